"""What is checked on a resolved config and its workload before simulating.

`check_run(cfg, workload)` is the one function `servesim validate` and
`servesim run` (through `servesim.run`) both call after loading, so `validate`
says "ok" only for what `run` accepts. It checks what the config schema alone
cannot see (a trace row's `dp_rank` against `cluster.data_parallel_size`) and
the memory the run would take: `estimate_memory` adds up the arrays a run
allocates from the resolved numbers (each pool's `num_gpu_blocks` and
`num_cpu_blocks`, the requests' lengths, the telemetry samples), and
`check_memory` refuses a run whose estimate would not fit in this machine's
memory, naming the key that takes the most (and the estimate), instead of a
MemoryError half-way. `check_config(cfg)` runs the part that needs no workload
first, so a synthetic workload is never generated at a size that cannot fit.

The estimate is deliberately rough (bytes per block, per token, per request,
per telemetry sample, from the arrays in kvcache/, scheduler/, engine/ and
replay/); it only has to tell a run that fits from one that is orders of
magnitude too big. Every pool size, derived or given, goes through the same
`pool_sizes` -> `check_memory` path.
"""

import os

import attrs
import numpy as np

from servesim.errors import InputError

# Bytes, from the arrays a run allocates (rounded up).
GPU_BLOCK_BYTES = 48  # kvcache/block_pool.py: 6 int64 fields per block, per rank
IDENTITY_BYTES = 4  # the block pool's identity -> block map (int32), per rank
VIEW_BYTES = 1  # with a KV event lag, the router's view of each identity (uint8), per rank
EVENT_BYTES = 16  # and each queued KV event (int64 event, float64 time)
# kvcache/cpu_tier.py `TierArrays`, per rank with a CPU tier (its job
# arrays grow with the jobs in flight, not with a config key):
CPU_SLOT_BYTES = 48  # per slot held: the tier's NUM_TIER_ROWS (5) int64 rows + a free-slot entry (int64)
CPU_IDENTITY_BYTES = 4  # `slot_of`: each block identity's slot (int32)
CPU_GPU_BLOCK_BYTES = 8  # `storing`: the latest store reading each G1 block (int64)
TOKEN_BYTES = 16  # engine/release.py: a client time per output token, then its compact copy
REQUEST_BLOCK_BYTES = 16  # block identities (int64) and block tables (int32) per request block
REQUEST_BYTES = 1024  # per-request state, records and output rows
# generating synthetic sessions (workload/sessions.py `accumulate_deltas`):
# each turn's hash ids as Python ints in a list, then flattened to int64
SESSION_ID_BYTES = 56
# a rank's fixed cost: its block pool, scheduler and worker objects and
# arrays besides the blocks (measured: ~75 KB more a worker, 8 workers against 2)
RANK_BYTES = 128 * 1024
SAMPLE_BYTES = 1024  # replay/telemetry.py: one dict per worker-rank per sample
TELEMETRY_WARN_SAMPLES = 1_000_000
MAX_TRACE_BLOCK = 32  # engine blocks in a synthetic trace block, at most
MAX_COMPILED = 512  # DP ranks per worker (`check_compiled_limits`)
SYNTHETIC_PLACES = {"output_length": "workload.synthetic.requests x output_tokens",
                    "input_length": "workload.synthetic.requests x input_tokens"}


@attrs.frozen
class PoolSize:
    """The resolved sizes of one pool of engines (a worker's DP ranks): the
    config key path its sizes come from, how many ranks, and their blocks."""

    key: str  # "engine", "cluster.prefill", "cluster.decode"
    ranks: int
    num_gpu_blocks: int
    num_cpu_blocks: int
    block_size: int
    kv_events: bool = False  # its ranks queue KV events for a lagging router


