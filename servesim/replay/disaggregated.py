"""Replay through disaggregated prefill and decode pools (`cluster.mode:
disaggregated`): routing at arrival and at handoff, the two request states
of each request (a prefill-side and a decode-side one: rows of two request
tables), and their results merged into one record. The KV handoff itself —
held blocks, links, pulls — is servesim/engine/kv_handoff.py.

- At arrival the router (`cluster.router`) picks a prefill worker and rank.
  The request runs there with `max_tokens = 1` (nixl_connector.py's
  `do_remote_decode`; the proxy of a vLLM P/D deployment sends the prefill
  request with `max_tokens: 1`). It is rejected at arrival if its prompt can
  never fit the prefill pool, or its prompt and first token the decode pool.
- When its first token's pass is processed (TTFT counts from there), the same
  router policy picks a decode worker and rank among the decode pool, and a
  decode-side request with `num_tokens = P + 1` joins that rank's waiting
  queue (its arrival, for the decode engine, is the handoff instant). A
  request asking for one token only finishes on the prefill worker: it is
  never handed off.
- Its record merges both: `worker` / `dp_rank` are the decode worker's (null
  when never handed off), `prefill_worker` / `prefill_dp_rank` the prefill
  worker's; `first_scheduled_ms`, `first_admission_cached_tokens` and
  `first_token_pass` come from the prefill worker, `finish_pass` from the
  worker that produced the last token; preemptions and recomputed tokens are
  summed over both.
- The summary's prefix-cache figures are the prefill pool's (one lookup per
  request, as in aggregated mode); `pools` has each pool's, and the decode
  pool's hit rate is the share of handed-off prompts that did not move.
"""

import math
from collections import namedtuple

import numpy as np

from servesim.engine import kv_handoff
from servesim.engine.core import EngineCore
from servesim.engine.disaggregated_loop import DisaggregatedLoop
from servesim.engine.worker_loop import pool_arrays
from servesim.replay.driver import Replay
from servesim.results.records import STATUS_FINISHED, STATUS_REJECTED, PoolStats, RunStats
from servesim.jit import Entry
from servesim.replay.router import Router
from servesim.scheduler import check
from servesim.scheduler.request import RequestTable
from servesim.scheduler.rank import RankScheduler

# One handoff's transfer as tests read it (`transfer(i)`).
TransferView = namedtuple("TransferView", "tokens nbytes submit_ms start_ms finish_ms land_ms "
                                          "done freed_ms")


class _PrefillObserver:
    """The prefill workers' observer: a request done there is handed off
    (or, with one token, done)."""

    def __init__(self, replay):
        self.replay = replay

    def on_done(self, i, finished):
        self.replay.on_prefill_done(i, finished)

    def on_finished(self, indices):
        for i in indices.tolist():
            self.replay.on_prefill_done(i, True)

    def horizon_key(self):
        return self.replay.horizon_key()

    def on_progress(self, core=None):
        self.replay.on_progress(core)


