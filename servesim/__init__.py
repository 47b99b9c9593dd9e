"""servesim: a GPU-free simulator of LLM serving on vLLM engines.

`servesim.run(config) -> Report` is the Python API (README.md, "Errors and faults"). It is
imported lazily, so `import servesim` (and `servesim --help`) does not load
NumPy, Numba or the engine.
"""

__all__ = ["run", "Report", "InputError", "__version__"]

_LAZY = {
    "run": "servesim.replay.api",
    "Report": "servesim.replay.api",
    "InputError": "servesim.errors",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            value = version("servesim")
        except PackageNotFoundError:
            value = "0+unknown"
        globals()[name] = value
        return value
    raise AttributeError(f"module 'servesim' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
