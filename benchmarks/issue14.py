"""Issue 14's speed table: servesim end to end against NVIDIA Dynamo 1.6.1's
offline replay (the peer), interleaved, as medians of per-pair ratios.

Every measurement is a fresh process, timed from outside: wall time, user +
system CPU time and peak RSS of the child (os.wait4). servesim runs as users
run it, `python -m servesim run CONFIG -o DIR -q` (it reads the trace,
simulates, writes summary.json, requests.jsonl and itl_quantiles.json); the
peer runs `benchmarks/peer_replay.py` in its own interpreter (the replay
reads the same trace file itself). Within one repetition every runner of a scenario runs once, in
an order that rotates between repetitions; a ratio is taken within one
repetition (pairs run back to back) and the median over repetitions is
reported, so slow drifts in the machine's load cancel out.

Parts (all on block 64, 16,384 blocks, polynomial pass times, as the peer):
  a  the whole Mooncake conversation trace, 1 worker: servesim / peer
  b  each feature on the whole trace relative to the plain 1-worker run of
     the same program (async scheduling; launch timing; the CPU tier with the
     offloading and simple_cpu connectors; attention DP 2; 4 workers with
     kv_aware routing; 2 prefill + 2 decode workers; --pass-log; telemetry
     every simulated second), and servesim / peer where the peer has it
  c  synthetic workloads of 10k, 100k and 1M requests (1,024 prompt and 128
     output tokens, Poisson arrivals at --rate/s; the peer generates the same
     with `--synthetic`), servesim / peer, with peak RSS
  d  the whole trace with an empty Numba cache (SERVESIM_CACHE_DIR pointing
     at a new folder: every kernel compiles), against the peer's plain run

Several servesim trees can be timed side by side (e.g. a checkout of the
code before a change and the current one): `--tree LABEL=PATH` (PATH goes on
PYTHONPATH; each tree gets its own warm Numba cache, filled by an unrecorded
first run).

    python benchmarks/issue14.py                                   # all parts, this tree
    python benchmarks/issue14.py --tree before=/tmp/before --tree after=. -n 5
    python benchmarks/issue14.py --parts a,c --sizes 10000,100000 -n 3 --write

Needs the peer installed in a virtual environment of its own (how:
benchmarks/peer_replay.py; `--peer-python`, default /work/peer-venv/bin/python). `--write` appends the tables to
benchmarks/RESULTS.md; `--json FILE` keeps every raw measurement.
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

import yaml

from results_file import commit, machine, publish  # a sibling module

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TRACE = HERE / "traces" / "mooncake_conversation_trace.jsonl.gz"
PEER_PYTHON = "/work/peer-venv/bin/python"
PEER_DRIVER = HERE / "peer_replay.py"

ENGINE = {"block_size": 64, "num_gpu_blocks": 16384, "timing": {"type": "polynomial"}}
TRACE_WORKLOAD = {"trace": str(TRACE), "trace_block_size": 512}
LAUNCH = {"decode_ms": 6.52, "piecewise_ms": 73.72, "eager_ms": 180.81,
          "eager_queue_fraction": 0.382, "max_cudagraph_capture_size": 4096}
CPU_BLOCKS = 32768


def cpu_tier(connector):
    return {"num_cpu_blocks": CPU_BLOCKS, "bytes_per_token": 131072, "d2h_gbps": 25,
            "h2d_gbps": 25, "connector": connector}


# name -> (engine additions, cluster, servesim CLI flags, peer flags or None)
FEATURES = {
    "async scheduling": ({"async_scheduling": True}, {}, [], None),
    "launch (async)": ({"async_scheduling": True, "launch": LAUNCH}, {}, [], None),
    "CPU tier (offloading)": ({"kv_offloading": cpu_tier("offloading")}, {}, [],
                             ["--host-offload", str(CPU_BLOCKS)]),
    "CPU tier (simple_cpu)": ({"kv_offloading": cpu_tier("simple_cpu")}, {}, [],
                             ["--host-offload", str(CPU_BLOCKS)]),
    "attention DP 2": ({}, {"data_parallel_size": 2}, [], ["--dp", "2"]),
    "4 workers kv_aware": ({}, {"workers": 4, "router": "kv_aware"}, [],
                            ["--workers", "4", "--router", "kv_router"]),
    "2 prefill + 2 decode": ({}, {"mode": "disaggregated", "prefill_workers": 2,
                                  "decode_workers": 2,
                                  "kv_transfer": {"bytes_per_token": 131072,
                                                  "bandwidth_gbps": 50}}, [],
                             ["--disagg", "2", "2"]),
    "--pass-log": ({}, {}, ["--pass-log"], None),
    "telemetry every 1 s": ({}, {}, ["--telemetry-interval-ms", "1000"],
                            ["--telemetry-ms", "1000"]),
}


def trace_config(engine=None, cluster=None):
    cfg = {"workload": dict(TRACE_WORKLOAD), "engine": {**ENGINE, **(engine or {})}}
    if cluster:
        cfg["cluster"] = cluster
    return cfg


def synthetic_config(requests, rate):
    return {"workload": {"synthetic": {"requests": requests, "input_tokens": 1024,
                                       "output_tokens": 128, "arrival": "poisson",
                                       "rate": rate, "seed": 42}},
            "engine": dict(ENGINE)}


class Runner:
    """One way to run a scenario: a servesim tree or the peer."""

    def __init__(self, label, tree=None, peer_python=None, cache=None):
        self.label, self.tree, self.peer_python, self.cache = label, tree, peer_python, cache

    @property
    def is_peer(self):
        return self.peer_python is not None

    def command(self, scenario, out_dir):
        """(argv, environment, working folder). A tree runs in its own folder:
        `python -m` puts the working folder first on sys.path, ahead of
        PYTHONPATH, so from another tree's folder it would import that one."""
        if self.is_peer:
            return [self.peer_python, str(PEER_DRIVER), *scenario["peer"]], None, ROOT
        env = dict(os.environ, PYTHONPATH=str(self.tree), SERVESIM_CACHE_DIR=str(self.cache))
        env.pop("NUMBA_CACHE_DIR", None)
        return [sys.executable, "-m", "servesim", "run", scenario["config_path"], "-o", out_dir,
                "-q", *scenario["flags"]], env, self.tree


