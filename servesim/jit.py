"""Numba's `njit` with the project's settings: every kernel is cached on disk
(`cache=True`), so only the first run on a machine pays for compilation.

The cache goes to a per-user folder, never into the package
(`servesim/cache.py`); it is set here, before Numba is first imported.
Numba is imported only by the modules that hold kernels, which the CLI imports
inside its commands: `servesim --help` never loads it.

Loading a cached kernel. Numba refreshes its target context before every
cache load (`Cache.load_overload`): the first refresh imports its whole
library of typings and lowerings (NumPy's, the random generators', typed
containers', ...), which only a compile uses. A cached kernel is machine code:
it needs the symbols of Numba's runtime (its C functions) and those every
target context registers when it is made, nothing of the registries, nor the
runtime's own LLVM module, which Numba compiles at start (a cached kernel
carries its copy of those functions). So a cache load here registers the
runtime's symbols only (`_load_without_refresh`, `_runtime_symbols`); a
compile still refreshes in full (Numba's compiler refreshes both contexts
itself, and so does a lookup of an implementation the context lacks). The
kernels' cached code declares only the runtime's C functions (`NRT_*`),
Numba's helpers' (`numba_*`), Python's C API and LLVM intrinsics
(tests/test_startup.py checks every kernel a few runs load). Unpickling a
cached kernel's environments would import the modules of Numba's own
overloads compiled into it (`numba.np.arrayobj`, `numba.np.arraymath`: most
of the lowerings again); those get their name only
(`_environments_without_imports`). Numba also checks that a kernel's cache
folder is writable by creating a temporary file in it, once per kernel when
its module is imported; here once per folder (`_check_cache_folders_once`).
Together a sixth of a warm tiny run's CPU time (benchmarks/RESULTS.md,
2026-12-07, "start-up").

The first refresh (a compile's) imports two modules that probe optional
packages servesim's kernels never use: SciPy (`numba.np.arraymath` checks for
BLAS by importing `scipy.linalg`, ~0.2-0.3 s) and cffi
(`numba.core.typing.cffi_utils`, with pycparser). Those two modules are
imported just before it with the probes answered "not installed" when the
packages are not loaded yet; np.dot and friends still find BLAS when a kernel
is compiled with them (Numba checks again then), only cffi functions as
kernel arguments and `_HAVE_BLAS` (BLAS inner products in np.dot's
small-case fallback) are off.

A kernel holds a reference count on every array it touches (Numba's NRT
`NRT_incref`/`NRT_decref`), and Numba makes each count an atomic (locked)
add, so that kernels on several threads may share an array. The pass loop
counts hundreds of millions of them on the whole Mooncake trace, and the
locks were half of its time. A process that runs kernels on one thread only
— the `servesim` command — asks for plain adds instead
(`single_thread_refcounts`, before its first kernel loads); `servesim.run()`
keeps Numba's atomic counts, as its caller may have threads.

Reference counts. The entry points the pass loop runs at every pass and rank
— `schedule`, `update_from_output` and `_allocate` (scheduler/), `run_passes`
(engine/pass_loop.py), `run_workers` and `run_cluster` (the loops over
workers) — are compiled without them (`_nrt=False`), and so is every kernel
they call that does not set the flag (Numba hands it down): counting each
array argument in and out, and every view the callees take, was a fifth of a
4-worker run's compiled time (benchmarks/RESULTS.md, 2026-12-06). Their
callers hold every array they hand over, so nothing is freed under them. Two
rules keep this sound, each marked `NOTE(refcounts)` where it is kept: a
kernel compiled without counts allocates nothing (Numba refuses one that
does), so those they reach that allocate say `_nrt=True` (`_schedule_waiting`,
the CPU tier's `prepare_store`, the debug mode's `_check_after` and
`_check_holders`); and a kernel they may reach hands back no array unless it
says `_nrt=True` (a counting caller would count it down once too often;
tests/test_compiled_loops.py watches the returns of every kernel the entry
points reach).

That command also runs without Python's cyclic garbage collector, except while
Numba compiles (`collecting_while_compiling`): what it creates while it
imports, loads cached kernels and simulates lives until it exits, so the
collections there (two full ones among them, in Numba's start-up) found
nothing and cost 0.1-0.16 s a run. Numba's compiler does leave cycles (a cold
cache's first run peaks ~200 MB higher without them collected): during a
compile the collector runs, over the compile's own objects only (what lived
before is frozen first, so its full collections took ~2.5 s of a cold run
rather than ~4.9 s), and collects them when it ends.
"""

