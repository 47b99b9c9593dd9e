"""`servesim warmup [--features NAMES]`: compile the kernels ahead of time,
for CI images and clusters, by replaying each named example
(`servesim example --help`) on its first few requests, with the compile's
progress (cli/compile_progress.py). Only the kernel cache and its compile
log are written."""

import click

WARMUP_REQUESTS = 50  # rows each example replays: enough to reach every kernel it uses
DEFAULT_FEATURES = "mooncake"


@click.command()
@click.option("--features", default=DEFAULT_FEATURES, show_default=True, metavar="NAMES",
              help="Comma-separated examples whose kernels to compile (servesim example --help), "
                   "or all.")
def warmup_command(features):
    """Compile the kernels the named examples use, ahead of the first run."""
    import tempfile
    import warnings
    from pathlib import Path

    from servesim import jit
    from servesim.cli.compile_progress import CompileProgress, features_key
    from servesim.config.examples import AIC_EXAMPLES, EXAMPLES, example_text
    from servesim.errors import InputError
    from servesim.replay.api import resolve_config, run

    every = features.strip() == "all"
    names = list(EXAMPLES) if every else [n.strip() for n in features.split(",") if n.strip()]
    for name in names:
        if name not in EXAMPLES:
            raise InputError(f"--features: unknown example {name!r}; available: "
                             f"{', '.join(EXAMPLES)}, or all")
    if not names:
        raise InputError("--features: give at least one example name, or all")
    jit.single_thread_refcounts()  # as `servesim run` does (not part of the cached code)
    with tempfile.TemporaryDirectory(prefix="servesim-warmup-") as tmp:
        for name in names:
            path = str(Path(tmp) / f"{name}.yaml")
            Path(path).write_text(example_text(name), encoding="utf-8")
            if every and name in AIC_EXAMPLES:
                from servesim.deployment import aic

                if aic.package_version() is None:
                    click.echo(f"{name}: skipped (its pass times need aiconfigurator-core: {aic.INSTALL})")
                    continue
            progress = CompileProgress(lambda: features_key(resolve_config(path)),
                                       label=f"{name}: compiling kernels")
            with warnings.catch_warnings(), progress:
                warnings.simplefilter("ignore", UserWarning)  # about the short replay, not the kernels
                run(path, limit=WARMUP_REQUESTS)
            click.echo(f"{name}: {progress.done} kernel(s) compiled" if progress.done
                       else f"{name}: already compiled")
