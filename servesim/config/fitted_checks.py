"""Cross-checks of an engine's pricing model against the rest of its config.

- :func:`read_fitted_provenance`: what a fitted model file's `metadata` says
  about the records it was fitted on (`servesim fit` writes it, docs/fitting.md):
  the capture size that told pass kinds apart and whether launches were moved
  back to their own passes (`--launch-stall`, `--window`).
- :func:`check_engine_pricing`: at config load, for `engine` and for each pool
  of a disaggregated cluster, (1) `engine.launch.max_cudagraph_capture_size`
  and a fitted model's capture size are one vLLM option and must agree; (2) no
  pass the run can schedule is priced below 0 ms (servesim/engine/price_floor.py
  says which passes that is).
- :func:`launch_double_count_warning`: `engine.launch` with a fitted model
  trained on uncorrected records charges each long launch twice (once inside
  the record of the pass before it, which the model learnt, once by launch).
"""

import math
import os

from servesim.engine.config import EngineConfig
from servesim.config.validation import Ctx, join, show
from servesim.config.yaml_input import read_yaml

FIT_ON_LAUNCH_STALL, FIT_ON_WINDOW, FIT_ON_RECORDS = "launch_stall", "window", "records"


def read_fitted_provenance(model_path: str) -> dict:
    """`{model_capture_size, model_fit_on}` (TimingConfig fields) of a model file.

    The capture size is `metadata.launch_stall.max_cudagraph_capture_size`
    when the fit used a stall file, else `metadata.capture_size` (written for
    `--window` fits), else None. `model_fit_on` is "launch_stall", "window",
    or "records" (neither: the records as written, or no metadata at all).
    A metadata value of the wrong type is an InputError naming the key."""
    data, where = read_yaml(model_path, "fitted model file")
    ctx = Ctx(model_path, os.path.dirname(model_path), where)
    metadata = data.get("metadata") if isinstance(data, dict) else None
    if metadata is None:
        return {"model_capture_size": None, "model_fit_on": FIT_ON_RECORDS}
    if not isinstance(metadata, dict):
        ctx.fail("metadata", f"must be a mapping (source, launch_stall, window, capture_size), "
                 f"got {show(metadata)}")
    capture = _capture_size(ctx, "metadata.capture_size", metadata.get("capture_size"))
    stall = metadata.get("launch_stall")
    window = metadata.get("window")
    if stall is not None:
        if not isinstance(stall, dict):
            ctx.fail("metadata.launch_stall", f"must be the stall file's contents (a mapping) "
                     f"or null, got {show(stall)}")
        key = "metadata.launch_stall.max_cudagraph_capture_size"
        stall_capture = _capture_size(ctx, key, stall.get("max_cudagraph_capture_size"))
        if capture is not None and stall_capture is not None and capture != stall_capture:
            ctx.fail("metadata.capture_size", f"{capture} differs from {key} ({stall_capture})")
        return {"model_capture_size": stall_capture if stall_capture is not None else capture,
                "model_fit_on": FIT_ON_LAUNCH_STALL}
    fit_on = FIT_ON_RECORDS if window is None else FIT_ON_WINDOW
    return {"model_capture_size": capture, "model_fit_on": fit_on}


def check_engine_pricing(ctx: Ctx, sub, engine: EngineConfig) -> None:
    """Raise (through `ctx`, naming the key) when the engine's launch capture
    size contradicts its fitted model's, or when any pass of the run's shape
    is priced below 0 ms. `sub(key)` names an engine key (`engine.timing`,
    `cluster.decode.timing`, ...)."""
    timing = engine.timing
    if timing.type == "fitted" and engine.launch is not None and timing.model_capture_size is not None:
        ours = engine.launch.max_cudagraph_capture_size
        if ours != timing.model_capture_size:
            ctx.fail(join(sub("launch"), "max_cudagraph_capture_size"),
                     f"{ours} differs from the fitted model's capture size "
                     f"{timing.model_capture_size} ({timing.model}, metadata): both are vLLM's "
                     "max_cudagraph_capture_size of one deployment; set "
                     f"{join(sub('launch'), 'max_cudagraph_capture_size')}: "
                     f"{timing.model_capture_size}, or refit with the capture size the run uses")
    from servesim.engine.price_floor import NEVER_NEGATIVE, cheapest_pass

    if timing.type in NEVER_NEGATIVE or timing.type == "aic":  # aic: measured, positive times
        return
    k = engine.speculative.num_speculative_tokens if engine.speculative is not None else 0
    shape, corner, price = cheapest_pass(timing, engine.scheduler, engine.kv_cache, k)
    if not price < 0 and not math.isnan(price):
        return
    ctx.fail(sub("timing"),
             f"{_model_name(engine)} prices a pass this run can schedule at {price:.6g} ms "
             f"(below 0): {corner.describe()}{_terms(engine, corner)}. The run's passes have "
             f"{shape.describe()}. A pass priced below 0 would run in 0 ms; refit on records "
             "that cover such passes, or narrow the engine limits named here")


def launch_double_count_warning(engine: EngineConfig) -> str | None:
    """The warning for `engine.launch` with a fitted model whose records kept
    each launch in the record of the pass before it, or None."""
    timing = engine.timing
    if engine.launch is None or timing.type != "fitted" or timing.model_fit_on != FIT_ON_RECORDS:
        return None
    return (f"engine.launch with the fitted model {timing.model}, which was fitted on "
            "uncorrected records (its metadata has no launch_stall and it is not a window "
            "fit): those records already hold each long launch in the pass before it, and "
            "launch charges it again, so it is counted twice; refit with --launch-stall or "
            "--window, or drop engine.launch")


def _capture_size(ctx: Ctx, key: str, value):
    if value is None:
        return None
    if type(value) is not int or value < 1:
        ctx.fail(key, f"must be a positive integer (tokens), got {show(value)}")
    return value


def _model_name(engine: EngineConfig) -> str:
    timing = engine.timing
    if timing.type == "fitted":
        return f"the fitted model {timing.model}"
    return f"timing type {timing.type!r}"


def _terms(engine: EngineConfig, corner) -> str:
    """' = intercept 5.2 + num_decode_requests 256 x -0.07 + ...' for a
    fitted model (the coefficients that make the price), else ''."""
    from servesim.engine.fitted_formula import FITTED_FEATURES, FITTED_SPEC_FEATURE

    timing = engine.timing
    if timing.type != "fitted":
        return ""
    values = (1, corner.num_prefill_requests, corner.prefill_tokens, corner.decode_requests,
              corner.decode_context, corner.draft_tokens)
    terms = [f"intercept {timing.coefficients_ms[0]:.6g}"]
    names = FITTED_FEATURES + (FITTED_SPEC_FEATURE,)
    for name, value, c in zip(names[1:], values[1:], timing.coefficients_ms[1:]):
        if value and c:
            terms.append(f"{name} {value} x {c:.6g}")
    return " (= " + " + ".join(terms) + ")"
