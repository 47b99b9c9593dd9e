"""The `deployment` section of summary.json: what was simulated, the derived
KV capacity and where pass times came from."""

from servesim.deployment.config import keys_of


def deployment_summary(engine, data_parallel_size: int = 1) -> dict | None:
    dep = engine.deployment
    if dep is None:
        return None
    from servesim.deployment.kv_capacity import derive_capacity, gpu_spec
    from servesim.deployment.specs import load_model_spec

    out = {key: getattr(dep, key) for key in keys_of(dep)}
    if engine.sglang is not None:
        out.update(_sglang_capacity(engine))
    else:
        s = engine.scheduler
        capacity = derive_capacity(load_model_spec(dep.model), gpu_spec(dep.gpu), dep,
                                   engine.kv_cache.block_size, s.max_num_batched_tokens,
                                   s.max_num_seqs, data_parallel_size)
        out["num_gpu_blocks"] = engine.kv_cache.num_gpu_blocks
        out["num_gpu_blocks_source"] = "derived" if dep.derived_num_gpu_blocks else "given"
        out["capacity"] = capacity.as_dict()
        out["capacity_text"] = capacity.describe()
    timing = engine.timing
    if timing.type == "aic":
        from servesim.deployment import aic

        out["timing_source"] = aic.timing_source(dep)
        if timing.calibration:
            out["timing_source"] += f", calibrated by {timing.calibration}"
    else:
        out["timing_source"] = timing.type
    if engine.sglang is not None:  # (docs/sglang.md: not modelled there)
        out["host_terms"] = None
        out["host_terms_text"] = "no API-server or host time modelled under backend: sglang"
    else:
        out["host_terms"] = host_terms(engine)
        out["host_terms_text"] = describe_host_terms(out["host_terms"])
    return out


def _sglang_capacity(engine) -> dict:
    """An SGLang deployment's token pool and the terms it came from
    (servesim/deployment/sglang_capacity.py)."""
    from servesim.deployment.kv_capacity import gpu_spec
    from servesim.deployment.sglang_capacity import derive_max_total_tokens
    from servesim.deployment.specs import load_model_spec

    dep, cfg = engine.deployment, engine.sglang
    out = {"max_total_tokens": cfg.max_total_tokens,
           "max_total_tokens_source": "derived" if dep.derived_num_gpu_blocks else "given"}
    spec = load_model_spec(dep.model)
    if spec.sliding_window:
        out["capacity_text"] = f"KV capacity: {cfg.max_total_tokens} tokens (given)"
        return out
    capacity = derive_max_total_tokens(spec, gpu_spec(dep.gpu), dep, cfg.page_size)
    out["capacity"] = capacity.as_dict()
    out["capacity_text"] = capacity.describe()
    if not dep.derived_num_gpu_blocks:
        out["capacity_text"] += f", capped at the given {cfg.max_total_tokens}"
    return out


def host_terms(engine) -> dict:
    """The time outside the pass times (servesim/deployment/host_time.py):
    the API server's delay of each request and the host time per pass, and
    whether async scheduling hides the latter."""
    frontend = engine.frontend
    return {
        "frontend_request_ms": 0.0 if frontend is None else frontend.request_ms,
        "frontend_tokenize_us_per_token": 0.0 if frontend is None else frontend.tokenize_us_per_token,
        "host_ms_per_pass": engine.host_ms_per_pass,
        "host_time_hidden": bool(engine.scheduler.async_scheduling),
    }


def describe_host_terms(terms: dict) -> str:
    """One line: e.g. `API server 4 ms + 3.6 µs/prompt token; host 1.4 ms
    per pass (hidden by async scheduling)`."""
    host = f"host {terms['host_ms_per_pass']:g} ms per pass"
    if terms["host_ms_per_pass"] and terms["host_time_hidden"]:
        host += " (hidden by async scheduling)"
    return (f"API server {terms['frontend_request_ms']:g} ms + "
            f"{terms['frontend_tokenize_us_per_token']:g} µs/prompt token; {host}")
