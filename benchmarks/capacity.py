"""Speed of `servesim capacity` (issue 17): the capacity search on the first
5,000 Mooncake conversation rows (benchmarks/configs/mooncake-5k-capacity.yaml:
one worker, polynomial pass times, TTFT p90 <= 5 s and ITL p99 <= 250 ms,
precision 2%), end to end through the CLI in a fresh process each time (Numba
cache warm after the first), median of the runs; appends a dated section to
benchmarks/RESULTS.md.

    python benchmarks/capacity.py               # 3 runs, print and append
    python benchmarks/capacity.py --runs 5 --no-write
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
CONFIG = HERE / "configs" / "mooncake-5k-capacity.yaml"


def one_run(out_dir: str) -> tuple:
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    began = time.perf_counter()
    subprocess.run([sys.executable, "-m", "servesim", "capacity", str(CONFIG), "-o", out_dir, "-q"],
                   check=True, env=env, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - began
    doc = json.loads((Path(out_dir) / "capacity.json").read_text())
    return wall, doc


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--note", default="", help="e.g. 'under load: shared with other jobs'")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        one_run(tmp)  # warm Numba's cache
        results = [one_run(tmp) for _ in range(args.runs)]
    walls = [w for w, _ in results]
    doc = results[0][1]
    probes = len(doc["probes"])
    lines = [
        f"### {datetime.date.today().isoformat()} — commit {commit()} — capacity search, 5,000 Mooncake rows",
        "",
        f"Machine: {machine()}." + (f" {args.note}." if args.note else ""),
        "",
        "`python benchmarks/capacity.py` (`servesim capacity benchmarks/configs/mooncake-5k-capacity.yaml`,"
        " end to end per fresh process, Numba cache warm).",
        "",
        "| runs | probes | capacity (speedup) | binding SLO | req/s sustained | wall s (median) | min | max |",
        "|---:|---:|---:|---|---:|---:|---:|---:|",
        f"| {args.runs} | {probes} | {doc['capacity']} | {doc['binding_slo']} | {doc['request_rate']} | "
        f"{statistics.median(walls):.2f} | {min(walls):.2f} | {max(walls):.2f} |",
    ]
    publish(lines, not args.no_write)


if __name__ == "__main__":
    main()
