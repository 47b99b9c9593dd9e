"""A worker's arrays for its compiled pass loop (engine/pass_loop.py
`run_passes`), as one named bundle: `WorkerArrays`, a Numba StructRef; and
the pass log buffer's arrays the loop writes, `PassLogArrays`.

The loop is entered at every outside event of an aggregated worker and, in a
disaggregated deployment, at nearly every event of each worker
(engine/disaggregated_loop.py switches workers in their events' key order). Handed
over as ~45 positional arrays and per-rank tuples of arrays, entering it cost
a reference count on and off for each of them and a copy of every array's
descriptor, a few µs a switch; a StructRef is handed over as one pointer, and
its fields are read where they are used.

It is a bundle (servesim/bundles.py): its fields are read without the
runtime's helper, so that the loop can be compiled without Numba's
reference counts.

The fields carry the names the loop's docstring uses (the request table `R`,
each rank's scheduler arrays `sched_t` (a tuple of
`SchedulerArrays`, scheduler/scheduler_arrays.py, the bundle the scheduler's
kernels take) and other per-rank tuples `*_t`, the batch queue's `outs` /
`feats` / `pidx` / `queue` (`PASS_DTYPE` records), the worker's state
`ws` (one `WORKER_DTYPE` record), ...); `WorkerLoop._make_args` builds
one, again whenever one of its arrays is replaced by a larger one. The
ranks' `kv` bundles stay an argument of the loop: None on a worker without
a CPU tier or remote KV, the loop's code for them is chosen by that
argument's type when it compiles (a loop over workers hands it the
bundle's `kv_t`).
"""

import enum

import numpy as np
from numba.experimental import structref

from servesim.bundles import BundleType, declare
from servesim.jit import njit, records
from servesim.kvcache.block_pool import kv_usage

# each rank's counters, `stats[r]` (one record per rank, `RANK_STATS_DTYPE`):
# passes and tokens scheduled, and vLLM's KV usage over time (its integral
# since the start, its max, its value and since when it holds)
RANK_STATS_DTYPE = np.dtype([
    ("num_passes", np.int64), ("tokens_scheduled", np.int64),
    ("usage_area", np.float64), ("usage_max", np.float64), ("usage_value", np.float64),
    ("usage_since", np.float64),
])



class LoopState(enum.IntEnum):
    """What a compiled loop hands back for (engine/pass_loop.py, "States handed
    back"); the kernels return the plain ints below, Python reads them as these."""
    IDLE = 0  # no event pending
    HORIZON = 1  # the next event's key is not below the horizon
    FINISHED = 2  # requests finished under `stop_on_finish`
    TAKEN_OUT = 3  # requests taken out, or a decode decision's transfers
    LOG_FULL = 4  # the pass log buffer may not hold the next pass
    ROOM = 5  # a CPU tier's job arrays or the transfer wakes may not hold the next event's


IDLE, HORIZON, FINISHED, TAKEN_OUT, LOG_FULL, ROOM = (int(s) for s in LoopState)
# A worker's state, `ws[0]` (one record, `new_worker_state`), read and
# written by the pass loop and the loops over workers:
WORKER_DTYPE = np.dtype([
    # the batch queue: its first slot, and how many passes are in flight from it
    ("head", np.int64), ("num_in_flight", np.int64),
    # the decision pending (DEC_*), its instant and event sequence
    ("decision", np.int64), ("decision_ms", np.float64), ("decision_seq", np.int64),
    # the event loop's sequence counter, handed in and out at every call
    ("seq", np.int64),
    ("phase", np.int64),  # PH_*: what the call after a FINISHED or TAKEN_OUT return does first
    ("num_passes", np.int64), ("busy_ms", np.float64),  # passes launched, their GPU time
    ("async_scheduling", np.int64),
    ("stop_on_finish", np.int64),  # return FINISHED when requests finish (their release matters)
    # what the call hands back: requests finished (`finished`), taken out
    # (`taken`), a decode decision's transfers (`pulls`)
    ("num_finished", np.int64), ("num_taken_out", np.int64), ("num_pulls", np.int64),
    ("now_ms", np.float64),  # the instant of the last event run
    # HORIZON: the key of the next event (`(time, order, seq)`, engine/events.py)
    ("next_ms", np.float64), ("next_order", np.int64), ("next_seq", np.int64),
    ("worker", np.int64), ("pool", np.int64),  # its index, and POOL_* (-1: aggregated)
    ("force", np.int64),  # the first event runs whatever its key (popped off the event loop)
    # the transfer wakes pending (`xw_t[:num_wakes]`), the latest (-1: none)
    ("num_wakes", np.int64), ("wake_ms", np.float64),
    ("ended_pass", np.int64),  # rank 0's index of the last pass whose outputs were processed
    # the arrivals the loop admits itself (`WorkerLoop.take_arrivals`):
    # the k-th for k from `arrival_next` up to `arrival_end`, request
    # `arrival_req[k]` at `arrival_ms[k]`, the next one's event sequence
    # `arrival_seq`; a call stops before arrival `arrival_limit`; one that
    # can never fit gets `status[i] = rejected_code`, counted in `num_rejected`
    ("arrival_next", np.int64), ("arrival_end", np.int64), ("arrival_seq", np.int64),
    ("arrival_limit", np.int64), ("rejected_code", np.int64), ("num_rejected", np.int64),
])
POOL_PREFILL, POOL_DECODE = 0, 1  # ws[0].pool (-1: aggregated)
# the kinds of the worker's events
EV_NONE, EV_END, EV_DECIDE, EV_XWAKE, EV_ARRIVE = range(5)
# ws[0].decision: the decision pending
DEC_NONE, DEC_PASS, DEC_WAKE, DEC_NOW = 0, 1, 2, 3
PH_NORMAL, PH_SETTLE, PH_ENDED = 0, 1, 2
# the batch queue: one record per slot (`queue[slot]`), the pass in flight there
PASS_DTYPE = np.dtype([
    ("decided_ms", np.float64), ("launch_end_ms", np.float64), ("start_ms", np.float64),
    ("end_ms", np.float64),
    ("seq", np.int64),  # its end's event sequence
])


