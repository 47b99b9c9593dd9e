"""`servesim capacity CONFIG --slo ...`: the highest load meeting the SLOs.

The load is the workload's own knob (`load.py`: a trace's speedup, a
synthetic rate or a closed loop's concurrency). Every probe is a full replay
at one load, checked against the SLOs (`config/slo.py`). Latency grows with load,
but not strictly monotonically in a finite replay, so the search

1. brackets: from the config's own load, doubles while the SLOs hold (up to
   `max_rate`), or halves while they do not (down to `min_rate`);
2. bisects the bracket [meets, misses] until the upper end is within the
   relative `precision` of the lower (a concurrency: within one request);
3. confirms: replays just above the answer (answer x (1 + precision), or
   answer + 1 request). If that probe meets the SLOs as well, the answer
   moves up to it and the search goes on above it (noted in the result), so
   the answer always meets the SLOs and the probe just above misses one.

Probes are deterministic functions of the load, so the whole search is too.
The result (`capacity.json`) lists every probe in order with each SLO's
figure, the answer, the binding SLO (the one the probe just above misses
by most) and the GPUs of the deployment.
"""

import json
import os
import time
from pathlib import Path

import attrs

from servesim.errors import InputError

CAPACITY_JSON = "capacity.json"
DEFAULT_PRECISION = 0.02
DEFAULT_SPAN = 1024  # default max_rate = start x SPAN, min_rate = start / SPAN
# The lowest load probed, as a fraction of the config's own (`_check_floor`):
# a million times slower stretches an hour of arrivals to 400 years of
# simulated milliseconds, where float64 still resolves a microsecond.
FLOOR_SPAN = DEFAULT_SPAN ** 2
MAX_PROBES = 80
FOUND, UNMET, MAX_MET = "found", "unmet", "max_rate_met"
PROBE_FIGURES = ("requests", "finished", "rejected", "unfinished", "request_rate",
                 "output_tokens_per_s", "duration_ms")


# --------------------------------------------------------------------------- the search


@attrs.define
class Outcome:
    """What `bracket_and_bisect` found: `status` (found | unmet |
    max_rate_met), the `answer` (highest load seen to meet, None if none),
    `above` (the probe just above that misses, for found), the probes in
    order as (value, phase) and their results by value, and notes."""

    status: str
    answer: object
    above: object
    order: list
    results: dict
    notes: list


