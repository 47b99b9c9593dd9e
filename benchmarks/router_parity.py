"""`kv_router` side by side with the peer's, NVIDIA Dynamo 1.6.1's offline
replay with `router_mode="kv_router"` (router_temperature 0, no KV event lag:
its defaults): the first 3,000 rows of the Mooncake conversation trace, and
300 generated chat sessions of 4 turns (`sessions_peer.py`'s, as `mooncake`
rows with `session_id` / `delay`), on 4 workers with fixed pass times, and the prefix hit rate, the largest worker's
share of the requests and the mean TTFT of each, computed the same way from
both simulators' per-request records; `round_robin` on both sides as the
reference. Appends a dated table to benchmarks/RESULTS.md.

    python benchmarks/router_parity.py --peer-python PEER/bin/python
    python benchmarks/router_parity.py --peer-python ... --no-write   # print only
    python benchmarks/router_parity.py --peer-python ... --seeds 0,1,2  # servesim seeds
    python benchmarks/router_parity.py --peer-python ... --peer-lags 0,1000,5000  # KV event lags

The peer runs in its own interpreter (`ai-dynamo` is never a dependency of
servesim; install it as its own venv: `pip download --no-deps ai-dynamo==1.6.1
ai-dynamo-runtime==1.6.1`, then install the runtime wheel and the
`ai-dynamo` wheel with `--no-deps`). The engine on both sides: `block_size:
64`, 16,384 blocks, 256 sequences, 8,192 tokens a pass, trace blocks of 512
tokens; fixed pass times (20 ms with prompt tokens, 10 ms without). The
peer's ties at temperature 0 are drawn from an unseeded generator, so it
runs `--peer-runs` times; servesim once per seed.
"""

import argparse
import datetime
import gzip
import json
import statistics
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from servesim.replay.api import run
from results_file import commit, machine, publish  # a sibling module
from sessions_peer import SEED, chat_traces, write  # a sibling module

HERE = Path(__file__).resolve().parent
TRACE = HERE / "traces" / "mooncake_conversation_trace.jsonl.gz"
ROWS, WORKERS, TBS = 3000, 4, 512
PREFILL_MS, DECODE_MS = 20.0, 10.0
PEER_ROUTERS = ("round_robin", "kv_router")  # the peer's router modes
ENGINE = {"block_size": 64, "num_gpu_blocks": 16384, "max_num_seqs": 256,
          "max_num_batched_tokens": 8192}

PEER_CHILD = r"""
import json, os, sys
os.environ.setdefault("DYN_LOG", "error")
from dynamo.replay import run_trace_replay
trace, router, engine, workers, tbs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
lag = {"kv_event_lag_ms": float(sys.argv[6])} if len(sys.argv) > 6 else {}
rep = run_trace_replay(trace, trace_block_size=tbs, num_workers=workers, router_mode=router,
                       extra_engine_args={"engine": engine}, capture_per_request=True, **lag)
rows = [{"ttft_ms": r["ttft_ms"], "input_length": r["input_length"],
         "reused": r["admission_history"][0]["reused_input_tokens"] if r["admission_history"] else 0,
         "worker": r["decode_worker_idx"], "status": r["terminal_status"]}
        for r in rep.per_request]
print(json.dumps(rows))
"""


def figures(ttft, reused, prompt, worker) -> dict:
    """Hit rate (prompt tokens cached at first admission over prompt tokens),
    the largest worker's share of the requests, the mean TTFT, the shares."""
    counts = np.bincount(np.asarray(worker, dtype=np.int64), minlength=WORKERS)
    return {"hit": float(np.sum(reused) / np.sum(prompt)),
            "largest": float(counts.max() / counts.sum()),
            "ttft": float(np.mean(ttft)), "counts": counts.tolist(), "n": int(len(ttft))}


def servesim_figures(path, router, seed=0, lag_ms=0.0) -> dict:
    policy = router if router != "kv_router" else {"policy": "kv_router", "seed": seed,
                                                   "kv_event_lag_ms": lag_ms}
    report = run({"workload": {"trace": str(path), "format": "mooncake", "trace_block_size": TBS},
                  "engine": dict(ENGINE, timing={"type": "fixed", "prefill_ms": PREFILL_MS,
                                                 "decode_ms": DECODE_MS}),
                  "cluster": {"workers": WORKERS, "router": policy},
                  "output": {"per_request": True}})
    rec = report.records
    done = np.asarray(rec.status) == 0
    return figures((rec.first_token_ms - rec.arrival_ms)[done],
                   rec.first_admission_cached_tokens[done], rec.input_length[done],
                   rec.worker[done])


def peer_figures(python, path, router, lag_ms=None) -> dict:
    """The peer's figures; `lag_ms`: its `kv_event_lag_ms` (None: its default, none)."""
    engine = dict(ENGINE, timing_model={"type": "fixed", "prefill_ms": PREFILL_MS,
                                        "decode_ms": DECODE_MS})
    lag = [] if lag_ms is None else [repr(float(lag_ms))]
    proc = subprocess.run([python, "-c", PEER_CHILD, str(path), router, json.dumps(engine),
                           str(WORKERS), str(TBS), *lag], check=True, capture_output=True, text=True)
    rows = [r for r in json.loads(proc.stdout.strip().splitlines()[-1])
            if r["status"] == "completed"]
    return figures([r["ttft_ms"] for r in rows], [r["reused"] for r in rows],
                   [r["input_length"] for r in rows], [r["worker"] for r in rows])


def median_of(runs: list) -> dict:
    return {key: statistics.median(r[key] for r in runs) for key in ("hit", "largest", "ttft")}


