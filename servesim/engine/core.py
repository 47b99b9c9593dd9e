"""The simulated engine core of one worker: its attention-DP ranks, and the
handler of the events from outside its compiled pass loop (vllm/v1/engine/core.py:
`EngineCore.step` and `step_with_batch_queue`).

Every pass of the worker — decision, launch, GPU start and end, output
processing and release, for any number of ranks in lockstep, sync or async,
with `launch` timing, the pass log, the CPU tier's transfers and a
disaggregated pool's handoffs — runs inside one compiled loop,
servesim/engine/pass_loop.py `run_passes`, which states the pass timing rules
(docs/engine.md §6-9, §11, §13) once and holds the worker's pending events
with the keys the event loop would give them. The core only hands it the
outside events and what it returns for:

- an arrival (or a handoff, on a decode worker) wakes an idle engine: a
  decision at that instant, after the arrivals at it (`add_request`; a
  worker of one rank taking an open-loop workload lets its loop admit the
  arrivals itself, `take_arrivals`);
- the loop's next event past the horizon (the next outside event that may
  touch the worker) goes on the event loop, and `_resume` carries on from it
  (a disaggregated deployment's workers run as one loop over all of them,
  engine/disaggregated_loop.py, which hands each core what its loop returns for:
  `report`);
- the finishes and take-outs it returns are reported to the observer (a
  closed loop's release, a prefill worker's handoff);
- a disaggregated decode decision's transfers are told to their prefill
  ranks' senders, and a transfer submitted for an idle prefill worker wakes it
  when it lands (`transfer_pending`).
"""


from servesim.engine.config import EngineConfig
from servesim.engine import worker_state
from servesim.engine.worker_state import LoopState
from servesim.engine.pass_loop import add_request
from servesim.engine.worker import WorkerLoop
from servesim.engine.events import ARRIVAL, DECIDE, EventLoop, wake_order
from servesim.engine.launch import launch_params
from servesim.engine.pricing import PassPricer
from servesim.jit import records
from servesim.kvcache.block_pool import BlockPool


class Rank:
    """One attention-DP rank: its scheduler, G1 pool, CPU tier (`connector`,
    None without `kv_offloading`) and pricing, plus the counters reported per
    rank. `transfers` is the rank's side of its KV transfers, whose arrays
    the compiled pass loop polls and feeds: the CPU tier's connector, or in
    disaggregated mode the rank's side of the KV handoffs."""

    def __init__(self, worker: int, index: int, config: EngineConfig, num_identities: int,
                 make_scheduler, data_parallel_size: int = 1, stats=None,
                 kv_event_lag_ms: float = 0.0):
        self.worker = worker
        self.index = index
        self.pool = BlockPool(config.kv_cache, num_identities, kv_event_lag_ms)
        self.scheduler = make_scheduler(config.scheduler, self.pool)
        self.connector = None
        if config.kv_offloading is not None:
            self.connector = self.scheduler.new_connector(config.kv_offloading)
        self.transfers = self.connector
        # the deployment's attention-DP width prices aic passes (expert parallelism)
        self.pricer = PassPricer.of_engine(config, data_parallel_size)
        self.num_requests = 0
        # arrays (rows of the worker's), so that the compiled pass loop
        # (engine/pass_loop.py) keeps them too
        # (a `RANK_STATS_DTYPE` record: passes, tokens scheduled, KV usage)
        self.stats = (records(1, worker_state.RANK_STATS_DTYPE)[0] if stats is None
                      else stats)

    num_passes = property(lambda self: int(self.stats["num_passes"]))
    tokens_scheduled = property(lambda self: int(self.stats["tokens_scheduled"]))
    usage_max = property(lambda self: float(self.stats["usage_max"]))

    def cpu_tier_blocks(self) -> int:
        return self.connector.num_blocks if self.connector is not None else 0

    def usage_mean(self, end: float) -> float:
        u = self.stats
        area = u["usage_area"] + u["usage_value"] * (end - u["usage_since"])
        return float(area / end) if end > 0 else 0.0


