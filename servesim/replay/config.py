"""Read, validate and write the YAML config (spec README §3).

`load_config` reads a YAML file (ruamel.yaml, keeping the line of every key),
applies `--set dotted.key=value` overrides and builds the frozen attrs
:class:`Config`; `config_from_dict` does the same for plain data (the Python
API); `config_to_dict` turns a Config back into plain data in the YAML layout.

Validation is strict: unknown keys (with a "did you mean"), wrong types, values
out of range and bad combinations each raise one :class:`InputError` whose
message names the file, the line when known, the dotted key path, what is wrong
and what is accepted, e.g.
``config.yaml:7: engine.num_gpu_blocs: unknown key (did you mean 'num_gpu_blocks'?)``.
Defaults are the attrs classes' defaults, which are vLLM's.
"""

import difflib
import math
import numbers
import os
from pathlib import Path

import attrs
from ruamel.yaml import YAML, YAMLError
from ruamel.yaml.comments import CommentedMap, CommentedSeq

from servesim.engine.config import (
    EngineConfig,
    KVOffloadingConfig,
    KVTransferConfig,
    LaunchConfig,
    TimingConfig,
)
from servesim.errors import InputError
from servesim.kvcache.config import KVCacheConfig
from servesim.replay.config_types import (
    ClusterConfig,
    Config,
    LengthDistribution,
    OutputConfig,
    SyntheticConfig,
    WorkloadConfig,
)
from servesim.scheduler.config import SchedulerConfig

_SET = "--set"  # the origin of a key given by an override
_REQUIRED = object()  # marks a key without a default

FITTED_FEATURES = (
    "intercept",
    "num_prefill_requests",
    "sum_prefill_tokens",
    "num_decode_requests",
    "sum_decode_kv_tokens",
)

# Parameters of each timing type and length distribution: name -> default.
_TIMING_PARAMS = {
    "fixed": {"prefill_ms": _REQUIRED, "decode_ms": _REQUIRED},
    "linear": {
        "base_ms": _REQUIRED,
        "per_token_ms": _REQUIRED,
        "per_request_ms": 0.0,
        "per_context_token_ms": 0.0,
    },
    "polynomial": {},
    "fitted": {"model": _REQUIRED},
}
_DISTRIBUTION_PARAMS = {
    "constant": {"value": _REQUIRED},
    "uniform": {"min": _REQUIRED, "max": _REQUIRED},
    "lognormal": {"mean": _REQUIRED, "sigma": _REQUIRED, "min": 1, "max": None},
    "zipf": {"a": _REQUIRED, "min": 1, "max": _REQUIRED},
}
_KV_CACHE_KEYS = tuple(f.name for f in attrs.fields(KVCacheConfig))
_SCHEDULER_KEYS = tuple(f.name for f in attrs.fields(SchedulerConfig))
_ENGINE_KEYS = (*_KV_CACHE_KEYS, *_SCHEDULER_KEYS, "launch", "detokenize_ms", "kv_offloading", "timing")
_TOP_KEYS = ("workload", "engine", "cluster", "output")
_AGGREGATED_KEYS = ("workers", "data_parallel_size", "router")
_DISAGGREGATED_KEYS = ("mode", "prefill_workers", "decode_workers", "data_parallel_size",
                       "router", "prefill", "decode", "kv_transfer")
_CLUSTER_KEYS = ("mode", "workers", "prefill_workers", "decode_workers", "data_parallel_size",
                 "router", "prefill", "decode", "kv_transfer")
_POOLS = ("prefill", "decode")
# engine keys both pools must share: one model, one block layout
_SHARED_ENGINE_KEYS = ("block_size", "max_model_len")


# --------------------------------------------------------------------------- public API


def load_config(path, overrides=()) -> Config:
    """Read the YAML config at `path`, apply `overrides` ("dotted.key=value"
    strings, values parsed as YAML) and return the validated :class:`Config`.

    Relative paths in the file (workload.trace, engine.timing.model) are
    resolved against the config file's directory, also when an override gives them.
    """
    source = str(path)
    data, where = _read_yaml(source, "config file")
    if not isinstance(data, dict):
        raise InputError(
            f"{source}: the config must be a YAML mapping with keys "
            f"{', '.join(_TOP_KEYS)}; got {_show(data)}"
        )
    for text in overrides:
        _apply_override(data, where, text)
    base_dir = os.path.dirname(os.path.abspath(source))
    return _build(_Ctx(source, base_dir, where), data)