def traces(folder: Path) -> tuple:
    """(name, path) of the two traces, written into `folder`."""
    moon = folder / "mooncake_3000.jsonl"
    with gzip.open(TRACE, "rt") as src, open(moon, "w") as dst:
        for k, line in enumerate(src):
            if k == ROWS:
                break
            dst.write(line)
    sessions = folder / "sessions.jsonl"
    write(chat_traces(np.random.default_rng(SEED))[0], sessions)
    return ((f"Mooncake, first {ROWS:,} rows", moon), ("300 chat sessions of 4 turns", sessions))


def peer_lag_table(args) -> list:
    """`--peer-lags`: `kv_router` on both sides at each KV event lag
    (servesim: its seeds' median; the peer: its runs')."""
    lags = [float(x) for x in args.peer_lags.split(",")]
    seeds = [int(x) for x in args.seeds.split(",")]
    lines = [
        f"### {datetime.date.today().isoformat()} — commit {commit()} — `kv_router` against "
        "Dynamo 1.6.1's at KV event lags (`benchmarks/router_parity.py --peer-lags`)", "",
        "The traces and engine of `router_parity.py`; `kv_event_lag_ms` delays the KV "
        "events (blocks stored and removed) the router's index sees, first tokens and "
        f"completions staying immediate. servesim: seeds {args.seeds} (median); peer: "
        f"{args.peer_runs} runs (median; its ties are unseeded). Machine: {machine()}. "
        "Reproduce: `python benchmarks/router_parity.py --peer-python PEER/bin/python "
        f"--peer-lags {args.peer_lags}`.", "",
        "| trace | kv_event_lag_ms | hit rate (servesim / peer) | largest share | "
        "TTFT mean ms |",
        "|---|---:|---:|---:|---:|",
    ]
    with tempfile.TemporaryDirectory() as folder:
        for name, path in traces(Path(folder)):
            for lag in lags:
                a = median_of([servesim_figures(path, "kv_router", seed, lag) for seed in seeds])
                b = median_of([peer_figures(args.peer_python, path, "kv_router", lag)
                               for _ in range(args.peer_runs)])
                lines.append(
                    f"| {name} | {lag:g} | {a['hit']:.2%} / {b['hit']:.2%} "
                    f"({(a['hit'] - b['hit']) * 100:+.2f} pt) | {a['largest']:.2%} / "
                    f"{b['largest']:.2%} | {a['ttft']:,.1f} / {b['ttft']:,.1f} |")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peer-python", required=True)
    parser.add_argument("--peer-runs", type=int, default=3)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--peer-lags", help="only kv_router, both sides, at these KV event lags (ms)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    if args.peer_lags:
        return publish(peer_lag_table(args) + [""], not args.no_write)
    seeds = [int(s) for s in args.seeds.split(",")]
    table = []
    with tempfile.TemporaryDirectory() as folder:
        for name, path in traces(Path(folder)):
            for router in ("round_robin", "kv_router", "least_prefill", "weighted"):
                ours = [servesim_figures(path, router, seed)
                        for seed in (seeds if router == "kv_router" else [0])]
                peer = ([peer_figures(args.peer_python, path, router)
                         for _ in range(args.peer_runs)] if router in PEER_ROUTERS else None)
                table.append((name, router, ours, peer))
    today = datetime.date.today().isoformat()
    lines = [
        f"### {today} — commit {commit()} — `kv_router` against Dynamo 1.6.1's "
        f"(`benchmarks/router_parity.py`)", "",
        f"The first {ROWS:,} rows of the Mooncake conversation trace and 300 chat sessions "
        "of 4 turns (`sessions_peer.py`'s, seed 7, as `mooncake` rows with `session_id` / "
        f"`delay`), trace blocks of {TBS}, "
        f"{WORKERS} workers, `block_size: 64`, 16,384 blocks, 256 sequences, 8,192 tokens a "
        f"pass, fixed pass times ({PREFILL_MS:g} ms with prompt tokens, {DECODE_MS:g} ms "
        "without); both routers at temperature 0, no KV event lag. From each simulator's "
        "per-request records (completed requests): hit rate = prompt tokens cached at first "
        "admission / prompt tokens; largest share = the busiest worker's requests / "
        f"requests. servesim: seeds {args.seeds} (median); peer: {args.peer_runs} runs "
        "(median; its ties are unseeded); `least_prefill` (servesim's `kv_aware` before "
        "this change) and `weighted` (default weights) have no peer. Machine: " + machine() + ". Reproduce: "
        "`python benchmarks/router_parity.py --peer-python PEER/bin/python`.", "",
        "| trace | router | requests (servesim / peer) | hit rate | largest share | "
        "TTFT mean ms | requests per worker (servesim; peer, first run) |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for name, router, ours, peer in table:
        a = median_of(ours)
        if peer is None:
            lines.append(f"| {name} | {router} | {ours[0]['n']} / - | {a['hit']:.2%} / - | "
                         f"{a['largest']:.2%} / - | {a['ttft']:,.1f} / - | "
                         f"{'/'.join(map(str, ours[0]['counts']))}; - |")
            continue
        b = median_of(peer)
        lines.append(
            f"| {name} | {router} | {ours[0]['n']} / {peer[0]['n']} | {a['hit']:.2%} / "
            f"{b['hit']:.2%} ({(a['hit'] - b['hit']) * 100:+.2f} pt) | {a['largest']:.2%} / "
            f"{b['largest']:.2%} ({(a['largest'] - b['largest']) * 100:+.2f} pt) | "
            f"{a['ttft']:,.1f} / {b['ttft']:,.1f} ({a['ttft'] / b['ttft'] - 1:+.1%}) | "
            f"{'/'.join(map(str, ours[0]['counts']))}; {'/'.join(map(str, peer[0]['counts']))} |")
    publish(lines + [""], not args.no_write)


if __name__ == "__main__":
    main()
