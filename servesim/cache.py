"""Where servesim keeps its per-user cache: Numba's compiled kernels.

Numba's `cache=True` writes its files next to the source by default, i.e.
inside the installed package (`site-packages/servesim/*/__pycache__/`), where
they outlive an uninstall and turn the leftover folders into a namespace
package that shadows a later install. servesim therefore points Numba's cache
at a per-user folder before Numba is imported:

1. `$SERVESIM_CACHE_DIR/numba` when SERVESIM_CACHE_DIR is set;
2. else `$NUMBA_CACHE_DIR` when the user set it;
3. else `$XDG_CACHE_HOME/servesim/numba`, or `~/.cache/servesim/numba`.

Inside that folder the kernels live in a sub-folder named after the content of
every kernel source (`sources_key`): Numba checks only the timestamp of a
kernel's own file, so a kernel that inlines one from another module (the pass
loop calls the scheduler's, the scheduler the block pool's) would otherwise
keep running the old code after that module changed — after an upgrade, or
an edit. Sub-folders of other source states unused for `STALE_DAYS` are
removed.

This module imports nothing heavy: the compile's progress
(servesim/cli/compile_progress.py) asks it which kernels are cached
(`kernel_cached`) to expect the rest.
"""

import hashlib
import os
from pathlib import Path

# Modules whose Numba kernels every run compiles (others, such as the async
# release kernels, compile only for the configs that use them).
KERNEL_MODULES = ("kvcache/block_pool.py", "engine/pricing.py", "results/metrics.py", "workload/prefix.py")
PACKAGE_DIR = Path(__file__).resolve().parent


STALE_DAYS = 14
_key = None
_JIT = b"servesim" + b".jit"  # (spelt apart: this module holds no kernels)


def sources_key() -> str:
    """A digest of every module that holds kernels (its text names the jit
    module, dotted: an import of it, even inside a function, as request.py's,
    whose enums kernels compile in), path and content: the cache sub-folder of
    this source state. This module avoids that name, so an edit here
    recompiles nothing."""
    global _key
    if _key is None:
        h = hashlib.sha1()
        for path in sorted(PACKAGE_DIR.rglob("*.py")):
            data = path.read_bytes()
            if _JIT in data or path.name == "jit.py":  # jit.py: the options
                h.update(str(path.relative_to(PACKAGE_DIR)).encode() + b"\0" + data + b"\0")
        _key = h.hexdigest()[:16]
    return _key


def cache_root() -> str:
    """The folder holding every source state's kernels (see the module docstring)."""
    root = os.environ.get("SERVESIM_CACHE_DIR")
    if root:
        return os.path.join(os.path.expanduser(root), "numba")
    given = os.environ.get("NUMBA_CACHE_DIR")
    if given:
        return os.path.expanduser(given)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "servesim", "numba")


def numba_cache_dir() -> str:
    """The folder Numba's cache goes to: this source state's sub-folder of
    `cache_root()`, or its own beside it for kernels compiled with every index
    checked (NUMBA_BOUNDSCHECK=1: Numba's cache does not tell the two apart)."""
    key = sources_key()
    if os.environ.get("NUMBA_BOUNDSCHECK", "").strip() == "1":
        key += "-boundscheck"
    return os.path.join(cache_root(), key)


def _remove_stale(root: str, keep: str) -> None:
    """Remove the sub-folders of other source states unused for STALE_DAYS
    (a folder's mtime changes when Numba writes an index into it)."""
    import shutil
    import time

    try:
        entries = list(os.scandir(root))
    except OSError:
        return
    limit = time.time() - STALE_DAYS * 86400
    for entry in entries:
        if (entry.name == keep or len(entry.name.removesuffix("-boundscheck")) != 16
                or not entry.is_dir()):
            continue
        try:
            if entry.stat().st_mtime < limit:
                shutil.rmtree(entry.path, ignore_errors=True)
        except OSError:
            pass


def configure_numba() -> str:
    """Point Numba's cache at `numba_cache_dir()`. The environment gets the
    root (before Numba is imported; a child process then keys its own
    sources under it), Numba's config this source state's folder (once
    imported: the jit module calls this again after importing it). Returns
    the folder."""
    import sys

    folder = numba_cache_dir()
    os.environ["NUMBA_CACHE_DIR"] = cache_root()
    config = sys.modules.get("numba.core.config")
    if config is not None:
        config.CACHE_DIR = folder
        _remove_stale(cache_root(), os.path.basename(folder))
    return folder


def _subfolder(source_dir: str) -> str:
    """Numba's cache sub-folder for the sources in `source_dir` (as
    numba.core.caching's `get_suitable_cache_subpath` names it)."""
    return "_".join([os.path.basename(source_dir), hashlib.sha1(source_dir.encode()).hexdigest()])


def kernel_cached(path: str, qualname: str) -> bool:
    """Whether the cache holds an index of the kernel `qualname` of the
    module at `path` (relative to the package, as the compile log names it)."""
    source = PACKAGE_DIR / path
    folder = Path(numba_cache_dir()) / _subfolder(str(source.parent))
    try:
        return any(folder.glob(f"{source.stem}.{qualname}-*.nbi"))
    except OSError:
        return False


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
