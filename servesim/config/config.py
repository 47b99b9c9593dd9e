"""Read, validate and write the YAML config (README.md, "Config").

`load_config` reads a YAML file (ruamel.yaml, keeping the line of every key),
applies `--set dotted.key=value` overrides and builds the frozen attrs
:class:`Config`; `config_from_dict` does the same for plain data (the Python
API); `config_to_dict` turns a Config back into plain data in the YAML layout.

Validation is strict: unknown keys (with a "did you mean"), wrong types, values
out of range and bad combinations each raise one :class:`InputError` whose
message names the file, the line when known, the dotted key path, what is wrong
and what is accepted, e.g.
``config.yaml:7: engine.num_gpu_blocs: unknown key (did you mean 'num_gpu_blocks'?)``.
Defaults are the attrs classes' defaults, which are vLLM's. Reading YAML and
overrides lives in `yaml_input`, the checking vocabulary in `validation`;
this module is the schema.
"""

import os

import attrs

from servesim.engine.config import (
    EngineConfig,
    FrontendConfig,
    KVOffloadingConfig,
    KVTransferConfig,
    LaunchConfig,
    TimingConfig,
)
from servesim.errors import InputError
from servesim.kvcache.config import KVCacheConfig
from servesim.config.config_types import (
    ClusterConfig,
    Config,
    LengthDistribution,
    OutputConfig,
    SessionsConfig,
    SyntheticConfig,
    WorkloadConfig,
)
from servesim.deployment.config import KEYS as DEPLOYMENT_KEYS
from servesim.deployment.host_time import default_frontend, default_host_ms_per_pass
from servesim.config.deployment_config import deployment_to_data, read_calibration, read_deployment
from servesim.config.fitted_checks import check_engine_pricing, read_fitted_provenance
from servesim.config.validation import (
    BOOL,
    INT,
    NUMBER,
    PATH,
    REQUIRED,
    Ctx,
    Section,
    check,
    did_you_mean,
    enum,
    ge,
    gt,
    is_int,
    join,
    le,
    lt,
    show,
    tagged_section,
)
from servesim.config.router_config import parse_router
from servesim.config.sglang_config import (BACKENDS, SGLANG_ROUTERS, check_backend_keys,
                                           parse_sglang_engine, sglang_engine_to_data)
from servesim.config.router_config import to_data as router_to_data
from servesim.config.speculative_config import (check_drafter, check_drafts_priced,
                                                parse_speculative)
from servesim.config.speculative_config import to_data as speculative_to_data
from servesim.config.yaml_input import apply_override, plain_data, read_yaml
from servesim.engine.fitted_formula import FITTED_FEATURES, FITTED_SPEC_FEATURE
from servesim.scheduler.config import SchedulerConfig


# Parameters of each timing type and length distribution: name -> default.
_TIMING_PARAMS = {
    "fixed": {"prefill_ms": REQUIRED, "decode_ms": REQUIRED},
    "linear": {
        "base_ms": REQUIRED,
        "per_token_ms": REQUIRED,
        "per_request_ms": 0.0,
        "per_context_token_ms": 0.0,
    },
    "polynomial": {},
    "fitted": {"model": REQUIRED},
    "aic": {"calibration": None},
}
_DISTRIBUTION_PARAMS = {
    "constant": {"value": REQUIRED},
    "uniform": {"min": REQUIRED, "max": REQUIRED},
    "lognormal": {"mean": REQUIRED, "sigma": REQUIRED, "min": 1, "max": None},
    "zipf": {"a": REQUIRED, "min": 1, "max": REQUIRED},
}
_KV_CACHE_KEYS = tuple(f.name for f in attrs.fields(KVCacheConfig))
_SCHEDULER_KEYS = tuple(f.name for f in attrs.fields(SchedulerConfig))
_ENGINE_KEYS = ("backend", *_KV_CACHE_KEYS, *_SCHEDULER_KEYS, "launch", "detokenize_ms", "frontend",
                "host_ms_per_pass", "kv_offloading", "speculative", "timing", *DEPLOYMENT_KEYS)
# `slo` is read by `servesim capacity` / `search` (servesim/config/slo.py); a replay ignores it
_TOP_KEYS = ("workload", "engine", "cluster", "output", "slo")
_AGGREGATED_KEYS = ("workers", "data_parallel_size", "router")
_DISAGGREGATED_KEYS = ("mode", "prefill_workers", "decode_workers", "data_parallel_size",
                       "router", "prefill", "decode", "kv_transfer")
_CLUSTER_KEYS = ("mode", "workers", "prefill_workers", "decode_workers", "data_parallel_size",
                 "router", "prefill", "decode", "kv_transfer")
_POOLS = ("prefill", "decode")
# engine keys both pools must share: one model, one block layout
_SHARED_ENGINE_KEYS = ("block_size", "max_model_len")


# --------------------------------------------------------------------------- public API


