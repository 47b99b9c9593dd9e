"""The `servesim` command line (README.md, "A quick tour").

One click group, a command per verb. Errors are mapped to exit codes in one
place, :meth:`ServesimGroup.invoke`: :class:`InputError` -> "error: ..." and
exit 2 (no traceback); Ctrl-C -> "interrupted" and exit 130; click's usage
errors keep their exit 2; a broken invariant of the debug mode (`--check`,
:class:`InvariantError`) is an internal error, exit 1, with one message and
its traceback only under SERVESIM_DEBUG; anything else
is an internal error, exit 1, with its traceback. Heavy modules (NumPy,
Numba, the engine) are imported inside the commands so `--help` is instant.
"""

import gc
import os
import sys
import traceback
import warnings

# NumPy's OpenBLAS starts a thread per core that spins while NumPy loads; no
# command simulates with BLAS (only `fit` solves small least squares), so one
# thread, unless the user chose (~0.1 s of CPU a run on a 2-core box)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import click  # noqa: E402

from servesim.cli.debug import check_option, traceback_wanted
from servesim.errors import InputError, InvariantError

OVERRIDE_HELP = "Override one config key (YAML-typed value), e.g. engine.num_gpu_blocks=4096. Repeatable."


class ServesimGroup(click.Group):
    """A click group that turns exceptions into messages and exit codes."""

    def invoke(self, ctx):
        from servesim.errors import warnings_as_lines

        try:
            with warnings_as_lines():  # "warning: TEXT", each once
                return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except InputError as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(2)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(130)
        except InvariantError as exc:  # the debug mode caught a bug in servesim
            click.echo(f"internal error: {exc}", err=True)
            if traceback_wanted():
                click.echo(traceback.format_exc(), err=True, nl=False)
            ctx.exit(1)
        except BrokenPipeError:  # the reader of our output went away (`| head`): no traceback
            import os

            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            ctx.exit(1)
        except Exception as exc:
            click.echo(f"internal error: {type(exc).__name__}: {exc}", err=True)
            click.echo(traceback.format_exc(), err=True, nl=False)
            ctx.exit(1)
        finally:
            # The process ends here: moving every object to the permanent
            # generation spares the interpreter's exit a garbage collection
            # that frees Numba's compiled code object by object (~0.3 s).
            gc.freeze()


@click.group(cls=ServesimGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="servesim", prog_name="servesim")
def main():
    """servesim: a GPU-free simulator of LLM serving on vLLM engines."""


class _Progress:
    """A progress bar over requests done, labelled with simulated time; the
    bar is created at the first report, when the total is known."""

    def __init__(self):
        self.bar = None
        self.done = 0

    def __call__(self, sim_time_ms, requests_done, requests_total):
        if self.bar is None:
            self.bar = click.progressbar(length=requests_total, label=self._label(0.0), show_pos=True)
            self.bar.__enter__()
        self.bar.label = self._label(sim_time_ms)
        if requests_done > self.done:
            self.bar.update(requests_done - self.done)
            self.done = requests_done
        else:
            self.bar.render_progress()

    @staticmethod
    def _label(sim_time_ms):
        return f"simulated {sim_time_ms / 1000.0:10.1f} s"

    def close(self):
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None


def _fmt(value, spec=".2f", unit=""):
    return "-" if value is None else f"{value:{spec}}{unit}"


def _pct(fraction):
    return "-" if fraction is None else f"{fraction * 100:.1f}%"


def _routing_lines(workers: list) -> list:
    """Where the router sent the requests, a line per pool of several
    workers: each worker's share of its pool's requests and prefix hit rate."""
    lines = []
    for pool in dict.fromkeys(w.get("pool") for w in workers):
        group = [w for w in workers if w.get("pool") == pool]
        if len(group) < 2:
            continue
        name = "routing" if pool is None else f"{pool} routing"
        cells = ", ".join(f"{w['worker']}: {_pct(w['request_share'])}"
                          + ("" if w["prefix_cache_hit_rate"] is None
                             else f" ({_pct(w['prefix_cache_hit_rate'])} hit)") for w in group)
        lines.append(f"{name:<16}{cells}")
    return lines


def _speculative_lines(spec) -> list:
    """Speculative decoding's drafts and, with --baseline, the TPOT without it."""
    if spec is None:
        return []
    lines = [f"speculative     {spec['method']}, {spec['num_speculative_tokens']} drafts a pass: "
             f"{spec['accepted_tokens']} / {spec['draft_tokens']} accepted "
             f"({_pct(spec['acceptance_rate'])}), mean acceptance length "
             f"{spec['mean_acceptance_length']:.2f}"]
    if "baseline_tpot_ms" in spec:
        speedup = spec["tpot_speedup"]
        lines.append(f"baseline        TPOT {_fmt(spec['baseline_tpot_ms']['mean'])} ms mean without "
                     f"speculative decoding; speedup {_fmt(speedup)}{'' if speedup is None else 'x'}")
    return lines


