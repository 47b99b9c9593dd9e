"""The routing rules (docs/engine.md §11): which (worker, rank) an arriving
request goes to, each rule stated once, compiled, for both callers — the
replay's router at each arrival it handles (servesim/replay/router.py) and
the compiled loop of an aggregated cluster that takes its open-loop arrivals
itself (engine/aggregated_loop.py `run_cluster`).

Ranks are numbered `j = worker * data_parallel_size + rank` ((worker, rank)
order); the ranks' scheduler arrays (each a `SchedulerArrays`,
scheduler/scheduler_arrays.py) are a `rank_set`, `(addresses, first)`:
their addresses and the first of them (servesim/bundles.py `bundle_at`),
read as rank j's by `rank_at(rank_set, j)`, so that each rule compiles once
for any number of ranks. A request pinned to a rank
(`pinned` >= 0, the trace's `dp_rank`) is routed among the ranks with that
index only.

- `round_robin`: (worker, rank) pairs in order, workers first, then ranks:
  w0r0, w1r0, ..., w0r1, w1r1, ...; a pinned request takes the next worker
  in its rank's own cycle.
- `least_loaded`: fewest running + waiting requests, then fewest used
  blocks, ties by (worker, rank).
- `least_prefill` (`kv_aware` until it became `kv_router`'s alias): the
  least `(prompt tokens - cached prefix tokens on the rank) + prefill tokens
  already queued there`, ties by (worker, rank). It has no decode-load term:
  a rank holding a hot prefix keeps winning however long its decode batch.
- `kv_router` (NVIDIA Dynamo's KV router, `DefaultWorkerSelector` in
  lib/kv-router/src/scheduling/selector.rs, 1.6.1): the least logit
  `overlap_score_weight * prefill blocks + decode blocks`, where, from the
  router's own book of the requests it sent to the rank and that have not
  finished (Dynamo's `ActiveSequences`, kept in `RouterArrays`):
  prefill blocks = (its requests' uncached prompt tokens, counted from their
  routing until their first token, + this prompt - this prompt's cached
  prefix on the rank) / block size, and decode blocks = the distinct full
  prompt blocks of its requests with this prompt's added. The cached prefix
  is the rank's prefix cache as the router's index of it holds it: as it
  was `kv_event_lag_ms` ago (Dynamo's KV events reach its indexer that
  late; kvcache/block_pool.py `see_events`), as it is now without a lag.
  Ties go to one of the tied ranks uniformly at random; with
  `router_temperature` > 0 the rank is drawn with probability proportional
  to `exp(-(logit - min) / ((max - min) * temperature))` (every rank alike
  when all logits are equal), both from the router's seeded generator. A
  disaggregated decode pool's router is load-only, as Dynamo's
  (`build_decode_router_override`): logit = its requests' full prompt blocks
  counted per request, plus this prompt's.
- `weighted` (the Kubernetes inference gateways' scorers: the Gateway API
  inference extension's `queue` and `kv-cache` scorers and llm-d's precise
  prefix-cache scorer, summed with their weights, the greatest score wins):
  `prefix_cache * (cached full prompt blocks / full prompt blocks) +
  queue_depth * (max waiting - waiting) / (max waiting - min waiting) (1 when
  every candidate waits alike) + kv_usage * (1 - used blocks / usable blocks)`,
  waiting counting the loads waiting ahead of the queue, each rank's state
  read as it is at the arrival (no metrics scrape interval); ties drawn from
  the router's generator (the gateways' max-score picker draws among ties).
"""

import collections
from enum import IntEnum

import numpy as np

from servesim.engine.config import RouterConfig
from servesim.bundles import addresses_of, bundle_at
from servesim.jit import njit
from servesim.kvcache import block_pool as bp
from servesim.scheduler.kv_cache_manager import can_ever_fit
from servesim.scheduler.request import RequestStatus
from servesim.scheduler.scheduler import pending_prefill_tokens


