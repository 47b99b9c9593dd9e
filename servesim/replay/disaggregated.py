"""Replay through disaggregated prefill and decode pools (`cluster.mode:
disaggregated`): routing at arrival and at handoff, the two request objects
of each request, and their results merged into one record. The KV handoff
itself — held blocks, links, pulls — is servesim/engine/disagg.py.

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

import numpy as np

from servesim.engine import disagg
from servesim.engine.core import EngineCore
from servesim.kvcache.manager import KVCacheManager
from servesim.replay.driver import empty_results, Replay
from servesim.replay.records import STATUS_REJECTED, PoolStats, RunStats
from servesim.replay.router import Router
from servesim.scheduler.request import Request
from servesim.scheduler.scheduler import Scheduler


class _PrefillObserver:
    """The prefill workers' observer: a request done there is handed off
    (or, with one token, done); passes go to the replay's pass log."""

    def __init__(self, replay):
        self.replay = replay

    def on_done(self, i, finished):
        self.replay.on_prefill_done(i, finished)

    def on_pass(self, core, p):
        self.replay.on_pass(core, p)


class DisaggregatedReplay(Replay):
    """A :class:`Replay` over a prefill pool and a decode pool."""

    def _build_workers(self, num_identities):
        config = self.config
        cluster = config.cluster
        prefill_dp = cluster.pool_data_parallel_size("prefill")
        decode_dp = cluster.pool_data_parallel_size("decode")
        n = len(self.workload)
        self.prefill_objects = [None] * n
        self.decode_objects = [None] * n
        self.handoffs = [None] * n
        self.prefill_worker_of = np.full(n, -1, dtype=np.int64)
        self.prefill_rank_of = np.full(n, -1, dtype=np.int64)

        def maker(engine):
            tokens = self.tokens.with_detokenize(engine.detokenize_ms)
            return lambda config, pool: Scheduler(config, KVCacheManager(pool), tokens)

        self.prefill_workers = [
            EngineCore(w, cluster.prefill, prefill_dp, self.loop, num_identities, _PrefillObserver(self),
                       maker(cluster.prefill), pool="prefill")
            for w in range(cluster.prefill_workers)]
        self.decode_workers = [
            EngineCore(w, cluster.decode, decode_dp, self.loop, num_identities, self,
                       maker(cluster.decode), pool="decode")
            for w in range(cluster.decode_workers)]
        disagg.connect(self.prefill_workers, self.decode_workers, cluster.kv_transfer)
        self.workers = self.prefill_workers + self.decode_workers
        (prefill_key, _), (decode_key, _) = cluster.data_parallel_widths()
        self.router = Router(cluster.router, self.prefill_workers, prefill_dp, prefill_key)
        self.decode_router = Router(cluster.router, self.decode_workers, decode_dp, decode_key)

    # -- arrivals and handoffs -------------------------------------------------

    def _idents(self, i):
        return self.idents[self.ident_offsets[i]:self.ident_offsets[i + 1]]

    def _on_arrival(self, i):
        w = self.workload
        self.arrived[i] = True
        self._arrivals += 1
        prompt = int(w.input_length[i])
        max_tokens = int(self.max_tokens[i])
        worker, rank = self.router.route(w.request_ids[i], prompt, self._idents(i),
                                         int(w.dp_rank[i]))
        self.prefill_worker_of[i] = worker
        self.prefill_rank_of[i] = rank
        request = Request(i, w.request_ids[i], float(self.arrival_ms[i]), prompt,
                          min(max_tokens, 1), self._idents(i), int(w.priority[i]))
        request.remote_decode = max_tokens > 1
        self.prefill_objects[i] = request
        core = self.prefill_workers[worker]
        decode_fits = (not request.remote_decode or self.decode_workers[0].ranks[0]
                       .scheduler.can_ever_fit(prompt + 1))
        if not decode_fits:
            core.ranks[rank].num_requests += 1  # routed there, as add_request counts rejections
        if not decode_fits or not core.add_request(rank, request, prompt):
            self.status[i] = STATUS_REJECTED
            self._release_next()

    def on_prefill_done(self, i, finished):
        """A request's prefill-side request finished (its first token is out)
        or was taken out as unfinishable."""
        source = self.prefill_objects[i]
        if not finished or not source.remote_decode:
            self.on_done(i, finished)
            return
        w = self.workload
        prompt = source.num_prompt_tokens
        worker, rank = self.decode_router.route(w.request_ids[i], prompt + 1, self._idents(i),
                                                int(w.dp_rank[i]))
        request = Request(i, w.request_ids[i], self.loop.now, prompt, int(self.max_tokens[i]),
                          self._idents(i), int(w.priority[i]))
        request.num_tokens = prompt + 1  # the prompt and the first token
        request.max_computed_tokens = prompt  # computed once, on the prefill worker
        self.decode_objects[i] = request
        self.worker_of[i] = worker
        self.rank_of[i] = rank
        self.handoffs[i] = disagg.handoff(
            self.prefill_workers[self.prefill_worker_of[i]], int(self.prefill_rank_of[i]),
            source, self.decode_workers[worker], rank, request, self.loop.now)

    # -- results ---------------------------------------------------------------

    def _records(self):
        n = len(self.workload)
        out = empty_results(n)
        kv_transfer_ms = np.full(n, math.nan)
        transferred = np.full(n, -1, dtype=np.int64)
        for i, p in enumerate(self.prefill_objects):
            if p is None:
                continue
            d = self.decode_objects[i]
            out["output_tokens"][i] = (d or p).num_output_tokens
            out["num_preemptions"][i] = p.num_preemptions + (d.num_preemptions if d else 0)
            out["first_admission_cached_tokens"][i] = max(p.first_admission_cached_tokens, 0)
            out["recomputed_tokens"][i] = p.recomputed_tokens + (d.recomputed_tokens if d else 0)
            out["first_scheduled_ms"][i] = p.first_scheduled_ms
            out["first_token_pass"][i] = p.first_token_pass
            out["finish_pass"][i] = d.finish_pass if d and d.finish_pass >= 0 else p.finish_pass
            if d is None:
                continue
            job = self.handoffs[i].transfer
            if job is not None:  # a pull (or a notice: nothing moved)
                transferred[i] = job.tokens
                if job.done or not job.tokens:
                    kv_transfer_ms[i] = job.wait_ms
            elif d.kv_handoff is None:  # admitted with nothing held to pull
                transferred[i] = 0
                kv_transfer_ms[i] = 0.0
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
        stats.kv_transfer_bytes = sum(h.transfer.nbytes for h in self.handoffs
                                      if h is not None and h.transfer is not None)
        return stats
