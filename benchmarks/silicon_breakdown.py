"""Where servesim's silicon error comes from, row by row.

Reads the per-row results of `benchmarks/silicon.py --out rows.jsonl` and
prints, per row, measured vs simulated TTFT and TPOT and their ratio (the
sign of the error), the median ratio and absolute error by TP, ISL, OSL and
concurrency, and — where a (model, GPU, TP, ISL, concurrency) group holds
three or more OSLs — a decomposition of the measured TPOT:

    TPOT(osl) = Td + (c - 1) X / (osl - 1)

fitted by least squares over the OSLs: in a closed loop of `c` clients each
request's decode shares passes with the prefills of the other c - 1 clients'
next requests, so Td is the decode step and X what one prompt's prefill adds
to the passes the decoders sit in. The same fit of servesim's TPOT, and
(with aiconfigurator-core) the database's own increment for one prompt of
ISL tokens in a pass of c - 1 decodes, show whether the prefill is priced
right; TTFT / X and (TTFT - X) / Td show what the measured TTFT holds beyond
one prefill.

    PYTHONPATH=$PWD python benchmarks/silicon_breakdown.py rows.jsonl [--no-database]
"""

import argparse
import json
import logging
import sys

import numpy as np

from servesim.deployment.model_names import resolve_model_name


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def per_row(rows):
    print(f"{'model':28} {'gpu':9} {'prec':4} {'tp':>2} {'isl':>5} {'osl':>5} {'c':>3} {'rep':>3} | "
          f"{'TTFT meas':>9} {'sim':>8} {'sim/m':>5} | {'TPOT meas':>9} {'sim':>6} {'sim/m':>5}")
    for r in sorted(rows, key=lambda r: (r["model"], r["gpu"], r["precision"], int(r["tp"]), r["isl"],
                                          r["osl"], r["concurrency"])):
        print(f"{r['model'][-28:]:28} {r['gpu']:9} {r['precision'] or 'bf16':4} {r['tp']:>2} {r['isl']:5} "
              f"{r['osl']:5} {r['concurrency']:3} {r.get('replicas', 1):3} | {r['silicon_ttft_ms']:9.1f} "
              f"{r['servesim_ttft_ms']:8.1f} {r['servesim_ttft_ms'] / r['silicon_ttft_ms']:5.2f} | "
              f"{r['silicon_tpot_ms']:9.2f} {r['servesim_tpot_ms']:6.2f} "
              f"{r['servesim_tpot_ms'] / r['silicon_tpot_ms']:5.2f}")


def by_factor(rows):
    def line(name, sel):
        tr = [r["servesim_ttft_ms"] / r["silicon_ttft_ms"] for r in sel]
        pr = [r["servesim_tpot_ms"] / r["silicon_tpot_ms"] for r in sel]
        print(f"  {name:22} n={len(sel):3}  TTFT sim/meas median {np.median(tr):.2f} (low in {sum(x < 1 for x in tr)}),"
              f" |err| {np.median([abs(x - 1) * 100 for x in tr]):5.1f} %   TPOT sim/meas median "
              f"{np.median(pr):.2f} (low in {sum(x < 1 for x in pr)}), |err| {np.median([abs(x - 1) * 100 for x in pr]):5.1f} %")

    for key in sorted({(r["model"], r["gpu"]) for r in rows}):
        group = [r for r in rows if (r["model"], r["gpu"]) == key]
        print(f"{key[0]} on {key[1]}:")
        line("all", group)
        for factor in ("precision", "tp", "isl", "osl", "concurrency"):
            for v in sorted({r[factor] for r in group}, key=lambda x: (len(str(x)), str(x))):
                line(f"{factor}={v or 'bf16'}", [r for r in group if r[factor] == v])


def _database_increment(cache, r, c):
    """The database's added time of one prompt of ISL tokens in a pass of
    c - 1 decodes of context ISL + OSL / 2, and its decode step of c."""
    from servesim.deployment import aic
    from servesim.deployment.config import DeploymentConfig

    sys.path.insert(0, "benchmarks")
    import silicon

    key = (r["model"], r["gpu"], r["tp"], r["precision"])
    if key not in cache:
        cache[key] = aic.DirectModel(DeploymentConfig(
            model=resolve_model_name(r["model"]), gpu=r["gpu"],
            tensor_parallel_size=int(r["tp"]), quantization="fp8" if r["precision"] == "fp8" else None))
    d = cache[key]
    ctx = r["isl"] + 500
    return d(r["isl"], 1, 0, c - 1, (c - 1) * ctx) - d(0, 0, 0, c - 1, (c - 1) * ctx), d(0, 0, 0, c, c * ctx)


def decomposition(rows, database=True):
    cache = {}
    print(f"{'model':28} {'gpu':9} {'tp':>2} {'isl':>5} {'c':>3} | measured: {'Td':>6} {'X':>6} {'TTFT':>6} "
          f"{'TTFT/X':>6} {'(TTFT-X)/Td':>11} | servesim: {'Td':>6} {'X':>6} {'TTFT':>6}"
          + (" | database: X, Td" if database else ""))
    groups = {}
    for r in rows:
        if r.get("replicas", 1) == 1:
            groups.setdefault((r["model"], r["gpu"], r["precision"], int(r["tp"]), r["isl"], r["concurrency"]),
                              {})[r["osl"]] = r
    for (model, gpu, _, tp, isl, c), g in sorted(groups.items()):
        if len(g) < 3 or c < 2:
            continue
        osls = sorted(g)
        a = np.array([[1.0, (c - 1) / (o - 1)] for o in osls])
        meas = np.linalg.lstsq(a, np.array([g[o]["silicon_tpot_ms"] for o in osls]), rcond=None)[0]
        sim = np.linalg.lstsq(a, np.array([g[o]["servesim_tpot_ms"] for o in osls]), rcond=None)[0]
        last = g[osls[-1]]
        t_meas, t_sim = last["silicon_ttft_ms"], last["servesim_ttft_ms"]
        text = (f"{model[-28:]:28} {gpu:9} {tp:2} {isl:5} {c:3} | {'':9} {meas[0]:6.2f} {meas[1]:6.1f} "
                f"{t_meas:6.0f} {t_meas / meas[1]:6.2f} {(t_meas - meas[1]) / meas[0]:11.1f} | {'':9} "
                f"{sim[0]:6.2f} {sim[1]:6.1f} {t_sim:6.0f}")
        if database:
            x, td = _database_increment(cache, last, c)
            text += f" | {x:6.1f} {td:6.2f}"
        print(text)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("rows", help="per-row results of benchmarks/silicon.py --out")
    ap.add_argument("--no-database", action="store_true", help="skip the database's own prefill increment")
    args = ap.parse_args(argv)
    logging.disable(logging.WARNING)
    rows = load(args.rows)
    per_row(rows)
    print()
    by_factor(rows)
    print()
    decomposition(rows, database=not args.no_database)


if __name__ == "__main__":
    main()
