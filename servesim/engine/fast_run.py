"""The pass lifecycle of a worker as one compiled loop (docs/engine.md §6-9,
§11, §13): the one statement of the pass timing rules.

Every worker's passes — decision, launch, GPU start and end, output
processing and release — run here, for any number of attention-DP ranks in
lockstep (every rank schedules at the worker's decision; the pass ends when
its slowest rank's does), synchronous or asynchronous (a batch queue of two),
with `launch` timing, the pass log, a CPU tier's transfers (§9) and a
disaggregated pool's handoffs (§13). The engine core (engine/core.py) only
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
  `ws[W_ALIMIT]`, so the event loop gets a turn every ARRIVALS_PER_CALL;
- under async scheduling, the decision due at `max(launch_end(k), end(k-1))`
  (order PASS_END), scheduled at pass k's launch just before its end;
- the wake of an idle engine with requests (order DECIDE: after arrivals at
  that instant);
- the transfer wakes (order DECIDE, `xw_t`/`xw_s`): an idle engine whose
  requests wait on a transfer decides again when the next one completes; a
  wake already pending no later (`wt[T_XWAKE]`) stands, and a wake that
  finds the engine busy or a decision due does nothing.

It runs them in key order while their key is below the `horizon` key (the next
outside event); the first event of a call may be one the event loop just
popped (`ws[W_FORCE]`). Rules at each event:

- a pass end: every rank's `update_from_output`, tokens released at
  `max(end(k), launch_end(k+1))` (or `end(k)` with no pass k+1 decided, §8),
  a CPU tier's finished-request stores submitted (at once when sync, at the
  end of the pass in flight when async), KV usage tracked; then, after the
  finishes went out when they must (`stop_on_finish`: the FINISHED state),
  with nothing left in flight and requests left, the engine wakes;
- a decision: the transfers done by now take effect (the CPU tier's
  `get_finished`, a prefill rank's sender, a decode rank's receiver), then
  every rank's `schedule()` (a rank that looks livelocked takes all its
  requests out instead, `fast.take_out_all`); the loads and `simple_cpu`
  preemption stores it decided go on their lanes, a decode rank's pulls and
  notices on their prefill ranks' links (the core then tells their senders);
  requests taken out return to the core; then a decision that scheduled
  nothing waits (a pass in flight wakes the engine at its end; an idle engine
  waits for an arrival, or for its next transfer), or decides again at once
  if it only preempted; otherwise the pass is launched: it starts when the
  pass in flight ends and no earlier than the stores still reading the G1
  blocks it writes, lasts as long as its slowest rank, its launch ends by its
  kind (engine/launch.py), and its `offloading` stores go out at its end.

With a pass log, every pass's line goes into a `PassLogBuffer` as its outputs
are processed (the loop returns LOG_FULL when the buffer may not hold the next
pass: the core grows it and calls again).

States handed back:
- IDLE: no event pending (nothing in flight, no decision or wake due);
- HORIZON: the next event's key is not below the horizon (`wt[T_NEXT]`,
  `ws[W_NEXT_ORDER]`, `ws[W_NEXT_SEQ]`): the core schedules it on the event loop;
- FINISHED: requests finished in a pass under `stop_on_finish` (closed loop,
  sessions, disaggregated pools): the core reports them, then calls again
  (ENDED phase: the wake after them);
- TAKEN_OUT: a decision took requests out (unfinishable or livelocked), or a
  decode decision submitted transfers (`pulls[:ws[W_NPULL]]`): the core
  reports them, then calls again to settle the decision (SETTLE phase);
- LOG_FULL: the pass log buffer may not hold the next pass;
- ROOM: a CPU tier's job arrays or the transfer wakes may not hold the next
  event's (`TierArrays.ensure_room`, job ids only grow): the core grows them
  and calls again.
Every state reports the requests finished so far in the call (`finished`).
"""

import numpy as np
from numba.core import types
from numba.extending import overload

from servesim.engine.events import ARRIVAL, DECIDE, PASS_END
from servesim.engine.launch import launch_end_ms
from servesim.engine.pricing import price_features
# (compiled in: Numba's cache of this file does not see pricing.py's kernels
# change; edit this line with them. Table layout 3.)
from servesim.jit import Entry, njit
from servesim.kvcache import cpu_tier_kernels as ct
from servesim.kvcache.block_pool import kv_usage
from servesim.scheduler import fast
from servesim.scheduler.fast import LIVELOCK_PREEMPTIONS
from servesim.scheduler.fast_table import KVHandoff, KVLoad
from servesim.engine import fast_disagg
from servesim.engine.worker_arrays import new_pass_log_arrays, new_worker_arrays

# usage: [area, max, value, since]; counters: [passes, tokens_scheduled]
U_AREA, U_MAX, U_VALUE, U_SINCE = range(4)
C_PASSES, C_TOKENS = range(2)

IDLE, HORIZON, FINISHED, TAKEN_OUT, LOG_FULL, ROOM = range(6)
# ws (int64 worker state)
(W_HEAD, W_COUNT, W_DECIDE, W_DSEQ, W_SEQ, W_PHASE, W_PASSES, W_ASYNC, W_STOP,
 W_NFIN, W_NOUT, W_NEXT_ORDER, W_NEXT_SEQ, W_WORKER, W_POOL, W_FORCE, W_NXW,
 W_NPULL, W_ENDED, W_ANEXT, W_AEND, W_ALIMIT, W_ASEQ) = range(23)
