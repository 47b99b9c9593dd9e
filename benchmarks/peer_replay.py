"""Run NVIDIA Dynamo 1.6.1's offline replay (the peer servesim is timed
against) on the scenarios of `benchmarks/issue14.py`, in the peer's own
interpreter, doing as little as possible in Python so that the time measured
is the peer's:

    PEER/bin/python benchmarks/peer_replay.py TRACE.jsonl[.gz] [--workers N]
        [--router round_robin|kv_router] [--dp N] [--disagg P D]
        [--host-offload BLOCKS] [--telemetry-ms MS] [--engine-type vllm|sglang]
    PEER/bin/python benchmarks/peer_replay.py --synthetic ISL OSL COUNT --rate R

Install the peer in a virtual environment of its own (it needs no GPU and no
torch; `ai-dynamo` is never a dependency of servesim):

    python3 -m venv peer
    peer/bin/pip install ai-dynamo-runtime==1.6.1
    peer/bin/pip install --no-deps ai-dynamo==1.6.1

A gzipped trace is unpacked to a temporary plain file first and handed to the
replay by path (its Rust side parses the rows; parsing them in Python would
add ~30% to the peer's time). The engine is the benchmark's: block 64,
16,384 GPU blocks, 256 sequences, 8,192 batched tokens, polynomial pass
times; the CPU tier and the KV transfer use servesim's figures (131,072
bytes a token; 25 GB/s each way for the tier, 50 GB/s for a handoff).
`--engine-type sglang` runs the mocker's SGLang engine instead (its pool of
16,384 x 64-token pages, 256 running requests, 8,192-token chunks, fcfs,
which Dynamo calls fifo): the peer of `benchmarks/configs/mooncake-full-sglang.yaml`.
Prints one JSON line: a few summary figures (to check both ran the same
workload), `process_s` and `maxrss_mb`.
"""

import argparse
import gzip
import json
import os
import resource
import shutil
import tempfile
import time

START = time.perf_counter()
os.environ.setdefault("DYN_LOG", "error")

BYTES_PER_TOKEN = 131072
SUMMARY_KEYS = ("num_requests", "completed_requests", "duration_ms", "mean_ttft_ms",
                "p99_ttft_ms", "mean_itl_ms", "mean_e2e_latency_ms", "prefix_cache_reused_ratio")


def engine_args(args, worker_type=None):
    engine = {"block_size": 64, "num_gpu_blocks": 16384, "max_num_seqs": 256,
              "max_num_batched_tokens": 8192, "timing_model": {"type": "polynomial"}}
    if args.engine_type == "sglang":
        engine.update(backend="sglang",
                      sglang={"chunked_prefill_size": 8192, "schedule_policy": "fifo"})
    if args.host_offload:
        engine["kv_cache_bytes_per_token"] = BYTES_PER_TOKEN
        engine["native_host_offload"] = {"num_host_blocks": args.host_offload,
                                         "d2h_bandwidth_gbps": 25.0, "h2d_bandwidth_gbps": 25.0}
    if worker_type is not None:
        engine.update(worker_type=worker_type, kv_transfer_bytes_per_token=BYTES_PER_TOKEN,
                      kv_transfer_bandwidth=50.0)
    return {"engine": engine, "dp_size": args.dp}


def replay_options(args):
    options = {"num_workers": args.workers, "router_mode": args.router}
    if args.disagg:
        prefill, decode = args.disagg
        options.update(num_prefill_workers=prefill, num_decode_workers=decode,
                       prefill_engine_args=engine_args(args, "prefill"),
                       decode_engine_args=engine_args(args, "decode"))
    else:
        options["extra_engine_args"] = engine_args(args)
    return options


def plain_trace(path, folder):
    """The trace as a plain JSONL file (unpacked into `folder` if gzipped)."""
    if not path.endswith(".gz"):
        return path
    plain = os.path.join(folder, "trace.jsonl")
    with gzip.open(path, "rb") as src, open(plain, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    return plain


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", nargs="?")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--router", default="round_robin")
    parser.add_argument("--dp", type=int, default=1)
    parser.add_argument("--disagg", nargs=2, type=int, metavar=("PREFILL", "DECODE"))
    parser.add_argument("--host-offload", type=int, metavar="NUM_HOST_BLOCKS")
    parser.add_argument("--telemetry-ms", type=float)
    parser.add_argument("--synthetic", nargs=3, type=int, metavar=("ISL", "OSL", "COUNT"))
    parser.add_argument("--rate", type=float)
    parser.add_argument("--engine-type", choices=("vllm", "sglang"), default="vllm")
    args = parser.parse_args()
    if (args.trace is None) == (args.synthetic is None):
        parser.error("give a trace or --synthetic, not both")

    from dynamo.replay import run_synthetic_trace_replay, run_trace_replay

    options = replay_options(args)
    out = {}
    with tempfile.TemporaryDirectory(prefix="peer_") as folder:
        telemetry = os.path.join(folder, "telemetry.jsonl")
        if args.telemetry_ms:
            from dynamo.replay.api import TelemetryOptions

            options["telemetry_options"] = TelemetryOptions(sample_interval_ms=args.telemetry_ms,
                                                            jsonl_path=telemetry)
        if args.synthetic:
            isl, osl, count = args.synthetic
            report = run_synthetic_trace_replay(isl, osl, count, request_rate=args.rate, **options)
        else:
            report = run_trace_replay(plain_trace(args.trace, folder), trace_block_size=512,
                                      **options)
        if args.telemetry_ms:
            out["telemetry_bytes"] = os.path.getsize(telemetry)
    out.update({key: report.summary.get(key) for key in SUMMARY_KEYS})
    out["process_s"] = time.perf_counter() - START
    out["maxrss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(out))


if __name__ == "__main__":
    main()