def load_config(path, overrides=(), override_dir=None) -> Config:
    """Read the YAML config at `path`, apply `overrides` ("dotted.key=value"
    strings, values parsed as YAML) and return the validated :class:`Config`.

    Relative paths in the file (workload.trace, engine.timing.model) are
    resolved against the config file's directory; relative paths given by an
    override against `override_dir` (default: the current directory, as a
    user typing `--set` expects; a sweep passes its grid file's folder).
    """
    source = str(path)
    data, where = read_yaml(source, "config file")
    if not isinstance(data, dict):
        raise InputError(
            f"{source}: the config must be a YAML mapping with keys "
            f"{', '.join(_TOP_KEYS)}; got {show(data)}"
        )
    for text in overrides:
        apply_override(data, where, text)
    base_dir = os.path.dirname(os.path.abspath(source))
    return _build(Ctx(source, base_dir, where, override_dir), data)


def config_from_dict(data: dict, base_dir: str = ".", source: str | None = None, overrides=()) -> Config:
    """Validate plain config data in the YAML layout and build the :class:`Config`.

    Relative paths are resolved against `base_dir`; `source` names the origin in
    messages and is stored in `Config.source`. `data` is not modified.
    """
    where: dict = {}
    data = plain_data(data, "", where)
    if not isinstance(data, dict):
        keys = ", ".join(_TOP_KEYS)
        raise InputError(f"{source or 'config'}: must be a mapping with keys {keys}; got {show(data)}")
    for text in overrides:
        apply_override(data, where, text)
    return _build(Ctx(source, os.path.abspath(base_dir), where), data)


def config_to_dict(cfg: Config) -> dict:
    """The resolved config as plain JSON-able data in the YAML layout: flat
    engine keys, every default filled, paths absolute, a fixed key order.
    `config_from_dict(config_to_dict(cfg), source=cfg.source) == cfg`."""
    workload = attrs.asdict(cfg.workload, recurse=False)
    if cfg.workload.synthetic is not None:
        synthetic = attrs.asdict(cfg.workload.synthetic, recurse=False)
        synthetic["input_tokens"] = _lengths_to_data(cfg.workload.synthetic.input_tokens)
        synthetic["output_tokens"] = _lengths_to_data(cfg.workload.synthetic.output_tokens)
        if synthetic["sessions"] is None:
            del synthetic["sessions"]  # the config of a run without sessions stays as it was
        else:
            synthetic["sessions"] = _sessions_to_data(synthetic["sessions"])
        workload["synthetic"] = synthetic
    return {
        "workload": workload,
        "engine": _engine_to_data(cfg.engine),
        "cluster": _cluster_to_data(cfg.cluster, cfg.engine),
        "output": attrs.asdict(cfg.output),
    }


def _engine_to_data(engine: EngineConfig) -> dict:
    """An engine block: flat keys, every default filled."""
    if engine.sglang is not None:
        return sglang_engine_to_data(engine, _timing_to_data(engine.timing))
    return {
        **attrs.asdict(engine.kv_cache),
        **attrs.asdict(engine.scheduler),
        "launch": None if engine.launch is None else attrs.asdict(engine.launch),
        "detokenize_ms": engine.detokenize_ms,
        **_host_terms_to_data(engine),
        "kv_offloading": None if engine.kv_offloading is None else attrs.asdict(engine.kv_offloading),
        **({} if engine.speculative is None else {"speculative": speculative_to_data(engine.speculative)}),
        "timing": _timing_to_data(engine.timing),
        **deployment_to_data(engine.deployment),
    }


def _host_terms_to_data(engine: EngineConfig) -> dict:
    """`frontend` and `host_ms_per_pass` where they differ from the timing
    type's defaults (servesim/deployment/host_time.py), so that the block
    reads back as the same engine."""
    data = {}
    kind = engine.timing.type
    if engine.frontend != _default_frontend(kind):
        data["frontend"] = attrs.asdict(engine.frontend or FrontendConfig())
    if engine.host_ms_per_pass != default_host_ms_per_pass(kind):
        data["host_ms_per_pass"] = engine.host_ms_per_pass
    return data


def _cluster_to_data(cluster: ClusterConfig, engine: EngineConfig) -> dict:
    """The cluster block: an aggregated cluster's three keys as ever; a
    disaggregated one's keys with each pool's engine keys that differ from
    `engine` (so an override of an `engine` key still reaches both pools)."""
    if not cluster.disaggregated:
        return {**{key: getattr(cluster, key) for key in _AGGREGATED_KEYS},
                "router": router_to_data(cluster.router)}
    data = {key: getattr(cluster, key) for key in _DISAGGREGATED_KEYS}
    data["router"] = router_to_data(cluster.router)
    base = _engine_to_data(engine)
    for pool in _POOLS:
        resolved = _engine_to_data(getattr(cluster, pool))
        data[pool] = {key: value for key, value in resolved.items() if base.get(key) != value}
        width = getattr(cluster, f"{pool}_data_parallel_size")
        if width is not None:
            data[pool]["data_parallel_size"] = width
    data["kv_transfer"] = attrs.asdict(cluster.kv_transfer)
    return data