class RoutePolicy(IntEnum):
    ROUND_ROBIN = 0
    LEAST_LOADED = 1
    LEAST_PREFILL = 2
    KV_ROUTER = 3
    WEIGHTED = 4


# the round-robin state: the next target of the whole cycle, then the next
# worker of each pinned rank's cycle (RR_PINNED + rank)
RR_NEXT, RR_PINNED = 0, 1



@njit
def round_robin(rr, num_workers, dp, pinned):
    """`round_robin`'s choice (module docstring), advancing its cycle in `rr`."""
    if pinned >= 0:
        w = rr[RR_PINNED + pinned]
        rr[RR_PINNED + pinned] = (w + 1) % num_workers
        return w * dp + pinned
    t = rr[RR_NEXT]
    rr[RR_NEXT] = (t + 1) % (num_workers * dp)
    return (t % num_workers) * dp + t // num_workers


# `RouterState` slots: the knobs (`weights`, float64), the generator and the pool's kind
# (`ints`, int64), per rank (`ranks`, `KR_*` rows) and per request (`reqs`, `KQ_*` rows)
KW_WEIGHT, KW_TEMPERATURE, KW_PREFIX, KW_QUEUE, KW_KV = range(5)
KI_RNG, KI_LOAD_ONLY = 0, 1
KR_HEAD, KR_BLOCKS, KR_PREFILL = 0, 1, 2  # first of its book, distinct blocks, prefill tokens
KQ_NEXT, KQ_PREFILL, KQ_BLOCKS = 0, 1, 2  # next in its rank's book, its prefill tokens, blocks
NONE = -1
RNG_MODULUS = 2147483647  # MINSTD (Park and Miller): exact in int64, here and as plain Python


@njit
def uniform(ints):
    """The router's next draw in [0, 1) from its generator `ints[KI_RNG]`
    (MINSTD, seeded by `RouterArrays`)."""
    ints[KI_RNG] = ints[KI_RNG] * 48271 % RNG_MODULUS
    return (ints[KI_RNG] - 1) / (RNG_MODULUS - 1)


def first_state(seed: int) -> int:
    """The generator's state for `seed` (any integer >= 0): the seed spread
    over MINSTD's states by Knuth's multiplicative hash, so that seeds near
    each other (and 0) start far apart."""
    return (seed * 2654435761 + 0x9E3779B9) % (RNG_MODULUS - 1) + 1


@njit
def forget_finished(kvr, R, idents, j):
    """Rank j's book brought up to now: a request that finished or was taken
    out leaves it (its prompt blocks and prefill tokens with it), one that
    has its first token no longer counts prefill tokens (Dynamo frees a
    request at its completion and its prompt load at its first token)."""
    ints, ranks, reqs, refs = kvr.ints, kvr.ranks, kvr.reqs, kvr.refs
    prev = NONE
    i = ranks[KR_HEAD, j]
    while i != NONE:
        nxt = reqs[KQ_NEXT, i]
        if reqs[KQ_PREFILL, i] and R[i].first_token_pass >= 0:
            ranks[KR_PREFILL, j] -= reqs[KQ_PREFILL, i]
            reqs[KQ_PREFILL, i] = 0
        if R[i].status >= RequestStatus.FINISHED:
            ranks[KR_PREFILL, j] -= reqs[KQ_PREFILL, i]
            reqs[KQ_PREFILL, i] = 0
            if ints[KI_LOAD_ONLY]:
                ranks[KR_BLOCKS, j] -= reqs[KQ_BLOCKS, i]
            else:
                off = R[i].block_offset
                for k in range(reqs[KQ_BLOCKS, i]):
                    refs[j, idents[off + k]] -= 1
                    if refs[j, idents[off + k]] == 0:
                        ranks[KR_BLOCKS, j] -= 1
            if prev == NONE:
                ranks[KR_HEAD, j] = nxt
            else:
                reqs[KQ_NEXT, prev] = nxt
        else:
            prev = i
        i = nxt


