"""The search space `servesim plan` generates from a deployment (README
"Capacity planning", "servesim plan"), and the points it prunes before any
replay.

A worker *shape* is one engine: a GPU type, a `tensor_parallel_size` and a
rung of the ladder (`max_num_seqs`, `max_num_batched_tokens`; with
`engine.backend: sglang` SGLang's `max_running_requests` and
`chunked_prefill_size`). A shape is kept only if the engine would start it:
`load_config` applies vLLM's start-up checks (servesim/deployment/startup.py:
the attention and KV heads split over TP, `max_model_len` within the model's
context; a derived KV cache, servesim/deployment/kv_capacity.py, that holds
the weights and one `max_model_len` request), or SGLang's
(servesim/deployment/sglang_capacity.py: the pool `mem_fraction_static`
leaves, one `context_length` request in it), so a refused shape is excluded
with the engine's reason.

The points:

- aggregated: one shape × 1..N workers (N: what `--gpus-max` allows);
- disaggregated (vLLM only: servesim's SGLang engine has no PD
  disaggregation): a prefill shape × its workers and a decode shape × its
  workers, each pool its own GPU type and TP; the prefill pool takes the
  ladder's `max_num_batched_tokens` (with the largest `max_num_seqs`), the
  decode pool its `max_num_seqs` (with the largest `max_num_batched_tokens`).
  The KV link is derived from the model and the prefill GPU
  (servesim/deployment/kv_transfer.py).

Every point sets every key it depends on, and unsets (`null`) the keys of
the other mode, so one grid holds both.

Pruning before a replay (`prune`), each rule a bound no replay can beat:

- `ttft`: every request's TTFT is at least its prompt's prefill run alone
  (its uncached tokens in chunks of `max_num_batched_tokens`, nothing else in
  the passes; a token's block that no earlier request holds cannot be a
  cache hit), so the statistic of those prefill times (the SLO's mean or
  percentile) is a floor under the replay's; a shape whose floor misses a
  TTFT target cannot meet it at any worker count;
- `tpot`: likewise every output token after the first takes at least one
  decode pass of that request alone at its context;
- `prefill_load` / `decode_load`: the GPU time the load's prompts need
  alone (each prompt's prefill less one pass's fixed cost per chunk, which a
  shared pass pays once), over the workers, is a share `u` of the arrivals'
  span; for a decode pool, the output tokens at the largest batch the pool
  can hold (`max_num_seqs`, its KV blocks) at the shortest context. With
  `u > 1` the backlog at time `t` is at least `(u - 1) t`, and a request
  arriving then waits at least that (first come, first served), so with
  arrivals spread over the span a share `1 - T / ((u - 1) span)` of them
  waits more than `T`: the point is pruned when that share exceeds what a
  percentile target allows (pXX: `(u - 1) span XX/100 > T`; a mean:
  `(u - 1) span / 2 > T`), `T` the TTFT target (prefill) or the TPOT target
  times the output tokens after the first (decode: the wait delays a
  request's second token). (The work is an estimate and arrivals are taken
  as even: `--no-prune` runs these points too.)

A point with more GPUs (or more $/h) than one that already meets the SLOs
cannot win: search.py skips it by level.
"""

import attrs
import numpy as np

from servesim.errors import InputError

TENSOR_PARALLEL_SIZES = (1, 2, 4, 8)  # one node's GPUs; TP beyond a node is not searched
MAX_NUM_SEQS_LADDER = (64, 256)  # vLLM's default on large GPUs is 256 (engine/arg_utils.py)
MAX_NUM_BATCHED_TOKENS_LADDER = (2048, 8192)  # vLLM's defaults for small / large GPUs
_MODE_KEYS = ("cluster.workers", "cluster.prefill_workers", "cluster.decode_workers", "cluster.prefill",
              "cluster.decode", "cluster.kv_transfer")