def read_fitted_model(model_path: str) -> tuple:
    """The five `coefficients_ms` of a fitted model file (docs/fitting.md), checked:
    `type: fitted`, `features` exactly FITTED_FEATURES (optionally followed
    by FITTED_SPEC_FEATURE), one finite number per feature.
    Other keys (records, r2, mape, metadata, ...) are not checked."""
    data, where = read_yaml(model_path, "fitted model file")
    ctx = Ctx(model_path, os.path.dirname(model_path), where)
    if not isinstance(data, dict):
        ctx.fail("", f"a fitted model must be a YAML mapping, got {show(data)}")
    if data.get("type") != "fitted":
        ctx.fail("type", f"must be 'fitted', got {show(data.get('type'))}")
    features = data.get("features")
    if features not in (list(FITTED_FEATURES), [*FITTED_FEATURES, FITTED_SPEC_FEATURE]):
        ctx.fail("features", f"must be [{', '.join(FITTED_FEATURES)}], optionally followed by "
                 f"{FITTED_SPEC_FEATURE}, got {show(features)}")
    coefficients = data.get("coefficients_ms")
    if not (
        isinstance(coefficients, list)
        and len(coefficients) == len(features)
        and all(NUMBER.accepts(c) for c in coefficients)
    ):
        n = len(features)
        ctx.fail("coefficients_ms", f"must be a list of {n} finite numbers, got {show(coefficients)}")
    return tuple(float(c) for c in coefficients)


# --------------------------------------------------------------------------- reading








# --------------------------------------------------------------------------- checking




























# --------------------------------------------------------------------------- building


def _build(ctx: Ctx, data: dict) -> Config:
    """The validated Config of plain data in the YAML layout."""
    top = Section(ctx, data, "", _TOP_KEYS)
    raw_cluster = top.data.get("cluster")
    dp = raw_cluster.get("data_parallel_size", 1) if isinstance(raw_cluster, dict) else 1
    engine = _engine(ctx, top.data.get("engine"), data_parallel_size=dp if is_int(dp) and dp >= 1 else 1)
    cluster = _cluster(ctx, top.data.get("cluster"), top.data.get("engine"), engine)
    if engine.launch is not None and cluster.data_parallel_size != 1:
        ctx.fail(
            "engine.launch",
            "requires cluster.data_parallel_size: 1 (launch timing models one-GPU "
            f"aggregated workers), got {cluster.data_parallel_size}",
        )
    if engine.sglang is not None:
        _check_sglang_cluster(ctx, cluster)
    if "workload" not in data:
        ctx.fail("workload", "required key is missing (a mapping with trace or synthetic)")
    return Config(
        workload=_workload(ctx, data["workload"], engine),
        engine=engine,
        cluster=cluster,
        output=_output(ctx, top.data.get("output")),
        source=ctx.source,
    )


def _check_sglang_cluster(ctx: Ctx, cluster: ClusterConfig):
    """`backend: sglang` runs aggregated workers of one rank, routed by the
    policies of servesim/sglang/cluster.py (docs/sglang.md, "Workers")."""
    if cluster.disaggregated:
        ctx.fail("cluster.mode", "disaggregated is not supported with engine.backend: sglang")
    if cluster.data_parallel_size != 1:
        ctx.fail("cluster.data_parallel_size", "must be 1 with engine.backend: sglang (DP "
                 f"attention is not supported), got {cluster.data_parallel_size}")
    if cluster.router.policy not in SGLANG_ROUTERS:
        ctx.fail("cluster.router", f"{cluster.router.policy} is not supported with "
                 f"engine.backend: sglang (accepted: {', '.join(SGLANG_ROUTERS)})")
    if cluster.router.kv_event_lag_ms:
        ctx.fail("cluster.router.kv_event_lag_ms", "must be 0 with engine.backend: sglang "
                 "(the router sees each worker's radix tree as it is)")