class _ArraySides:
    """A prefill-side and a decode-side
    :class:`~servesim.scheduler.request.RequestTable` (request i is row i
    of both), scheduled by the compiled :class:`RankScheduler`, and the
    handoffs' transfers as arrays (engine/kv_handoff.py)."""

    def __init__(self, replay):
        self.replay = replay
        w = replay.workload
        n = len(w)
        max_tokens = replay.max_tokens
        self.prefill = RequestTable(w.request_ids, w.input_length,
                                               np.minimum(max_tokens, 1), w.priority,
                                               replay.idents, replay.ident_offsets)
        self.prefill.R["do_remote_decode"] = max_tokens > 1
        self.decode = RequestTable(w.request_ids, w.input_length, max_tokens,
                                              w.priority, replay.idents, replay.ident_offsets)
        self.handed = np.zeros(n, dtype=bool)
        self.transfers = None  # at connect, once the links are known
        self._hand_off = Entry(kv_handoff.hand_off)

    def make_scheduler(self, engine, pool):
        tokens = self.replay.tokens.with_detokenize(engine.detokenize_ms)
        table = self.prefill if pool == "prefill" else self.decode
        return lambda config, blocks: RankScheduler(config, blocks, table, tokens)

    def connect(self, prefill_cores, decode_cores, config):
        links = sum(len(core.ranks) for core in prefill_cores)
        self.transfers = kv_handoff.Transfers(len(self.handed), links, config)
        kv_handoff.connect(prefill_cores, decode_cores, self.transfers)

    def create_prefill(self, i):
        """Request i arrives at the prefill pool: its arrival instant at the
        engine (after the frontend's delay) in the table."""
        self.prefill.R["arrival_time"][i] = self.replay.engine_arrival_ms(i)
        return i

    def remote_decode(self, i) -> bool:
        return bool(self.prefill.R["do_remote_decode"][i])

    def handoff(self, i, source_core, source_rank, decode_core, decode_rank):
        """The handoff (engine/kv_handoff.py `hand_off`): request i joins
        the decode rank's waiting queue now with its prompt and first
        token."""
        self._hand_off(self.prefill.R, self.decode.R, i, self.replay.loop.now)
        self.transfers.link_of[i] = source_core.ranks[source_rank].transfers.link
        self.handed[i] = True
        decode_core.add_request(decode_rank, i, int(self.decode.R["num_tokens"][i]))

    def results(self):
        """`(result columns, kv_transfer_ms, transferred_tokens)`."""
        P, D = self.prefill.R, self.decode.R
        handed = self.handed
        out = self.prefill.results()
        out["output_tokens"] = np.where(handed, D["num_tokens"],
                                        P["num_tokens"]) - P["num_prompt_tokens"]
        out["num_preemptions"] = out["num_preemptions"] + D["num_preemptions"]
        out["recomputed_tokens"] = out["recomputed_tokens"] + D["num_recomputed_tokens"]
        decode_finish = D["finish_pass"]
        out["finish_pass"] = np.where(handed & (decode_finish >= 0), decode_finish,
                                      out["finish_pass"])
        X = self.transfers
        tokens = X.I[:, kv_handoff.X_TOKENS]
        has = handed & (tokens >= 0)
        transferred = np.where(has, tokens, -1)
        wait = np.where(tokens > 0, X.F[:, kv_handoff.X_LAND] - X.F[:, kv_handoff.X_SUBMIT], 0.0)
        known = has & ((X.I[:, kv_handoff.X_DONE] != 0) | (tokens == 0))
        kv_transfer_ms = np.where(known, wait, math.nan)
        # admitted with nothing held to pull
        nothing = handed & (tokens < 0) & (D["kv_handoff"] == 0)
        transferred[nothing] = 0
        kv_transfer_ms[nothing] = 0.0
        return out, kv_transfer_ms, transferred

    def transfer_bytes(self) -> int:
        return int(self.transfers.I[:, kv_handoff.X_NBYTES].sum())

    def handed_off(self, i) -> bool:
        return bool(self.handed[i])

    def sender_of(self, i):
        return self.transfers.senders[self.transfers.link_of[i]]

    def blocks_of(self, pool, i) -> list:
        t = self.prefill if pool == "prefill" else self.decode
        off = t.R["block_offset"][i]
        return t.tables[off:off + t.R["num_held_blocks"][i]].tolist()

    def transfer(self, i):
        X = self.transfers
        if not X.has(i):
            return None
        F = X.F[i]
        return TransferView(int(X.I[i, kv_handoff.X_TOKENS]), int(X.I[i, kv_handoff.X_NBYTES]),
                            float(F[kv_handoff.X_SUBMIT]), float(F[kv_handoff.X_START]),
                            float(F[kv_handoff.X_FINISH]), float(F[kv_handoff.X_LAND]),
                            bool(X.I[i, kv_handoff.X_DONE]), float(F[kv_handoff.X_FREED]))


