"""Accuracy of the pass-time fits of fitting.md on synthetic records with a
known ground truth (tests/fpm_synth.py): every model is fitted on workload A
and scored on A and on B (a different pass mix) against each pass's own time.

    python benchmarks/fitting_accuracy.py                # prints the markdown table
    python benchmarks/fitting_accuracy.py --short-eager  # eager prefills of 4,097-8,000
                                                         # tokens: some raw records < 0

Columns: mean signed % error of the predicted time of decode passes against
their own time, and % error of the total predicted time against the total own
time. Rows: a fit on the raw records, after `--launch-stall` (the true stall
values), the window fit (`--window W`, no stall values), and naive fixed-size
windows of W records per worker cut anywhere (what `--window` avoids).
"""

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fpm_synth import EAGER_TOKENS, SHORT_EAGER_TOKENS, STALL, synth_workload  # noqa: E402
from servesim.fitting import (DECODE, charge_own_launch, fit_records,  # noqa: E402
                              fit_windows, predict)
from servesim.fitting.fit import fit_ols, window_sums  # noqa: E402

WINDOWS = (4, 8, 32)
CAPTURE_SIZE = 512  # `--capture-size` default; every synthetic decode pass is under it


def naive_window_fit(records, wall_ms, window: int):
    """OLS on sums over fixed windows of `window` consecutive records of a
    worker, cut anywhere (even where a launch stall crosses the cut)."""
    order = np.lexsort((records.counter, records.worker))
    worker = records.worker[order]
    first = np.r_[True, worker[1:] != worker[:-1]]
    run_start = np.maximum.accumulate(np.where(first, np.arange(len(order)), 0))
    position = np.arange(len(order)) - run_start
    starts = np.flatnonzero(position % window == 0)
    x, y = window_sums(records.features(), wall_ms, order, starts)
    return fit_ols(x, y)


def errors(coefficients, synth, records) -> tuple:
    """(decode-pass mean signed % error, total % error) against own times."""
    predicted = predict(coefficients, records)
    decode = synth.kind == DECODE
    own = synth.own_ms
    return (100 * np.mean((predicted[decode] - own[decode]) / own[decode]),
            100 * (predicted.sum() / own.sum() - 1))


def main(argv) -> None:
    started = time.perf_counter()
    eager_tokens = SHORT_EAGER_TOKENS if "--short-eager" in argv else EAGER_TOKENS
    synth = {name: synth_workload(name, eager_tokens=eager_tokens) for name in ("A", "B")}
    records = {name: s.records() for name, s in synth.items()}
    a = records["A"]
    fits = [("raw records", fit_records(a, a.wall_ms)),
            ("`--launch-stall`", fit_records(a, charge_own_launch(a, STALL)))]
    fits += [(f"`--window {w}`", fit_windows(a, a.wall_ms, w, CAPTURE_SIZE)) for w in WINDOWS]
    fits += [(f"naive fixed windows of {w}", naive_window_fit(a, a.wall_ms, w)) for w in WINDOWS]

    print("| fit (on A) | decode passes, A | total, A | decode passes, B | total, B |")
    print("|---|---:|---:|---:|---:|")
    for label, fit in fits:
        cells = []
        for name in ("A", "B"):
            cells += [f"{e:+.2f}%" for e in errors(fit.coefficients, synth[name], records[name])]
        print(f"| {label} | " + " | ".join(cells) + " |")
    print()
    counts = ", ".join(f"{name}: {len(r)} records, {int((synth[name].kind == DECODE).sum())} decode, "
                       f"{int((r.wall_ms < 0).sum())} below 0 ms" for name, r in records.items())
    print(f"({counts}; {time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main(sys.argv[1:])
