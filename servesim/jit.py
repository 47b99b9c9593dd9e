"""Numba's `njit` with the project's settings: every kernel is cached on disk
(`cache=True`), so only the first run on a machine pays for compilation.

Numba is imported only by the modules that hold kernels, which the CLI imports
inside its commands: `servesim --help` never loads it.
"""

import numba


def njit(func=None, **options):
    options.setdefault("cache", True)
    options.setdefault("nogil", True)
    if func is None:
        return lambda f: numba.njit(**options)(f)
    return numba.njit(**options)(func)
