"""Reading and checking `engine.speculative` (the schema of
:class:`~servesim.scheduler.speculative.SpeculativeConfig`), and the check of a
trace's `accepted` lists against `num_speculative_tokens`."""

import attrs

from servesim.scheduler.speculative import (DEFAULT_RATE, MAX_SPECULATIVE_TOKENS, METHODS,
                                         SpeculativeConfig, rates_for_length)
from servesim.errors import InputError
from servesim.config.validation import INT, NUMBER, REQUIRED, Section, check, enum, ge, gt, le, show

KEYS = tuple(f.name for f in attrs.fields(SpeculativeConfig)) + ("mean_acceptance_length",)
PROFILE_KEYS = ("weight", "acceptance_rates", "mean_acceptance_length")


def _rates(ctx, s, k, k_path, default):
    """A section's per-position rates: `acceptance_rates` (k numbers in
    [0, 1]) or `mean_acceptance_length` (in [1, k + 1], one rate p at every
    position), not both; `default` when neither is given."""
    if "acceptance_rates" in s.data and "mean_acceptance_length" in s.data:
        ctx.fail(s.sub("mean_acceptance_length"), f"give {s.sub('acceptance_rates')} or "
                 "mean_acceptance_length, not both")
    if "mean_acceptance_length" in s.data:
        length = s.get("mean_acceptance_length", NUMBER, REQUIRED, ge(1), le(k + 1))
        return rates_for_length(float(length), k)
    rates_path = s.sub("acceptance_rates")
    rates = s.data.get("acceptance_rates")
    if rates is None:
        return default
    if not isinstance(rates, list) or len(rates) != k:
        ctx.fail(rates_path, f"must be a list of {k} numbers in [0, 1], one per draft position "
                 f"({k_path} is {k}), got {show(rates)}")
    return tuple(check(ctx, rates_path, r, NUMBER, ge(0), le(1)) for r in rates)


def _profiles(ctx, s, k, k_path) -> tuple:
    """`acceptance_profiles`: a mapping of names to {weight, acceptance_rates
    or mean_acceptance_length}, as (name, weight, rates) triples."""
    path = s.sub("acceptance_profiles")
    data = s.data["acceptance_profiles"]
    if not isinstance(data, dict) or not data:
        ctx.fail(path, "must be a mapping of profile names to {weight, acceptance_rates or "
                 f"mean_acceptance_length}}, got {show(data)}")
    for other in ("acceptance_rates", "mean_acceptance_length"):
        if other in s.data:
            ctx.fail(s.sub(other), f"give {other} or {path}, not both (each profile has its own)")
    out = []
    for name, body in data.items():
        sub = f"{path}.{name}"
        if not isinstance(body, dict):
            ctx.fail(sub, f"must be a mapping of {', '.join(PROFILE_KEYS)}, got {show(body)}")
        p = Section(ctx, body, sub, PROFILE_KEYS)
        weight = p.get("weight", NUMBER, 1.0, gt(0))
        if "acceptance_rates" not in body and "mean_acceptance_length" not in body:
            ctx.fail(sub, "needs acceptance_rates or mean_acceptance_length")
        out.append((str(name), float(weight), _rates(ctx, p, k, k_path, None)))
    return tuple(out)


def parse_speculative(ctx, data, path, scheduler, launch):
    """The validated :class:`SpeculativeConfig` at `path` (None when absent).
    ngram is synchronous in vLLM: with `async_scheduling` or `launch` it is
    rejected, naming both keys."""
    if data is None:
        return None
    s = Section(ctx, data, path, KEYS)
    method = s.get("method", enum(*METHODS), REQUIRED)
    k = s.get("num_speculative_tokens", INT, REQUIRED, ge(1), le(MAX_SPECULATIVE_TOKENS))
    k_path = s.sub("num_speculative_tokens")
    profiles = _profiles(ctx, s, k, k_path) if "acceptance_profiles" in s.data else ()
    rates = _rates(ctx, s, k, k_path, (DEFAULT_RATE,) * k)
    seed = s.get("seed", INT, 42, ge(0))
    if method == "ngram":
        engine = path.rpartition(".")[0] or "engine"
        if launch is not None:
            ctx.fail(s.sub("method"), f"ngram does not combine with {engine}.launch (launch "
                     "timing models async engines, and vLLM runs ngram synchronously)")
        if scheduler.async_scheduling:
            ctx.fail(s.sub("method"), f"ngram needs {engine}.async_scheduling: false (vLLM turns "
                     "async scheduling off for ngram drafts); use method mtp or eagle, or set "
                     f"{engine}.async_scheduling: false")
    return SpeculativeConfig(method=method, num_speculative_tokens=k,
                             acceptance_rates=rates, seed=seed, acceptance_profiles=profiles)


