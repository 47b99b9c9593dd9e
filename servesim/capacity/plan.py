"""`servesim plan CONFIG --slo ... --rate R`: the cheapest deployment of the
config's model that meets the SLOs at load R, searched over full replays of
a generated space (README "Capacity planning", "servesim plan").

1. The space (`plan_space.py`): every worker shape the engine would start
   on each GPU type (TP × the max_num_seqs / max_num_batched_tokens ladder;
   under `backend: sglang` max_running_requests / chunked_prefill_size),
   aggregated and (vLLM) disaggregated, up to `--gpus-max` GPUs.
2. Pruned before a replay: the bounds of `plan_space.prune`.
3. Searched (`search.py`, local or Ray, resumable): level by level of $/h
   (`--cost`) or GPUs, skipping what costs more than a point that meets.
4. The answer (`DIR/`): `best.yaml` (the winner as a servesim config, its
   load and SLOs set: `servesim run best.yaml` replays it), `launch.sh`
   (the real engine's commands, `launch_commands.py`), `plan.json` (the
   counts, the runner-ups, the next cheaper point and what it missed, the
   cost), beside search.csv / search.json / points/.
5. `--sensitivity P`: the winner and the next cheaper point replayed with
   every pass time scaled by 1 ± P/100 and, with speculative decoding, the
   acceptance rates by 1 ∓ P/100 (`DIR/sensitivity/`): does the answer
   change?
"""

import json
import os
from pathlib import Path

from servesim.errors import InputError

PLAN_JSON = "plan.json"
BEST_YAML = "best.yaml"
LAUNCH_SH = "launch.sh"
PLAN_GRID = "plan-grid.yaml"
SENSITIVITY_DIR = "sensitivity"
PLAN_OUTPUTS = (PLAN_JSON, BEST_YAML, LAUNCH_SH, PLAN_GRID, SENSITIVITY_DIR)
DEFAULT_GPUS_MAX = 16  # two 8-GPU nodes
RUNNER_UPS = 5
ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang"}


def _deployment_of(config_path: str) -> tuple:
    """(engine.model, engine.gpu, cluster.kv_transfer.latency_ms or 0,
    engine.backend) of the config file, as given."""
    from servesim.config.yaml_input import read_yaml

    data, _ = read_yaml(config_path, "config file")
    engine = data.get("engine") if isinstance(data, dict) else None
    engine = engine if isinstance(engine, dict) else {}
    if not engine.get("model") or not engine.get("gpu"):
        raise InputError(f"{config_path}: engine: servesim plan needs a named deployment (engine.model and "
                         "engine.gpu, docs/deployment.md) to generate the space from")
    cluster = data.get("cluster") if isinstance(data.get("cluster"), dict) else {}
    link = cluster.get("kv_transfer") if isinstance(cluster.get("kv_transfer"), dict) else {}
    latency = link.get("latency_ms", 0.0)
    backend = "sglang" if engine.get("backend") == "sglang" else "vllm"
    return engine["model"], engine["gpu"], latency if isinstance(latency, (int, float)) else 0.0, backend


def check_gpus(names) -> list:
    from servesim.deployment.gpus import GPUS

    out = []
    for name in names:
        if name not in GPUS:
            raise InputError(f"--gpu: unknown GPU {name!r}; supported: {', '.join(GPUS)}")
        if name not in out:
            out.append(name)
    return out