def new_worker_state(worker_index, pool_code, async_scheduling, stop_on_finish):
    """A worker's state record (`WORKER_DTYPE`), as a new worker has it."""
    ws = records(1, WORKER_DTYPE)
    ws[0]["worker"] = worker_index
    ws[0]["pool"] = pool_code
    ws[0]["async_scheduling"] = async_scheduling
    ws[0]["stop_on_finish"] = stop_on_finish
    ws[0]["wake_ms"] = -1.0
    return ws


@njit
def track_usage(stats, pscal, num_gpu_blocks, now):
    """Integrate vLLM's KV usage (1 - free / usable) up to `now`, then take its
    new value (`stats`: the rank's `RANK_STATS_DTYPE` record)."""
    stats.usage_area += stats.usage_value * (now - stats.usage_since)
    stats.usage_since = now
    value = kv_usage(pscal, num_gpu_blocks)
    stats.usage_value = value
    if value > stats.usage_max:
        stats.usage_max = value


FIELDS = (
    # the request table its ranks share, the arrivals the loop admits and
    # the replay's status of each request (it marks those it rejects)
    "R", "arrival_ms", "arrival_req", "status",
    # each attention-DP rank's scheduler arrays (scheduler/scheduler_arrays.py;
    # a tuple, `padded`), its state, configuration and block pool's among them
    "sched_t",
    # KV usage, counters and pricing (`table`: the aic tables, or None for a
    # formula, engine/pricing.py `price_features`)
    "stats", "model", "params", "kv_capacity", "table", "num_gpu_blocks", "launch",
    # disaggregated mode: each rank's sender or receiver, the handoffs' transfers
    "side_pending_t", "side_state_t", "side_log_t", "XI", "XF", "link_free", "link_of",
    "xparams",
    # the batch queue, the worker's state, transfer wakes, what the loop hands back
    "outs", "feats", "pidx", "queue", "ws", "xw_t", "xw_s", "finished",
    "taken", "pulls",
    # each rank's `kv` bundle (`RankScheduler._kv`; None: no CPU tier and no
    # remote KV), as `run_passes` takes it: for a loop over workers
    "kv_t",
)


class WorkerArraysType(BundleType):
    pass


class WorkerArrays(structref.StructRefProxy):
    """One worker's arrays, in the order of `FIELDS` (make with
    `new_worker_arrays`)."""


@njit
def _new_worker_arrays(*fields):
    return WorkerArrays(*fields)


new_worker_arrays = declare(WorkerArraysType, WorkerArrays, FIELDS, _new_worker_arrays)


# the pass log buffer's arrays (engine/pass_log_buffer.py `PassLogBuffer`)
LOG_FIELDS = ("head", "time", "sched", "pre", "fin", "count")


class PassLogArraysType(BundleType):
    pass


class PassLogArrays(structref.StructRefProxy):
    """A `PassLogBuffer`'s arrays, in the order of `LOG_FIELDS` (make with
    `new_pass_log_arrays`; made again when the buffer grows)."""


@njit
def _new_pass_log_arrays(*fields):
    return PassLogArrays(*fields)


new_pass_log_arrays = declare(PassLogArraysType, PassLogArrays, LOG_FIELDS,
                              _new_pass_log_arrays)
