"""TPOT speedup of speculative decoding against the plain run (`--baseline`) on
the regression cases with speculative decoding (tests/regression/cases.py, 250
Mooncake rows): `python benchmarks/spec_speedup.py [CHECKOUT]`, CHECKOUT (default
this one) being a checkout whose `servesim` is the one imported (set PYTHONPATH
to it), so the figures of two commits compare (benchmarks/RESULTS.md)."""

import copy
import os
import sys


def main(argv):
    root = argv[0] if argv else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.join(root, "tests"))
    from regression.cases import ROWS, cases

    from servesim.replay.api import run

    every = cases()
    for name in ("speculative", "spec-sync", "spec-small-pool"):
        s = run(copy.deepcopy(every[name]), limit=ROWS, baseline=True, pass_log=False).summary
        block = s["speculative"]
        print(f"{name}: TPOT mean {s['tpot_ms']['mean']:.3f} ms, plain "
              f"{block['baseline_tpot_ms']['mean']:.3f} ms, speedup {block['tpot_speedup']}, "
              f"TTFT p50 {s['ttft_ms']['p50']:.1f} ms, mean acceptance length "
              f"{block['mean_acceptance_length']}")


if __name__ == "__main__":
    main(sys.argv[1:])
