"""Routing an arriving request to a worker and rank (docs/engine.md §11).

- `round_robin`: (worker, rank) pairs in order — workers first, then ranks:
  w0r0, w1r0, ..., w0r1, w1r1, ...
- `least_loaded`: fewest running + waiting requests, then fewest used blocks,
  ties by (worker, rank) index.
- `kv_aware`: the rank where the request's prefill would finish soonest: the
  least `(prompt tokens - cached prefix tokens on the rank) + prefill tokens
  already queued there` (what running requests still have to prefill and every
  waiting request's tokens) — the longest cached prefix minus a load penalty
  in the same unit, as NVIDIA Dynamo's KV router weighs prefill blocks against
  load; ties by index.

- `session_affinity`: a session's first request goes round robin, its later
  requests to the same (worker, rank); requests outside sessions go round
  robin.

A request with a pinned `dp_rank` goes to that rank; the router chooses only
among the ranks with that index.
"""

import numpy as np

from servesim.errors import InputError
from servesim.engine.fast_run import padded
from servesim.jit import compiled_for, njit
from servesim.kvcache import block_pool as bp
from servesim.scheduler import check, fast


class Router:
    def __init__(self, policy: str, workers, data_parallel_size: int,
                 width_key: str = "cluster.data_parallel_size"):
        self.policy = policy
        self.width_key = width_key  # the config key of the DP width, for messages
        self.workers = workers
        self.dp = data_parallel_size
        num_workers = len(workers)
        # round robin over workers first, then ranks
        self.targets = [(w, r) for r in range(data_parallel_size) for w in range(num_workers)]
        self._next = 0
        self._next_pinned = [0] * data_parallel_size
        self._scratch = np.zeros(64, dtype=np.int64)
        self._session_target = {}  # session_affinity: session -> (worker, rank)
        self._kv_args = None  # kv_aware: the ranks' arrays, by (worker, rank) (`_kv_aware`)
        self._checking = check.enabled()  # the debug mode, as the schedulers read it

    def route(self, request_id: str, num_prompt_tokens: int, idents, pinned_rank: int,
              session: int = -1):
        """The (worker, rank) for a request with these prompt block identities
        (`session`: its session's index, -1 outside sessions)."""
        if pinned_rank >= self.dp:
            raise InputError(
                f"request {request_id!r}: dp_rank {pinned_rank} is out of range "
                f"({self.width_key} is {self.dp})")
        if self.policy == "kv_aware":
            return self._kv_aware(num_prompt_tokens, idents, pinned_rank)
        if pinned_rank >= 0:
            candidates = [(w, pinned_rank) for w in range(len(self.workers))]
        else:
            candidates = self.targets
        if self.policy == "round_robin":
            return self._round_robin(candidates, pinned_rank)
        if self.policy == "session_affinity":
            target = self._session_target.get(session)
            if target is None or (pinned_rank >= 0 and target[1] != pinned_rank):
                target = self._round_robin(candidates, pinned_rank)
                if session >= 0:
                    self._session_target[session] = target
            return target
        return min(candidates, key=lambda t: self._load(t) + (t,))  # least_loaded

    def _round_robin(self, candidates, pinned_rank):
        if pinned_rank >= 0:
            i = self._next_pinned[pinned_rank]
            self._next_pinned[pinned_rank] = (i + 1) % len(candidates)
            return candidates[i]
        i = self._next
        self._next = (i + 1) % len(candidates)
        return candidates[i]

    def _rank(self, target):
        return self.workers[target[0]].ranks[target[1]]

    def _load(self, target):
        rank = self._rank(target)
        scheduler = rank.scheduler
        used = rank.pool.num_gpu_blocks - 1 - rank.pool.num_free_blocks
        return (scheduler.num_running + scheduler.num_waiting, used)

    def _kv_aware(self, num_prompt_tokens, idents, pinned_rank):
        """`kv_aware`'s choice (module docstring): one kernel call over the
        candidate ranks, held as tuples of their arrays ordered by (worker,
        rank), so that the first of equal costs is the lowest (worker, rank)."""
        if self._kv_args is None:
            ranks = [w.ranks[r] for w in self.workers for r in range(self.dp)]
            self._kv_ranks = ranks
            # (padded: one compile for 1-2 ranks in all, 3-4, ...; the
            # candidates never index the padding)
            self._kv_args = (padded([rk.pool.blocks for rk in ranks]),
                             padded([rk.pool.idmap for rk in ranks]),
                             padded([rk.scheduler.S for rk in ranks]))
            n = len(ranks)
            self._kv_candidates = np.arange(n, dtype=np.int64)
            self._kv_pinned = [np.arange(r, n, self.dp, dtype=np.int64) for r in range(self.dp)]
            self._kv_entries = {}
        pool = self._kv_ranks[0].pool
        max_blocks = (num_prompt_tokens - 1) // pool.block_size if pool.enable_caching else 0
        if max_blocks > len(self._scratch):
            self._scratch = np.zeros(max_blocks, dtype=np.int64)
        candidates = self._kv_candidates if pinned_rank < 0 else self._kv_pinned[pinned_rank]
        if self._checking:  # the debug mode: every candidate's kept count against its scan
            for j in candidates.tolist():
                s = self._kv_ranks[j].scheduler
                S = s.S[0]
                check.check_pending_prefill(
                    s.table.R, s.running, S["num_running"], s.wq,
                    0 if s.priority else S["waiting_head"], S["num_waiting"],
                    S["pending_prefill_tokens"], check.AT_ARRIVAL, S["num_checked_passes"])
        args = (*self._kv_args, candidates, idents, max_blocks, self._scratch,
                num_prompt_tokens, pool.block_size)
        # the kernel compiled for these types (jit.compiled_for), by the identities' array type
        key = (idents.dtype, idents.flags.c_contiguous)
        entry = self._kv_entries.get(key)
        if entry is None:
            k = kv_aware_choice(*args)
            self._kv_entries[key] = compiled_for(kv_aware_choice, args)
        else:
            k = entry(*args)
        j = int(candidates[k])
        return (j // self.dp, j % self.dp)


@njit
def kv_aware_choice(blocks_t, idmap_t, S_t, candidates, idents, max_blocks, scratch,
                    num_prompt_tokens, block_size):
    """`kv_aware`'s choice among the ranks `candidates` (indices into the
    tuples of their arrays, in (worker, rank) order): the first of least
    cost, a rank's cost (module docstring) being the prompt tokens not in
    its prefix cache (the longest cached run of the first `max_blocks`
    identities) plus the prefill tokens queued there (`S[0]`'s kept count,
    fast.py `pending_prefill_tokens`). One kernel call per arrival. Returns
    the index into `candidates`."""
    best = 0
    best_cost = 0
    for k in range(len(candidates)):
        j = candidates[k]
        hit = bp.find_cached_prefix(blocks_t[j], idmap_t[j], idents, max_blocks, scratch)
        cost = num_prompt_tokens - hit * block_size + fast.pending_prefill_tokens(S_t[j])
        if k == 0 or cost < best_cost:
            best = k
            best_cost = cost
    return best