@njit
def kv_router_logit(kvr, j, idents, num_full, hit, num_prompt_tokens, block_size):
    """Rank j's logit for a prompt of `num_prompt_tokens` whose first `hit`
    full blocks (of `num_full`) are in its prefix cache (module docstring)."""
    weights, ints, ranks, refs = kvr.weights, kvr.ints, kvr.ranks, kvr.refs
    if ints[KI_LOAD_ONLY]:
        return float(ranks[KR_BLOCKS, j] + num_full)
    new = 0
    for k in range(num_full):
        if refs[j, idents[k]] == 0:
            new += 1
    prefill = (ranks[KR_PREFILL, j] + num_prompt_tokens - hit * block_size) / block_size
    return weights[KW_WEIGHT] * prefill + (ranks[KR_BLOCKS, j] + new)


@njit
def kv_router_book(kvr, j, i, idents, num_full, prefill_tokens):
    """Request i, sent to rank j, enters its book with its full prompt blocks
    and (but on a load-only pool) its uncached prompt tokens."""
    ints, ranks, reqs, refs = kvr.ints, kvr.ranks, kvr.reqs, kvr.refs
    reqs[KQ_NEXT, i] = ranks[KR_HEAD, j]
    ranks[KR_HEAD, j] = i
    reqs[KQ_BLOCKS, i] = num_full
    if ints[KI_LOAD_ONLY]:
        ranks[KR_BLOCKS, j] += num_full
        return
    reqs[KQ_PREFILL, i] = prefill_tokens
    ranks[KR_PREFILL, j] += prefill_tokens
    for k in range(num_full):
        if refs[j, idents[k]] == 0:
            ranks[KR_BLOCKS, j] += 1
        refs[j, idents[k]] += 1


@njit
def cached_prefix_seen(events, blocks, idmap, idents, num_full, scratch, now):
    """The leading full blocks of a prompt the router believes a rank (its
    KV `events`, `blocks` and `idmap`, scheduler arrays) has cached at `now`:
    with a KV event lag, those of the view its KV events built, taken up to
    `now - lag` (the cache as it was then; kvcache/block_pool.py
    `see_events`); without (`events` None: the view's kernels are then
    compiled away), the cache as it is."""
    if events is not None:
        bp.see_events(events, now - events[1][bp.EV_LAG])
        return bp.viewed_prefix(events[2], idents, num_full)
    return bp.find_cached_prefix(blocks, idmap, idents, num_full, scratch)


@njit(inline="always")
def rank_at(rank_set, j):
    """Rank j's scheduler arrays in `rank_set` (module docstring).
    NOTE(refcounts): inlined into its caller, as `bundle_at` is, so that the
    bundle comes back counted as its caller counts (servesim/jit.py)."""
    return bundle_at(rank_set[0], j, rank_set[1])


