"""Parameter sweeps: `servesim sweep CONFIG --grid GRID` (README.md, "A quick tour").

A grid file names the config keys to vary and their values, in one of two forms:

- a mapping of dotted keys to lists of values: the cartesian product, keys in
  file order (the first key varies slowest), values in list order::

      engine.num_gpu_blocks: [4096, 8192]
      engine.async_scheduling: [false, true]

- a list of points, each a mapping of dotted keys to one value, either at the
  top level or under `points:`::

      points:
        - {engine.num_gpu_blocks: 4096}
        - {engine.num_gpu_blocks: 8192, engine.async_scheduling: true}

A value `null` unsets the key (the config's default applies), so one grid may
mix aggregated and disaggregated points: `cluster.workers: null` on a point
with `cluster.mode: disaggregated`.

Every point is validated against the config up front (`load_config(config,
overrides)`), so a misspelled key or a bad value fails before anything runs,
with an InputError naming the grid file, its line and the key. Each point then
runs as an independent run in its own process (`executors.py`), writing its
report into `DIR/points/NNN-<slug>/` with `Report.write` (summary.json last,
atomically). A point that raises is recorded as failed with its error and the
others go on. The results are gathered in grid order into `DIR/sweep.csv` and
`DIR/sweep.json`.

Resuming: a point counts as done, and is not run again, only when its folder
holds every output its config asks for, a summary.json of the same resolved
config, and the fingerprint of the same inputs (`fingerprint.py`: the
resolved config and the trace file's size and SHA-256); an edited trace or
config reruns it. Its figures are read back from that summary.json.

Ctrl-C: the executor cancels the points in flight, their folders are removed,
sweep.csv / sweep.json are written for the points that finished (the others
are "failed" with error "not run") and KeyboardInterrupt propagates (the CLI
exits 130); rerunning resumes.
"""

import csv
import io
import json
import os
import re
import shutil
import traceback
from pathlib import Path

import attrs

from servesim.errors import InputError

POINTS_DIR = "points"
SWEEP_CSV = "sweep.csv"
SWEEP_JSON = "sweep.json"
SWEEP_OUTPUTS = (SWEEP_CSV, SWEEP_JSON, POINTS_DIR)  # what a sweep writes in its folder
ERROR_FILE = "error.txt"
SLUG_MAX = 48

# summary.json figures in sweep.csv: column name -> (key, sub-key or None).
_LATENCY = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
_STATS = ("mean", "p50", "p90", "p99")
FIGURES = {
    **{name: (name, None) for name in (
        "requests", "finished", "rejected", "unfinished", "duration_ms",
        "request_rate", "output_tokens_per_s")},
    **{f"{lat}_{stat}": (lat, stat) for lat in _LATENCY for stat in _STATS},
    **{name: (name, None) for name in (
        "preemptions", "prefix_cache_hit_rate", "kv_usage_mean", "passes", "wall_time_s")},
}
STATUS_OK = "ok"
STATUS_FAILED = "failed"
NOT_RUN = "not run"
_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


# --------------------------------------------------------------------------- the grid


@attrs.frozen
class Grid:
    """The points of a grid file: `keys` (every key any point sets, in order
    of first appearance), `points` (one {key: value} per point, in grid
    order) and `lines` (per point, {key: line in the grid file})."""

    source: str
    keys: tuple
    points: tuple
    lines: tuple


