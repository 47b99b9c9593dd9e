"""Numba's `njit` with the project's settings: every kernel is cached on disk
(`cache=True`), so only the first run on a machine pays for compilation.

The cache goes to a per-user folder, never into the package
(`servesim/cache.py`); it is set here, before Numba is first imported.
Numba is imported only by the modules that hold kernels, which the CLI imports
inside its commands: `servesim --help` never loads it.

Loading the first kernel makes Numba import its whole library of lowerings,
and two of those probe optional packages servesim's kernels never use: SciPy
(`numba.np.arraymath` checks for BLAS by importing `scipy.linalg`, ~0.2-0.3 s)
and cffi (`numba.core.typing.cffi_utils`, with pycparser). Those two modules
are imported here with the probes answered "not installed" when the packages
are not loaded yet; np.dot and friends still find BLAS when a kernel is
compiled with them (Numba checks again then), only cffi functions as kernel
arguments and `_HAVE_BLAS` (BLAS inner products in np.dot's
small-case fallback) are off.
"""

import sys

from servesim.cache import configure_numba

configure_numba()

import numba  # noqa: E402  (after the cache folder is set)

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


_import_without_probes()

configure_numba()  # now on Numba's config: this source state's sub-folder


def njit(func=None, **options):
    options.setdefault("cache", True)
    options.setdefault("nogil", True)
    if func is None:
        return lambda f: numba.njit(**options)(f)
    return numba.njit(**options)(func)
