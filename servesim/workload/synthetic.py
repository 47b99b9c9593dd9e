"""Synthetic workloads (README.md, "Config"): seeded lengths and arrivals.

Every prompt is unique except a prefix of `shared_prefix_tokens` common to
all requests. Prompts are encoded as hash ids with one id per trace block of
up to 32 engine blocks (the largest such unit that divides the shared prefix,
see `synthetic_trace_block_size`): ids 0..k-1 (k = shared_prefix_tokens //
trace_block_size) are the shared prefix blocks, every other block gets a fresh
id. A large unit keeps the ids small: 100,000 prompts of 1,024 tokens take
4 ids each, not 64.
All arrays are built vectorised (no Python object per request besides its
id string), so 100,000 requests of ~1024 tokens stay far below the memory
target (README.md, "Benchmarks").
"""

import numpy as np

from servesim.errors import InputError
from servesim.config.config_types import LengthDistribution, SyntheticConfig
from servesim.workload.workload import Workload

_KEY = "workload.synthetic"
# Upper clip of lognormal lengths with no `max` (keeps int64 and memory sane).
_LENGTH_CAP = 2**31 - 1
ARRIVALS = ("burst", "poisson", "constant")
DISTRIBUTIONS = ("constant", "uniform", "lognormal", "zipf")


def synthetic_workload(cfg: SyntheticConfig, block_size: int) -> Workload:
    """Generate the workload of a `synthetic` block, deterministically from `seed`.

    Draw order (fixed, for determinism): input lengths, output lengths,
    arrivals, all from one `numpy.random.default_rng(seed)`.
    """
    if cfg.sessions is not None:
        return synthetic_sessions(cfg, block_size)
    n = cfg.requests
    if type(n) is not int or n < 1:
        raise InputError(f"{_KEY}.requests: must be an integer >= 1, got {n!r}")
    if type(block_size) is not int or block_size < 1:
        raise InputError(f"engine.block_size: must be an integer >= 1, got {block_size!r}")
    rng = np.random.default_rng(cfg.seed)
    input_length = draw_lengths(rng, cfg.input_tokens, n, f"{_KEY}.input_tokens")
    output_length = draw_lengths(rng, cfg.output_tokens, n, f"{_KEY}.output_tokens")
    arrival_ms = draw_arrivals(rng, cfg.arrival, cfg.rate, n)
    trace_block_size = synthetic_trace_block_size(block_size, cfg.shared_prefix_tokens)
    hash_flat, hash_offsets = prefix_hash_ids(input_length, trace_block_size,
                                              cfg.shared_prefix_tokens)
    return Workload(
        request_ids=[str(i) for i in range(n)],
        arrival_ms=arrival_ms,
        input_length=input_length,
        output_length=output_length,
        priority=np.zeros(n, dtype=np.int64),
        dp_rank=np.full(n, -1, dtype=np.int64),
        hash_flat=hash_flat,
        hash_offsets=hash_offsets,
        trace_block_size=trace_block_size,
        concurrency=cfg.concurrency,
        source=None,
    )