def config_from_dict(data: dict, base_dir: str = ".", source: str | None = None, overrides=()) -> Config:
    """Validate plain config data in the YAML layout and build the :class:`Config`.

    Relative paths are resolved against `base_dir`; `source` names the origin in
    messages and is stored in `Config.source`. `data` is not modified.
    """
    where: dict = {}
    data = _plain(data, "", where)
    if not isinstance(data, dict):
        keys = ", ".join(_TOP_KEYS)
        raise InputError(f"{source or 'config'}: must be a mapping with keys {keys}; got {_show(data)}")
    for text in overrides:
        _apply_override(data, where, text)
    return _build(_Ctx(source, os.path.abspath(base_dir), where), data)


def config_to_dict(cfg: Config) -> dict:
    """The resolved config as plain JSON-able data in the YAML layout: flat
    engine keys, every default filled, paths absolute, a fixed key order.
    `config_from_dict(config_to_dict(cfg), source=cfg.source) == cfg`."""
    workload = attrs.asdict(cfg.workload, recurse=False)
    if cfg.workload.synthetic is not None:
        synthetic = attrs.asdict(cfg.workload.synthetic, recurse=False)
        synthetic["input_tokens"] = _lengths_to_data(cfg.workload.synthetic.input_tokens)
        synthetic["output_tokens"] = _lengths_to_data(cfg.workload.synthetic.output_tokens)
        workload["synthetic"] = synthetic
    return {
        "workload": workload,
        "engine": _engine_to_data(cfg.engine),
        "cluster": _cluster_to_data(cfg.cluster, cfg.engine),
        "output": attrs.asdict(cfg.output),
    }


def _engine_to_data(engine: EngineConfig) -> dict:
    """An engine block: flat keys, every default filled."""
    return {
        **attrs.asdict(engine.kv_cache),
        **attrs.asdict(engine.scheduler),
        "launch": None if engine.launch is None else attrs.asdict(engine.launch),
        "detokenize_ms": engine.detokenize_ms,
        "kv_offloading": None if engine.kv_offloading is None else attrs.asdict(engine.kv_offloading),
        "timing": _timing_to_data(engine.timing),
    }


def _cluster_to_data(cluster: ClusterConfig, engine: EngineConfig) -> dict:
    """The cluster block: an aggregated cluster's three keys as ever; a
    disaggregated one's keys with each pool's engine keys that differ from
    `engine` (so an override of an `engine` key still reaches both pools)."""
    if not cluster.disaggregated:
        return {key: getattr(cluster, key) for key in _AGGREGATED_KEYS}
    data = {key: getattr(cluster, key) for key in _DISAGGREGATED_KEYS}
    base = _engine_to_data(engine)
    for pool in _POOLS:
        resolved = _engine_to_data(getattr(cluster, pool))
        data[pool] = {key: value for key, value in resolved.items() if base[key] != value}
    data["kv_transfer"] = attrs.asdict(cluster.kv_transfer)
    return data


def read_fitted_model(model_path: str) -> tuple:
    """The five `coefficients_ms` of a fitted model file (fitting.md §2), checked:
    `type: fitted`, `features` exactly FITTED_FEATURES, five finite numbers.
    Other keys (records, r2, mape, metadata, ...) are not checked."""
    data, where = _read_yaml(model_path, "fitted model file")
    ctx = _Ctx(model_path, os.path.dirname(model_path), where)
    if not isinstance(data, dict):
        ctx.fail("", f"a fitted model must be a YAML mapping, got {_show(data)}")
    if data.get("type") != "fitted":
        ctx.fail("type", f"must be 'fitted', got {_show(data.get('type'))}")
    if data.get("features") != list(FITTED_FEATURES):
        ctx.fail("features", f"must be [{', '.join(FITTED_FEATURES)}], got {_show(data.get('features'))}")
    coefficients = data.get("coefficients_ms")
    if not (
        isinstance(coefficients, list)
        and len(coefficients) == len(FITTED_FEATURES)
        and all(_NUMBER.accepts(c) for c in coefficients)
    ):
        n = len(FITTED_FEATURES)
        ctx.fail("coefficients_ms", f"must be a list of {n} finite numbers, got {_show(coefficients)}")
    return tuple(float(c) for c in coefficients)


# --------------------------------------------------------------------------- reading


