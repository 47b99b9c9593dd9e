"""Runs of synchronous passes inside one compiled loop.

Between two outside events — an arrival, a telemetry tick, a closed-loop
release — a synchronous one-rank worker only alternates "process pass k's
outputs at end(k)" and "decide pass k+1 at end(k)" (vllm-engine.md §6). When
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
def run_sync_passes(R, F, idents, tables, blocks, idmap, pscal, cfg, S, running, wq,
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
        n = fast.update_from_output(R, F, tables, blocks, pscal, cfg, S, running, wq, out,
                                    feats[fast.N_SCHED], t, pass_index, detokenize_ms,
                                    client_ms, token_offsets, last_client,
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
        scheduler.S, scheduler.running, scheduler.wq, tok.client_ms, tok.offsets,
        tok.last_client, tok.detokenize_ms, pricer.model, pricer.params,
        pricer.kv_capacity_tokens, p.num_gpu_blocks, last.out, last.feats, end_ms,
        pass_index, horizon, scheduler.stop_on_finish, usage, counters, busy, finished,
        times)
    return state, finished[:n].tolist(), times, last