def timed(cmd, env, cwd):
    """(wall s, user + system CPU s, peak RSS MB) of one child process."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    stderr_chunks = []
    # stderr is small (warnings); read it before reaping so the pipe cannot fill
    stderr_chunks.append(proc.stderr.read())
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}\n"
                         f"{b''.join(stderr_chunks).decode(errors='replace')[-3000:]}")
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
            "user_s": usage.ru_utime, "rss_mb": usage.ru_maxrss / 1024}


def run_one(runner, scenario, cold_root=None):
    with tempfile.TemporaryDirectory(prefix="issue14_") as out:
        cmd, env, cwd = runner.command(scenario, out)
        if cold_root is not None:  # an empty Numba cache: every kernel compiles
            env = dict(env, SERVESIM_CACHE_DIR=tempfile.mkdtemp(dir=cold_root))
        m = timed(cmd, env, cwd)
    m["load"] = os.getloadavg()[0]
    return m


def measure(runners, scenarios, reps, log, cold_root=None):
    """{scenario: {runner label: [measurement per rep]}}, interleaved: in
    repetition k the (scenario, runner) pairs run in an order rotated by k."""
    out = {s["name"]: {r.label: [] for r in runners} for s in scenarios}
    for k in range(reps):
        shift = k % len(runners)
        for s in scenarios:
            order = runners[shift:] + runners[:shift]
            for r in order:
                if r.is_peer and s["peer"] is None:
                    continue
                cold = cold_root if (cold_root is not None and not r.is_peer) else None
                m = run_one(r, s, cold)
                out[s["name"]][r.label].append(m)
                log(f"  rep {k + 1}/{reps} {s['name']:<24} {r.label:<8} wall {m['wall_s']:7.2f} s  "
                    f"cpu {m['cpu_s']:7.2f} s  rss {m['rss_mb']:6.0f} MB  load {m['load']:.1f}")
    return out


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def ratios(a, b, key="wall_s"):
    """Per-repetition a/b, paired by index."""
    return [x[key] / y[key] for x, y in zip(a, b)]


def fmt(x, spec=".2f", suffix=""):
    return "–" if x is None else f"{x:{spec}}{suffix}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", default=[], metavar="LABEL=PATH",
                        help="a servesim source tree to time (repeatable; default: this one)")
    parser.add_argument("--peer-python", default=PEER_PYTHON)
    parser.add_argument("--parts", default="a,b,c,d")
    parser.add_argument("-n", "--reps", type=int, default=5, help="repetitions (parts a, b)")
    parser.add_argument("--synthetic-reps", type=int, default=3,
                        help="repetitions of part c (the 1M run takes minutes)")
    parser.add_argument("--big-reps", type=int, default=2,
                        help="repetitions of part c's sizes from 1M requests on")
    parser.add_argument("--cold-reps", type=int, default=2)
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--rate", type=float, default=40.0, help="synthetic arrivals per second")
    parser.add_argument("--features", help="comma-separated subset of part b's features (names as in FEATURES)")
    parser.add_argument("--cache-root", help="keep each tree's warm Numba cache here "
                        "(default: a new temporary folder)")
    parser.add_argument("--note", default="")
    parser.add_argument("--json", help="also write every measurement to this file")
    parser.add_argument("--write", action="store_true", help="append the tables to RESULTS.md")
    args = parser.parse_args()
    parts = set(args.parts.split(","))

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    work = Path(tempfile.mkdtemp(prefix="issue14_"))
    trees = [t.split("=", 1) for t in args.tree] or [["servesim", str(ROOT)]]
    cache_root = Path(args.cache_root or work)
    runners = [Runner(label, tree=Path(path).resolve(), cache=cache_root / f"cache-{label}")
               for label, path in trees]
    peer = Runner("peer", peer_python=args.peer_python)
    everyone = runners + [peer]

    def scenario(name, config, flags=(), peer_flags=None, trace=True):
        path = work / f"{len(list(work.glob('*.yaml')))}.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        pf = None if peer_flags is None else ([str(TRACE)] if trace else []) + list(peer_flags)
        return {"name": name, "config_path": str(path), "flags": list(flags), "peer": pf}

    plain = scenario("whole trace, 1 worker", trace_config(), peer_flags=[])
    chosen = FEATURES if not args.features else {k: FEATURES[k] for k in args.features.split(",")}
    feats = [scenario(name, trace_config(eng, cl), flags, pf)
             for name, (eng, cl, flags, pf) in chosen.items()] if "b" in parts else []
    log(f"warming each tree's Numba cache ({cache_root}): one unrecorded run of each trace scenario")
    for r in runners:
        for s in [plain, *feats]:
            run_one(r, s)
    raw = {}
    started = datetime.datetime.now(datetime.timezone.utc)
    load_before = os.getloadavg()
    if parts & {"a", "b"}:
        log("parts a/b")
        raw.update(measure(everyone, [plain, *feats], args.reps, log))
    sizes = [int(x) for x in args.sizes.split(",") if x] if "c" in parts else []
    synth = [scenario(f"synthetic {n:,}", synthetic_config(n, args.rate), (),
                      ["--synthetic", "1024", "128", str(n), "--rate", str(args.rate)], trace=False)
             for n in sizes]
    for n, s in zip(sizes, synth):
        log(f"part c: {s['name']}")
        raw.update(measure(everyone, [s], args.big_reps if n >= 1_000_000 else args.synthetic_reps,
                           log))
    if "d" in parts:
        log("part d: cold")
        cold_scn = dict(plain, name="whole trace, cold cache")
        raw.update(measure(everyone, [cold_scn], args.cold_reps, log, cold_root=work))
    load_after = os.getloadavg()

    labels = [r.label for r in runners]
    lines = [f"### {datetime.date.today().isoformat()} — commit {commit()} — issue 14 speed table"
             + (f" — {args.note}" if args.note else ""), "",
             f"Machine: {machine()}. Started {started:%H:%M} UTC; load average (1/5/15 min) "
             f"{'/'.join(f'{x:.1f}' for x in load_before)} before, "
             f"{'/'.join(f'{x:.1f}' for x in load_after)} after.",
             f"Trees: {', '.join(f'{r.label} = {r.tree}' for r in runners)}; peer: NVIDIA Dynamo "
             f"1.6.1 offline replay via peer_replay.py. `python benchmarks/issue14.py "
             f"{' '.join(sys.argv[1:])}`.", "",
             "Wall and CPU (user + system) seconds are medians over repetitions; a ratio is the "
             "median of per-repetition ratios (pairs run back to back, order rotating).", ""]

    if "a" in parts or "c" in parts:
        lines += ["| workload | program | runs | wall s | CPU s | peak RSS MB | wall / peer "
                  "| CPU / peer |", "|---|---|---:|---:|---:|---:|---:|---:|"]
        for s in ([plain] if "a" in parts else []) + synth:
            p = raw[s["name"]]["peer"]
            for label in labels + ["peer"]:
                ms = raw[s["name"]][label]
                is_peer = label == "peer"
                lines.append(
                    f"| {s['name']} | {label if not is_peer else 'Dynamo 1.6.1'} | {len(ms)} | "
                    f"{fmt(med(m['wall_s'] for m in ms))} | {fmt(med(m['cpu_s'] for m in ms))} | "
                    f"{fmt(med(m['rss_mb'] for m in ms), '.0f')} | "
                    f"{'' if is_peer else fmt(med(ratios(ms, p)), '.2f', '×')} | "
                    f"{'' if is_peer else fmt(med(ratios(ms, p, 'cpu_s')), '.2f', '×')} |")
        lines.append("")
    if "b" in parts:
        head = " | ".join(f"{lab} wall s | {lab} × plain" for lab in labels)
        lines += [f"| feature (whole trace) | {head} | peer wall s | peer × plain | "
                  + " | ".join(f"{lab} / peer" for lab in labels) + " |",
                  "|---|" + "---:|" * (2 * len(labels) + 2 + len(labels))]
        for s in feats:
            cells = []
            for lab in labels:
                ms = raw[s["name"]][lab]
                cells += [fmt(med(m["wall_s"] for m in ms)),
                          fmt(med(ratios(ms, raw[plain["name"]][lab])), ".2f", "×")]
            p = raw[s["name"]]["peer"]
            cells += [fmt(med(m["wall_s"] for m in p)) if p else "n/a",
                      fmt(med(ratios(p, raw[plain["name"]]["peer"])), ".2f", "×") if p else "n/a"]
            cells += [fmt(med(ratios(raw[s["name"]][lab], p)), ".2f", "×") if p else "n/a"
                      for lab in labels]
            lines.append(f"| {s['name']} | " + " | ".join(cells) + " |")
        lines.append("")
    if "d" in parts:
        name = "whole trace, cold cache"
        lines += ["| cold (empty Numba cache), whole trace | runs | wall s | CPU s | "
                  "wall / peer (plain run) |", "|---|---:|---:|---:|---:|"]
        p = raw[name]["peer"]
        for lab in labels:
            ms = raw[name][lab]
            lines.append(f"| {lab} | {len(ms)} | {fmt(med(m['wall_s'] for m in ms))} | "
                         f"{fmt(med(m['cpu_s'] for m in ms))} | {fmt(med(ratios(ms, p)), '.2f', '×')} |")
        lines.append("")
    if args.json:
        Path(args.json).write_text(json.dumps(raw, indent=1))
    publish(lines, args.write)


if __name__ == "__main__":
    main()
