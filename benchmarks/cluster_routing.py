"""Routing on several workers (vllm-engine.md §11): the first 5,000 rows of the
Mooncake conversation trace on 4 workers with each router, and append the
dated table to benchmarks/RESULTS.md.

The engine is `benchmarks/configs/mooncake-full.yaml`'s: `block_size: 64`,
`num_gpu_blocks: 16384` per worker, polynomial pass times, trace blocks of 512
tokens; only `cluster` changes: 4 workers of one rank, `round_robin`,
`least_loaded`, `least_prefill` or `kv_router`. The simulated figures are deterministic, so each
router runs once; "wall s" is the simulator's own end-to-end time for that run
(reading the trace, simulating, summarising), not a simulated figure.

    python benchmarks/cluster_routing.py             # print and append to RESULTS.md
    python benchmarks/cluster_routing.py --no-write  # print only
"""

import argparse
import datetime
from pathlib import Path

from servesim.replay.api import run
from results_file import commit, publish  # a sibling module

HERE = Path(__file__).resolve().parent
TRACE = HERE / "traces" / "mooncake_conversation_trace.jsonl.gz"
ROWS = 5000
WORKERS = 4
ROUTERS = ("round_robin", "least_loaded", "least_prefill", "kv_router")


def config(router):
    return {
        "workload": {"trace": str(TRACE), "trace_block_size": 512, "limit": ROWS},
        "engine": {"block_size": 64, "num_gpu_blocks": 16384, "timing": {"type": "polynomial"}},
        "cluster": {"workers": WORKERS, "router": router},
        "output": {"per_request": True},
    }


def row(router, report) -> str:
    s = report.summary
    return (f"| {router} | {s['finished']} | {s['prefix_cache_hit_rate']:.1%} | "
            f"{s['ttft_ms']['mean']:,.1f} | {s['ttft_ms']['p90']:,.1f} | "
            f"{s['tpot_ms']['mean']:.2f} | {s['request_rate']:.3f} | {s['preemptions']} | "
            f"{'/'.join(str(w['requests']) for w in s['workers'])} | {s['wall_time_s']:.2f} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-write", action="store_true",
                        help="print, do not append to RESULTS.md")
    args = parser.parse_args()
    reports = {router: run(config(router)) for router in ROUTERS}
    rr, kv = reports["round_robin"].summary, reports["kv_router"].summary
    better_hits = kv["prefix_cache_hit_rate"] > rr["prefix_cache_hit_rate"]
    better_ttft = kv["ttft_ms"]["mean"] < rr["ttft_ms"]["mean"]
    verdict = ("kv_router has a higher hit rate and a lower mean TTFT than round_robin."
               if better_hits and better_ttft else
               f"NOTE: against round_robin, kv_router's hit rate is "
               f"{'higher' if better_hits else 'not higher'} and its mean TTFT "
               f"{'lower' if better_ttft else 'not lower'}.")
    lines = [
        f"### {datetime.date.today().isoformat()} — working tree at commit {commit()} — "
        f"routers on {WORKERS} workers (`benchmarks/cluster_routing.py`)", "",
        f"First {ROWS:,} rows of `traces/mooncake_conversation_trace.jsonl.gz` "
        "(trace blocks of 512 tokens), 4 workers of one rank, each `block_size: 64`, "
        "`num_gpu_blocks: 16384`, polynomial pass times (the `mooncake-full.yaml` engine). "
        "Simulated figures (deterministic); wall s is the simulator's own end-to-end time. "
        "Reproduce: `python benchmarks/cluster_routing.py`.", "",
        "| router | finished | prefix-cache hit rate | TTFT mean ms | TTFT p90 ms "
        "| TPOT mean ms | requests/s | preemptions | requests per worker | wall s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|",
        *(row(router, reports[router]) for router in ROUTERS), "",
        verdict, ""]
    publish(lines, not args.no_write)


if __name__ == "__main__":
    main()
