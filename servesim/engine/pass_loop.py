"""The pass lifecycle of a worker as one compiled loop (docs/engine.md §6-9,
§11, §13): the one statement of the pass timing rules.

Every worker's passes — decision, launch, GPU start and end, output
processing and release — run here, for any number of attention-DP ranks in
lockstep (every rank schedules at the worker's decision; the pass ends when
its slowest rank's does), synchronous or asynchronous (a batch queue of two),
with `launch` timing, the pass log, a CPU tier's transfers (§9) and a
disaggregated pool's handoffs (§13): the transfers' time side is
kv_transfers.py, the worker's state layout worker_state.py, its Python face
worker.py `WorkerLoop`. The engine core (engine/core.py) only
hands it the outside events — arrivals and handoffs, a transfer submitted for
it elsewhere — and what the loop returns for: finishes, requests taken out, a
decode decision's transfers, the horizon. A worker of one rank serving an
open-loop workload alone takes its arrivals here too (`take_arrivals`).

The loop is the worker's events, kept as the event loop would hold them, each
with its `(time, order, seq)` key (engine/events.py), `seq` drawn from the event
loop's counter as it goes:

- the end of each pass in flight (order PASS_END), scheduled at its launch;
- the next of the arrivals it takes (order ARRIVAL), scheduled when the one
  before it arrived (`_arrive`: queued, or rejected if it can never fit, and
  an idle engine woken, `add_request`); it returns HORIZON at the arrival
  `ws[0].arrival_limit`, so the event loop gets a turn every ARRIVALS_PER_CALL;
- under async scheduling, the decision due at `max(launch_end(k), end(k-1))`
  (order PASS_END), scheduled at pass k's launch just before its end;
- the wake of an idle engine with requests (order DECIDE: after arrivals at
  that instant);
- the transfer wakes (order DECIDE, `xw_t`/`xw_s`): an idle engine whose
  requests wait on a transfer decides again when the next one completes; a
  wake already pending no later (`ws[0].wake_ms`) stands, and a wake that
  finds the engine busy or a decision due does nothing.

It runs them in key order while their key is below the `horizon` key (the next
outside event); the first event of a call may be one the event loop just
popped (`ws[0].force`). Rules at each event:

- a pass end: every rank's `update_from_output`, tokens released at
  `max(end(k), launch_end(k+1))` (or `end(k)` with no pass k+1 decided, §8),
  a CPU tier's finished-request stores submitted (at once when sync, at the
  end of the pass in flight when async), KV usage tracked; then, after the
  finishes went out when they must (`stop_on_finish`: the FINISHED state),
  with nothing left in flight and requests left, the engine wakes;
- a decision: the transfers done by now take effect (the CPU tier's
  `get_finished`, a prefill rank's sender, a decode rank's receiver), then
  every rank's `schedule()` (a rank that looks livelocked takes all its
  requests out instead, `take_out_all`); the loads and `simple_cpu`
  preemption stores it decided go on their lanes, a decode rank's pulls and
  notices on their prefill ranks' links (the core then tells their senders);
  requests taken out return to the core; then a decision that scheduled
  nothing waits (a pass in flight wakes the engine at its end; an idle engine
  waits for an arrival, or for its next transfer), or decides again at once
  if it only preempted; otherwise the pass is launched: it starts when the
  pass in flight ends and no earlier than the stores still reading the G1
  blocks it writes, lasts as long as its slowest rank, its launch ends by its
  kind (engine/launch.py), and its `offloading` stores go out at its end.

With a pass log, every pass's line goes into a `PassLogBuffer`
(pass_log_buffer.py) as its outputs are processed (the loop returns LOG_FULL when the buffer may not hold the next
pass: the core grows it and calls again).

States handed back:
- IDLE: no event pending (nothing in flight, no decision or wake due);
- HORIZON: the next event's key is not below the horizon (`ws[0].next_ms`,
  `ws[0].next_order`, `ws[0].next_seq`): the core schedules it on the event loop;
- FINISHED: requests finished in a pass under `stop_on_finish` (closed loop,
  sessions, disaggregated pools): the core reports them, then calls again
  (ENDED phase: the wake after them);
- TAKEN_OUT: a decision took requests out (unfinishable or livelocked), or a
  decode decision submitted transfers (`pulls[:ws[0].num_pulls]`): the core
  reports them, then calls again to settle the decision (SETTLE phase);
- LOG_FULL: the pass log buffer may not hold the next pass;
- ROOM: a CPU tier's job arrays or the transfer wakes may not hold the next
  event's (`TierArrays.ensure_room`, job ids only grow): the core grows them
  and calls again.
Every state reports the requests finished so far in the call (`finished`).

NOTE(refcounts): `run_passes` is an entry point compiled without reference
counts (servesim/jit.py); its callers hold every array it gets.
"""


