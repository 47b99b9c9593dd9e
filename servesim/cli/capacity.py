"""The `servesim capacity` and `servesim search` commands (registered by
servesim/cli/main.py)."""

import json
import sys

import click

from servesim.cli.debug import check_option

SLO_HELP = ("An SLO, METRIC=VALUE: ttft|tpot|itl|e2e _mean|_p50|_p90|_p95|_p99 _ms (e.g. ttft_p90_ms=2000), "
            "or goodput=FRACTION with per-request ttft_ms / tpot_ms / e2e_ms targets. Repeatable; "
            "adds to or replaces the config's slo: block.")
PRECISION_HELP = "Relative precision of the answer (bisect until the bracket is this narrow)."
ALLOW_REJECTED_HELP = ("Fraction of the requests that may be rejected or unfinished in a run that meets the "
                       "SLOs (default 0: a run that loses any request misses).")


def _html(html_report) -> tuple:
    """What --report replaces."""
    from servesim.results.output import HTML_REPORT

    return (HTML_REPORT,) if html_report else ()


def _write_html(out_dir):
    from servesim.capacity.report import write_report

    return write_report(out_dir)


@click.command()
@click.argument("config", type=click.Path(exists=True, dir_okay=False))
@click.option("--slo", "slo_options", multiple=True, metavar="METRIC=VALUE", help=SLO_HELP)
@click.option("--allow-rejected", type=float, metavar="FRACTION", help=ALLOW_REJECTED_HELP)
@click.option("-o", "--output-dir", default="capacity-out", show_default=True, type=click.Path(file_okay=False),
              help="Directory for capacity.json (and report.html).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override one config key (YAML-typed value). Repeatable.")