def _workload(ctx: Ctx, data, engine: EngineConfig) -> WorkloadConfig:
    """`workload`: exactly one of a trace file and a synthetic workload."""
    keys = [f.name for f in attrs.fields(WorkloadConfig)]
    s = Section(ctx, data, "workload", keys)
    if s.given("trace") == s.given("synthetic"):
        ctx.fail("workload", "give exactly one of workload.trace (a trace file) and workload.synthetic")
    trace = s.get("trace", PATH, None, nullable=True)
    fmt = s.get("format", enum("mooncake", "azure", "mooncake-delta", "agentic_mooncake"), None,
                nullable=True)
    if trace is not None:
        trace = ctx.resolve(trace, "workload.trace")
        if os.path.isdir(trace):
            ctx.fail("workload.trace", f"{trace} is a directory, not a trace file")
        if not os.path.isfile(trace):
            ctx.fail("workload.trace", f"trace file not found: {trace}")
        fmt = fmt or _format_from_name(ctx, trace)
    elif fmt is not None:
        ctx.fail("workload.format", "applies only to a trace file (workload.trace)")
    synthetic = _synthetic(ctx, s.data["synthetic"], engine) if s.given("synthetic") else None
    concurrency = s.get("concurrency", INT, None, ge(1), nullable=True)
    if concurrency is not None and synthetic is not None and synthetic.concurrency is not None:
        ctx.fail("workload.concurrency", "given twice: set workload.concurrency or workload.synthetic.concurrency, not both")
    return WorkloadConfig(
        trace=trace,
        format=fmt,
        trace_block_size=s.get("trace_block_size", INT, 512, ge(1)),
        limit=s.get("limit", INT, None, ge(1), nullable=True),
        speedup=s.get("speedup", NUMBER, 1.0, gt(0)),
        concurrency=concurrency,
        synthetic=synthetic,
    )


def _format_from_name(ctx: Ctx, trace: str) -> str:
    """mooncake for .jsonl/.json, azure for .csv (optionally .gz)."""
    name = trace.lower().removesuffix(".gz")
    if name.endswith((".jsonl", ".json")):
        return "mooncake"
    if name.endswith(".csv"):
        return "azure"
    name = os.path.basename(trace)
    ctx.fail("workload.format", f"cannot tell the trace format from the file name {name!r}; set it to mooncake or azure")


def _synthetic(ctx: Ctx, data, engine: EngineConfig) -> SyntheticConfig:
    """`workload.synthetic` (README.md, "Config")."""
    d = _defaults(SyntheticConfig)
    s = Section(ctx, data, "workload.synthetic", list(d))
    arrival = s.get("arrival", enum("burst", "poisson", "constant"), d["arrival"])
    rate = s.get("rate", NUMBER, None, gt(0), nullable=True)
    sessions = _sessions(ctx, s) if s.given("sessions") else None
    if sessions is not None:
        if arrival == "burst" and sessions.sessions_per_second is not None:
            arrival = "poisson"
        if arrival != "burst" and sessions.sessions_per_second is None:
            ctx.fail(s.sub("sessions") + ".sessions_per_second",
                     f"arrival {arrival} of sessions needs sessions_per_second (a number > 0)")
        rate = sessions.sessions_per_second
    elif arrival != "burst" and rate is None:
        ctx.fail(s.sub("rate"), f"arrival {arrival} needs a rate in requests/s (a number > 0)")
    prefix = s.get("shared_prefix_tokens", INT, d["shared_prefix_tokens"], ge(0))
    block_size = engine.kv_cache.block_size
    if prefix % block_size:
        ctx.fail(s.sub("shared_prefix_tokens"), f"must be a multiple of engine.block_size ({block_size}), got {prefix}")
    input_tokens = _lengths(ctx, s, "input_tokens")
    longest = input_tokens.value if input_tokens.distribution == "constant" else input_tokens.max
    if longest and prefix > longest:  # (a lognormal without max has no longest)
        ctx.fail(s.sub("shared_prefix_tokens"), f"{prefix} is longer than any prompt "
                 f"(input_tokens is at most {longest})")
    return SyntheticConfig(
        requests=s.get("requests", INT, d["requests"], ge(1)),
        input_tokens=input_tokens,
        output_tokens=_lengths(ctx, s, "output_tokens"),
        arrival=arrival,
        rate=rate,
        concurrency=s.get("concurrency", INT, None, ge(1), nullable=True),
        shared_prefix_tokens=prefix,
        seed=s.get("seed", INT, d["seed"], ge(0)),
        sessions=sessions,
    )


def _sessions(ctx: Ctx, outer: Section) -> SessionsConfig:
    """`workload.synthetic.sessions` (README, "Workloads"). The request-level
    keys of `synthetic` do not apply to sessions."""
    defaults = _defaults(SyntheticConfig)
    given = outer.data["sessions"]
    sessions_rate = given.get("sessions_per_second") if isinstance(given, dict) else None
    for key in ("requests", "input_tokens", "output_tokens", "rate"):
        value = outer.data.get(key)
        if key in ("input_tokens", "output_tokens") and value is not None:
            value = _lengths(ctx, outer, key)
        if value is not None and value != defaults[key] and not (key == "rate" and value == sessions_rate):
            ctx.fail(outer.sub(key), "does not apply with sessions (set workload.synthetic."
                     "sessions.count, new_input_tokens, output_tokens, sessions_per_second)")
    d = _defaults(SessionsConfig)
    s = Section(ctx, outer.data["sessions"], outer.sub("sessions"), list(d))
    think = d["think_time"]
    if "think_time" in s.data:
        value = s.data["think_time"]
        if isinstance(value, dict):
            think = _lengths(ctx, s, "think_time", d)
        else:
            think = float(s.get("think_time", NUMBER, 0.0, ge(0)))
    return SessionsConfig(
        count=s.get("count", INT, d["count"], ge(1)),
        turns=s.get("turns", INT, d["turns"], ge(1)),
        new_input_tokens=_lengths(ctx, s, "new_input_tokens", d),
        output_tokens=_lengths(ctx, s, "output_tokens", d),
        think_time=think,
        sessions_per_second=s.get("sessions_per_second", NUMBER, None, gt(0), nullable=True),
        shared_prefix_ratio=float(s.get("shared_prefix_ratio", NUMBER, 0.0, ge(0), le(1))),
        prefix_groups=s.get("prefix_groups", INT, 0, ge(0)),
    )


