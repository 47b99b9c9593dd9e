"""HTML pages of a capacity search (capacity.json) and of a deployment
search (search.json), in the style of servesim/results/report.py; any other
folder is that module's (a run's or a sweep's).

- capacity: the answer, one plot per SLO of every probe's figure against the
  load (the SLO's target as a dashed line, the capacity as a dotted one;
  green where the probe meets that SLO, red where not; filled when it meets
  every SLO, hollow when not), and the probe table;
- search: the Pareto front of request rate per GPU against the first SLO's
  figure (points meeting the SLOs filled, the winner starred, the
  non-dominated points joined), and the table of points with their ranks.
"""

import os
from pathlib import Path

from servesim.results import report as base

CAPACITY_JSON = "capacity.json"
SEARCH_JSON = "search.json"
MEET, MISS = "#2ca02c", "#d62728"


def _figure_text(name: str, value) -> str:
    return base._pct(value) if name == "goodput" else base._ms(value)


def _cards(items) -> str:
    return '<div class="cards">' + "".join(
        f"<div class=\"card\"><b>{base._esc(v)}</b><span>{base._esc(k)}</span></div>" for k, v in items) + "</div>"


def _probe_curve(plots, doc: dict) -> str:
    names = [n for n in doc["slo"] if doc["probes"] and n in doc["probes"][0]["metrics"]]
    probes = sorted(doc["probes"], key=lambda p: p["rate"])
    rates = [p["rate"] for p in probes]
    log = max(rates) / min(rates) > 8

    def draw(fig):
        axes = fig.subplots(1, len(names), squeeze=False)[0]
        for ax, name in zip(axes, names):
            values = [p["metrics"][name] for p in probes]
            shown = [(r, v, name not in p["violated"], p["meets"])
                     for r, v, p in zip(rates, values, probes) if v is not None]
            ax.plot([r for r, *_ in shown], [v for _, v, *_ in shown], color="#888", lw=1, zorder=1)
            for r, v, ok, all_ok in shown:
                ax.scatter([r], [v], s=28, zorder=2, color=(MEET if ok else MISS) if all_ok else "white",
                           edgecolors=MEET if ok else MISS, linewidths=1.4)
            ax.axhline(doc["slo"][name], color=MISS, ls="--", lw=1, label=f"SLO {doc['slo'][name]:g}")
            if doc["capacity"] is not None:
                ax.axvline(doc["capacity"], color="#1f77b4", ls=":", lw=1.2, label=f"capacity {doc['capacity']:g}")
            if log:
                ax.set_xscale("log", base=2)
            ys = [v for _, v, *_ in shown] + [doc["slo"][name]]
            if name != "goodput" and min(ys) > 0 and max(ys) / min(ys) > 20:
                ax.set_yscale("log")
            ax.set_xlabel(f"{doc['load']['key']} ({doc['load']['unit']})")
            ax.set_ylabel(name if name == "goodput" else name.replace("_ms", " (ms)"))
            ax.set_title(name)
            ax.legend(loc="best", fontsize=8)
            ax.grid(alpha=0.3)

    return plots.figure(draw, width=min(12.0, 4.2 * len(names) + 1), height=3.4)


def capacity_page(directory: Path, plots) -> str:
    doc = base._read_json(directory / CAPACITY_JSON)
    names = [n for n in doc["slo"] if doc["probes"] and n in doc["probes"][0]["metrics"]]
    unit = doc["load"]["unit"]
    body = [_cards([("capacity (" + unit + ")", "–" if doc["capacity"] is None else f"{doc['capacity']:g}"),
                    ("req/s sustained", base._fmt(doc["request_rate"])),
                    ("GPUs", doc["gpus"]), ("req/s per GPU", base._fmt(doc["request_rate_per_gpu"])),
                    ("binding SLO", doc["binding_slo"] or "–"), ("probes", len(doc["probes"]))]),
            f"<p>{base._esc(doc['message'])}</p>"]
    body += [f"<p>note: {base._esc(n)}</p>" for n in doc["notes"]]
    if doc["probes"]:
        body.append("<h2>Probe curve</h2>")
        body.append(base._img("probe-curve", _probe_curve(plots, doc),
                              "Each probe's figure against the load; dashed: the SLO, dotted: the capacity; "
                              "green: meets this SLO, red: misses it; filled: the probe meets every SLO, "
                              "hollow: it misses at least one."))
    header = ["probe", "phase", base._esc(doc["load"]["key"]), "meets",
              *[base._esc(f"{n} ({'≥' if n == 'goodput' else '≤'} {doc['slo'][n]:g})") for n in names],
              "req/s", "finished", "rejected"]
    rows, classes = [], []
    for p in sorted(doc["probes"], key=lambda p: p["rate"]):
        rows.append([p["probe"], p["phase"], f"{p['rate']:g}", "yes" if p["meets"] else "no",
                     *[_figure_text(n, p["metrics"][n]) for n in names],
                     base._fmt(p["request_rate"]), p["finished"], p["rejected"]])
        classes.append("" if p["meets"] else "failed")
    body += ["<h2>Probes</h2>", f'<div class="scroll">{base._table(header, rows, classes)}</div>']
    subtitle = base._esc(f"SLOs: {', '.join(f'{k}={v:g}' for k, v in doc['slo'].items())} · precision "
                         f"{doc['precision']:g} · config {os.path.basename(doc['config'])}")
    return base._page(f"servesim capacity: {directory.resolve().name}", subtitle, body)


def pareto_front(points: list) -> list:
    """The points no other point beats on both request rate per GPU
    (higher) and latency (lower), by rate per GPU; points are (x, y, index)."""
    front, best = [], None
    for x, y, i in sorted(points, key=lambda t: (-t[0], t[1], t[2])):
        if best is None or y < best:
            front.append((x, y, i))
            best = y
    return front


