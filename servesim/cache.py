"""Where servesim keeps its per-user cache: Numba's compiled kernels.

Numba's `cache=True` writes its files next to the source by default, i.e.
inside the installed package (`site-packages/servesim/*/__pycache__/`), where
they outlive an uninstall and turn the leftover folders into a namespace
package that shadows a later install. servesim therefore points Numba's cache
at a per-user folder before Numba is imported:

1. `$SERVESIM_CACHE_DIR/numba` when SERVESIM_CACHE_DIR is set;
2. else `$NUMBA_CACHE_DIR` when the user set it;
3. else `$XDG_CACHE_HOME/servesim/numba`, or `~/.cache/servesim/numba`.

This module imports nothing heavy: the CLI asks it whether the kernels are
compiled yet (`kernels_cached`) to announce a cold start.
"""

import hashlib
import os
from pathlib import Path

# Modules whose Numba kernels every run compiles (others, such as the async
# release kernels, compile only for the configs that use them).
KERNEL_MODULES = ("kvcache/block_pool.py", "engine/pricing.py", "results/metrics.py", "workload/prefix.py")
PACKAGE_DIR = Path(__file__).resolve().parent
# What a first compile of every kernel takes (measured, README "Set up").
COLD_START_S = 20


def numba_cache_dir() -> str:
    """The folder Numba's cache goes to (see the module docstring)."""
    root = os.environ.get("SERVESIM_CACHE_DIR")
    if root:
        return os.path.join(os.path.expanduser(root), "numba")
    given = os.environ.get("NUMBA_CACHE_DIR")
    if given:
        return os.path.expanduser(given)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "servesim", "numba")


def configure_numba() -> str:
    """Point Numba's cache at `numba_cache_dir()`: through the environment
    before Numba is imported, and on its config if it already is. Returns
    the folder."""
    import sys

    folder = numba_cache_dir()
    os.environ["NUMBA_CACHE_DIR"] = folder
    config = sys.modules.get("numba.core.config")
    if config is not None:
        config.CACHE_DIR = folder
    return folder


def _subfolder(source_dir: str) -> str:
    """Numba's cache sub-folder for the sources in `source_dir` (as
    numba.core.caching's `get_suitable_cache_subpath` names it)."""
    return "_".join([os.path.basename(source_dir), hashlib.sha1(source_dir.encode()).hexdigest()])


def kernels_cached() -> bool:
    """Whether the kernels every run uses are in the cache (False: the next
    run compiles them, which takes seconds)."""
    root = Path(numba_cache_dir())
    for rel in KERNEL_MODULES:
        source = PACKAGE_DIR / rel
        folder = root / _subfolder(str(source.parent))
        try:
            if not any(folder.glob(source.stem + ".*.nbi")):
                return False
        except OSError:
            return False
    return True