def synthetic_sessions(cfg: SyntheticConfig, block_size: int) -> Workload:
    """Chat sessions (`synthetic.sessions`): turn k's prompt is turn k-1's
    prompt, its output and `new_input_tokens` more (servesim/workload/sessions.py).
    Requests are session by session, turn by turn. Draw order (fixed): new
    input lengths, output lengths, think times (when a distribution), session
    starts. A first prompt shares its first round(ratio * its trace blocks)
    blocks with the other sessions of its prefix group (session index modulo
    `prefix_groups`); trace blocks are 32 engine blocks."""
    from servesim.workload.sessions import accumulate_deltas, chain_plan

    sc = cfg.sessions
    count, turns = sc.count, sc.turns
    n = count * turns
    rng = np.random.default_rng(cfg.seed)
    key = f"{_KEY}.sessions"
    delta = draw_lengths(rng, sc.new_input_tokens, n, f"{key}.new_input_tokens")
    output_length = draw_lengths(rng, sc.output_tokens, n, f"{key}.output_tokens")
    if isinstance(sc.think_time, LengthDistribution):
        think = draw_lengths(rng, sc.think_time, n, f"{key}.think_time").astype(np.float64)
    else:
        think = np.full(n, float(sc.think_time))
    starts = draw_arrivals(rng, cfg.arrival, cfg.rate, count)
    session = np.repeat(np.arange(count, dtype=np.int64), turns)
    turn = np.tile(np.arange(turns, dtype=np.int64), count)
    think[turn == 0] = 0.0
    tbs = synthetic_trace_block_size(block_size, 0)
    groups = max(sc.prefix_groups, 1)
    first = delta[turn == 0]
    nblocks = -(-first // tbs)
    shared = np.minimum(np.rint(nblocks * sc.shared_prefix_ratio).astype(np.int64), nblocks)
    next_id = int(nblocks.max()) * groups
    hashes = [None] * n
    for s, row in enumerate(np.flatnonzero(turn == 0).tolist()):
        k, total = int(shared[s]), int(nblocks[s])
        own = list(range(next_id, next_id + total - k))
        next_id += total - k
        hashes[row] = [j * groups + s % groups for j in range(k)] + own
    for row in np.flatnonzero(turn > 0).tolist():
        m = -(-int(delta[row]) // tbs)
        hashes[row] = list(range(next_id, next_id + m))
        next_id += m
    prompt, hashes, stream_start = accumulate_deltas(session.tolist(), delta, output_length,
                                                     hashes, tbs)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum([len(h) for h in hashes], out=offsets[1:])
    arrival = np.full(n, np.nan)
    arrival[turn == 0] = starts
    plan = chain_plan([str(s) for s in range(count)], session, turn, think, stream_start)
    return Workload(
        request_ids=[f"{s}.{t}" for s, t in zip(session.tolist(), turn.tolist())],
        arrival_ms=arrival, input_length=prompt, output_length=output_length,
        priority=np.zeros(n, dtype=np.int64), dp_rank=np.full(n, -1, dtype=np.int64),
        hash_flat=np.array([x for h in hashes for x in h], dtype=np.int64),
        hash_offsets=offsets, trace_block_size=tbs, concurrency=cfg.concurrency,
        source=None, sessions=plan)


def draw_lengths(rng: np.random.Generator, dist: LengthDistribution, n: int, key: str) -> np.ndarray:
    """`n` token counts (int64, >= 1) from a LengthDistribution.

    constant: `value`; uniform: integers in [min, max]; lognormal:
    round(exp(N(mean, sigma))) clipped to [min, max] (no upper clip when
    max is 0); zipf: rng.zipf(a) clipped to [min, max] (max required).
    """
    kind = dist.distribution
    lo = max(int(dist.min), 1)
    if kind == "constant":
        if type(dist.value) is not int or dist.value < 1:
            raise InputError(f"{key}: a constant length must be an integer >= 1, got {dist.value!r}")
        return np.full(n, dist.value, dtype=np.int64)
    if kind == "uniform":
        _check_bounds(dist, key, need_max=True)
        return rng.integers(lo, dist.max, size=n, endpoint=True, dtype=np.int64)
    if kind == "lognormal":
        _check_bounds(dist, key, need_max=False)
        if not dist.sigma >= 0:
            raise InputError(f"{key}: lognormal sigma must be >= 0, got {dist.sigma!r}")
        x = np.rint(np.exp(rng.normal(dist.mean, dist.sigma, size=n)))
        return _clip(x, lo, dist.max)
    if kind == "zipf":
        _check_bounds(dist, key, need_max=True)
        if not dist.a > 1:
            raise InputError(f"{key}: zipf needs a > 1, got {dist.a!r}")
        return _clip(rng.zipf(dist.a, size=n), lo, dist.max)
    raise InputError(f"{key}: unknown distribution {kind!r}; accepted: {', '.join(DISTRIBUTIONS)}")


def draw_arrivals(rng: np.random.Generator, arrival: str, rate, n: int) -> np.ndarray:
    """Arrival times in ms (float64, first at 0): burst (all at 0), poisson
    (exponential gaps of mean 1000/rate ms), constant (i * 1000/rate ms)."""
    if arrival == "burst":
        return np.zeros(n, dtype=np.float64)
    if arrival not in ARRIVALS:
        raise InputError(f"{_KEY}.arrival: unknown arrival {arrival!r}; accepted: {', '.join(ARRIVALS)}")
    if type(rate) not in (int, float) or not 0 < rate < float("inf"):
        raise InputError(f"{_KEY}.rate: arrival {arrival} needs a rate (requests/s) > 0, got {rate!r}")
    gap = 1000.0 / rate
    if arrival == "constant":
        return np.arange(n, dtype=np.float64) * gap
    out = np.zeros(n, dtype=np.float64)
    np.cumsum(rng.exponential(gap, size=n - 1), out=out[1:])
    return out


def synthetic_trace_block_size(block_size: int, shared_prefix_tokens: int,
                               max_blocks: int = 32) -> int:
    """The largest multiple of `block_size`, up to `max_blocks` blocks, that
    divides the shared prefix (any, without one)."""
    for m in range(max_blocks, 0, -1):
        if shared_prefix_tokens % (block_size * m) == 0:
            return block_size * m
    return block_size


def prefix_hash_ids(input_length: np.ndarray, block_size: int, shared_prefix_tokens: int):
    """Hash ids (flat, offsets) of prompts unique except a common prefix.

    Request i has ceil(L_i / block_size) ids; its first min(k, that) ids
    are 0..k-1 with k = shared_prefix_tokens // block_size, the others are
    fresh ids k, k+1, ... in request order, unique across the workload.
    """
    if type(shared_prefix_tokens) is not int or shared_prefix_tokens < 0:
        raise InputError(f"{_KEY}.shared_prefix_tokens: must be an integer >= 0, "
                         f"got {shared_prefix_tokens!r}")
    k = shared_prefix_tokens // block_size
    nblocks = -(-input_length // block_size)
    offsets = np.zeros(len(nblocks) + 1, dtype=np.int64)
    np.cumsum(nblocks, out=offsets[1:])
    shared = np.minimum(nblocks, k)
    # Fresh ids: global position minus the shared slots up to and including
    # this request, plus k (so request 0's first fresh id is k).
    flat = np.arange(offsets[-1], dtype=np.int64)
    flat -= np.repeat(np.cumsum(shared) - k, nblocks)
    if k:
        starts = np.repeat(offsets[:-1], shared)
        within = np.arange(len(starts), dtype=np.int64) - np.repeat(np.cumsum(shared) - shared, shared)
        flat[starts + within] = within
    return flat, offsets


def _check_bounds(dist: LengthDistribution, key: str, need_max: bool) -> None:
    """min >= 1; max >= min when given (required when `need_max`)."""
    if type(dist.min) is not int or dist.min < 1:
        raise InputError(f"{key}: min must be an integer >= 1, got {dist.min!r}")
    if type(dist.max) is not int or dist.max < 0:
        raise InputError(f"{key}: max must be an integer >= min, got {dist.max!r}")
    if need_max and dist.max == 0:
        raise InputError(f"{key}: distribution {dist.distribution} needs max (an integer >= min)")
    if dist.max and dist.max < dist.min:
        raise InputError(f"{key}: max {dist.max} is below min {dist.min}")


def _clip(x: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Clip to [lo, hi] (hi 0: no upper bound beyond _LENGTH_CAP) as int64."""
    top = hi if hi > 0 else _LENGTH_CAP
    return np.clip(x, lo, top).astype(np.int64)