def _sessions_to_data(cfg: SessionsConfig) -> dict:
    data = attrs.asdict(cfg, recurse=False)
    for key in ("new_input_tokens", "output_tokens"):
        data[key] = _lengths_to_data(data[key])
    if isinstance(cfg.think_time, LengthDistribution):
        data["think_time"] = _lengths_to_data(cfg.think_time)
    return data


def _lengths(ctx: Ctx, s: Section, key: str, defaults=None) -> LengthDistribution:
    """A token-count distribution: an int (constant) or {distribution: ...}.
    A lognormal without `max` is stored with max 0: no upper clip."""
    path = s.sub(key)
    if key not in s.data:
        return (defaults or _defaults(SyntheticConfig))[key]
    value = s.data[key]
    if not isinstance(value, dict):
        if not is_int(value):
            kinds = "|".join(_DISTRIBUTION_PARAMS)
            ctx.fail(path, f"must be an integer >= 1 or a mapping {{distribution: {kinds}, ...}}, got {show(value)}")
        return LengthDistribution(value=check(ctx, path, value, INT, ge(1)))
    kind, d = tagged_section(ctx, value, path, "distribution", REQUIRED, _DISTRIBUTION_PARAMS)
    if kind == "constant":
        return LengthDistribution(value=d.get("value", INT, REQUIRED, ge(1)))
    if kind == "zipf":
        a = d.get("a", NUMBER, REQUIRED, gt(1))
    elif kind == "lognormal":
        mean, sigma = d.get("mean", NUMBER), d.get("sigma", NUMBER, REQUIRED, ge(0))
    low = d.get("min", INT, _DISTRIBUTION_PARAMS[kind]["min"], ge(1))
    high = d.get("max", INT, _DISTRIBUTION_PARAMS[kind]["max"], ge(low), nullable=kind == "lognormal")
    if kind == "uniform":
        return LengthDistribution(distribution=kind, min=low, max=high)
    if kind == "zipf":
        return LengthDistribution(distribution=kind, a=a, min=low, max=high)
    return LengthDistribution(distribution=kind, mean=mean, sigma=sigma, min=low, max=high or 0)


def _engine(ctx: Ctx, data, path_of=None, data_parallel_size=1) -> EngineConfig:
    """`engine`: flat keys split into the KV cache, scheduler and engine configs.
    `path_of(key)` names where each key came from when `data` merges a
    pool's overrides into `engine` (messages then say `cluster.prefill.KEY`
    or `engine.KEY`). `backend: sglang` reads SGLang's keys instead
    (servesim/config/sglang_config.py)."""
    if path_of is None:
        def path_of(key):
            return join("engine", key)
    backend = data.get("backend", "vllm") if isinstance(data, dict) else "vllm"
    backend = check(ctx, path_of("backend"), backend, enum(*BACKENDS))
    if backend == "sglang":
        return parse_sglang_engine(ctx, data, path_of, _timing)
    if isinstance(data, dict):
        check_backend_keys(ctx, data, "vllm", path_of)
    s = Section(ctx, data, "engine", _ENGINE_KEYS, path_of)
    kv_cache = _kv_cache(s)
    scheduler = _scheduler(ctx, s)
    launch = _launch(ctx, s.data.get("launch"), s.sub("launch"))
    speculative = parse_speculative(ctx, s.data.get("speculative"), s.sub("speculative"),
                                    scheduler, launch)
    if launch is not None and not scheduler.async_scheduling:
        ctx.fail(s.sub("launch"), f"requires {s.sub('async_scheduling')}: true")
    if speculative is not None and s.given("kv_offloading"):
        ctx.fail(s.sub("speculative"), f"does not combine with {s.sub('kv_offloading')} "
                 "(the CPU tier's rules are not written for speculative decoding's drafts "
                 "and lookahead slots)")
    deployment, kv_cache, scheduler = read_deployment(ctx, s, kv_cache, scheduler,
                                                      data_parallel_size)
    timing = _timing(ctx, s.data.get("timing"), s.sub("timing"))
    if timing.type == "aic" and deployment is None:
        ctx.fail(s.sub("timing"), f"type aic requires a deployment: {s.sub('model')} and {s.sub('gpu')}")
    check_drafts_priced(ctx, timing, speculative, s.sub("timing"))
    check_drafter(ctx, speculative, deployment, s.sub("speculative"))
    engine = EngineConfig(
        kv_cache=kv_cache,
        scheduler=scheduler,
        deployment=deployment,
        timing=timing,
        launch=launch,
        detokenize_ms=s.get("detokenize_ms", NUMBER, 0.0, ge(0)),
        frontend=_frontend(ctx, s.data.get("frontend"), s.sub("frontend"),
                           _default_frontend(timing.type)),
        host_ms_per_pass=s.get("host_ms_per_pass", NUMBER, default_host_ms_per_pass(timing.type),
                               ge(0)),
        kv_offloading=_kv_offloading(ctx, s.data.get("kv_offloading"), s.sub("kv_offloading")),
        speculative=speculative,
    )
    check_engine_pricing(ctx, s.sub, engine)
    return engine


