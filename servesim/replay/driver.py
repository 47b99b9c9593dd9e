"""Replay a workload through the configured workers: arrivals (open loop, or
closed loop with `concurrency`), routing, the engines on one event loop, and
the collection of per-request results, pass log and counters.
"""

import math
import time
import warnings

import numpy as np

from servesim.engine.core import EngineCore
from servesim.engine.events import ARRIVAL, RELEASED, EventLoop
from servesim.engine.pass_log_buffer import PassLogBuffer
from servesim.engine.release import TokenLog
from servesim.scheduler.speculative import spec_table_slack
from servesim.errors import InvariantError
from servesim.config.config_types import Config
from servesim.config.fitted_checks import launch_double_count_warning
from servesim.config.speculative_config import check_accepted
from servesim.workload.prefix import block_identities
from servesim.results.records import (STATUS_FINISHED, STATUS_REJECTED, STATUS_UNFINISHED,
                                     RequestRecords, RunStats, SimulationResult,
                                     WorkerStats)
from servesim.replay.router import Router
from servesim.replay.telemetry import Telemetry
from servesim.workload.workload import Workload
from servesim.scheduler import check
from servesim.scheduler.check import AFTER_OUTPUT, check_table
from servesim.scheduler.drafts import position_counts
from servesim.scheduler.rank import RankScheduler
from servesim.scheduler.request import RequestTable

_PROGRESS_EVERY_S = 0.1  # wall seconds between progress callbacks
_AFTER_EVERY_ORDER = 99  # a key after every event at its instant (engine/events.py orders)


class RequestStore:
    """The requests: columns of a :class:`RequestTable`, scheduled by the
    compiled :class:`RankScheduler`."""

    def __init__(self, replay):
        self.replay = replay
        w = replay.workload
        self.table = RequestTable(w.request_ids, w.input_length, replay.max_tokens,
                                  w.priority, replay.idents, replay.ident_offsets,
                                  w.accepted_offsets, w.accepted_values)

    def create(self, i):
        self.table.R["arrival_time"][i] = self.replay.engine_arrival_ms(i)
        return i

    def make_scheduler(self, config, pool):
        scheduler = RankScheduler(config, pool, self.table, self.replay.tokens,
                                  self.replay.config.engine.speculative)
        w = self.replay.workload
        # a finish may release an arrival: closed loop, or a session's next turn
        scheduler.stop_on_finish = w.concurrency is not None or w.sessions is not None
        return scheduler

    def results(self):
        out = self.table.results()
        if self.replay.config.engine.speculative is not None:
            out.update(self.table.spec_results())
        return out


class OneWorkerArrivals:
    """The open-loop arrivals one worker of one rank admits in its own pass
    loop (`EngineCore.take_arrivals`; it rejects those that can never fit
    itself), as the replay's `_sync_arrivals` reads every compiled loop
    taking them: `arrivals` so far, `done` (the requests rejected), `settle`
    (what the kernel leaves to the replay)."""

    def __init__(self, core):
        self.core = core

    arrivals = property(lambda self: self.core.compiled.arrivals)
    done = property(lambda self: self.core.compiled.rejected)

    def settle(self, span, replay):
        """Requests `span` arrived: on worker 0, rank 0, counted there."""
        replay.worker_of[span] = 0
        replay.rank_of[span] = 0
        self.core.ranks[0].num_requests += len(span)


