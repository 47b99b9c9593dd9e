"""Sessions and agent graphs side by side with the peer, NVIDIA Dynamo 1.6.1's
offline replay: the same three generated traces — chat sessions as `mooncake`
rows with `session_id` / `delay`, the same sessions as `mooncake-delta`, and
agent graphs as `agentic_mooncake` — on one worker with fixed pass times, and
the mean TTFT, ITL (over tokens), E2E and prefix reuse (prompt tokens cached at
first admission over prompt tokens) of each, computed the same way from both
simulators' per-request records. Appends a dated table to
benchmarks/RESULTS.md.

    python benchmarks/sessions_peer.py --peer-python /work/peer-venv/bin/python
    python benchmarks/sessions_peer.py --peer-python ... --no-write   # print only
    python benchmarks/sessions_peer.py --keep DIR   # keep the traces in DIR
    python benchmarks/sessions_peer.py ... --speed 10000  # and time 10,000 sessions

The peer runs in its own interpreter (`ai-dynamo` is never a dependency of
servesim); the engine on both sides: `block_size: 64`, 16,384 blocks, 256
sequences, 8,192 tokens a pass, trace blocks of 512 tokens; fixed pass times (20
ms with prompt tokens, 10 ms without), then the polynomial model.
"""

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from servesim.replay.api import run
from results_file import commit, machine, publish  # a sibling module

TBS = 512
PREFILL_MS, DECODE_MS = 20.0, 10.0
ENGINE = {"block_size": 64, "num_gpu_blocks": 16384, "max_num_seqs": 256,
          "max_num_batched_tokens": 8192}
SESSIONS, TURNS, SEED = 300, 4, 7

PEER_CHILD = r"""
import json, os, sys
os.environ.setdefault("DYN_LOG", "error")
from dynamo.replay import run_trace_replay
trace, fmt, engine = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
kw = {"execution_model": "servesim-bench"} if fmt == "agentic_mooncake" else {}
rep = run_trace_replay(trace, trace_block_size=int(sys.argv[4]), trace_format=fmt,
                       extra_engine_args={"engine": engine}, capture_per_request=True, **kw)
rows = [{k: r.get(k) for k in ("session_id", "turn_index", "arrival_time_ms", "ttft_ms",
                               "e2e_latency_ms", "itl_ms", "input_length", "output_length",
                               "reused_input_tokens", "terminal_status")}
        for r in rep.per_request]
print(json.dumps({"summary": {k: rep.summary.get(k) for k in (
    "completed_requests", "mean_ttft_ms", "mean_itl_ms", "mean_e2e_latency_ms",
    "prefix_cache_reused_ratio")}, "rows": rows}))
"""


# ------------------------------------------------------------------ the traces


def _ids(next_id, n):
    return list(range(next_id, next_id + n)), next_id + n


