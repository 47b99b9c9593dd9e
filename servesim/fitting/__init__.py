"""Calibrate pass times from measured forward-pass records (docs/fitting.md).

`records` reads and validates the JSONL records; `launch_stall` moves each
pass's launch back to its own record (`--launch-stall`); `fit` fits the
`fitted` model per record or on windows (`--window`) and writes the model file;
`evaluate` scores a model per pass kind (the `fit` and `evaluate` click
commands are in `servesim.cli.fitting`). NumPy only (no Numba).

The names below are imported on first use, so `servesim --help` (which
imports `servesim.cli.fitting`) does not load NumPy.
"""

import importlib

_EXPORTS = {
    "ForwardPassRecords": "records", "read_records": "records", "parse_records": "records",
    "DECODE": "records", "PIECEWISE": "records", "EAGER": "records", "KIND_NAMES": "records",
    "charge_own_launch": "launch_stall", "load_launch_stall": "launch_stall",
    "Fit": "fit", "fit_records": "fit", "fit_windows": "fit", "window_bounds": "fit",
    "write_model": "fit",
    "evaluate_records": "evaluate", "predict": "evaluate",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'servesim.fitting' has no attribute {name!r}")
    return getattr(importlib.import_module(f"servesim.fitting.{module}"), name)
