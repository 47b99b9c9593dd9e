"""The `servesim fit` and `servesim evaluate` commands (README.md, "A quick tour"; docs/fitting.md).

Both read forward-pass records, apply `--launch-stall` before anything else
when given (and change nothing without it), and raise InputError on bad
input; the `servesim` group maps it to exit code 2. `--capture-size` (the
`max_cudagraph_capture_size` that tells decode passes from piecewise and eager
ones, for `--window` and for evaluate's kinds) defaults to the stall file's
capture size when one is given, else to 512 (vLLM's default); given with a
stall file, it must equal the stall file's. A record below 0 ms after
`--launch-stall` is an error naming it; without the option, `fit` fits
negative raw records as written and warns once on stderr.
"""

import json

import click

from servesim.errors import InputError

DEFAULT_CAPTURE_SIZE = 512

_RECORDS = click.argument("records_files", metavar="RECORDS.jsonl...", nargs=-1, required=True,
                          type=click.Path(dir_okay=False))
_LAUNCH_STALL = click.option(
    "--launch-stall", "launch_stall_path", metavar="STALL.json", type=click.Path(dir_okay=False),
    help="Move each pass's launch stall back to its own record first (measured stall values).")
_CAPTURE_SIZE = click.option(
    "--capture-size", type=click.IntRange(min=1), metavar="N",
    help="max_cudagraph_capture_size: passes over N tokens are eager. "
         "Default: the stall file's, else 512.")


def _load(records_files, launch_stall_path, capture_size):
    """(records, wall ms after --launch-stall, stall contents or None, capture size).

    With a stall file, `--capture-size` must equal its capture size (one vLLM
    option), and no record may be below 0 ms after the correction
    (:func:`~servesim.fitting.launch_stall.require_nonnegative`)."""
    from servesim.fitting.launch_stall import (CAPTURE_KEY, charge_own_launch, load_launch_stall,
                                               require_nonnegative)
    from servesim.fitting.records import read_records

    stall = load_launch_stall(launch_stall_path) if launch_stall_path is not None else None
    if stall is not None and capture_size is not None and capture_size != stall[CAPTURE_KEY]:
        raise InputError(
            f"--capture-size {capture_size} differs from {launch_stall_path}: {CAPTURE_KEY} "
            f"{stall[CAPTURE_KEY]}; both are the deployment's vLLM max_cudagraph_capture_size "
            "(leave --capture-size out to use the stall file's)")
    records = read_records(records_files)
    wall_ms = records.wall_ms
    if stall is not None:
        wall_ms = charge_own_launch(records, stall)
        require_nonnegative(records, wall_ms, launch_stall_path)
    if capture_size is None:
        capture_size = stall[CAPTURE_KEY] if stall is not None else DEFAULT_CAPTURE_SIZE
    return records, wall_ms, stall, capture_size


@click.command("fit")
@_RECORDS
@_LAUNCH_STALL
@click.option("--window", type=click.IntRange(min=1), metavar="W",
              help="Fit on sums over windows of at least W consecutive records that end "
                   "before a decode pass (docs/fitting.md); needs no stall values.")
@_CAPTURE_SIZE
@click.option("-o", "--output", "output_path", required=True, metavar="MODEL.yaml",
              type=click.Path(dir_okay=False), help="Where to write the fitted model.")
def fit_command(records_files, launch_stall_path, window, capture_size, output_path):
    """Fit a `fitted` pass-time model to forward-pass records."""
    from servesim.fitting.fit import fit_records, fit_windows, write_model

    records, wall_ms, stall, capture_size = _load(records_files, launch_stall_path, capture_size)
    if stall is None:
        _warn_negative_records(records, window)
    if window is None:
        fit = fit_records(records, wall_ms)
    else:
        fit = fit_windows(records, wall_ms, window, capture_size)
    metadata = {"source": [str(p) for p in records_files], "launch_stall": stall,
                "window": window}
    if window is not None:
        # The capture size that cut the windows: a run with engine.launch must
        # use the same one (servesim/config/fitted_checks.py).
        metadata["capture_size"] = capture_size
    write_model(output_path, fit.coefficients, len(records), fit.r2, fit.mape, metadata)
    click.echo(_fit_report(records, wall_ms, stall, launch_stall_path, window, capture_size,
                           fit, output_path))


@click.command("evaluate")
@_RECORDS
@click.option("--model", "model_path", required=True, metavar="MODEL.yaml",
              type=click.Path(dir_okay=False), help="A model written by `servesim fit`.")
@_LAUNCH_STALL
@_CAPTURE_SIZE
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table",
              show_default=True, help="A table for people or one JSON object for scripts.")
def evaluate_command(records_files, model_path, launch_stall_path, capture_size, fmt):
    """Score a fitted model on forward-pass records, per pass kind."""
    from servesim.fitting.evaluate import evaluate_records, format_table
    from servesim.config.config import read_fitted_model

    coefficients = read_fitted_model(model_path)
    records, wall_ms, _, capture_size = _load(records_files, launch_stall_path, capture_size)
    report = evaluate_records(records, wall_ms, coefficients, capture_size)
    if fmt == "json":
        report = {"model": str(model_path), "launch_stall": launch_stall_path, **report}
        click.echo(json.dumps(report, indent=2))
    else:
        click.echo(format_table(report))


def _warn_negative_records(records, window) -> None:
    """One warning on stderr when raw records below 0 ms are fitted as written."""
    negative = int((records.wall_ms < 0).sum())
    if not negative:
        return
    how = "fitted as written" if window is None else "summed into their windows as written"
    click.echo(
        f"warning: {negative} record(s) have a negative wall_time, {how}: with async "
        "scheduling the record before an eager pass carries that pass's launch, so a raw "
        "record can go below 0; --launch-stall STALL.json moves each launch back to its own "
        "pass, and --window W fits on sums no launch crosses (docs/fitting.md)", err=True)


def _fit_report(records, wall_ms, stall, stall_path, window, capture_size, fit, output_path):
    from servesim.fitting.fit import model_features

    files = ", ".join(records.sources)
    lines = [f"records        {len(records)} from {files} ({len(records.worker_ids)} workers)"]
    if stall is not None:
        moved = int((wall_ms != records.wall_ms).sum())
        lines.append(f"launch stall   {stall_path}: {moved} records changed")
    if window is None:
        lines.append(f"fitted on      {fit.rows} records")
    else:
        lines.append(f"fitted on      {fit.rows} windows of >= {window} records "
                     f"(capture size {capture_size})")
    lines.append("coefficients (ms):")
    features = model_features(len(fit.coefficients))
    for name, value in zip(features, fit.coefficients):
        lines.append(f"  {name:<22} {value:.6g}")
    lines.append(f"r2             {'-' if fit.r2 is None else f'{fit.r2:.6f}'}")
    lines.append(f"mape           {'-' if fit.mape is None else f'{100 * fit.mape:.2f}%'}")
    lines.append(f"model          {output_path}")
    return "\n".join(lines)
