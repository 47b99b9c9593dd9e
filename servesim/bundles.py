"""Named bundles of arrays for the kernels: Numba StructRefs whose fields a
kernel reads as `bundle.name`, handed from kernel to kernel as one pointer.

A kernel that took each array as its own argument copied every array's
descriptor (seven words or more) at each call, and named its arguments by
position; the scheduler's kernels took 14 to 22 of them, the pass loop ~45.
A bundle is one argument, its fields carry the names the kernels use, and a
field is read where it is used.

The fields are read through the bundle's MemInfo without the runtime's
helper (`_payload`), so that kernels compiled without Numba's reference
counts (servesim/jit.py, "Reference counts") may read them:
Numba's own StructRef reads call that helper, which such kernels may not.

A bundle is declared by a `BundleType` subclass and a proxy class, named
in its module (their names are how Numba's cache finds the kernels that take
them), and a constructor, a cached kernel of that module returning
`Proxy(*fields)` (the proxy's own would compile in every process); then
`declare(type, proxy, fields, constructor)` registers it and returns the
function that makes one. As plain Python (servesim/jit.py `plain_python`) a
bundle is a `PlainBundle` of the same fields.

A loop over many bundles of one type (a pool's workers, its ranks for the
routing rules) takes them as an array of their addresses and the first of
them, and reads bundle k with `bundle_at`: a tuple's length is part of its
type, so a tuple of them compiled the loop once per length, its code growing
with it; by address it compiles once for any number.
"""

import numpy as np
from numba.core import cgutils, imputils, types
from numba.core.datamodel import default_manager, models
from numba.core.runtime.nrtdynmod import _meminfo_struct_type
from numba.core.typing.templates import AttributeTemplate
from numba.experimental import structref
from numba.extending import (infer_getattr, intrinsic, lower_getattr_generic, lower_setattr_generic,
                             overload)

from servesim.jit import compile_for, njit, plain_python


class BundleType(types.StructRef):
    """The Numba type of a bundle (subclassed once per bundle)."""

    def preprocess_fields(self, fields):
        return tuple((name, types.unliteral(typ)) for name, typ in fields)


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


def _getattr(context, builder, typ, val, attr):
    value = getattr(_payload(context, builder, typ, val), attr)
    return imputils.impl_ret_borrowed(context, builder, typ.field_dict[attr], value)


def _setattr(context, builder, sig, args, attr):
    # (the bundle's constructor sets each field with it; kernels set none)
    typ, value_type = sig.args
    instance, value = args
    payload = _payload(context, builder, typ, instance)
    value = context.cast(builder, value, value_type, typ.field_dict[attr])
    old = getattr(payload, attr)
    context.nrt.incref(builder, value_type, value)
    context.nrt.decref(builder, value_type, old)
    setattr(payload, attr, value)


def _register(type_class, proxy_class, fields):
    """Make `type_class` (a `BundleType`) and `proxy_class` (a
    `structref.StructRefProxy`) a bundle of `fields`, read and written
    without the runtime's helper."""
    default_manager.register(type_class, models.StructRefModel)

    class _Fields(AttributeTemplate):
        key = type_class

        def generic_resolve(self, typ, attr):
            return typ.field_dict.get(attr)

    infer_getattr(_Fields)
    lower_getattr_generic(type_class)(_getattr)
    lower_setattr_generic(type_class)(_setattr)
    structref.define_proxy(proxy_class, type_class, list(fields))


class PlainBundle:
    """A bundle when the kernels run as plain Python: its fields as
    attributes (subclassed with the bundle's `__slots__`)."""

    __slots__ = ()

    def __init__(self, *fields):
        for name, value in zip(self.__slots__, fields, strict=True):
            setattr(self, name, value)


def declare(type_class, proxy_class, fields, constructor):
    """Register the bundle (module docstring) and return the function that
    makes one of `fields`' values, in their order: `constructor` compiled,
    a `PlainBundle` as plain Python."""
    _register(type_class, proxy_class, fields)
    plain = type("Plain" + proxy_class.__name__, (PlainBundle,), {"__slots__": tuple(fields)})

    def make(*values):
        # (through `compile_for`, which takes the `*fields` as one tuple: the
        # dispatcher's call typed every array again, each run, a structured
        # one through Python, ~2.5 ms of a small disaggregated run's setup)
        if plain_python():
            return plain(*values)
        function = compile_for(constructor, (values,))
        return constructor(*values) if function is None else function(values)

    make.__doc__ = f"A `{proxy_class.__name__}` of the values of `{fields}`, in order."
    return make


# -- bundles by address: a loop over any number of them, compiled once ----------


@intrinsic
def _address(typingctx, bundle):
    """The address of `bundle`'s MemInfo (an int64)."""
    if not isinstance(bundle, BundleType):
        return None

    def codegen(context, builder, sig, args):
        meminfo = cgutils.create_struct_proxy(sig.args[0])(context, builder, value=args[0]).meminfo
        return builder.ptrtoint(meminfo, context.get_value_type(types.int64))

    return types.int64(bundle), codegen


@intrinsic
def _bundle_at(typingctx, addresses, k, like):
    """The bundle of `like`'s type whose MemInfo is at `addresses[k]`
    (`bundle_at`). A kernel compiled with reference counts gets a new
    reference (it counts it down when done); one compiled without them
    gets the bundle as its caller holds it."""
    if not isinstance(like, BundleType):
        return None

    def codegen(context, builder, sig, args):
        array_type = sig.args[0]
        array = context.make_array(array_type)(context, builder, args[0])
        address = builder.load(cgutils.get_item_pointer(context, builder, array_type, array,
                                                        [args[1]]))
        bundle = cgutils.create_struct_proxy(sig.args[2])(context, builder)
        meminfo_type = bundle._get_ptr_by_name("meminfo").type.pointee
        bundle.meminfo = builder.inttoptr(address, meminfo_type)
        value = bundle._getvalue()
        if context.enable_nrt:
            context.nrt.incref(builder, sig.args[2], value)
        return value

    return like(addresses, k, like), codegen


def bundle_at(addresses, k, like):
    """Bundle k of `addresses` (`addresses_of`), of the type of `like` (one of
    them): a loop over many bundles of one type takes them as an array of
    addresses and one of them, and is compiled once whatever their number
    (a tuple of them would compile once per length, its code growing with
    it). Their holder keeps them alive while the loop runs. As plain Python
    `addresses` is the list of bundles.

    NOTE(refcounts): inlined into its caller, as is every kernel that hands
    on what it returns (routing.py `rank_at`), so that the reference
    `_bundle_at` gives is of its caller's kind. A function of its own in
    between is compiled once, counting or not as its first caller did, and
    later callers of the other kind reuse it: a counting one inside a loop
    compiled without counts leaked every bundle it took (which test order
    compiled first decided it); the other way round it would free a bundle
    under its holder."""
    return addresses[k]


@overload(bundle_at, inline="always")
def _bundle_at_compiled(addresses, k, like):
    if isinstance(like, BundleType):
        return lambda addresses, k, like: _bundle_at(addresses, k, like)


@njit
def bundle_address(bundle):
    """`bundle`'s address (`addresses_of`)."""
    return _address(bundle)


def addresses_of(bundles) -> "np.ndarray | list":
    """The bundles' addresses, for `bundle_at` (as plain Python: the list)."""
    if plain_python():
        return list(bundles)
    return np.array([bundle_address(b) for b in bundles], dtype=np.int64)
