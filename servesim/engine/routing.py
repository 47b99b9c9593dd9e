"""The routing rules (docs/engine.md §11): which (worker, rank) an arriving
request goes to, each rule stated once, compiled, for both callers — the
replay's router at each arrival it handles (servesim/replay/router.py) and
the compiled loop of an aggregated cluster that takes its open-loop arrivals
itself (engine/fast_cluster.py `run_cluster`).

Ranks are numbered `j = worker * data_parallel_size + rank` ((worker, rank)
order); the ranks' scheduler arrays `sched_t` (a tuple of `SchedulerArrays`,
scheduler/scheduler_arrays.py) are indexed by j. A request pinned to a rank
(`pinned` >= 0, the trace's `dp_rank`) is routed among the ranks with that
index only.

- `round_robin`: (worker, rank) pairs in order, workers first, then ranks:
  w0r0, w1r0, ..., w0r1, w1r1, ...; a pinned request takes the next worker
  in its rank's own cycle.
- `least_loaded`: fewest running + waiting requests, then fewest used
  blocks, ties by (worker, rank).
- `kv_aware`: the least `(prompt tokens - cached prefix tokens on the rank)
  + prefill tokens already queued there`, ties by (worker, rank).
"""

from enum import IntEnum

import numpy as np

from servesim.engine.fast_run import padded
from servesim.jit import njit
from servesim.kvcache import block_pool as bp
from servesim.scheduler import fast


class RoutePolicy(IntEnum):
    ROUND_ROBIN = 0
    LEAST_LOADED = 1
    KV_AWARE = 2


# the round-robin state: the next target of the whole cycle, then the next
# worker of each pinned rank's cycle (RR_PINNED + rank)
RR_NEXT, RR_PINNED = 0, 1

RANKS_PADDED = 16  # (`RankArrays`)


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


@njit
def least_loaded(sched_t, num_gpu_blocks, num_workers, dp, pinned):
    """`least_loaded`'s choice: the first rank of least (running + waiting
    requests — loads waiting ahead of the queue included —, used blocks)."""
    best = -1
    best_requests = best_used = 0
    for j in range(num_workers * dp):
        if pinned >= 0 and j % dp != pinned:
            continue
        S = sched_t[j].S
        requests = S[0].num_running + S[0].num_waiting + S[0].num_waiting_for_kv
        used = num_gpu_blocks - 1 - sched_t[j].pscal[bp.NUM_FREE]
        if best < 0 or requests < best_requests or (requests == best_requests
                                                    and used < best_used):
            best, best_requests, best_used = j, requests, used
    return best


@njit
def kv_aware(sched_t, num_workers, dp, pinned, idents, max_blocks, scratch,
             num_prompt_tokens, block_size):
    """`kv_aware`'s choice: the first rank of least cost, a rank's cost being
    the prompt tokens not in its prefix cache (the longest cached run of the
    first `max_blocks` identities, `scratch` holding them) plus the prefill
    tokens queued there (fast.py `pending_prefill_tokens`, kept as requests
    move, so this is O(prompt blocks) per rank)."""
    best = -1
    best_cost = 0
    for j in range(num_workers * dp):
        if pinned >= 0 and j % dp != pinned:
            continue
        s = sched_t[j]
        hit = bp.find_cached_prefix(s.blocks, s.idmap, idents, max_blocks, scratch)
        cost = num_prompt_tokens - hit * block_size + fast.pending_prefill_tokens(s.S)
        if best < 0 or cost < best_cost:
            best, best_cost = j, cost
    return best


@njit
def route(policy, rr, sched_t, num_gpu_blocks, num_workers, dp, pinned, idents, scratch,
          num_prompt_tokens, block_size, enable_caching):
    """The rank `j` (module docstring) `policy` sends a request to."""
    if policy == RoutePolicy.KV_AWARE:
        max_blocks = (num_prompt_tokens - 1) // block_size if enable_caching else 0
        return kv_aware(sched_t, num_workers, dp, pinned, idents, max_blocks, scratch,
                        num_prompt_tokens, block_size)
    if policy == RoutePolicy.LEAST_LOADED:
        return least_loaded(sched_t, num_gpu_blocks, num_workers, dp, pinned)
    return round_robin(rr, num_workers, dp, pinned)


class RankArrays:
    """The scheduler arrays of a pool's ranks, which the routing rules read
    (and the compiled loops over workers queue arrivals on), as a tuple in
    (worker, rank) order, `padded` to RANKS_PADDED at least (a tuple's length is part of
    its type: one compile of each rule, and of the cluster loop, for every
    deployment of up to 16 ranks; the rules never index the padding), and
    the round-robin state."""

    def __init__(self, workers, data_parallel_size: int):
        ranks = [w.ranks[r] for w in workers for r in range(data_parallel_size)]
        self.ranks = ranks
        self.num_workers = len(workers)
        self.dp = data_parallel_size
        pool = ranks[0].pool
        self.num_gpu_blocks = pool.num_gpu_blocks
        self.block_size = pool.block_size
        self.enable_caching = bool(pool.enable_caching)
        self.sched_t = padded([rk.scheduler.arrays for rk in ranks], RANKS_PADDED)
        self.rr = np.zeros(RR_PINNED + data_parallel_size, dtype=np.int64)

    def target(self, j):
        """Rank index j as (worker, rank)."""
        return (j // self.dp, j % self.dp)