import contextlib
import gc
import inspect
import sys

from servesim.cache import configure_numba

configure_numba()

import numba  # noqa: E402  (after the cache folder is set)
import numpy as np  # noqa: E402

_SKIPPED_PROBES = ("scipy.linalg", "cffi")  # (numba itself imports scipy: cheap)


def _import_without_probes():
    """Import Numba's two probing modules with scipy.linalg and cffi reading as
    absent (a None in sys.modules makes `import` raise ImportError), then
    let them be imported normally again."""
    if "numba.np.arraymath" in sys.modules and "numba.core.typing.cffi_utils" in sys.modules:
        return
    blocked = [name for name in _SKIPPED_PROBES if name not in sys.modules]
    for name in blocked:
        sys.modules[name] = None
    try:
        import numba.core.typing.cffi_utils  # noqa: F401
        import numba.np.arraymath  # noqa: F401
    finally:
        for name in blocked:
            if sys.modules.get(name, 0) is None:
                del sys.modules[name]


def _load_without_refresh() -> bool:
    """Cache loads that start Numba's runtime but do not refresh the target
    context (module docstring); a context's first refresh imports the probing
    modules without their probes (`_import_without_probes`). Does nothing if
    Numba's methods are not the ones this was written for (then every load
    refreshes, as in Numba). Returns whether loads skip the refresh."""
    from numba.core import caching, cpu
    from numba.core.runtime import nrt

    load = caching.Cache.load_overload
    if getattr(load, "without_refresh", False):
        return True
    if load.__code__.co_names != ("refresh", "_guard_against_spurious_io_errors", "_load_overload") \
            or not hasattr(nrt.rtsys, "initialize"):
        return False
    start = _runtime_symbols(nrt)

    def load_overload(self, sig, target_context):
        """Numba's `Cache.load_overload` without `target_context.refresh()`."""
        start(target_context)
        with self._guard_against_spurious_io_errors():
            return self._load_overload(sig, target_context)

    refresh = cpu.CPUContext.refresh

    def refresh_without_probes(self):
        _import_without_probes()
        refresh(self)

    load_overload.without_refresh = True
    caching.Cache.load_overload = load_overload
    cpu.CPUContext.refresh = refresh_without_probes
    _environments_without_imports()
    return True


def _runtime_symbols(nrt):
    """What a cache load starts of Numba's runtime: the symbols of its C
    functions (`NRT_MemInfo_alloc`, ...), which cached code calls. Numba's
    `rtsys.initialize` also compiles the runtime's LLVM module (reference
    counts, atomic adds), ~30 ms in every process; a cached kernel carries its
    own copy of those functions (linked in when it was compiled), so only a
    compile needs it, and a compile's refresh initializes the runtime in full.
    Numba's own `initialize` when its code is not what this was written for."""
    import inspect

    from llvmlite import binding as ll
    from numba.core import config

    runtime = type(nrt.rtsys)
    names = inspect.unwrap(runtime.initialize).__code__.co_names
    helpers = getattr(getattr(nrt, "_nrt", None), "c_helpers", None)
    if not isinstance(helpers, dict) or names != (
            "_init", "config", "NRT_STATS", "_nrt", "memsys_enable_stats", "c_helpers",
            "startswith", "ll", "add_symbol", "nrtdynmod", "compile_nrt_functions", "_library"):
        return lambda ctx: nrt.rtsys.initialize(ctx)
    started = []

    def start(ctx):
        if started or nrt.rtsys._init:
            return
        with nrt.global_compiler_lock:
            if config.NRT_STATS:
                nrt._nrt.memsys_enable_stats()
            for name, address in helpers.items():  # as Numba's initialize names them
                ll.add_symbol(name if name.startswith("_") else "NRT_" + name, address)
            started.append(True)

    return start