def check_drafts_priced(ctx, timing, speculative, path):
    """With `engine.speculative`, `timing` (at `path`) must put a price on
    draft tokens: `linear` and `polynomial` do (docs/engine.md §12), a fitted
    model does with its sixth coefficient `sum_draft_tokens`, `aic` prices the
    verification and the drafter from the database (docs/deployment.md);
    `fixed` (a price per pass kind) and a five-feature fitted model would price
    them at 0 ms, so those are refused naming `path`."""
    if speculative is None:
        return
    spec = path.rpartition(".")[0] + ".speculative"
    fallback = "use aic, linear or polynomial timing, or a fitted model with sum_draft_tokens"
    if timing.type == "fixed":
        ctx.fail(path, f"type fixed prices a pass by its kind, not by its tokens, so {spec}'s "
                 f"draft tokens would cost nothing; {fallback}")
    if timing.type == "fitted" and len(timing.coefficients_ms) < 6:
        ctx.fail(f"{path}.model", f"{timing.model} has no sum_draft_tokens coefficient (fitted "
                 f"on records without speculative decoding), so {spec}'s draft tokens would cost "
                 "nothing; refit on records with scheduled_requests.sum_draft_tokens, or use "
                 "aic, linear or polynomial timing")


def check_drafter(ctx, speculative, deployment, path):
    """`method: mtp` drafts with the model's own MTP layers: with a deployment
    (`engine.model`) whose config.json has none (no `num_nextn_predict_layers`,
    no `mtp_num_hidden_layers`) it is refused naming `path`.method, and with n
    layers a k above n must be a multiple of n (vLLM's SpeculativeConfig reuses
    the layers: "num_speculative_tokens must be divisible by n_predict").
    EAGLE's head is a separate checkpoint and ngram needs none: a target's
    config.json says nothing about them."""
    if speculative is None or deployment is None or speculative.method != "mtp":
        return
    from servesim.deployment.specs import load_model_spec

    n = load_model_spec(deployment.model).mtp_layers
    if not n:
        ctx.fail(f"{path}.method", f"mtp drafts with the model's MTP layers, and "
                 f"{deployment.model}'s config.json has none (no num_nextn_predict_layers or "
                 "mtp_num_hidden_layers); use method eagle or ngram")
    k = speculative.num_speculative_tokens
    if k > n and k % n:
        ctx.fail(f"{path}.num_speculative_tokens", f"must be a multiple of the model's {n} MTP "
                 f"layers (num_nextn_predict_layers) when above {n}: vLLM reuses them, got {k}")


def to_data(spec: SpeculativeConfig) -> dict:
    """The YAML layout of `engine.speculative`."""
    data = {"method": spec.method, "num_speculative_tokens": spec.num_speculative_tokens,
            "acceptance_rates": list(spec.acceptance_rates), "seed": spec.seed}
    if spec.acceptance_profiles:  # they replace acceptance_rates
        del data["acceptance_rates"]
        data["acceptance_profiles"] = {name: {"weight": weight, "acceptance_rates": list(rates)}
                                       for name, weight, rates in spec.acceptance_profiles}
    return data


def check_accepted(workload, k: int):
    """Every trace `accepted` entry is in 0..k; the error names file:line."""
    values = workload.accepted_values
    if values is None or not len(values):
        return
    bad = (values < 0) | (values > k)
    if bad.any():
        import numpy as np

        pos = int(np.flatnonzero(bad)[0])
        row = int(np.searchsorted(workload.accepted_offsets, pos, side="right")) - 1
        where = (f"{workload.source}:{row + workload.first_line}" if workload.source
                 else f"request {workload.request_ids[row]}")
        raise InputError(f"{where}: accepted: entries must be in 0..{k} "
                         f"(engine.speculative.num_speculative_tokens), got {int(values[pos])}")