def _session_lines(sessions) -> list:
    """Sessions completed, and their later turns against their first."""
    if sessions is None:
        return []
    cut = sessions.get("truncated_sessions")
    first, later = sessions["ttft_ms_first_turn"], sessions["ttft_ms_later_turns"]
    return [
        f"sessions        {sessions['sessions']} ({sessions['completed_sessions']} completed"
        + (f", {cut} cut by workload.limit" if cut else "")
        + f"), {sessions['turns_mean']:.2f} turns mean, {sessions['turns_max']} max",
        f"  turns         TTFT mean first {_fmt(first['mean'])} ms, later {_fmt(later['mean'])} ms; "
        f"prefix hit first {_pct(sessions['prefix_cache_hit_rate_first_turn'])}, "
        f"later {_pct(sessions['prefix_cache_hit_rate_later_turns'])}",
    ]


def _load_lines(workers: list) -> list:
    """With telemetry and several workers, a row per worker of its load over
    time (summary.json `workers[*].load`): running and waiting requests and
    KV usage, each as its time-weighted mean / p90."""
    if len(workers) < 2 or not all("load" in w for w in workers):
        return []
    lines = [f"{'worker load':<16}{'running mean/p90':<20}{'waiting mean/p90':<20}KV usage mean/p90"]
    for w in workers:
        load = w["load"]
        name = str(w["worker"]) if "pool" not in w else f"{w['pool']} {w['worker']}"
        cells = [f"{load[q]['mean']:.2f} / {load[q]['p90']:g}" for q in ("running", "waiting")]
        kv = load["kv_usage"]
        lines.append(f"  {name:<14}{cells[0]:<20}{cells[1]:<20}{_pct(kv['mean'])} / {_pct(kv['p90'])}")
    return lines


def format_table(summary: dict, out_dir) -> str:
    """The human summary of a run printed by `servesim run`."""
    s = summary
    lines = [
        f"requests        {s['requests']} ({s['finished']} finished, "
        f"{s['rejected']} rejected, {s['unfinished']} unfinished)",
        f"duration        {s['duration_ms'] / 1000.0:.3f} s simulated",
        f"request rate    {s['request_rate']:.3f} req/s",
        f"token rate      {s['input_tokens_per_s']:.1f} input tok/s, "
        f"{s['output_tokens_per_s']:.1f} output tok/s",
        f"latency (ms) {'mean':>10} {'p50':>10} {'p90':>10} {'p99':>10}",
    ]
    for key, name in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2e_ms", "E2E")):
        st = s[key]
        cells = " ".join(f"{_fmt(st[k]):>10}" for k in ("mean", "p50", "p90", "p99"))
        lines.append(f"  {name:<11}{cells}")
    lines += [
        f"preemptions     {s['preemptions']} ({s['preempted_requests']} requests, "
        f"{s['recomputed_tokens']} tokens recomputed)",
        f"prefix cache    {_pct(s['prefix_cache_hit_rate'])} hit rate "
        f"({s['prefix_cache_hits']} / {s['prefix_cache_queries']} tokens)",
    ]
    if s["cpu_tier_hit_tokens"]:
        lines.append(f"cpu tier        {s['cpu_tier_hit_tokens']} hit tokens")
    lines += _speculative_lines(s.get("speculative"))
    lines += _session_lines(s.get("sessions"))
    lines += _routing_lines(s["workers"])
    lines += _load_lines(s["workers"])
    if "pools" in s:  # disaggregated prefill/decode
        for name, pool in s["pools"].items():
            lines.append(f"{name + ' pool':<16}{pool['workers']} worker(s), {pool['passes']} passes, "
                         f"{_pct(pool['kv_usage_mean'])} KV usage mean")
        t = s["kv_transfer"]
        lines.append(f"KV transfer     {t['handoffs']} handoffs, {t['transferred_tokens']} tokens, "
                     f"{_fmt(t['kv_transfer_ms']['mean'])} ms mean, "
                     f"{_fmt(t['kv_transfer_ms']['p90'])} ms p90")
    lines += [
        f"KV usage        {_pct(s['kv_usage_mean'])} mean, {_pct(s['kv_usage_max'])} max",
        f"passes          {s['passes']}",
        f"wall time       {s['wall_time_s']:.3f} s ({s['passes_per_s']:.0f} passes/s)",
        f"output          {out_dir}",
    ]
    return "\n".join(lines)


