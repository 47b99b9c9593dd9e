"""servesim's `timing: {type: aic}` against measured vLLM runs.

For each vLLM aggregated row of aiconfigurator-core's `systems/silicon_sample.csv`
that servesim can express (a database model and GPU, bf16 or fp8 weights,
no attention DP), simulate the benchmark that measured it (InferenceX's
vLLM benchmark_serving.py run, see `model_of` and RANGE_RATIO below: a
closed loop of CONC clients all starting at once, CONC*10 random prompts
sharing nothing, prompt and output lengths uniform in [0.8 L, L], vLLM's
defaults otherwise; a Dynamo node job's row as 8 / (TP x PP) replicas, see
`replicas`) and compare its mean TTFT and TPOT over all requests with the
measured means. Each source's documented server flags (`source`): InferenceX's
(`INFERENCEX_SERVER`, max_num_seqs = CONC); NVIDIA's gap-analysis rows,
whose client is not recorded, replayed with uniform and with fixed lengths
(`protocols_of`). Rows whose measured TTFT says they waited for KV cache
(`kv_bound`) are summarized apart, with the concurrency servesim's engine
admitted (`admitted`). `benchmarks/silicon_breakdown.py` reads the `--out` rows and
shows where the error comes from. Next to it, AIConfigurator's own static estimate
(`aiconfigurator.cli.api.cli_estimate`, aggregated mode) for the same row,
when the `aiconfigurator` package is installed. No constant is fitted to the
measurements. The replays keep the API server's delay and the host time per
pass that `timing: aic` adds by default (docs/deployment.md);
`--no-host-terms` replays the pass times alone.

    PYTHONPATH=$PWD python benchmarks/silicon.py [--max-rows N] [--models a,b] [--gpus g] [--conc 4-64]
        [--max-isl N] [--max-osl N] [--out rows.jsonl] [--no-host-terms] [--no-static]

Needs aiconfigurator-core (`pip install 'servesim[aic]'`).
"""

import argparse
import json
import os
import sys
import time

import numpy as np

from servesim.deployment.model_names import resolve_model_name


def silicon_rows():
    import csv

    from servesim.deployment import aic

    path = os.path.join(aic._systems_dir(), "silicon_sample.csv")
    with open(path, newline="") as f:
        return [r for r in csv.DictReader(f) if r["backend"] == "vllm" and r["mode"] == "agg"]


def _num(value, default=0.0):
    try:
        return float(value) if value != "" else default
    except ValueError:
        return default


def expressible(row, models, systems):
    """None when servesim can simulate the row, else why not."""
    from servesim.deployment.gpus import GPUS

    if model_of(row) not in models:
        return "model not in the database's configs"
    if row["system"] not in systems or row["system"] not in GPUS:
        return "GPU not supported"
    if row["precision"] not in ("", "fp8", "bf16", "bfloat16"):
        return f"precision {row['precision']}"
    if _num(row["attention_dp_size"], 1) > 1:
        return "attention DP"
    if _num(row["pp_size"], 1) > 1:
        return "pipeline parallel"
    return None


# The measuring benchmark (InferenceX, ex-InferenceMAX; AISimulate replays its
# rows with the same workload): vLLM's benchmark_serving.py, `--dataset-name
# random --random-range-ratio 0.8 --num-prompts CONC*10 --max-concurrency CONC
# --request-rate inf --ignore-eos`, the server with `--max-num-batched-tokens
# 8192 --no-enable-prefix-caching`. Its random dataset draws each prompt and
# output length uniformly from [int(L * 0.8), L]; the reported TTFT and TPOT
# are means over all CONC*10 requests, the first wave included.
RANGE_RATIO = 0.8
PROMPTS_PER_CLIENT = 10
MAX_NUM_BATCHED_TOKENS = 8192


def vllm_default_max_num_seqs(system):
    """vLLM's default `max_num_seqs` for its OpenAI server on `system`
    (`EngineArgs.get_batch_defaults` in vLLM 0.12): 1024 on a
    GPU of at least 70 GiB that is not an A100, else 256. No row's benchmark
    sets it; it sizes the sampler's logits in vLLM's profiling pass, so the KV
    capacity."""
    from servesim.deployment.gpus import GPUS

    big = GPUS[system].hbm_bytes >= 70 * (1 << 30) and not system.startswith("a100")
    return 1024 if big else 256