def pool_sizes(cfg) -> list:
    """The :class:`PoolSize` of every pool of a resolved config."""
    c = cfg.cluster
    if c.disaggregated:
        pools = [("cluster.prefill", c.prefill, c.prefill_workers * c.pool_data_parallel_size("prefill")),
                 ("cluster.decode", c.decode, c.decode_workers * c.pool_data_parallel_size("decode"))]
    else:
        pools = [("engine", cfg.engine, c.workers * c.data_parallel_size)]
    out = []
    for key, engine, ranks in pools:
        off = engine.kv_offloading
        out.append(PoolSize(key, ranks, engine.kv_cache.num_gpu_blocks,
                            off.num_cpu_blocks if off is not None else 0, engine.kv_cache.block_size,
                            c.router.kv_event_lag_ms > 0 and key != "cluster.decode"))
    return out


CGROUP_MEMORY_MAX = "/sys/fs/cgroup/memory.max"  # cgroup v2: this process's group limit


def _cgroup_limit():
    try:
        with open(CGROUP_MEMORY_MAX, encoding="ascii") as f:
            text = f.read().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def memory_limit() -> tuple:
    """`(bytes, what)`: the memory this process may use, the least of the
    machine's physical memory, its address-space rlimit (`ulimit -v`) and its
    cgroup's `memory.max` (a container's limit)."""
    limits = []
    try:
        limits.append((os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "this machine has"))
    except (ValueError, OSError, AttributeError):
        pass
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY:
            limits.append((soft, "this process may take (ulimit -v)"))
    except (ImportError, OSError, ValueError):
        pass
    cgroup = _cgroup_limit()
    if cgroup is not None:
        limits.append((cgroup, f"this process's cgroup allows ({CGROUP_MEMORY_MAX})"))
    return min(limits, default=(1 << 62, "this machine has"))


def _gb(n: float) -> str:
    return f"{n / 1e9:.3g} GB"


def estimate_memory(pools, requests: int, request_blocks: int, output_tokens: int,
                    telemetry_samples: int = 0) -> dict:
    """Bytes a run would allocate, per config key that sizes them:
    {key: (bytes, what)}. `request_blocks` / `output_tokens` are sums over
    the requests (prompt plus output blocks; output tokens)."""
    parts = {}
    identities = request_blocks  # at most one identity per request block
    for p in pools:
        workers = "cluster.workers" if p.key == "engine" else f"{p.key}_workers"
        parts[workers] = (p.ranks * RANK_BYTES, f"{p.ranks} rank(s)")
        parts[f"{p.key}.num_gpu_blocks"] = (
            p.ranks * (p.num_gpu_blocks * GPU_BLOCK_BYTES + identities * IDENTITY_BYTES),
            f"{p.ranks} rank(s) x {p.num_gpu_blocks} blocks")
        if p.kv_events:  # block_pool.event_queue: the router's view, the ring of events
            ring = max(4 * p.num_gpu_blocks, 4096)
            parts["cluster.router.kv_event_lag_ms"] = (
                p.ranks * (identities * VIEW_BYTES + ring * EVENT_BYTES),
                f"{p.ranks} rank(s) x a view of {identities} identities and {ring} events")
        if p.num_cpu_blocks:
            held = min(p.num_cpu_blocks, identities)  # TierArrays' slots: it never holds more
            parts[f"{p.key}.kv_offloading.num_cpu_blocks"] = (
                p.ranks * (held * CPU_SLOT_BYTES + identities * CPU_IDENTITY_BYTES
                           + p.num_gpu_blocks * CPU_GPU_BLOCK_BYTES),
                f"{p.ranks} rank(s) x up to {held} CPU blocks")
    parts["output_length"] = (output_tokens * TOKEN_BYTES, f"{output_tokens} output tokens")
    parts["input_length"] = (request_blocks * REQUEST_BLOCK_BYTES + requests * REQUEST_BYTES,
                             f"{requests} requests, {request_blocks} KV blocks")
    if telemetry_samples:
        ranks = sum(p.ranks for p in pools)
        parts["output.telemetry_interval_ms"] = (telemetry_samples * ranks * SAMPLE_BYTES,
                                                 f"{telemetry_samples} samples x {ranks} rank(s)")
    return parts