from servesim.engine.events import ARRIVAL, DECIDE, PASS_END
from servesim.engine.launch import host_ready_ms, launch_end_ms
from servesim.engine.pricing import price_features
# (compiled in: Numba's cache of this file does not see pricing.py's kernels
# change; edit this line with them. Table layout 4.)
from servesim.jit import njit
from servesim.kvcache.block_pool import stamp_events
from servesim.scheduler import output, scheduler
from servesim.scheduler.kv_cache_manager import can_ever_fit
from servesim.scheduler.scheduler import LIVELOCK_PREEMPTIONS
from servesim.engine import kv_handoff

from servesim.engine.kv_transfers import (_kv_room, _next_completion_ms, _next_land, _poll,
                                          _store_done_ms, _submit, _submit_decided,
                                          _submit_finished_stores, _submit_pulls, rank_kv)
from servesim.engine.pass_log_buffer import _log_pass, _log_room
from servesim.engine.worker_state import (DEC_NONE, DEC_NOW, DEC_PASS,
                                          DEC_WAKE, EV_ARRIVE, EV_DECIDE, EV_END, EV_NONE,
                                          EV_XWAKE, FINISHED, HORIZON, IDLE, LOG_FULL, PH_ENDED,
                                          PH_NORMAL, PH_SETTLE, POOL_DECODE, POOL_PREFILL, ROOM,
                                          TAKEN_OUT, track_usage)


@njit
def _before(t, order, seq, h_time, h_order, h_seq):
    """Key `(t, order, seq)` strictly before the horizon key."""
    if t != h_time:
        return t < h_time
    if order != h_order:
        return order < h_order
    return seq < h_seq


@njit
def _next_seq(ws):
    ws[0].seq += 1
    return ws[0].seq


@njit
def add_request(s, ws, i, num_prompt_tokens, now):
    """Request i, of `num_prompt_tokens`, arrives at `now` at the rank `s`
    (its `SchedulerArrays`): queued unless it can never fit (`can_ever_fit`:
    rejected, False returned); an idle engine (nothing in flight, no decision
    due) then decides at `now`, after the other arrivals at that instant (order
    DECIDE, its sequence drawn) (docs/engine.md §3, §7 "Ties";
    `EngineCore.add_request` in vllm/v1/engine/core.py queues it for the next
    `schedule()`)."""
    if not can_ever_fit(s.cfg, num_prompt_tokens):
        return False
    scheduler.add_request(s, i)
    if ws[0].num_in_flight == 0 and ws[0].decision == DEC_NONE:
        ws[0].decision = DEC_WAKE
        ws[0].decision_ms = now
        ws[0].decision_seq = _next_seq(ws)
    return True


@njit
def next_arrival(R, state, arrival_ms, arrival_req):
    """The next of the arrivals a compiled loop admits itself (the k-th,
    k = `state[0].arrival_next`; they end before `arrival_end`): request
    `arrival_req[k]` at `arrival_ms[k]` (times in arrival order, ties in
    table order), as the event loop runs an arrival
    (`Replay._on_open_arrival`): the following arrival's event is scheduled
    first (its sequence drawn from `state[0].seq` into `arrival_seq`), then
    the request arrives. `state`: a worker's (engine/worker_state.py) or a
    loop over workers' (engine/worker_loop.py) state record. Returns the
    request; its `arrival_time` is set."""
    st = state[0]
    k = st.arrival_next
    st.arrival_next = k + 1
    i = arrival_req[k]
    R[i].arrival_time = arrival_ms[k]
    if k + 1 < st.arrival_end:
        st.seq += 1
        st.arrival_seq = st.seq
    return i