def _pareto_plot(plots, doc: dict, name: str) -> str:
    pts = [p for p in doc["points"] if p["status"] == "ok" and p.get("metrics") and p["metrics"].get(name) is not None
           and p["request_rate_per_gpu"] is not None]

    def draw(fig):
        ax = fig.subplots()
        for p in pts:
            ok = p["meets"]
            ax.scatter([p["request_rate_per_gpu"]], [p["metrics"][name]], s=36, zorder=2,
                       color=MEET if ok else "white", edgecolors=MEET if ok else MISS, linewidths=1.4)
            ax.annotate(str(p["point"]), (p["request_rate_per_gpu"], p["metrics"][name]), fontsize=7,
                        xytext=(4, 3), textcoords="offset points")
        front = pareto_front([(p["request_rate_per_gpu"], p["metrics"][name], p["point"]) for p in pts])
        if front:
            front = sorted(front)
            ax.plot([x for x, _, _ in front], [y for _, y, _ in front], color="#1f77b4", lw=1.2,
                    zorder=1, label="Pareto front")
        if doc["winner"] is not None:
            w = doc["points"][doc["winner"]]
            if w.get("metrics") and w["metrics"].get(name) is not None:
                ax.scatter([w["request_rate_per_gpu"]], [w["metrics"][name]], marker="*", s=220,
                           color="#ff7f0e", edgecolors="black", zorder=3, label=f"winner (point {w['point']})")
        ax.axhline(doc["slo"][name], color=MISS, ls="--", lw=1, label=f"SLO {doc['slo'][name]:g}")
        ax.set_xlabel("request rate per GPU (req/s)")
        ax.set_ylabel(name if name == "goodput" else name.replace("_ms", " (ms)"))
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8)

    return plots.figure(draw, width=8.0, height=4.0)


def search_page(directory: Path, plots) -> str:
    doc = base._read_json(directory / SEARCH_JSON)
    from servesim.config.slo import ALLOW_REJECTED, checked_names

    names = checked_names(doc["slo"])
    capacity_mode = doc["mode"] == "capacity"
    points = doc["points"]
    body = [_cards([("points", len(points)), ("meet the SLOs", len(doc["ranking"])),
                    ("skipped", sum(p["status"] == "skipped" for p in points)),
                    ("winner", "–" if doc["winner"] is None else f"point {doc['winner']}")]),
            f"<p>{base._esc(doc['message'])}</p>"]
    if any(p["status"] == "ok" for p in points):
        body.append("<h2>Pareto front</h2>")
        what = "at its capacity" if capacity_mode else f"at {doc['load']['key']}={doc['rate']}"
        body.append(base._img("pareto", _pareto_plot(plots, doc, names[0]),
                              f"Each point {what}: request rate per GPU against {names[0]}; filled: meets "
                              "every SLO, hollow: misses one; the star is the winner."))
    header = ["rank", "point", *map(base._esc, doc["keys"]), "GPUs", "status",
              *(["capacity", "req/s per GPU"] if capacity_mode else []), "margin",
              *map(base._esc, names), "rejected", "unfinished", "folder"]
    rows, classes = [], []
    order = doc["ranking"] + [p["point"] for p in points if p["point"] not in doc["ranking"]]
    for i in order:
        p = points[i]
        cells = [p["rank"] or "–", p["point"], *[base._esc(p["values"].get(k, "")) for k in doc["keys"]],
                 p["gpus"], base._esc(p["status"] if p["status"] != "ok" else ("meets" if p["meets"] else "misses"))]
        if p["status"] == "ok":
            if capacity_mode:
                bound = "≥ " if p.get("capacity_is_lower_bound") else ""
                cells += [bound + base._fmt(p["capacity"]), base._fmt(p["request_rate_per_gpu"])]
            metrics = p.get("metrics") or {}
            cells += [base._fmt(p["margin"]), *[_figure_text(n, metrics.get(n)) for n in names],
                      base._fmt(p.get("rejected")), base._fmt(p.get("unfinished"))]
        else:
            span = len(names) + 3 + (2 if capacity_mode else 0)
            cells.append((f'class="err" colspan="{span}"', base._esc(p["error"] or "")))
        cells.append(f'<a href="{base._esc(p["dir"])}">{base._esc(p["dir"])}</a>')
        rows.append(cells)
        classes.append("" if p["meets"] else "failed")
    body += ["<h2>Points</h2>", f'<div class="scroll">{base._table(header, rows, classes)}</div>']
    mode = "capacity per point" if capacity_mode else f"at {doc['load']['key']}={doc['rate']}"
    allowed = doc["slo"].get(ALLOW_REJECTED, 0)
    subtitle = base._esc(f"{mode} · SLOs: {', '.join(f'{k}={v:g}' for k, v in doc['slo'].items())} · "
                         f"at most {allowed:g} of the requests rejected or unfinished · "
                         f"grid {os.path.basename(doc['grid'])}")
    return base._page(f"servesim search: {directory.resolve().name}", subtitle, body)


def write_report(directory) -> Path:
    """Write `directory/report.html` for a capacity search, a deployment
    search, or (servesim/results/report.py) a run or a sweep."""
    d = Path(directory)
    if (d / CAPACITY_JSON).is_file():
        page = capacity_page
    elif (d / SEARCH_JSON).is_file():
        page = search_page
    else:
        return base.write_report(d)
    from servesim.results.outdir import check_replaceable, write_file

    check_replaceable(d, [base.REPORT])
    return write_file(d / base.REPORT, page(d, base._Plots()))