NUM_WS = 23  # W_ENDED: rank 0's index of the last pass whose outputs were processed
# W_ANEXT..W_ASEQ: the arrivals the loop admits itself (`CompiledWorker.take_arrivals`):
# requests W_ANEXT up to W_AEND, in table order at `arrival_ms[i]`, the next
# one's event sequence W_ASEQ; the loop stops before request W_ALIMIT
POOL_PREFILL, POOL_DECODE = 0, 1  # ws[W_POOL] (-1: aggregated)
# wt (float64 worker times); T_XWAKE: the pending transfer wake's instant (-1: none)
T_DECIDE, T_BUSY, T_NOW, T_NEXT, T_XWAKE = range(5)
NUM_WT = 5
# the kinds of the worker's events
EV_NONE, EV_END, EV_DECIDE, EV_XWAKE, EV_ARRIVE = range(5)
# ws[W_DECIDE]: the decision pending
DEC_NONE, DEC_PASS, DEC_WAKE, DEC_NOW = 0, 1, 2, 3
PH_NORMAL, PH_SETTLE, PH_ENDED = 0, 1, 2
# ptime (per slot of the batch queue)
P_DECIDED, P_LAUNCH_END, P_START, P_END = range(4)
# pass log buffer: head columns, time columns, scheduled-entry columns
(L_PASS, L_POOL, L_WORKER, L_RANK, L_FREE, L_SCHED_END, L_PRE_END, L_FIN_END) = range(8)
NUM_LHEAD = 8
E_REQ, E_TOK, E_CACHED, E_KIND, E_SPEC = range(5)
NUM_LENTRY = 5
N_ROWS, N_SCHED_E, N_PRE_E, N_FIN_E = range(4)


@njit
def track_usage(usage, pscal, num_gpu_blocks, now):
    """Integrate vLLM's KV usage (1 - free / usable) up to `now`, then take its
    new value."""
    usage[U_AREA] += usage[U_VALUE] * (now - usage[U_SINCE])
    usage[U_SINCE] = now
    value = kv_usage(pscal, num_gpu_blocks)
    usage[U_VALUE] = value
    if value > usage[U_MAX]:
        usage[U_MAX] = value


@njit
def _before(t, order, seq, h_time, h_order, h_seq):
    """Key `(t, order, seq)` strictly before the horizon key."""
    if t != h_time:
        return t < h_time
    if order != h_order:
        return order < h_order
    return seq < h_seq


@njit
def _log_room(log, ranks, width):
    """Whether the pass log buffer (`log`, a `PassLogArrays`) holds one more
    pass of `ranks` ranks of up to `width` entries each."""
    count = log.count
    return (count[N_ROWS] + ranks <= log.head.shape[0]
            and count[N_SCHED_E] + ranks * width <= log.sched.shape[0]
            and count[N_PRE_E] + ranks * width <= log.pre.shape[0]
            and count[N_FIN_E] + ranks * width <= log.fin.shape[0])


@njit
def _log_pass(log, ws, ptime, slot, r, index, out, feats, finished, n_fin):
    """One line of `passes.jsonl`: rank r's part of the pass in `slot`,
    into the pass log buffer `log` (a `PassLogArrays`)."""
    lhead, ltime, lsched = log.head, log.time, log.sched
    lpre, lfin, lcount = log.pre, log.fin, log.count
    row = lcount[N_ROWS]
    lhead[row, L_PASS] = index
    lhead[row, L_POOL] = ws[W_POOL]
    lhead[row, L_WORKER] = ws[W_WORKER]
    lhead[row, L_RANK] = r
    lhead[row, L_FREE] = feats[fast.FREE_BLOCKS]
    ltime[row, 0] = ptime[slot, P_START]
    ltime[row, 1] = ptime[slot, P_END]
    ltime[row, 2] = ptime[slot, P_DECIDED]
    ltime[row, 3] = ptime[slot, P_LAUNCH_END]
    k = lcount[N_SCHED_E]
    for e in range(feats[fast.N_SCHED]):
        lsched[k, E_REQ] = out[fast.O_REQ, e]
        lsched[k, E_TOK] = out[fast.O_TOK, e]
        lsched[k, E_CACHED] = out[fast.O_CACHED, e]
        lsched[k, E_KIND] = out[fast.O_KIND, e]
        lsched[k, E_SPEC] = out[fast.O_SPEC, e]
        k += 1
    lcount[N_SCHED_E] = k
    k = lcount[N_PRE_E]
    for e in range(feats[fast.N_PRE]):
        lpre[k] = out[fast.O_PRE, e]
        k += 1
    lcount[N_PRE_E] = k
    k = lcount[N_FIN_E]
    for e in range(n_fin):
        lfin[k] = finished[e]
        k += 1
    lcount[N_FIN_E] = k
    lhead[row, L_SCHED_END] = lcount[N_SCHED_E]
    lhead[row, L_PRE_END] = lcount[N_PRE_E]
    lhead[row, L_FIN_END] = lcount[N_FIN_E]
    lcount[N_ROWS] = row + 1


@njit
def _next_seq(ws):
    ws[W_SEQ] += 1
    return ws[W_SEQ]