class DisaggregatedReplay(Replay):
    """A :class:`Replay` over a prefill pool and a decode pool (`sides`: the
    request state of both pools and the handoffs)."""

    def _build_workers(self, num_identities):
        config = self.config
        cluster = config.cluster
        prefill_dp = cluster.pool_data_parallel_size("prefill")
        decode_dp = cluster.pool_data_parallel_size("decode")
        n = len(self.workload)
        self.sides = _ArraySides(self)
        self.prefill_worker_of = np.full(n, -1, dtype=np.int64)
        self.prefill_rank_of = np.full(n, -1, dtype=np.int64)
        sides = self.sides
        buffer = self._pass_log_buffer()
        self.prefill_workers = [
            EngineCore(w, cluster.prefill, prefill_dp, self.loop, num_identities,
                       _PrefillObserver(self), sides.make_scheduler(cluster.prefill, "prefill"),
                       pool="prefill", pass_log=buffer,
                       kv_event_lag_ms=cluster.router.kv_event_lag_ms)
            for w in range(cluster.prefill_workers)]
        self.decode_workers = [
            EngineCore(w, cluster.decode, decode_dp, self.loop, num_identities, self,
                       sides.make_scheduler(cluster.decode, "decode"), pool="decode",
                       pass_log=buffer)
            for w in range(cluster.decode_workers)]
        sides.connect(self.prefill_workers, self.decode_workers, cluster.kv_transfer)
        self.workers = self.prefill_workers + self.decode_workers
        self._use_compiled_log(buffer)
        self.runner = None  # the workers' compiled loop (engine/disaggregated_loop.py)
        if DisaggregatedLoop.fit(self.workers, len(self.prefill_workers)):
            self.runner = DisaggregatedLoop(self.workers, len(self.prefill_workers), self.loop,
                                          self, buffer)
        (prefill_key, _), (decode_key, _) = cluster.data_parallel_widths()
        self.router = Router(cluster.router, self.prefill_workers, prefill_dp, prefill_key)
        self.decode_router = Router(cluster.router, self.decode_workers, decode_dp, decode_key,
                                    load_only=True)

    # -- what tests read ---------------------------------------

    def transfer(self, i):
        """Request i's transfer (a :data:`TransferView`), or None."""
        return self.sides.transfer(i)

    def handed_off(self, i) -> bool:
        """Whether request i was handed to a decode worker."""
        return self.sides.handed_off(i)

    def sender_of(self, i):
        """The prefill rank's sender that handed request i off."""
        return self.sides.sender_of(i)

    def blocks_of(self, pool: str, i) -> list:
        """The G1 blocks request i holds on its `pool` rank ("prefill",
        "decode")."""
        return self.sides.blocks_of(pool, i)

    def _arrivals_in_loop(self) -> bool:
        return False  # every arrival is routed to the prefill pool (`_on_arrival`)

    def _cluster_takes_arrivals(self) -> bool:
        return False  # (as above)

    def _tables(self):
        return [self.sides.prefill, self.sides.decode]

    def _schedule_arrivals(self):
        if self.runner is None:
            return super()._schedule_arrivals()
        w = self.workload
        n = len(w)
        prefill, decode = self.sides.prefill, self.sides.decode
        # prompts whose first token and prompt can never fit the decode pool
        # (`_on_arrival`)
        never_fits = (self._never_fit(self.decode_workers[0].ranks[0].scheduler, 1)
                      & (self.max_tokens > 1))
        # (read by the loop in an open loop only; arrays of one type either way)
        self._open_ms, self._open_req = self._open_arrivals()
        self.runner.attach(
            pool_arrays(self.router.arrays, self.router.code, prefill),
            pool_arrays(self.decode_router.arrays, self.decode_router.code, decode, 1),
            (self._open_ms, self._open_req, np.ascontiguousarray(w.dp_rank, np.int64),
             never_fits,
             self.prefill_worker_of, self.prefill_rank_of, self.worker_of, self.rank_of,
             self.sides.handed, self.status, int(STATUS_FINISHED), int(STATUS_REJECTED)),
            (self.router.arrays.ranks, self.decode_router.arrays.ranks))
        if not self._loop_takes_arrivals():
            return super()._schedule_arrivals()
        # an open loop: the workers' compiled loop routes the arrivals, hands
        # the requests off and marks them finished (a finish releases nothing)
        self.taker = self.runner
        self.loop.seq += 1
        self.runner.take_arrivals(self.loop.seq)
        self._next_release = n

    def _loop_takes_arrivals(self) -> bool:
        """Whether the workers' compiled loop takes the arrivals
        (`DisaggregatedLoop.take_arrivals`): an open loop without sessions, no
        request pinned to a rank out of either pool's range (the router names
        it when it arrives), and not the debug mode (it checks the routers'
        kept counts at each arrival)."""
        cluster = self.config.cluster
        widths = (cluster.pool_data_parallel_size("prefill"),
                  cluster.pool_data_parallel_size("decode"))
        return (self.workload.concurrency is None and self.sessions is None
                and not check.enabled() and not (self.workload.dp_rank >= min(widths)).any())

    def horizon_key(self):
        """The pools touch each other (a prefill finish hands a request to a
        decode worker, a decode decision's pull makes a prefill rank wait):
        the workers run as one compiled loop in their events' key order
        (engine/disaggregated_loop.py), which stops at the next event of any
        other kind."""
        return min(super().horizon_key(), self.loop.next_key())

    # -- arrivals and handoffs -------------------------------------------------

    def _idents(self, i):
        return self.idents[self.ident_offsets[i]:self.ident_offsets[i + 1]]

    def _on_arrival(self, i):
        w = self.workload
        self.arrived[i] = True
        self._arrivals += 1
        prompt = int(w.input_length[i])
        max_tokens = int(self.max_tokens[i])
        decode_fits = (max_tokens <= 1 or self.decode_workers[0].ranks[0]
                       .scheduler.can_ever_fit(prompt + 1))
        worker, rank = self.router.route(w.request_ids[i], i, prompt, self._idents(i),
                                         int(w.dp_rank[i]), self.loop.now, admit=decode_fits)
        self.prefill_worker_of[i] = worker
        self.prefill_rank_of[i] = rank
        request = self.sides.create_prefill(i)
        core = self.prefill_workers[worker]
        if not decode_fits:
            core.ranks[rank].num_requests += 1  # routed there, as add_request counts rejections
        if not decode_fits or not core.add_request(rank, request, prompt):
            self.status[i] = STATUS_REJECTED
            self._release_next()

    def on_prefill_done(self, i, finished):
        """A request's prefill-side request finished (its first token is out)
        or was taken out as unfinishable."""
        if not finished or not self.sides.remote_decode(i):
            self.on_done(i, finished)
            return
        w = self.workload
        prompt = int(w.input_length[i])
        worker, rank = self.decode_router.route(w.request_ids[i], i, prompt + 1, self._idents(i),
                                                int(w.dp_rank[i]), self.loop.now)
        self.worker_of[i] = worker
        self.rank_of[i] = rank
        self.sides.handoff(i, self.prefill_workers[self.prefill_worker_of[i]],
                           int(self.prefill_rank_of[i]), self.decode_workers[worker], rank)

    # -- results ---------------------------------------------------------------

    def _records(self):
        out, kv_transfer_ms, transferred = self.sides.results()
        return self._make_records(
            out, self.worker_of, self.rank_of, prefill_worker=self.prefill_worker_of,
            prefill_dp_rank=self.prefill_rank_of,
            decode_worker=self.worker_of.copy(), kv_transfer_ms=kv_transfer_ms,
            transferred_tokens=transferred)

    def _stats(self) -> RunStats:
        stats = super()._stats()
        end = self.loop.now
        stats.pools = {}
        # the run's prefix-cache figures: the prefill pool's lookups only
        stats.prefix_cache_queries = stats.prefix_cache_hits = 0
        stats.preempted_prefix_cache_queries = stats.preempted_prefix_cache_hits = 0
        for name, cores in (("prefill", self.prefill_workers), ("decode", self.decode_workers)):
            pool = PoolStats(workers=len(cores), data_parallel_size=getattr(
                self.config.cluster, f"{name}_data_parallel_size"))
            means = []
            for core in cores:
                pool.passes += core.num_passes
                pool.busy_ms += core.busy_ms
                for rank in core.ranks:
                    s = rank.scheduler
                    pool.requests += rank.num_requests
                    pool.preemptions += s.num_preemptions
                    pool.prefix_cache_queries += s.prefix_cache_stats.queries
                    pool.prefix_cache_hits += s.prefix_cache_stats.hits
                    means.append(rank.usage_mean(end))
                    if name == "prefill":
                        pcs = s.prefix_cache_stats
                        stats.prefix_cache_queries += pcs.queries
                        stats.prefix_cache_hits += pcs.hits
                        stats.preempted_prefix_cache_queries += pcs.preempted_queries
                        stats.preempted_prefix_cache_hits += pcs.preempted_hits
            pool.kv_usage_mean = sum(means) / len(means)
            stats.pools[name] = pool
        stats.kv_transfer_bytes = self.sides.transfer_bytes()
        return stats