@click.option("--limit", type=click.IntRange(min=1), metavar="N", help="Replay only the first N trace rows.")
@click.option("--precision", type=float, default=0.02, show_default=True, help=PRECISION_HELP)
@click.option("--start", type=float, help="First load probed (default: the config's speedup / rate / concurrency).")
@click.option("--min-rate", type=float, help="Lowest load probed (default: start / 1024; a concurrency: 1).")
@click.option("--max-rate", type=float, help="Highest load probed (default: start x 1024).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("-q", "--quiet", is_flag=True, help="Print only the answer.")
@click.option("--report", "html_report", is_flag=True, help="Also write report.html (needs servesim[report]).")
@check_option
def capacity_command(config, slo_options, allow_rejected, output_dir, overrides, limit, precision, start, min_rate, max_rate,
                     fmt, quiet, html_report):
    """The highest load of CONFIG at which the SLOs hold.

    The load is a trace's speedup, a synthetic workload's rate, or a closed
    loop's concurrency. It brackets by doubling (or halving), bisects to
    --precision, and confirms with a probe just above the answer; every probe
    is a full replay; a probe with rejected or unfinished requests misses
    unless --allow-rejected allows them. Exits 1 when no load down to
    --min-rate meets the SLOs.
    """
    from servesim.capacity.capacity import CAPACITY_JSON, UNMET, capacity, probe_table, write_capacity
    from servesim.config.slo import load_slos

    if html_report:
        from servesim.results.report import require_matplotlib

        require_matplotlib()
    slos = load_slos(config, slo_options, overrides, allow_rejected)

    def as_int(x):
        return int(x) if x is not None and float(x).is_integer() else x

    progress = None
    if fmt == "table" and not quiet and sys.stdout.isatty():
        def progress(row):
            state = "meets" if row["meets"] else "misses " + ", ".join(row["violated"])
            click.echo(f"  probe at {row['rate']:g}: {state}", err=True)

    from servesim.capacity.load import load_of
    from servesim.cli.compile_progress import for_command
    from servesim.replay.api import resolve_config

    from servesim.results.outdir import claim

    integer = load_of(resolve_config(config, overrides)).integer
    # an unwritable folder, or the user's own capacity.json, fails before the probes
    with claim(output_dir, remove_if_empty=True, replaces=(CAPACITY_JSON, *_html(html_report))):
        with for_command(config, overrides, quiet or fmt == "json") as compiling:
            if progress is not None and compiling is not None:
                shown = progress

                def progress(row):
                    compiling.pause()  # a probe's line goes below the compile's
                    shown(row)

            doc = capacity(config, slos, overrides=tuple(overrides), limit=limit, precision=precision,
                           start=as_int(start) if integer else start,
                           min_rate=as_int(min_rate) if integer else min_rate,
                           max_rate=as_int(max_rate) if integer else max_rate, progress=progress)
        path = write_capacity(doc, output_dir)
        if html_report:
            _write_html(output_dir)
    if fmt == "json":
        click.echo(json.dumps(doc, indent=2))
    else:
        if not quiet or doc["status"] == UNMET:
            click.echo(f"SLOs: {slos.describe()}")
            click.echo(probe_table(doc))
            for note in doc["notes"]:
                click.echo(f"note: {note}")
        click.echo(doc["message"])
        if not quiet:
            click.echo(f"output          {path}")
    if doc["status"] == UNMET:
        click.get_current_context().exit(1)


def _why(doc) -> None:
    """Why a rate search's winner wins: its tightest SLO, and the next cheaper
    point replayed and what it missed."""
    from servesim.capacity.plan import tightest_slo, missed_text

    points = doc["points"]
    win = points[doc["winner"]]

    def level(p):
        return (p["dollars_per_hour"], p["gpus"]) if p.get("dollars_per_hour") is not None else (p["gpus"],)

    tight = tightest_slo(win["metrics"], doc["slo"])
    figure = (win["metrics"] or {}).get(tight)
    line = f"  why: binding SLO {tight}" + (f" {figure:.1f} (target {doc['slo'][tight]:g})" if figure is not None else "")
    click.echo(line + f", margin {win['margin']}")
    cheaper = [p for p in points if p["status"] == "ok" and not p["meets"] and level(p) < level(win)]
    if cheaper:
        top = max(level(p) for p in cheaper)
        nxt = max((p for p in cheaper if level(p) == top),
                  key=lambda p: p["margin"] if p["margin"] is not None else -1e300)
        values = ", ".join(f"{k}={v}" for k, v in nxt["values"].items())
        click.echo(f"  the next cheaper point, {nxt['point']} ({values}, {nxt['gpus']} GPU(s)), misses "
                   f"{missed_text(nxt, doc['slo'])}")


def _write_winner(config, grid, doc, slos, output_dir, limit) -> None:
    """best.yaml and launch.sh of the search's winner, at the search's load
    (a rate search) or the winner's capacity."""
    import os
    from pathlib import Path

    from servesim.capacity.load import Load
    from servesim.capacity.plan import BEST_YAML, LAUNCH_SH, write_answer
    from servesim.results.outdir import record_written

    win = doc["points"][doc["winner"]]
    load = doc["load"]
    rate = doc["rate"] if doc["mode"] == "rate" else win["capacity"]
    knob = Load(load["key"], load["kind"], load["start"], load["kind"] == "concurrency")
    values = ", ".join(f"{k}={v}" for k, v in win["values"].items())
    extra = () if limit is None else (f"workload.limit={int(limit)}",)
    write_answer(os.path.abspath(config), win["values"], knob, rate, slos, Path(output_dir),
                 f"point {win['point']} ({values}) of {os.path.basename(grid)}, {win['gpus']} GPU(s)", extra)
    record_written(output_dir, [BEST_YAML, LAUNCH_SH])


@click.command()
@click.argument("config", type=click.Path(exists=True, dir_okay=False))
@click.option("--slo", "slo_options", multiple=True, metavar="METRIC=VALUE", help=SLO_HELP)
@click.option("--allow-rejected", type=float, metavar="FRACTION", help=ALLOW_REJECTED_HELP)
@click.option("--grid", required=True, type=click.Path(exists=True, dir_okay=False),
              help="Grid of deployments (a sweep grid file); it may not set the load.")
@click.option("--rate", type=float, help="The load every point must sustain (speedup, req/s or concurrency).")
@click.option("--capacity", "capacity_mode", is_flag=True,
              help="Instead of --rate: a capacity search per point, ranked by request rate per GPU.")
@click.option("-o", "--output-dir", default="search-out", show_default=True, type=click.Path(file_okay=False),
              help="Directory for search.csv, search.json and points/NNN-*/.")
@click.option("--limit", type=click.IntRange(min=1), metavar="N", help="Replay only the first N trace rows.")
@click.option("--precision", type=float, default=0.02, show_default=True, help=PRECISION_HELP + " (--capacity)")
@click.option("--min-rate", type=float, help="Lowest load probed (--capacity).")
@click.option("--max-rate", type=float, help="Highest load probed (--capacity).")
@click.option("--no-skip", is_flag=True, help="Run every point, also those with more GPUs than a winner.")
@click.option("-j", "--jobs", type=click.IntRange(min=1), metavar="N", help="Points run at once (default 1).")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True)
@click.option("--ray-address", metavar="ADDR", help="Ray cluster to use, e.g. auto.")
@click.option("--report", "html_report", is_flag=True, help="Also write report.html (needs servesim[report]).")
@check_option
def search_command(config, slo_options, allow_rejected, grid, rate, capacity_mode, output_dir, limit, precision, min_rate,
                   max_rate, no_skip, jobs, executor, ray_address, html_report):
    """The deployments of a grid that meet the SLOs, fewest GPUs first.

    With --rate R every point replays at load R; points meeting the SLOs
    rank by GPUs, then margin, and points with more GPUs than one that
    meets are skipped. With --capacity each point gets its own capacity
    search and points rank by request rate per GPU (a capacity that is only
    a lower bound, every probe met up to --max-rate, after an exact one of
    the same rate). A point with rejected or unfinished requests misses
    unless --allow-rejected allows them. Points already done in OUTPUT_DIR
    are not run again. The winner is written as best.yaml (a config that
    replays it at the load) and launch.sh (its vllm serve commands).
    A grid value null unsets a key, so one grid may mix aggregated and
    disaggregated points. Exits 1 if no point meets the SLOs or a
    point failed.
    """
    from servesim.capacity.search import FAILED, SEARCH_CSV, search
    from servesim.config.slo import load_slos
    from servesim.errors import InputError

    if html_report:
        from servesim.results.report import require_matplotlib

        require_matplotlib()
    if executor == "local" and ray_address is not None:
        raise InputError("--ray-address applies only to --executor ray")
    if not capacity_mode and (min_rate is not None or max_rate is not None):
        raise InputError("--min-rate / --max-rate apply only to --capacity")
    slos = load_slos(config, slo_options, allow_rejected=allow_rejected)
    if rate is not None and float(rate).is_integer():
        rate = int(rate)
    from servesim.capacity.plan import BEST_YAML, LAUNCH_SH
    from servesim.results.outdir import claim

    # an unwritable folder, or the user's own file in the way, fails before any point
    try:
        with claim(output_dir, remove_if_empty=True, replaces=(*_html(html_report), BEST_YAML, LAUNCH_SH)):
            doc = search(config, grid, slos, output_dir, rate=rate, capacity_mode=capacity_mode, limit=limit,
                         precision=precision, min_rate=min_rate, max_rate=max_rate, jobs=jobs,
                         executor=executor, ray_address=ray_address, skip=not no_skip)
            if doc["winner"] is not None:
                _write_winner(config, grid, doc, slos, output_dir, limit)
            if html_report:
                _write_html(output_dir)
    except KeyboardInterrupt:
        click.echo(f"interrupted: {SEARCH_CSV} holds the points that finished; "
                   "run the same search again to resume", err=True)
        click.get_current_context().exit(130)  # said once: not again by the group
    points = doc["points"]
    counts = {s: sum(p["status"] == s for p in points) for s in ("ok", "failed", "skipped")}
    resumed = sum(p["resumed"] for p in points)
    click.echo(f"SLOs: {slos.describe()}")
    click.echo(f"{len(points)} points: {counts['ok']} ok, {counts['failed']} failed, {counts['skipped']} skipped"
               + (f", {resumed} already done" if resumed else "")
               + f"; {len(doc['ranking'])} meet the SLOs")
    for place, index in enumerate(doc["ranking"][:5], 1):
        p = points[index]
        values = ", ".join(f"{k}={v}" for k, v in p["values"].items())
        bound = " (lower bound)" if p.get("capacity_is_lower_bound") else ""
        figure = (f"capacity {p['capacity']}{bound}, {p['request_rate_per_gpu']} req/s per GPU" if capacity_mode
                  else f"margin {p['margin']}")
        lost = f", {p['rejected']} rejected + {p['unfinished']} unfinished" if p["rejected"] or p["unfinished"] else ""
        click.echo(f"  {place}. point {index} ({values}): {p['gpus']} GPU(s), {figure}{lost}")
    click.echo(doc["message"])
    if doc["winner"] is not None and not capacity_mode:
        _why(doc)
    if doc["winner"] is not None:
        click.echo(f"the winner as a config: {output_dir}/best.yaml; its vLLM launch commands: {output_dir}/launch.sh")
    click.echo(f"results in {output_dir}/{SEARCH_CSV}")
    for p in points:
        if p["status"] == FAILED:
            click.echo(f"failed: point {p['point']} ({p['dir']}): {p['error']}", err=True)
    if doc["winner"] is None or counts["failed"]:
        click.get_current_context().exit(1)
