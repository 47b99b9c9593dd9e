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

In disaggregated mode (servesim/engine/fast_disagg.py) a rank's `transfers` are its
side of the KV handoffs instead — a prefill rank's sender, a decode rank's
receiver — polled at each decision like the CPU tier, the decode worker's
pulls submitted at the decision that queues them.

With the compiled scheduler and no KV transfers (a rank with a CPU tier or a
disaggregated pool's handoffs goes pass by pass here), every pass of the
worker — any number of ranks, sync or async, with `launch` timing and the pass
log — runs inside one compiled loop (`servesim.engine.fast_run`), which holds
the worker's pending events with the keys the event loop would give them. The
core is then only the handler of outside events: an arrival wakes an idle
engine, the loop's next event past the horizon goes on the event loop
(`_resume` carries on from it), and the finishes and take-outs it returns are
reported to the observer. The pass-by-pass path below serves the ranks with
transfers.
"""

from collections import deque

import numpy as np

from servesim.engine.config import EngineConfig
from servesim.engine import fast_run
from servesim.engine.events import DECIDE, PASS_END, EventLoop
from servesim.engine.launch import launch_end, launch_params
from servesim.engine.pricing import PassPricer
from servesim.kvcache.block_pool import BlockPool


class Rank:
    """One attention-DP rank: its scheduler, G1 pool, CPU tier (`connector`,
    None without `kv_offloading`) and pricing, plus the counters reported per
    rank. `transfers` is what the engine polls for finished transfers and
    submits the decided loads to: the CPU tier's connector, or in
    disaggregated mode the rank's side of the KV handoffs."""

    def __init__(self, worker: int, index: int, config: EngineConfig, num_identities: int,
                 make_scheduler, data_parallel_size: int = 1, usage=None, counters=None):
        self.worker = worker
        self.index = index
        self.pool = BlockPool(config.kv_cache, num_identities)
        self.scheduler = make_scheduler(config.scheduler, self.pool)
        self.connector = None
        if config.kv_offloading is not None:
            self.connector = self.scheduler.new_connector(config.kv_offloading)
        self.transfers = self.connector
        # the deployment's attention-DP width prices aic passes (expert parallelism)
        self.pricer = PassPricer(config.timing, config.kv_cache.num_gpu_blocks,
                                 config.kv_cache.block_size, config, data_parallel_size)
        self.num_requests = 0
        # arrays (rows of the worker's), so that the compiled pass loop
        # (engine/fast_run.py) keeps them too
        self.counters = np.zeros(2, dtype=np.int64) if counters is None else counters
        self.usage = np.zeros(4, dtype=np.float64) if usage is None else usage
        # passes, tokens scheduled; KV usage: area, max, value, since

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
                 "start_ms", "end_ms")

    def __init__(self, outputs, decided_ms):
        self.outputs = outputs
        self.indices = [-1] * len(outputs)
        self.finished = [()] * len(outputs)  # per rank, once outputs are processed
        self.decided_ms = self.launch_end_ms = decided_ms
        self.start_ms = self.end_ms = decided_ms


