"""Replay speed with and without speculative decoding, a pass (issue 40):
the whole Mooncake trace (configs/mooncake-full.yaml) plain and with MTP k = 3
and k = 1, each prepared once and simulated once to warm, then `simulate()`
timed alone over interleaved rounds; medians (benchmarks/RESULTS.md).

CPU time (user + sys of this process, `time.process_time`) as well as wall
time, the machine being shared; and, of that CPU time, the compiled loops'
(every call of a `jit.Entry`, the worker's `run_passes`): the rest is the
run's Python (setting up the tables, the block identities, the report),
which costs a run the same whatever its passes. Run with another tree's
servesim (`PYTHONPATH=TREE python benchmarks/spec_replay_speed.py`) to
compare the two; `--raw FILE` appends every round's figures to FILE (JSON
lines) for that, and `--only NAME` (plain, "mtp k=3", "mtp k=1") runs one
variant alone in the process (the three in one process cost k = 1 and k = 3
more a pass than alone: benchmarks/RESULTS.md, 2026-12-08).

    python benchmarks/spec_replay_speed.py [ROUNDS] [--raw FILE] [--only NAME]   (default 3)
"""

import json
import os
import statistics
import sys
import time


def _timing_entries(jit):
    """Make every `jit.Entry` call add its CPU time to the returned cell."""
    spent = [0.0]
    call = jit.Entry.__call__

    def timed(self, *args):
        start = time.process_time()
        try:
            return call(self, *args)
        finally:
            spent[0] += time.process_time() - start

    jit.Entry.__call__ = timed
    return spent


def main(argv):
    from servesim import jit
    from servesim.replay.api import prepare, simulate

    options = {}
    for flag in ("--raw", "--only"):
        if flag in argv:
            k = argv.index(flag)
            options[flag] = argv[k + 1]
            argv = argv[:k] + argv[k + 2:]
    raw = options.get("--raw")
    loop = _timing_entries(jit)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs", "mooncake-full.yaml")
    variants = {"plain": (),
                "mtp k=3": ("engine.speculative={method: mtp, num_speculative_tokens: 3}",),
                "mtp k=1": ("engine.speculative={method: mtp, num_speculative_tokens: 1}",)}
    if "--only" in options:
        variants = {options["--only"]: variants[options["--only"]]}
    prepared = {}
    for name, overrides in variants.items():
        cfg, workload, _ = prepare(path, overrides=overrides, pass_log=False)
        prepared[name] = (cfg, workload)
        simulate(cfg, workload)  # warm
    times = {name: {"wall": [], "cpu": [], "loop": []} for name in variants}
    passes = {}
    for _ in range(int(argv[0]) if argv else 3):
        for name, (cfg, workload) in prepared.items():
            loop[0] = 0.0
            start, cpu = time.perf_counter(), time.process_time()
            result = simulate(cfg, workload)
            row = {"wall": time.perf_counter() - start, "cpu": time.process_time() - cpu,
                   "loop": loop[0]}
            for key, value in row.items():
                times[name][key].append(value)
            passes[name] = result.stats.passes
            if raw:
                with open(raw, "a") as out:
                    out.write(json.dumps({"variant": name, "passes": passes[name], **row}) + "\n")
    plain = None
    if "plain" in times:
        plain = {key: statistics.median(times["plain"][key]) / passes["plain"] * 1e6
                 for key in ("cpu", "loop")}
    for name in variants:
        m = {key: statistics.median(v) for key, v in times[name].items()}
        per = {key: m[key] / passes[name] * 1e6 for key in m}
        x = {key: f" ({per[key] / plain[key]:.2f}x plain)" if plain else "" for key in ("cpu", "loop")}
        print(f"{name}: {passes[name]} passes, simulate {m['wall']:.3f} s wall, {m['cpu']:.3f} s "
              f"CPU (medians of {len(times[name]['cpu'])}): {per['wall']:.1f} us a pass wall, "
              f"{per['cpu']:.1f} us CPU{x['cpu']}, of which the compiled loop "
              f"{per['loop']:.1f} us{x['loop']}")


if __name__ == "__main__":
    main(sys.argv[1:])
