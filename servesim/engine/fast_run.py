"""Runs of synchronous passes inside one compiled loop.

Between two outside events — an arrival, a telemetry tick, a closed-loop
release — a synchronous one-rank worker only alternates "process pass k's
outputs at end(k)" and "decide pass k+1 at end(k)" (docs/engine.md §6). When
the compiled scheduler runs it, `run_sync_passes` does that alternation pass
after pass without returning to Python, with the same kernels, pricing and
bookkeeping the engine core uses one pass at a time, so results are identical.

It stops and hands back to the engine core:
- DONE_IDLE: outputs of the last pass processed, nothing decided (an outside
  event is due at exactly that instant, a request finished under closed
  loop, or nothing is left to run);
- IN_FLIGHT: a pass was decided and launched, ending after the horizon;
- NEEDS_CORE: a decision that scheduled nothing or took a request out as
  unfinishable, for the core's general handling;
- STALLED: before deciding, the rank looks livelocked (requests preempting
  each other without a token sampled): the core's decision takes them out.
"""

import numpy as np

from servesim.engine.pricing import price_features
# (compiled in: Numba's cache of this file does not see pricing.py's kernels
# change; edit this line with them. Table layout 3.)
from servesim.jit import njit
from servesim.kvcache.block_pool import NUM_FREE
from servesim.scheduler import fast
from servesim.scheduler.fast_queue import WQ_LEN

DONE_IDLE, IN_FLIGHT, NEEDS_CORE, STALLED = 0, 1, 2, 3
# usage: [area, max, value, since]; counters: [passes, tokens_scheduled]
U_AREA, U_MAX, U_VALUE, U_SINCE = range(4)
C_PASSES, C_TOKENS = range(2)


@njit
def track_usage(usage, pscal, num_gpu_blocks, now):
    """Integrate vLLM's KV usage (1 - free / usable) up to `now`, then take its
    new value."""
    usage[U_AREA] += usage[U_VALUE] * (now - usage[U_SINCE])
    usage[U_SINCE] = now
    value = 1.0 - pscal[NUM_FREE] / (num_gpu_blocks - 1)
    usage[U_VALUE] = value
    if value > usage[U_MAX]:
        usage[U_MAX] = value


@njit
def run_sync_passes(R, F, idents, tables, blocks, idmap, pscal, cfg, spec, S, running, wq,
                    client_ms, token_offsets, last_client, detokenize_ms,
                    model, params, kv_capacity, num_gpu_blocks,
                    out, feats, end_ms, pass_index, horizon, stop_on_finish,
                    usage, counters, busy, finished, times):
    """Start from a launched pass (`out`, `feats`, index `pass_index`) ending
    at `end_ms` <= `horizon`. Returns `(state, num_finished)`; `times` gets
    [time reached, -, the in-flight pass's start, its end]; `finished` the
    requests that finished, in order; `busy[0]` accumulates GPU time."""
    num_finished = 0
    t = end_ms
    while True:
        # outputs of the pass ending at t
        n = fast.update_from_output(R, F, idents, tables, blocks, idmap, pscal, cfg, spec, S,
                                    running, wq, out, feats[fast.N_SCHED], t, pass_index,
                                    detokenize_ms, client_ms, token_offsets, last_client,
                                    finished[num_finished:])
        num_finished += n
        track_usage(usage, pscal, num_gpu_blocks, t)
        if t >= horizon or (n > 0 and stop_on_finish) or S[fast.S_RUN_N] + S[WQ_LEN] == 0:
            times[0] = t
            return DONE_IDLE, num_finished
        # the next decision, at t
        if S[fast.S_STALL] > fast.LIVELOCK_PREEMPTIONS:
            times[0] = t
            return STALLED, num_finished
        feats[:] = 0
        fast.schedule(R, F, idents, tables, blocks, idmap, pscal, cfg, S, running, wq,
                      out, feats)
        track_usage(usage, pscal, num_gpu_blocks, t)
        if feats[fast.N_SCHED] == 0 or feats[fast.N_UNFIN] > 0:
            times[0] = t
            return NEEDS_CORE, num_finished
        duration = price_features(model, params, feats, kv_capacity)
        fast.mark_started(F, out, feats[fast.N_SCHED], t)
        pass_index = counters[C_PASSES]
        counters[C_PASSES] += 1
        counters[C_TOKENS] += feats[fast.TOTAL_TOKENS]
        busy[0] += duration
        end = t + duration
        if end > horizon:
            times[0] = t
            times[2] = t
            times[3] = end
            return IN_FLIGHT, num_finished
        t = end


def run_from(scheduler: fast.FastScheduler, out: fast.FastOutput, end_ms, pass_index,
             horizon, usage, counters, busy, pricer):
    """Run `run_sync_passes` on a compiled scheduler's arrays, from its
    launched pass `out`. Returns `(state, finished indices, times, output of
    the last decision)`."""
    t = scheduler.table
    p = scheduler.pool
    tok = scheduler.tokens
    times = np.zeros(4, dtype=np.float64)
    # the last decision gets its own arrays: `out` stays the first pass's
    last = fast.FastOutput(out.out.copy(), out.feats.copy())
    finished = scheduler.finished_buffer
    state, n = run_sync_passes(
        t.R, t.F, t.idents, t.tables, p.blocks, p.idmap, p.scalars, scheduler.cfg,
        scheduler.spec, scheduler.S, scheduler.running, scheduler.wq, tok.client_ms, tok.offsets,
        tok.last_client, tok.detokenize_ms, pricer.model, pricer.params,
        pricer.kv_capacity_tokens, p.num_gpu_blocks, last.out, last.feats, end_ms,
        pass_index, horizon, scheduler.stop_on_finish, usage, counters, busy, finished,
        times)
    return state, finished[:n].tolist(), times, last