def load_grid(path) -> Grid:
    """Read and check a grid file (see the module docstring for its forms)."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    from servesim.config.yaml_input import parse_yaml, read_text
    from servesim.config.yaml_input import plain_data as _plain

    source = str(path)
    doc = parse_yaml(read_text(source, "grid file"), source)
    try:
        _plain(doc, "", {})  # refuses alias bombs and recursive aliases up front
    except InputError as e:
        raise InputError(f"{source}: {e}") from None

    def key_line(node, key):
        try:
            return node.lc.key(key)[0] + 1 if isinstance(node, CommentedMap) else None
        except (KeyError, TypeError):
            return None

    def item_line(node, i):
        try:
            return node.lc.item(i)[0] + 1 if isinstance(node, CommentedSeq) else None
        except (KeyError, TypeError, IndexError):
            return None

    def fail(line, message):
        where = f"{source}:{line}" if line else source
        raise InputError(f"{where}: {message}")

    def check_key(node, key):
        if not isinstance(key, str) or not _KEY_RE.match(key):
            fail(key_line(node, key), f"{key!r}: not a dotted config key (e.g. engine.num_gpu_blocks)")

    forms = ("a mapping of dotted keys to lists of values (e.g. engine.num_gpu_blocks: [4096, 8192]), "
             "or a list of points (points: [{engine.num_gpu_blocks: 4096}, ...])")
    points, lines = [], []
    if isinstance(doc, dict) and "points" in doc:
        if len(doc) != 1:
            other = next(k for k in doc if k != "points")
            fail(key_line(doc, other), f"{other}: a grid with points: has no other keys")
        items, items_node = doc["points"], doc["points"]
        if not isinstance(items, list):
            fail(key_line(doc, "points"), "points: must be a list of mappings of dotted keys to values")
    elif isinstance(doc, list):
        items, items_node = doc, doc
    elif isinstance(doc, dict):
        items = None
    else:
        fail(None, f"the grid must be {forms}")

    if items is None:  # the cartesian product of a mapping of lists
        if not doc:
            fail(None, f"empty grid; it must be {forms}")
        axes = []
        for key, values in doc.items():
            check_key(doc, key)
            line = key_line(doc, key)
            if not isinstance(values, list) or not values:
                fail(line, f"{key}: must be a non-empty list of values, e.g. [4096, 8192]")
            values = [_plain(v, "", {}) for v in values]
            for i, v in enumerate(values):
                if v in values[:i]:
                    fail(line, f"{key}: value {_yaml_text(v)} appears twice")
            axes.append((key, values, line))
        combos = [{}]
        for key, values, _ in axes:
            combos = [{**c, key: v} for c in combos for v in values]
        points = combos
        key_lines = {key: line for key, _, line in axes}
        lines = [dict(key_lines) for _ in points]
    else:
        if not items:
            fail(None, "the grid has no points")
        for i, item in enumerate(items):
            line = item_line(items_node, i)
            if not isinstance(item, dict) or not item:
                fail(line, f"point {i}: must be a non-empty mapping of dotted keys to values")
            for key in item:
                check_key(item, key)
            point = {k: _plain(v, "", {}) for k, v in item.items()}
            if point in points:
                fail(line, f"point {i}: the same as point {points.index(point)}")
            points.append(point)
            lines.append({k: key_line(item, k) or line for k in item})

    keys = []
    for point in points:
        keys.extend(k for k in point if k not in keys)
    for point, point_lines in zip(points, lines):
        for key, value in point.items():
            override_text(key, value, source=source, line=point_lines.get(key))
    return Grid(source=source, keys=tuple(keys), points=tuple(points), lines=tuple(lines))


def _yaml_text(value) -> str:
    """A value as a one-line YAML (flow) text; JSON is valid YAML. (A value
    JSON cannot hold, such as .inf, gives a text that does not parse back to
    it, which `override_text` rejects.)"""
    try:
        return json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return repr(value)


def override_text(key, value, source=None, line=None) -> str:
    """The `--set` text of one grid value, checked to parse back to the value."""
    from ruamel.yaml import YAML

    from servesim.config.yaml_input import UNSET
    from servesim.config.yaml_input import plain_data as _plain

    if value is None:  # a grid's null unsets the key (the config's default applies)
        return f"{key}={UNSET}"
    text = _yaml_text(value)
    try:
        ok = _plain(YAML(typ="safe", pure=True).load(text), "", {}) == value
    except Exception:  # ruamel's parse errors
        ok = False
    if not ok:
        where = f"{source}:{line}" if source and line else (source or "grid")
        raise InputError(f"{where}: {key}: cannot pass {value!r} as a config value (not finite or not plain data)")
    return f"{key}={text}"


def cell_text(value) -> str:
    """A grid value in sweep.csv: strings as they are, the rest as YAML/JSON."""
    if value is None:
        return ""
    return value if isinstance(value, str) else _yaml_text(value)


def point_slug(point: dict) -> str:
    """A short, file-name-safe summary of a point's values, e.g.
    `num_gpu_blocks=4096-async_scheduling=false` (the last part of each key)."""
    parts = []
    for key, value in point.items():
        text = re.sub(r"[^A-Za-z0-9._+-]+", "", cell_text(value).replace(" ", "")) or "x"
        parts.append(f"{key.rpartition('.')[2]}={text}")
    return "-".join(parts)[:SLUG_MAX].rstrip("-=")


def point_dir_names(grid: Grid) -> list:
    """`NNN-<slug>` for each point (NNN zero-padded to at least 3 digits)."""
    width = max(3, len(str(len(grid.points) - 1)))
    return [f"{i:0{width}d}-{point_slug(p)}" for i, p in enumerate(grid.points)]


def validate_points(config_path: str, grid: Grid, base_overrides=()) -> list:
    """The resolved config dict of every point (as summary.json records it);
    the first point that does not validate raises an InputError naming the
    grid file, the line and the key. Relative paths in the grid are relative
    to the grid file's folder."""
    from servesim.config.config import config_to_dict, load_config

    load_config(config_path, base_overrides)  # a broken base config is the config's error, not the grid's
    grid_dir = os.path.dirname(os.path.abspath(grid.source))
    configs = []
    for i, (point, point_lines) in enumerate(zip(grid.points, grid.lines)):
        overrides = [*base_overrides, *(override_text(k, v) for k, v in point.items())]
        try:
            cfg = load_config(config_path, overrides, override_dir=grid_dir)
        except InputError as e:
            text = str(e)
            culprit = next((k for k in point if re.search(rf"--set {re.escape(k)}(?![A-Za-z0-9_])", text)), None)
            line = point_lines.get(culprit) if culprit else min(
                (v for v in point_lines.values() if v), default=None)
            where = f"{grid.source}:{line}" if line else grid.source
            key = f"{culprit}: " if culprit else ""
            values = ", ".join(f"{k}={cell_text(v)}" for k, v in point.items())
            raise InputError(f"{where}: {key}point {i} ({values}): {text}") from None
        configs.append(json.loads(json.dumps(config_to_dict(cfg))))
    return configs