def _kv_cache(s: Section) -> KVCacheConfig:
    d = _defaults(KVCacheConfig)
    return KVCacheConfig(
        block_size=s.get("block_size", INT, d["block_size"], ge(1)),
        num_gpu_blocks=s.get("num_gpu_blocks", INT, d["num_gpu_blocks"], ge(2)),
        enable_prefix_caching=s.get("enable_prefix_caching", BOOL, d["enable_prefix_caching"]),
    )


def _scheduler(ctx: Ctx, s: Section) -> SchedulerConfig:
    """The scheduler keys, with vLLM's cross-checks of the token budget."""
    d = _defaults(SchedulerConfig)
    cfg = SchedulerConfig(
        max_num_seqs=s.get("max_num_seqs", INT, d["max_num_seqs"], ge(1)),
        max_num_batched_tokens=s.get("max_num_batched_tokens", INT, d["max_num_batched_tokens"], ge(1)),
        max_model_len=s.get("max_model_len", INT, None, ge(1), nullable=True),
        enable_chunked_prefill=s.get("enable_chunked_prefill", BOOL, d["enable_chunked_prefill"]),
        long_prefill_token_threshold=s.get("long_prefill_token_threshold", INT, d["long_prefill_token_threshold"], ge(0)),
        scheduling_policy=s.get("scheduling_policy", enum("fcfs", "priority"), d["scheduling_policy"]),
        reserve_full_isl=s.get("reserve_full_isl", BOOL, d["reserve_full_isl"]),
        watermark=s.get("watermark", NUMBER, d["watermark"], ge(0), lt(1)),
        async_scheduling=s.get("async_scheduling", BOOL, d["async_scheduling"]),
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


def _timing(ctx: Ctx, data, path="engine.timing") -> TimingConfig:
    """`engine.timing`: a type and that type's parameters (docs/engine.md §10)."""
    if data is None:
        return TimingConfig()
    kind, s = tagged_section(ctx, data, path, "type", "polynomial", _TIMING_PARAMS)
    if kind == "fitted":
        model = ctx.resolve(s.get("model", PATH), s.sub("model"))
        if not os.path.isfile(model):
            ctx.fail(s.sub("model"), f"fitted model file not found: {model}")
        return TimingConfig(type=kind, model=model, coefficients_ms=read_fitted_model(model),
                            **read_fitted_provenance(model))
    if kind == "aic":
        if not s.given("calibration"):
            return TimingConfig(type=kind)
        calibration = ctx.resolve(s.get("calibration", PATH))
        if not os.path.isfile(calibration):
            ctx.fail(s.sub("calibration"), f"calibration file not found: {calibration}")
        return TimingConfig(type=kind, calibration=calibration,
                            calibration_factors=read_calibration(calibration))
    params = {key: s.get(key, NUMBER, default, ge(0)) for key, default in _TIMING_PARAMS[kind].items()}
    return TimingConfig(type=kind, **params)


def _launch(ctx: Ctx, data, path="engine.launch") -> LaunchConfig | None:
    """`engine.launch` (docs/engine.md §8), or None."""
    if data is None:
        return None
    d = _defaults(LaunchConfig)
    s = Section(ctx, data, path, list(d))
    costs = {key: s.get(key, NUMBER, d[key], ge(0)) for key in ("decode_ms", "piecewise_ms", "eager_ms")}
    return LaunchConfig(
        **costs,
        eager_queue_fraction=s.get("eager_queue_fraction", NUMBER, d["eager_queue_fraction"], ge(0), le(1)),
        max_cudagraph_capture_size=s.get("max_cudagraph_capture_size", INT, d["max_cudagraph_capture_size"], ge(1)),
    )


def _default_frontend(timing_type: str) -> FrontendConfig | None:
    """`engine.frontend` when the config leaves it out (servesim/deployment/host_time.py)."""
    keys = default_frontend(timing_type)
    return None if keys is None else FrontendConfig(**keys)


def _frontend(ctx: Ctx, data, path="engine.frontend",
              default: FrontendConfig | None = None) -> FrontendConfig | None:
    """`engine.frontend`: the API server's delay of each request (docs/engine.md
    §8, "Frontend"); `default` when it is left out (servesim/deployment/
    host_time.py), a key left out 0; None when there is no delay."""
    if data is None:
        return default
    d = _defaults(FrontendConfig)
    s = Section(ctx, data, path, list(d))
    frontend = FrontendConfig(**{key: s.get(key, NUMBER, d[key], ge(0)) for key in d})
    return None if frontend == FrontendConfig() else frontend


def _kv_offloading(ctx: Ctx, data, path="engine.kv_offloading") -> KVOffloadingConfig | None:
    """`engine.kv_offloading`: the CPU tier (docs/engine.md §9), or None."""
    if data is None:
        return None
    keys = [f.name for f in attrs.fields(KVOffloadingConfig)]
    s = Section(ctx, data, path, keys)
    return KVOffloadingConfig(
        num_cpu_blocks=s.get("num_cpu_blocks", INT, REQUIRED, ge(1)),
        bytes_per_token=s.get("bytes_per_token", INT, REQUIRED, ge(1)),
        d2h_gbps=s.get("d2h_gbps", NUMBER, REQUIRED, gt(0)),
        h2d_gbps=s.get("h2d_gbps", NUMBER, REQUIRED, gt(0)),
        connector=s.get("connector", enum("offloading", "simple_cpu"), "offloading"),
    )


def _cluster(ctx: Ctx, data, engine_data, engine: EngineConfig) -> ClusterConfig:
    """`cluster`: aggregated workers (the default), or disaggregated prefill
    and decode pools (servesim/engine/kv_handoff.py)."""
    d = _defaults(ClusterConfig)
    if isinstance(data, dict):
        disaggregated = data.get("mode") == "disaggregated"
        for key in data:
            if key not in _CLUSTER_KEYS:
                close = did_you_mean(key, _CLUSTER_KEYS)
                if close:
                    ctx.fail(join("cluster", key), "unknown key" + close)
                if disaggregated:
                    message = f"unknown key (accepted: {', '.join(_DISAGGREGATED_KEYS)})"
                else:
                    extra = ", ".join(k for k in _DISAGGREGATED_KEYS if k != "mode")
                    message = (f"unknown key (accepted: {', '.join(_AGGREGATED_KEYS)}); "
                               f"with mode: disaggregated: {extra}")
                ctx.fail(join("cluster", key), message)
    s = Section(ctx, data, "cluster", _CLUSTER_KEYS)
    mode = s.get("mode", enum("aggregated", "disaggregated"), d["mode"])
    common = dict(
        data_parallel_size=s.get("data_parallel_size", INT, d["data_parallel_size"], ge(1)),
        router=parse_router(ctx, s.data.get("router"), s.sub("router")),
    )
    if mode == "aggregated":
        for key in _DISAGGREGATED_KEYS:
            if key not in _AGGREGATED_KEYS and key != "mode" and key in s.data:
                ctx.fail(s.sub(key), "applies only to cluster.mode: disaggregated")
        return ClusterConfig(workers=s.get("workers", INT, d["workers"], ge(1)), **common)
    if "workers" in s.data:
        ctx.fail(s.sub("workers"), "applies only to cluster.mode: aggregated; a disaggregated "
                 "cluster has cluster.prefill_workers and cluster.decode_workers")
    widths = {pool: _pool_data_parallel_size(ctx, s, pool) for pool in _POOLS}
    pools = {pool: _pool_engine(ctx, s, pool, engine_data, engine,
                                widths[pool] or common["data_parallel_size"])
             for pool in _POOLS}
    return ClusterConfig(
        mode=mode,
        prefill_workers=s.get("prefill_workers", INT, 1, ge(1)),
        decode_workers=s.get("decode_workers", INT, 1, ge(1)),
        prefill=pools["prefill"],
        decode=pools["decode"],
        kv_transfer=_kv_transfer(ctx, s, pools["prefill"].deployment),
        prefill_data_parallel_size=widths["prefill"],
        decode_data_parallel_size=widths["decode"],
        **common,
    )


def _pool_data_parallel_size(ctx: Ctx, s: Section, pool: str):
    """`cluster.prefill.data_parallel_size` / `cluster.decode.data_parallel_size`:
    the attention-DP ranks of each of the pool's workers, or None when not
    given (`cluster.data_parallel_size` applies). A cluster key, not an
    engine key: it is read out of the pool's mapping before the engine
    overrides are."""
    overrides = s.data.get(pool)
    if not isinstance(overrides, dict) or "data_parallel_size" not in overrides:
        return None
    return check(ctx, join(s.sub(pool), "data_parallel_size"), overrides["data_parallel_size"],
                 INT, ge(1))


def _pool_engine(ctx: Ctx, s: Section, pool: str, engine_data, engine: EngineConfig,
                 data_parallel_size: int = 1) -> EngineConfig:
    """`cluster.prefill` / `cluster.decode`: `engine` with the pool's keys
    replacing its own (a mapping such as `timing` is replaced whole), checked
    like `engine`; a message names the key where it was given. Launch timing
    and the CPU tier are not modelled on disaggregated workers, and both pools
    share `block_size` and `max_model_len` (one model, whole blocks moved).
    The pool's `data_parallel_size` (read by `_pool_data_parallel_size`) is
    not an engine key; a deployment derives its blocks with it."""
    overrides = s.data.get(pool)
    path = s.sub(pool)
    if overrides is None:
        overrides = {}
    if not isinstance(overrides, dict):
        ctx.fail(path, f"must be a mapping of engine keys (overrides of engine for the {pool} "
                 f"workers) and data_parallel_size, got {show(overrides)}")
    pool_keys = (*_ENGINE_KEYS, "data_parallel_size")
    for key in overrides:  # the did-you-mean knows the pool's own key too
        if key not in pool_keys:
            ctx.fail(join(path, key), "unknown key" + did_you_mean(key, pool_keys, list_all=True))
    overrides = {key: value for key, value in overrides.items() if key != "data_parallel_size"}
    if "frontend" in overrides:
        ctx.fail(join(path, "frontend"), "the API server is in front of the whole cluster: "
                 "set engine.frontend instead")
    merged = {**(engine_data if isinstance(engine_data, dict) else {}), **overrides}

    def path_of(key):
        return join(path, key) if key in overrides else join("engine", key)

    for key, reason in (("launch", "launch timing models one-GPU aggregated workers"),
                        ("speculative", "speculative decoding is simulated on aggregated "
                         "workers only"),
                        ("kv_offloading", "the CPU tier does not combine with the KV "
                         "transfer connector in servesim (vLLM would need a MultiConnector)")):
        if merged.get(key) is not None:
            ctx.fail(path_of(key), f"is not supported on disaggregated {pool} workers "
                     f"(cluster.mode: disaggregated): {reason}; remove it")
    config = _engine(ctx, merged, path_of, data_parallel_size)
    for key in _SHARED_ENGINE_KEYS:
        if key in overrides:
            ours = getattr(config.kv_cache if key == "block_size" else config.scheduler, key)
            theirs = getattr(engine.kv_cache if key == "block_size" else engine.scheduler, key)
            if ours != theirs:
                ctx.fail(path_of(key), f"must equal engine.{key} ({show(theirs)}), got "
                         f"{show(ours)}: both pools serve one model and move whole blocks "
                         f"between them; set engine.{key} instead")
    return config


def _kv_transfer(ctx: Ctx, s: Section, prefill_deployment) -> KVTransferConfig:
    """`cluster.kv_transfer`: the prefill-to-decode link (required). With a
    named prefill deployment (engine.model, engine.gpu) `bytes_per_token` and
    `bandwidth_gbps` may be left out: derived (servesim/deployment/kv_transfer.py)."""
    if s.data.get("kv_transfer") is None:
        ctx.fail(s.sub("kv_transfer"), "required key is missing in disaggregated mode (a mapping "
                 "{bytes_per_token, bandwidth_gbps, latency_ms}; the first two are derived "
                 "when the deployment names engine.model and engine.gpu)")
    t = Section(ctx, s.data["kv_transfer"], s.sub("kv_transfer"),
                 [f.name for f in attrs.fields(KVTransferConfig)])
    derived = {}
    if prefill_deployment is not None and not ("bytes_per_token" in t.data and "bandwidth_gbps" in t.data):
        from servesim.deployment.kv_transfer import link_defaults

        derived = link_defaults(prefill_deployment)
    return KVTransferConfig(
        bytes_per_token=t.get("bytes_per_token", INT, derived.get("bytes_per_token", REQUIRED), ge(1)),
        bandwidth_gbps=t.get("bandwidth_gbps", NUMBER, derived.get("bandwidth_gbps", REQUIRED), gt(0)),
        latency_ms=t.get("latency_ms", NUMBER, 0.0, ge(0)),
    )


def _output(ctx: Ctx, data) -> OutputConfig:
    d = _defaults(OutputConfig)
    s = Section(ctx, data, "output", list(d))
    return OutputConfig(
        per_request=s.get("per_request", BOOL, d["per_request"]),
        pass_log=s.get("pass_log", BOOL, d["pass_log"]),
        telemetry_interval_ms=s.get("telemetry_interval_ms", NUMBER, None, gt(0), nullable=True),
    )


# --------------------------------------------------------------------------- writing


def _timing_to_data(timing: TimingConfig) -> dict:
    """The timing block: its type and that type's parameters only."""
    if timing.type == "fitted":
        return {"type": "fitted", "model": timing.model}
    if timing.type == "aic":
        return {"type": "aic", "calibration": timing.calibration}
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










__all__ = ["load_config", "config_from_dict", "config_to_dict", "read_fitted_model"]
