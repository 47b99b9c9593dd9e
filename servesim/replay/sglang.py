"""Replay a workload through one simulated SGLang worker (`engine.backend:
sglang`; docs/sglang.md): the requests built from the workload, the
scheduler's event loop, and the records, pass log and counters the other
engines produce (servesim/replay/driver.py), with SGLang's own fields."""

import functools
import math

import numpy as np

from servesim.engine.events import RELEASED
from servesim.engine.pricing import PassPricer, price_pass
from servesim.replay.telemetry import Telemetry
from servesim.scheduler import check
from servesim.results.records import (STATUS_FINISHED, STATUS_REJECTED, STATUS_UNFINISHED,
                                      RequestRecords, RunStats, SimulationResult, WorkerStats)
from servesim.sglang.cluster import Cluster
from servesim.sglang.scheduler import Scheduler
from servesim.sglang.req import Req, stream_token


def prompt_tokens(hash_ids, input_length: int, block: int) -> list:
    """Token t of a prompt is `hash_ids[t // block] * block + t % block`: two
    prompts share exactly the tokens their hash ids make equal."""
    blocks = -(-input_length // block)
    ids = np.asarray(hash_ids[:blocks], dtype=np.int64) * block
    return (ids[:, None] + np.arange(block, dtype=np.int64)).ravel()[:input_length]


def stream_prompt_tokens(hash_ids, input_length: int, block: int, start: int, stream: int):
    """A turn of an accumulating session: its first `start` tokens are its
    session's first prompt (from the hash ids), the rest the session's token
    stream (the earlier turns' outputs and new input, `stream_token`)."""
    head = prompt_tokens(hash_ids, min(start, input_length), block)
    return np.concatenate((head, stream_token(stream, np.arange(start, input_length,
                                                                dtype=np.int64))))


def init_req_max_new_tokens(cfg, prompt_len: int, limit: int) -> int:
    """`init_req_max_new_tokens`: the limit clipped to the context length and
    to what an empty pool can hold (`max_new_tokens_for_memory`)."""
    page = cfg.page_size
    by_memory = cfg.max_total_tokens - (-(-prompt_len // page) * page) - page - 1
    return min(limit, cfg.context_length - 1 - prompt_len - 1, by_memory)


def build_reqs(cfg, workload):
    """The requests in workload order, and the set of those rejected at
    arrival (a prompt that leaves no room for one output token)."""
    reqs, rejected = [], set()
    limits = workload.max_new_tokens if workload.max_new_tokens is not None else workload.output_length
    block = workload.trace_block_size
    plan = workload.sessions
    for i in range(len(workload)):
        h = workload.hash_flat[workload.hash_offsets[i]:workload.hash_offsets[i + 1]]
        prompt_len = int(workload.input_length[i])
        output_length = int(workload.output_length[i])
        limit = int(limits[i])
        eos_at = output_length if limit > output_length else 0
        clipped = init_req_max_new_tokens(cfg, prompt_len, limit)
        stream = None
        if plan is not None and plan.stream_start[i] >= 0:
            stream = int(plan.session[i])
            make = functools.partial(stream_prompt_tokens, h, prompt_len, block,
                                     int(plan.stream_start[i]), stream)
        else:
            make = functools.partial(prompt_tokens, h, prompt_len, block)
        req = Req(i, workload.request_ids[i], float(workload.arrival_ms[i]), make, clipped,
                  eos_at, cfg.ignore_eos, prompt_len=prompt_len, stream=stream)
        if plan is not None:
            req.session = int(plan.session[i])
        reqs.append(req)
        if clipped < 1:
            rejected.add(i)
    return reqs, rejected


class PassCost:
    """A pass's GPU time under the engine's timing model (the same kernel as
    vLLM engines: servesim/engine/pricing.py), from its rows; `aic` from the
    database's SGLang tables (servesim/deployment/aic_tables.py)."""

    def __init__(self, engine):
        self.pricer = PassPricer.of_engine(engine)

    def __call__(self, batch) -> float:
        prefill = prefill_rows = decode = decode_context = prefill_context = 0
        for row in batch.rows:
            prefill += row.tokens
            prefill_rows += 1
            prefill_context += row.prefix
        decode = len(batch.decode)
        decode_context = batch.decode_context
        p = self.pricer
        return float(price_pass(p.model, p.params, prefill, prefill_rows, decode, decode_context,
                                prefill + decode, batch.num_rows, p.kv_capacity_tokens, 0,
                                prefill_context, 0))


class TelemetryWorker:
    """The SGLang worker as telemetry samples it (servesim/replay/telemetry.py):
    one worker of one rank, which is also the rank's scheduler, KV pool and
    prefix-cache counters; `cached_blocks` are the radix tree's pages,
    `kv_usage` SGLang's token usage, `preemptions` retractions."""

    def __init__(self, scheduler, index: int = 0):
        self.index = index
        self.ranks = [_TelemetryRank(scheduler)]
        self.pool = None  # not a disaggregated pool


class _TelemetryRank:
    """The one rank: also its scheduler, its KV pool and its prefix-cache
    counters, as telemetry reads them (`_FACES`)."""

    index = 0
    _FACES = {
        "num_passes": lambda s: s.num_passes,
        "tokens_scheduled": lambda s: s.tokens_scheduled,
        "num_preemptions": lambda s: s.num_retractions,
        "queries": lambda s: s.prefix_queries,
        "hits": lambda s: s.prefix_hits,
        "num_running": lambda s: len(s.running),
        "num_waiting": lambda s: len(s.waiting),
        "usage": lambda s: s.used_tokens / s.pool.size,
    }

    def __init__(self, scheduler):
        self._s = scheduler
        self.scheduler = self.pool = self.prefix_cache_stats = self

    def __getattr__(self, name):
        try:
            face = self._FACES[name]
        except KeyError:
            raise AttributeError(name) from None
        return face(self._s)

    def num_cached_blocks(self):
        return self._s.tree.total_size() // self._s.page_size

    def cpu_tier_blocks(self):
        return 0


class _SessionLoop:
    """Sessions and agent graphs (servesim/workload/sessions.py's
    `SessionArrivals`) on the SGLang workers' clock: the event loop it
    schedules arrivals on. An arrival sent at a finish's instant (no delay,
    or a closed loop's next session) is added at once, after the decision of
    that instant (as a closed loop's release); a later one at its instant,
    before the workers' events there. A request rejected at arrival is done
    at once (its dependents are released)."""

    def __init__(self, cluster, workload, reqs, workers):
        from servesim.workload.sessions import SessionArrivals

        self.cluster = cluster
        self.reqs = reqs
        self.releasing = None  # the worker whose finish is being processed
        self.started = False
        self.arrival_ms = workload.arrival_ms.astype(np.float64).copy()
        self.sessions = SessionArrivals(workload.sessions, self.arrival_ms, workload.concurrency,
                                        self, self._on_arrival)
        cluster.on_rejected = lambda req, at_ms: self.sessions.done(req.index, at_ms)
        for worker in workers:
            worker.release_on_finish = self._on_finish

    def start(self):
        self.sessions.start()
        self.started = True

    @property
    def now(self) -> float:
        return self.cluster.now

    def next_time(self) -> float:
        return math.inf  # (SessionArrivals.horizon: the compiled loops' bound only)

    def schedule(self, t, order, handler, arg=None):
        if order == RELEASED and t == self.now and self.started:
            self._released = True
            handler(arg)
            self._released = False
        else:
            self.cluster.call_at(t, handler, arg)

    _released = False

    def _on_arrival(self, i):
        req = self.reqs[i]
        at = float(self.arrival_ms[i])
        if self._released:
            self.cluster.add(req, at, releasing=self.releasing, released=True)
        else:
            self.cluster.add(req, at)

    def _on_finish(self, worker, req, at_ms):
        self.releasing = worker
        self.sessions.done(req.index, at_ms)
        self.releasing = None


class SGLangReplay:
    """One simulation run of an SGLang worker; `run()` returns its SimulationResult."""

    def __init__(self, config, workload, progress=None):
        self.config = config
        self.workload = workload
        self.progress = progress

    def run(self) -> SimulationResult:
        config = self.config
        cfg = config.engine.sglang
        w = self.workload
        reqs, rejected = build_reqs(cfg, w)
        log = config.output.pass_log
        passes = []  # every worker's, in launch order
        workers = []
        for k in range(config.cluster.workers):
            worker = Scheduler(cfg, [], PassCost(config.engine), log=log, check=check.enabled())
            worker.passes = passes
            if config.cluster.workers > 1:
                worker.worker_index = k  # named in each pass of the log
            workers.append(worker)
        telemetry = None
        interval = config.output.telemetry_interval_ms
        if interval:
            telemetry = Telemetry(interval, [TelemetryWorker(worker, k)
                                             for k, worker in enumerate(workers)])
        router = config.cluster.router
        choose = None
        if router.policy in ("kv_router", "least_prefill", "weighted"):
            from servesim.replay.sglang_router import cache_aware_router

            choose = cache_aware_router(router, workers, reqs, w, cfg.page_size)
        cluster = Cluster(workers, router.policy,
                          None if telemetry is None else telemetry.advance, choose)
        if w.sessions is not None:
            _SessionLoop(cluster, w, reqs, workers).start()
        elif w.concurrency is None:
            cluster.arrivals = reqs
        else:
            pending = iter(reqs)
            cluster.arrivals = self._closed_loop_release(pending, w.concurrency, 0.0)

            def release(worker, finished, at_ms):
                for req in self._closed_loop_release(pending, 1, at_ms):
                    cluster.add(req, at_ms, releasing=worker)

            for worker in workers:
                worker.release_on_finish = release
        cluster.run()
        end = cluster.clock
        if telemetry is not None:
            telemetry.finish(end)
        status = np.full(len(w), STATUS_UNFINISHED, dtype=np.int8)
        for req in reqs:
            if req.index in rejected:
                status[req.index] = STATUS_REJECTED
            elif req.finished:
                status[req.index] = STATUS_FINISHED
        if self.progress is not None:
            self.progress(end, int((status != STATUS_UNFINISHED).sum()))
        return SimulationResult(records=self._records(reqs, status),
                                stats=self._stats(workers, reqs, end),
                                pass_log=passes if log else None,
                                telemetry=None if telemetry is None else telemetry.samples)

    @staticmethod
    def _closed_loop_release(pending, count: int, at_ms: float) -> list:
        """Closed loop (`workload.concurrency`): the next requests arriving at
        `at_ms`, up to `count` that are not rejected (one rejected at arrival
        leaves at once and releases the next in its place)."""
        out = []
        admitted = 0
        while admitted < count:
            req = next(pending, None)
            if req is None:
                break
            req.arrival_ms = at_ms
            out.append(req)
            admitted += req.max_new_tokens >= 1
        return out

    def _records(self, reqs, status) -> RequestRecords:
        w = self.workload
        n = len(w)

        def ints(get):
            return np.array([get(r) for r in reqs], dtype=np.int64)

        def floats(get):
            return np.array([get(r) for r in reqs], dtype=np.float64)

        produced = ints(lambda r: r.num_outputs)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(produced, out=offsets[1:])
        token_ms = np.zeros(offsets[-1], dtype=np.float64)
        tables = {id(r.table): r.table for r in reqs if r.table is not None}
        for table in tables.values():  # each worker's token log, into request order
            slot, ms = table.tokens_by_slot()
            if not len(slot):
                continue
            starts = np.flatnonzero(np.r_[True, slot[1:] != slot[:-1]])
            first = np.repeat(starts, np.diff(np.r_[starts, len(slot)]))
            index = np.array([r.index for r in table.reqs], dtype=np.int64)[slot]
            token_ms[offsets[index] + np.arange(len(slot)) - first] = ms
        retractions = ints(lambda r: r.num_retractions)
        extra = {}
        if w.sessions is not None:
            extra = dict(session_ids=w.sessions.session_ids, session=w.sessions.session,
                         turn=w.sessions.turn, session_truncated=w.sessions.truncated)
        return RequestRecords(**extra,
            ids=list(w.request_ids), arrival_ms=floats(lambda r: r.arrival_ms),
            first_scheduled_ms=floats(lambda r: r.first_scheduled_ms),
            first_token_ms=floats(lambda r: r.first_token_ms),
            finish_ms=floats(lambda r: r.finish_ms),
            input_length=w.input_length.astype(np.int64), output_length=w.output_length.astype(np.int64),
            output_tokens=produced, num_preemptions=retractions,
            first_admission_cached_tokens=ints(lambda r: max(r.first_cached, 0)),
            cpu_tier_cached_tokens=np.zeros(n, dtype=np.int64),
            recomputed_tokens=ints(lambda r: r.recomputed_tokens),
            worker=ints(lambda r: r.worker), dp_rank=np.zeros(n, dtype=np.int64),
            status=status,
            first_token_pass=ints(lambda r: r.first_token_pass),
            finish_pass=ints(lambda r: r.finish_pass),
            token_offsets=offsets, token_client_ms=token_ms,
            num_retractions=retractions, cached_tokens=ints(lambda r: r.cached_tokens),
            finish_reason=[r.finish_reason for r in reqs],
        )

    def _stats(self, workers, reqs, end: float) -> RunStats:
        stats = RunStats()
        means = []
        for k, worker in enumerate(workers):
            mean = worker.usage_area / end if end > 0 else 0.0
            means.append(mean)
            stats.passes += worker.num_passes
            stats.preemptions += worker.num_retractions
            stats.prefix_cache_queries += worker.prefix_queries
            stats.prefix_cache_hits += worker.prefix_hits
            stats.workers.append(WorkerStats(
                worker=k, requests=sum(1 for r in reqs if r.worker == k), passes=worker.num_passes,
                busy_ms=worker.busy_ms, kv_usage_mean=mean, kv_usage_max=worker.usage_max))
        stats.kv_usage_mean = sum(means) / len(means)
        stats.kv_usage_max = max(worker.usage_max for worker in workers)
        return stats


__all__ = ["SGLangReplay", "build_reqs", "prompt_tokens"]