def _read_yaml(path: str, what: str):
    """Parse a YAML file into plain data and {dotted key path: line}."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: {what} not found") from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: {what} is not UTF-8 text") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read {what}: {e.strerror}") from None
    try:
        doc = YAML(typ="rt").load(text)
    except YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise InputError(f"{path}{line}: invalid YAML: {problem}") from None
    where: dict = {}
    return _plain(doc, "", where), where


def _plain(node, path: str, where: dict):
    """Plain dicts, lists and scalars from ruamel (or API) data; records the
    1-based line of every mapping key in `where`."""
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            key_path = _join(path, str(key))
            if isinstance(node, CommentedMap):
                try:
                    where[key_path] = node.lc.key(key)[0] + 1
                except (KeyError, TypeError):
                    pass
            out[str(key)] = _plain(value, key_path, where)
        return out
    if isinstance(node, (list, tuple, CommentedSeq)):
        return [_plain(item, path, where) for item in node]
    if isinstance(node, bool) or type(node).__name__ == "ScalarBoolean":
        return bool(node)
    if isinstance(node, numbers.Integral):
        return int(node)
    if isinstance(node, float):
        return float(node)
    if isinstance(node, str):
        return str(node)
    return node


def _apply_override(data: dict, where: dict, text: str) -> None:
    """Apply one `dotted.key=value` override in place; the value is YAML
    (scalar or flow collection) and replaces what was there."""
    key, sep, raw = str(text).partition("=")
    key = key.strip()
    parts = key.split(".")
    if not sep or not all(parts):
        raise InputError(f"{_SET} {text!r}: expected dotted.key=value, e.g. engine.num_gpu_blocks=4096")
    try:
        value = _plain(YAML(typ="safe", pure=True).load(raw), "", {})
    except YAMLError as e:
        raise InputError(f"{_SET} {key}: cannot parse {raw!r} as a YAML value: {getattr(e, 'problem', e)}") from None
    node = data
    for i, part in enumerate(parts[:-1]):
        prefix = ".".join(parts[: i + 1])
        if node.get(part) is None:
            node[part] = {}
            where[prefix] = _SET
        elif not isinstance(node[part], dict):
            raise InputError(f"{_SET} {key}: {prefix} is {_show(node[part])}, not a mapping")
        node = node[part]
    node[parts[-1]] = value
    for stale in [p for p in where if p.startswith(key + ".")]:
        del where[stale]
    where[key] = _SET


# --------------------------------------------------------------------------- checking


@attrs.frozen
class _Ctx:
    """Where the data came from: names the file and line in messages and
    resolves relative paths."""

    source: str | None
    base_dir: str
    where: dict  # dotted key path -> 1-based line, or _SET

    def fail(self, path: str, message: str):
        """Raise the InputError for `path` (its line, else its nearest parent's)."""
        origin = self._origin(path)
        head = self.source or ""
        if head and isinstance(origin, int):
            head += f":{origin}"
        if path and origin == _SET:
            path = f"{_SET} {path}"
        prefix = ": ".join(p for p in (head, path) if p)
        raise InputError(f"{prefix}: {message}" if prefix else message)

    def _origin(self, path: str):
        while path:
            if path in self.where:
                return self.where[path]
            path = path.rpartition(".")[0]
        return None

    def resolve(self, path: str) -> str:
        """An absolute path for a file named in the config."""
        return os.path.abspath(os.path.join(self.base_dir, os.path.expanduser(path)))


@attrs.frozen
class _Kind:
    """A value type: its name in messages, its test and its conversion."""

    name: str
    accepts: object
    cast: object = lambda v: v


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)


_INT = _Kind("an integer", _is_int, int)
_NUMBER = _Kind("a number", _is_number, float)
_BOOL = _Kind("true or false", lambda v: isinstance(v, bool), bool)
_PATH = _Kind("a file path", lambda v: isinstance(v, str) and v != "", str)


def _enum(*choices: str) -> _Kind:
    return _Kind("one of " + ", ".join(choices), lambda v: isinstance(v, str) and v in choices, str)


def _ge(bound):
    return (lambda v: v >= bound, f">= {bound}")


def _gt(bound):
    return (lambda v: v > bound, f"> {bound}")


def _lt(bound):
    return (lambda v: v < bound, f"< {bound}")


def _le(bound):
    return (lambda v: v <= bound, f"<= {bound}")


def _check(ctx: _Ctx, path: str, value, kind: _Kind, *bounds, nullable=False):
    """`value` converted by `kind`, or an InputError saying what is accepted."""
    if value is None and nullable:
        return None
    if kind.accepts(value) and all(test(kind.cast(value)) for test, _ in bounds):
        return kind.cast(value)
    message = f"must be {_accepted(kind, bounds, nullable)}, got {_show(value)}"
    if kind.name.startswith("one of") and isinstance(value, str):
        message += _did_you_mean(value, kind.name[len("one of ") :].split(", "))
    ctx.fail(path, message)