def plan(config, slos, rate, out_dir="plan-out", *, gpus=None, gpus_max=None, prices=None,
         max_num_seqs=None, max_num_batched_tokens=None, limit=None, jobs=None, executor="local",
         ray_address=None, prune=True, sensitivity=None, progress=None) -> dict:
    """Generate, prune, search and answer (module docstring); returns plan.json."""
    from servesim.capacity import plan_space as ps
    from servesim.capacity.load import load_of
    from servesim.config.config import load_config

    config_path = os.path.abspath(str(config))
    _, gpu, latency, backend = _deployment_of(config_path)
    engine_name = ENGINE_NAMES[backend]
    gpus = check_gpus(gpus or [gpu])
    if gpus_max is not None and (isinstance(gpus_max, bool) or not isinstance(gpus_max, int) or gpus_max < 1):
        raise InputError(f"--gpus-max: must be a positive number of GPUs, got {gpus_max}")
    if prices is not None:
        missing = [g for g in gpus if g not in prices]
        if missing:
            raise InputError(f"--cost: no price for {', '.join(missing)} (give --cost GPU=$/h for every GPU searched)")
    if sensitivity is not None and not 0 < sensitivity < 100:
        raise InputError(f"--sensitivity: must be a percentage between 0 and 100, got {sensitivity:g}")
    seqs = ps.check_ladder("--max-num-seqs", max_num_seqs or ps.MAX_NUM_SEQS_LADDER)
    batched = ps.check_ladder("--max-num-batched-tokens", max_num_batched_tokens or ps.MAX_NUM_BATCHED_TOKENS_LADDER)
    extra = () if limit is None else (f"workload.limit={int(limit)}",)
    ok, refused = ps.shapes(config_path, gpus, seqs, batched, extra, backend)
    if not ok:
        reasons = "; ".join(sorted({f"TP{s.tensor_parallel_size} on {s.gpu}: {r}" for s, r in refused})[:4])
        raise InputError(f"{config_path}: no worker shape of {', '.join(gpus)} that {engine_name} would start: "
                         f"{reasons}")
    smallest = min(s.tensor_parallel_size for s in ok)
    if gpus_max is None:
        gpus_max = max(DEFAULT_GPUS_MAX, smallest)
    elif gpus_max < smallest:
        first = min(ok, key=lambda s: s.tensor_parallel_size)
        raise InputError(f"--gpus-max {gpus_max}: below the smallest deployment {engine_name} would start "
                         f"({smallest} GPUs: one worker of {first.text()})")
    cost_of = None
    if prices is not None:
        from servesim.capacity.cost import dollars_per_hour

        cost_of = lambda counts: dollars_per_hour(counts, prices)  # noqa: E731
    points = ps.generate(ok, gpus_max, cost_of, latency)
    cfg0 = load_config(config_path, (*extra, *ps._shape_overrides(ok[0])))
    load = load_of(cfg0)
    load_override = load.override(rate)
    counts = {}
    if prune:
        floors = ps.ShapeFloors(config_path, extra, ps.demand(config_path, (*extra, *ps._shape_overrides(ok[0]),
                                                                            load_override)))
        counts = ps.prune(points, floors, slos, cfg0.cluster.data_parallel_size)
    kept = [q for q in points if q.pruned is None]
    out = Path(out_dir)
    from servesim.capacity.search import SEARCH_OUTPUTS
    from servesim.results.outdir import check_replaceable

    check_replaceable(out, (*PLAN_OUTPUTS, *SEARCH_OUTPUTS))  # nothing of the user's in the way
    ladder_names = (("max_running_requests", "chunked_prefill_size") if backend == "sglang"
                    else ("max_num_seqs", "max_num_batched_tokens"))
    doc = {"config": config_path, "rate": load.value(rate), "load": load.to_dict(), "slo": slos.to_dict(),
           "backend": backend, "gpus": gpus, "gpus_max": gpus_max, "prices": prices,
           "ladder": dict(zip(ladder_names, (list(seqs), list(batched)))),
           "excluded": [{"shape": s.text(), "reason": r} for s, r in refused],
           "generated": len(points), "pruned": sum(counts.values()), "pruned_by": counts,
           "pruned_points": [{"point": q.text(), "gpus": q.gpus, "why": q.pruned} for q in points if q.pruned]}
    if not kept:
        doc.update(searched=None, run=0, skipped=0, winner=None,
                   message="every generated point was pruned: no deployment within the budget can meet the SLOs")
        _write_json(out / PLAN_JSON, doc)
        return doc
    search_doc = _search(config_path, kept, slos, load, rate, out, limit, jobs, executor, ray_address, prices,
                         progress, tuple(ps._shape_overrides(ok[0])))
    doc.update(_answer(config_path, kept, search_doc, slos, load, rate, extra, out, prices))
    if sensitivity is not None and doc["winner"] is not None:
        doc["sensitivity"] = _sensitivity(config_path, doc, search_doc, slos, out, sensitivity, extra)
    _write_json(out / PLAN_JSON, doc)
    return doc


