"""A worker's arrays for its compiled pass loop (engine/fast_run.py
`run_passes`), as one named bundle: `WorkerArrays`, a Numba StructRef.

The loop is entered at every outside event of an aggregated worker and, in a
disaggregated deployment, at nearly every event of each worker
(engine/fast_workers.py switches workers in their events' key order). Handed
over as ~45 positional arrays and per-rank tuples of arrays, entering it cost
a reference count on and off for each of them and a copy of every array's
descriptor, a few µs a switch; a StructRef is handed over as one pointer, and
its fields are read where they are used.

A field is read through the bundle's MemInfo without the runtime's helper
(`_payload`), so that the loop can be compiled without Numba's reference
counts (servesim/scheduler/fast.py, "Reference counts"): Numba's own
StructRef reads call that helper, which such kernels may not.

The fields carry the names the loop's docstring uses (the request table `R`,
its `idents` and block `tables`, the scheduler's `cfg`, each rank's arrays as
tuples `*_t`, the batch queue's `outs` / `feats` / `pidx` / `ptime` / `pseq`,
the worker's state `ws` / `wt`, ...); `CompiledWorker._make_args` builds one,
again whenever one of its arrays is replaced by a larger one. The rank's `kv`
bundle stays an argument of the loop: it is None on a worker without a CPU
tier or remote KV, and the loop's code for it is chosen by that argument's
type when it compiles.
"""

from numba.core import cgutils, imputils, types
from numba.core.datamodel import default_manager, models
from numba.core.runtime.nrtdynmod import _meminfo_struct_type
from numba.core.typing.templates import AttributeTemplate
from numba.experimental import structref
from numba.extending import infer_getattr, lower_getattr_generic, lower_setattr_generic

from servesim.jit import njit, plain_python

FIELDS = (
    # the request table and what every rank shares
    "R", "idents", "tables", "cfg", "client_ms", "token_offsets", "last_client",
    "detokenize_ms", "arrival_ms",
    # each attention-DP rank's (tuples, `padded`)
    "blocks_t", "idmap_t", "pscal_t", "S_t", "running_t", "wq_t", "spec_t", "held_t",
    # KV usage, counters and pricing
    "usage", "counters", "model", "params", "kv_capacity", "num_gpu_blocks", "launch",
    # disaggregated mode: each rank's sender or receiver, the handoffs' transfers
    "side_pending_t", "side_state_t", "side_log_t", "XI", "XF", "link_free", "link_of",
    "xparams",
    # the batch queue, the worker's state, transfer wakes, what the loop hands back
    "outs", "feats", "pidx", "ptime", "pseq", "ws", "wt", "xw_t", "xw_s", "finished",
    "taken", "pulls",
)


class WorkerArraysType(types.StructRef):
    def preprocess_fields(self, fields):
        return tuple((name, types.unliteral(typ)) for name, typ in fields)


default_manager.register(WorkerArraysType, models.StructRefModel)


@infer_getattr
class _Fields(AttributeTemplate):
    key = WorkerArraysType

    def generic_resolve(self, typ, attr):
        return typ.field_dict.get(attr)


def _payload(context, builder, typ, val):
    """The bundle's fields, read through its MemInfo's data pointer without
    the runtime's helper (which kernels compiled without reference counts
    may not call): the same load `NRT_MemInfo_data_fast` makes."""
    meminfo = cgutils.create_struct_proxy(typ)(context, builder, value=val).meminfo
    mi = builder.bitcast(meminfo, _meminfo_struct_type.as_pointer())
    data = builder.load(cgutils.gep_inbounds(builder, mi, 0, 3))
    payload_type = typ.get_data_type()
    ptr = builder.bitcast(data, context.get_value_type(payload_type).as_pointer())
    return cgutils.create_struct_proxy(payload_type)(context, builder, ref=ptr)


@lower_getattr_generic(WorkerArraysType)
def _getattr(context, builder, typ, val, attr):
    value = getattr(_payload(context, builder, typ, val), attr)
    return imputils.impl_ret_borrowed(context, builder, typ.field_dict[attr], value)


@lower_setattr_generic(WorkerArraysType)
def _setattr(context, builder, sig, args, attr):
    typ, value_type = sig.args
    instance, value = args
    payload = _payload(context, builder, typ, instance)
    value = context.cast(builder, value, value_type, typ.field_dict[attr])
    old = getattr(payload, attr)
    context.nrt.incref(builder, value_type, value)
    context.nrt.decref(builder, value_type, old)
    setattr(payload, attr, value)


class WorkerArrays(structref.StructRefProxy):
    """One worker's arrays, in the order of `FIELDS` (make with
    `new_worker_arrays`: its constructor is compiled once and cached)."""


structref.define_proxy(WorkerArrays, WorkerArraysType, list(FIELDS))


@njit
def _new_worker_arrays(*fields):
    return WorkerArrays(*fields)


class PlainWorkerArrays:
    """The bundle when the kernels run as plain Python (servesim/jit.py
    `plain_python`): the same fields, as attributes."""

    __slots__ = FIELDS

    def __init__(self, *fields):
        for name, value in zip(FIELDS, fields, strict=True):
            setattr(self, name, value)


def new_worker_arrays(*fields):
    """A `WorkerArrays` of `fields` (in `FIELDS` order), made by a compiled
    and cached constructor (the proxy's own would compile in every
    process); a `PlainWorkerArrays` as plain Python."""
    if plain_python():
        return PlainWorkerArrays(*fields)
    return _new_worker_arrays(*fields)