@attrs.frozen(order=True)
class Shape:
    """A worker shape; the ladder's rungs are `max_num_seqs` and
    `max_num_batched_tokens` under vLLM, `max_running_requests` and
    `chunked_prefill_size` (the same two budgets: request slots and
    prompt tokens a pass) under `backend: sglang`."""

    gpu: str
    tensor_parallel_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    backend: str = "vllm"

    def engine_values(self) -> dict:
        if self.backend == "sglang":
            return {"gpu": self.gpu, "tensor_parallel_size": self.tensor_parallel_size,
                    "max_running_requests": self.max_num_seqs, "chunked_prefill_size": self.max_num_batched_tokens}
        return {"gpu": self.gpu, "tensor_parallel_size": self.tensor_parallel_size,
                "max_num_seqs": self.max_num_seqs, "max_num_batched_tokens": self.max_num_batched_tokens}

    def text(self) -> str:
        if self.backend == "sglang":
            return (f"{self.gpu} TP{self.tensor_parallel_size} running {self.max_num_seqs} "
                    f"chunk {self.max_num_batched_tokens}")
        return f"{self.gpu} TP{self.tensor_parallel_size} seqs {self.max_num_seqs} batched {self.max_num_batched_tokens}"


@attrs.define
class PlanPoint:
    values: dict  # the grid values (dotted keys)
    mode: str  # aggregated | disaggregated
    shapes: tuple  # (shape,) or (prefill shape, decode shape)
    workers: tuple  # (workers,) or (prefill workers, decode workers)
    gpus: int
    gpu_counts: dict  # {gpu type: GPUs}
    pruned: str | None = None  # the rule and its figures, when pruned

    def text(self) -> str:
        if self.mode == "aggregated":
            return f"{self.workers[0]} x {self.shapes[0].text()}"
        return (f"prefill {self.workers[0]} x {self.shapes[0].text()} + "
                f"decode {self.workers[1]} x {self.shapes[1].text()}")


@attrs.frozen
class Space:
    shapes: tuple  # the shapes vLLM would start
    excluded: tuple  # ((gpu, tp, max_num_seqs, max_num_batched_tokens), vLLM's reason) of the others
    points: tuple  # PlanPoint, cheapest first


def check_ladder(name: str, values) -> tuple:
    values = tuple(values)
    if not values or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
        raise InputError(f"{name}: must be positive integers, got {', '.join(map(str, values)) or 'none'}")
    return tuple(sorted(set(values)))


def _shape_overrides(shape: Shape) -> list:
    from servesim.sweep.sweep import override_text

    values = {"cluster.mode": "aggregated", **{k: None for k in _MODE_KEYS}, "cluster.workers": 1,
              **{f"engine.{k}": v for k, v in shape.engine_values().items()}}
    return [override_text(k, v) for k, v in values.items()]


def shapes(config_path: str, gpus, ladder_seqs, ladder_batched, extra=(), backend: str = "vllm") -> tuple:
    """`(shapes the engine would start, [(shape, reason)] of those it would refuse)`."""
    from servesim.config.config import load_config

    ok, refused = [], []
    for gpu in gpus:
        for tp in TENSOR_PARALLEL_SIZES:
            for seqs in ladder_seqs:
                for batched in ladder_batched:
                    shape = Shape(gpu, tp, seqs, batched, backend)
                    try:
                        load_config(config_path, (*extra, *_shape_overrides(shape)))
                    except InputError as e:
                        refused.append((shape, _reason(str(e))))
                    else:
                        ok.append(shape)
    return ok, refused


def _reason(message: str) -> str:
    """vLLM's reason without the config file's name and line, or the key."""
    import re

    return re.sub(r"^(?:\S+?:\d+: |\S+?\.ya?ml: )?(?:--set )?[A-Za-z_][\w.]*: ", "", message, count=1)