@njit
def add_request(s, ws, wt, i, num_prompt_tokens, now):
    """Request i, of `num_prompt_tokens`, arrives at `now` at the rank `s`
    (its `SchedulerArrays`): queued unless it can never fit (`fast.can_ever_fit`:
    rejected, False returned); an idle engine (nothing in flight, no decision
    due) then decides at `now`, after the other arrivals at that instant (order
    DECIDE, its sequence drawn) (docs/engine.md §3, §7 "Ties";
    `EngineCore.add_request` in vllm/v1/engine/core.py queues it for the next
    `schedule()`)."""
    if not fast.can_ever_fit(s.cfg, num_prompt_tokens):
        return False
    fast.add_request(s, i)
    if ws[W_COUNT] == 0 and ws[W_DECIDE] == DEC_NONE:
        ws[W_DECIDE] = DEC_WAKE
        wt[T_DECIDE] = now
        ws[W_DSEQ] = _next_seq(ws)
    return True


@njit
def next_arrival(R, state, arrival_ms, NEXT, END, ASEQ, SEQ):
    """The next of the arrivals a compiled loop admits itself (request
    `state[NEXT]`; they end before `state[END]`), as the event loop runs an
    arrival (`Replay._on_open_arrival`): the following arrival's event is
    scheduled first (its sequence drawn from `state[SEQ]` into
    `state[ASEQ]`), then the request arrives at `arrival_ms[i]`. Returns i."""
    i = state[NEXT]
    state[NEXT] = i + 1
    R[i].arrival_time = arrival_ms[i]
    if i + 1 < state[END]:
        state[SEQ] += 1
        state[ASEQ] = state[SEQ]
    return i


@njit
def _arrive(s, ws, wt, arrival_ms):
    """The next of the arrivals the loop admits itself (a worker of one rank
    taking an open-loop workload, `CompiledWorker.take_arrivals`): it
    arrives (`next_arrival`) and is queued (`add_request`)."""
    R = s.R
    i = next_arrival(R, ws, arrival_ms, W_ANEXT, W_AEND, W_ASEQ, W_SEQ)
    add_request(s, ws, wt, i, R[i].num_prompt_tokens, arrival_ms[i])


@njit
def _first_wake(xw_t, xw_s, n):
    """The transfer wake with the smallest key `(time, DECIDE, seq)`."""
    best = 0
    for k in range(1, n):
        if xw_t[k] < xw_t[best] or (xw_t[k] == xw_t[best] and xw_s[k] < xw_s[best]):
            best = k
    return best


def rank_kv(kv_t, r):
    """Rank r's `kv` bundle, or None for a worker without KV transfers
    (`kv_t` None): one call site per kernel for both specialisations of the
    loop (Numba picks the body by `kv_t`'s type when it compiles)."""
    return None if kv_t is None else kv_t[r]


@overload(rank_kv)
def _rank_kv(kv_t, r):
    if isinstance(kv_t, types.NoneType):
        return lambda kv_t, r: None
    return lambda kv_t, r: kv_t[r]


@njit
def _kv_room(kv_t, sched_t, ranks, width, num_gpu_blocks):
    """Whether every rank's CPU-tier job arrays hold the jobs of one call
    (`FastScheduler._kv`'s bound, which `TierArrays.ensure_room` grows to)."""
    for r in range(ranks):
        kv = kv_t[r]
        KS = kv.KS
        jobs = 2 * width + min(sched_t[r].S[0].num_waiting, num_gpu_blocks)
        if (KS[ct.K_JOBS] + jobs > kv.jobs.shape[0]
                or KS[ct.K_JB] + 3 * num_gpu_blocks > kv.job_blocks.shape[1]):
            return False
    return True


@njit
def _submit(kv, j, at_ms):
    """A decided CPU-tier job onto its lane at `at_ms` (cpu_tier_kernels.submit)."""
    ct.submit(kv.lanes, kv.storing, kv.jobs, kv.job_times, kv.job_blocks, kv.KS, kv.KF, j, at_ms)


@njit
def _next_completion_ms(kv_t, ranks):
    """The earliest finish of a CPU-tier transfer not yet retired on any
    rank (-1.0: none)."""
    t = -1.0
    for r in range(ranks):
        kv = kv_t[r]
        f = ct.next_completion_ms(kv.lanes, kv.job_times, kv.KS)
        if f >= 0 and (t < 0 or f < t):
            t = f
    return t


@njit
def _has_requests(sched_t, ranks):
    """Anything to run or wait for on some rank (`FastScheduler.has_requests`)."""
    for r in range(ranks):
        S = sched_t[r].S
        if (S[0].num_running + S[0].num_waiting + S[0].num_waiting_for_kv
                + S[0].num_delayed_free_requests > 0):
            return True
    return False


