"""Reading the deployment keys of `engine:` (`model`, `gpu`, parallelism,
precision, `gpu_memory_utilization`) and deriving `num_gpu_blocks` from them
when it is not given (docs/deployment.md)."""

import os

import attrs

from servesim.deployment.config import KEYS, DeploymentConfig
from servesim.errors import InputError
from servesim.config.validation import BOOL, INT, NUMBER, enum, ge, gt, le

DTYPES = ("auto", "bfloat16", "float16")
QUANTIZATIONS = ("fp8",)
KV_CACHE_DTYPES = ("auto", "fp8")


def _reraise(ctx, path, exc: InputError):
    message = str(exc)
    ctx.fail(path, message.split(": ", 1)[1] if message.startswith("engine.") else message)


def read_deployment(ctx, s, kv_cache, scheduler, data_parallel_size=1):
    """`(DeploymentConfig or None, kv_cache, scheduler)`: the keys checked,
    vLLM's start-up limits applied (deployment/startup.py: TP against the
    heads, `max_model_len` defaulted to and bounded by the model's context
    length, one `max_model_len` request in a derived KV cache), the KV cache
    config with `num_gpu_blocks` derived when the deployment names a model
    and a GPU and `num_gpu_blocks` is absent (an explicit value wins), and
    the scheduler config with that `max_model_len`."""
    from servesim.deployment import startup
    from servesim.deployment.kv_capacity import derive_capacity, gpu_spec, kv_bytes_per_token
    from servesim.deployment.specs import load_model_spec

    given = [key for key in KEYS if key in s.data]
    if not given:
        return None, kv_cache, scheduler
    for key in ("model", "gpu"):
        if key not in s.data:
            ctx.fail(s.sub(key), f"required with {s.sub(given[0])} (a deployment names "
                     "engine.model and engine.gpu)")
    model = s.data["model"]
    if not isinstance(model, str) or not model:
        ctx.fail(s.sub("model"), "must be a database model name or a folder holding config.json")
    if os.path.isdir(ctx.resolve(model)):
        model = ctx.resolve(model)
    else:
        from servesim.deployment.model_names import resolve_model_name

        model = resolve_model_name(model)  # a Hugging Face or measurement name: the database's
    gpu = s.get("gpu", enum(*_gpu_names()))
    quant = s.get("quantization", enum(*QUANTIZATIONS), None, nullable=True)
    dep = DeploymentConfig(
        model=model,
        gpu=gpu,
        tensor_parallel_size=s.get("tensor_parallel_size", INT, 1, ge(1)),
        pipeline_parallel_size=s.get("pipeline_parallel_size", INT, 1, ge(1)),
        enable_expert_parallel=s.get("enable_expert_parallel", BOOL, False),
        dtype=s.get("dtype", enum(*DTYPES), "auto"),
        quantization=quant,
        kv_cache_dtype=s.get("kv_cache_dtype", enum(*KV_CACHE_DTYPES), "auto"),
        gpu_memory_utilization=s.get("gpu_memory_utilization", NUMBER, 0.9, gt(0), le(1)),
    )
    try:
        spec = load_model_spec(dep.model, s.sub("model"))
    except InputError as exc:
        _reraise(ctx, s.sub("model"), exc)
    if dep.pipeline_parallel_size > spec.num_layers:
        ctx.fail(s.sub("pipeline_parallel_size"),
                 f"must be <= the model's {spec.num_layers} layers, got {dep.pipeline_parallel_size}")
    try:
        startup.verify_with_parallel_config(spec, dep.tensor_parallel_size)
    except InputError as exc:
        ctx.fail(s.sub("tensor_parallel_size"), str(exc))
    try:
        max_model_len = startup.get_and_verify_max_len(spec, scheduler.max_model_len)
    except InputError as exc:
        ctx.fail(s.sub("max_model_len"), str(exc))
    scheduler = attrs.evolve(scheduler, max_model_len=max_model_len)
    if "num_gpu_blocks" in s.data:
        return dep, kv_cache, scheduler
    try:
        capacity = derive_capacity(spec, gpu_spec(gpu), dep, kv_cache.block_size,
                                   scheduler.max_num_batched_tokens, scheduler.max_num_seqs,
                                   data_parallel_size)
    except InputError as exc:
        _reraise(ctx, s.sub("model"), exc)
    try:
        startup.check_enough_kv_cache_memory(capacity.num_gpu_blocks, kv_cache.block_size,
                                             max_model_len, kv_bytes_per_token(spec, dep))
    except InputError as exc:
        ctx.fail(s.sub("max_model_len"), str(exc))
    dep = attrs.evolve(dep, derived_num_gpu_blocks=True)
    return dep, attrs.evolve(kv_cache, num_gpu_blocks=capacity.num_gpu_blocks), scheduler


def _gpu_names():
    from servesim.deployment.gpus import GPUS

    return tuple(GPUS)


def deployment_to_data(dep: DeploymentConfig | None) -> dict:
    """The deployment keys for the resolved config (none when not set)."""
    if dep is None:
        return {}
    return {key: getattr(dep, key) for key in KEYS}


CALIBRATION_KINDS = ("prefill", "decode", "mixed")


def read_calibration(path: str) -> tuple:
    """The (prefill, decode, mixed) factors of a calibration file written by
    `servesim calibrate` (docs/deployment.md), checked."""
    from servesim.config.validation import NUMBER, Ctx, show
    from servesim.config.yaml_input import read_yaml

    data, where = read_yaml(path, "calibration file")
    ctx = Ctx(path, os.path.dirname(path), where)
    if not isinstance(data, dict) or data.get("type") != "aic_calibration":
        ctx.fail("type", f"must be 'aic_calibration', got {show(data.get('type') if isinstance(data, dict) else data)}")
    factors = data.get("factors")
    if not isinstance(factors, dict):
        ctx.fail("factors", f"must be a mapping of {', '.join(CALIBRATION_KINDS)} to positive numbers")
    values = []
    for kind in CALIBRATION_KINDS:
        value = factors.get(kind, 1.0)
        if not NUMBER.accepts(value) or value <= 0:
            ctx.fail(f"factors.{kind}", f"must be a positive number, got {show(value)}")
        values.append(float(value))
    return tuple(values)
