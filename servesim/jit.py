"""Numba's `njit` with the project's settings: every kernel is cached on disk
(`cache=True`), so only the first run on a machine pays for compilation.

The cache goes to a per-user folder, never into the package
(`servesim/cache.py`); it is set here, before Numba is first imported.
Numba is imported only by the modules that hold kernels, which the CLI imports
inside its commands: `servesim --help` never loads it.
"""

from servesim.cache import configure_numba

configure_numba()

import numba  # noqa: E402  (after the cache folder is set)

configure_numba()  # now on Numba's config: this source state's sub-folder


def njit(func=None, **options):
    options.setdefault("cache", True)
    options.setdefault("nogil", True)
    if func is None:
        return lambda f: numba.njit(**options)(f)
    return numba.njit(**options)(func)
