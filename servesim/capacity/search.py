"""`servesim search CONFIG --slo ... --grid GRID (--rate R | --capacity)`:
the deployments of a grid that meet the SLOs, cheapest first.

The grid is a sweep's grid file (`servesim/sweep/sweep.py`: workers,
data_parallel_size, max_num_seqs, max_num_batched_tokens, P/D pool sizes,
router, ...); it may not set the load itself, which the search sets.

- `--rate R`: every point replays at load R (the workload's knob, see
  `load.py`) and is checked against the SLOs. Points meeting them rank by
  GPUs (fewest first, `deployment.gpus_of`), then by margin to the SLOs
  (largest first), then grid order. Points run level by level of GPU count,
  in parallel within a level; once a level has a point that meets the SLOs,
  the points with more GPUs cannot win and are skipped (`skip=False` runs
  them all, e.g. for a full Pareto front).
- `--capacity`: every point gets its own capacity search (`capacity.py`),
  and points rank by sustained request rate per GPU at their capacity
  (highest first), then exact capacities before lower bounds (a point whose
  every probe met up to `--max-rate` may sustain more: it is marked
  `capacity_is_lower_bound` and ranks after an exact capacity of the same
  rate per GPU), then fewer GPUs, then grid order. No point can be ruled
  out before it runs, so none is skipped.

A point meets the SLOs only if it also passes the gate on rejected and
unfinished requests (`config/slo.py`); each point's counts of both are in
search.csv.

Each point's files go to `DIR/points/NNN-<slug>/` (rate: the replay's report
and `slo.json`; capacity: `capacity.json`). A point whose file records the
same resolved config and SLOs (and search settings) is not run again, so an
interrupted search resumes. The results: `DIR/search.csv` and
`DIR/search.json`, in grid order.

With `prices` ({gpu: $/h}, `--cost`) a point's cost is its $/h
(`cost.py`): levels, skipping and ranking go by $/h, then GPUs, instead of
GPUs alone; search.csv gains `dollars_per_hour`.
"""

import contextlib
import csv
import io
import json
import os
import shutil
import traceback
from pathlib import Path

import attrs

from servesim.errors import InputError

SEARCH_CSV = "search.csv"
SEARCH_JSON = "search.json"
POINTS_DIR = "points"
SEARCH_OUTPUTS = (SEARCH_CSV, SEARCH_JSON, POINTS_DIR)  # what a search writes in its folder
NOT_RUN = "not run"
SLO_JSON = "slo.json"
OK, FAILED, SKIPPED = "ok", "failed", "skipped"


@attrs.define
class SearchPoint:
    index: int
    values: dict
    dir: str
    gpus: int
    config: dict  # the resolved config the point runs (before the load)
    status: str = FAILED
    error: str | None = NOT_RUN
    row: dict | None = None  # the probe row (rate) or capacity document (capacity)
    resumed: bool = False
    rank: int | None = None
    cost: float | None = None  # $/h with `prices`, else None (ranked by GPUs)


# --------------------------------------------------------------------------- tasks (worker processes)


def _failure(out: Path, exc: Exception) -> dict:
    message = str(exc) if isinstance(exc, InputError) else f"{type(exc).__name__}: {exc}"
    detail = message if isinstance(exc, InputError) else traceback.format_exc()
    (out / "error.txt").write_text(detail.rstrip("\n") + "\n", encoding="utf-8")
    return {"status": FAILED, "error": message, "row": None}


def rate_point(config_path, overrides, out_dir, slo, load_key, value, fingerprint) -> dict:
    """One point of a rate search: replay at `load_key=value`, write its
    report and slo.json (the fingerprint and the check) into `out_dir`."""
    from servesim.capacity.capacity import PROBE_FIGURES
    from servesim.config.slo import evaluate, slos_from_dict
    from servesim.replay.api import run
    from servesim.sweep.sweep import override_text

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "error.txt").unlink(missing_ok=True)
    try:
        report = run(config_path, overrides=(*overrides, override_text(load_key, value)))
        report.write(out)
        ev = evaluate(slos_from_dict(slo), report.summary, report.records)
    except Exception as exc:  # recorded, never raised: the other points go on
        return _failure(out, exc)
    row = {"rate": value, **ev, **{k: report.summary[k] for k in PROBE_FIGURES}}
    _write_json(out / SLO_JSON, {**fingerprint, "result": row})
    return {"status": OK, "error": None, "row": row}