def _environments_without_imports() -> None:
    """A cached kernel's environments (one per function compiled into it,
    Numba's own overloads among them) are unpickled with their module's
    globals, which imports the module: for `numba.np.arrayobj` and
    `numba.np.arraymath`, most of Numba's lowerings. Only code compiled in
    object mode reads an environment's globals (njit kernels never do), so
    the environment of a Numba module not imported yet gets its name only."""
    from numba.core import environment

    rebuild = environment._rebuild_env
    if getattr(rebuild, "without_imports", False) or rebuild.__code__.co_varnames[:3] \
            != ("modname", "consts", "env_name") or not hasattr(environment, "lookup_environment"):
        return

    def rebuild_env(modname, consts, env_name):
        if not isinstance(modname, str) or not modname.startswith("numba.") or modname in sys.modules:
            return rebuild(modname, consts, env_name)
        env = environment.lookup_environment(env_name)
        if env is None:
            env = environment.Environment({"__name__": modname})
            env.consts[:] = consts
            env.env_name = env_name
            environment.Environment._memo[env_name] = env
        return env

    rebuild_env.without_imports = True
    environment._rebuild_env = rebuild_env


def _check_cache_folders_once() -> None:
    """Numba's check that a kernel's cache folder can be written (a
    temporary file created in it, for every kernel a module defines), once
    per folder and process."""
    from numba.core import caching

    ensure = caching._CacheLocator.ensure_cache_path
    if getattr(ensure, "once", False) or ensure.__code__.co_names[:1] != ("get_cache_path",):
        return
    checked = set()

    def ensure_cache_path(self):
        path = self.get_cache_path()
        if path not in checked:
            ensure(self)
            checked.add(path)

    ensure_cache_path.once = True
    caching._CacheLocator.ensure_cache_path = ensure_cache_path


if not _load_without_refresh():
    _import_without_probes()  # Numba's own loads refresh: the probes come at the first
_check_cache_folders_once()

configure_numba()  # now on Numba's config: this source state's sub-folder


def single_thread_refcounts() -> bool:
    """Make Numba's reference counts plain (non-atomic) adds for this
    process: only for a process whose kernels all run on one thread (see the
    module docstring). It must come before Numba's runtime starts (the first
    kernel compiled or loaded); it does nothing then, or if Numba's runtime
    module is not the one this was written for (then counts stay atomic).
    Returns whether the counts are plain. Nothing cached changes: a cached
    kernel calls the `NRT_incref` of the process that loads it."""
    try:
        from llvmlite import ir
        from numba.core.runtime import nrt, nrtdynmod
    except ImportError:  # pragma: no cover - Numba's layout changed
        return False
    define = getattr(nrtdynmod, "_define_atomic_inc_dec", None)
    word = getattr(nrtdynmod, "_word_type", None)
    if define is None or word is None or getattr(nrt.rtsys, "_init", True):
        return getattr(define, "plain_refcounts", False)
    import inspect

    if list(inspect.signature(define).parameters) != ["module", "op", "ordering"]:
        return False  # not the function this replaces: counts stay atomic

    def define_plain_inc_dec(module, op, ordering):
        """`nrt_atomic_add` / `nrt_atomic_sub` as nrtdynmod names them
        (they return the new count), without the lock."""
        fn = ir.Function(module, ir.FunctionType(word, [word.as_pointer()]),
                         name=f"nrt_atomic_{op}")
        [ptr] = fn.args
        builder = ir.IRBuilder(fn.append_basic_block())
        new = getattr(builder, op)(builder.load(ptr), ir.Constant(word, 1))
        builder.store(new, ptr)
        builder.ret(new)
        return fn

    define_plain_inc_dec.plain_refcounts = True
    nrtdynmod._define_atomic_inc_dec = define_plain_inc_dec
    return True


def refcounts_are_plain() -> bool:
    """Whether this process counts Numba's references with plain adds
    (`single_thread_refcounts` took effect)."""
    from numba.core.runtime import nrtdynmod

    define = getattr(nrtdynmod, "_define_atomic_inc_dec", None)
    return bool(getattr(define, "plain_refcounts", False))


@contextlib.contextmanager
def collecting_while_compiling():
    """Within (for the `servesim run` command, which turns Python's cyclic
    garbage collector off: module docstring): the collector on while Numba
    compiles a kernel (its `numba:compile` event, a cache miss), over the
    compile's objects only, which it collects at the end."""
    from numba.core import event

    class CollectWhileCompiling(event.Listener):
        depth = 0
        was_enabled = False

        def on_start(self, ev):
            self.depth += 1
            if self.depth == 1:  # what lives now is for good: collect the compile's only
                self.was_enabled = gc.isenabled()
                gc.freeze()
                gc.enable()

        def on_end(self, ev):
            self.depth -= 1
            if not self.depth:  # the compile's leftovers are garbage now
                gc.collect()
                if not self.was_enabled:
                    gc.disable()

    listener = CollectWhileCompiling()
    event.register("numba:compile", listener)
    try:
        yield
    finally:
        event.unregister("numba:compile", listener)