def point_overrides(point: dict, config: dict) -> tuple:
    """The `--set` texts that run `point` anywhere: a relative path the grid
    gives is replaced by the absolute path its resolved `config` holds (so a
    worker in another folder, or on another Ray node, reads the same file)."""
    texts = []
    for key, value in point.items():
        if isinstance(value, str):
            node = config
            for part in key.split("."):
                node = node.get(part) if isinstance(node, dict) else None
            if isinstance(node, str) and node != value and os.path.isabs(node):
                value = node
        texts.append(override_text(key, value))
    return tuple(texts)


# --------------------------------------------------------------------------- one point


def run_point(config_path: str, overrides: tuple, out_dir: str, fingerprint: str | None = None) -> dict:
    """Run one point and write its report into `out_dir` (executed in a worker
    process or a Ray task), then its inputs' `fingerprint` when given. Never
    raises: returns {"status", "error", "summary"} where summary is the
    summary.json dict without its config."""
    from servesim.replay.api import run
    from servesim.sweep.fingerprint import FINGERPRINT_FILE, write_fingerprint
    from servesim.results.outdir import claim

    out = Path(out_dir)
    try:
        with claim(out):  # held while the point runs: an interrupted sweep removes such folders
            (out / ERROR_FILE).unlink(missing_ok=True)
            (out / FINGERPRINT_FILE).unlink(missing_ok=True)  # the outputs are about to change
            report = run(config_path, overrides=overrides)
            report.write(out)
            if fingerprint is not None:
                write_fingerprint(out, fingerprint)
    except Exception as e:  # recorded, never raised: the other points go on
        message = str(e) if isinstance(e, InputError) else f"{type(e).__name__}: {e}"
        detail = message if isinstance(e, InputError) else traceback.format_exc()
        try:
            out.mkdir(parents=True, exist_ok=True)
            (out / ERROR_FILE).write_text(detail + ("" if detail.endswith("\n") else "\n"), encoding="utf-8")
        except OSError:
            pass
        return {"status": STATUS_FAILED, "error": message, "summary": None}
    summary = {k: v for k, v in report.summary.items() if k != "config"}
    return {"status": STATUS_OK, "error": None, "summary": summary}