@njit
def _arrive(s, ws, arrival_ms, arrival_req, status):
    """The next of the arrivals the loop admits itself (a worker of one rank
    taking an open-loop workload, `WorkerLoop.take_arrivals`): it
    arrives (`next_arrival`) and is queued (`add_request`), or, if it can
    never fit, rejected (`status[i]`, `ws[0].num_rejected`), as a loop over
    workers takes one (worker_loop `arrive`)."""
    R = s.R
    i = next_arrival(R, ws, arrival_ms, arrival_req)
    if not add_request(s, ws, i, R[i].num_prompt_tokens, R[i].arrival_time):
        status[i] = ws[0].rejected_code
        ws[0].num_rejected += 1


@njit
def _first_wake(xw_t, xw_s, n):
    """The transfer wake with the smallest key `(time, DECIDE, seq)`."""
    best = 0
    for k in range(1, n):
        if xw_t[k] < xw_t[best] or (xw_t[k] == xw_t[best] and xw_s[k] < xw_s[best]):
            best = k
    return best


@njit
def _has_requests(sched_t, ranks):
    """Anything to run or wait for on some rank (`RankScheduler.has_requests`)."""
    for r in range(ranks):
        S = sched_t[r].S
        if (S[0].num_running + S[0].num_waiting + S[0].num_waiting_for_kv
                + S[0].num_delayed_free_requests > 0):
            return True
    return False