def njit(func=None, **options):
    """`numba.njit` with the project's settings (module docstring), each
    kernel typed from other kernels without literal arguments
    (`_without_literals`)."""
    options.setdefault("cache", True)
    options.setdefault("nogil", True)
    if func is None:
        return lambda f: njit(f, **options)
    dispatcher = numba.njit(**options)(func)
    if hasattr(dispatcher, "get_call_template"):  # (not as plain Python)
        _without_literals(dispatcher)
    return dispatcher


def _without_literals(dispatcher):
    """Make the calls of other kernels compile `dispatcher` for their
    arguments' plain types. Numba types a constant argument of a call from
    compiled code as a literal (`_before(t, DECIDE, ...)`: `Literal[int](2)`)
    and compiles the callee once for each such signature: `_before` three
    times, `allocate_slots` and `_allocate` twice, in every run (~1 s of a
    cold run's compile; nothing in servesim's kernels is typed by a literal
    argument's value). The plain signature is tried first, the literal one
    only if typing it fails (as Numba's own resolution of overloads falls
    back the other way). What a kernel computes does not change: a literal
    only lets Numba prune a branch its value never takes."""
    from numba.core import errors, types

    typed = dispatcher.get_call_template

    def get_call_template(args, kws):
        plain = tuple(types.unliteral(a) for a in args)
        plain_kws = {k: types.unliteral(v) for k, v in kws.items()}
        if plain != tuple(args) or plain_kws != kws:
            try:
                return typed(plain, plain_kws)
            except errors.TypingError:
                pass
        return typed(args, kws)

    dispatcher.get_call_template = get_call_template


def plain_python() -> bool:
    """Whether the kernels run as plain Python (NUMBA_DISABLE_JIT=1, for
    debugging: a breakpoint or a print inside the scheduler works)."""
    return bool(numba.config.DISABLE_JIT)


def records(n, dtype):
    """`n` zeroed records of the structured `dtype`: the request table, a
    scheduler's config and state. The kernels read a record's fields as
    attributes (`R[i].num_tokens`), which Numba compiles; NumPy answers it
    only on a record array, so as plain Python (`plain_python`) it is one."""
    import numpy as np

    array = np.zeros(n, dtype=dtype)
    return array.view(np.recarray) if plain_python() else array


def _folded(dispatcher, args) -> bool:
    """Whether `args` are as the dispatcher's own call hands them to the
    function it compiled: every parameter given by position, the values of a
    `*` parameter as one tuple (a bundle's constructor, `*fields`, takes one
    tuple argument)."""
    code = dispatcher.py_func.__code__
    star = bool(code.co_flags & inspect.CO_VARARGS)
    return (not code.co_kwonlyargcount and len(args) == code.co_argcount + star
            and (not star or type(args[-1]) is tuple))


_COMPILED = {}  # (kernel, `types_key` of its arguments) -> its function compiled for them
_MAX_COMPILED = 256  # more than that and they are looked up again


def compile_for(dispatcher, args):
    """The function `dispatcher` (a kernel) compiled for `args`' types, for a
    caller that calls it again and again with arguments of those types:
    called directly, it skips the dispatcher's resolution of every
    argument's type at each call — for a structured array (the request
    table, a scheduler's state) that goes through Python, ~0.1-1 ms each.
    Found by the arguments' `types_key` when a call (of any caller: each run
    makes its bundles and loops anew) had arguments of those types; else the
    types are resolved once here, as the dispatcher's own call resolves
    them, and the function loaded from the cache or compiled as that call
    would (`Dispatcher.compile`). `args` as the dispatcher folds them
    (`_folded`). None as plain Python, for other `args`, or when compiling
    fails (the caller then calls the dispatcher, which reports why). The
    caller must call it with arguments of exactly those types (it does not
    check them)."""
    if plain_python() or not _folded(dispatcher, args):
        return None
    key = (dispatcher, types_key(args))
    function = _COMPILED.get(key)
    if function is None:
        try:
            function = dispatcher.compile(tuple(dispatcher.typeof_pyval(a) for a in args))
        except Exception:
            return None
        if len(_COMPILED) >= _MAX_COMPILED:
            _COMPILED.clear()
        _COMPILED[key] = function
    return function