@main.command()
@click.argument("config", type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output-dir", default="servesim-out", show_default=True,
              type=click.Path(file_okay=False), help="Directory for the report files.")
@click.option("--pass-log", is_flag=True, help="Also write passes.jsonl.")
@click.option("--telemetry-interval-ms", type=click.FloatRange(min=0, min_open=True),
              metavar="MS", help="Write telemetry.jsonl with one sample every MS of simulated time.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help=OVERRIDE_HELP)
@click.option("--limit", type=click.IntRange(min=1), metavar="N", help="Replay only the first N trace rows.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table",
              show_default=True, help="Print a table or the summary JSON.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar and no table.")
@click.option("--report", "html_report", is_flag=True,
              help="Also write report.html (plots; needs servesim[report]).")
@click.option("--baseline", is_flag=True,
              help="With engine.speculative: also run without it and report the TPOT speedup.")
@check_option
def run(config, output_dir, pass_log, telemetry_interval_ms, overrides, limit, fmt, quiet, html_report,
        baseline):
    """Replay CONFIG and write its report (summary.json, requests.jsonl, ...)."""
    # Python's cyclic garbage collector is off for the run, but while Numba
    # compiles (servesim/jit.py), and the run's objects are frozen after it,
    # as after every command (ServesimGroup.invoke).
    was_collecting = gc.isenabled()
    gc.disable()
    try:
        from servesim import jit  # (no kernels here: not a key of the kernel cache, cache.py)

        jit.single_thread_refcounts()  # this process runs its kernels on one thread
        with jit.collecting_while_compiling():
            _run(config, output_dir, pass_log, telemetry_interval_ms, overrides, limit, fmt,
                 quiet, html_report, baseline)
    finally:
        gc.freeze()
        if was_collecting:
            gc.enable()


def _run(config, output_dir, pass_log, telemetry_interval_ms, overrides, limit, fmt, quiet,
         html_report, baseline):
    import json

    from servesim.cli.compile_progress import for_command
    from servesim.cli.ctrl_c import remembered
    from servesim.replay.api import run as api_run

    if html_report:
        from servesim.results.report import require_matplotlib

        require_matplotlib()  # before the run, not after it
    from servesim.results.outdir import claim
    from servesim.results.output import RUN_OUTPUTS

    # a folder that cannot be written, or holds the user's own report.html, fails here, before the run
    with claim(output_dir, remove_if_empty=True, replaces=RUN_OUTPUTS):
        progress = None
        if fmt == "table" and not quiet and sys.stdout.isatty():
            progress = _Progress()
        try:
            with warnings.catch_warnings(), remembered() as ctrl_c, \
                    for_command(config, overrides, quiet) as compiling:
                warnings.simplefilter("ignore", UserWarning)  # printed below, once

                def on_progress(sim_time_ms, requests_done, requests_total):
                    # a Ctrl-C swallowed while Numba compiled stops the run here,
                    # at its next return to Python, not after its last request
                    ctrl_c.check()
                    if progress is not None:
                        if progress.bar is None and compiling is not None:
                            compiling.pause()  # the bar goes below the compile's line
                        progress(sim_time_ms, requests_done, requests_total)

                report = api_run(
                    config,
                    overrides=overrides,
                    limit=limit,
                    pass_log=True if pass_log else None,
                    telemetry_interval_ms=telemetry_interval_ms,
                    progress=on_progress,
                    baseline=baseline,
                )
                ctrl_c.check()  # pressed after the last progress: nothing is written
        finally:
            if progress is not None:
                progress.close()
        for warning in report.result.warnings:
            click.echo(f"warning: {warning}", err=True)
        deployment = report.summary.get("deployment")
        if deployment is not None and not quiet:
            click.echo(f"{deployment['capacity_text']}; pass times: {deployment['timing_source']}; "
                       f"{deployment['host_terms_text']}", err=True)
        out = report.write(output_dir)
        if html_report:
            from servesim.results.report import write_report

            write_report(out)
    if fmt == "json":
        click.echo(json.dumps(report.summary, indent=2))
    elif not quiet:
        click.echo(format_table(report.summary, out))


@main.command()
@click.argument("config", type=click.Path(exists=True, dir_okay=False))
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help=OVERRIDE_HELP)
def validate(config, overrides):
    """Check CONFIG and its workload (trace) without simulating."""
    from servesim.replay.api import prepare
    from servesim.replay.diagnosis import foreseen_losses

    cfg, workload, warnings = prepare(config, tuple(overrides))
    for warning in warnings + foreseen_losses(cfg, workload):
        click.echo(f"warning: {warning}", err=True)
    click.echo(f"{config}: ok ({len(workload)} requests)")


