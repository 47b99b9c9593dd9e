"""What a deployment costs in $/h (`--cost GPU=$/h`), and per million
tokens at the load it serves (README "Capacity planning", "servesim plan").

A resolved config's GPUs by type: an aggregated cluster's `engine.gpu`; a
disaggregated one's pools, each its own `gpu` (from `cluster.prefill` /
`cluster.decode`, else `engine.gpu`). GPU counts as `capacity/gpus.py`.
"""


from servesim.errors import InputError


def parse_costs(items) -> dict:
    """`--cost GPU=$/h` options as {gpu: dollars per hour}."""
    from servesim.deployment.gpus import GPUS

    prices = {}
    for text in items:
        gpu, sep, raw = str(text).partition("=")
        gpu = gpu.strip()
        if not sep or not gpu:
            raise InputError(f"--cost {text!r}: expected GPU=DOLLARS_PER_HOUR, e.g. h100_sxm=2.5")
        if gpu not in GPUS:
            raise InputError(f"--cost {gpu}: unknown GPU {gpu!r}; supported: {', '.join(GPUS)}")
        try:
            price = float(raw)
        except ValueError:
            raise InputError(f"--cost {gpu}: {raw!r} is not a number of $/h") from None
        if not 0 <= price < float("inf"):
            raise InputError(f"--cost {gpu}: the price must be a finite number >= 0 $/h, got {raw}")
        prices[gpu] = price
    return prices


def dollars_per_hour(counts: dict, prices: dict) -> float:
    missing = [g for g in counts if g not in prices]
    if missing:
        raise InputError(f"--cost: no price for {', '.join(str(g) for g in missing)} (give --cost GPU=$/h "
                         "for every GPU type searched)")
    return round(sum(n * prices[g] for g, n in counts.items()), 6)


def dollars_per_million_tokens(per_hour: float, tokens_per_s: float) -> float | None:
    """$ per million tokens at `tokens_per_s` (None when nothing flowed)."""
    if not tokens_per_s:
        return None
    return round(per_hour / (tokens_per_s * 3600) * 1e6, 4)
