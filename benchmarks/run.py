"""Time `servesim run` end to end on the benchmark scenarios and append dated
rows to benchmarks/RESULTS.md.

Each measurement is a fresh process running `servesim run CONFIG` (reading the
trace, simulating, writing the report), timed from outside. "warm" runs use a
Numba cache filled by a first, unrecorded run; "cold" runs each start from an
empty cache directory (NUMBA_CACHE_DIR), so they include compiling every
kernel. The figure reported is the median.

    python benchmarks/run.py                      # all scenarios, 5 warm + 3 cold runs
    python benchmarks/run.py mooncake-full -n 7   # one scenario
    python benchmarks/run.py --no-write           # print only
    python benchmarks/run.py --peer-python /path/to/venv/bin/python

With `--peer-python` (an interpreter where `ai-dynamo-runtime` is installed;
never a dependency of servesim), the scenarios that have a counterpart are also
run through NVIDIA Dynamo's offline mocker replay
(`dynamo._core.run_mocker_trace_replay`), each in a fresh process, timed the
same way. The peer reads plain JSONL, so the trace is decompressed once
beforehand, outside the timing.
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results_file import commit, machine, publish  # a sibling module

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CONFIGS = HERE / "configs"

# The child runs the real CLI entry point and reports its peak memory.
CHILD = r"""
import json, resource, sys
from servesim.cli.main import main
try:
    main(sys.argv[1:], standalone_mode=False)
finally:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    sys.stderr.write("\nMAXRSS_KB=%d\n" % rss)
"""


# scenario -> the peer's (num_workers, router_mode), same trace, block size,
# blocks and (default) polynomial timing
PEER_SCENARIOS = {"mooncake-full": (1, "round_robin"), "mooncake-full-4w-kv": (4, "kv_router")}

PEER_CHILD = r"""
import json, resource, sys
from dynamo._core import run_mocker_trace_replay
trace, workers, router = sys.argv[1], int(sys.argv[2]), sys.argv[3]
result = run_mocker_trace_replay([trace], extra_engine_args={"engine": {"block_size": 64,
    "num_gpu_blocks": 16384}}, num_workers=workers, router_mode=router, trace_block_size=512)
summary = result.summary
print(json.dumps({"requests": summary["num_requests"], "duration_ms": summary["duration_ms"],
                  "rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def run_peer(python, name, plain_trace, runs):
    workers, router = PEER_SCENARIOS[name]
    walls = []
    for _ in range(runs):
        start = time.perf_counter()
        proc = subprocess.run([python, "-c", PEER_CHILD, plain_trace, str(workers), router],
                              capture_output=True, text=True)
        walls.append(time.perf_counter() - start)
        if proc.returncode != 0:
            raise SystemExit(f"peer failed on {name}:\n{proc.stderr[-2000:]}")
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    return (f"| {name} (Dynamo mocker replay, peer) | - | {runs} | {info['requests']} | - | "
            f"{statistics.median(walls):.2f} | - | - | {info['rss_kb'] / 1024:.0f} |")


def decompressed_trace(directory):
    import gzip
    import shutil
    path = os.path.join(directory, "mooncake_conversation_trace.jsonl")
    with gzip.open(HERE / "traces" / "mooncake_conversation_trace.jsonl.gz", "rb") as src, \
            open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return path


def scenarios():
    return sorted(p.stem for p in CONFIGS.glob("*.yaml"))


def run_once(name, cache_dir, extra_args=()):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache_dir))
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-c", CHILD, "run", str(CONFIGS / f"{name}.yaml"),
               "-o", out, "--format", "json", *extra_args]
        start = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
        wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{name}: servesim failed:\n{proc.stderr}")
    summary = json.loads(proc.stdout)
    rss_kb = int(proc.stderr.rsplit("MAXRSS_KB=", 1)[1].split()[0])
    return {"wall_s": wall, "sim_wall_s": summary["wall_time_s"], "passes": summary["passes"],
            "requests": summary["requests"], "rss_mb": rss_kb / 1024}


def measure(name, warm_runs, cold_runs):
    rows = {}
    with tempfile.TemporaryDirectory() as warm_cache:
        run_once(name, warm_cache)  # fills the cache
        rows["warm"] = [run_once(name, warm_cache) for _ in range(warm_runs)]
    cold = []
    for _ in range(cold_runs):
        with tempfile.TemporaryDirectory() as cold_cache:
            cold.append(run_once(name, cold_cache))
    rows["cold"] = cold
    return rows


def help_time(runs=5):
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "servesim", "--help"], capture_output=True, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def table_rows(name, rows):
    out = []
    for kind in ("warm", "cold"):
        runs = rows[kind]
        if not runs:
            continue
        wall = statistics.median(r["wall_s"] for r in runs)
        sim = statistics.median(r["sim_wall_s"] for r in runs)
        passes = runs[0]["passes"]
        rss = max(r["rss_mb"] for r in runs)
        out.append(f"| {name} | {kind} | {len(runs)} | {runs[0]['requests']} | {passes} | "
                   f"{wall:.2f} | {sim:.2f} | {passes / sim:,.0f} | {rss:.0f} |")
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help=f"scenarios (default all: {', '.join(scenarios())})")
    parser.add_argument("-n", "--warm-runs", type=int, default=5)
    parser.add_argument("--cold-runs", type=int, default=3)
    parser.add_argument("--note", default="", help="a note for the results heading")
    parser.add_argument("--no-write", action="store_true", help="print, do not append to RESULTS.md")
    parser.add_argument("--peer-python", help="an interpreter with ai-dynamo-runtime installed")
    args = parser.parse_args()
    names = args.names or scenarios()
    lines = [f"### {datetime.date.today().isoformat()} — commit {commit()}"
             + (f" — {args.note}" if args.note else ""), "",
             f"Machine: {machine()}.", "",
             "| scenario | cache | runs | requests | passes | wall s (median, end to end) "
             "| simulate s | passes/s | peak RSS MB |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    with tempfile.TemporaryDirectory() as tmp:
        plain = decompressed_trace(tmp) if args.peer_python else None
        for name in names:
            rows = measure(name, args.warm_runs, args.cold_runs)
            lines.extend(table_rows(name, rows))
            if plain and name in PEER_SCENARIOS:
                lines.append(run_peer(args.peer_python, name, plain, args.warm_runs))
            print("\n".join(lines[-3:]), flush=True)
    lines += ["", f"`servesim --help`: {help_time():.2f} s (median of 5).", ""]
    publish(lines, not args.no_write)


if __name__ == "__main__":
    main()