def check_memory(parts: dict, limit: int | None = None, where: dict | None = None) -> None:
    """Refuse (InputError) when the estimate `parts` (from `estimate_memory`)
    exceeds `limit` bytes (default: this machine's memory), naming the key
    that takes the most; `where` maps keys to a better place for the
    message (e.g. the trace file and request)."""
    limit, against = memory_limit() if limit is None else (limit, "this machine has")
    total = sum(b for b, _ in parts.values())
    if total <= limit:
        return
    key, (size, what) = max(parts.items(), key=lambda kv: kv[1][0])
    place = (where or {}).get(key, key)
    hint = " (use a larger interval)" if key == "output.telemetry_interval_ms" else ""
    raise InputError(f"{place}: the run would need ~{_gb(total)} of memory (~{_gb(size)} for {what}), "
                     f"more than {against} ({_gb(limit)}){hint}")


def check_trace_ids(source: str, input_length, num_ids: int, limit: int | None = None) -> None:
    """Refuse a trace whose hash ids (generated, one per trace block, for a
    format without them) would not fit, naming its longest prompt."""
    i = int(np.argmax(input_length))
    check_memory({"input_length": (num_ids * 8, f"{num_ids} prompt hash ids")}, limit,
                 {"input_length": f"{source}: request '{i}': input_length {int(input_length[i])}"})