def capacity_point(config_path, overrides, out_dir, slo, settings, fingerprint) -> dict:
    """One point of a capacity search: its own capacity search, written to
    `out_dir/capacity.json` with the fingerprint."""
    from servesim.capacity.capacity import capacity, write_capacity
    from servesim.config.slo import slos_from_dict

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "error.txt").unlink(missing_ok=True)
    try:
        doc = capacity(config_path, slos_from_dict(slo), overrides=overrides, **settings)
    except Exception as exc:
        return _failure(out, exc)
    doc = {**fingerprint, **doc}
    write_capacity(doc, out)
    return {"status": OK, "error": None, "row": doc}


def _write_json(path: Path, doc) -> None:
    from servesim.results.outdir import write_file

    write_file(path, json.dumps(doc, indent=2, allow_nan=False) + "\n")


def _resumed(path: Path, fingerprint: dict):
    """The result recorded in `path` if it carries `fingerprint`, else None."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or any(doc.get(k) != v for k, v in fingerprint.items()):
        return None
    return doc


# --------------------------------------------------------------------------- the search


def search(config, grid, slos, out_dir="search-out", *, rate=None, capacity_mode=False, limit=None,
           precision=None, min_rate=None, max_rate=None, jobs=None, executor="local", ray_address=None,
           skip=True, progress=None, prices=None, base_overrides=()) -> dict:
    """Run the search (see the module docstring) and write search.csv /
    search.json into `out_dir`; returns the search.json document."""
    from servesim.capacity.capacity import DEFAULT_PRECISION, bracket_limits
    from servesim.capacity.gpus import gpus_of
    from servesim.capacity.load import check_grid_keys, load_of
    from servesim.sweep import executors
    from servesim.config.config import config_to_dict, load_config
    from servesim.sweep.sweep import Grid, load_grid, override_text, point_dir_names, validate_points

    if (rate is None) == (not capacity_mode):
        raise InputError("give either --rate R (the load every point must sustain) or --capacity")
    if executor not in executors.EXECUTORS:
        raise InputError(f"unknown executor {executor!r}; accepted: {', '.join(executors.EXECUTORS)}")
    if executor == "ray":
        executors.import_ray()
    config_path = os.path.abspath(str(config))
    # `base_overrides`: applied under every point (servesim plan's start-able base)
    extra = (*base_overrides, *(() if limit is None else (f"workload.limit={int(limit)}",)))
    base = load_config(config_path, extra)
    load = load_of(base)
    if rate is not None:
        bad = isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate < float("inf")
        if bad or (load.integer and float(rate) != int(rate)):
            what = "a positive integer (requests in flight)" if load.integer else f"a number > 0 ({load.unit})"
            raise InputError(f"--rate: must be {what} for {load.key}, got {rate!r}")
        rate = load.value(rate)
    if capacity_mode:  # --min-rate / --max-rate, before any point
        bracket_limits(load, None, min_rate, max_rate)
    if not isinstance(grid, Grid):
        grid = load_grid(grid)
    check_grid_keys(load, grid.keys, grid.source)
    validate_points(config_path, grid, base_overrides)  # messages naming the grid's line
    out = Path(out_dir)
    from servesim.results.outdir import check_replaceable, record_written

    check_replaceable(out, SEARCH_OUTPUTS)  # before any point: nothing of the user's in the way
    slo = slos.to_dict()
    # the allowance always recorded: a result from before the gate (no such key) is run again
    gate = {"allow_rejected": slos.allow_rejected}
    settings = {"limit": limit, "precision": precision or DEFAULT_PRECISION,
                "min_rate": min_rate, "max_rate": max_rate}

    points, tasks = [], {}
    for i, (values, name) in enumerate(zip(grid.points, point_dir_names(grid))):
        overrides = (*extra, *(override_text(k, v) for k, v in values.items()))
        cfg = load_config(config_path, overrides)
        if load_of(cfg).key != load.key:
            raise InputError(f"{grid.source}: point {i}: changes the workload's load from {load.key} "
                             f"to {load_of(cfg).key}; every point must share one load")
        resolved = json.loads(json.dumps(config_to_dict(cfg)))
        p = SearchPoint(i, values, f"{POINTS_DIR}/{name}", gpus_of(resolved), resolved)
        if prices is not None:
            from servesim.capacity.cost import dollars_per_hour
            from servesim.capacity.gpus import gpu_counts

            p.cost = dollars_per_hour(gpu_counts(resolved), prices)
        points.append(p)
        point_dir = str((out / p.dir).absolute())
        if capacity_mode:
            fingerprint = {"point_config": resolved, "slo": slo, **gate, "settings": settings}
            args = (config_path, tuple(o for o in overrides if o not in extra), point_dir, slo,
                    settings, fingerprint)
            done = _resumed(out / p.dir / "capacity.json", fingerprint)
            tasks[i] = (capacity_point, args, done)
        else:
            fingerprint = {"point_config": resolved, "slo": slo, **gate, "rate": rate}
            args = (config_path, overrides, point_dir, slo, load.key, rate, fingerprint)
            done = _resumed(out / p.dir / SLO_JSON, fingerprint)
            tasks[i] = (rate_point, args, done and done.get("result"))

    def run_level(level):
        todo = []
        for p in level:
            fn, args, done = tasks[p.index]
            if done is not None:
                p.status, p.error, p.row, p.resumed = OK, None, done, True
            else:
                todo.append((p.index, args))
        if progress is not None:
            progress(sum(p.status == OK for p in points), len(points))
        if todo:
            out.mkdir(parents=True, exist_ok=True)
            (out / POINTS_DIR).mkdir(exist_ok=True)
            record_written(out, [POINTS_DIR])
            fn = tasks[todo[0][0]][0]
            for i, outcome in executors.EXECUTORS[executor](fn, todo, jobs=jobs, address=ray_address):
                p = points[i]
                p.status, p.error, p.row = outcome["status"], outcome["error"], outcome["row"]
                if progress is not None:
                    progress(sum(q.status == OK for q in points), len(points))

    def finish():
        ranked = sorted((p for p in points if _meets(p)), key=_capacity_key if capacity_mode else _rate_key)
        for r, p in enumerate(ranked, 1):
            p.rank = r
        doc = _document(config_path, grid, slos, load, rate, capacity_mode, settings, points, ranked)
        doc["prices"] = prices
        write_search_files(doc, out)
        return doc

    try:
        _run_levels(run_level, points, capacity_mode, skip)
    except KeyboardInterrupt:  # the executor has cancelled the points in flight
        _remove_interrupted(out, points)
        finish()  # search.csv lists the points that finished; the same search resumes
        raise
    return finish()


def _run_levels(run_level, points, capacity_mode, skip) -> None:
    """Run every point at once (capacity) or level by level of GPU count,
    skipping the levels above one that meets the SLOs (rate, with `skip`)."""
    if capacity_mode:
        run_level(points)
    else:
        for level in sorted({_level(p) for p in points}):
            run_level([p for p in points if _level(p) == level])
            meeting = [p for p in points if _level(p) == level and _meets(p)]
            if meeting and skip:
                for q in points:
                    if _level(q) > level:
                        q.status = SKIPPED
                        q.error = (f"cannot win: {_level_text(q)}, more than point {meeting[0].index}'s "
                                   f"{_level_text(meeting[0]) if q.cost is not None else meeting[0].gpus}, "
                                   "which meets the SLOs")
                break


def _level(p: SearchPoint) -> tuple:
    """What a rate search orders points by: $/h (with prices), then GPUs."""
    return (p.cost, p.gpus) if p.cost is not None else (p.gpus,)


def _level_text(p: SearchPoint) -> str:
    return f"${p.cost:g}/h on {p.gpus} GPUs" if p.cost is not None else f"{p.gpus} GPUs"


def _remove_interrupted(out: Path, points) -> None:
    """Remove what the points an interrupt stopped mid-run left: a folder
    holding nothing but servesim's lock, staging folder or error.txt (a
    finished or resumable result stays)."""
    from servesim.results.outdir import LOCK
    from servesim.results.output import STAGING_PREFIX

    for p in points:
        folder = out / p.dir
        if p.error != NOT_RUN or not folder.is_dir():
            continue
        left = [e.name for e in folder.iterdir()]
        if all(n in (LOCK, "error.txt") or n.startswith(STAGING_PREFIX) for n in left):
            shutil.rmtree(folder, ignore_errors=True)
    with contextlib.suppress(OSError):
        (out / POINTS_DIR).rmdir()  # if no point finished


def _meets(p: SearchPoint) -> bool:
    if p.status != OK:
        return False
    if "probes" in p.row:  # a capacity document
        return p.row["status"] != "unmet"
    return p.row["meets"]


def _rate_key(p: SearchPoint):
    margin = p.row["margin"]
    return (*_level(p), -(margin if margin is not None else -1e300), p.index)


def _capacity_key(p: SearchPoint):
    from servesim.capacity.capacity import is_lower_bound

    return (-p.row["request_rate_per_gpu"], is_lower_bound(p.row), p.gpus, p.index)


def _point_doc(p: SearchPoint, capacity_mode: bool) -> dict:
    doc = {"point": p.index, "values": p.values, "gpus": p.gpus, "dollars_per_hour": p.cost,
           "dir": p.dir, "status": p.status,
           "error": p.error, "resumed": p.resumed, "rank": p.rank, "meets": _meets(p)}
    row = p.row or {}
    if capacity_mode:
        from servesim.capacity.capacity import is_lower_bound

        at = next((q for q in row.get("probes", ()) if q["rate"] == row.get("capacity")), {})
        doc.update({"capacity": row.get("capacity"), "capacity_status": row.get("status"),
                    "capacity_is_lower_bound": is_lower_bound(row) if row else None,
                    "binding_slo": row.get("binding_slo"), "margin": row.get("margin"),
                    "metrics": at.get("metrics"), "request_rate": row.get("request_rate"),
                    "rejected": at.get("rejected"), "unfinished": at.get("unfinished"),
                    "probes": len(row.get("probes", ()))})
    else:
        from servesim.config.slo import binding

        doc.update({"margin": row.get("margin"), "binding_slo": binding(row) if row else None,
                    "metrics": row.get("metrics"), "violated": row.get("violated"),
                    "rejected": row.get("rejected"), "unfinished": row.get("unfinished"),
                    "request_rate": row.get("request_rate")})
    rr = doc["request_rate"]
    doc["request_rate_per_gpu"] = None if rr is None else round(rr / p.gpus, 6)
    return doc


def _document(config_path, grid, slos, load, rate, capacity_mode, settings, points, ranked) -> dict:
    winner = ranked[0] if ranked else None
    if winner is None:
        message = ("no point meets the SLOs" + ("" if capacity_mode else f" at {load.key}={rate}"))
    elif capacity_mode:
        from servesim.capacity.capacity import is_lower_bound

        bound = " (a lower bound: every probe met up to --max-rate)" if is_lower_bound(winner.row) else ""
        message = (f"best: point {winner.index} ({_values_text(winner.values)}): capacity "
                   f"{load.key}={winner.row['capacity']}{bound}, {winner.row['request_rate_per_gpu']} "
                   f"req/s per GPU on {winner.gpus} GPU(s)")
    else:
        message = (f"winner: point {winner.index} ({_values_text(winner.values)}) meets the SLOs at "
                   f"{load.key}={rate} with " + (f"{winner.gpus} GPU(s)" if winner.cost is None
                                                     else _level_text(winner)) + f", margin {winner.row['margin']}")
    return {
        "config": config_path,
        "grid": os.path.abspath(grid.source),
        "mode": "capacity" if capacity_mode else "rate",
        "load": load.to_dict(),
        "rate": rate,
        "slo": slos.to_dict(),
        "settings": settings if capacity_mode else None,
        "keys": list(grid.keys),
        "winner": None if winner is None else winner.index,
        "ranking": [p.index for p in ranked],
        "message": message,
        "points": [_point_doc(p, capacity_mode) for p in points],
    }


def _values_text(values: dict) -> str:
    from servesim.sweep.sweep import cell_text

    return ", ".join(f"{k}={cell_text(v)}" for k, v in values.items())


def write_search_files(doc: dict, out_dir) -> None:
    """search.csv (one row per point, grid order) and search.json."""
    from servesim.sweep.sweep import cell_text

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    from servesim.config.slo import checked_names

    names = checked_names(doc["slo"])
    columns = ["point", *doc["keys"], "gpus", *(["dollars_per_hour"] if doc.get("prices") else []),
               "status", "error", "meets", "rank"]
    if doc["mode"] == "capacity":
        columns += ["capacity", "capacity_status", "capacity_is_lower_bound"]
    columns += ["margin", "binding_slo", *names, "rejected", "unfinished", "request_rate",
                "request_rate_per_gpu", "dir"]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for p in doc["points"]:
        row = {"point": p["point"], "gpus": p["gpus"], "status": p["status"], "error": p["error"] or "",
               "meets": "true" if p["meets"] else "false", "dir": p["dir"]}
        row.update({k: cell_text(p["values"][k]) if k in p["values"] else "" for k in doc["keys"]})
        for key in ("dollars_per_hour", "rank", "capacity", "capacity_status", "capacity_is_lower_bound", "margin", "binding_slo",
                    "rejected", "unfinished", "request_rate", "request_rate_per_gpu"):
            if key in columns:
                row[key] = "" if p.get(key) is None else cell_text(p[key])
        metrics = p.get("metrics") or {}
        row.update({n: "" if metrics.get(n) is None else cell_text(metrics[n]) for n in names})
        writer.writerow(row)
    from servesim.results.outdir import write_file

    write_file(out / SEARCH_CSV, buf.getvalue())
    _write_json(out / SEARCH_JSON, doc)