class _Section:
    """One mapping of the config at a dotted path: typed access to its keys,
    unknown keys rejected when it is opened."""

    def __init__(self, ctx: _Ctx, data, path: str, keys, path_of=None):
        if data is None:
            data = {}
        if not isinstance(data, dict):
            ctx.fail(path, f"must be a mapping, got {_show(data)}")
        self.ctx, self.data, self.path, self.keys = ctx, data, path, keys
        self._path_of = path_of  # key -> its dotted path, for merged sections
        for key in data:
            if key not in keys:
                ctx.fail(self.sub(key), "unknown key" + _did_you_mean(key, keys, list_all=True))

    def get(self, key: str, kind: _Kind, default=_REQUIRED, *bounds, nullable=False):
        """The checked value of `key`, or `default` when it is absent."""
        path = self.sub(key)
        if key not in self.data:
            if default is _REQUIRED:
                self.ctx.fail(path, f"required key is missing ({_accepted(kind, bounds)})")
            return default
        return _check(self.ctx, path, self.data[key], kind, *bounds, nullable=nullable)

    def given(self, key: str) -> bool:
        return self.data.get(key) is not None

    def sub(self, key: str) -> str:
        if self._path_of is not None:
            return self._path_of(key)
        return _join(self.path, key)


def _tagged_section(ctx, data, path, tag, default, params_by_tag) -> tuple:
    """A mapping whose `tag` key (timing `type`, `distribution`) chooses its
    parameters; a parameter of another tag is named as such."""
    if not isinstance(data, dict):
        ctx.fail(path, f"must be a mapping with key {tag!r}, got {_show(data)}")
    if tag not in data and default is _REQUIRED:
        ctx.fail(_join(path, tag), f"required key is missing ({_enum(*params_by_tag).name})")
    value = _check(ctx, _join(path, tag), data.get(tag, default), _enum(*params_by_tag))
    params = params_by_tag[value]
    for key in data:
        if key != tag and key not in params and any(key in p for p in params_by_tag.values()):
            accepted = ", ".join(params) or "none"
            ctx.fail(_join(path, key), f"not a parameter of {tag} {value!r} (its parameters: {accepted})")
    return value, _Section(ctx, data, path, (tag, *params))


# --------------------------------------------------------------------------- building


def _build(ctx: _Ctx, data: dict) -> Config:
    """The validated Config of plain data in the YAML layout."""
    top = _Section(ctx, data, "", _TOP_KEYS)
    engine = _engine(ctx, top.data.get("engine"))
    cluster = _cluster(ctx, top.data.get("cluster"), top.data.get("engine"), engine)
    if engine.launch is not None and cluster.data_parallel_size != 1:
        ctx.fail(
            "engine.launch",
            "requires cluster.data_parallel_size: 1 (launch timing models one-GPU "
            f"aggregated workers), got {cluster.data_parallel_size}",
        )
    if "workload" not in data:
        ctx.fail("workload", "required key is missing (a mapping with trace or synthetic)")
    return Config(
        workload=_workload(ctx, data["workload"], engine),
        engine=engine,
        cluster=cluster,
        output=_output(ctx, top.data.get("output")),
        source=ctx.source,
    )


def _workload(ctx: _Ctx, data, engine: EngineConfig) -> WorkloadConfig:
    """`workload`: exactly one of a trace file and a synthetic workload."""
    keys = [f.name for f in attrs.fields(WorkloadConfig)]
    s = _Section(ctx, data, "workload", keys)
    if s.given("trace") == s.given("synthetic"):
        ctx.fail("workload", "give exactly one of workload.trace (a trace file) and workload.synthetic")
    trace = s.get("trace", _PATH, None, nullable=True)
    fmt = s.get("format", _enum("mooncake", "azure"), None, nullable=True)
    if trace is not None:
        trace = ctx.resolve(trace)
        if not os.path.isfile(trace):
            ctx.fail("workload.trace", f"trace file not found: {trace}")
        fmt = fmt or _format_from_name(ctx, trace)
    elif fmt is not None:
        ctx.fail("workload.format", "applies only to a trace file (workload.trace)")
    synthetic = _synthetic(ctx, s.data["synthetic"], engine) if s.given("synthetic") else None
    concurrency = s.get("concurrency", _INT, None, _ge(1), nullable=True)
    if concurrency is not None and synthetic is not None and synthetic.concurrency is not None:
        ctx.fail("workload.concurrency", "given twice: set workload.concurrency or workload.synthetic.concurrency, not both")
    return WorkloadConfig(
        trace=trace,
        format=fmt,
        trace_block_size=s.get("trace_block_size", _INT, 512, _ge(1)),
        limit=s.get("limit", _INT, None, _ge(1), nullable=True),
        speedup=s.get("speedup", _NUMBER, 1.0, _gt(0)),
        concurrency=concurrency,
        synthetic=synthetic,
    )


