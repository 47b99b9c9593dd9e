"""`servesim models` and `servesim gpus`: what a deployment can name."""

import click


@click.command()
def models_command():
    """List the database's models (engine.model); a folder with a config.json works too."""
    from servesim.deployment import aic
    from servesim.deployment.specs import database_models

    names = database_models()
    if not names:
        click.echo("no database models: install the optional package aiconfigurator-core "
                   f"({aic.INSTALL}); engine.model may still name a folder holding config.json")
        return
    click.echo(f"{len(names)} models of aiconfigurator-core {aic.package_version()}:")
    for name in names:
        click.echo(f"  {name}")


@click.command()
def gpus_command():
    """List the GPUs (engine.gpu): memory, and the database's vLLM data for pass times."""
    from servesim.deployment import aic
    from servesim.deployment.capacity import GIB
    from servesim.deployment.gpus import GPUS

    systems = aic.database_systems()
    for name, spec in GPUS.items():
        data = ", ".join(systems.get(name, [])) or ("no vLLM data" if systems else "database not installed")
        click.echo(f"  {name:<22} {spec.hbm_bytes / GIB:6.1f} GiB   vLLM pass-time data: {data}")