@njit(_nrt=False)
def run_passes(w, kv_t, h_time, h_order, h_seq, log_on, log):
    """Run the worker's events up to the horizon (module docstring); returns
    the state handed back. `w`: the worker's arrays (a `WorkerArrays`,
    engine/worker_arrays.py; read as `w.name` where used, so that entering
    the loop costs one reference, not one per array), of which:
    `outs[slot, rank]`, `feats[slot, rank]`, `pidx[slot, rank]` (the pass's
    index on that rank, -1 for an empty batch), `ptime[slot]`, `pseq[slot]`
    describe the batch queue's passes in flight (`ws[W_COUNT]` of them from
    slot `ws[W_HEAD]`). `arrival_ms[i]`: when request i arrives, for the
    arrivals the loop admits (`W_ANEXT`). `kv_t` (an argument): each rank's
    `kv` bundle (a `KVArrays`, `FastScheduler._kv`; None: no CPU tier and no
    remote KV),
    `xw_t[:ws[W_NXW]]`, `xw_s`: the transfer wakes pending (instant,
    sequence). In disaggregated mode (`ws[W_POOL]`) `side_*_t` are each
    rank's sender (prefill) or receiver (decode) arrays and `XI`, `XF`,
    `link_free`, `link_of`, `xparams` the handoffs' transfers and links
    (engine/fast_disagg.py); a decode decision's transfers go into
    `pulls[:ws[W_NPULL]]` for the core to tell their senders. With `log_on`
    each rank's part of each pass ends in the pass log buffer `log` (a
    `PassLogArrays`; `PassLogBuffer.arrays`).

    Compiled without reference counts, as the scheduler's kernels it calls
    (servesim/scheduler/fast.py, "Reference counts"): the caller holds every
    array `w`, `kv_t` and `log` bundle for the call."""
    ws = w.ws  # (read everywhere below: held for the call)
    wt = w.wt
    ranks = w.feats.shape[1]
    width = w.outs.shape[3]
    cpu = w.sched_t[0].cfg[0].kv_source == fast.KV_SOURCE_CPU  # (read under `kv_t is not None`)
    pool = ws[W_POOL]
    n_fin = 0
    ws[W_NOUT] = 0
    ws[W_NPULL] = 0
    while True:
        head = ws[W_HEAD]
        count = ws[W_COUNT]
        tail = (head + count) % 2
        decide = ws[W_DECIDE]
        if ws[W_PHASE] == PH_ENDED:
            # after the finishes of a pass end went out (`stop_on_finish`):
            # with nothing left in flight, an idle engine with requests wakes
            ws[W_PHASE] = PH_NORMAL
            if count == 0 and decide == DEC_NONE and _has_requests(w.sched_t, ranks):
                ws[W_DECIDE] = DEC_WAKE
                wt[T_DECIDE] = wt[T_NOW]
                ws[W_DSEQ] = _next_seq(ws)
            continue
        if ws[W_PHASE] == PH_SETTLE:
            ws[W_PHASE] = PH_NORMAL
            t = wt[T_NOW]
        else:
            # the next of the worker's events, in key order
            kind = EV_NONE
            t, order, seq = 0.0, 0, 0
            if count == 2 or (count == 1 and decide != DEC_PASS):
                t, order, seq, kind = w.ptime[head, P_END], PASS_END, w.pseq[head], EV_END
            elif decide != DEC_NONE:
                order = PASS_END if decide == DEC_PASS else DECIDE
                t, seq, kind = wt[T_DECIDE], ws[W_DSEQ], EV_DECIDE
            x = -1
            if ws[W_NXW] and decide != DEC_NOW:
                x = _first_wake(w.xw_t, w.xw_s, ws[W_NXW])
                if kind == EV_NONE or _before(w.xw_t[x], DECIDE, w.xw_s[x], t, order, seq):
                    t, order, seq, kind = w.xw_t[x], DECIDE, w.xw_s[x], EV_XWAKE
            a = ws[W_ANEXT]
            if a < ws[W_AEND] and decide != DEC_NOW:
                at = w.arrival_ms[a]
                if kind == EV_NONE or _before(at, ARRIVAL, ws[W_ASEQ], t, order, seq):
                    t, order, seq, kind = at, ARRIVAL, ws[W_ASEQ], EV_ARRIVE
            if kind == EV_NONE:
                ws[W_NFIN] = n_fin
                return IDLE
            if kind == EV_END and log_on and not _log_room(log, ranks, width):
                ws[W_NFIN] = n_fin
                return LOG_FULL
            if kv_t is not None:
                if cpu and (ws[W_NXW] + 1 >= len(w.xw_t)
                            or not _kv_room(kv_t, w.sched_t, ranks, width, w.num_gpu_blocks)):
                    ws[W_NFIN] = n_fin
                    return ROOM
            if (not (ws[W_FORCE] or decide == DEC_NOW
                     or _before(t, order, seq, h_time, h_order, h_seq))
                    or (kind == EV_ARRIVE and a >= ws[W_ALIMIT])):
                wt[T_NEXT] = t
                ws[W_NEXT_ORDER] = order
                ws[W_NEXT_SEQ] = seq
                ws[W_NFIN] = n_fin
                return HORIZON
            ws[W_FORCE] = 0
            wt[T_NOW] = t
            if kind == EV_ARRIVE:
                _arrive(w.sched_t[0], ws, wt, w.arrival_ms)
                continue
            if kind == EV_END:
                # the outputs of the pass at the head of the queue
                following = 1 - head
                release = max(t, w.ptime[following, P_LAUNCH_END]) if count == 2 else t
                finished_here = 0
                for r in range(ranks):
                    index = w.pidx[head, r]
                    if index < 0:
                        continue
                    n = fast.update_from_output(
                        w.sched_t[r], w.outs[head, r], w.feats[head, r, fast.N_SCHED], release,
                        index, w.finished[n_fin:], rank_kv(kv_t, r))
                    if kv_t is not None:
                        if cpu:
                            _submit_finished_stores(kv_t[r], w.ptime[following, P_END]
                                                    if count == 2 else t)
                    if log_on:
                        _log_pass(log, ws, w.ptime, head, r, index, w.outs[head, r],
                                  w.feats[head, r], w.finished[n_fin:], n)
                    n_fin += n
                    finished_here += n
                    track_usage(w.usage[r], w.sched_t[r].pscal, w.num_gpu_blocks, t)
                ws[W_HEAD] = following
                ws[W_COUNT] = count - 1
                ws[W_ENDED] = w.pidx[head, 0]
                if finished_here and ws[W_STOP]:
                    # the finishes go out first (a handoff wakes a decode
                    # worker, a closed loop releases an arrival), then the wake
                    ws[W_PHASE] = PH_ENDED
                    ws[W_NFIN] = n_fin
                    return FINISHED
                if count == 1 and _has_requests(w.sched_t, ranks):
                    # an idle engine wakes (after arrivals at t)
                    ws[W_DECIDE] = DEC_WAKE
                    wt[T_DECIDE] = t
                    ws[W_DSEQ] = _next_seq(ws)
                continue
            if kind == EV_XWAKE:
                # a transfer's end wakes an idle engine (`_wake_at_next_transfer`)
                last = ws[W_NXW] - 1
                w.xw_t[x] = w.xw_t[last]
                w.xw_s[x] = w.xw_s[last]
                ws[W_NXW] = last
                if wt[T_XWAKE] == t:
                    wt[T_XWAKE] = -1.0
                if count or decide != DEC_NONE:
                    continue
            # a decision at t: every rank's schedule() (transfers finished by
            # now take effect first; the loads and preemption stores decided
            # go out at once)
            ws[W_DECIDE] = DEC_NONE
            if kv_t is not None:
                if cpu:
                    for r in range(ranks):
                        _poll(kv_t[r], w.R, t)
            if pool == POOL_PREFILL:
                for r in range(ranks):
                    if w.side_state_t[r][fast_disagg.P_COUNT]:
                        fast_disagg.poll_sender(w.sched_t[r], w.side_pending_t[r],
                                                w.side_state_t[r], w.side_log_t[r], w.XF, t)
            elif pool == POOL_DECODE:
                for r in range(ranks):
                    if w.side_state_t[r][fast_disagg.P_COUNT]:
                        fast_disagg.poll_receiver(w.R, w.side_pending_t[r], w.side_state_t[r],
                                                  w.XI, w.XF, t)
            n_taken = 0
            for r in range(ranks):
                S = w.sched_t[r].S
                w.feats[tail, r, :] = 0
                if S[0].preemptions_since_token > LIVELOCK_PREEMPTIONS:
                    if kv_t is not None:
                        KC = kv_t[r].KC
                        for row in range(fast.NUM_KO_ROWS):
                            if row != fast.KO_FSTORES:
                                KC[row] = 0
                    n_taken += fast.take_out_all(w.sched_t[r], rank_kv(kv_t, r), w.outs[tail, r],
                                                 w.feats[tail, r], w.taken[n_taken:])
                    continue
                fast.schedule(w.sched_t[r], w.outs[tail, r], w.feats[tail, r], rank_kv(kv_t, r))
                for e in range(w.feats[tail, r, fast.N_UNFIN]):
                    w.taken[n_taken] = w.outs[tail, r, fast.O_UNFIN, e]
                    n_taken += 1
            n_pulls = 0
            if kv_t is not None:
                if cpu:
                    for r in range(ranks):
                        _submit_decided(kv_t[r], t)
                elif pool == POOL_DECODE:
                    for r in range(ranks):
                        if kv_t[r].KC[fast.KO_LOADS] == 0:
                            continue  # no pull decided
                        n_pulls = _submit_pulls(w.R, kv_t[r], w.side_pending_t[r],
                                                w.side_state_t[r], w.XI, w.XF, w.link_free,
                                                w.link_of, w.xparams, t, w.pulls, n_pulls)
            for r in range(ranks):
                track_usage(w.usage[r], w.sched_t[r].pscal, w.num_gpu_blocks, t)
            if n_taken or n_pulls:
                ws[W_PHASE] = PH_SETTLE
                ws[W_NOUT] = n_taken
                ws[W_NPULL] = n_pulls
                ws[W_NFIN] = n_fin
                return TAKEN_OUT
        # settle the decision in slot `tail`, made at t
        scheduled = preempted = False
        for r in range(ranks):
            if w.feats[tail, r, fast.N_SCHED]:
                scheduled = True
            if w.feats[tail, r, fast.N_PRE]:
                preempted = True
        if not scheduled:
            if count == 0:
                if preempted:  # only preempted, idle: decide again at once
                    ws[W_DECIDE] = DEC_NOW
                    wt[T_DECIDE] = t
                elif pool >= 0:
                    _wake_at(_next_land(w.side_pending_t, w.side_state_t, w.XF, ranks), w.sched_t,
                             ranks, ws, wt, w.xw_t, w.xw_s)
                elif kv_t is not None:
                    if cpu:
                        _wake_at(_next_completion_ms(kv_t, ranks), w.sched_t, ranks, ws, wt, w.xw_t,
                                 w.xw_s)
            continue  # else wait: for the pass in flight's end, or an arrival
        # launch it: it starts when the pass in flight ends, and no earlier
        # than the stores still reading the G1 blocks it writes
        start = max(t, w.ptime[head, P_END]) if count == 1 else t
        if kv_t is not None:
            if cpu:
                for r in range(ranks):
                    start = max(start, _store_done_ms(kv_t[r]))
        duration = 0.0
        prefill_tokens = total_tokens = 0
        for r in range(ranks):
            f = w.feats[tail, r]
            n_sched = f[fast.N_SCHED]
            if n_sched == 0:
                w.pidx[tail, r] = -1
                continue
            w.pidx[tail, r] = w.counters[r, C_PASSES]
            w.counters[r, C_PASSES] += 1
            w.counters[r, C_TOKENS] += f[fast.TOTAL_TOKENS]
            prefill_tokens += f[fast.PREFILL_TOKENS]
            total_tokens += f[fast.TOTAL_TOKENS]
            duration = max(duration, price_features(w.model, w.params, f, w.kv_capacity))
            fast.mark_started(w.R, w.outs[tail, r], n_sched, start)
        end = start + duration
        launch_end = launch_end_ms(w.launch, total_tokens, prefill_tokens, t, start, end)
        w.ptime[tail, P_DECIDED] = t
        w.ptime[tail, P_START] = start
        w.ptime[tail, P_END] = end
        w.ptime[tail, P_LAUNCH_END] = launch_end
        wt[T_BUSY] += duration
        ws[W_PASSES] += 1
        if kv_t is not None:
            if cpu:
                for r in range(ranks):  # `offloading`: the pass's stores go out at its end
                    kv = kv_t[r]
                    for k in range(kv.KC[fast.KO_STORES]):
                        _submit(kv, kv.KO[fast.KO_STORES, k], end)
        if ws[W_ASYNC]:
            ws[W_DECIDE] = DEC_PASS
            wt[T_DECIDE] = max(launch_end, w.ptime[head, P_END]) if count == 1 else launch_end
            ws[W_DSEQ] = _next_seq(ws)
        w.pseq[tail] = _next_seq(ws)
        ws[W_COUNT] = count + 1