# Async runs: states handed back to the engine core
A_DECIDE_NEXT, A_NEEDS_CORE, A_IN_FLIGHT = 10, 11, 12


@njit
def run_async_passes(R, F, idents, tables, blocks, idmap, pscal, cfg, spec, S, running, wq,
                     client_ms, token_offsets, last_client, detokenize_ms,
                     model, params, kv_capacity, num_gpu_blocks,
                     outs, feats, cur, times, index, horizon, stop_on_finish,
                     usage, counters, busy, finished):
    """The asynchronous alternation (docs/engine.md §7, no `launch`) between
    outside events, for a one-rank worker with two passes in flight: slot
    `cur` of `outs`/`feats` ends at `times[0]` and its outputs are processed
    there; slot `1 - cur` is decided, on the GPU from `times[1]` to
    `times[2]` (decided at `times[3]`); `times[4:6]` hold the decision and start
    of the slot `cur` pass. At each pass end: process its outputs,
    then decide the next pass at once (before arrivals at that instant); it
    starts when the pass in flight ends. Returns `(state, cur slot,
    num_finished)`, with `times` and `index` (pass indices of the two slots)
    describing the passes in flight:
    - DONE: never returned here (the core handles an empty queue);
    - A_DECIDE_NEXT: outputs processed at `times[0]`, the next decision is the
      core's (a finish under closed loop, or a livelock to take out);
    - A_NEEDS_CORE: the decision at `times[0]` scheduled nothing or took a
      request out: it is in slot `cur`, for the core's general handling;
    - A_IN_FLIGHT: slot `cur` ends after the horizon; both passes in flight."""
    num_finished = 0
    while True:
        t = times[0]
        n = fast.update_from_output(R, F, idents, tables, blocks, idmap, pscal, cfg, spec, S,
                                    running, wq, outs[cur], feats[cur, fast.N_SCHED], t,
                                    index[cur], detokenize_ms, client_ms, token_offsets,
                                    last_client, finished[num_finished:])
        num_finished += n
        track_usage(usage, pscal, num_gpu_blocks, t)
        if (n > 0 and stop_on_finish) or S[fast.S_STALL] > fast.LIVELOCK_PREEMPTIONS:
            return A_DECIDE_NEXT, cur, num_finished
        # the next decision, at t, with the other slot's pass in flight
        feats[cur, :] = 0
        fast.schedule(R, F, idents, tables, blocks, idmap, pscal, cfg, S, running, wq,
                      outs[cur], feats[cur])
        track_usage(usage, pscal, num_gpu_blocks, t)
        if feats[cur, fast.N_SCHED] == 0 or feats[cur, fast.N_UNFIN] > 0:
            return A_NEEDS_CORE, cur, num_finished
        duration = price_features(model, params, feats[cur], kv_capacity)
        start = max(t, times[2])
        fast.mark_started(F, outs[cur], feats[cur, fast.N_SCHED], start)
        index[cur] = counters[C_PASSES]
        counters[C_PASSES] += 1
        counters[C_TOKENS] += feats[cur, fast.TOTAL_TOKENS]
        busy[0] += duration
        # the pass in flight becomes the one to finish next; the new one follows it
        times[4] = times[3]
        times[5] = times[1]
        times[0] = times[2]
        times[3] = t
        times[1] = start
        times[2] = start + duration
        cur = 1 - cur
        if times[0] > horizon:
            return A_IN_FLIGHT, cur, num_finished


def run_async_from(scheduler: fast.FastScheduler, first, second, horizon, usage, counters,
                   busy, pricer):
    """Run `run_async_passes` from two passes in flight (`first` ends next),
    each given as `(FastOutput, index, decided, start, end)`. Returns
    `(state, finished indices, (cur output, index, decided, start, end),
    (other output, index, decided, start, end))`."""
    t = scheduler.table
    p = scheduler.pool
    tok = scheduler.tokens
    width = first[0].out.shape[1]
    outs = np.empty((2, first[0].out.shape[0], width), dtype=np.int64)
    feats = np.empty((2, len(first[0].feats)), dtype=np.int64)
    outs[0], feats[0] = first[0].out, first[0].feats
    outs[1], feats[1] = second[0].out, second[0].feats
    times = np.array([first[4], second[3], second[4], second[2], first[2], first[3]],
                     dtype=np.float64)
    index = np.array([first[1], second[1]], dtype=np.int64)
    finished = scheduler.finished_buffer
    state, cur, n = run_async_passes(
        t.R, t.F, t.idents, t.tables, p.blocks, p.idmap, p.scalars, scheduler.cfg,
        scheduler.spec, scheduler.S, scheduler.running, scheduler.wq, tok.client_ms, tok.offsets,
        tok.last_client, tok.detokenize_ms, pricer.model, pricer.params,
        pricer.kv_capacity_tokens, p.num_gpu_blocks, outs, feats, 0, times, index,
        horizon, scheduler.stop_on_finish, usage, counters, busy, finished)
    other = 1 - cur
    return (state, finished[:n].tolist(),
            (fast.FastOutput(outs[cur], feats[cur]), int(index[cur]), float(times[4]),
             float(times[5]), float(times[0])),
            (fast.FastOutput(outs[other], feats[other]), int(index[other]), float(times[3]),
             float(times[1]), float(times[2])))