def _blocks(tokens, block_size: int):
    return -(-tokens // block_size)


def _least(dist) -> int:
    """The least length a draw of `dist` can give."""
    return dist.value if dist.distribution == "constant" else max(dist.min, 1)


def session_sizes(sc, block_size: int) -> tuple:
    """`(requests, request_blocks, output_tokens, hash_ids)` of synthetic
    sessions at their least lengths, in closed form (nothing generated): turn
    k's prompt is (k + 1) new inputs and k outputs (workload/synthetic.py), so
    a session of T turns holds about (new + out) T (T + 1) / 2 tokens of
    prompts and outputs, and its prompts' tokens in trace blocks of hash
    ids. Each is a lower bound, short by less than a block a turn."""
    count, turns = max(int(sc.count), 0), max(int(sc.turns), 0)
    new, out = _least(sc.new_input_tokens), _least(sc.output_tokens)
    prompts = new * turns * (turns + 1) // 2 + out * turns * (turns - 1) // 2  # one session's
    tbs = MAX_TRACE_BLOCK * block_size  # a trace block is at most that (workload/synthetic.py)
    return (count * turns, count * _blocks(prompts + turns * out, block_size), count * turns * out,
            count * _blocks(prompts, tbs))


def check_compiled_limits(cluster) -> None:
    """Refuse more DP ranks in a worker than the compiled pass loop takes
    (MAX_COMPILED): it gets each rank's arrays in a tuple padded to a power
    of two (engine/worker.py `padded`), and Numba compiles no tuple of 1,000
    entries or more. (The loops over workers take any number of them: by
    address, servesim/bundles.py `bundle_at`.)"""
    for key, n in cluster.data_parallel_widths():
        if n > MAX_COMPILED:
            raise InputError(f"{key}: {n} is more than the {MAX_COMPILED} DP ranks per worker "
                             "servesim simulates (its compiled pass loop takes at most that many)")


def check_timing_packages(cfg) -> None:
    """A pool timed by `aic` needs aiconfigurator-core and a model and GPU
    its database holds: refused here, as the run would refuse them while
    building its pricing table, after announcing a compile."""
    c = cfg.cluster
    pools = [("cluster.prefill", c.prefill), ("cluster.decode", c.decode)] if c.disaggregated \
        else [("engine", cfg.engine)]
    for key, engine in pools:
        if engine.timing.type == "aic":
            from servesim.deployment import aic

            # a pool's timing is its own key only where it replaces engine.timing
            key = "engine" if engine.timing == cfg.engine.timing else key
            aic.require(f"{key}.timing type aic")
            aic.check_supported(engine.deployment)


def check_config(cfg, limit: int | None = None) -> None:
    """The checks that need no workload: the compiled loops' limits, the
    timing's optional package, the pools' sizes, `max_model_len`, and a
    synthetic workload's size before it is generated."""
    check_compiled_limits(cfg.cluster)
    check_timing_packages(cfg)
    pools = pool_sizes(cfg)
    requests = blocks = tokens = 0
    syn = cfg.workload.synthetic
    block_size = pools[0].block_size
    sessions = None
    if syn is not None and cfg.workload.trace is None:
        if syn.sessions is not None:
            sessions = session_sizes(syn.sessions, block_size)
            requests, blocks, tokens = sessions[:3]
        else:
            requests = syn.requests
            new, out = _least(syn.input_tokens), _least(syn.output_tokens)
            blocks = requests * _blocks(new + out, block_size)
            tokens = requests * out
    parts = estimate_memory(pools, requests, blocks, tokens)
    where = SYNTHETIC_PLACES if syn is not None else {}
    if sessions is not None:
        sc = syn.sessions
        what = f"{sc.count} sessions x {sc.turns} turns"
        parts["workload.synthetic.sessions"] = (sessions[3] * SESSION_ID_BYTES,
                                                f"generating {what}: {sessions[3]} prompt hash ids")
        where = {key: f"workload.synthetic.sessions ({what})" for key in (*parts, "input_length")}
    max_model_len = cfg.engine.scheduler.max_model_len
    if max_model_len is not None:  # one request of max_model_len tokens
        parts["engine.max_model_len"] = (max_model_len * TOKEN_BYTES, f"one request of {max_model_len} tokens")
    check_memory(parts, limit, where)


def check_run(cfg, workload, limit: int | None = None) -> list:
    """Everything checked before simulating a loaded config and workload,
    after `check_config` (see the module docstring); returns the warnings
    to print."""
    for key, dp in cfg.cluster.data_parallel_widths():
        pinned = np.flatnonzero(workload.dp_rank >= dp)
        if len(pinned):
            i = int(pinned[0])
            raise InputError(f"{workload.source or 'workload'}: request {workload.request_ids[i]!r}: "
                             f"dp_rank {int(workload.dp_rank[i])} is out of range ({key} is {dp})")
    pools = pool_sizes(cfg)
    block_size = pools[0].block_size
    prompt = workload.input_length.astype(np.int64)
    max_tokens = workload.output_length.astype(np.int64)
    max_model_len = cfg.engine.scheduler.max_model_len
    if max_model_len is not None:
        max_tokens = np.maximum(np.minimum(max_tokens, max_model_len - prompt), 0)
    blocks = int(_blocks(prompt + max_tokens, block_size).sum())
    tokens = int(max_tokens.sum())
    interval = cfg.output.telemetry_interval_ms
    samples = 0
    if interval and len(workload):
        # at least the arrivals' span (later session turns arrive only while simulating: NaN)
        samples = int(float(np.nanmax(workload.arrival_ms)) // interval) + 1
    parts = estimate_memory(pools, len(workload), blocks, tokens, samples)
    where = {}
    if workload.source is not None:
        for key, column in (("output_length", max_tokens), ("input_length", prompt)):
            i = int(np.argmax(column))
            where[key] = f"{workload.source}: request {workload.request_ids[i]!r}: {key} {int(column[i])}"
    elif cfg.workload.synthetic is not None:
        where = SYNTHETIC_PLACES
    check_memory(parts, limit, where)
    warnings = []
    cut = workload.sessions.truncated if workload.sessions is not None else None
    if cut is not None and cut.any():
        names = [workload.sessions.session_ids[k] for k in np.flatnonzero(cut)[:5].tolist()]
        more = ", ..." if int(cut.sum()) > len(names) else ""
        warnings.append(f"workload.limit={cfg.workload.limit} cuts {int(cut.sum())} session(s) short "
                        f"({', '.join(names)}{more}): their later turns are not replayed, so the "
                        "summary counts them as truncated_sessions, not completed_sessions")
    if samples > TELEMETRY_WARN_SAMPLES:
        warnings.append(f"output.telemetry_interval_ms: {interval:g} ms over at least "
                        f"{float(np.nanmax(workload.arrival_ms)) / 1000:.0f} s of simulated time gives more than "
                        f"{samples} samples per rank; telemetry.jsonl will be large")
    return warnings