@njit
def _poll(kv, R, now):
    """The CPU tier's `get_finished` at a decision: transfers done by now
    take effect (a landed load marks its request KVLoad.LANDED)."""
    KS = kv.KS
    if KS[ct.K_LEN + ct.STORE] or KS[ct.K_LEN + ct.LOAD]:
        ct.get_finished(kv.tier, kv.slot_of, kv.lanes, kv.jobs, kv.job_times, kv.job_blocks, KS,
                        kv.KF, R, KVLoad.LANDED, now)


@njit
def _submit_decided(kv, now):
    """A decision's `simple_cpu` preemption stores, then its loads, go out at
    the decision instant."""
    KO, KC = kv.KO, kv.KC
    for k in range(KC[fast.KO_PSTORES]):
        _submit(kv, KO[fast.KO_PSTORES, k], now)
    for k in range(KC[fast.KO_LOADS]):
        _submit(kv, KO[fast.KO_LOADS, k], now)


@njit
def _submit_finished_stores(kv, at_ms):
    """A finished request's store goes out with its free: at once when
    synchronous; under async scheduling the pass in flight was decided while
    the request still held its blocks, so at that pass's end (`at_ms`)."""
    KO, KC = kv.KO, kv.KC
    for k in range(KC[fast.KO_FSTORES]):
        _submit(kv, KO[fast.KO_FSTORES, k], at_ms)
    KC[fast.KO_FSTORES] = 0