@njit
def kv_router(rank_set, kvr, num_workers, dp, pinned, idents, scratch, num_prompt_tokens,
              block_size, enable_caching, i, admit, now):
    """`kv_router`'s choice (module docstring) for request i arriving at
    `now`; the request enters the chosen rank's book unless it is rejected
    there (`admit` False: it can never fit elsewhere; or it can never fit
    the rank)."""
    weights, ints = kvr.weights, kvr.ints
    temperature = weights[KW_TEMPERATURE]
    num_full = num_prompt_tokens // block_size
    lo = hi = 0.0
    best = -1
    ties = 0
    n = num_workers * dp
    logits = kvr.logits
    for j in range(n):
        logits[j] = np.inf
        if pinned >= 0 and j % dp != pinned:
            continue
        s = rank_at(rank_set, j)
        forget_finished(kvr, s.R, s.idents, j)
        hit = 0
        if enable_caching and not ints[KI_LOAD_ONLY]:
            hit = cached_prefix_seen(s.events, s.blocks, s.idmap, idents, num_full, scratch,
                                     now)
        x = kv_router_logit(kvr, j, idents, num_full, hit, num_prompt_tokens, block_size)
        logits[j] = x
        kvr.hits[j] = hit
        if best < 0 or x > hi:
            hi = x
        if best < 0 or x < lo:
            best, lo, ties = j, x, 1
        elif x == lo:
            ties += 1
            if temperature == 0.0 and uniform(ints) * ties < 1.0:
                best = j  # reservoir sampling: each tied rank alike
    if temperature > 0.0:
        best = softmax_sample(logits, n, lo, hi, temperature, uniform(ints))
    if admit and can_ever_fit(rank_at(rank_set, best).cfg, num_prompt_tokens):
        hit = kvr.hits[best]
        kv_router_book(kvr, best, i, idents, num_full, num_prompt_tokens - hit * block_size)
    return best


@njit
def softmax_sample(logits, n, lo, hi, temperature, u):
    """Dynamo's `softmax_sample_entries` over the candidate ranks (finite
    `logits[:n]`, least `lo`, greatest `hi`) with the draw `u`: rank j with
    probability proportional to exp(-(logit - lo) / ((hi - lo) * temperature)),
    every candidate alike when hi == lo; the first rank whose cumulative
    probability reaches `u`."""
    total = 0.0
    count = 0
    for j in range(n):
        if logits[j] != np.inf:
            count += 1
            total += 1.0 if hi == lo else np.exp(-(logits[j] - lo) / ((hi - lo) * temperature))
    cum = 0.0
    last = -1
    for j in range(n):
        if logits[j] == np.inf:
            continue
        p = 1.0 if hi == lo else np.exp(-(logits[j] - lo) / ((hi - lo) * temperature))
        cum += p / total
        last = j
        if u <= cum:
            return j
    return last


@njit
def least_loaded(rank_set, num_gpu_blocks, num_workers, dp, pinned):
    """`least_loaded`'s choice: the first rank of least (running + waiting
    requests — loads waiting ahead of the queue included —, used blocks)."""
    best = -1
    best_requests = best_used = 0
    for j in range(num_workers * dp):
        if pinned >= 0 and j % dp != pinned:
            continue
        S = rank_at(rank_set, j).S
        requests = S[0].num_running + S[0].num_waiting + S[0].num_waiting_for_kv
        used = bp.usable_blocks(num_gpu_blocks) - rank_at(rank_set, j).pscal[bp.NUM_FREE]
        if best < 0 or requests < best_requests or (requests == best_requests
                                                    and used < best_used):
            best, best_requests, best_used = j, requests, used
    return best


@njit
def least_prefill_cost(num_prompt_tokens, hit, block_size, pending):
    """`least_prefill`'s cost of a rank: the prompt tokens not in its `hit`
    cached blocks plus the `pending` prefill tokens queued there."""
    return num_prompt_tokens - hit * block_size + pending


@njit
def weighted_score(weights, cached, hit, num_full, waiting, lo, hi, usage):
    """`weighted`'s score of a rank: `hit` of the prompt's `num_full` full
    blocks cached (when `cached`: prefix caching on and a full block), its
    `waiting` requests among the candidates' `lo`..`hi`, its KV `usage`."""
    score = 0.0
    if cached:
        score += weights[KW_PREFIX] * hit / num_full
    score += weights[KW_QUEUE] * (1.0 if hi == lo else (hi - waiting) / (hi - lo))
    score += weights[KW_KV] * (1.0 - usage)
    return score


