"""The simulated engine core of one worker: its attention-DP ranks and the
life of each pass — decision, GPU start and end, output processing — on the
shared event loop (vllm/v1/engine/core.py: `EngineCore.step` and
`step_with_batch_queue`).

Synchronous (`async_scheduling: false`, vllm-engine.md §6): pass k+1 is decided
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
"""

from collections import deque

from servesim.engine.config import EngineConfig
from servesim.engine.events import DECIDE, PASS_END, EventLoop
from servesim.engine.launch import launch_end
from servesim.engine.pricing import PassPricer
from servesim.kvcache.block_pool import BlockPool


class Rank:
    """One attention-DP rank: its scheduler, G1 pool and pricing, plus the
    counters reported per rank."""

    def __init__(self, worker: int, index: int, config: EngineConfig, num_identities: int,
                 make_scheduler):
        self.worker = worker
        self.index = index
        self.pool = BlockPool(config.kv_cache, num_identities)
        self.scheduler = make_scheduler(config.scheduler, self.pool)
        self.pricer = PassPricer(config.timing, config.kv_cache.num_gpu_blocks,
                                 config.kv_cache.block_size)
        self.num_passes = 0
        self.num_requests = 0
        self.tokens_scheduled = 0
        self.usage_area = 0.0  # integral of KV usage over time
        self.usage_max = 0.0
        self._usage = 0.0
        self._usage_since = 0.0

    def track_usage(self, now: float):
        """Integrate KV usage up to `now` and take its new value."""
        self.usage_area += self._usage * (now - self._usage_since)
        self._usage_since = now
        self._usage = self.pool.usage
        if self._usage > self.usage_max:
            self.usage_max = self._usage

    def cpu_tier_blocks(self) -> int:
        return 0

    def usage_mean(self, end: float) -> float:
        area = self.usage_area + self._usage * (end - self._usage_since)
        return area / end if end > 0 else 0.0


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
    are processed and `on_done(request_index, finished)` when a request
    finishes or is taken out as unfinishable. `make_scheduler(config, pool)`
    builds each rank's scheduler (the reference or the fast implementation)."""

    def __init__(self, index: int, config: EngineConfig, data_parallel_size: int,
                 loop: EventLoop, num_identities: int, observer, make_scheduler):
        self.index = index
        self.config = config
        self.loop = loop
        self.observer = observer
        self.async_scheduling = config.scheduler.async_scheduling
        self.launch = config.launch
        self.ranks = [Rank(index, r, config, num_identities, make_scheduler)
                      for r in range(data_parallel_size)]
        self.in_flight = deque()  # decided passes whose outputs are not processed
        self._decide_scheduled = False
        self.busy_ms = 0.0
        self.num_passes = 0

    # -- arrivals ------------------------------------------------------------

    def add_request(self, rank: int, request, num_prompt_tokens: int) -> bool:
        """A request (the scheduler's handle for it) arrives at `rank`; False if
        it can never fit (rejected)."""
        scheduler = self.ranks[rank].scheduler
        if not scheduler.can_ever_fit(num_prompt_tokens):
            return False
        self.ranks[rank].num_requests += 1
        scheduler.add_request(request)
        self._wake()
        return True

    def _wake(self):
        """An idle engine decides at this instant, after every arrival at it."""
        if not self.in_flight and not self._decide_scheduled:
            self._decide_scheduled = True
            self.loop.schedule(self.loop.now, DECIDE, self._on_decide)

    def _on_decide(self, _):
        self._decide_scheduled = False
        self._decide()

    # -- decisions -----------------------------------------------------------

    def _decide(self, _=None):
        now = self.loop.now
        while True:
            outputs = [rank.scheduler.schedule() for rank in self.ranks]
            self._take_out_unfinishable()
            for rank in self.ranks:
                rank.track_usage(now)
            if any(out.num_scheduled for out in outputs):
                break
            # Nothing to run. A decision that only preempted decides again at
            # once when idle; with a pass in flight the empty-pass rule waits
            # for its end (`_on_pass_end` wakes the engine).
            if self.in_flight or not any(out.num_preempted for out in outputs):
                return
        self._launch(Pass(outputs, now))

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
        for i, (rank, out) in enumerate(zip(self.ranks, p.outputs)):
            if out.num_scheduled:
                p.indices[i] = rank.num_passes
                rank.num_passes += 1
                rank.tokens_scheduled += out.total_tokens
                prefill_tokens += out.prefill_tokens
                total_tokens += out.total_tokens
                duration = max(duration, rank.pricer.price(out))
                rank.scheduler.mark_started(out, start)
        p.start_ms = start
        p.end_ms = start + duration
        p.launch_end_ms = launch_end(self.launch, total_tokens, prefill_tokens,
                                     p.decided_ms, start, p.end_ms)
        self.busy_ms += duration
        self.num_passes += 1
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
            for request_index in finished:
                observer.on_done(request_index, finished=True)
            rank.track_usage(now)
        observer.on_pass(self, p)
        if not self.in_flight and any(rank.scheduler.has_requests() for rank in self.ranks):
            self._wake()