def _format_from_name(ctx: _Ctx, trace: str) -> str:
    """mooncake for .jsonl/.json, azure for .csv (optionally .gz)."""
    name = trace.lower().removesuffix(".gz")
    if name.endswith((".jsonl", ".json")):
        return "mooncake"
    if name.endswith(".csv"):
        return "azure"
    name = os.path.basename(trace)
    ctx.fail("workload.format", f"cannot tell the trace format from the file name {name!r}; set it to mooncake or azure")


def _synthetic(ctx: _Ctx, data, engine: EngineConfig) -> SyntheticConfig:
    """`workload.synthetic` (spec README §3-4)."""
    d = _defaults(SyntheticConfig)
    s = _Section(ctx, data, "workload.synthetic", list(d))
    arrival = s.get("arrival", _enum("burst", "poisson", "constant"), d["arrival"])
    rate = s.get("rate", _NUMBER, None, _gt(0), nullable=True)
    if arrival != "burst" and rate is None:
        ctx.fail(s.sub("rate"), f"arrival {arrival} needs a rate in requests/s (a number > 0)")
    prefix = s.get("shared_prefix_tokens", _INT, d["shared_prefix_tokens"], _ge(0))
    block_size = engine.kv_cache.block_size
    if prefix % block_size:
        ctx.fail(s.sub("shared_prefix_tokens"), f"must be a multiple of engine.block_size ({block_size}), got {prefix}")
    return SyntheticConfig(
        requests=s.get("requests", _INT, d["requests"], _ge(1)),
        input_tokens=_lengths(ctx, s, "input_tokens"),
        output_tokens=_lengths(ctx, s, "output_tokens"),
        arrival=arrival,
        rate=rate,
        concurrency=s.get("concurrency", _INT, None, _ge(1), nullable=True),
        shared_prefix_tokens=prefix,
        seed=s.get("seed", _INT, d["seed"], _ge(0)),
    )


def _lengths(ctx: _Ctx, s: _Section, key: str) -> LengthDistribution:
    """A token-count distribution: an int (constant) or {distribution: ...}.
    A lognormal without `max` is stored with max 0: no upper clip."""
    path = s.sub(key)
    if key not in s.data:
        return _defaults(SyntheticConfig)[key]
    value = s.data[key]
    if not isinstance(value, dict):
        if not _is_int(value):
            kinds = "|".join(_DISTRIBUTION_PARAMS)
            ctx.fail(path, f"must be an integer >= 1 or a mapping {{distribution: {kinds}, ...}}, got {_show(value)}")
        return LengthDistribution(value=_check(ctx, path, value, _INT, _ge(1)))
    kind, d = _tagged_section(ctx, value, path, "distribution", _REQUIRED, _DISTRIBUTION_PARAMS)
    if kind == "constant":
        return LengthDistribution(value=d.get("value", _INT, _REQUIRED, _ge(1)))
    if kind == "zipf":
        a = d.get("a", _NUMBER, _REQUIRED, _gt(1))
    elif kind == "lognormal":
        mean, sigma = d.get("mean", _NUMBER), d.get("sigma", _NUMBER, _REQUIRED, _ge(0))
    low = d.get("min", _INT, _DISTRIBUTION_PARAMS[kind]["min"], _ge(1))
    high = d.get("max", _INT, _DISTRIBUTION_PARAMS[kind]["max"], _ge(low), nullable=kind == "lognormal")
    if kind == "uniform":
        return LengthDistribution(distribution=kind, min=low, max=high)
    if kind == "zipf":
        return LengthDistribution(distribution=kind, a=a, min=low, max=high)
    return LengthDistribution(distribution=kind, mean=mean, sigma=sigma, min=low, max=high or 0)


