"""The `servesim plan` command (registered by servesim/cli/main.py)."""

import click

from servesim.capacity.plan import ENGINE_NAMES, missed_text
from servesim.cli.capacity import ALLOW_REJECTED_HELP, SLO_HELP, _html
from servesim.cli.debug import check_option


def _ints(text, name):
    from servesim.errors import InputError

    if text is None:
        return None
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise InputError(f"{name}: expected comma-separated integers, got {text!r}") from None


def _figures(row, names) -> str:
    metrics = row.get("metrics") or {}
    return ", ".join(f"{n} {metrics[n]:.1f}" for n in names if metrics.get(n) is not None)


def print_plan(doc, slos) -> None:
    from servesim.config.slo import checked_names

    slo = doc["slo"]
    names = checked_names(slo)
    click.echo(f"SLOs: {slos.describe()}")
    by = ", ".join(f"{k} {v}" for k, v in doc["pruned_by"].items() if v)
    click.echo(f"space: {doc['generated']} points generated on {', '.join(doc['gpus'])} up to {doc['gpus_max']} GPUs "
               f"({len(doc['excluded'])} worker shapes {ENGINE_NAMES[doc['backend']]} would refuse excluded); {doc['pruned']} pruned"
               + (f" ({by})" if by else "") + f"; {doc.get('run', 0)} run, {doc.get('skipped', 0)} skipped "
               "(cost more than a point that meets the SLOs)")
    win = doc.get("winner")
    if win is None:
        click.echo(doc["message"])
        return
    cost = f", ${win['dollars_per_hour']:g}/h" if win["dollars_per_hour"] is not None else ""
    click.echo(f"best: {win['deployment']} ({win['mode']}, {win['gpus']} GPUs{cost})")
    binding = win["binding_slo"]
    figure = (win.get("metrics") or {}).get(binding)
    why = f"  why: it meets every SLO at {doc['load']['key']}={doc['rate']}; binding SLO {binding}"
    if figure is not None and binding in slo:
        why += f" {figure:.1f} (target {slo[binding]:g})"
    click.echo(why + f", margin {win['margin']}")
    nxt = doc.get("next_cheaper")
    if nxt is not None:
        ncost = f", ${nxt['dollars_per_hour']:g}/h" if nxt["dollars_per_hour"] is not None else ""
        click.echo(f"  the next cheaper point, {nxt['deployment']} ({nxt['gpus']} GPUs{ncost}), misses "
                   f"{missed_text(nxt, slo)}")
    else:
        click.echo("  no cheaper point was left to run (all pruned, or none exists within the space)")
    if doc.get("cost"):
        c = doc["cost"]
        click.echo(f"  cost: ${c['dollars_per_hour']:g}/h; ${c['dollars_per_million_tokens']} per million tokens "
                   f"(${c['dollars_per_million_output_tokens']} per million output tokens) at this load")
    if doc["runner_ups"]:
        click.echo("runner-ups:")
        for r in doc["runner_ups"]:
            rc = f", ${r['dollars_per_hour']:g}/h" if r["dollars_per_hour"] is not None else ""
            click.echo(f"  {r['deployment']}: {r['gpus']} GPUs{rc}, margin {r['margin']} ({_figures(r, names)})")
    cheaper = doc.get("cheaper_missed") or []
    if cheaper:
        click.echo(f"cheaper points run ({len(cheaper)}, each misses):")
        for r in sorted(cheaper, key=lambda r: (-r["gpus"], r["point"]))[:8]:
            click.echo(f"  {r['deployment']}: {r['gpus']} GPUs, misses {missed_text(r, slo)}")
        if len(cheaper) > 8:
            click.echo(f"  ... {len(cheaper) - 8} more in plan.json")
    sens = doc.get("sensitivity")
    if sens is not None:
        click.echo(f"sensitivity ±{sens['percent']:g}%: {sens['verdict']}")
    click.echo("launch (launch.sh):")
    for w in doc["launch"]["workers"][:4]:
        click.echo(f"  {w['command']}")
    if len(doc["launch"]["workers"]) > 4:
        click.echo(f"  ... {len(doc['launch']['workers']) - 4} more workers in launch.sh")
    click.echo(f"  router: {doc['launch']['router']['note']}")


@click.command()
@click.argument("config", type=click.Path(exists=True, dir_okay=False))
@click.option("--slo", "slo_options", multiple=True, metavar="METRIC=VALUE", help=SLO_HELP)
@click.option("--allow-rejected", type=float, metavar="FRACTION", help=ALLOW_REJECTED_HELP)
@click.option("--rate", type=float, required=True, help="The load to serve (speedup, req/s or concurrency).")
@click.option("--gpus-max", type=int, metavar="N", help="GPU budget (default 16).")
@click.option("--gpu", "gpu_list", metavar="GPU[,GPU...]",
              help="GPU types to search (default: the config's engine.gpu); several: each pool its own type.")