@njit
def _store_done_ms(kv):
    """The instant from which the G1 blocks a decided pass writes may be
    overwritten: the end of the stores still reading them (docs/engine.md §9)."""
    n = kv.KC[fast.KO_NEW_BLOCKS]
    if n == 0:
        return 0.0
    return ct.store_done_ms(kv.storing, kv.job_times, kv.KO[fast.KO_NEW_BLOCKS], n)


@njit
def _next_land(side_pending_t, side_state_t, XF, ranks):
    """The earliest landing among the ranks' pending handoff transfers
    (-1.0: none)."""
    t = np.inf
    for r in range(ranks):
        t = min(t, fast_disagg.next_land(side_pending_t[r], side_state_t[r][fast_disagg.P_COUNT],
                                         XF))
    return t if t < np.inf else -1.0


@njit
def _submit_pulls(R, kv, pending, state, XI, XF, link_free, link_of, xparams, now, pulls, n):
    """A decode rank's pulls and notices decided now go on their prefill
    ranks' links (`ArrayReceiver.submit`); each is listed in `pulls` for its
    sender. Returns the new count."""
    KO, KC = kv.KO, kv.KC
    for k in range(KC[fast.KO_LOADS]):
        i = KO[fast.KO_LOADS, k]
        tokens = 0
        if R[i].kv_handoff == KVHandoff.PULLING:  # waiting for the pull
            tokens = R[i].num_prompt_tokens - R[i].num_g1_hit_tokens
        fast_disagg.submit_transfer(XI, XF, link_free, i, link_of[i], tokens, xparams[0],
                                    xparams[1], xparams[2], now)
        pulls[n] = i
        n += 1
        if tokens:
            fast_disagg.wait_on(pending, state, i)
    return n


@njit
def _wake_at(t, sched_t, ranks, ws, wt, xw_t, xw_s):
    """An idle engine whose requests wait on a transfer (a load, a store a
    lookup waits for, a handoff's transfer) decides again when the next one
    completes, at `t` (-1: none): a wake (order DECIDE) at that instant,
    unless one is pending no later (`EngineCore._wake_at_next_transfer`).
    Returns whether it added one."""
    if not _has_requests(sched_t, ranks):
        return False
    if t < 0 or (wt[T_XWAKE] >= 0 and wt[T_XWAKE] <= t):
        return False
    wt[T_XWAKE] = t
    n = ws[W_NXW]
    xw_t[n] = t
    xw_s[n] = _next_seq(ws)
    ws[W_NXW] = n + 1
    return True