def _engine(ctx: _Ctx, data, path_of=None) -> EngineConfig:
    """`engine`: flat keys split into the KV cache, scheduler and engine configs.
    `path_of(key)` names where each key came from when `data` merges a
    pool's overrides into `engine` (messages then say `cluster.prefill.KEY`
    or `engine.KEY`)."""
    s = _Section(ctx, data, "engine", _ENGINE_KEYS, path_of)
    kv_cache = _kv_cache(s)
    scheduler = _scheduler(ctx, s)
    launch = _launch(ctx, s.data.get("launch"), s.sub("launch"))
    if launch is not None and not scheduler.async_scheduling:
        ctx.fail(s.sub("launch"), f"requires {s.sub('async_scheduling')}: true")
    return EngineConfig(
        kv_cache=kv_cache,
        scheduler=scheduler,
        timing=_timing(ctx, s.data.get("timing"), s.sub("timing")),
        launch=launch,
        detokenize_ms=s.get("detokenize_ms", _NUMBER, 0.0, _ge(0)),
        kv_offloading=_kv_offloading(ctx, s.data.get("kv_offloading"), s.sub("kv_offloading")),
    )


def _kv_cache(s: _Section) -> KVCacheConfig:
    d = _defaults(KVCacheConfig)
    return KVCacheConfig(
        block_size=s.get("block_size", _INT, d["block_size"], _ge(1)),
        num_gpu_blocks=s.get("num_gpu_blocks", _INT, d["num_gpu_blocks"], _ge(2)),
        enable_prefix_caching=s.get("enable_prefix_caching", _BOOL, d["enable_prefix_caching"]),
    )


def _scheduler(ctx: _Ctx, s: _Section) -> SchedulerConfig:
    """The scheduler keys, with vLLM's cross-checks of the token budget."""
    d = _defaults(SchedulerConfig)
    cfg = SchedulerConfig(
        max_num_seqs=s.get("max_num_seqs", _INT, d["max_num_seqs"], _ge(1)),
        max_num_batched_tokens=s.get("max_num_batched_tokens", _INT, d["max_num_batched_tokens"], _ge(1)),
        max_model_len=s.get("max_model_len", _INT, None, _ge(1), nullable=True),
        enable_chunked_prefill=s.get("enable_chunked_prefill", _BOOL, d["enable_chunked_prefill"]),
        long_prefill_token_threshold=s.get("long_prefill_token_threshold", _INT, d["long_prefill_token_threshold"], _ge(0)),
        scheduling_policy=s.get("scheduling_policy", _enum("fcfs", "priority"), d["scheduling_policy"]),
        reserve_full_isl=s.get("reserve_full_isl", _BOOL, d["reserve_full_isl"]),
        watermark=s.get("watermark", _NUMBER, d["watermark"], _ge(0), _lt(1)),
        async_scheduling=s.get("async_scheduling", _BOOL, d["async_scheduling"]),
    )
    budget = cfg.max_num_batched_tokens
    if budget < cfg.max_num_seqs:
        ctx.fail(s.sub("max_num_batched_tokens"), f"must be >= {s.sub('max_num_seqs')} ({cfg.max_num_seqs}), got {budget}")
    if not cfg.enable_chunked_prefill and cfg.max_model_len is not None and budget < cfg.max_model_len:
        ctx.fail(
            s.sub("max_num_batched_tokens"),
            f"must be >= {s.sub('max_model_len')} ({cfg.max_model_len}) when enable_chunked_prefill "
            f"is false (vLLM's rule: a prompt is scheduled whole), got {budget}",
        )
    return cfg


def _timing(ctx: _Ctx, data, path="engine.timing") -> TimingConfig:
    """`engine.timing`: a type and that type's parameters (vllm-engine.md §10)."""
    if data is None:
        return TimingConfig()
    kind, s = _tagged_section(ctx, data, path, "type", "polynomial", _TIMING_PARAMS)
    if kind == "fitted":
        model = ctx.resolve(s.get("model", _PATH))
        if not os.path.isfile(model):
            ctx.fail(s.sub("model"), f"fitted model file not found: {model}")
        return TimingConfig(type=kind, model=model, coefficients_ms=read_fitted_model(model))
    params = {key: s.get(key, _NUMBER, default, _ge(0)) for key, default in _TIMING_PARAMS[kind].items()}
    return TimingConfig(type=kind, **params)


def _launch(ctx: _Ctx, data, path="engine.launch") -> LaunchConfig | None:
    """`engine.launch` (vllm-engine.md §8), or None."""
    if data is None:
        return None
    d = _defaults(LaunchConfig)
    s = _Section(ctx, data, path, list(d))
    costs = {key: s.get(key, _NUMBER, d[key], _ge(0)) for key in ("decode_ms", "piecewise_ms", "eager_ms")}
    return LaunchConfig(
        **costs,
        eager_queue_fraction=s.get("eager_queue_fraction", _NUMBER, d["eager_queue_fraction"], _ge(0), _le(1)),
        max_cudagraph_capture_size=s.get("max_cudagraph_capture_size", _INT, d["max_cudagraph_capture_size"], _ge(1)),
    )


