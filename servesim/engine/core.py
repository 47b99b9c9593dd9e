"""The simulated engine core of one worker: its attention-DP ranks and the
life of each pass — decision, GPU start and end, output processing — on the
shared event loop (vllm/v1/engine/core.py: `EngineCore.step` and
`step_with_batch_queue`).

Synchronous (`async_scheduling: false`, docs/engine.md §6): pass k+1 is decided
at `end(k)`, after pass k's outputs are processed (and after arrivals at that
instant), so a finished request's blocks serve the next pass.

Asynchronous (§7), a batch queue of two: when pass k starts on the GPU, pass k+1
is decided at once, before pass k's outputs are known (placeholders stand in
for them). Pass k's outputs are processed at `end(k)`, then the queued pass k+1
starts and pass k+2 is decided — so a request finishing in pass k frees its
blocks for pass k+2, and an arrival during pass k first joins pass k+2. A
decision that finds nothing to run while a pass is in flight waits for that
pass's outputs and decides again at its end, seeing arrivals up to then, as an
idle engine would (the empty-pass rule).

Ranks (§11) run in lockstep: every rank schedules its own batch at the
worker's decision and the worker's pass ends when its slowest rank's does.

The CPU tier's time side (§9; vLLM's connector worker reports finished
transfers with a pass's outputs): transfers done by a decision take effect at
that decision; loads and `simple_cpu` preemption stores go out at the decision
that queues them, `offloading` stores at the end of their pass, and a
finished request's store with its free (under async scheduling at the end of
the pass in flight when it is freed; for `offloading` that is the block its
last pass filled with a then in-flight token). A pass that writes a G1
block still read by a store in flight starts no earlier than that store's end.
An idle engine whose requests wait on a transfer decides again when the next
transfer completes.

In disaggregated mode (servesim/engine/disagg.py) a rank's `transfers` are its
side of the KV handoffs instead — a prefill rank's sender, a decode rank's
receiver — polled at each decision like the CPU tier, the decode worker's
pulls submitted at the decision that queues them.

With the compiled scheduler and one rank, the stretches between outside events
(arrivals, telemetry ticks, closed-loop releases) run inside one compiled loop
(`servesim.engine.fast_run`) that follows exactly these rules; the pass-by-pass
path below stays the statement of them.
"""

from collections import deque

import numpy as np

from servesim.engine.config import EngineConfig
from servesim.engine import fast_run
from servesim.engine.events import DECIDE, PASS_END, EventLoop
from servesim.engine.launch import launch_end
from servesim.engine.pricing import PassPricer
from servesim.kvcache.block_pool import BlockPool
from servesim.kvcache.cpu_tier import CPUOffloadConnector
from servesim.scheduler import check
from servesim.scheduler.fast import FastScheduler


class Rank:
    """One attention-DP rank: its scheduler, G1 pool, CPU tier (`connector`,
    None without `kv_offloading`) and pricing, plus the counters reported per
    rank. `transfers` is what the engine polls for finished transfers and
    submits the decided loads to: the CPU tier's connector, or in
    disaggregated mode the rank's side of the KV handoffs."""

    def __init__(self, worker: int, index: int, config: EngineConfig, num_identities: int,
                 make_scheduler, data_parallel_size: int = 1):
        self.worker = worker
        self.index = index
        self.pool = BlockPool(config.kv_cache, num_identities)
        self.scheduler = make_scheduler(config.scheduler, self.pool)
        self.connector = None
        if config.kv_offloading is not None:
            self.connector = CPUOffloadConnector(config.kv_offloading,
                                                 config.kv_cache.block_size)
            self.scheduler.attach_connector(self.connector)
        self.transfers = self.connector
        # the deployment's attention-DP width prices aic passes (expert parallelism)
        self.pricer = PassPricer(config.timing, config.kv_cache.num_gpu_blocks,
                                 config.kv_cache.block_size, config, data_parallel_size)
        self.num_requests = 0
        # arrays, so that compiled runs of passes (engine/fast_run.py) keep them too
        self.counters = np.zeros(2, dtype=np.int64)  # passes, tokens scheduled
        self.usage = np.zeros(4, dtype=np.float64)  # KV usage: area, max, value, since

    num_passes = property(lambda self: int(self.counters[fast_run.C_PASSES]))
    tokens_scheduled = property(lambda self: int(self.counters[fast_run.C_TOKENS]))
    usage_max = property(lambda self: float(self.usage[fast_run.U_MAX]))

    def track_usage(self, now: float):
        """Integrate KV usage up to `now` and take its new value."""
        fast_run.track_usage(self.usage, self.pool.scalars, self.pool.num_gpu_blocks, now)

    def cpu_tier_blocks(self) -> int:
        return self.connector.num_blocks if self.connector is not None else 0

    def usage_mean(self, end: float) -> float:
        u = self.usage
        area = u[fast_run.U_AREA] + u[fast_run.U_VALUE] * (end - u[fast_run.U_SINCE])
        return float(area / end) if end > 0 else 0.0


