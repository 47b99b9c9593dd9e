"""Where the wall time of one `servesim run` goes: the CLI's steps, timed in
one process (imports, config and workload, the replay's set-up, the run,
the summary, the outputs), and the Numba kernels loaded.

    PYTHONPATH=. python benchmarks/phases.py CONFIG [-o OUT] [--as-api]

As the command runs them: Numba's reference counts as plain adds and
Python's cyclic garbage collector off (servesim/jit.py); `--as-api` keeps
both as `servesim.run()` has them. Interpreter start and exit are not
included (~0.05 s). Numbers for benchmarks/RESULTS.md.
"""

import argparse
import gc
import sys
import tempfile
import time

T0 = time.perf_counter()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config")
    parser.add_argument("-o", "--output-dir")
    parser.add_argument("--as-api", action="store_true")
    args = parser.parse_args()
    marks = []

    def mark(name):
        marks.append((name, time.perf_counter()))

    import numpy  # noqa: F401

    mark("import NumPy")
    if not args.as_api:
        gc.disable()
    from servesim import jit

    if not args.as_api and hasattr(jit, "single_thread_refcounts"):
        jit.single_thread_refcounts()
    mark("import Numba (servesim/jit.py)")
    from servesim.config import config as cfgmod
    from servesim.replay import api
    from servesim.replay.api import prepare
    from servesim.results.metrics import summarize
    from servesim.results.output import write_outputs

    mark("import servesim's modules")
    cfg, workload, _ = prepare(args.config)
    mark("config + workload")
    replay = api.make_replay(cfg, workload)
    mark("make_replay (Numba's runtime start, first kernels loaded, identities)")
    result = replay.run()
    mark("Replay.run")
    summary = summarize(result, cfgmod.config_to_dict(cfg), 1.0)
    mark("summarize")
    out = cfg.output
    write_outputs(args.output_dir or tempfile.mkdtemp(prefix="phases_"), summary, result,
                  per_request=out.per_request, pass_log=out.pass_log,
                  telemetry=out.telemetry_interval_ms is not None)
    mark("write_outputs")
    previous = T0
    for name, t in marks:
        print(f"{name:72s} {t - previous:7.3f} s")
        previous = t
    print(f"{'total in-process':72s} {previous - T0:7.3f} s")
    from numba.core.registry import CPUDispatcher

    dispatchers = [o for o in gc.get_objects() if isinstance(o, CPUDispatcher)]
    loaded = [d for d in dispatchers if d.overloads]
    print(f"{len(dispatchers)} dispatchers, {sum(len(d.overloads) for d in loaded)} "
          f"specialisations loaded: " + ", ".join(sorted(d.py_func.__name__ for d in loaded)))


if __name__ == "__main__":
    sys.exit(main())