@njit(_nrt=False)  # NOTE(refcounts): an entry point, compiled without counts (servesim/jit.py)
def run_passes(w, kv_t, tier_t, h_time, h_order, h_seq, log_on, log, checking, handoffs):
    """Run the worker's events up to the horizon (module docstring); returns
    the state handed back. `w`: the worker's arrays (a `WorkerArrays`,
    engine/worker_state.py; read as `w.name` where used, so that entering
    the loop costs one reference, not one per array), of which:
    `outs[slot, rank]`, `feats[slot, rank]`, `pidx[slot, rank]` (the pass's
    index on that rank, -1 for an empty batch), `queue[slot]`
    describe the batch queue's passes in flight (`ws[0].num_in_flight` of them from
    slot `ws[0].head`). `arrival_ms[k]`, `arrival_req[k]`: when the
    k-th of the arrivals the loop admits comes, and its request
    (`next_arrival`). `kv_t` (an argument): each rank's
    `kv` bundle (a `KVArrays`, `RankScheduler._kv`; None: no CPU tier and no
    remote KV), `tier_t`: the same tuple when the bundles are a CPU tier's,
    else None (the CPU tier's transfer kernels are then compiled away: a
    disaggregated pool's `kv` bundles are remote KV's, never a CPU tier's,
    which does not combine with it), `checking`: True in the debug mode, else None (the invariant
    check, the scheduler's `_check_after`, is then compiled away),
    `handoffs`: True for a disaggregated pool's worker (`ws[0].pool` >= 0),
    else None (the handoffs' kernels, engine/kv_handoff.py, are then
    compiled away, as Numba prunes a branch on a None argument),
    `xw_t[:ws[0].num_wakes]`, `xw_s`: the transfer wakes pending (instant,
    sequence). In disaggregated mode (`ws[0].pool`) `side_*_t` are each
    rank's sender (prefill) or receiver (decode) arrays and `XI`, `XF`,
    `link_free`, `link_of`, `xparams` the handoffs' transfers and links
    (engine/kv_handoff.py); a decode decision's transfers go into
    `pulls[:ws[0].num_pulls]` for the core to tell their senders. With `log_on`
    each rank's part of each pass ends in the pass log buffer `log` (a
    `PassLogArrays`; `PassLogBuffer.arrays`).

    Compiled without reference counts, as the scheduler's kernels it calls
    (servesim/jit.py, "Reference counts"): the caller holds every
    array `w`, `kv_t` and `log` bundle for the call."""
    ws = w.ws  # (its record read everywhere below as ws[0]: held for the call)
    ranks = w.feats.shape[1]
    width = w.outs.shape[3]
    pool = ws[0].pool
    n_fin = 0
    ws[0].num_taken_out = 0
    ws[0].num_pulls = 0
    while True:
        head = ws[0].head
        count = ws[0].num_in_flight
        tail = (head + count) % 2
        decide = ws[0].decision
        if ws[0].phase == PH_ENDED:
            # after the finishes of a pass end went out (`stop_on_finish`):
            # with nothing left in flight, an idle engine with requests wakes
            ws[0].phase = PH_NORMAL
            if count == 0 and decide == DEC_NONE and _has_requests(w.sched_t, ranks):
                ws[0].decision = DEC_WAKE
                ws[0].decision_ms = ws[0].now_ms
                ws[0].decision_seq = _next_seq(ws)
            continue
        if ws[0].phase == PH_SETTLE:
            ws[0].phase = PH_NORMAL
            t = ws[0].now_ms
        else:
            # the next of the worker's events, in key order
            kind = EV_NONE
            t, order, seq = 0.0, 0, 0
            if count == 2 or (count == 1 and decide != DEC_PASS):
                t, order, seq, kind = w.queue[head].end_ms, PASS_END, w.queue[head].seq, EV_END
            elif decide != DEC_NONE:
                order = PASS_END if decide == DEC_PASS else DECIDE
                t, seq, kind = ws[0].decision_ms, ws[0].decision_seq, EV_DECIDE
            x = -1
            if ws[0].num_wakes and decide != DEC_NOW:
                x = _first_wake(w.xw_t, w.xw_s, ws[0].num_wakes)
                if kind == EV_NONE or _before(w.xw_t[x], DECIDE, w.xw_s[x], t, order, seq):
                    t, order, seq, kind = w.xw_t[x], DECIDE, w.xw_s[x], EV_XWAKE
            a = ws[0].arrival_next
            if a < ws[0].arrival_end and decide != DEC_NOW:
                at = w.arrival_ms[a]
                if kind == EV_NONE or _before(at, ARRIVAL, ws[0].arrival_seq, t, order, seq):
                    t, order, seq, kind = at, ARRIVAL, ws[0].arrival_seq, EV_ARRIVE
            if kind == EV_NONE:
                ws[0].num_finished = n_fin
                return IDLE
            if kind == EV_END and log_on and not _log_room(log, ranks, width):
                ws[0].num_finished = n_fin
                return LOG_FULL
            if tier_t is not None:
                if (ws[0].num_wakes + 1 >= len(w.xw_t)
                        or not _kv_room(tier_t, w.sched_t, ranks, width, w.num_gpu_blocks)):
                    ws[0].num_finished = n_fin
                    return ROOM
            if (not (ws[0].force or decide == DEC_NOW
                     or _before(t, order, seq, h_time, h_order, h_seq))
                    or (kind == EV_ARRIVE and a >= ws[0].arrival_limit)):
                ws[0].next_ms = t
                ws[0].next_order = order
                ws[0].next_seq = seq
                ws[0].num_finished = n_fin
                return HORIZON
            ws[0].force = 0
            ws[0].now_ms = t
            if kind == EV_ARRIVE:
                _arrive(w.sched_t[0], ws, w.arrival_ms, w.arrival_req, w.status)
                continue
            if kind == EV_END:
                # the outputs of the pass at the head of the queue
                following = 1 - head
                release = max(t, w.queue[following].launch_end_ms) if count == 2 else t
                finished_here = 0
                for r in range(ranks):
                    index = w.pidx[head, r]
                    if index < 0:
                        continue
                    n = scheduler.update_from_output(
                        w.sched_t[r], w.outs[head, r], w.feats[head, r, output.N_SCHED], release,
                        index, w.finished[n_fin:], rank_kv(kv_t, r), checking)
                    if tier_t is not None:
                        _submit_finished_stores(tier_t[r], w.queue[following].end_ms
                                                if count == 2 else t)
                    if log_on:
                        _log_pass(log, ws, w.queue, head, r, index, w.outs[head, r],
                                  w.feats[head, r], w.finished[n_fin:], n)
                    n_fin += n
                    finished_here += n
                    track_usage(w.stats[r], w.sched_t[r].pscal, w.num_gpu_blocks, t)
                    stamp_events(w.sched_t[r].events, t)
                ws[0].head = following
                ws[0].num_in_flight = count - 1
                ws[0].ended_pass = w.pidx[head, 0]
                if finished_here and ws[0].stop_on_finish:
                    # the finishes go out first (a handoff wakes a decode
                    # worker, a closed loop releases an arrival), then the wake
                    ws[0].phase = PH_ENDED
                    ws[0].num_finished = n_fin
                    return FINISHED
                if count == 1 and _has_requests(w.sched_t, ranks):
                    # an idle engine wakes (after arrivals at t)
                    ws[0].decision = DEC_WAKE
                    ws[0].decision_ms = t
                    ws[0].decision_seq = _next_seq(ws)
                continue
            if kind == EV_XWAKE:
                # a transfer's end wakes an idle engine (`_wake_at_next_transfer`)
                last = ws[0].num_wakes - 1
                w.xw_t[x] = w.xw_t[last]
                w.xw_s[x] = w.xw_s[last]
                ws[0].num_wakes = last
                if ws[0].wake_ms == t:
                    ws[0].wake_ms = -1.0
                if count or decide != DEC_NONE:
                    continue
            # a decision at t: every rank's schedule() (transfers finished by
            # now take effect first; the loads and preemption stores decided
            # go out at once)
            ws[0].decision = DEC_NONE
            if tier_t is not None:
                for r in range(ranks):
                    _poll(tier_t[r], w.R, t)
            if handoffs is not None:
                if pool == POOL_PREFILL:
                    for r in range(ranks):
                        if w.side_state_t[r][0].num_pending:
                            kv_handoff.poll_sender(w.sched_t[r], w.side_pending_t[r],
                                                    w.side_state_t[r], w.side_log_t[r], w.XF, t)
                elif pool == POOL_DECODE:
                    for r in range(ranks):
                        if w.side_state_t[r][0].num_pending:
                            kv_handoff.poll_receiver(w.R, w.side_pending_t[r], w.side_state_t[r],
                                                      w.XI, w.XF, t)
            n_taken = 0
            for r in range(ranks):
                S = w.sched_t[r].S
                w.feats[tail, r, :] = 0
                if S[0].preemptions_since_token > LIVELOCK_PREEMPTIONS:
                    if kv_t is not None:
                        KC = kv_t[r].KC
                        for row in range(output.NUM_KO_ROWS):
                            if row != output.KO_FSTORES:
                                KC[row] = 0
                    n_taken += scheduler.take_out_all(w.sched_t[r], rank_kv(kv_t, r),
                                                      w.outs[tail, r], w.feats[tail, r],
                                                      w.taken[n_taken:], checking)
                    continue
                scheduler.schedule(w.sched_t[r], w.outs[tail, r], w.feats[tail, r], rank_kv(kv_t, r),
                                   checking)
                for e in range(w.feats[tail, r, output.N_UNFIN]):
                    w.taken[n_taken] = w.outs[tail, r, output.O_UNFIN, e]
                    n_taken += 1
            n_pulls = 0
            if tier_t is not None:
                for r in range(ranks):
                    _submit_decided(tier_t[r], t)
            elif handoffs is not None:
                if kv_t is not None:  # (a pool's ranks always have `kv` bundles)
                    if pool == POOL_DECODE:
                        for r in range(ranks):
                            if kv_t[r].KC[output.KO_LOADS] == 0:
                                continue  # no pull decided
                            n_pulls = _submit_pulls(w.R, kv_t[r], w.side_pending_t[r],
                                                    w.side_state_t[r], w.XI, w.XF, w.link_free,
                                                    w.link_of, w.xparams, t, w.pulls, n_pulls)
            for r in range(ranks):
                track_usage(w.stats[r], w.sched_t[r].pscal, w.num_gpu_blocks, t)
                stamp_events(w.sched_t[r].events, t)
            if n_taken or n_pulls:
                ws[0].phase = PH_SETTLE
                ws[0].num_taken_out = n_taken
                ws[0].num_pulls = n_pulls
                ws[0].num_finished = n_fin
                return TAKEN_OUT
        # settle the decision in slot `tail`, made at t
        scheduled = preempted = False
        for r in range(ranks):
            if w.feats[tail, r, output.N_SCHED]:
                scheduled = True
            if w.feats[tail, r, output.N_PRE]:
                preempted = True
        if not scheduled:
            if count == 0:
                if preempted:  # only preempted, idle: decide again at once
                    ws[0].decision = DEC_NOW
                    ws[0].decision_ms = t
                elif handoffs is not None:  # (then `pool` >= 0)
                    _wake_at(_next_land(w.side_pending_t, w.side_state_t, w.XF, ranks), w.sched_t,
                             ranks, ws, w.xw_t, w.xw_s)
                elif tier_t is not None:
                    _wake_at(_next_completion_ms(tier_t, ranks), w.sched_t, ranks, ws, w.xw_t,
                             w.xw_s)
            continue  # else wait: for the pass in flight's end, or an arrival
        # launch it: it starts when the host is done with it and the pass in
        # flight ends, and no earlier than the stores still reading the G1
        # blocks it writes
        ready = host_ready_ms(w.launch, t)
        start = max(ready, w.queue[head].end_ms) if count == 1 else ready
        if tier_t is not None:
            for r in range(ranks):
                start = max(start, _store_done_ms(tier_t[r]))
        duration = 0.0
        prefill_tokens = total_tokens = 0
        for r in range(ranks):
            f = w.feats[tail, r]
            n_sched = f[output.N_SCHED]
            if n_sched == 0:
                w.pidx[tail, r] = -1
                continue
            stats = w.stats[r]
            w.pidx[tail, r] = stats.num_passes
            stats.num_passes += 1
            stats.tokens_scheduled += f[output.TOTAL_TOKENS]
            prefill_tokens += f[output.PREFILL_TOKENS]
            total_tokens += f[output.TOTAL_TOKENS]
            duration = max(duration, price_features(w.model, w.params, f, w.kv_capacity,
                                                      w.table))
            scheduler.mark_started(w.R, w.outs[tail, r], n_sched, start)
        end = start + duration
        launch_end = launch_end_ms(w.launch, total_tokens, prefill_tokens, t, start, end)
        w.queue[tail].decided_ms = t
        w.queue[tail].start_ms = start
        w.queue[tail].end_ms = end
        w.queue[tail].launch_end_ms = launch_end
        ws[0].busy_ms += duration
        ws[0].num_passes += 1
        if tier_t is not None:
            for r in range(ranks):  # `offloading`: the pass's stores go out at its end
                kv = tier_t[r]
                for k in range(kv.KC[output.KO_STORES]):
                    _submit(kv, kv.KO[output.KO_STORES, k], end)
        if ws[0].async_scheduling:
            ws[0].decision = DEC_PASS
            ws[0].decision_ms = max(launch_end, w.queue[head].end_ms) if count == 1 else launch_end
            ws[0].decision_seq = _next_seq(ws)
        w.queue[tail].seq = _next_seq(ws)
        ws[0].num_in_flight = count + 1


@njit
def _wake_at(t, sched_t, ranks, ws, xw_t, xw_s):
    """An idle engine whose requests wait on a transfer (a load, a store a
    lookup waits for, a handoff's transfer) decides again when the next one
    completes, at `t` (-1: none): a wake (order DECIDE) at that instant,
    unless one is pending no later (`EngineCore._wake_at_next_transfer`).
    Returns whether it added one."""
    if not _has_requests(sched_t, ranks):
        return False
    if t < 0 or (ws[0].wake_ms >= 0 and ws[0].wake_ms <= t):
        return False
    ws[0].wake_ms = t
    n = ws[0].num_wakes
    xw_t[n] = t
    xw_s[n] = _next_seq(ws)
    ws[0].num_wakes = n + 1
    return True