def _kv_offloading(ctx: _Ctx, data, path="engine.kv_offloading") -> KVOffloadingConfig | None:
    """`engine.kv_offloading`: the CPU tier (vllm-engine.md §9), or None."""
    if data is None:
        return None
    keys = [f.name for f in attrs.fields(KVOffloadingConfig)]
    s = _Section(ctx, data, path, keys)
    return KVOffloadingConfig(
        num_cpu_blocks=s.get("num_cpu_blocks", _INT, _REQUIRED, _ge(1)),
        bytes_per_token=s.get("bytes_per_token", _INT, _REQUIRED, _ge(1)),
        d2h_gbps=s.get("d2h_gbps", _NUMBER, _REQUIRED, _gt(0)),
        h2d_gbps=s.get("h2d_gbps", _NUMBER, _REQUIRED, _gt(0)),
        connector=s.get("connector", _enum("offloading", "simple_cpu"), "offloading"),
    )


def _cluster(ctx: _Ctx, data, engine_data, engine: EngineConfig) -> ClusterConfig:
    """`cluster`: aggregated workers (the default), or disaggregated prefill
    and decode pools (servesim/engine/disagg.py)."""
    d = _defaults(ClusterConfig)
    if isinstance(data, dict):
        disaggregated = data.get("mode") == "disaggregated"
        for key in data:
            if key not in _CLUSTER_KEYS:
                close = _did_you_mean(key, _CLUSTER_KEYS)
                if close:
                    ctx.fail(_join("cluster", key), "unknown key" + close)
                if disaggregated:
                    message = f"unknown key (accepted: {', '.join(_DISAGGREGATED_KEYS)})"
                else:
                    extra = ", ".join(k for k in _DISAGGREGATED_KEYS if k != "mode")
                    message = (f"unknown key (accepted: {', '.join(_AGGREGATED_KEYS)}); "
                               f"with mode: disaggregated: {extra}")
                ctx.fail(_join("cluster", key), message)
    s = _Section(ctx, data, "cluster", _CLUSTER_KEYS)
    mode = s.get("mode", _enum("aggregated", "disaggregated"), d["mode"])
    common = dict(
        data_parallel_size=s.get("data_parallel_size", _INT, d["data_parallel_size"], _ge(1)),
        router=s.get("router", _enum("round_robin", "least_loaded", "kv_aware"), d["router"]),
    )
    if mode == "aggregated":
        for key in _DISAGGREGATED_KEYS:
            if key not in _AGGREGATED_KEYS and key != "mode" and key in s.data:
                ctx.fail(s.sub(key), "applies only to cluster.mode: disaggregated")
        return ClusterConfig(workers=s.get("workers", _INT, d["workers"], _ge(1)), **common)
    if "workers" in s.data:
        ctx.fail(s.sub("workers"), "applies only to cluster.mode: aggregated; a disaggregated "
                 "cluster has cluster.prefill_workers and cluster.decode_workers")
    pools = {pool: _pool_engine(ctx, s, pool, engine_data, engine) for pool in _POOLS}
    return ClusterConfig(
        mode=mode,
        prefill_workers=s.get("prefill_workers", _INT, 1, _ge(1)),
        decode_workers=s.get("decode_workers", _INT, 1, _ge(1)),
        prefill=pools["prefill"],
        decode=pools["decode"],
        kv_transfer=_kv_transfer(ctx, s),
        **common,
    )