class EngineCore:
    """One worker. `observer` receives `on_pass(core, p)` when a pass's outputs
    are processed pass by pass, `on_done(request_index, finished)` when a
    request finishes or is taken out as unfinishable, and is asked for
    `horizon_key()`, the event-loop key `(time, order, seq)` of the
    next outside event that may touch the worker, and told `on_progress()`
    after each compiled run. `make_scheduler(config, pool)` builds each rank's
    compiled scheduler. `pass_log` is the
    `PassLogBuffer` compiled runs write their passes into (None: no pass log).
    `pool` names the worker's pool in disaggregated mode ("prefill" or
    "decode"; None for an aggregated worker)."""

    def __init__(self, index: int, config: EngineConfig, data_parallel_size: int,
                 loop: EventLoop, num_identities: int, observer, make_scheduler,
                 pool: str | None = None, pass_log=None):
        self.index = index
        self.pool = pool
        self.config = config
        self.loop = loop
        self.observer = observer
        self.async_scheduling = config.scheduler.async_scheduling
        self.launch = config.launch
        usage = np.zeros((data_parallel_size, 4), dtype=np.float64)
        counters = np.zeros((data_parallel_size, 2), dtype=np.int64)
        self.ranks = [Rank(index, r, config, num_identities, make_scheduler, data_parallel_size,
                           usage[r], counters[r])
                      for r in range(data_parallel_size)]
        self.in_flight = deque()  # decided passes whose outputs are not processed
        self.connectors = [rank.transfers for rank in self.ranks if rank.transfers is not None]
        # the compiled pass loop (engine/fast_run.py): no KV transfers on any
        # rank (a disaggregated pool's handoffs are attached after this)
        self.compiled = None
        self.pass_log = pass_log
        if True:
            self.compiled = fast_run.CompiledWorker(
                self.ranks, index, {None: -1, "prefill": 0, "decode": 1}[pool],
                self.async_scheduling, launch_params(self.launch), usage, counters)
        self._decide_scheduled = False
        # the compiled loop's one live event on the event loop: its key and
        # token (an earlier wake replaces it; the one it replaced is ignored)
        self._resume_key = None
        self._resume_token = 0
        self._transfer_wake_ms = None  # an idle engine's wake at a transfer's end
        self._busy_ms = 0.0  # GPU time of the passes decided pass by pass
        self._num_passes = 0

    @property
    def busy_ms(self) -> float:
        c = self.compiled
        return self._busy_ms + (float(c.wt[fast_run.T_BUSY]) if c is not None else 0.0)

    @property
    def num_passes(self) -> int:
        c = self.compiled
        return self._num_passes + (int(c.ws[fast_run.W_PASSES]) if c is not None else 0)

    @property
    def clock_ms(self) -> float:
        """The instant of the compiled loop's last event (-inf: none, or pass
        by pass): the event loop's clock follows only the events put on it."""
        c = self.compiled
        return float(c.wt[fast_run.T_NOW]) if c is not None else -float("inf")

    def attach_transfers(self, rank, transfers):
        """Disaggregated mode: `transfers` (engine/fast_disagg.py) is `rank`'s side
        of the KV handoffs, polled at each decision inside the compiled pass
        loop (it must come before the run starts)."""
        rank.transfers = transfers
        self.connectors.append(transfers)
        self.compiled.attach_side(rank.index, transfers._pending, transfers._state,
                                  getattr(transfers, "_log", None), transfers.transfers)

    def transfer_pending(self):
        """A transfer this worker waits for was submitted elsewhere (a decode
        worker pulling this prefill worker's blocks): an idle engine decides
        again when it completes."""
        c = self.compiled
        if c is not None:
            if c.idle:
                times = [t for t in (x.next_completion_ms() for x in self.connectors)
                         if t is not None]
                loop = self.loop
                if c.transfer_pending(min(times) if times else -1.0, loop.seq):
                    loop.seq = int(c.ws[fast_run.W_SEQ])
                    self._push_resume(float(c.wt[fast_run.T_XWAKE]), DECIDE, loop.seq)
            return
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
        c = self.compiled
        if c is not None:
            if c.idle:
                loop = self.loop
                loop.seq += 1
                c.wake(loop.now, loop.seq)
                self._push_resume(loop.now, DECIDE, loop.seq)
            return
        if not self.in_flight and not self._decide_scheduled:
            self._decide_scheduled = True
            self.loop.schedule(self.loop.now, DECIDE, self._on_decide)

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
            return [rank.scheduler.schedule() for rank in self.ranks]
        for connector in self.connectors:
            connector.poll(now)
        outputs = [rank.scheduler.schedule() for rank in self.ranks]
        for rank, out in zip(self.ranks, outputs):
            if rank.transfers is not None:
                for job in out.preemption_stores:
                    rank.transfers.submit(job, now)
                for job in out.loads:
                    rank.transfers.submit(job, now)
        return outputs

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
        self._busy_ms += duration
        self._num_passes += 1
        if self.connectors:
            self._submit_pass_stores(p)
        self.in_flight.append(p)
        if self.async_scheduling:
            next_decision = max(p.launch_end_ms, previous.end_ms) if previous else p.launch_end_ms
            self.loop.schedule(next_decision, PASS_END, self._decide)
        self.loop.schedule(p.end_ms, PASS_END, self._on_pass_end, p)

    # -- outputs -------------------------------------------------------------

    def _on_pass_end(self, p: Pass):
        """Process a pass's outputs at its end. They leave the engine once the
        next pass is launched (§8): at `max(end(k), launch_end(k+1))`, or at
        `end(k)` when no pass k+1 was decided."""
        now = self.loop.now
        self.in_flight.popleft()
        release = max(now, self.in_flight[0].launch_end_ms) if self.in_flight else now
        observer = self.observer
        for i, (rank, out, index) in enumerate(zip(self.ranks, p.outputs, p.indices)):
            if not out.num_scheduled:
                continue
            finished = rank.scheduler.update_from_output(out, release, index)
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

    # -- the compiled pass loop ---------------------------------------------

    def _push_resume(self, t, order, seq):
        """Put the compiled loop's next event on the event loop, unless the
        one already there comes first (an idle engine's transfer wake, then
        an arrival at the same instant: the wake runs first and finds the
        arrival's decision pending)."""
        key = (t, order, seq)
        if self._resume_key is not None and self._resume_key < key:
            return
        self._resume_key = key
        self._resume_token += 1
        self.loop.push(t, order, seq, self._resume, self._resume_token)

    def _resume(self, token):
        """The compiled loop's next event, popped off the event loop: run the
        worker's events from it up to the observer's horizon
        (engine/fast_run.py), reporting what it returns for."""
        if token != self._resume_token:
            return  # replaced by an earlier event
        self._resume_key = None
        c = self.compiled
        loop = self.loop
        observer = self.observer
        c.ws[fast_run.W_FORCE] = 1
        while True:
            state = c.run(observer.horizon_key(), loop.seq, self.pass_log)
            loop.seq = int(c.ws[fast_run.W_SEQ])
            if state == fast_run.FINISHED or state == fast_run.TAKEN_OUT:
                # what the requests leaving release starts at the event run last
                loop.now = float(c.wt[fast_run.T_NOW])
            n = c.ws[fast_run.W_NFIN]
            if n:
                for i in c.finished[:n].tolist():
                    observer.on_done(i, finished=True)
            if state == fast_run.HORIZON:
                self._push_resume(float(c.wt[fast_run.T_NEXT]), int(c.ws[fast_run.W_NEXT_ORDER]),
                                  int(c.ws[fast_run.W_NEXT_SEQ]))
                break
            if state == fast_run.IDLE:
                break
            if state == fast_run.TAKEN_OUT:
                n = c.ws[fast_run.W_NPULL]
                if n:  # a decode decision's transfers: their prefill ranks wait for them
                    transfers = self.ranks[0].transfers.transfers
                    for i in c.pulls[:n].tolist():
                        transfers.senders[transfers.link_of[i]].scheduled(i)
                for i in c.taken[:c.ws[fast_run.W_NOUT]].tolist():
                    observer.on_done(i, finished=False)
            elif state == fast_run.LOG_FULL:
                self.pass_log.grow(len(self.ranks), c.width)
        observer.on_progress()
