"""Routing an arriving request to a worker and rank at the arrivals the
replay handles itself (closed loops, sessions, disaggregated pools, the
debug mode): the rules are servesim/engine/routing.py's, compiled, which an
aggregated cluster's compiled loop also applies to the open-loop arrivals it
takes (engine/aggregated_loop.py); docs/engine.md §11.

- `round_robin`, `least_loaded`, `least_prefill`, `kv_router`, `weighted`:
  engine/routing.py.
- `session_affinity`: a session's first request goes round robin, its later
  requests to the same (worker, rank); requests outside sessions go round
  robin.

A request with a pinned `dp_rank` goes to that rank; the router chooses only
among the ranks with that index.
"""

import numpy as np

from servesim.config.config_types import RouterConfig
from servesim.errors import InputError
from servesim.engine import routing
from servesim.engine.routing import RankArrays, RoutePolicy
from servesim.jit import Entry, types_key
from servesim.scheduler import check

POLICIES = {"round_robin": RoutePolicy.ROUND_ROBIN, "least_loaded": RoutePolicy.LEAST_LOADED,
            "least_prefill": RoutePolicy.LEAST_PREFILL, "kv_router": RoutePolicy.KV_ROUTER,
            "weighted": RoutePolicy.WEIGHTED,
            "session_affinity": RoutePolicy.ROUND_ROBIN}


class Router:
    """A pool's router (`options`: `cluster.router`, a RouterConfig;
    `load_only`: a disaggregated decode pool, which `kv_router` routes by
    load alone)."""

    def __init__(self, options: RouterConfig, workers, data_parallel_size: int,
                 width_key: str = "cluster.data_parallel_size", load_only: bool = False):
        self.options = options
        self.policy = options.policy
        self.code = POLICIES[self.policy]
        self.load_only = load_only
        self.width_key = width_key  # the config key of the DP width, for messages
        self.workers = workers
        self.dp = data_parallel_size
        self._arrays = None  # the ranks' arrays (made at the first arrival: `arrays`)
        self._scratch = np.zeros(64, dtype=np.int64)
        self._session_target = {}  # session_affinity: session -> (worker, rank)
        self._entries = {}  # the rules compiled for their arguments' types
        self._checking = check.enabled()  # the debug mode, as the schedulers read it

    @property
    def arrays(self) -> RankArrays:
        if self._arrays is None:
            self._arrays = RankArrays(self.workers, self.dp, self.options, self.load_only)
        return self._arrays

    def _check_pinned(self, request_id: str, pinned_rank: int):
        if pinned_rank >= self.dp:
            raise InputError(
                f"request {request_id!r}: dp_rank {pinned_rank} is out of range "
                f"({self.width_key} is {self.dp})")

    def route(self, request_id: str, i: int, num_prompt_tokens: int, idents, pinned_rank: int,
              now: float, session: int = -1, admit: bool = True):
        """The (worker, rank) for request i (its row in the pool's request
        table), arriving at `now`, with these prompt block identities
        (`session`: its session's index, -1 outside sessions; `admit` False:
        it is rejected wherever it goes)."""
        self._check_pinned(request_id, pinned_rank)
        if self.policy == "session_affinity":
            target = self._session_target.get(session)
            if target is None or (pinned_rank >= 0 and target[1] != pinned_rank):
                target = self._round_robin(pinned_rank)
                if session >= 0:
                    self._session_target[session] = target
            return target
        if self._checking and self.code == RoutePolicy.LEAST_PREFILL:
            self._check_kept_counts(pinned_rank)
        a = self.arrays
        if num_prompt_tokens // a.block_size > len(self._scratch):  # a cached run
            self._scratch = np.zeros(num_prompt_tokens // a.block_size, dtype=np.int64)
        return a.target(self._call(routing.route, int(self.code), a.rr, a.rank_set,
                                   a.num_gpu_blocks, a.num_workers, a.dp, pinned_rank, idents,
                                   self._scratch, num_prompt_tokens, a.block_size,
                                   a.enable_caching, a.router, i, admit, float(now)))

    def _call(self, kernel, *args):
        """`kernel(*args)`, through its compiled function for these types
        (jit.Entry, one per kernel and argument types — an array's by
        `types_key`, anything else by its Python type: no per-argument
        dispatch at every arrival)."""
        key = (kernel, *(types_key((a,)) if isinstance(a, np.ndarray) else type(a) for a in args))
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = Entry(kernel)
        return entry(*args)

    def _round_robin(self, pinned_rank):
        a = self.arrays
        return a.target(self._call(routing.round_robin, a.rr, a.num_workers, a.dp, pinned_rank))

    def _check_kept_counts(self, pinned_rank):
        """The debug mode, before a `least_prefill` choice: every candidate rank's
        kept count of pending prefill tokens against a scan of its queues."""
        for j, rank in enumerate(self.arrays.ranks):
            if pinned_rank >= 0 and j % self.dp != pinned_rank:
                continue
            s = rank.scheduler
            S = s.S[0]
            check.check_pending_prefill(
                s.table.R, s.running, S["num_running"], s.wq,
                0 if s.priority else S["waiting_head"], S["num_waiting"],
                S["pending_prefill_tokens"], check.AT_ARRIVAL, S["num_checked_passes"])