def _search(config_path, kept, slos, load, rate, out, limit, jobs, executor, ray_address, prices, progress, base):
    from servesim.capacity.search import search
    from servesim.results.outdir import write_file
    from servesim.sweep.sweep import Grid, _yaml_text

    keys = []
    for q in kept:
        keys += [k for k in q.values if k not in keys]
    out.mkdir(parents=True, exist_ok=True)
    grid_path = out / PLAN_GRID
    text = "# the points servesim plan ran (pruned ones left out): servesim search --grid plan-grid.yaml\npoints:\n"
    text += "".join(f"  - {_yaml_text(q.values)}\n" for q in kept)
    write_file(grid_path, text)
    grid = Grid(str(grid_path.absolute()), tuple(keys), tuple(q.values for q in kept), tuple({} for _ in kept))
    return search(config_path, grid, slos, out, rate=rate, limit=limit, jobs=jobs, executor=executor,
                  ray_address=ray_address, progress=progress, prices=prices, base_overrides=base)


def missed_text(row, slo) -> str:
    """What a run missed: each violated SLO with its figure and target, or its lost requests."""
    from servesim.config.slo import COMPLETED

    parts = []
    for name in row.get("violated") or ():
        if name == COMPLETED:
            parts.append(f"{row['rejected']} rejected + {row['unfinished']} unfinished")
        else:
            figure = (row.get("metrics") or {}).get(name)
            parts.append(f"{name} {figure:.1f} (target {slo[name]:g})" if figure is not None else name)
    return ", ".join(parts) or "failed"


def tightest_slo(metrics: dict, slo: dict):
    """The SLO a run is closest to (its largest figure / target ratio)."""
    from servesim.config.slo import GOODPUT

    ratios = {n: (slo[n] / v if n == GOODPUT else v / slo[n]) for n, v in (metrics or {}).items()
              if v and n in slo}
    return max(ratios, key=ratios.get) if ratios else None


def _row(search_doc, i, kept) -> dict:
    p = search_doc["points"][i]
    binding = p["binding_slo"] or (tightest_slo(p["metrics"], search_doc["slo"]) if p["meets"] else None)
    return {"point": i, "deployment": kept[i].text(), "mode": kept[i].mode, "gpus": p["gpus"],
            "dollars_per_hour": p["dollars_per_hour"], "status": p["status"], "meets": p["meets"],
            "margin": p["margin"], "binding_slo": binding, "violated": p.get("violated"),
            "metrics": p["metrics"], "rejected": p["rejected"], "unfinished": p["unfinished"],
            "dir": p["dir"]}


def _level(row) -> tuple:
    return (row["dollars_per_hour"], row["gpus"]) if row["dollars_per_hour"] is not None else (row["gpus"],)


def _answer(config_path, kept, search_doc, slos, load, rate, extra, out, prices) -> dict:
    from servesim.capacity.launch_commands import launch_commands

    points = search_doc["points"]
    run = sum(p["status"] != "skipped" for p in points)
    base = {"searched": len(points), "run": run, "skipped": len(points) - run,
            "failed": [{"point": p["point"], "error": p["error"]} for p in points if p["status"] == "failed"]}
    ranked = [_row(search_doc, i, kept) for i in search_doc["ranking"]]
    cheaper = [_row(search_doc, p["point"], kept) for p in points if p["status"] == "ok" and not p["meets"]]
    if not ranked:
        return {**base, "winner": None, "runner_ups": [], "cheaper_missed": cheaper,
                "message": search_doc["message"]}
    win = ranked[0]
    cheaper = [r for r in cheaper if _level(r) < _level(win)]
    nxt = None
    if cheaper:  # the most expensive of the cheaper points, best margin first
        top = max(_level(r) for r in cheaper)
        nxt = max((r for r in cheaper if _level(r) == top), key=lambda r: r["margin"] if r["margin"] is not None else -1e300)
    resolved = write_answer(config_path, kept[win["point"]].values, load, rate, slos, out,
                            f"{win['deployment']} ({win['gpus']} GPUs), margin {win['margin']}", extra)
    summary = _summary_json(out / win["dir"])
    tokens = (summary.get("input_tokens_per_s") or 0) + (summary.get("output_tokens_per_s") or 0)
    cost = {}
    if prices is not None:
        from servesim.capacity.cost import dollars_per_million_tokens

        cost = {"dollars_per_hour": win["dollars_per_hour"],
                "dollars_per_million_tokens": dollars_per_million_tokens(win["dollars_per_hour"], tokens),
                "dollars_per_million_output_tokens": dollars_per_million_tokens(
                    win["dollars_per_hour"], summary.get("output_tokens_per_s") or 0)}
    message = (f"best: {win['deployment']} — {win['gpus']} GPUs" + (f", ${win['dollars_per_hour']:g}/h" if prices else "")
               + f"; binding SLO {win['binding_slo']}, margin {win['margin']}")
    return {**base, "winner": win, "runner_ups": ranked[1:1 + RUNNER_UPS], "next_cheaper": nxt,
            "cheaper_missed": cheaper, "cost": cost, "launch": launch_commands(resolved),
            "best_yaml": str(out / BEST_YAML), "message": message}