def chat_traces(rng, sessions=None):
    """(mooncake rows, mooncake-delta rows) of the same chat sessions: first
    turns arrive as a Poisson process (0.5 sessions/s); a later turn adds new
    tokens to the previous prompt and output after a think time. The plain
    rows name the previous prompt's whole trace blocks with its ids (outputs
    get fresh ids: a plain trace cannot name generated tokens)."""
    plain, delta = [], []
    next_id = 1
    sessions = sessions or SESSIONS
    start = np.cumsum(rng.exponential(2000.0, sessions))
    for s in range(sessions):
        prompt = int(rng.integers(1000, 4000))
        ids, next_id = _ids(next_id, -(-prompt // TBS))
        out = int(rng.integers(50, 300))
        sid = f"s{s}"
        first = dict(session_id=sid, timestamp=round(float(start[s]), 3), input_length=prompt,
                     output_length=out, hash_ids=ids)
        plain.append(dict(first))
        delta.append(dict(first))
        for _ in range(1, TURNS):
            new = int(rng.integers(200, 1500))
            think = round(float(rng.uniform(500, 5000)), 3)
            cont = prompt + out + new
            keep = ids[:prompt // TBS]
            fresh, next_id = _ids(next_id, -(-cont // TBS) - len(keep))
            ids = keep + fresh
            d_ids, next_id = _ids(next_id, -(-new // TBS))
            out = int(rng.integers(50, 300))
            plain.append(dict(session_id=sid, delay=think, input_length=cont,
                              output_length=out, hash_ids=ids))
            delta.append(dict(session_id=sid, delay=think, input_length=new,
                              output_length=out, hash_ids=d_ids))
            prompt = cont
    return plain, delta


def agent_trace(rng):
    """Agent graphs: a root, two tool calls that wait for it (tool waits),
    a step that waits for both, and a final answer after it; each prompt is
    its first dependency's prompt plus new tokens (the same leading ids)."""
    rows = []
    next_id = 1
    start = np.cumsum(rng.exponential(2000.0, SESSIONS))
    for g in range(SESSIONS):
        def node(name, parent_ids, deps, **fields):
            nonlocal next_id
            new = int(rng.integers(300, 2000))
            length = len(parent_ids) * TBS + new
            fresh, next_id = _ids(next_id, -(-length // TBS) - len(parent_ids))
            row = dict(request_id=f"g{g}.{name}", session_id=f"g{g}", input_length=length,
                       output_length=int(rng.integers(30, 200)), hash_ids=parent_ids + fresh,
                       **fields)
            if deps:
                row["wait_for"] = [f"g{g}.{d}" for d in deps]
            rows.append(row)
            return (parent_ids + fresh)[:length // TBS]
        root = node("root", [], [], timestamp=round(float(start[g]), 3))
        a = node("tool_a", root, ["root"], tool_wait_ms=round(float(rng.uniform(200, 2000)), 3))
        node("tool_b", root, ["root"], tool_wait_ms=round(float(rng.uniform(200, 2000)), 3))
        join = node("join", a, ["tool_a", "tool_b"], delay=round(float(rng.uniform(50, 500)), 3))
        node("answer", join, ["join"], delay=round(float(rng.uniform(50, 500)), 3))
    return rows


# ------------------------------------------------------------------ the runs


def figures(ttft, e2e, itl, out, reused, prompt):
    """Means over completed requests; ITL over tokens (a request of n tokens
    has n - 1 gaps of its mean ITL)."""
    gaps = np.maximum(np.asarray(out) - 1, 0)
    return {"requests": len(ttft), "ttft": float(np.mean(ttft)), "e2e": float(np.mean(e2e)),
            "itl": float(np.sum(np.asarray(itl) * gaps) / max(gaps.sum(), 1)),
            "reuse": float(np.sum(reused) / np.sum(prompt))}


TIMINGS = {"fixed": {"type": "fixed", "prefill_ms": PREFILL_MS, "decode_ms": DECODE_MS},
           "polynomial": {"type": "polynomial"}}


def servesim_figures(path, fmt, timing):
    cfg = {"workload": {"trace": str(path), "format": fmt, "trace_block_size": TBS},
           "engine": dict(ENGINE, timing=TIMINGS[timing])}
    report = run(cfg)
    r = report.records
    done = r.status == 0
    out = r.output_tokens[done]
    ttft = (r.first_token_ms - r.arrival_ms)[done]
    e2e = (r.finish_ms - r.arrival_ms)[done]
    itl = np.where(out > 1, (r.finish_ms - r.first_token_ms)[done] / np.maximum(out - 1, 1), 0)
    return figures(ttft, e2e, itl, out, r.first_admission_cached_tokens[done],
                   r.input_length[done]), report


def peer_figures(python, path, fmt, timing):
    engine = dict(ENGINE, timing_model=TIMINGS[timing])
    proc = subprocess.run([python, "-c", PEER_CHILD, str(path), fmt, json.dumps(engine), str(TBS)],
                          capture_output=True, text=True, check=True)
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    rows = [x for x in data["rows"] if x["terminal_status"] == "completed"]
    col = lambda k: [x[k] for x in rows]  # noqa: E731
    return figures(col("ttft_ms"), col("e2e_latency_ms"), [x or 0.0 for x in col("itl_ms")],
                   col("output_length"), col("reused_input_tokens"), col("input_length")), data


def write(rows, path):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def agentic_v2(rows):
    """The form of `agentic_mooncake` Dynamo 1.6.1 reads (a v2 header,
    then rows with `not_before_ms` and `dependencies` of trigger
    `completion`): each `wait_for` id becomes a dependency whose `delay_ms`
    is the row's delay plus tool wait, so the request is ready at the latest
    finish plus both (servesim reads either form)."""
    out = [{"schema": "dynamo.agentic_mooncake", "version": 2, "block_size": TBS,
            "hash_id_scope": "local", "source": {"format": "servesim-bench", "digest": "-"}}]
    for r in rows:
        deps = r.get("wait_for", [])
        wait = r.get("delay", 0.0) + r.get("tool_wait_ms", 0.0)
        relation = "join" if len(deps) > 1 else "sequence"
        out.append({"request_id": r["request_id"], "play_id": r["session_id"],
                    "session_id": r["session_id"], "model": "servesim-bench",
                    "input_length": r["input_length"], "output_length": r["output_length"],
                    "hash_ids": r["hash_ids"], "not_before_ms": r.get("timestamp", 0.0),
                    "dependencies": [{"request_id": d, "trigger": "completion", "delay_ms": wait,
                                      "relation": relation} for d in deps]})
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peer-python", required=True,
                        help="an interpreter with ai-dynamo 1.6.1 installed")
    parser.add_argument("--no-write", action="store_true", help="print, do not append to RESULTS.md")
    parser.add_argument("--keep", help="write the traces to this folder and keep them")
    parser.add_argument("--speed", type=int, metavar="SESSIONS",
                        help="also time both end to end on a mooncake-delta trace of SESSIONS "
                             "sessions (median of --runs fresh processes each)")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    rng = np.random.default_rng(SEED)
    plain, delta = chat_traces(rng)
    graphs = agent_trace(rng)
    folder = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="sessions_peer_"))
    folder.mkdir(parents=True, exist_ok=True)
    traces = [("mooncake", "sessions.jsonl", plain), ("mooncake-delta", "sessions_delta.jsonl", delta),
              ("agentic_mooncake", "agents.jsonl", graphs)]
    table, notes = [], []
    for fmt, name, rows in traces:
        path = folder / name
        write(rows, path)
        peer_path = path
        if fmt == "agentic_mooncake":
            peer_path = folder / "agents_dynamo_v2.jsonl"
            write(agentic_v2(rows), peer_path)
        for timing in TIMINGS:
            # the same file on both sides; servesim reads the plain graph the same way
            ours, _ = servesim_figures(peer_path, fmt, timing)
            if peer_path != path and servesim_figures(path, fmt, timing)[0] != ours:
                notes.append(f"NOTE: servesim's figures of {name} and {peer_path.name} differ "
                             f"({timing}).")
            peer, _ = peer_figures(args.peer_python, peer_path, fmt, timing)
            table.append((f"{fmt}, {timing}", ours, peer))
    lines = [
        f"### {datetime.date.today().isoformat()} — working tree at commit {commit()} — "
        "sessions and agent graphs against the peer (`benchmarks/sessions_peer.py`)", "",
        f"{SESSIONS} generated chat sessions of {TURNS} turns (as `mooncake` with `session_id` / "
        f"`delay`, and the same sessions as `mooncake-delta`) and {SESSIONS} agent graphs of 5 "
        "requests (`agentic_mooncake`: a root, two tool calls, a join, an answer), one worker, "
        f"`block_size: 64`, 16,384 blocks, trace blocks of {TBS}; fixed pass times ({PREFILL_MS:g} ms "
        f"with prompt tokens, {DECODE_MS:g} ms without), and again with the polynomial pass-time "
        "model (pass time grows with the tokens computed, so cached tokens show in TTFT). Means over completed requests, from "
        "each simulator's per-request records; ITL over tokens; reuse = prompt tokens cached at "
        "first admission / prompt tokens. Deterministic (one run each). Reproduce: "
        "`python benchmarks/sessions_peer.py --peer-python PEER/bin/python`.", "",
        "| trace, timing | requests (servesim / peer) | TTFT ms | ITL ms | E2E ms | prefix reuse |",
        "|---|---:|---:|---:|---:|---:|"]
    for fmt, ours, peer in table:
        def cell(key, pct=False):
            a, b = ours[key], peer[key]
            diff = (a - b) / b * 100 if b else 0.0
            if pct:
                return f"{a:.2%} / {b:.2%}"
            return f"{a:,.2f} / {b:,.2f} ({diff:+.2f}%)"
        lines.append(f"| {fmt} | {ours['requests']} / {peer['requests']} | {cell('ttft')} | "
                     f"{cell('itl')} | {cell('e2e')} | {cell('reuse', True)} |")
    lines.append("")
    lines += notes or [f"servesim reads both forms of the agent graphs ({traces[2][1]}, "
                       "wait_for rows, and Dynamo's versioned agents_dynamo_v2.jsonl) to the "
                       "same figures; the table's row is the versioned file, as the peer reads it.",
                       ""]
    if args.speed:
        lines += speed(args, folder)
    publish(lines, not args.no_write)


def _timed(cmd) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - t


def speed(args, folder) -> list:
    """Wall time of a fresh process replaying a big mooncake-delta trace, for
    servesim (`servesim run`, Numba cache warm) and the peer, interleaved."""
    _, rows = chat_traces(np.random.default_rng(SEED), args.speed)
    path = folder / "sessions_delta_big.jsonl"
    write(rows, path)
    config = folder / "big.yaml"
    config.write_text(json.dumps({
        "workload": {"trace": str(path), "format": "mooncake-delta", "trace_block_size": TBS},
        "engine": dict(ENGINE, timing=TIMINGS["polynomial"]), "output": {"per_request": True}}))
    ours_cmd = [sys.executable, "-m", "servesim", "run", str(config), "-o", str(folder / "big_out")]
    engine = dict(ENGINE, timing_model=TIMINGS["polynomial"])
    peer_cmd = [args.peer_python, "-c", PEER_CHILD, str(path), "mooncake-delta",
                json.dumps(engine), str(TBS)]
    _timed(ours_cmd)  # fills the Numba cache
    ours, peer = [], []
    for _ in range(args.runs):
        ours.append(_timed(ours_cmd))
        peer.append(_timed(peer_cmd))
    summary = json.loads((folder / "big_out" / "summary.json").read_text())
    return [f"Speed: {args.speed:,} sessions ({len(rows):,} requests, mooncake-delta, polynomial "
            f"pass times, one worker, {summary['passes']:,} passes): servesim "
            f"{statistics.median(ours):.2f} s, peer {statistics.median(peer):.2f} s end to end "
            f"(median of {args.runs} fresh processes each, interleaved; the peer's figure "
            "includes capturing per-request records, as servesim writes requests.jsonl). "
            f"Machine: 2-core dev box, shared with other jobs ({machine()}).", ""]


if __name__ == "__main__":
    sys.exit(main())