@njit
def least_prefill(rank_set, num_workers, dp, pinned, idents, max_blocks, scratch,
             num_prompt_tokens, block_size):
    """`least_prefill`'s choice: the first rank of least cost, a rank's cost being
    the prompt tokens not in its prefix cache (the longest cached run of the
    first `max_blocks` identities, `scratch` holding them) plus the prefill
    tokens queued there (scheduler.py `pending_prefill_tokens`, kept as requests
    move, so this is O(prompt blocks) per rank)."""
    best = -1
    best_cost = 0
    for j in range(num_workers * dp):
        if pinned >= 0 and j % dp != pinned:
            continue
        s = rank_at(rank_set, j)
        hit = bp.find_cached_prefix(s.blocks, s.idmap, idents, max_blocks, scratch)
        cost = least_prefill_cost(num_prompt_tokens, hit, block_size, pending_prefill_tokens(s.S))
        if best < 0 or cost < best_cost:
            best, best_cost = j, cost
    return best


@njit
def weighted(rank_set, kvr, num_gpu_blocks, num_workers, dp, pinned, idents, scratch,
             num_prompt_tokens, block_size, enable_caching):
    """`weighted`'s choice (module docstring): the rank of greatest
    `prefix_cache * hit blocks / prompt blocks + queue_depth * (max - waiting)
    / (max - min) (1 when all wait alike) + kv_usage * (1 - KV usage)`, ties
    drawn from the router's generator."""
    weights, ints = kvr.weights, kvr.ints
    num_full = num_prompt_tokens // block_size
    lo, hi = 1 << 62, -1
    for j in range(num_workers * dp):
        if pinned >= 0 and j % dp != pinned:
            continue
        S = rank_at(rank_set, j).S
        waiting = S[0].num_waiting + S[0].num_waiting_for_kv
        lo = min(lo, waiting)
        hi = max(hi, waiting)
    best = -1
    top = 0.0
    ties = 0
    for j in range(num_workers * dp):
        if pinned >= 0 and j % dp != pinned:
            continue
        s = rank_at(rank_set, j)
        cached = num_full > 0 and enable_caching
        hit = bp.find_cached_prefix(s.blocks, s.idmap, idents, num_full, scratch) if cached else 0
        waiting = s.S[0].num_waiting + s.S[0].num_waiting_for_kv
        score = weighted_score(weights, cached, hit, num_full, waiting, lo, hi,
                               bp.kv_usage(s.pscal, num_gpu_blocks))
        if best < 0 or score > top:
            best, top, ties = j, score, 1
        elif score == top:
            ties += 1
            if uniform(ints) * ties < 1.0:
                best = j
    return best


@njit
def route(policy, rr, rank_set, num_gpu_blocks, num_workers, dp, pinned, idents, scratch,
          num_prompt_tokens, block_size, enable_caching, kvr, i, admit, now):
    """The rank `j` (module docstring) `policy` sends request i, arriving at
    `now`, to (`admit` False: it is rejected whichever rank it goes to).
    `kvr`: the router's state (`RouterArrays`) for `kv_router` and
    `weighted`, None for the rules that keep none, whose runs then compile
    neither of those two (Numba prunes the branch on a None argument)."""
    if kvr is not None:
        if policy == RoutePolicy.KV_ROUTER:
            return kv_router(rank_set, kvr, num_workers, dp, pinned, idents, scratch,
                             num_prompt_tokens, block_size, enable_caching, i, admit, now)
        if policy == RoutePolicy.WEIGHTED:
            return weighted(rank_set, kvr, num_gpu_blocks, num_workers, dp, pinned, idents,
                            scratch, num_prompt_tokens, block_size, enable_caching)
    if policy == RoutePolicy.LEAST_PREFILL:
        max_blocks = (num_prompt_tokens - 1) // block_size if enable_caching else 0
        return least_prefill(rank_set, num_workers, dp, pinned, idents, max_blocks, scratch,
                             num_prompt_tokens, block_size)
    if policy == RoutePolicy.LEAST_LOADED:
        return least_loaded(rank_set, num_gpu_blocks, num_workers, dp, pinned)
    return round_robin(rr, num_workers, dp, pinned)


