"""The `deployment` section of summary.json: what was simulated, the derived
KV capacity and where pass times came from."""

from servesim.deployment.config import KEYS


def deployment_summary(engine, data_parallel_size: int = 1) -> dict | None:
    dep = engine.deployment
    if dep is None:
        return None
    from servesim.deployment.kv_capacity import derive_capacity, gpu_spec
    from servesim.deployment.specs import load_model_spec

    out = {key: getattr(dep, key) for key in KEYS}
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

        out["timing_source"] = f"aiconfigurator-core {aic.package_version()} (vllm {aic.backend_version(dep.gpu)} data)"
        if timing.calibration:
            out["timing_source"] += f", calibrated by {timing.calibration}"
    else:
        out["timing_source"] = timing.type
    return out
