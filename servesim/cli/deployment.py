"""`servesim models` and `servesim gpus`: what a deployment can name."""

import click


@click.command()
def models_command():
    """List the database's models (engine.model); a folder with a config.json works too."""
    from servesim.deployment import aic
    from servesim.deployment.model_names import MODEL_ALIASES
    from servesim.deployment.specs import database_models

    names = database_models()
    if not names:
        click.echo("no database models: install the optional package aiconfigurator-core "
                   f"({aic.INSTALL}); engine.model may still name a folder holding config.json")
        return
    click.echo(f"{len(names)} models of aiconfigurator-core {aic.package_version()}:")
    for name in names:
        click.echo(f"  {name}")
    known = set(names)
    aliases = {a: t for a, t in MODEL_ALIASES.items() if t in known}
    click.echo(f"{len(aliases)} aliases (Hugging Face and measurement names):")
    for alias, target in sorted(aliases.items()):
        click.echo(f"  {alias} -> {target}")


@click.command()
def gpus_command():
    """List the GPUs (engine.gpu): memory, the KV link's GB/s, and the database's vLLM and SGLang data for pass times."""
    from servesim.deployment import aic
    from servesim.deployment.kv_capacity import GIB
    from servesim.deployment.gpus import GPUS

    systems = aic.database_systems()
    sglang = aic.database_systems("sglang")
    for name, spec in GPUS.items():
        data = ", ".join(systems.get(name, [])) or ("no vLLM data" if systems else "database not installed")
        line = (f"  {name:<22} {spec.hbm_bytes / GIB:6.1f} GiB   KV link {spec.kv_link_gbps:5.1f} GB/s   "
                f"vLLM pass-time data: {data}")
        if systems:
            line += f"; SGLang: {', '.join(sglang.get(name, [])) or 'none'}"
        click.echo(line)


@click.command()
@click.argument("records_files", metavar="RECORDS.jsonl...", nargs=-1, required=True,
                type=click.Path(exists=True, dir_okay=False))
@click.option("--config", "config_path", required=True, type=click.Path(exists=True, dir_okay=False),
              help="A config with the deployment and timing type aic.")
@click.option("-o", "--output", "output_path", required=True, metavar="CALIBRATION.yaml",
              help="Where to write the factors.")
def calibrate_command(records_files, config_path, output_path):
    """Fit per-kind correction factors of the aic pass times to forward-pass records."""
    import attrs
    from ruamel.yaml import YAML

    from servesim.deployment import aic
    from servesim.deployment.aic_tables import load_or_build
    from servesim.deployment.calibration import KINDS, calibration_document, fit_factors
    from servesim.errors import InputError
    from servesim.fitting.records import read_records
    from servesim.config.config import load_config

    cfg = load_config(config_path)
    if cfg.engine.timing.type != "aic":
        raise InputError(f"{config_path}: engine.timing must be type aic to calibrate it")
    records = read_records(list(records_files))
    fit = fit_factors(load_or_build(cfg.engine, cfg.cluster.data_parallel_size), records)
    doc = calibration_document(fit, attrs.asdict(cfg.engine.deployment),
                               f"aiconfigurator-core {aic.package_version()}")
    tmp = output_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        YAML().dump(doc, f)
    import os

    os.replace(tmp, output_path)
    for name in KINDS:
        r = fit[name]
        if r["records"]:
            click.echo(f"{name:<8} {r['records']:6d} records  factor {r['factor']:.4f}  "
                       f"MAPE {r['mape_before_pct']:.1f}% -> {r['mape_after_pct']:.1f}%")
        else:
            click.echo(f"{name:<8}      0 records  factor 1")
    click.echo(f"wrote {output_path}")