def padded(entries, least=2) -> tuple:
    """`entries` as a tuple of length `least` doubled until it holds them
    (a power of two by default), the padding repeating the first entry.

    Numba compiles a kernel once per type of its arguments, and a tuple's
    length is part of its type: the ranks' arrays (`CompiledWorker`) and a
    pool's workers (engine/fast_workers.py) go to their loops padded, so 1 and
    2 attention-DP ranks, or workers per pool, share one compile (the 1-rank
    run of the whole Mooncake trace is as fast padded: 3.23 s against 3.35 s,
    medians of 3). The loops read the real count elsewhere (`feats.shape[1]`,
    `ps[P_NUM_A]`) and never read the padding."""
    n = least
    while n < len(entries):
        n *= 2
    return tuple(entries) + (entries[0],) * (n - len(entries))


class PassLogBuffer:
    """The pass log of compiled workers, one line per rank and pass in the
    order their outputs were processed: head and time columns per line, and
    flat arrays of scheduled entries (request, tokens, cached, kind, drafts),
    preempted and finished requests, each line holding the end of its slice.
    `grow()` doubles what is full. `for_workload` reserves what a workload
    is expected to need up front: zeroed arrays are mapped lazily, so a page
    costs only once it is written, where each doubling writes it again."""

    def __init__(self, rows=4096, entries=None, finished=None):
        self.head = np.zeros((rows, NUM_LHEAD), dtype=np.int64)
        self.time = np.zeros((rows, 4), dtype=np.float64)
        self.sched = np.zeros((entries or rows * 8, NUM_LENTRY), dtype=np.int32)
        self.pre = np.zeros(rows, dtype=np.int32)
        self.fin = np.zeros(finished or rows, dtype=np.int32)
        self.count = np.zeros(4, dtype=np.int64)
        self._arrays = None  # (`arrays`)

    @classmethod
    def for_workload(cls, input_length, output_length):
        """A buffer for requests of these lengths: a scheduled entry for each
        output token and prompt chunk (taken as 512 tokens; preemptions and
        disaggregated hand-offs add a few, and `grow` the rest), a finished
        entry for each request."""
        n = len(input_length)
        entries = int(output_length.sum()) + int(input_length.sum()) // 512 + 2 * n
        return cls(entries=entries + 4096, finished=n + 1)

    def grow(self, ranks, width):
        def bigger(a, used, need):
            if used + need <= a.shape[0]:
                return a
            size = max(2 * a.shape[0], used + need)
            b = np.zeros((size,) + a.shape[1:], dtype=a.dtype)
            b[:used] = a[:used]
            return b

        c = self.count
        self.head = bigger(self.head, c[N_ROWS], ranks)
        self.time = bigger(self.time, c[N_ROWS], ranks)
        self.sched = bigger(self.sched, c[N_SCHED_E], ranks * width)
        self.pre = bigger(self.pre, c[N_PRE_E], ranks * width)
        self.fin = bigger(self.fin, c[N_FIN_E], ranks * width)
        self._arrays = None

    def arrays(self):
        """The buffer's arrays as the pass loops take them (a
        `PassLogArrays`, engine/worker_arrays.py), made again after `grow`."""
        if self._arrays is None:
            self._arrays = new_pass_log_arrays(self.head, self.time, self.sched, self.pre,
                                               self.fin, self.count)
        return self._arrays

    def __len__(self):
        return int(self.count[N_ROWS])


_NO_LOG = PassLogBuffer(1)


def log_arguments(log):
    """The pass loops' last arguments: whether they log passes, and the
    `PassLogBuffer`'s arrays (stand-ins without a pass log, `log` None)."""
    buf = log if log is not None else _NO_LOG
    return (log is not None, buf.arrays())

# a worker admitting its own arrivals returns to the event loop after this many
# (progress, Ctrl-C and the debug mode's checks get a turn)
ARRIVALS_PER_CALL = 4096


