"""The `timing: {type: aic}` tables against direct database calls
(docs/deployment.md, "Pass times"): the absolute % error of the interpolated
pass time (`table_pass_ms`) against `DirectModel` with the same features.

Two samples per deployment:

- random passes (seeded) of five kinds within the engine limits:
  prefill-only (1 prompt, or 2-8 with context), decode-only, mixed with one
  prompt, mixed with 1-8 prompts with context (the kind issue 38 item 7 is
  about: a chunk continued next to new prompts);
- every pass of chunked-prefill runs (Poisson arrivals, prompts of
  100-3,000 tokens, 40 outputs) at two token budgets, the features rebuilt
  from the pass log (`pass_features`).

For each: p50 / p90 / p99 / max, and the worst passes' features.

    PYTHONPATH=$PWD python benchmarks/aic_interpolation.py [--samples 4000] [--worst 5]
"""

import argparse
import sys

import numpy as np

KINDS = ("prefill", "decode", "mixed, 1 prompt", "mixed, 1-8 prompts")
# (name, engine keys): the example deployment and a silicon row's (InferenceX)
DEPLOYMENTS = (
    ("Qwen3-32B h200 TP 2", {"model": "Qwen/Qwen3-32B", "gpu": "h200_sxm",
                             "tensor_parallel_size": 2, "max_model_len": 32768}),
    ("Llama-3.1-70B fp8 h100 TP 4", {"model": "meta-llama/Llama-3.1-70B", "gpu": "h100_sxm",
                                     "tensor_parallel_size": 4, "quantization": "fp8",
                                     "kv_cache_dtype": "fp8", "max_model_len": 10240}),
)


def pass_features(passes, prompt_tokens):
    """Each logged pass's pricing features `(prefill_tokens, num_prefill,
    prefill_context, decode_requests, decode_context)`, rebuilt from the
    pass log (`passes`, dicts as passes.jsonl has them) and each request's
    prompt length (`prompt_tokens[id]`): an entry is a prefill while its
    request's computed tokens (its cached tokens at first sight) are below
    its prompt. Runs without preemption (a recomputed request would restart
    from its prompt)."""
    computed, out = {}, []
    for p in passes:
        pre, dec = [0, 0, 0], [0, 0]
        for e in p["scheduled"]:
            before = computed.get(e["id"], e["cached"])
            if before < prompt_tokens[e["id"]]:
                pre[0] += e["tokens"]
                pre[1] += 1
                pre[2] += before
            else:
                dec[0] += 1
                dec[1] += before
            computed[e["id"]] = before + e["tokens"]
        out.append((pre[0], pre[1], pre[2], dec[0], dec[1]))
    return out


def random_passes(kind, n, budget, seqs, top, rng):
    """`n` random passes of `kind` (KINDS) within the engine limits."""
    out = []
    while len(out) < n:
        if kind == "decode":
            d = int(rng.integers(1, seqs + 1))
            out.append((0, 0, 0, d, d * int(rng.integers(1, top))))
            continue
        one = kind == "mixed, 1 prompt" or (kind == "prefill" and rng.random() < 0.5)
        q = 1 if one else int(rng.integers(1, 9))
        d = 0 if kind == "prefill" else int(rng.integers(1, min(seqs - q, budget - q) + 1))
        tokens = int(rng.integers(q, budget - d + 1))
        per = tokens // q
        if per + 1 >= top:
            continue
        ctx = 0 if one and kind == "prefill" else int(rng.integers(0, top - per - 1)) * q
        dec_ctx = d * int(rng.integers(1, top)) if d else 0
        out.append((tokens, q, ctx, d, dec_ctx))
    return out


def run_passes(engine, budget, seed=5):
    """The features of every pass of a chunked-prefill run with `timing: aic`."""
    from servesim.replay.api import run

    e = dict(engine, max_num_batched_tokens=budget, max_num_seqs=32,
             timing={"type": "aic"})
    report = run({"workload": {"synthetic": {
        "requests": 200, "input_tokens": {"distribution": "uniform", "min": 100, "max": 3000},
        "output_tokens": 40, "arrival": "poisson", "rate": 20, "seed": seed}},
        "engine": e, "output": {"pass_log": True}})
    prompts = dict(zip(report.records.ids, report.records.input_length.tolist()))
    return pass_features(report.pass_log, prompts), report.config


def errors(table, direct, passes):
    """Absolute % error of the table against the direct call, per pass."""
    from servesim.deployment.table_pricing import table_pass_ms

    return np.array([abs(table_pass_ms(table, *f) / direct(*f) - 1) * 100 for f in passes])


def _row(name, err):
    return (f"| {name} | {len(err)} | {np.percentile(err, 50):.2f} | {np.percentile(err, 90):.2f} "
            f"| {np.percentile(err, 99):.2f} | {err.max():.2f} |")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=4000, help="random passes per kind")
    ap.add_argument("--worst", type=int, default=5, help="worst passes listed per sample")
    ap.add_argument("--seed", type=int, default=38)
    args = ap.parse_args(argv)

    from servesim.config.config import config_from_dict
    from servesim.deployment import aic
    from servesim.deployment.aic_tables import pricing_table

    print(f"aiconfigurator-core {aic.package_version()}")
    print("| sample | passes | p50 % | p90 % | p99 % | max % |")
    print("|---|---|---|---|---|---|")
    worst = []
    for name, engine in DEPLOYMENTS:
        cfg = config_from_dict({"workload": {"synthetic": {"requests": 1}},
                                "engine": dict(engine, max_num_batched_tokens=8192,
                                               max_num_seqs=256, timing={"type": "aic"})})
        s = cfg.engine.scheduler
        table = pricing_table(cfg.engine)
        direct = aic.DirectModel(cfg.engine.deployment)
        rng = np.random.default_rng(args.seed)
        every = []
        for kind in KINDS:
            passes = random_passes(kind, args.samples, s.max_num_batched_tokens, s.max_num_seqs,
                                   s.max_model_len, rng)
            err = errors(table, direct, passes)
            every.append(err)
            print(_row(f"{name}, 8192 / 256, {kind}", err), flush=True)
            worst += [(e, name, kind, f) for e, f in zip(err, passes)]
        print(_row(f"{name}, 8192 / 256, all", np.concatenate(every)), flush=True)
        for budget in (2048, 8192):
            passes, run_cfg = run_passes(engine, budget)
            err = errors(pricing_table(run_cfg.engine), direct, passes)
            print(_row(f"{name}, chunked run, budget {budget} / 32", err), flush=True)
            worst += [(e, name, f"run {budget}", f) for e, f in zip(err, passes)]
    print("\nworst passes (error %, deployment, sample, features P Q K D C):")
    for e, name, kind, f in sorted(worst, key=lambda w: -w[0])[:args.worst]:
        print(f"  {e:.2f}  {name}  {kind}  {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