class Pass:
    """One lockstep pass of a worker: each rank's `SchedulerOutput` and its
    index on that rank (-1 for a rank with an empty batch), and its instants:
    decided, launch end (§8), GPU start and end."""

    __slots__ = ("outputs", "indices", "finished", "decided_ms", "launch_end_ms",
                 "start_ms", "end_ms", "stale")

    def __init__(self, outputs, decided_ms):
        self.outputs = outputs
        self.indices = [-1] * len(outputs)
        self.finished = [()] * len(outputs)  # per rank, once outputs are processed
        self.decided_ms = self.launch_end_ms = decided_ms
        self.start_ms = self.end_ms = decided_ms
        self.stale = False  # taken over by a compiled run: its end event is void


class EngineCore:
    """One worker. `observer` receives `on_pass(core, p)` when a pass's outputs
    are processed, `on_done(request_index, finished)` when a request finishes
    or is taken out as unfinishable, and — with `fast_runs` — is asked for
    `horizon()`, the next instant at which something outside may touch the
    worker. `make_scheduler(config, pool)` builds each rank's scheduler (the
    reference or the compiled implementation).
    `pool` names the worker's pool in disaggregated mode ("prefill" or
    "decode"; None for an aggregated worker)."""

    def __init__(self, index: int, config: EngineConfig, data_parallel_size: int,
                 loop: EventLoop, num_identities: int, observer, make_scheduler,
                 fast_runs: bool = False, pool: str | None = None):
        self.index = index
        self.pool = pool
        self.config = config
        self.loop = loop
        self.observer = observer
        self.async_scheduling = config.scheduler.async_scheduling
        self.launch = config.launch
        self.ranks = [Rank(index, r, config, num_identities, make_scheduler, data_parallel_size)
                      for r in range(data_parallel_size)]
        self.in_flight = deque()  # decided passes whose outputs are not processed
        # compiled runs of passes between outside events (engine/fast_run.py):
        # one rank on the compiled scheduler; async ones without launch timing
        compiled = (fast_runs and data_parallel_size == 1
                    and isinstance(self.ranks[0].scheduler, FastScheduler))
        self.fast_runs = compiled and not self.async_scheduling
        self.async_fast_runs = compiled and self.async_scheduling and self.launch is None
        self._decision_token = 0  # a busy async decision event runs only if still current
        self._decide_scheduled = False
        self.connectors = [rank.transfers for rank in self.ranks if rank.transfers is not None]
        self._transfer_wake_ms = None  # an idle engine's wake at a transfer's end
        self._busy = np.zeros(1)  # GPU time, an array for compiled runs
        self.num_passes = 0
        # the debug mode on the reference scheduler (the compiled one checks
        # itself inside its kernels, servesim/scheduler/fast.py `check_pass`)
        self.check_reference = check.enabled() and not isinstance(
            self.ranks[0].scheduler, FastScheduler)

    busy_ms = property(lambda self: float(self._busy[0]))

    def attach_transfers(self, rank, transfers):
        """Disaggregated mode: `transfers` (engine/disagg.py) is `rank`'s side
        of the KV handoffs, polled and fed like a CPU tier's connector."""
        rank.transfers = transfers
        self.connectors.append(transfers)

    def transfer_pending(self):
        """A transfer this worker waits for was submitted elsewhere (a decode
        worker pulling this prefill worker's blocks): an idle engine decides
        again when it completes."""
        if not self.in_flight and not self._decide_scheduled:
            self._wake_at_next_transfer()

    # -- arrivals ------------------------------------------------------------

    def add_request(self, rank: int, request, num_prompt_tokens: int) -> bool:
        """A request (the scheduler's handle for it) arrives at `rank`; False if
        it can never fit (rejected)."""
        scheduler = self.ranks[rank].scheduler
        self.ranks[rank].num_requests += 1  # routed here, rejected or not
        if not scheduler.can_ever_fit(num_prompt_tokens):
            return False
        scheduler.add_request(request)
        self._wake()
        return True

    def _wake(self):
        """An idle engine decides at this instant, after every arrival at it."""
        if not self.in_flight and not self._decide_scheduled:
            self._decide_scheduled = True
            self.loop.schedule(self.loop.now, DECIDE, self._on_decide)

    def _decide_if_current(self, token):
        if token == self._decision_token:
            self._decide()

    def _on_decide(self, _):
        self._decide_scheduled = False
        self._decide()

    # -- decisions -----------------------------------------------------------

    def _decide(self, _=None):
        now = self.loop.now
        outputs = self._schedule_ranks(now)
        for rank in self.ranks:
            rank.track_usage(now)
        self._settle(outputs, now)

    def _schedule_ranks(self, now):
        """Every rank's `schedule()`. With a CPU tier, transfers finished by
        now take effect first, and the loads and preemption stores decided go
        out at once."""
        if not self.connectors:
            outputs = [rank.scheduler.schedule() for rank in self.ranks]
            if self.check_reference:
                self._check(outputs, check.AFTER_SCHEDULE)
            return outputs
        for connector in self.connectors:
            connector.poll(now)
        outputs = [rank.scheduler.schedule() for rank in self.ranks]
        if self.check_reference:
            self._check(outputs, check.AFTER_SCHEDULE)
        for rank, out in zip(self.ranks, outputs):
            if rank.transfers is not None:
                for job in out.preemption_stores:
                    rank.transfers.submit(job, now)
                for job in out.loads:
                    rank.transfers.submit(job, now)
        return outputs

    def _check(self, outputs, where):
        """The debug mode: check each reference rank after its decision (its
        pass index: the one it gets if launched)."""
        for rank, out in zip(self.ranks, outputs):
            check.check_reference(rank.scheduler, out, where, rank.num_passes)

    def _settle(self, outputs, now):
        """Launch a decision's pass, or deal with a decision that scheduled
        nothing: one that only preempted decides again at once when idle;
        with a pass in flight the empty-pass rule waits for its end
        (`_on_pass_end` wakes the engine)."""
        self._take_out_unfinishable()
        while not any(out.num_scheduled for out in outputs):
            if self.in_flight or not any(out.num_preempted for out in outputs):
                if self.connectors and not self.in_flight:
                    self._wake_at_next_transfer()
                return
            outputs = self._schedule_ranks(now)
            self._take_out_unfinishable()
            for rank in self.ranks:
                rank.track_usage(now)
        self._launch(Pass(outputs, now))

    def _wake_at_next_transfer(self):
        """An idle engine whose requests wait on a transfer (a load, or a store
        a lookup waits for) decides again when the next transfer completes."""
        if not any(rank.scheduler.has_requests() for rank in self.ranks):
            return
        times = [t for t in (c.next_completion_ms() for c in self.connectors) if t is not None]
        if not times or (self._transfer_wake_ms is not None
                         and self._transfer_wake_ms <= min(times)):
            return
        self._transfer_wake_ms = min(times)
        self.loop.schedule(self._transfer_wake_ms, DECIDE, self._on_transfer_done,
                           self._transfer_wake_ms)

    def _on_transfer_done(self, t):
        if self._transfer_wake_ms == t:
            self._transfer_wake_ms = None
        if not self.in_flight and not self._decide_scheduled:
            self._decide()

    def _take_out_unfinishable(self):
        for rank in self.ranks:
            if rank.scheduler.unfinishable:
                for index in rank.scheduler.unfinishable:
                    self.observer.on_done(index, finished=False)
                rank.scheduler.unfinishable.clear()

    def _launch(self, p: Pass):
        """Price a decided pass and fix its instants: it starts on the GPU when
        the pass before it ends, lasts as long as its slowest rank, and its
        launch ends by its kind (§8). Under async scheduling the next decision
        is due at `max(launch_end(k), end(k-1))`; it is scheduled before this
        pass's end so that, at one instant, it runs after pass k-1's outputs
        and before pass k's, and before arrivals at that instant (§7, Ties)."""
        duration = 0.0
        prefill_tokens = total_tokens = 0
        previous = self.in_flight[-1] if self.in_flight else None
        start = max(p.decided_ms, previous.end_ms) if previous else p.decided_ms
        if self.connectors:
            start = max(start, self._store_done_ms(p))
        for i, (rank, out) in enumerate(zip(self.ranks, p.outputs)):
            if out.num_scheduled:
                p.indices[i] = rank.num_passes
                rank.counters[fast_run.C_PASSES] += 1
                rank.counters[fast_run.C_TOKENS] += out.total_tokens
                prefill_tokens += out.prefill_tokens
                total_tokens += out.total_tokens
                duration = max(duration, rank.pricer.price(out))
                rank.scheduler.mark_started(out, start)
        p.start_ms = start
        p.end_ms = start + duration
        p.launch_end_ms = launch_end(self.launch, total_tokens, prefill_tokens,
                                     p.decided_ms, start, p.end_ms)
        self._busy[0] += duration
        self.num_passes += 1
        if self.connectors:
            self._submit_pass_stores(p)
        self.in_flight.append(p)
        if self.async_scheduling:
            next_decision = max(p.launch_end_ms, previous.end_ms) if previous else p.launch_end_ms
            self.loop.schedule(next_decision, PASS_END, self._decide_if_current,
                               self._decision_token)
        self.loop.schedule(p.end_ms, PASS_END, self._on_pass_end, p)

    # -- outputs -------------------------------------------------------------

    def _on_pass_end(self, p: Pass):
        """Process a pass's outputs at its end. They leave the engine once the
        next pass is launched (§8): at `max(end(k), launch_end(k+1))`, or at
        `end(k)` when no pass k+1 was decided."""
        now = self.loop.now
        if p.stale:
            return
        if self.fast_runs:
            return self._run_fast(p, now)
        if self.async_fast_runs and len(self.in_flight) == 2:
            return self._run_async_fast(p)
        self.in_flight.popleft()
        release = max(now, self.in_flight[0].launch_end_ms) if self.in_flight else now
        observer = self.observer
        for i, (rank, out, index) in enumerate(zip(self.ranks, p.outputs, p.indices)):
            if not out.num_scheduled:
                continue
            finished = rank.scheduler.update_from_output(out, release, index)
            if self.check_reference:
                check.check_reference(rank.scheduler, None, check.AFTER_OUTPUT, index)
            p.finished[i] = finished
            if rank.connector is not None and rank.scheduler.finished_stores:
                self._submit_finished_stores(rank, now)
            for request_index in finished:
                observer.on_done(request_index, finished=True)
            rank.track_usage(now)
        observer.on_pass(self, p)
        if not self.in_flight and any(rank.scheduler.has_requests() for rank in self.ranks):
            self._wake()

    # -- CPU tier ------------------------------------------------------------

    def _store_done_ms(self, p: Pass) -> float:
        """A pass writing G1 blocks that a store in flight still reads starts
        no earlier than that store's end (§9)."""
        t = 0.0
        for rank, out in zip(self.ranks, p.outputs):
            if rank.connector is not None and out.new_blocks:
                t = max(t, rank.connector.store_done_ms(out.new_blocks))
        return t

    def _submit_pass_stores(self, p: Pass):
        """`offloading`: the store jobs of a pass go out at its end."""
        for rank, out in zip(self.ranks, p.outputs):
            if rank.connector is not None:
                for job in out.stores:
                    rank.connector.submit(job, p.end_ms)

    def _submit_finished_stores(self, rank, now):
        """A finished request's store goes out with its free — at
        once when synchronous; under async scheduling the pass in flight was
        decided while the request still held its blocks, so at that pass's
        end."""
        at = self.in_flight[0].end_ms if self.in_flight else now
        for job in rank.scheduler.finished_stores:
            rank.connector.submit(job, at)
        rank.scheduler.finished_stores.clear()

    # -- compiled runs of passes ---------------------------------------------

    def _run_fast(self, p: Pass, now: float):
        """Process pass p's outputs and run the passes after it in one compiled
        loop (engine/fast_run.py) up to the observer's horizon; then carry on
        at the instant it reached, as the pass-by-pass path would."""
        self.in_flight.popleft()
        rank = self.ranks[0]
        before = rank.num_passes
        state, finished, times, out = fast_run.run_from(
            rank.scheduler, p.outputs[0], p.end_ms, p.indices[0], self.observer.horizon(),
            rank.usage, rank.counters, self._busy, rank.pricer)
        self.num_passes += rank.num_passes - before
        self.loop.schedule(times[0], PASS_END, self._after_fast_run,
                           (p, state, finished, times, out))

    def _after_fast_run(self, arg):
        p, state, finished, times, out = arg
        for request_index in finished:
            self.observer.on_done(request_index, finished=True)
        self.observer.on_pass(self, p)
        if state == fast_run.IN_FLIGHT:
            q = Pass([out], times[2])
            q.indices[0] = self.ranks[0].num_passes - 1
            q.start_ms = q.launch_end_ms = times[2]
            q.end_ms = times[3]
            self.in_flight.append(q)
            self.loop.schedule(q.end_ms, PASS_END, self._on_pass_end, q)
        elif state == fast_run.NEEDS_CORE:
            self.ranks[0].scheduler.note_unfinishable(out)
            self._settle([out], self.loop.now)
        elif state == fast_run.STALLED:
            self._decide()
        elif self.ranks[0].scheduler.has_requests():
            self._wake()

    def _run_async_fast(self, p: Pass):
        """Under async scheduling (no launch), with pass p ending now and the
        next one in flight: run the alternation "outputs of pass k, decision of
        pass k+2" in one compiled loop up to the horizon. The pending events it
        takes over (the next pass's end, the decision due now) are voided."""
        q = self.in_flight[1]
        q.stale = True
        self._decision_token += 1
        self.in_flight.clear()
        rank = self.ranks[0]
        before = rank.num_passes
        state, finished, cur, other = fast_run.run_async_from(
            rank.scheduler, _pass_info(p), _pass_info(q), self.observer.horizon(),
            rank.usage, rank.counters, self._busy, rank.pricer)
        self.num_passes += rank.num_passes - before
        at = other[2] if state == fast_run.A_IN_FLIGHT else cur[4]
        self.loop.schedule(at, PASS_END, self._after_async_fast_run,
                           (p, state, finished, cur, other))

    def _after_async_fast_run(self, arg):
        p, state, finished, cur, other = arg
        for request_index in finished:
            self.observer.on_done(request_index, finished=True)
        self.observer.on_pass(self, p)
        if state == fast_run.A_IN_FLIGHT:
            first, second = _pass_from(cur), _pass_from(other)
            self.in_flight.extend((first, second))
            self.loop.schedule(first.end_ms, PASS_END, self._on_pass_end, first)
            self.loop.schedule(max(second.decided_ms, first.end_ms), PASS_END,
                               self._decide_if_current, self._decision_token)
            self.loop.schedule(second.end_ms, PASS_END, self._on_pass_end, second)
            return
        running = _pass_from(other)
        self.in_flight.append(running)
        self.loop.schedule(running.end_ms, PASS_END, self._on_pass_end, running)
        if state == fast_run.A_DECIDE_NEXT:
            self._decide()
        else:
            out = cur[0]
            self.ranks[0].scheduler.note_unfinishable(out)
            self._settle([out], self.loop.now)


def _pass_info(p: Pass):
    return (p.outputs[0], p.indices[0], p.decided_ms, p.start_ms, p.end_ms)


def _pass_from(info) -> Pass:
    out, index, decided, start, end = info
    p = Pass([out], decided)
    p.indices[0] = index
    p.start_ms = start
    p.end_ms = end
    return p