class CompiledWorker:
    """A worker's state for `run_passes`: the batch queue (two slots of every
    rank's output), the pending decision, the event-loop sequence counter, and
    the ranks' arrays as tuples (one entry per attention-DP rank, `padded`)."""

    def __init__(self, ranks, worker_index, pool_code, async_scheduling, launch_params,
                 usage, counters):
        schedulers = [rank.scheduler for rank in ranks]
        s0 = schedulers[0]
        self.ranks = ranks
        self.schedulers = schedulers
        width = s0._out_width
        d = len(ranks)
        self.outs = np.zeros((2, d, fast.NUM_OUT_ROWS, width), dtype=np.int64)
        self.feats = np.zeros((2, d, fast.NUM_FEATS), dtype=np.int64)
        self.pidx = np.full((2, d), -1, dtype=np.int64)
        self.ptime = np.zeros((2, 4), dtype=np.float64)
        self.pseq = np.zeros(2, dtype=np.int64)
        self.ws = np.zeros(NUM_WS, dtype=np.int64)
        self.ws[W_ASYNC] = async_scheduling
        self.ws[W_STOP] = s0.stop_on_finish
        self.ws[W_WORKER] = worker_index
        self.ws[W_POOL] = pool_code
        self.wt = np.zeros(NUM_WT, dtype=np.float64)
        self.wt[T_XWAKE] = -1.0
        self.xw_t = np.zeros(8, dtype=np.float64)  # transfer wakes pending
        self.xw_s = np.zeros(8, dtype=np.int64)
        n = len(s0.table.request_ids) + 1
        self.finished = np.zeros(n, dtype=np.int64)
        self.taken = np.zeros(n, dtype=np.int64)
        self.pulls = np.zeros(n, dtype=np.int64)
        # disaggregated mode: each rank's sender or receiver arrays and the
        # transfers (`attach_side`); stand-ins of the same types otherwise
        none = np.zeros(1, dtype=np.int64)
        self._side = [(none, np.zeros(2, dtype=np.int64), none)] * d
        self._xfer = (np.zeros((1, 4), dtype=np.int64), np.zeros((1, 5), dtype=np.float64),
                      np.zeros(1, dtype=np.float64), none, np.zeros(3, dtype=np.float64))
        self._side_args = self._side_tuple()
        self._args = None  # (made at the first call)
        # run_passes compiled for the arguments' types (jit.Entry): a worker
        # calls it at every outside event with the same arguments (the worker's
        # arrays as one bundle, the `kv` bundles, the horizon and the pass log),
        # whose types stay those of the first call until `_args` is rebuilt
        self._entry = Entry(run_passes)
        self.launch = launch_params
        self.usage = usage
        self.counters = counters
        self.width = width
        table = s0.table
        pricer = ranks[0].pricer
        self._shared = (table.R, np.zeros(0, dtype=np.float64))  # arrival_ms (`take_arrivals`)
        self._ranks = (padded([s.arrays for s in schedulers]),
                       usage, counters, pricer.model, pricer.params, pricer.kv_capacity_tokens,
                       s0.pool.num_gpu_blocks, launch_params)

    idle = property(lambda self: self.ws[W_COUNT] == 0 and self.ws[W_DECIDE] == DEC_NONE)

    def _side_tuple(self):
        return (padded([x[0] for x in self._side]), padded([x[1] for x in self._side]),
                padded([x[2] for x in self._side])) + self._xfer

    def attach_side(self, rank_index, pending, state, log, transfers):
        """Disaggregated mode: rank `rank_index`'s sender or receiver arrays
        (engine/fast_disagg.py) and the handoffs' `Transfers`."""
        self._side[rank_index] = (pending, state, log if log is not None else pending)
        self.ws[W_STOP] = 1  # finishes go out at once: a handoff, or a decode's release
        self._xfer = (transfers.I, transfers.F, transfers.link_free, transfers.link_of,
                      np.array([transfers.bytes_per_token, transfers.bytes_per_ms,
                                transfers.latency_ms], dtype=np.float64))
        self._side_args = self._side_tuple()
        self._args = None

    def transfer_pending(self, seq):
        """A transfer this idle worker's ranks wait for was submitted
        elsewhere: the wake at their next landing (`_wake_at`), with sequence
        `seq + 1`. Returns whether a wake was added."""
        self._grow_wakes()
        self.ws[W_SEQ] = seq
        side = self._side_args
        d = len(self.ranks)
        t = _next_land(side[0], side[1], side[4], d)
        return bool(_wake_at(t, self._ranks[0], d, self.ws, self.wt, self.xw_t, self.xw_s))

    def take_arrivals(self, arrival_ms, seq):
        """The loop admits requests 0 to `len(arrival_ms)` - 1 itself
        (`_arrive`), in that order, request i at `arrival_ms[i]`; the first
        one's event has sequence `seq`."""
        self.ws[W_ANEXT] = 0
        self.ws[W_AEND] = len(arrival_ms)
        self.ws[W_ASEQ] = seq
        self._shared = self._shared[:-1] + (arrival_ms,)
        self._args = None

    arrivals = property(lambda self: int(self.ws[W_ANEXT]))  # admitted (or rejected) so far

    def run(self, horizon, seq, log):
        """`run_passes` up to the `horizon` key, the event loop's sequence
        counter at `seq` (`ws[W_FORCE]` set: the first event was popped off the
        event loop); returns the state (the counter is then `ws[W_SEQ]`)."""
        self.ws[W_SEQ] = seq
        self.ws[W_ALIMIT] = min(self.ws[W_AEND], self.ws[W_ANEXT] + ARRIVALS_PER_CALL)
        return self._entry(*self.arguments(), float(horizon[0]), int(horizon[1]),
                           int(horizon[2]), *log_arguments(log))

    def arguments(self):
        """`run_passes`' arguments but the horizon and the pass log (made
        again after `regrow`)."""
        if self._args is None:
            self._args = self._make_args()
            self._entry.reset()
        return self._args

    def regrow(self):
        """After ROOM: the arrays that may not hold the next event are grown
        when the arguments are made again (`_make_args`)."""
        self._args = None

    def _make_args(self):
        """The loop's arguments but the horizon and the pass log: the worker's
        arrays (engine/worker_arrays.py) and each rank's `kv` bundle
        (`FastScheduler._kv`, which grows the CPU tier's job arrays so that
        one call's jobs fit; only this worker calls it during a run) and the
        transfer wakes' arrays, grown when they may run short."""
        kv = (padded([s._kv() for s in self.schedulers])
              if self.schedulers[0].kv_state is not None else None)
        self._grow_wakes()
        w = new_worker_arrays(*self._shared, *self._ranks, *self._side_args, self.outs,
                              self.feats, self.pidx, self.ptime, self.pseq, self.ws, self.wt,
                              self.xw_t, self.xw_s, self.finished, self.taken, self.pulls)
        return w, kv

    def _grow_wakes(self):
        if self.ws[W_NXW] + 1 >= len(self.xw_t):
            self.xw_t = np.concatenate([self.xw_t, np.zeros_like(self.xw_t)])
            self.xw_s = np.concatenate([self.xw_s, np.zeros_like(self.xw_s)])
            self._args = None
