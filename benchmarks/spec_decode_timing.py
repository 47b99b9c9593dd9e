"""Simulate-only wall time of a config, best of 4 in one process (the kernels
compiled by a first run): `python benchmarks/spec_decode_timing.py CONFIG
[--set-style overrides ...]`, e.g. speculative decoding on the Mooncake
benchmark:

    python benchmarks/spec_decode_timing.py benchmarks/configs/mooncake-full.yaml \
        'engine.speculative={method: mtp, num_speculative_tokens: 3, acceptance_rates: [0.8, 0.6, 0.5]}'
"""

import sys
import time

from servesim.replay.api import resolve_config
from servesim.replay.api import simulate
from servesim.workload.load import load_workload


def main(argv):
    cfg = resolve_config(argv[0], tuple(argv[1:]))
    workload = load_workload(cfg.workload, cfg.engine.kv_cache.block_size)
    simulate(cfg, workload)  # compile
    best = float("inf")
    for _ in range(4):
        start = time.perf_counter()
        result = simulate(cfg, workload)
        best = min(best, time.perf_counter() - start)
    passes = result.stats.passes
    print(f"{best:.3f} s, {passes} passes, {best / passes * 1e6:.1f} us/pass")


if __name__ == "__main__":
    main(sys.argv[1:])