def _pool_engine(ctx: _Ctx, s: _Section, pool: str, engine_data, engine: EngineConfig) -> EngineConfig:
    """`cluster.prefill` / `cluster.decode`: `engine` with the pool's keys
    replacing its own (a mapping such as `timing` is replaced whole), checked
    like `engine`; a message names the key where it was given. Launch timing
    and the CPU tier are not modelled on disaggregated workers, and both pools
    share `block_size` and `max_model_len` (one model, whole blocks moved)."""
    overrides = s.data.get(pool)
    path = s.sub(pool)
    if overrides is None:
        overrides = {}
    if not isinstance(overrides, dict):
        ctx.fail(path, f"must be a mapping of engine keys (overrides of engine for the {pool} "
                 f"workers), got {_show(overrides)}")
    merged = {**(engine_data if isinstance(engine_data, dict) else {}), **overrides}

    def path_of(key):
        return _join(path, key) if key in overrides else _join("engine", key)

    for key, reason in (("launch", "launch timing models one-GPU aggregated workers"),
                        ("kv_offloading", "the CPU tier does not combine with the KV "
                         "transfer connector in servesim (vLLM would need a MultiConnector)")):
        if merged.get(key) is not None:
            ctx.fail(path_of(key), f"is not supported on disaggregated {pool} workers "
                     f"(cluster.mode: disaggregated): {reason}; remove it")
    config = _engine(ctx, merged, path_of)
    for key in _SHARED_ENGINE_KEYS:
        if key in overrides:
            ours = getattr(config.kv_cache if key == "block_size" else config.scheduler, key)
            theirs = getattr(engine.kv_cache if key == "block_size" else engine.scheduler, key)
            if ours != theirs:
                ctx.fail(path_of(key), f"must equal engine.{key} ({_show(theirs)}), got "
                         f"{_show(ours)}: both pools serve one model and move whole blocks "
                         f"between them; set engine.{key} instead")
    return config


def _kv_transfer(ctx: _Ctx, s: _Section) -> KVTransferConfig:
    """`cluster.kv_transfer`: the prefill-to-decode link (required)."""
    if s.data.get("kv_transfer") is None:
        ctx.fail(s.sub("kv_transfer"), "required key is missing in disaggregated mode (a mapping "
                 "{bytes_per_token, bandwidth_gbps, latency_ms})")
    t = _Section(ctx, s.data["kv_transfer"], s.sub("kv_transfer"),
                 [f.name for f in attrs.fields(KVTransferConfig)])
    return KVTransferConfig(
        bytes_per_token=t.get("bytes_per_token", _INT, _REQUIRED, _ge(1)),
        bandwidth_gbps=t.get("bandwidth_gbps", _NUMBER, _REQUIRED, _gt(0)),
        latency_ms=t.get("latency_ms", _NUMBER, 0.0, _ge(0)),
    )


def _output(ctx: _Ctx, data) -> OutputConfig:
    d = _defaults(OutputConfig)
    s = _Section(ctx, data, "output", list(d))
    return OutputConfig(
        per_request=s.get("per_request", _BOOL, d["per_request"]),
        pass_log=s.get("pass_log", _BOOL, d["pass_log"]),
        telemetry_interval_ms=s.get("telemetry_interval_ms", _NUMBER, None, _gt(0), nullable=True),
    )


# --------------------------------------------------------------------------- writing


def _timing_to_data(timing: TimingConfig) -> dict:
    """The timing block: its type and that type's parameters only."""
    if timing.type == "fitted":
        return {"type": "fitted", "model": timing.model}
    return {"type": timing.type, **{key: getattr(timing, key) for key in _TIMING_PARAMS[timing.type]}}


def _lengths_to_data(dist: LengthDistribution):
    """An int for a constant, else {distribution, its parameters}."""
    if dist.distribution == "constant":
        return dist.value
    data = {"distribution": dist.distribution}
    for key in _DISTRIBUTION_PARAMS[dist.distribution]:
        data[key] = getattr(dist, key)
    if dist.distribution == "lognormal" and dist.max == 0:
        data["max"] = None
    return data


# --------------------------------------------------------------------------- helpers


def _defaults(cls) -> dict:
    """Field name -> default of an attrs class (factories called)."""
    out = {}
    for f in attrs.fields(cls):
        default = f.default
        if isinstance(default, attrs.Factory):
            default = default.factory()
        out[f.name] = default
    return out


def _accepted(kind: _Kind, bounds=(), nullable: bool = False) -> str:
    """What a key accepts, e.g. 'an integer >= 2 or null'."""
    text = " ".join([kind.name, *(desc for _, desc in bounds[:1])])
    text += "".join(f" and {desc}" for _, desc in bounds[1:])
    return text + (" or null" if nullable else "")


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _did_you_mean(word: str, choices, list_all: bool = False) -> str:
    """' (did you mean 'x'?)', else the accepted choices when `list_all`."""
    close = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.6)
    if close:
        return f" (did you mean {close[0]!r}?)"
    return f" (accepted: {', '.join(choices)})" if list_all else ""


def _show(value) -> str:
    """A value as the user wrote it, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return f"a list {value!r}" if len(repr(value)) < 60 else "a list"
    return repr(value)


__all__ = ["load_config", "config_from_dict", "config_to_dict", "read_fitted_model", "FITTED_FEATURES"]