# The Qwen3-32B, Qwen3-235B-A22B-FP8 and Llama-3.1-8B rows come from NVIDIA's
# own gap analysis (`source_file=.../aic-auto-gap-analysis/...`), whose client
# the package does not name: each is replayed both ways, with the lengths
# uniform in [0.8 L, L] (benchmark_serving) and fixed (`genai_perf`, the way
# the package's own `aiconfigurator eval` harness measures,
# aiconfigurator/eval/benchmarks/genai_perf_runner.py: genai-perf with fixed
# lengths (stddev 0), --concurrency CONC --request-count CONC*10), and the
# measured TTFT is expected between the two. `--protocol` replays every row
# one way.
PROTOCOLS = ("benchmark_serving", "genai_perf")

# Where a row was measured (`source`): InferenceX's runs (`source_file=
# YYYY-MM-DD.csv; model=...`), NVIDIA's gap analysis, a Dynamo node job, or
# another source (replayed as InferenceX's client, vLLM's server defaults).
SOURCES = ("inferencex", "gap_analysis", "dynamo", "other")

# InferenceX's vLLM server flags for its Llama-3.1-70B FP8 runs (issue 38,
# item 6): async scheduling, an fp8 KV cache, max_num_seqs = CONC, prefix
# caching off, 8192 batched tokens, gpu_memory_utilization 0.9 (vLLM's default).
INFERENCEX_SERVER = {"async_scheduling": True, "kv_cache_dtype": "fp8"}

# A row whose measured TTFT exceeds this at ISL <= 8192 queued for KV cache,
# not for compute: it is judged by the concurrency its engine admitted and
# reported apart.
KV_BOUND_TTFT_MS = 5000.0
KV_BOUND_MAX_ISL = 8192


def source(row) -> str:
    """Which of SOURCES measured the row (its `silicon_data_source`)."""
    import re

    text = row["silicon_data_source"]
    if "gtl_job_id=" in text:
        return "dynamo"
    if "aic-auto-gap-analysis" in text:
        return "gap_analysis"
    if re.search(r"source_file=\d{4}-\d{2}-\d{2}\.csv", text) and "model=" in text:
        return "inferencex"
    return "other"


def kv_bound(row) -> bool:
    """Whether the row's measured TTFT says it waited for KV cache."""
    return float(row["silicon_ttft_ms"]) > KV_BOUND_TTFT_MS and int(row["isl"]) <= KV_BOUND_MAX_ISL

# The rows of NVIDIA's Dynamo node jobs (`gtl_job_id=... image=...ai-dynamo/
# ...-runtime`) measure one 8-GPU node serving the row's deployment as
# 8 / (TP x PP) aggregated replicas behind Dynamo's frontend, and their
# `batch_size` is the node's concurrency: the job's TRT-LLM rows hold 32, 64,
# 128, 224 clients at TP 1, 2, 4, 8, and its vLLM Qwen3-32B fp8 rows (TP 1,
# c 24; TP 2, c 48) a TPOT below the database's own decode-only step for that
# many requests on one replica (TP 2: 11.6 ms measured, 15.7-19.5 ms for
# 48 decodes of 4,500 tokens), while their TTFT is one prompt's prefill
# (TP 2: 185 ms measured, 180 ms in the database). servesim replays such a row
# as that many workers behind a round-robin router (Dynamo's default).
NODE_GPUS = 8


