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
`feats` / `pidx` / `ptime` / `pseq`,
the worker's state `ws` / `wt`, ...); `WorkerLoop._make_args` builds one,
again whenever one of its arrays is replaced by a larger one. The rank's `kv`
bundle stays an argument of the loop: it is None on a worker without a CPU
tier or remote KV, and the loop's code for it is chosen by that argument's
type when it compiles.
"""

import enum

from numba.experimental import structref

from servesim.bundles import BundleType, declare
from servesim.jit import njit
from servesim.kvcache.block_pool import kv_usage

# usage: [area, max, value, since]; counters: [passes, tokens_scheduled]
U_AREA, U_MAX, U_VALUE, U_SINCE = range(4)
C_PASSES, C_TOKENS = range(2)



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
# ws (int64 worker state)
(W_HEAD, W_COUNT, W_DECIDE, W_DSEQ, W_SEQ, W_PHASE, W_PASSES, W_ASYNC, W_STOP,
 W_NFIN, W_NOUT, W_NEXT_ORDER, W_NEXT_SEQ, W_WORKER, W_POOL, W_FORCE, W_NXW,
 W_NPULL, W_ENDED, W_ANEXT, W_AEND, W_ALIMIT, W_ASEQ) = range(23)
NUM_WS = 23  # W_ENDED: rank 0's index of the last pass whose outputs were processed
# W_ANEXT..W_ASEQ: the arrivals the loop admits itself (`WorkerLoop.take_arrivals`):
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


FIELDS = (
    # the request table its ranks share, the arrivals the loop admits
    "R", "arrival_ms",
    # each attention-DP rank's scheduler arrays (scheduler/scheduler_arrays.py;
    # a tuple, `padded`), its state, configuration and block pool's among them
    "sched_t",
    # KV usage, counters and pricing
    "usage", "counters", "model", "params", "kv_capacity", "num_gpu_blocks", "launch",
    # disaggregated mode: each rank's sender or receiver, the handoffs' transfers
    "side_pending_t", "side_state_t", "side_log_t", "XI", "XF", "link_free", "link_of",
    "xparams",
    # the batch queue, the worker's state, transfer wakes, what the loop hands back
    "outs", "feats", "pidx", "ptime", "pseq", "ws", "wt", "xw_t", "xw_s", "finished",
    "taken", "pulls",
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