class EngineCore:
    """One worker. `observer` receives `on_finished(request_indices)` (an
    array) for the requests a compiled run finished and `on_done(request_index,
    False)` for one taken out as unfinishable, is asked for
    `horizon_key()`, the event-loop key `(time, order, seq)` of the
    next outside event that may touch the worker, and is told
    `on_progress(core)` after each compiled run. `make_scheduler(config,
    pool)` builds each rank's compiled scheduler. `pass_log` is the
    `PassLogBuffer` compiled runs write their passes into (None: no pass log).
    `pool` names the worker's pool in disaggregated mode ("prefill" or
    "decode"; None for an aggregated worker). `kv_event_lag_ms` > 0: its
    ranks queue their KV events for a router that sees them that late."""

    def __init__(self, index: int, config: EngineConfig, data_parallel_size: int,
                 loop: EventLoop, num_identities: int, observer, make_scheduler,
                 pool: str | None = None, pass_log=None, kv_event_lag_ms: float = 0.0):
        self.index = index
        self.pool = pool
        self.config = config
        self.loop = loop
        self.observer = observer
        self.async_scheduling = config.scheduler.async_scheduling
        self.launch = config.launch
        stats = records(data_parallel_size, worker_state.RANK_STATS_DTYPE)
        self.ranks = [Rank(index, r, config, num_identities, make_scheduler, data_parallel_size,
                           stats[r], kv_event_lag_ms)
                      for r in range(data_parallel_size)]
        self.pass_log = pass_log
        # the compiled pass loop (engine/pass_loop.py); a disaggregated pool's
        # handoffs are attached to it after this (`attach_transfers`)
        self.compiled = WorkerLoop(
            self.ranks, index, {None: -1, "prefill": 0, "decode": 1}[pool],
            self.async_scheduling, launch_params(self.launch, config.host_ms_per_pass), stats)
        # the compiled loop's one live event on the event loop: its key and
        # token (an earlier wake replaces it; the one it replaced is ignored)
        self._resume_key = None
        self._resume_token = 0
        # a disaggregated deployment's workers run as one (engine/disaggregated_loop.py):
        # the runner of their loop, and this worker's place in it
        self.runner = None
        self.slot = -1

    busy_ms = property(lambda self: float(self.compiled.state["busy_ms"]))
    num_passes = property(lambda self: int(self.compiled.state["num_passes"]))

    @property
    def clock_ms(self) -> float:
        """The instant of the compiled loop's last event (0 before any): the
        event loop's clock follows only the events put on it."""
        return float(self.compiled.state["now_ms"])

    def attach_transfers(self, rank, transfers):
        """Disaggregated mode: `transfers` (engine/kv_handoff.py) is `rank`'s side
        of the KV handoffs, polled at each decision inside the compiled pass
        loop (it must come before the run starts)."""
        rank.transfers = transfers
        self.compiled.attach_side(rank.index, transfers._pending, transfers._state,
                                  getattr(transfers, "_log", None), transfers.transfers)

    def transfer_pending(self):
        """A transfer this worker waits for was submitted elsewhere (a decode
        worker pulling this prefill worker's blocks): an idle engine decides
        again when it completes."""
        c = self.compiled
        if c.idle:
            loop = self.loop
            if c.transfer_pending(loop.seq):
                loop.seq = int(c.state["seq"])
                self._push_resume(float(c.state["wake_ms"]), DECIDE, loop.seq)

    # -- arrivals ------------------------------------------------------------

    def add_request(self, rank: int, request, num_prompt_tokens: int) -> bool:
        """A request (its row in the scheduler's table) arrives at `rank` now
        (pass_loop `add_request`); False if it can never fit (rejected)."""
        self.ranks[rank].num_requests += 1  # routed here, rejected or not
        scheduler = self.ranks[rank].scheduler
        c = self.compiled
        loop = self.loop
        c.state["seq"] = loop.seq
        if not add_request(scheduler.arrays, c.ws, request, num_prompt_tokens, loop.now):
            return False
        if c.state["seq"] != loop.seq:  # it woke the engine: a decision at this instant
            loop.seq = int(c.state["seq"])
            self._push_resume(loop.now, wake_order(loop.order), loop.seq)
        return True

    def take_arrivals(self, arrival_ms, arrival_req, status, rejected_code, seq) -> None:
        """Every request arrives here, the k-th request `arrival_req[k]` at
        `arrival_ms[k]` (in time order), admitted by the compiled loop itself
        (pass_loop `_arrive`: what `add_request` does, without a return to the
        event loop at each arrival); the first arrival's event has sequence `seq`.
        For a worker of one rank that takes the whole open-loop workload."""
        self.compiled.take_arrivals(arrival_ms, arrival_req, status, rejected_code, seq)
        if len(arrival_ms):
            self._push_resume(float(arrival_ms[0]), ARRIVAL, seq)

    # -- the compiled pass loop ---------------------------------------------

    def _push_resume(self, t, order, seq):
        """Put the compiled loop's next event on the event loop, unless the
        one already there comes first (an idle engine's transfer wake, then
        an arrival at the same instant: the wake runs first and finds the
        arrival's decision pending)."""
        if self.runner is not None:  # one loop over the deployment's workers
            return self.runner.push(self.slot, t, order, seq)
        key = (t, order, seq)
        if self._resume_key is not None and self._resume_key < key:
            return
        self._resume_key = key
        self._resume_token += 1
        self.loop.push(t, order, seq, self._resume, self._resume_token)

    def _resume(self, token):
        """The compiled loop's next event, popped off the event loop: run the
        worker's events from it up to the observer's horizon
        (engine/pass_loop.py), reporting what it returns for."""
        if token != self._resume_token:
            return  # replaced by an earlier event
        self._resume_key = None
        c = self.compiled
        c.state["force"] = 1
        while self.report(c.run(self.observer.horizon_key(), self.loop.seq, self.pass_log)):
            pass
        self.observer.on_progress(self)

    def report(self, state) -> bool:
        """What the compiled loop returned for (`state`, engine/pass_loop.py):
        the finishes and take-outs go to the observer, a decode decision's
        pulls to their senders, the next event past the horizon on the event
        loop; True if the loop must be called again (to settle a decision, or
        after the finishes of a pass end, a grown pass log or room)."""
        state = LoopState(state)
        c = self.compiled
        loop = self.loop
        observer = self.observer
        loop.seq = int(c.state["seq"])
        if state == LoopState.FINISHED or state == LoopState.TAKEN_OUT:
            # what the requests leaving release starts at the event run last
            loop.now = float(c.state["now_ms"])
        n = c.state["num_finished"]
        if n:
            observer.on_finished(c.finished[:n])
        if state == LoopState.HORIZON:
            self._push_resume(float(c.state["next_ms"]), int(c.state["next_order"]),
                              int(c.state["next_seq"]))
            return False
        if state == LoopState.IDLE:
            return False
        if state == LoopState.TAKEN_OUT:
            n = c.state["num_pulls"]
            if n:  # a decode decision's transfers: their prefill ranks wait for them
                transfers = self.ranks[0].transfers.transfers
                for i in c.pulls[:n].tolist():
                    transfers.senders[transfers.link_of[i]].scheduled(i)
            for i in c.taken[:c.state["num_taken_out"]].tolist():
                observer.on_done(i, finished=False)
        elif state == LoopState.LOG_FULL:
            self.pass_log.grow(len(self.ranks), c.width)
        elif state == LoopState.ROOM:
            c.regrow()
        return True