def write_answer(config_path, values, load, rate, slos, out: Path, label: str, extra=()) -> dict:
    """best.yaml and launch.sh of a point at the load (plan's winner, or
    search's); returns its resolved config dict."""
    from servesim.capacity.launch_commands import launch_script
    from servesim.results.outdir import write_file

    resolved = search_doc_point_config(config_path, values, load, rate, extra)
    write_file(out / BEST_YAML, best_yaml(resolved, slos, label))
    write_file(out / LAUNCH_SH, launch_script(resolved))
    return resolved


def search_doc_point_config(config_path, values, load, rate, extra) -> dict:
    """The resolved config dict of a point at the load, with the derived
    `num_gpu_blocks` left out (derived again when replayed)."""
    from servesim.config.config import config_to_dict, load_config
    from servesim.sweep.sweep import override_text

    cfg = load_config(config_path, (*extra, *(override_text(k, v) for k, v in values.items()), load.override(rate)))
    data = json.loads(json.dumps(config_to_dict(cfg)))
    dep = cfg.engine.deployment
    if dep is not None and dep.derived_num_gpu_blocks:  # SGLang's pool: max_total_tokens
        data["engine"].pop("max_total_tokens" if cfg.engine.sglang is not None else "num_gpu_blocks", None)
    for pool in ("prefill", "decode"):
        engine = getattr(cfg.cluster, pool)
        if engine is not None and engine.deployment is not None and engine.deployment.derived_num_gpu_blocks:
            (data["cluster"].get(pool) or {}).pop("num_gpu_blocks", None)
    return data


def best_yaml(resolved: dict, slos, label: str) -> str:
    import io

    from ruamel.yaml import YAML

    doc = {**resolved, "slo": slos.to_dict()}
    buf = io.StringIO()
    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = False
    yaml.sort_base_mapping_type_on_output = False
    yaml.dump(doc, buf)
    head = (f"# the winner: {label}.\n"
            "# `servesim run best.yaml` replays it; `servesim capacity best.yaml` checks its SLOs.\n")
    return head + buf.getvalue()


