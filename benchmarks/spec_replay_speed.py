"""Replay speed with and without speculative decoding, a pass (issue 40):
the whole Mooncake trace (configs/mooncake-full.yaml) plain and with MTP k = 3
and k = 1, each prepared once and simulated once to warm, then `simulate()`
timed alone over interleaved rounds; medians (benchmarks/RESULTS.md).

    python benchmarks/spec_replay_speed.py [ROUNDS]   (default 3)
"""

import os
import statistics
import sys
import time


def main(argv):
    from servesim.replay.api import prepare, simulate

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs", "mooncake-full.yaml")
    variants = {"plain": (),
                "mtp k=3": ("engine.speculative={method: mtp, num_speculative_tokens: 3}",),
                "mtp k=1": ("engine.speculative={method: mtp, num_speculative_tokens: 1}",)}
    prepared = {}
    for name, overrides in variants.items():
        cfg, workload, _ = prepare(path, overrides=overrides, pass_log=False)
        prepared[name] = (cfg, workload)
        simulate(cfg, workload)  # warm
    times = {name: [] for name in variants}
    passes = {}
    for _ in range(int(argv[0]) if argv else 3):
        for name, (cfg, workload) in prepared.items():
            start = time.perf_counter()
            result = simulate(cfg, workload)
            times[name].append(time.perf_counter() - start)
            passes[name] = result.stats.passes
    for name in variants:
        m = statistics.median(times[name])
        print(f"{name}: {passes[name]} passes, simulate {m:.3f} s (median of "
              f"{len(times[name])}), {m / passes[name] * 1e6:.1f} us a pass")


if __name__ == "__main__":
    main(sys.argv[1:])