@click.option("--cost", "costs", multiple=True, metavar="GPU=$/h",
              help="Price of a GPU per hour; rank by $/h instead of GPUs. Repeatable.")
@click.option("--max-num-seqs", "seqs", metavar="N[,N...]", help="The max_num_seqs ladder (default 64,256); SGLang's max_running_requests.")
@click.option("--max-num-batched-tokens", "batched", metavar="N[,N...]",
              help="The max_num_batched_tokens ladder (default 2048,8192); SGLang's chunked_prefill_size.")
@click.option("--sensitivity", type=float, metavar="P",
              help="Replay the winner and the next cheaper point with pass times ±P% (and speculative "
                   "acceptance ∓P%) and say if the answer changes.")
@click.option("--no-prune", is_flag=True, help="Replay the points the bounds rule out too.")
@click.option("-o", "--output-dir", default="plan-out", show_default=True, type=click.Path(file_okay=False),
              help="Directory for best.yaml, launch.sh, plan.json, search.csv and points/.")
@click.option("--limit", type=click.IntRange(min=1), metavar="N", help="Replay only the first N trace rows.")
@click.option("-j", "--jobs", type=click.IntRange(min=1), metavar="N", help="Points run at once (default 1).")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True)
@click.option("--ray-address", metavar="ADDR", help="Ray cluster to use, e.g. auto.")
@check_option
def plan_command(config, slo_options, allow_rejected, rate, gpus_max, gpu_list, costs, seqs, batched, sensitivity,
                 no_prune, output_dir, limit, jobs, executor, ray_address):
    """The cheapest deployment of CONFIG's model that meets the SLOs at --rate.

    CONFIG names a deployment (engine.model, engine.gpu, timing aic). The
    space is generated from it: every tensor_parallel_size vLLM would start
    (heads divisible, weights and one max_model_len request fit), worker
    counts up to --gpus-max, aggregated and disaggregated splits (each pool
    its TP and, with several --gpu, its GPU type), and the max_num_seqs /
    max_num_batched_tokens ladder. With engine.backend: sglang, the shapes
    SGLang would start, aggregated, over max_running_requests /
    chunked_prefill_size, and launch.sh holds sglang.launch_server commands.
    Points no replay can save are pruned (a
    request alone already misses a TTFT/TPOT target; the prompts or outputs
    alone need more than the GPUs' time); the rest replay level by level of
    GPUs (or $/h with --cost), and what costs more than a point that meets
    is skipped. Writes best.yaml (`servesim run best.yaml` replays the
    winner), launch.sh (vllm serve commands), plan.json and search.csv.
    Resumes in OUTPUT_DIR. Exits 1 if no point meets the SLOs or one failed.
    """
    from servesim.capacity.cost import parse_costs
    from servesim.capacity.plan import PLAN_OUTPUTS, plan
    from servesim.capacity.search import SEARCH_CSV, SEARCH_OUTPUTS
    from servesim.config.slo import load_slos
    from servesim.errors import InputError
    from servesim.results.outdir import claim

    if executor == "local" and ray_address is not None:
        raise InputError("--ray-address applies only to --executor ray")
    slos = load_slos(config, slo_options, allow_rejected=allow_rejected)
    if not slos.names:
        raise InputError("servesim plan: give at least one SLO (--slo METRIC=VALUE or the config's slo: block)")
    prices = parse_costs(costs) if costs else None
    gpus = [g.strip() for g in gpu_list.split(",") if g.strip()] if gpu_list else None
    if rate is not None and float(rate).is_integer():
        rate = int(rate)
    try:
        with claim(output_dir, remove_if_empty=True, replaces=(*PLAN_OUTPUTS, *SEARCH_OUTPUTS, *_html(False))):
            doc = plan(config, slos, rate, output_dir, gpus=gpus, gpus_max=gpus_max, prices=prices,
                       max_num_seqs=_ints(seqs, "--max-num-seqs"),
                       max_num_batched_tokens=_ints(batched, "--max-num-batched-tokens"), limit=limit,
                       jobs=jobs, executor=executor, ray_address=ray_address, prune=not no_prune,
                       sensitivity=sensitivity)
    except KeyboardInterrupt:
        click.echo(f"interrupted: {SEARCH_CSV} holds the points that finished; run the same plan again to resume",
                   err=True)
        click.get_current_context().exit(130)
    print_plan(doc, slos)
    click.echo(f"files: {output_dir}/best.yaml, launch.sh, plan.json, {SEARCH_CSV}" if doc.get("winner")
               else f"results in {output_dir}/plan.json")
    for f in doc.get("failed") or ():
        click.echo(f"failed: point {f['point']}: {f['error']}", err=True)
    if doc.get("winner") is None or doc.get("failed"):
        click.get_current_context().exit(1)