def replicas(row):
    """Aggregated replicas that served the row: 8 / (TP x PP) for a Dynamo
    node job, else 1."""
    if "gtl_job_id=" not in row["silicon_data_source"]:
        return 1
    gpus = int(_num(row["tp_size"], 1)) * int(_num(row["pp_size"], 1))
    return max(NODE_GPUS // gpus, 1)


def model_of(row):
    """The row's model as the database names it (the package's alias table,
    servesim/deployment/model_names.py: `meta-llama/Llama-3.1-70B` is the
    database's `meta-llama/Meta-Llama-3.1-70B`, as the package's InferenceX
    adapter maps `llama70b`)."""
    return resolve_model_name(row["model_path"])


def _lengths(n):
    return {"distribution": "uniform", "min": max(int(n * RANGE_RATIO), 1), "max": n}


# --no-host-terms: the pass times alone, without the API server's delay and
# the host time per pass that `timing: aic` adds by default (docs/deployment.md)
NO_HOST_TERMS = {"frontend": {"request_ms": 0, "tokenize_us_per_token": 0}, "host_ms_per_pass": 0}


def row_config(row, protocol=None, host_terms=True):
    """servesim's config for the benchmark behind one silicon row (without
    `host_terms`: `NO_HOST_TERMS`)."""
    protocol = protocol or "benchmark_serving"
    tp = int(_num(row["tp_size"], 1))
    ep = int(_num(row["moe_ep_size"], 1))
    conc = int(_num(row["batch_size"]))
    isl, osl = int(row["isl"]), int(row["osl"])
    engine = {
        "model": model_of(row),
        "gpu": row["system"],
        "tensor_parallel_size": tp,
        "enable_expert_parallel": ep > 1,
        "max_num_seqs": max(vllm_default_max_num_seqs(row["system"]), conc),
        "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS,
        "max_model_len": isl + osl,
        "enable_prefix_caching": False,
        "timing": {"type": "aic"},
    }
    if row["precision"] == "fp8":
        engine["quantization"] = "fp8"
    if source(row) == "inferencex":
        engine.update(INFERENCEX_SERVER, max_num_seqs=conc)
    if not host_terms:
        engine.update(NO_HOST_TERMS)
    return {
        "workload": {"synthetic": {
            "requests": PROMPTS_PER_CLIENT * conc,
            "input_tokens": _lengths(isl) if protocol == "benchmark_serving" else isl,
            "output_tokens": _lengths(osl) if protocol == "benchmark_serving" else osl,
            "arrival": "burst", "concurrency": conc, "seed": 1}},
        "engine": engine,
        "cluster": {"workers": replicas(row), "router": "round_robin"},
        "output": {"per_request": True},
    }


def simulate_row(row, protocol=None, host_terms=True):
    """Mean TTFT and TPOT (ms) over all requests of the simulated benchmark:
    a closed loop of CONC clients that all start at 0, each sending its next
    prompt when its last one finishes; TPOT per request is
    (latency - TTFT) / (output tokens - 1), as benchmark_serving.py computes it."""
    from servesim.replay.api import run

    report = run(row_config(row, protocol, host_terms))
    rec = report.records
    ttft = rec.first_token_ms - rec.arrival_ms
    many = rec.output_tokens > 1
    tpot = (rec.finish_ms[many] - rec.first_token_ms[many]) / (rec.output_tokens[many] - 1)
    return float(np.mean(ttft)), float(np.mean(tpot)), report.summary["passes"], admitted(rec)


def admitted(rec) -> float:
    """The concurrency the engine admitted: the time-weighted mean number of
    requests between their first scheduling and their finish."""
    span = float(np.nanmax(rec.finish_ms) - np.nanmin(rec.arrival_ms))
    held = np.nansum(rec.finish_ms - rec.first_scheduled_ms)
    return float(held / span) if span > 0 else 0.0


def protocols_of(row, protocol=None):
    """The replays of a row: `protocol` if given, else both for a
    gap-analysis row (uniform and fixed lengths), else InferenceX's client."""
    if protocol is not None:
        return [protocol]
    return list(PROTOCOLS) if source(row) == "gap_analysis" else [PROTOCOLS[0]]


def replay_row(row, protocol, static=True, host_terms=True):
    """One replay of a row against its measurement (a result line), or None
    if the simulation failed."""
    ttft_true, tpot_true = float(row["silicon_ttft_ms"]), float(row["silicon_tpot_ms"])
    try:
        ttft, tpot, passes, held = simulate_row(row, protocol, host_terms)
    except Exception as exc:
        print(f"row {row['id']}: simulation failed: {exc}", file=sys.stderr)
        return None
    r = {"id": row["id"], "model": row["model_path"], "gpu": row["system"],
         "tp": row["tp_size"], "ep": row["moe_ep_size"], "precision": row["precision"],
         "protocol": protocol, "source": source(row), "kv_bound": kv_bound(row),
         "replicas": replicas(row), "isl": int(row["isl"]), "osl": int(row["osl"]),
         "concurrency": int(_num(row["batch_size"])), "admitted": held,
         "silicon_ttft_ms": ttft_true, "silicon_tpot_ms": tpot_true,
         "servesim_ttft_ms": ttft, "servesim_tpot_ms": tpot, "passes": passes,
         "servesim_ttft_err": pct_err(ttft, ttft_true), "servesim_tpot_err": pct_err(tpot, tpot_true)}
    estimate = static_estimate(row) if static else None
    if estimate is not None:
        r.update(aic_static_ttft_ms=estimate[0], aic_static_tpot_ms=estimate[1],
                 aic_static_ttft_err=pct_err(estimate[0], ttft_true),
                 aic_static_tpot_err=pct_err(estimate[1], tpot_true))
    return r


def ttft_between(results):
    """`(rows, of)`: the gap-analysis rows whose measured TTFT lies between
    their uniform- and fixed-length replays' (None: no row replayed both ways)."""
    by_row = {}
    for r in results:
        if r["source"] == "gap_analysis":
            by_row.setdefault(r["id"], {})[r["protocol"]] = r
    pairs = [v for v in by_row.values() if len(v) == len(PROTOCOLS)]
    if not pairs:
        return None
    inside = sum(1 for v in pairs
                 if min(x["servesim_ttft_ms"] for x in v.values()) <= v[PROTOCOLS[0]]["silicon_ttft_ms"]
                 <= max(x["servesim_ttft_ms"] for x in v.values()))
    return inside, len(pairs)


def static_estimate(row):
    """AIConfigurator's own aggregated estimate (TTFT, TPOT) or None."""
    try:
        from aiconfigurator.cli.api import cli_estimate
    except ImportError:
        return None
    tp = int(_num(row["tp_size"], 1))
    ep = int(_num(row["moe_ep_size"], 1)) or 1
    moe_tp = int(_num(row["moe_tp_size"], 0)) or (1 if ep > 1 else tp)
    kwargs = dict(backend_name="vllm", isl=int(row["isl"]), osl=int(row["osl"]),
                  batch_size=max(int(_num(row["batch_size"])) // replicas(row), 1), tp_size=tp,
                  pp_size=int(_num(row["pp_size"], 1)))
    from servesim.deployment.specs import load_model_spec

    if load_model_spec(model_of(row)).num_experts:
        kwargs.update(moe_tp_size=moe_tp, moe_ep_size=ep)
    if row["precision"] == "fp8":
        kwargs.update(gemm_quant_mode="fp8", moe_quant_mode="fp8")
    try:
        r = cli_estimate(model_of(row), row["system"], **kwargs)
    except Exception as exc:  # the estimator rejects some rows; report and go on
        print(f"  static estimate failed: {type(exc).__name__}: {str(exc)[:120]}", file=sys.stderr)
        return None
    return float(r.ttft), float(r.tpot)


def pct_err(pred, true):
    return abs(pred / true - 1.0) * 100.0


def summarize(results):
    """Per (model, GPU) and overall, and per source (KV-bound rows apart): n,
    median and p90 abs % error."""
    groups = {}
    first = [r for r in results if r["protocol"] == PROTOCOLS[0]] or results
    for r in first:
        groups.setdefault((r["model"], r["gpu"]), []).append(r)
    groups[("all", "")] = first
    for r in results:
        label = r["source"] + (", KV-bound" if r["kv_bound"] else "") + ", " + r["protocol"]
        groups.setdefault((label, ""), []).append(r)
    table = []
    for (model, gpu), rows in groups.items():
        line = {"model": model, "gpu": gpu, "rows": len(rows)}
        for who in ("servesim", "aic_static"):
            for metric in ("ttft", "tpot"):
                errs = [r[f"{who}_{metric}_err"] for r in rows if r.get(f"{who}_{metric}_err") is not None]
                line[f"{who}_{metric}"] = (float(np.median(errs)), float(np.percentile(errs, 90)), len(errs)) if errs else None
        table.append(line)
    return table


def markdown(table) -> str:
    def cell(v):
        return "–" if v is None else f"{v[0]:.1f} / {v[1]:.1f}"
    out = ["| model | GPU | rows | servesim TTFT | AIC static TTFT | servesim TPOT | AIC static TPOT |",
           "|---|---|---|---|---|---|---|"]
    for t in table:
        out.append(f"| {t['model']} | {t['gpu']} | {t['rows']} | {cell(t['servesim_ttft'])} | "
                   f"{cell(t['aic_static_ttft'])} | {cell(t['servesim_tpot'])} | {cell(t['aic_static_tpot'])} |")
    return "\n".join(out) + "\n\n(median / p90 absolute % error against the measured TTFT and TPOT)"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-rows", type=int, default=None, help="at most N rows per (model, GPU)")
    ap.add_argument("--models", default=None, help="comma-separated model names")
    ap.add_argument("--max-isl", type=int, default=None)
    ap.add_argument("--max-osl", type=int, default=None)
    ap.add_argument("--no-static", action="store_true", help="skip AIConfigurator's own estimate")
    ap.add_argument("--out", default=None, help="write per-row results (JSON lines)")
    ap.add_argument("--protocol", default=None, choices=PROTOCOLS,
                    help="client protocol (default benchmark_serving: InferenceX's)")
    ap.add_argument("--conc", default=None, help="concurrency range LO-HI (e.g. 4-64)")
    ap.add_argument("--gpus", default=None, help="comma-separated GPU names")
    ap.add_argument("--no-host-terms", action="store_true",
                    help="leave out the API server's delay and the host time per pass")
    args = ap.parse_args(argv)

    import logging

    logging.disable(logging.WARNING)
    from servesim.deployment import aic
    from servesim.deployment.specs import database_models

    models = set(database_models())
    systems = set(aic.database_systems())
    rows = silicon_rows()
    skipped = {}
    chosen, per_group = [], {}
    for row in rows:
        why = expressible(row, models, systems)
        if why is None and args.models and model_of(row) not in args.models.split(",") \
                and row["model_path"] not in args.models.split(","):
            why = "not selected"
        if why is None and args.max_isl and int(row["isl"]) > args.max_isl:
            why = "not selected"
        if why is None and args.max_osl and int(row["osl"]) > args.max_osl:
            why = "not selected"
        if why is None and args.gpus and row["system"] not in args.gpus.split(","):
            why = "not selected"
        if why is None and args.conc:
            lo, hi = (int(x) for x in args.conc.split("-"))
            if not lo <= int(_num(row["batch_size"])) <= hi:
                why = "not selected"
        key = (row["model_path"], row["system"])
        if why is None and args.max_rows is not None and per_group.get(key, 0) >= args.max_rows:
            why = "not selected"
        if why:
            skipped[why] = skipped.get(why, 0) + 1
            continue
        per_group[key] = per_group.get(key, 0) + 1
        chosen.append(row)
    print(f"{len(rows)} vLLM aggregated rows; simulating {len(chosen)}; skipped: {skipped}", file=sys.stderr)
    results = []
    out = open(args.out, "w") if args.out else None
    start = time.perf_counter()
    for i, row in enumerate(chosen):
        for protocol in protocols_of(row, args.protocol):
            r = replay_row(row, protocol, static=not args.no_static and protocol == PROTOCOLS[0],
                           host_terms=not args.no_host_terms)
            if r is None:
                continue
            results.append(r)
            if out:
                out.write(json.dumps(r) + "\n")
                out.flush()
            print(f"[{i + 1}/{len(chosen)} {time.perf_counter() - start:.0f}s] {row['id']} "
                  f"({protocol}): TTFT {r['servesim_ttft_ms']:.1f} vs {r['silicon_ttft_ms']:.1f}, "
                  f"TPOT {r['servesim_tpot_ms']:.2f} vs {r['silicon_tpot_ms']:.2f}"
                  + (f" (static {r['aic_static_ttft_ms']:.1f}, {r['aic_static_tpot_ms']:.2f})"
                     if "aic_static_ttft_ms" in r else ""), file=sys.stderr)
    print(markdown(summarize(results)))
    between = ttft_between(results)
    if between is not None:
        print(f"\nGap-analysis rows whose measured TTFT lies between the uniform- and the "
              f"fixed-length replay: {between[0]} of {between[1]}")


if __name__ == "__main__":
    main()