def expected_outputs(config: dict) -> list:
    """The files a complete run of the resolved `config` (as summary.json
    records it) writes."""
    from servesim.results.output import ITL_QUANTILES, PASSES, REQUESTS, SUMMARY, TELEMETRY

    out = config.get("output") or {}
    names = [SUMMARY]
    if out.get("per_request", True):
        names += [REQUESTS, ITL_QUANTILES]
    if out.get("pass_log"):
        names.append(PASSES)
    if out.get("telemetry_interval_ms") is not None:
        names.append(TELEMETRY)
    return names


def _finished_summary(point_dir: Path, config: dict, fingerprint: str | None = None):
    """The summary.json in `point_dir` if the folder holds a complete run of
    `config`: every output the config asks for, and (when given) inputs of
    the same `fingerprint` (the config and the trace's content)."""
    from servesim.sweep.fingerprint import read_fingerprint

    try:
        summary = json.loads((point_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(summary, dict) or summary.get("config") != config:
        return None
    if not all((point_dir / name).is_file() for name in expected_outputs(config)):
        return None
    if fingerprint is not None and read_fingerprint(point_dir) != fingerprint:
        return None
    return summary


def _remove_interrupted(out: Path, results, todo) -> None:
    """Remove the folders of the points an interrupt stopped mid-run (they
    hold their run's lock, whose process is gone or cancelled)."""
    from servesim.results.outdir import LOCK

    for i, _ in todo:
        folder = out / results[i].dir
        if results[i].error == NOT_RUN and (folder / LOCK).exists():
            shutil.rmtree(folder, ignore_errors=True)


# --------------------------------------------------------------------------- the sweep


@attrs.define
class PointResult:
    index: int
    values: dict
    dir: str  # relative to the sweep's folder
    status: str
    error: str | None
    summary: dict | None
    resumed: bool = False


@attrs.define
class SweepResult:
    out_dir: Path
    grid: Grid
    points: list  # PointResult in grid order

    @property
    def failed(self) -> list:
        return [p for p in self.points if p.status != STATUS_OK]

    @property
    def resumed(self) -> list:
        return [p for p in self.points if p.resumed]


def sweep(config, grid, out_dir="sweep-out", *, jobs=None, executor="local", ray_address=None,
          progress=None) -> SweepResult:
    """Run every point of `grid` (a grid file path or a :class:`Grid`) on the
    config file `config`, `jobs` at a time, and write sweep.csv / sweep.json
    into `out_dir`. `executor` is "local" (processes) or "ray".
    `progress(done, total)` is called as points complete. Raises InputError
    on a bad config or grid, before anything runs."""
    from servesim.sweep import executors

    if executor not in executors.EXECUTORS:
        raise InputError(f"unknown executor {executor!r}; accepted: {', '.join(executors.EXECUTORS)}")
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise InputError(f"jobs must be a positive integer, got {jobs!r}")
    if executor == "local" and ray_address is not None:
        raise InputError("--ray-address applies only to --executor ray")
    if executor == "ray":
        executors.import_ray()  # fail before anything runs when Ray is missing
    config_path = os.path.abspath(str(config))
    if not isinstance(grid, Grid):
        grid = load_grid(grid)
    configs = validate_points(config_path, grid)
    out = Path(out_dir)
    from servesim.results.outdir import check_replaceable, record_written

    check_replaceable(out, SWEEP_OUTPUTS)  # before any point: nothing of the user's in the way
    names = point_dir_names(grid)
    from servesim.sweep.fingerprint import HASH_CACHE, FileHashes, fingerprint

    hashes = FileHashes(out / HASH_CACHE)
    results, todo = [], []
    for i, (point, name, cfg) in enumerate(zip(grid.points, names, configs)):
        rel = f"{POINTS_DIR}/{name}"
        inputs = fingerprint(cfg, hashes)
        summary = _finished_summary(out / rel, cfg, inputs)
        if summary is not None:
            summary.pop("config")
            results.append(PointResult(i, point, rel, STATUS_OK, None, summary, resumed=True))
        else:
            results.append(PointResult(i, point, rel, STATUS_FAILED, NOT_RUN, None))
            overrides = point_overrides(point, cfg)
            todo.append((i, (config_path, overrides, str((out / rel).absolute()), inputs)))

    total = len(results)
    done = total - len(todo)
    if progress is not None:
        progress(done, total)
    result = SweepResult(out_dir=out, grid=grid, points=results)
    if todo:
        out.mkdir(parents=True, exist_ok=True)
        (out / POINTS_DIR).mkdir(exist_ok=True)
        record_written(out, [POINTS_DIR])
        run = executors.EXECUTORS[executor]
        try:
            for i, outcome in run(run_point, todo, jobs=jobs, address=ray_address):
                r = results[i]
                r.status, r.error, r.summary = outcome["status"], outcome["error"], outcome["summary"]
                done += 1
                if progress is not None:
                    progress(done, total)
        except KeyboardInterrupt:  # the executor has cancelled the points in flight
            _remove_interrupted(out, results, todo)
            hashes.save()
            write_sweep_files(result, config_path)
            raise
    hashes.save()
    write_sweep_files(result, config_path)
    return result


def csv_columns(grid: Grid) -> list:
    from servesim.sweep import speculative

    extra = speculative.COLUMNS if speculative.has_axis(grid.keys) else ()
    return ["point", *grid.keys, "status", "error", *FIGURES, *extra, "dir"]


def csv_rows(result: SweepResult) -> list:
    """One row (a dict of texts) per point, in grid order."""
    from servesim.sweep import speculative

    rows = []
    spec = (speculative.cells(result.points, result.grid.keys)
            if speculative.has_axis(result.grid.keys) else [{}] * len(result.points))
    for p, extra in zip(result.points, spec):
        row = {"point": str(p.index)}
        row.update({k: cell_text(p.values[k]) if k in p.values else "" for k in result.grid.keys})
        row["status"] = p.status
        row["error"] = p.error or ""
        for column, (key, sub) in FIGURES.items():
            value = None
            if p.summary is not None:
                value = p.summary.get(key)
                if sub is not None:
                    value = value.get(sub) if isinstance(value, dict) else None
            row[column] = "" if value is None else (repr(value) if isinstance(value, float) else str(value))
        for column, value in extra.items():
            row[column] = "" if value is None else (repr(value) if isinstance(value, float) else str(value))
        row["dir"] = p.dir
        rows.append(row)
    return rows


def write_sweep_files(result: SweepResult, config_path: str) -> None:
    """sweep.csv (one row per point) and sweep.json (the grid and each
    point's status), each written to a temporary name and renamed
    (outdir.write_file)."""
    from servesim.results.outdir import write_file

    out = Path(result.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=csv_columns(result.grid), lineterminator="\n")
    writer.writeheader()
    writer.writerows(csv_rows(result))
    write_file(out / SWEEP_CSV, buf.getvalue())

    doc = {
        "config": config_path,
        "grid": os.path.abspath(result.grid.source),
        "keys": list(result.grid.keys),
        "points": [
            {"point": p.index, "values": p.values, "dir": p.dir, "status": p.status,
             "error": p.error, "resumed": p.resumed}
            for p in result.points
        ],
        "ok": sum(p.status == STATUS_OK for p in result.points),
        "failed": len(result.failed),
    }
    write_file(out / SWEEP_JSON, json.dumps(doc, indent=2, allow_nan=False) + "\n")