class _ExampleCommand(click.Command):
    """`servesim example`, whose help lists the examples."""

    def format_epilog(self, ctx, formatter):
        from servesim.config.examples import example_summaries

        with formatter.section("Examples (NAME)"):
            formatter.write_dl(example_summaries())


@main.command(cls=_ExampleCommand)
@click.argument("name", default="mooncake")
def example(name):
    """Print the ready config NAME (default: mooncake); `servesim example NAME > c.yaml`."""
    from servesim.config.examples import EXAMPLES, example_text

    names = list(EXAMPLES)
    if name not in names:
        raise InputError(f"unknown example {name!r}; available: {', '.join(names)}")
    text = example_text(name)
    click.echo(text, nl=not text.endswith("\n"))


@main.command()
@click.argument("config", type=click.Path(exists=True, dir_okay=False))
@click.option("--grid", required=True, type=click.Path(exists=True, dir_okay=False),
              help="YAML grid: {dotted.key: [values, ...]} (cartesian product) or a list of points.")
@click.option("-o", "--output-dir", default="sweep-out", show_default=True, type=click.Path(file_okay=False),
              help="Directory for sweep.csv, sweep.json and points/NNN-*/.")
@click.option("-j", "--jobs", type=click.IntRange(min=1), metavar="N",
              help="Points run at once (default 1; with --ray-address, all the cluster takes).")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="Run points in local processes or as Ray tasks (needs servesim[ray]).")
@click.option("--ray-address", metavar="ADDR", help="Ray cluster to use, e.g. ray://head:10001 or auto.")
@check_option
def sweep(config, grid, output_dir, jobs, executor, ray_address):
    """Run CONFIG for every point of a grid file.

    Each point runs in its own process (or Ray task) and writes its report
    into OUTPUT_DIR/points/NNN-*/; sweep.csv and sweep.json gather them.
    Points already done (their folder holds all the outputs of the same
    config and trace) are not run again. Exits 1 if any point failed, 130 on
    Ctrl-C (sweep.csv then lists the points that finished).
    """
    from servesim.sweep.sweep import SWEEP_CSV, SWEEP_OUTPUTS, sweep as run_sweep

    bar = None
    progress = None
    if sys.stdout.isatty():

        def progress(done, total):
            nonlocal bar
            if bar is None:
                bar = click.progressbar(length=total, label="points", show_pos=True)
                bar.__enter__()
            bar.update(done - bar.pos)

    from servesim.results.outdir import claim

    try:
        # a folder that cannot be written, another sweep in it, or the user's
        # own sweep.csv or points/, fails before any point
        with claim(output_dir, remove_if_empty=True, replaces=SWEEP_OUTPUTS):
            result = run_sweep(config, grid, output_dir, jobs=jobs, executor=executor,
                               ray_address=ray_address, progress=progress)
    except KeyboardInterrupt:
        if bar is not None:
            bar.__exit__(None, None, None)
            bar = None
        click.echo(f"interrupted: {SWEEP_CSV} holds the points that finished; "
                   f"run the same sweep again to resume", err=True)
        click.get_current_context().exit(130)  # said once: not again by the group
    finally:
        if bar is not None:
            bar.__exit__(None, None, None)
    points, failed, resumed = result.points, result.failed, result.resumed
    note = f", {len(resumed)} already done" if resumed else ""
    click.echo(f"{len(points)} points: {len(points) - len(failed)} ok, {len(failed)} failed{note}; "
               f"results in {result.out_dir / SWEEP_CSV}")
    if failed:
        for p in failed:
            click.echo(f"failed: point {p.index} ({p.dir}): {p.error}", err=True)
        click.get_current_context().exit(1)


@main.command()
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
def report(directory):
    """Write DIRECTORY/report.html for a run or a sweep.

    DIRECTORY is a run's output folder (summary.json, requests.jsonl,
    telemetry.jsonl) or a sweep's (sweep.csv). Needs servesim[report].
    """
    from servesim.capacity.report import write_report

    click.echo(str(write_report(directory)))


def _register_fitting_commands():
    from servesim.cli.fitting import evaluate_command, fit_command

    main.add_command(fit_command, "fit")
    main.add_command(evaluate_command, "evaluate")
    from servesim.cli.deployment import calibrate_command, gpus_command, models_command

    main.add_command(models_command, "models")
    main.add_command(gpus_command, "gpus")
    main.add_command(calibrate_command, "calibrate")


def _register_capacity_commands():
    from servesim.cli.capacity import capacity_command, search_command

    main.add_command(capacity_command, "capacity")
    main.add_command(search_command, "search")
    from servesim.cli.plan import plan_command

    main.add_command(plan_command, "plan")
    from servesim.cli.warmup import warmup_command

    main.add_command(warmup_command, "warmup")


_register_fitting_commands()
_register_capacity_commands()