def bracket_and_bisect(probe, start, *, integer=False, precision=DEFAULT_PRECISION,
                       min_value, max_value, results=None, order=None, max_probes=MAX_PROBES) -> Outcome:
    """Search the highest value in [min_value, max_value] where probe(value)
    ["meets"]. `results`/`order` may hold probes already made (value ->
    result, [(value, phase)]). Values are rounded to 6 significant digits
    (integers for `integer`), so every probe's value is exact in its text."""
    results = {} if results is None else results
    order = [] if order is None else order
    notes = []

    def rnd(x):
        return int(x) if integer else float(f"{float(x):.6g}")

    def at(value, phase):
        value = rnd(value)
        if value not in results:
            if len(order) >= max_probes:
                raise _Budget()
            results[value] = probe(value)
            order.append((value, phase))
        return results[value]["meets"]

    def just_above(x):
        return max(x + 1, int(x * (1 + precision))) if integer else rnd(x * (1 + precision))

    def midpoint(a, b):
        return (a + b) // 2 if integer else rnd((a + b) / 2)

    lo = hi = None
    start = rnd(start)
    try:
        if at(start, "bracket"):
            lo = start
        else:
            hi = start
            while lo is None:
                nxt = max(rnd(hi // 2 if integer else hi / 2), rnd(min_value))
                if nxt >= hi:
                    return Outcome(UNMET, None, None, order, results, notes)
                if at(nxt, "bracket"):
                    lo = nxt
                else:
                    hi = nxt
        while True:
            while hi is None:  # double while the SLOs hold
                nxt = min(rnd(lo * 2), rnd(max_value))
                if nxt <= lo:
                    return Outcome(MAX_MET, lo, None, order, results, notes)
                if at(nxt, "bracket"):
                    lo = nxt
                else:
                    hi = nxt
            while hi > just_above(lo):
                mid = midpoint(lo, hi)
                if not lo < mid < hi:
                    break
                if at(mid, "bisect"):
                    lo = mid
                else:
                    hi = mid
            confirm = min(just_above(lo), rnd(max_value))
            if confirm <= lo:
                return Outcome(MAX_MET, lo, None, order, results, notes)
            if not at(confirm, "confirm"):
                return Outcome(FOUND, lo, confirm, order, results, notes)
            notes.append(f"{confirm} just above the bisected answer {lo} also meets the SLOs "
                         "(latency is not monotone in load here); searched on above it")
            lo = confirm
            misses = [v for v, r in results.items() if v > lo and not r["meets"]]
            hi = min(misses) if misses else None
    except _Budget:
        notes.append(f"stopped after {max_probes} probes without a confirmed answer")
        return Outcome(FOUND if lo is not None else UNMET, lo, None, order, results, notes)


class _Budget(Exception):
    pass


# --------------------------------------------------------------------------- probes


def run_probe(config, overrides, load, value, slos, limit=None) -> dict:
    """Replay `config` at load `value` and check it against `slos`: the
    probe's row of capacity.json (without its index and phase)."""
    from servesim.config.slo import evaluate
    from servesim.replay.api import run

    report = run(config, overrides=(*overrides, load.override(value)), limit=limit)
    ev = evaluate(slos, report.summary, report.records)
    row = {"rate": load.value(value), "meets": ev["meets"], "metrics": ev["metrics"],
           "ratios": ev["ratios"], "violated": ev["violated"], "margin": ev["margin"]}
    row.update({key: report.summary[key] for key in PROBE_FIGURES})
    return row


def _check_positive(name, value, integer):
    if value is None:
        return None
    bad = isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf")
    if integer and not bad and float(value) != int(value):
        bad = True
    if bad:
        what = "a positive integer" if integer else "a finite number > 0"
        raise InputError(f"--{name.replace('_', '-')}: must be {what}, got {value!r}")
    return int(value) if integer else float(value)


def _check_floor(name, value, load):
    """A speedup or rate no lower than the config's own load / FLOOR_SPAN:
    far below it the simulated clock (float64 milliseconds) no longer
    resolves the latencies, and a tiny SLO "holds" at a meaningless load."""
    floor = load.start / FLOOR_SPAN
    if value is not None and not load.integer and value < floor:
        raise InputError(f"--{name.replace('_', '-')}: {value!r} is below the lowest load servesim "
                         f"probes, {floor:.6g} ({load.key} {load.start!r} / {FLOOR_SPAN})")
    return value


def bracket_limits(load, start=None, min_rate=None, max_rate=None) -> tuple:
    """`(start, min_rate, max_rate)` of a search of `load`, the options
    checked (finite, positive, not below `_check_floor`) and the defaults
    filled in; `search --capacity` checks its options here before any point."""
    integer = load.integer
    start = _check_floor("start", _check_positive("start", start, integer), load) or load.start
    max_rate = _check_positive("max_rate", max_rate, integer) or (start * DEFAULT_SPAN)
    min_rate = _check_floor("min_rate", _check_positive("min_rate", min_rate, integer), load) \
        or (1 if integer else max(start / DEFAULT_SPAN, load.start / FLOOR_SPAN))
    if not min_rate <= start <= max_rate:
        raise InputError(f"--start {start} must lie between --min-rate {min_rate} and --max-rate {max_rate}")
    return start, min_rate, max_rate


def capacity(config, slos, *, overrides=(), limit=None, precision=DEFAULT_PRECISION, start=None,
             min_rate=None, max_rate=None, progress=None, load=None) -> dict:
    """Find the highest load of `config` (a path) meeting `slos`; returns
    the capacity.json document. `start` defaults to the config's own load;
    `max_rate` to start x 1024 (and, for a concurrency, the workload's
    request count); `min_rate` to start / 1024 (a concurrency: 1).
    `progress(row)` is called after each probe."""
    from servesim.capacity.gpus import gpus_of
    from servesim.capacity.load import load_of
    from servesim.config.slo import binding
    from servesim.replay.api import resolve_config
    from servesim.config.config import config_to_dict

    began = time.perf_counter()
    if isinstance(precision, bool) or not isinstance(precision, (int, float)) or not 1e-4 <= precision < 1:
        raise InputError(f"--precision: must be a fraction in [0.0001, 1), got {precision!r}")
    config_path = os.path.abspath(str(config))
    cfg = resolve_config(config_path, overrides)
    load = load or load_of(cfg)
    integer = load.integer
    start, min_rate, max_rate = bracket_limits(load, start, min_rate, max_rate)

    index = []

    def probe(value):
        row = run_probe(config_path, overrides, load, value, slos, limit)
        index.append(row)
        if progress is not None:
            progress(row)
        return row

    results, order = {}, []
    if integer:  # more requests in flight than there are requests changes nothing
        first = probe(start)
        results[load.value(start)] = first
        order.append((load.value(start), "bracket"))
        max_rate = max(min(max_rate, first["requests"]), start)
    outcome = bracket_and_bisect(probe, start, integer=integer, precision=precision,
                                 min_value=min_rate, max_value=max_rate, results=results, order=order)
    probes = [{"probe": i, "phase": phase, **outcome.results[v]} for i, (v, phase) in enumerate(outcome.order)]
    at_answer = outcome.results.get(outcome.answer) if outcome.answer is not None else None
    resolved = json.loads(json.dumps(config_to_dict(cfg)))
    gpus = gpus_of(resolved)
    if outcome.status == FOUND:
        bind = binding(outcome.results[outcome.above]) if outcome.above is not None else None
    elif outcome.status == UNMET:
        lowest = min(outcome.results)
        bind = binding(outcome.results[lowest])
    else:
        bind = None
    sustained = at_answer["request_rate"] if at_answer else None
    doc = {
        "config": config_path,
        "overrides": list(overrides),
        "limit": limit,
        "load": load.to_dict(),
        "slo": slos.to_dict(),
        "precision": precision,
        "min_rate": load.value(min_rate),
        "max_rate": load.value(max_rate),
        "status": outcome.status,
        "capacity": outcome.answer,
        "above": outcome.above,
        "capacity_is_lower_bound": outcome.answer is not None and outcome.above is None,
        "binding_slo": bind,
        "request_rate": sustained,
        "gpus": gpus,
        "request_rate_per_gpu": None if sustained is None else round(sustained / gpus, 6),
        "margin": at_answer["margin"] if at_answer else None,
        "message": "",
        "notes": outcome.notes,
        "probes": probes,
        "resolved_config": resolved,
        "wall_time_s": round(time.perf_counter() - began, 6),
    }
    doc["message"] = message(doc)
    return doc


def is_lower_bound(doc: dict) -> bool:
    """A capacity with no probe above it that misses the SLOs (every probe
    met up to --max-rate, or the probe budget ran out): the true capacity
    is at least this, maybe more."""
    return doc["capacity"] is not None and doc["above"] is None


def message(doc: dict) -> str:
    """The one-paragraph answer of a capacity document."""
    from servesim.config.slo import miss_text

    load, status = doc["load"], doc["status"]
    key, unit = load["key"], load["unit"]
    if status == FOUND:
        bind = doc["binding_slo"]
        text = (f"capacity: {key}={doc['capacity']} ({unit}), {doc['request_rate']} req/s sustained on "
                f"{doc['gpus']} GPU(s)")
        if doc["above"] is None:
            return f"{text}; a lower bound: no probe above it missed the SLOs before the probe budget ran out"
        above = next(p for p in doc["probes"] if p["rate"] == doc["above"])
        return f"{text}; at {doc['above']} {miss_text(bind, above, doc['slo'])}"
    if status == MAX_MET:
        return (f"every probe meets the SLOs up to the maximum {key}={doc['max_rate']} ({unit}); "
                f"the capacity is at least that (raise --max-rate to look further)")
    bind = doc["binding_slo"]
    lowest = min(doc["probes"], key=lambda p: p["rate"])
    return (f"no load meets the SLOs: even at {key}={lowest['rate']} (the lowest probed, --min-rate "
            f"{doc['min_rate']}) {miss_text(bind, lowest, doc['slo'])}")


def write_capacity(doc: dict, out_dir) -> Path:
    """Write `out_dir/capacity.json` (outdir.write_file: a temporary name,
    then a rename; never over a file servesim did not write)."""
    from servesim.results.outdir import write_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return write_file(out / CAPACITY_JSON, json.dumps(doc, indent=2, allow_nan=False) + "\n")


def probe_table(doc: dict) -> str:
    """The probes as a text table: load, meets, each SLO's figure / target,
    and the rejected + unfinished requests against their allowance."""
    from servesim.config.slo import ALLOW_REJECTED, COMPLETED

    names = list(doc["slo"])
    names = [n for n in names if n in (doc["probes"][0]["metrics"] if doc["probes"] else {})]
    head = (f"{'probe':>5} {'phase':<8} {'load':>12} {'meets':<5}" + " ".join(f"{n} ".rjust(15) for n in names)
            + " rejected+unfinished")
    bounds = " ".join((f"{'>=' if n == 'goodput' else '<='} {doc['slo'][n]:g}" + " ").rjust(15) for n in names)
    allowed = doc["slo"].get(ALLOW_REJECTED, 0)
    lines = [head, " " * 33 + bounds + f" <= {allowed:g} of requests".rjust(20)]
    for p in sorted(doc["probes"], key=lambda p: p["rate"]):
        cells = " ".join(
            (("-" if p["metrics"][n] is None else f"{p['metrics'][n]:.6g}")
             + ("*" if n in p["violated"] else " ")).rjust(15) for n in names)
        lost = (f"{p['rejected']}+{p['unfinished']}" + ("*" if COMPLETED in p["violated"] else " ")).rjust(20)
        mark = "yes" if p["meets"] else "no"
        lines.append(f"{p['probe']:>5} {p['phase']:<8} {p['rate']:>12g} {mark:<5}{cells} {lost}")
    return "\n".join(lines)
