"""A worker's arrays for its compiled pass loop (engine/fast_run.py
`run_passes`), as one named bundle: `WorkerArrays`, a Numba StructRef; and
the pass log buffer's arrays the loop writes, `PassLogArrays`.

The loop is entered at every outside event of an aggregated worker and, in a
disaggregated deployment, at nearly every event of each worker
(engine/fast_workers.py switches workers in their events' key order). Handed
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
the worker's state `ws` / `wt`, ...); `CompiledWorker._make_args` builds one,
again whenever one of its arrays is replaced by a larger one. The rank's `kv`
bundle stays an argument of the loop: it is None on a worker without a CPU
tier or remote KV, and the loop's code for it is chosen by that argument's
type when it compiles.
"""

from numba.experimental import structref

from servesim.bundles import BundleType, declare
from servesim.jit import njit

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


# the pass log buffer's arrays (engine/fast_run.py `PassLogBuffer`)
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
