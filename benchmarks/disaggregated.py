"""Aggregated vs disaggregated prefill/decode serving on the Mooncake trace
(servesim/engine/kv_handoff.py), and append the dated table to
benchmarks/RESULTS.md.

The workload: the first 5,000 rows of benchmarks/traces/
mooncake_conversation_trace.jsonl.gz, replayed at their timestamps, through
workers with `block_size: 64`, `num_gpu_blocks: 16384` and Dynamo's
polynomial pass-time model, round-robin routing. The same four GPUs run as
4 aggregated workers, and as 2 prefill + 2 decode workers with a 50 GB/s link
(131072 B/token: Llama-3-8B in bf16, 0.05 ms latency). Three more rows answer
"how many of each, and what does the link cost?": the 2 + 2 split on a
5 GB/s link, and the 3 + 1 and 1 + 3 splits.

The simulated figures are deterministic; the wall time (the simulator's own,
in this process, Numba cache warm) is the median of `--repeat` runs.
Disaggregated runs use the compiled scheduler pass by pass (compiled runs of
many passes cover aggregated workers only), hence their longer wall time.

    python benchmarks/disaggregated.py             # print and append to RESULTS.md
    python benchmarks/disaggregated.py --no-write  # print only
"""

import argparse
import datetime
import statistics
import time
from pathlib import Path

from servesim.replay.api import run
from results_file import commit, machine, publish  # a sibling module

HERE = Path(__file__).resolve().parent
TRACE = HERE / "traces" / "mooncake_conversation_trace.jsonl.gz"
ROWS = 5000


def link(gbps):
    return {"bytes_per_token": 131072, "bandwidth_gbps": gbps, "latency_ms": 0.05}


def disaggregated(prefill, decode, gbps=50):
    return {"mode": "disaggregated", "prefill_workers": prefill, "decode_workers": decode,
            "kv_transfer": link(gbps)}


SETUPS = [
    ("4 aggregated", {"workers": 4}),
    ("2 prefill + 2 decode, 50 GB/s", disaggregated(2, 2)),
    ("2 prefill + 2 decode, 5 GB/s", disaggregated(2, 2, gbps=5)),
    ("3 prefill + 1 decode, 50 GB/s", disaggregated(3, 1)),
    ("1 prefill + 3 decode, 50 GB/s", disaggregated(1, 3)),
]


def config(cluster):
    return {
        "workload": {"trace": str(TRACE), "format": "mooncake", "trace_block_size": 512,
                     "limit": ROWS},
        "engine": {"block_size": 64, "num_gpu_blocks": 16384, "timing": {"type": "polynomial"}},
        "cluster": {"router": "round_robin", **cluster},
    }


def measure(cluster, repeat):
    """(summary of the first run, median wall seconds over `repeat` runs)."""
    walls, summary = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        report = run(config(cluster))
        walls.append(time.perf_counter() - start)
        summary = summary or report.summary
    return summary, statistics.median(walls)


def row(name, s, wall) -> str:
    transfer = s.get("kv_transfer")
    mean_transfer = f"{transfer['kv_transfer_ms']['mean']:.1f}" if transfer else "-"
    return (f"| {name} | {s['ttft_ms']['mean']:.0f} | {s['ttft_ms']['p90']:.0f} | "
            f"{s['tpot_ms']['mean']:.2f} | {s['tpot_ms']['p90']:.2f} | "
            f"{s['request_rate']:.3f} | {s['preemptions']} | {mean_transfer} | {wall:.2f} |")


def notes(results) -> list:
    """A few figures behind the table, from the runs' summaries."""
    agg = results[0][1]
    split = results[1][1]
    slow = results[2][1]
    t = split["kv_transfer"]
    per_handoff = t["transferred_tokens"] / t["handoffs"]
    pools = split["pools"]
    return [
        f"All setups keep up with the trace's arrivals ({agg['request_rate']:.2f} requests/s) "
        f"and none preempts: a worker's 16,384 blocks of 64 tokens never fill. The 2 + 2 "
        f"split halves the GPUs that compute prompts, so TTFT rises "
        f"({agg['ttft_ms']['mean']:.0f} -> {split['ttft_ms']['mean']:.0f} ms mean); its decode "
        f"workers never run a prompt chunk, so TPOT falls "
        f"({agg['tpot_ms']['mean']:.2f} -> {split['tpot_ms']['mean']:.2f} ms mean) even though "
        f"the first decode gap includes the transfer. The prefill pool is busy "
        f"{pools['prefill']['busy_ms'] / pools['prefill']['workers'] / split['duration_ms']:.0%} "
        f"of the run, the decode pool "
        f"{pools['decode']['busy_ms'] / pools['decode']['workers'] / split['duration_ms']:.0%}.",
        "",
        f"A handoff moves {per_handoff:,.0f} prompt tokens on average "
        f"({per_handoff * 131072 / 1e9:.2f} GB; the decode worker already held "
        f"{pools['decode']['prefix_cache_hit_rate']:.1%} of the prompt tokens it looked up): "
        f"{t['kv_transfer_ms']['mean']:.1f} ms at 50 GB/s (p90 {t['kv_transfer_ms']['p90']:.1f}). "
        f"At 5 GB/s the link queues: {slow['kv_transfer']['kv_transfer_ms']['mean']:.0f} ms mean "
        f"per transfer, which lands in TPOT ({slow['tpot_ms']['mean']:.2f} ms mean).",
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-write", action="store_true",
                        help="print, do not append to RESULTS.md")
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs per setup; the wall time is their median (default 3)")
    args = parser.parse_args()
    run(config({"workers": 1}), limit=50)  # warm the Numba cache
    results = [(name, *measure(cluster, args.repeat)) for name, cluster in SETUPS]
    lines = [
        f"### {datetime.date.today().isoformat()} — working tree at commit {commit()} — "
        f"aggregated vs disaggregated prefill/decode (`benchmarks/disaggregated.py`)", "",
        f"First {ROWS:,} rows of the Mooncake conversation trace at their timestamps, "
        "`block_size: 64`, `num_gpu_blocks: 16384` per worker, polynomial timing, round-robin "
        "routing; link 131072 B/token, 0.05 ms latency, one link per prefill GPU. Simulated "
        f"figures (deterministic); wall time: median of {args.repeat} runs in one process, "
        f"Numba cache warm. Machine: {machine()}.", "",
        "| setup (4 GPUs) | TTFT mean ms | TTFT p90 ms | TPOT mean ms | TPOT p90 ms "
        "| requests/s | preemptions | KV transfer mean ms | wall s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        *(row(name, s, wall) for name, s, wall in results), "",
        *notes(results), ""]
    publish(lines, not args.no_write)


if __name__ == "__main__":
    main()