def generate(ok_shapes, gpus_max: int, cost_of=None, kv_latency_ms: float = 0.0) -> list:
    """Every aggregated and disaggregated point within `gpus_max` GPUs; the
    disaggregated ones' link with `kv_latency_ms` (the config's, else 0) and
    its bytes and bandwidth derived."""
    points = []
    for s in ok_shapes:
        for w in range(1, gpus_max // s.tensor_parallel_size + 1):
            values = {"cluster.mode": "aggregated", **{k: None for k in _MODE_KEYS}, "cluster.workers": w,
                      **{f"engine.{k}": v for k, v in s.engine_values().items()}}
            g = w * s.tensor_parallel_size
            points.append(PlanPoint(values, "aggregated", (s,), (w,), g, {s.gpu: g}))
    if any(s.backend == "sglang" for s in ok_shapes):  # no PD disaggregation (module docstring)
        ok_shapes = ()
    top_seqs = max(s.max_num_seqs for s in ok_shapes) if ok_shapes else 0
    top_batched = max(s.max_num_batched_tokens for s in ok_shapes) if ok_shapes else 0
    prefill = [s for s in ok_shapes if s.max_num_seqs == top_seqs]
    decode = [s for s in ok_shapes if s.max_num_batched_tokens == top_batched]
    for p in prefill:
        for d in decode:
            for wp in range(1, (gpus_max - d.tensor_parallel_size) // p.tensor_parallel_size + 1):
                left = gpus_max - wp * p.tensor_parallel_size
                for wd in range(1, left // d.tensor_parallel_size + 1):
                    values = {"cluster.mode": "disaggregated", **{k: None for k in _MODE_KEYS},
                              "cluster.prefill_workers": wp, "cluster.decode_workers": wd,
                              **{f"engine.{k}": v for k, v in p.engine_values().items()},
                              "cluster.decode": d.engine_values(),
                              "cluster.kv_transfer": {"latency_ms": kv_latency_ms}}
                    counts = {}
                    for s, w in ((p, wp), (d, wd)):
                        counts[s.gpu] = counts.get(s.gpu, 0) + w * s.tensor_parallel_size
                    points.append(PlanPoint(values, "disaggregated", (p, d), (wp, wd), sum(counts.values()),
                                            counts))
    key = (lambda q: (cost_of(q.gpu_counts), q.gpus)) if cost_of else (lambda q: (q.gpus,))
    points.sort(key=key)  # stable: aggregated before disaggregated at a level, shapes in order
    return points


# --------------------------------------------------------------------------- pruning


@attrs.frozen
class Demand:
    """What the load asks of a deployment, from its requests: each prompt's
    uncached tokens (a lower bound) and cached prefix, its output tokens, the
    span of the arrivals (ms) and the number of requests."""

    uncached: np.ndarray
    cached: np.ndarray
    outputs: np.ndarray
    span_ms: float
    closed_loop: bool


def demand(config_path: str, overrides) -> Demand:
    """The workload at the load the search asks for."""
    from servesim.replay.api import prepare

    cfg, wl, _ = prepare(config_path, overrides)
    # SGLang's tokens are the hash ids' (servesim/replay/sglang.py `prompt_tokens`)
    sglang = cfg.engine.sglang is not None
    block = wl.trace_block_size if cfg.workload.trace is not None or sglang else cfg.engine.kv_cache.block_size
    seen = set()
    n = len(wl.input_length)
    cached = np.zeros(n, dtype=np.int64)
    for i in range(n):
        blocks = wl.hash_flat[wl.hash_offsets[i]:wl.hash_offsets[i + 1]].tolist()
        lead = 0
        while lead < len(blocks) and blocks[lead] in seen:
            lead += 1
        seen.update(blocks)
        cached[i] = min(lead * block, max(int(wl.input_length[i]) - 1, 0))
    closed = wl.concurrency is not None or wl.sessions is not None
    span = float(wl.arrival_ms.max() - wl.arrival_ms.min()) if n > 1 else 0.0
    return Demand(wl.input_length - cached, cached, wl.output_length.astype(np.int64), span, closed)


class ShapeFloors:
    """Per shape, the per-request floors of TTFT and TPOT and the GPU work of
    the load's prompts and outputs (pass prices of the shape's own timing)."""

    def __init__(self, config_path: str, extra, need: Demand):
        self.config_path, self.extra, self.need = config_path, tuple(extra), need
        self._cache = {}

    def of(self, shape: Shape) -> dict:
        if shape not in self._cache:
            self._cache[shape] = self._floors(shape)
        return self._cache[shape]

    def _floors(self, shape: Shape) -> dict:
        from servesim.config.config import load_config
        from servesim.engine.pricing import PassPricer, price_pass

        cfg = load_config(self.config_path, (*self.extra, *_shape_overrides(shape)))
        eng = cfg.engine
        pricer = PassPricer.of_engine(eng, cfg.cluster.data_parallel_size)

        def price(prefill, context, decodes=0, decode_context=0):
            return float(price_pass(pricer.model, pricer.params, prefill, 1 if prefill else 0, decodes,
                                    decode_context, prefill + decodes, (1 if prefill else 0) + decodes,
                                    pricer.kv_capacity_tokens, 0, context, 0))

        chunk = shape.max_num_batched_tokens
        fixed = price(1, 0)
        memo = {}
        ttft, work = [], []
        for new, hit in zip(self.need.uncached.tolist(), self.need.cached.tolist()):
            if (new, hit) not in memo:
                total, passes, done = 0.0, 0, 0
                while done < new:
                    step = min(chunk, new - done)
                    total += price(step, hit + done)
                    done, passes = done + step, passes + 1
                memo[new, hit] = (total, max(total - passes * fixed, 0.0))
            ttft.append(memo[new, hit][0])
            work.append(memo[new, hit][1])
        tpot = []
        dmemo = {}
        prompts = (self.need.uncached + self.need.cached).tolist()
        for p, o in zip(prompts, self.need.outputs.tolist()):
            ctx = p + o // 2
            if ctx not in dmemo:
                dmemo[ctx] = price(0, 0, 1, ctx)
            tpot.append(dmemo[ctx] if o > 1 else np.nan)
        # the decode pool's best rate: its largest batch (max_num_seqs, or what its
        # KV blocks hold at the shortest context) at that shortest context
        shortest = max(int(min(prompts)), 1) if prompts else 1
        batch = int(max(1, min(shape.max_num_seqs, pricer.kv_capacity_tokens // shortest)))
        per_token = price(0, 0, batch, batch * shortest) / batch
        return {"ttft": np.array(ttft), "tpot": np.array(tpot), "prefill_work_ms": float(sum(work)),
                "decode_work_ms": float(self.need.outputs.clip(min=1).sum() - len(prompts)) * per_token}


def _stat(values: np.ndarray, stat: str) -> float:
    values = values[~np.isnan(values)]
    if not len(values):
        return 0.0
    return float(values.mean()) if stat == "mean" else float(np.percentile(values, float(stat[1:])))


def prune(points, floors: ShapeFloors, slos, data_parallel_size: int = 1) -> dict:
    """Mark the points no replay of which can meet the SLOs (module
    docstring); returns {rule: points pruned}."""
    targets = {}
    for name, metric, stat, value in slos.percentiles:
        base = name.split("_")[0]
        if base in ("ttft", "tpot"):
            targets.setdefault(base, []).append((name, stat, value))
    span = floors.need.span_ms
    counts = {"ttft": 0, "tpot": 0, "prefill_load": 0, "decode_load": 0}

    def floor_miss(shape, metric):
        f = floors.of(shape)
        for name, stat, value in targets.get(metric, ()):
            figure = _stat(f[metric], stat)
            if figure > value:
                return metric, (f"{shape.text()}: a request alone already takes {name.replace('_ms', '')} "
                                f"{figure:.1f} ms (target {value:g})")
        return None

    outputs = floors.need.outputs
    mean_tokens = float(np.mean(np.maximum(outputs - 1, 1))) if len(outputs) else 1.0

    def overload_miss(load, metric, per):
        for name, stat, value in targets.get(metric, ()):
            share = 0.5 if stat == "mean" else float(stat[1:]) / 100
            if (load - 1) * span * share / per > value:
                return name
        return None

    for q in points:
        found = None
        prefill_shape, decode_shape = q.shapes[0], q.shapes[-1]
        found = floor_miss(prefill_shape, "ttft") or floor_miss(decode_shape, "tpot")
        if found is None and span > 0 and not floors.need.closed_loop:
            ranks = q.workers[0] * data_parallel_size
            load = floors.of(prefill_shape)["prefill_work_ms"] / (ranks * span)
            missed = overload_miss(load, "ttft", 1.0) if load > 1 else None
            if missed:
                found = ("prefill_load", f"its prompts alone need {load:.0%} of the prefill GPUs' time over the "
                         f"arrivals, a backlog that misses {missed}")
            elif q.mode == "disaggregated":
                load = floors.of(decode_shape)["decode_work_ms"] / (q.workers[1] * data_parallel_size * span)
                missed = overload_miss(load, "tpot", mean_tokens) if load > 1 else None
                if missed:
                    found = ("decode_load", f"its output tokens alone need {load:.0%} of the decode GPUs' time "
                             f"over the arrivals, a backlog that misses {missed}")
        if found is not None:
            counts[found[0]] += 1
            q.pruned = f"{found[0]}: {found[1]}"
    return counts