class Replay:
    """One simulation run; `run()` returns its :class:`SimulationResult`."""

    def __init__(self, config: Config, workload: Workload, progress=None):
        self.config = config
        self.workload = workload
        self.progress = progress
        engine = config.engine
        block_size = engine.kv_cache.block_size
        max_model_len = engine.scheduler.max_model_len
        prompt = workload.input_length
        self.max_tokens = workload.output_length.copy()
        if max_model_len is not None:
            self.max_tokens = np.minimum(self.max_tokens, max_model_len - prompt)
        self.max_tokens = np.maximum(self.max_tokens, 0)
        speculative = engine.speculative
        slack, hash_lookahead = 0, 0
        if speculative is not None:
            slack, hash_lookahead = spec_table_slack(speculative, engine.kv_cache)
            check_accepted(workload, speculative.num_speculative_tokens)
            if speculative.acceptance_profiles:
                from servesim.scheduler.acceptance_profiles import with_profile_lists

                self.workload = workload = with_profile_lists(workload, speculative,
                                                              self.max_tokens)
        num_blocks = np.maximum(-(-(prompt + self.max_tokens + slack) // block_size), 1)
        self.idents, self.ident_offsets, num_identities = block_identities(
            workload.hash_flat, workload.hash_offsets, workload.trace_block_size,
            prompt, num_blocks, block_size, hash_lookahead)
        if workload.sessions is not None:
            from servesim.workload.sessions import session_block_identities

            self.idents, num_identities = session_block_identities(
                workload.sessions, self.idents, self.ident_offsets, num_identities,
                prompt, self.max_tokens, block_size, hash_lookahead)
        # when each request is sent (the client's clock: TTFT counts from it)
        self.arrival_ms = workload.arrival_ms.astype(np.float64).copy()
        # the API server's delay of each, before it reaches the engine (None: none)
        frontend = engine.frontend
        self.frontend_ms = (None if frontend is None else
                            frontend.delay_ms(workload.input_length.astype(np.float64)))
        # an open loop's arrivals at the engine in the order they come: the
        # k-th is request `_open_req[k]` at `_open_ms[k]` (`_open_arrivals`)
        self._open_ms, self._open_req = None, None
        self.tokens = TokenLog(self.max_tokens, engine.detokenize_ms)
        self.loop = EventLoop()
        n = len(workload)
        self.pass_log = [] if config.output.pass_log else None
        self._build_workers(num_identities)
        # the debug mode across the compiled schedulers of several workers or
        # ranks sharing a request table (each also checks itself alone,
        # servesim/scheduler/check.py), after every event of their compiled runs
        self._checked_tables = [t for t in self._tables() if len(t.checked_schedulers) > 1]

        self.status = np.full(n, STATUS_UNFINISHED, dtype=np.int8)
        self.arrived = np.zeros(n, dtype=bool)
        self.worker_of = np.full(n, -1, dtype=np.int64)
        self.rank_of = np.full(n, -1, dtype=np.int64)
        interval = config.output.telemetry_interval_ms
        self.telemetry = Telemetry(interval, self.workers) if interval else None
        self.num_done = 0
        self._next_release = 0  # closed loop: next request to release
        self._last_progress = time.perf_counter()
        self._arrivals = 0  # arrivals so far; open loop: in `_open_arrivals`' order
        # the compiled loop that takes an open loop's arrivals (None: the event
        # loop takes them one by one), and the requests it finished or
        # rejected, accounted for (`_sync_arrivals`)
        self.taker = None
        self._taker_done = 0
        self.sessions = None  # arrivals that wait for finishes (workload/sessions.py)
        if workload.sessions is not None:
            from servesim.workload.sessions import SessionArrivals

            self.sessions = SessionArrivals(workload.sessions, self.arrival_ms,
                                            workload.concurrency, self.loop, self._on_arrival,
                                            self.frontend_ms)

    def _build_workers(self, num_identities):
        """The request store, the workers and the router."""
        config = self.config
        self.store = RequestStore(self)
        cluster = config.cluster
        buffer = self._pass_log_buffer()
        self.workers = [EngineCore(w, config.engine, cluster.data_parallel_size, self.loop,
                                   num_identities, self, self.store.make_scheduler,
                                   pass_log=buffer, kv_event_lag_ms=cluster.router.kv_event_lag_ms)
                        for w in range(cluster.workers)]
        self._use_compiled_log(buffer)
        self.router = Router(cluster.router, self.workers, cluster.data_parallel_size)

    def _pass_log_buffer(self):
        """The compiled pass loops' log buffer, sized for this workload (None:
        no pass log)."""
        if self.pass_log is None:
            return None
        return PassLogBuffer.for_workload(self.workload.input_length, self.workload.output_length)

    def _tables(self):
        """The request tables the workers' schedulers share."""
        return [self.store.table]

    def _use_compiled_log(self, buffer):
        """With a pass log, the log is the compiled pass loops' buffer; passes
        of several workers go into it in event order, so a worker's run then
        stops at the next event of any kind."""
        self._log_in_order = False
        if buffer is None:
            return
        from servesim.replay.pass_log import PassLog

        self.pass_log = PassLog(buffer, self.workload.request_ids,
                                        self.config.engine.speculative is not None)
        self._log_in_order = len(self.workers) > 1

    # -- arrivals ------------------------------------------------------------

    def engine_arrival_ms(self, i) -> float:
        """When request i reaches the engine: when it was sent, plus the
        frontend's delay (`engine.frontend`)."""
        t = float(self.arrival_ms[i])
        return t if self.frontend_ms is None else t + float(self.frontend_ms[i])

    def _send(self, i, t, order):
        """Request i is sent at `t`: it arrives at the engine after the
        frontend's delay, at order `order` if there is none (RELEASED for a
        request sent at a release instant), else as an outside arrival
        (ARRIVAL): it reaches the engine after the release instant."""
        self.arrival_ms[i] = t
        at = self.engine_arrival_ms(i)
        self.loop.schedule(at, order if at == t else ARRIVAL, self._on_arrival, i)

    def _open_arrivals(self):
        """An open loop's arrivals at the engine in the order they come, as
        `(at, req)`: the k-th is request `req[k]` at `at[k]`
        (`engine_arrival_ms`). That is the workload order unless a per-token
        tokenize delay lets a short prompt sent later overtake a long one;
        equal times keep the workload order (a stable sort)."""
        if self.frontend_ms is None:
            return self.arrival_ms, np.arange(len(self.arrival_ms), dtype=np.int64)
        at = self.arrival_ms + self.frontend_ms
        req = np.argsort(at, kind="stable").astype(np.int64)
        return np.ascontiguousarray(at[req]), req

    def _schedule_arrivals(self):
        if self.sessions is not None:
            return self.sessions.start()
        concurrency = self.workload.concurrency
        n = len(self.workload)
        if concurrency is None:
            self._open_ms, self._open_req = self._open_arrivals()
        if concurrency is None and self._arrivals_in_loop():
            # the worker's compiled loop admits them (sequence drawn as below)
            self.taker = OneWorkerArrivals(self.workers[0])
            self.loop.seq += 1
            self.workers[0].take_arrivals(self._open_ms, self._open_req, self.status,
                                          STATUS_REJECTED, self.loop.seq)
            self._next_release = n
        elif concurrency is None and self._cluster_takes_arrivals():
            # the workers' compiled loop routes and admits them (aggregated_loop.py)
            from servesim.engine.aggregated_loop import AggregatedLoop

            w = self.workload
            self.taker = AggregatedLoop(
                self.workers, self.loop, self, self.workers[0].pass_log, self.router.arrays,
                self.router.code, self._open_ms, self._open_req,
                np.ascontiguousarray(w.dp_rank, np.int64),
                self.worker_of, self.rank_of, self.status, STATUS_FINISHED, STATUS_REJECTED)
            self.loop.seq += 1
            self.taker.take_arrivals(self.loop.seq)
            self._next_release = n
        elif concurrency is None:
            # one arrival in the heap at a time: each schedules the next (the
            # heap stays small; arrivals come in their order, `_open_arrivals`)
            if n:
                self.loop.schedule(float(self._open_ms[0]), ARRIVAL, self._on_open_arrival, 0)
            self._next_release = n
        else:
            first = min(concurrency, n)
            for i in range(first):
                self._send(i, 0.0, ARRIVAL)
            self._next_release = first

    def _never_fit(self, scheduler, extra_tokens=0):
        """Whether each request's prompt and `extra_tokens` can never fit a
        rank of `scheduler`'s kind (`can_ever_fit`, once per prompt length)."""
        lengths, which = np.unique(self.workload.input_length, return_inverse=True)
        fits = np.array([scheduler.can_ever_fit(int(p) + extra_tokens) for p in lengths.tolist()],
                        dtype=bool)
        return ~fits[which]

    def _arrivals_in_loop(self) -> bool:
        """Whether the open-loop arrivals can go to the worker's compiled loop
        (`EngineCore.take_arrivals`): one worker of one rank, where routing has
        nothing to choose, and no request pinned to a rank the router would reject."""
        cluster = self.config.cluster
        return (cluster.workers == 1 and cluster.data_parallel_size == 1
                and not (self.workload.dp_rank >= 1).any())

    def _cluster_takes_arrivals(self) -> bool:
        """Whether the open-loop arrivals can go to the workers' compiled loop,
        which routes them itself (engine/aggregated_loop.py): several workers
        or ranks whose loops take arguments of one type, no request pinned to
        a rank out of range (the router names it when it arrives), and not
        the debug mode (it checks across schedulers after every event)."""
        from servesim.engine.aggregated_loop import AggregatedLoop

        cluster = self.config.cluster
        return ((cluster.workers > 1 or cluster.data_parallel_size > 1) and not check.enabled()
                and not (self.workload.dp_rank >= cluster.data_parallel_size).any()
                and AggregatedLoop.fit(self.workers))

    def _sync_arrivals(self):
        """The one account of the open-loop arrivals a compiled loop took
        (`self.taker`: one worker's pass loop, `OneWorkerArrivals`, or a loop
        over workers, engine/aggregated_loop.py and disaggregated_loop.py),
        as `_on_arrival` and `on_done` keep it one by one: the requests that
        arrived since the last call (the taker's `arrivals`, in
        `_open_arrivals`' order), what the taker leaves to the replay for
        them (its `settle`), and the requests it finished or rejected (its
        `done`)."""
        taker = self.taker
        new = taker.arrivals
        span = self._open_req[self._arrivals:new]  # (the requests, in arrival order)
        self._arrivals = new
        self.arrived[span] = True
        taker.settle(span, self)
        done = taker.done
        self.num_done += done - self._taker_done
        self._taker_done = done

    def _on_open_arrival(self, k):
        """The k-th open-loop arrival at the engine (`_open_arrivals`): it
        schedules the next."""
        if k + 1 < len(self.workload):
            self.loop.schedule(float(self._open_ms[k + 1]), ARRIVAL, self._on_open_arrival, k + 1)
        self._on_arrival(int(self._open_req[k]))

    def _on_arrival(self, i):
        w = self.workload
        self.arrived[i] = True
        self._arrivals += 1
        prompt = int(w.input_length[i])
        session = int(w.sessions.session[i]) if w.sessions is not None else -1
        worker, rank = self.router.route(
            w.request_ids[i], i, prompt, self.idents[self.ident_offsets[i]:self.ident_offsets[i + 1]],
            int(w.dp_rank[i]), self.loop.now, session)
        self.worker_of[i] = worker
        self.rank_of[i] = rank
        if not self.workers[worker].add_request(rank, self.store.create(i), prompt):
            self.status[i] = STATUS_REJECTED
            self._left(i)

    # -- engine observer -----------------------------------------------------

    def on_done(self, i, finished):
        self.status[i] = STATUS_FINISHED if finished else STATUS_UNFINISHED
        self._left(i)

    def on_finished(self, indices):
        """Requests `indices` (an array) finished in the events just run:
        `on_done` for each, or, when no request waits for another to leave
        (an open loop: every request released, no sessions), only their
        status and the count (`_left` would release nothing)."""
        if self.sessions is None and self._next_release >= len(self.workload):
            self.status[indices] = STATUS_FINISHED
            self.num_done += len(indices)
            return
        for i in indices.tolist():
            self.on_done(i, finished=True)

    def _left(self, i):
        """Request i left the system: what waited for it (the closed loop's
        next request, a session's dependents) is released when its last
        token reached the client, `finish_ms` with `detokenize_ms` (now, if it
        never finished): a client sends its next request once it has the
        answer (README.md, "Config")."""
        now = self.loop.now
        finish = max(now, float(self.tokens.last_client[i])) if self.status[i] == STATUS_FINISHED else now
        if self.sessions is None:
            return self._release_next(finish)
        self.num_done += 1
        self.sessions.done(i, finish)

    def _release_next(self, at=None):
        """A request left the system: closed loop releases the next one at
        `at` (default now), after every decision at that instant (order
        RELEASED, engine/events.py)."""
        self.num_done += 1
        if self._next_release < len(self.workload):
            j = self._next_release
            self._next_release += 1
            self._send(j, self.loop.now if at is None else at, RELEASED)

    def on_progress(self, core=None):
        """After a compiled run of `core`'s events: the debug mode's check
        across schedulers, and the progress callback now and then."""
        if self.taker is not None:
            self._sync_arrivals()
        if self._checked_tables and core is not None:
            for table in self._checked_tables:
                check_table(table, AFTER_OUTPUT, core.num_passes - 1)
        if self.progress is not None:
            now = time.perf_counter()
            if now - self._last_progress >= _PROGRESS_EVERY_S:
                self._last_progress = now
                # (a compiled run may have gone past the event loop's clock)
                clock = self.loop.now if core is None else max(self.loop.now, core.clock_ms)
                self.progress(clock, self.num_done)

    def horizon_key(self):
        """The event-loop key `(time, order, seq)` below which nothing outside
        a worker touches it: the next arrival (closed loop: the next event of
        any kind, since a finish elsewhere releases one; sessions:
        workload/sessions.py; several workers sharing the pass log: the next
        event of any kind too), or the telemetry tick (a sample shows every
        event at or before it)."""
        if self.sessions is not None:
            key = (self.sessions.horizon(), ARRIVAL, 0)
        elif self.workload.concurrency is not None:
            key = self.loop.next_key()
        elif self._arrivals < len(self.workload) and self.taker is None:
            key = (float(self._open_ms[self._arrivals]), ARRIVAL, 0)
        else:
            key = (math.inf, 0, 0)
        if self._log_in_order:
            key = min(key, self.loop.next_key())
        if self.telemetry is not None:
            key = min(key, (self.telemetry.next_tick(), _AFTER_EVERY_ORDER, 0))
        if self._checked_tables:  # the debug mode checks across schedulers after every event
            key = (-math.inf, 0, 0)
        return key

    def _on_advance(self, t):
        self.telemetry.advance(t)

    # -- run -----------------------------------------------------------------

    def run(self) -> SimulationResult:
        self._schedule_arrivals()
        try:
            self.loop.run(self._on_advance if self.telemetry else None)
        except InvariantError as exc:  # the debug mode (SERVESIM_CHECK): name the request
            if len(exc.args) != 7:
                raise
            from servesim.scheduler.check import describe

            now = max([self.loop.now] + [core.clock_ms for core in self.workers])
            raise InvariantError(f"{describe(exc, self.workload.request_ids)} "
                                 f"(simulated time {now:.3f} ms)") from exc
        # the run ends at its last event, on the event loop or in a compiled run
        self.loop.now = max([self.loop.now] + [core.clock_ms for core in self.workers])
        result_warnings = self._close_unfinished() + self._early_events()
        launch_warning = launch_double_count_warning(self.config.engine)
        if launch_warning is not None:
            result_warnings.insert(0, launch_warning)
        if self.progress is not None:
            self.progress(self.loop.now, self.num_done)
        telemetry = None
        if self.telemetry is not None:
            self.telemetry.finish(self.loop.now)
            telemetry = self.telemetry.samples
        return SimulationResult(records=self._records(), stats=self._stats(),
                                pass_log=self.pass_log, telemetry=telemetry,
                                warnings=result_warnings)

    def _close_unfinished(self):
        """The run's warnings: requests that could never finish, or every
        request rejected, each with its cause (`diagnosis.py`)."""
        from servesim.replay import diagnosis

        c = self.config
        engine = c.cluster.prefill if c.cluster.disaggregated else c.engine
        w = self.workload
        messages = []
        left = np.flatnonzero(self.arrived & (self.status == STATUS_UNFINISHED))
        if len(left):
            messages.append(diagnosis.unfinished_message(engine, w.request_ids, left, w.input_length,
                                                         self.max_tokens))
        if diagnosis.all_rejected(self.status, STATUS_REJECTED):
            messages.append(diagnosis.all_rejected_message(engine, w.request_ids, w.input_length))
        for message in messages:
            warnings.warn(message, stacklevel=2)
        return messages

    def _early_events(self):
        """A warning when a rank's ring of KV events filled up (more events
        within the lag than it holds, kvcache/block_pool.py `event_queue`):
        its oldest then reached the router before their lag."""
        from servesim.kvcache.block_pool import EV_EARLY

        early = sum(int(rank.pool.events[0][EV_EARLY]) for core in self.workers
                    for rank in core.ranks)
        if not early:
            return []
        message = (f"cluster.router.kv_event_lag_ms: {early} KV events reached the router "
                   "before their lag (more events within the lag than a rank's queue holds)")
        warnings.warn(message, stacklevel=2)
        return [message]

    def _records(self) -> RequestRecords:
        return self._make_records(self.store.results(), self.worker_of, self.rank_of)

    def _make_records(self, results, worker, dp_rank, **extra) -> RequestRecords:
        """The records from per-request result arrays (`results`, as
        `RequestStore.results` gives them) and placements."""
        w = self.workload
        n = len(w)
        produced = results.pop("output_tokens")
        offsets, client = self.tokens.compact(produced)
        has_tokens = produced > 0
        first_token_ms = np.full(n, math.nan)
        finish_ms = np.full(n, math.nan)
        first_token_ms[has_tokens] = client[offsets[:-1][has_tokens]]
        finish_ms[has_tokens] = client[offsets[1:][has_tokens] - 1]
        if w.sessions is not None:
            extra = dict(extra, session_ids=w.sessions.session_ids, session=w.sessions.session,
                         turn=w.sessions.turn, session_truncated=w.sessions.truncated)
        return RequestRecords(
            ids=list(w.request_ids), arrival_ms=self.arrival_ms,
            first_token_ms=first_token_ms, finish_ms=finish_ms,
            input_length=w.input_length.astype(np.int64),
            output_length=w.output_length.astype(np.int64), output_tokens=produced,
            worker=worker, dp_rank=dp_rank, status=self.status,
            token_offsets=offsets, token_client_ms=client, **results, **extra)

    def _stats(self) -> RunStats:
        end = self.loop.now
        stats = RunStats()
        usage_means = []
        for core in self.workers:
            ranks = core.ranks
            means = [rank.usage_mean(end) for rank in ranks]
            usage_means.extend(means)
            stats.workers.append(WorkerStats(
                worker=core.index, requests=sum(r.num_requests for r in ranks),
                passes=core.num_passes, busy_ms=core.busy_ms,
                kv_usage_mean=sum(means) / len(means),
                kv_usage_max=max(r.usage_max for r in ranks), pool=core.pool))
            stats.passes += sum(r.num_passes for r in ranks)
            for rank in ranks:
                s = rank.scheduler
                stats.preemptions += s.num_preemptions
                pcs = s.prefix_cache_stats
                stats.prefix_cache_queries += pcs.queries
                stats.prefix_cache_hits += pcs.hits
                stats.preempted_prefix_cache_queries += pcs.preempted_queries
                stats.preempted_prefix_cache_hits += pcs.preempted_hits
                if rank.connector is not None:
                    _add_cpu_tier_stats(stats, rank.connector)
        if self.config.engine.speculative is not None:
            stats.spec_positions = sum(position_counts(rank.scheduler.spec[3])
                                       for core in self.workers for rank in core.ranks)
            spec = self.config.engine.speculative
            if spec.acceptance_profiles:
                from servesim.scheduler.acceptance_profiles import profile_summary

                R = self.store.table.R
                stats.spec_profiles = profile_summary(spec, self.workload.request_ids,
                                                      R["num_draft_tokens"], R["num_accepted_tokens"])
        stats.kv_usage_mean = sum(usage_means) / len(usage_means)
        stats.kv_usage_max = max(w.kv_usage_max for w in stats.workers)
        return stats


def _add_cpu_tier_stats(stats: RunStats, connector):
    """One rank's CPU-tier counters into the run's (docs/engine.md §9)."""
    stats.cpu_tier = True
    stats.cpu_tier_hit_tokens += connector.hit_tokens
    stats.cpu_tier_loads += connector.num_loads
    stats.cpu_tier_stores += connector.num_stores
    stats.cpu_tier_bytes_loaded += connector.bytes_loaded
    stats.cpu_tier_bytes_stored += connector.bytes_stored
    stats.cpu_tier_blocks_max = max(stats.cpu_tier_blocks_max, connector.tier.max_blocks)