# What the `kv_router` and `weighted` rules read and keep, by name (a named tuple,
# which Numba reads field by field as it does a tuple): `weights` (`KW_*`), `ints`
# (`KI_*`), `ranks[KR_*, j]`, `reqs[KQ_*, i]`, `refs[j, identity]` (each rank's
# count of requests holding each identity), and a choice's scratch `logits`, `hits`.
RouterState = collections.namedtuple("RouterState", "weights ints ranks reqs refs logits hits")


class RouterArrays:
    """The knobs and state of `kv_router` and `weighted` for a pool of
    `num_ranks` ranks over a request table of `num_requests` rows and
    `num_identities` block identities, as the `RouterState` `arrays` the rules take:
    the knobs (`options`, a RouterConfig: `overlap_score_weight`,
    `router_temperature`, the scorers' weights), the generator (seeded by
    `seed`) and whether the pool is load-only (a disaggregated decode pool),
    then `kv_router`'s book when `book` (the first request of each rank's, as
    a list linked through the requests; its distinct blocks; its prefill
    tokens; each request's link, prefill tokens and blocks; each rank's count
    of requests holding each identity), and scratch for the logits and hits
    of a choice. Without a book (`weighted`) its arrays are of the same types
    with nothing in them, so both policies share one compile of the loops
    (the other rules take None instead, `route`)."""

    def __init__(self, options=None, num_ranks=1, num_requests=1, num_identities=1,
                 load_only=False, book=False):
        o = RouterConfig() if options is None else options
        if not book:
            num_requests = num_identities = 1
        ranks = np.zeros((3, num_ranks), dtype=np.int64)
        ranks[KR_HEAD] = NONE
        refs_shape = (1, 1) if load_only or not book else (num_ranks, max(1, num_identities))
        self.arrays = RouterState(
            weights=np.array([o.overlap_score_weight, o.router_temperature, o.prefix_cache,
                              o.queue_depth, o.kv_usage]),
            ints=np.array([first_state(o.seed), int(load_only)], dtype=np.int64),
            ranks=ranks, reqs=np.zeros((3, max(1, num_requests)), dtype=np.int64),
            refs=np.zeros(refs_shape, dtype=np.int32), logits=np.zeros(num_ranks),
            hits=np.zeros(num_ranks, dtype=np.int64))


class RankArrays:
    """The scheduler arrays of a pool's ranks, which the routing rules read
    (and the compiled loops over workers queue arrivals on), as a `rank_set`
    in (worker, rank) order (module docstring), the
    round-robin state and the `RouterArrays` of `options` (a RouterConfig;
    `load_only` on a disaggregated decode pool) when its policy keeps state
    (`kv_router`, `weighted`; else None, `route`)."""

    def __init__(self, workers, data_parallel_size: int, options=None, load_only=False):
        ranks = [w.ranks[r] for w in workers for r in range(data_parallel_size)]
        self.ranks = ranks
        self.num_workers = len(workers)
        self.dp = data_parallel_size
        pool = ranks[0].pool
        self.num_gpu_blocks = pool.num_gpu_blocks
        self.block_size = pool.block_size
        self.enable_caching = bool(pool.enable_caching)
        arrays = [rk.scheduler.arrays for rk in ranks]
        self.rank_set = (addresses_of(arrays), arrays[0])
        self._arrays = arrays  # (the bundles the addresses point to, held for the run)
        self.rr = np.zeros(RR_PINNED + data_parallel_size, dtype=np.int64)
        policy = None if options is None else options.policy
        self.router = (RouterArrays(options, len(ranks), len(ranks[0].scheduler.table.R),
                                    len(pool.idmap), load_only, policy == "kv_router").arrays
                       if policy in ("kv_router", "weighted") else None)

    def target(self, j):
        """Rank index j as (worker, rank)."""
        return (j // self.dp, j % self.dp)