def _summary_json(point_dir: Path) -> dict:
    try:
        return json.loads((point_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _write_json(path: Path, doc) -> None:
    from servesim.results.outdir import record_written, write_file

    path.parent.mkdir(parents=True, exist_ok=True)
    write_file(path, json.dumps(doc, indent=2, allow_nan=False) + "\n")
    if path.name == PLAN_JSON:  # the last file a plan writes: the manifest names what it wrote
        record_written(path.parent, [n for n in PLAN_OUTPUTS if (path.parent / n).exists()])


# --------------------------------------------------------------------------- sensitivity


def scaled_timing(config_path: str, values: dict, factor: float, out: Path, extra=()) -> list:
    """Overrides that scale every pass time of a point by `factor`: an aic
    deployment through a calibration file (its factors times the config's
    own), linear and fixed timing through their parameters."""
    from servesim.config.config import load_config
    from servesim.results.outdir import write_file
    from servesim.sweep.sweep import override_text

    overrides = [*extra, *(override_text(k, v) for k, v in values.items())]
    timing = load_config(config_path, overrides).engine.timing
    if timing.type == "aic":
        own = timing.calibration_factors or (1.0, 1.0, 1.0)
        path = out / f"calibration-x{factor:g}.yaml"
        write_file(path, "type: aic_calibration\nfactors:\n" + "".join(
            f"  {k}: {v * factor!r}\n" for k, v in zip(("prefill", "decode", "mixed"), own)))
        return [*overrides, override_text("engine.timing", {"type": "aic", "calibration": str(path.absolute())})]
    if timing.type == "linear":
        keys = ("base_ms", "per_token_ms", "per_request_ms", "per_context_token_ms")
    elif timing.type == "fixed":
        keys = ("prefill_ms", "decode_ms")
    else:
        raise InputError(f"--sensitivity: pass times of timing type {timing.type!r} cannot be scaled; "
                         "it applies to aic, linear and fixed timing")
    data = {"type": timing.type, **{k: getattr(timing, k) * factor for k in keys}}
    return [*overrides, override_text("engine.timing", data)]


def scaled_acceptance(config_path: str, overrides: list, factor: float) -> list:
    """Overrides that scale a point's speculative acceptance by `factor`: each
    per-position rate, its own or a profile's, times `factor`, at most 1;
    none without speculative decoding. A trace's `accepted` lists are
    measured acceptance and stay as they are (`acceptance_scaled` says so)."""
    import attrs

    from servesim.config.config import load_config
    from servesim.config.speculative_config import to_data
    from servesim.sweep.sweep import override_text

    spec = load_config(config_path, overrides).engine.speculative
    if spec is None:
        return []

    def scale(rates):
        return tuple(min(1.0, rate * factor) for rate in rates)

    scaled = attrs.evolve(spec, acceptance_rates=scale(spec.acceptance_rates),
                          acceptance_profiles=tuple((name, weight, scale(rates))
                                                    for name, weight, rates in spec.acceptance_profiles))
    return [override_text("engine.speculative", to_data(scaled))]


def _misses(run: dict) -> str:
    metrics = run.get("metrics") or {}
    return ", ".join(f"{n} ({metrics[n]:.1f})" if metrics.get(n) is not None else n
                     for n in run.get("violated") or ()) or (run.get("error") or "")


def _sensitivity(config_path, doc, search_doc, slos, out, percent, extra) -> dict:
    from servesim.capacity.search import rate_point

    load = doc["load"]
    sens = out / SENSITIVITY_DIR
    sens.mkdir(parents=True, exist_ok=True)
    cases = [("winner", doc["winner"])] + ([("next_cheaper", doc["next_cheaper"])] if doc.get("next_cheaper") else [])
    values_of = {p["point"]: p["values"] for p in search_doc["points"]}
    results = []
    for name, row in cases:
        for sign in (+1, -1):
            # slower passes with less acceptance, faster with more
            factor = round(1 + sign * percent / 100, 6)
            acceptance = round(1 - sign * percent / 100, 6)
            overrides = scaled_timing(config_path, values_of[row["point"]], factor, sens, extra)
            speculative = scaled_acceptance(config_path, overrides, acceptance)
            where = sens / f"{name}-x{factor:g}"
            outcome = rate_point(config_path, tuple(overrides + speculative), str(where), slos.to_dict(),
                                 load["key"], doc["rate"], {"sensitivity": factor})
            r = outcome["row"] or {}
            results.append({"point": name, "factor": factor,
                            "acceptance_factor": acceptance if speculative else None,
                            "meets": bool(r.get("meets")),
                            "margin": r.get("margin"), "violated": r.get("violated"),
                            "metrics": r.get("metrics"), "error": outcome["error"]})
    slower = next(r for r in results if r["point"] == "winner" and r["factor"] > 1)
    faster = next((r for r in results if r["point"] == "next_cheaper" and r["factor"] < 1), None)
    changes = (not slower["meets"]) or (faster is not None and faster["meets"])
    worse = f"passes {percent:g}% slower" + (
        f" and acceptance {percent:g}% lower" if slower["acceptance_factor"] is not None else "")
    better = f"passes {percent:g}% faster" + (
        f" and acceptance {percent:g}% higher" if slower["acceptance_factor"] is not None else "")
    verdict = (f"the answer is stable: the winner still meets the SLOs with {worse}"
               + (f", and the next cheaper point still misses with {better}" if faster is not None else "")
               ) if not changes else (
        "the answer changes: " + "; ".join(
            ([f"with {worse} the winner misses {_misses(slower)}"] if not slower["meets"] else [])
            + ([f"with {better} the next cheaper point meets the SLOs"]
               if faster is not None and faster["meets"] else [])))
    return {"percent": percent, "runs": results, "changes": changes, "verdict": verdict,
            "acceptance_scaled": slower["acceptance_factor"] is not None}
