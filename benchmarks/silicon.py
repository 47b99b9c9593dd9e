"""servesim's `timing: {type: aic}` against measured vLLM runs.

For each vLLM aggregated row of aiconfigurator-core's `systems/silicon_sample.csv`
that servesim can express (a database model and GPU, bf16 or fp8 weights,
no attention DP), simulate that benchmark — the steady state of a closed
loop at the row's concurrency (requests evenly spaced at the loop's own
throughput, found by iterating Little's law from the lockstep loop), every
prompt `isl` tokens sharing nothing, `osl` output tokens, vLLM's defaults
otherwise — and compare its steady-state mean TTFT and TPOT
(requests after the first and before the last `concurrency` ones) with the
measured ones. Next to it, AIConfigurator's own static estimate
(`aiconfigurator.cli.api.cli_estimate`, aggregated mode) for the same row,
when the `aiconfigurator` package is installed. No constant is fitted to the
measurements.

    PYTHONPATH=$PWD python benchmarks/silicon.py [--max-rows N] [--models a,b] [--out rows.jsonl]

Needs aiconfigurator-core (`pip install 'servesim[aic]'`).
"""

import argparse
import json
import os
import sys
import time

import numpy as np

WAVES = 6  # requests = WAVES x concurrency (at least MIN_REQUESTS)
MIN_REQUESTS = 48
FIXED_POINT_ITERATIONS = 3


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

    if row["model_path"] not in models:
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


def row_config(row, requests, rate=None, arrival="constant"):
    tp = int(_num(row["tp_size"], 1))
    ep = int(_num(row["moe_ep_size"], 1))
    conc = int(_num(row["batch_size"]))
    engine = {
        "model": row["model_path"],
        "gpu": row["system"],
        "tensor_parallel_size": tp,
        "enable_expert_parallel": ep > 1,
        "max_num_seqs": max(256, conc),
        "timing": {"type": "aic"},
    }
    if row["precision"] == "fp8":
        engine["quantization"] = "fp8"
    return {
        "workload": {"synthetic": {
            "requests": requests, "input_tokens": int(row["isl"]), "output_tokens": int(row["osl"]),
            **({"arrival": "burst", "concurrency": conc} if rate is None
               else {"arrival": arrival, "rate": rate}), "seed": 1}},
        "engine": engine,
        "output": {"per_request": True},
    }


def simulate_row(row, arrival="constant"):
    from servesim.replay.api import run

    conc = int(_num(row["batch_size"]))
    requests = max(WAVES * conc, MIN_REQUESTS)
    # A deterministic closed loop stays in lockstep (every wave's prompts in
    # one pass); real clients drift apart. Their steady state has requests
    # starting evenly at the loop's throughput, concurrency / latency (Little's
    # law): start from the lockstep loop's latency and iterate that rate.
    report = run(row_config(row, requests))
    for _ in range(FIXED_POINT_ITERATIONS if arrival != "lockstep" else 0):
        rec = report.records
        e2e_s = float(np.mean(rec.finish_ms - rec.arrival_ms)) / 1000.0
        report = run(row_config(row, requests, rate=conc / e2e_s, arrival=arrival))
    rec = report.records
    order = np.argsort(rec.arrival_ms, kind="stable")
    steady = order[conc:-conc] if requests > 2 * conc else order
    ttft = rec.first_token_ms[steady] - rec.arrival_ms[steady]
    tpot = (rec.finish_ms[steady] - rec.first_token_ms[steady]) / np.maximum(rec.output_tokens[steady] - 1, 1)
    return float(np.mean(ttft)), float(np.mean(tpot)), report.summary["passes"]


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
                  batch_size=int(_num(row["batch_size"])), tp_size=tp,
                  pp_size=int(_num(row["pp_size"], 1)))
    from servesim.deployment.specs import load_model_spec

    if load_model_spec(row["model_path"]).num_experts:
        kwargs.update(moe_tp_size=moe_tp, moe_ep_size=ep)
    if row["precision"] == "fp8":
        kwargs.update(gemm_quant_mode="fp8", moe_quant_mode="fp8")
    try:
        r = cli_estimate(row["model_path"], row["system"], **kwargs)
    except Exception as exc:  # the estimator rejects some rows; report and go on
        print(f"  static estimate failed: {type(exc).__name__}: {str(exc)[:120]}", file=sys.stderr)
        return None
    return float(r.ttft), float(r.tpot)


def pct_err(pred, true):
    return abs(pred / true - 1.0) * 100.0


def summarize(results):
    """Per (model, GPU) and overall: n, median and p90 abs % error."""
    groups = {}
    for r in results:
        groups.setdefault((r["model"], r["gpu"]), []).append(r)
    groups[("all", "")] = results
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
    ap.add_argument("--no-static", action="store_true", help="skip AIConfigurator's own estimate")
    ap.add_argument("--out", default=None, help="write per-row results (JSON lines)")
    ap.add_argument("--arrival", default="constant", choices=("constant", "poisson", "lockstep"),
                    help="steady state: evenly spaced (default) or Poisson starts at the loop's "
                         "throughput, or the deterministic closed loop itself (lockstep)")
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
        if why is None and args.models and row["model_path"] not in args.models.split(","):
            why = "not selected"
        if why is None and args.max_isl and int(row["isl"]) > args.max_isl:
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
        ttft_true, tpot_true = float(row["silicon_ttft_ms"]), float(row["silicon_tpot_ms"])
        try:
            ttft, tpot, passes = simulate_row(row, args.arrival)
        except Exception as exc:
            print(f"row {row['id']}: simulation failed: {exc}", file=sys.stderr)
            continue
        r = {"id": row["id"], "model": row["model_path"], "gpu": row["system"],
             "tp": row["tp_size"], "ep": row["moe_ep_size"], "precision": row["precision"],
             "isl": int(row["isl"]), "osl": int(row["osl"]), "concurrency": int(_num(row["batch_size"])),
             "silicon_ttft_ms": ttft_true, "silicon_tpot_ms": tpot_true,
             "servesim_ttft_ms": ttft, "servesim_tpot_ms": tpot, "passes": passes,
             "servesim_ttft_err": pct_err(ttft, ttft_true), "servesim_tpot_err": pct_err(tpot, tpot_true)}
        static = None if args.no_static else static_estimate(row)
        if static is not None:
            r.update(aic_static_ttft_ms=static[0], aic_static_tpot_ms=static[1],
                     aic_static_ttft_err=pct_err(static[0], ttft_true),
                     aic_static_tpot_err=pct_err(static[1], tpot_true))
        results.append(r)
        if out:
            out.write(json.dumps(r) + "\n")
            out.flush()
        print(f"[{i + 1}/{len(chosen)} {time.perf_counter() - start:.0f}s] {row['id']}: TTFT "
              f"{ttft:.1f} vs {ttft_true:.1f}, TPOT {tpot:.2f} vs {tpot_true:.2f}"
              + (f" (static {static[0]:.1f}, {static[1]:.2f})" if static else ""), file=sys.stderr)
    print(markdown(summarize(results)))


if __name__ == "__main__":
    main()