_SCALAR_TYPES = {float: numba.types.float64, bool: numba.types.boolean,
                 type(None): numba.types.none}  # (as `numba.typeof` types them)
_KEPT_DTYPES = {}  # id -> dtype: each dtype `types_key` named, kept so that no other takes its id


def _type_key(value):
    """`types_key` of one value."""
    if type(value) is np.ndarray:
        dtype = value.dtype
        if _KEPT_DTYPES.get(id(dtype)) is not dtype:
            _KEPT_DTYPES[id(dtype)] = dtype
        flags = value.flags
        return (id(dtype), value.ndim, flags.c_contiguous, flags.f_contiguous, flags.writeable)
    if type(value) is tuple:
        return (tuple, *map(_type_key, value))
    bundle_type = getattr(value, "_numba_type_", None)  # (what `numba.typeof` reads first)
    if bundle_type is not None:
        return bundle_type
    return _SCALAR_TYPES.get(type(value)) or numba.typeof(value)


def types_key(values) -> tuple:
    """A key of the Numba types of `values`, made without typing their
    arrays: equal keys, equal types. Numba types an array (typeof.py
    `_typeof_ndarray`) by its dtype, its number of dimensions, its layout
    (C, else F, else A contiguous) and whether it is writeable; here the
    dtype goes by identity, since equal dtypes may be different Numba types
    (of another alignment flag) — the same dtype under another object only
    makes another key. A tuple goes by its items; anything else (a bundle,
    a number, None) by its Numba type."""
    return tuple(map(_type_key, values))


def one_type(arguments) -> bool:
    """Whether every tuple in `arguments` has the same Numba type (true of
    none or one): by `types_key` when their keys agree, which they do when
    they hold the same dtypes (a worker's arguments, made by one builder),
    else by `numba.typeof` (equal types under other dtype objects)."""
    if len({types_key(args) for args in arguments}) <= 1:
        return True
    return len({numba.typeof(args) for args in arguments}) <= 1


def _give_back(args):
    """Give back the reference Numba's call took on each bundle in `args`
    (tuples searched too): see `Entry`."""
    from numba.experimental.structref import StructRefProxy

    for a in args:
        if isinstance(a, StructRefProxy):
            a._meminfo.release()
        elif isinstance(a, tuple):
            _give_back(a)


def _bundle_paths(args, prefix=()) -> tuple:
    """Where the bundles of `args` are (tuples searched too), as index paths:
    the same for any arguments of the same Numba types."""
    from numba.experimental.structref import StructRefProxy

    paths = []
    for k, a in enumerate(args):
        if isinstance(a, StructRefProxy):
            paths.append((*prefix, k))
        elif isinstance(a, tuple):
            paths.extend(_bundle_paths(a, (*prefix, k)))
    return tuple(paths)


def _give_back_at(args, paths):
    """`_give_back` of the bundles at `paths` (`_bundle_paths` of arguments of
    `args`' types), without searching `args` again."""
    for path in paths:
        value = args
        for k in path:
            value = value[k]
        value._meminfo.release()


class Entry:
    """A kernel that one caller calls again and again with arguments of the
    same types (a worker's pass loop, the loops over workers): the first
    call resolves their types and compiles or loads the function for them
    (`compile_for`), every call goes straight to it.
    `reset()` when the arguments' types may change.

    NOTE(refcounts): Numba's call from Python takes a reference on every
    bundle (servesim/bundles.py) it hands a kernel, for the kernel to give
    back when it returns; a kernel compiled without reference counts never
    does, so after each call of one the references taken are given back
    here (`_give_back`), or every bundle it was ever handed, and all the
    arrays it holds, would outlive the run."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.function = None
        self.uncounted = getattr(kernel, "targetoptions", {}).get("_nrt") is False
        self.bundles = None  # where the bundles of the arguments are (`_bundle_paths`)

    def __call__(self, *args):
        if self.function is None:
            self.function = compile_for(self.kernel, args)
            # (the function is for these types only: its arguments' bundles stay where they are)
            self.bundles = _bundle_paths(args) if self.function is not None else None
            self.function = self.function or self.kernel
        result = self.function(*args)
        if self.uncounted:
            if self.bundles is None:
                _give_back(args)
            else:
                _give_back_at(args, self.bundles)
        return result

    def reset(self):
        self.function = None
