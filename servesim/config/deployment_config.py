"""Reading the deployment keys of `engine:` (`model`, `gpu`, parallelism,
precision, `gpu_memory_utilization`) and deriving `num_gpu_blocks` from them
when it is not given (docs/deployment.md); under `backend: sglang`, SGLang's
keys (`mem_fraction_static`) and `max_total_tokens` (docs/sglang.md,
"Deployments")."""

import os

import attrs

from servesim.config.validation import BOOL, INT, NUMBER, enum, ge, gt, le, lt
from servesim.deployment.config import KEYS, DeploymentConfig, keys_of
from servesim.errors import InputError

GIB = 1 << 30

DTYPES = ("auto", "bfloat16", "float16")
QUANTIZATIONS = ("fp8",)
KV_CACHE_DTYPES = ("auto", "fp8")


def _reraise(ctx, path, exc: InputError):
    message = str(exc)
    ctx.fail(path, message.split(": ", 1)[1] if message.startswith("engine.") else message)


def _named_model_and_gpu(ctx, s, given) -> tuple:
    """(model, gpu) of a deployment whose keys `given` are set: both
    required; the model a folder holding config.json (resolved against the
    config's folder) or a Hugging Face or database name (the database's)."""
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
    return model, s.get("gpu", enum(*_gpu_names()))


def _load_spec(ctx, s, dep, engine_name="vLLM"):
    """The model's spec, its heads checked against TP (deployment/startup.py)."""
    from servesim.deployment import startup
    from servesim.deployment.specs import load_model_spec

    try:
        spec = load_model_spec(dep.model, s.sub("model"))
    except InputError as exc:
        _reraise(ctx, s.sub("model"), exc)
    try:
        startup.verify_with_parallel_config(spec, dep.tensor_parallel_size, engine_name)
    except InputError as exc:
        ctx.fail(s.sub("tensor_parallel_size"), str(exc))
    return spec


def read_deployment(ctx, s, kv_cache, scheduler, data_parallel_size=1):
    """`(DeploymentConfig or None, kv_cache, scheduler)`: the keys checked,
    vLLM's start-up limits applied (deployment/startup.py: TP against the
    heads, `max_model_len` defaulted to and bounded by the model's context
    length, one `max_model_len` request in a derived KV cache), the KV cache
    config with `num_gpu_blocks` derived when the deployment names a model
    and a GPU and `num_gpu_blocks` is absent (an explicit value wins), and
    the scheduler config with that `max_model_len`."""
    from servesim.deployment import startup
    from servesim.deployment.kv_capacity import (
        derive_capacity,
        gpu_spec,
        kv_bytes_per_token,
    )

    given = [key for key in KEYS if key in s.data]
    if not given:
        return None, kv_cache, scheduler
    model, gpu = _named_model_and_gpu(ctx, s, given)
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
    spec = _load_spec(ctx, s, dep)
    if dep.pipeline_parallel_size > spec.num_layers:
        ctx.fail(s.sub("pipeline_parallel_size"),
                 f"must be <= the model's {spec.num_layers} layers, got {dep.pipeline_parallel_size}")
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


def read_sglang_deployment(ctx, s) -> tuple:
    """`(DeploymentConfig or None, ModelSpec or None)` of an `engine:` block
    with `backend: sglang`: SGLang's deployment keys checked
    (deployment/config.py SGLANG_KEYS), its heads against TP.
    `mem_fraction_static` is left None when not given (derived with the
    capacity: `sglang_capacity`)."""
    from servesim.deployment.config import SGLANG_KEYS, SGLANG_KV_CACHE_DTYPES

    given = [key for key in SGLANG_KEYS if key in s.data]
    if not given:
        return None, None
    model, gpu = _named_model_and_gpu(ctx, s, given)
    dep = DeploymentConfig(
        model=model,
        gpu=gpu,
        tensor_parallel_size=s.get("tensor_parallel_size", INT, 1, ge(1)),
        dtype=s.get("dtype", enum(*DTYPES), "auto"),
        quantization=s.get("quantization", enum(*QUANTIZATIONS), None, nullable=True),
        kv_cache_dtype=s.get("kv_cache_dtype", enum(*SGLANG_KV_CACHE_DTYPES), "auto"),
        backend="sglang",
        mem_fraction_static=s.get("mem_fraction_static", NUMBER, None, gt(0), lt(1), nullable=True),
    )
    return dep, _load_spec(ctx, s, dep, "SGLang")


def sglang_capacity(ctx, s, dep, spec, cfg) -> tuple:
    """`(DeploymentConfig, SGLangConfig)` with SGLang's start-up rules applied
    (servesim/deployment/sglang_capacity.py): `context_length` defaulted to
    the model's (as SGLang derives it) and bounded by it unless
    SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN is set; `mem_fraction_static`
    defaulted by the GPU's memory; `max_total_tokens` derived, a given one
    capping it; `max_running_requests` defaulted by the pool and the context
    length; and one `context_length` request in the pool (servesim's check:
    SGLang would clip the longest prompt instead)."""
    from servesim.deployment.sglang_capacity import default_max_running_requests

    context = _sglang_context_length(ctx, s, spec, cfg.context_length)
    given_total = cfg.max_total_tokens if s.given("max_total_tokens") else None
    given_running = cfg.max_running_requests if s.given("max_running_requests") else None
    if dep.mem_fraction_static is None:
        dep = attrs.evolve(dep, mem_fraction_static=_sglang_mem_fraction(ctx, s, dep, spec, cfg,
                                                                         given_running, given_total))
    derived = _sglang_pool(ctx, s, dep, spec, cfg.page_size, given_total)
    total = derived if given_total is None else min(derived, given_total)
    _check_one_request(ctx, s, dep, spec, context, total)
    dep = attrs.evolve(dep, derived_num_gpu_blocks=given_total is None or derived < given_total)
    running = given_running or default_max_running_requests(total, context)
    return dep, attrs.evolve(cfg, max_total_tokens=total, context_length=context,
                             max_running_requests=running)


def _sglang_mem_fraction(ctx, s, dep, spec, cfg, given_running, given_total) -> float:
    """SGLang's default `mem_fraction_static` for the deployment
    (sglang_capacity.default_mem_fraction_static); a multimodal model's is
    refused: SGLang lowers it by the vision encoder's shape."""
    from servesim.deployment.kv_capacity import gpu_spec
    from servesim.deployment.sglang_capacity import default_mem_fraction_static

    if spec.has_vision:
        ctx.fail(s.sub("mem_fraction_static"), f"required with {spec.name}, a multimodal model: "
                 "SGLang lowers its default fraction by the vision encoder's shape "
                 "(adjust_mem_fraction_for_vlm, sglang/srt/arg_groups/memory_hook.py), which "
                 "servesim does not read (nor count the encoder's weights)")
    return default_mem_fraction_static(spec, gpu_spec(dep.gpu), dep.tensor_parallel_size,
                                       cfg.chunked_prefill_size, cfg.max_prefill_tokens,
                                       given_running, given_total)


def _sglang_pool(ctx, s, dep, spec, page_size, given_total) -> int:
    """The derived `max_total_tokens` (sglang_capacity.derive_max_total_tokens),
    its refusals naming the key; a sliding-window model's cannot be derived
    (kv_bytes_per_token), so a given one is taken as it is."""
    from servesim.deployment.kv_capacity import gpu_spec
    from servesim.deployment.sglang_capacity import derive_max_total_tokens

    if spec.sliding_window and given_total is not None:
        return given_total
    try:
        total = derive_max_total_tokens(spec, gpu_spec(dep.gpu), dep, page_size).max_total_tokens
    except InputError as exc:
        message = str(exc).replace("engine.num_gpu_blocks", s.sub("max_total_tokens"))
        key = "mem_fraction_static" if message.startswith("engine.mem_fraction_static") else "model"
        _reraise(ctx, s.sub(key), InputError(message))
    if total < 2:
        ctx.fail(s.sub("mem_fraction_static"), f"leaves {total} tokens of KV pool (SGLang refuses "
                 "to start: raise mem_fraction_static or tensor_parallel_size)")
    return total


def _check_one_request(ctx, s, dep, spec, context: int, total: int):
    """servesim's check, as vLLM's `check_enough_kv_cache_memory` for
    `max_model_len`: the pool holds one `context_length` request."""
    from servesim.deployment.kv_capacity import kv_bytes_per_token

    if context <= total:
        return
    per_token = 0 if spec.sliding_window else kv_bytes_per_token(spec, dep)
    ctx.fail(s.sub("context_length"),
             f"one request of context_length {context} needs {context * per_token / GIB:.2f} "
             f"GiB of KV cache ({context} tokens), more than the {total * per_token / GIB:.2f} "
             f"GiB ({total} tokens) the deployment leaves; the largest context_length that fits "
             f"is {total} (lower context_length, or raise mem_fraction_static or "
             "tensor_parallel_size)")


# SGLang's override of the context-length limit (sglang/srt/environ.py)
ALLOW_OVERWRITE_LONGER_CONTEXT_LEN = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"


def _sglang_context_length(ctx, s, spec, given: int) -> int:
    """SGLang's `ModelConfig._derive_context_length`
    (sglang/srt/configs/model_config.py): without `context_length` the model's
    (`ModelSpec.sglang_context_length`); a larger one is refused unless
    SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN is set (to 1, true, yes or y,
    any case: `EnvBool`, sglang/srt/environ.py)."""
    top = spec.sglang_context_length
    if not s.given("context_length"):
        return top
    allowed = os.environ.get(ALLOW_OVERWRITE_LONGER_CONTEXT_LEN, "").lower() in ("1", "true", "yes", "y")
    if given > top and not allowed:
        ctx.fail(s.sub("context_length"), f"{given} is greater than the model's context length "
                 f"({top}, derived from the config.json of {spec.name}); SGLang refuses it unless "
                 f"{ALLOW_OVERWRITE_LONGER_CONTEXT_LEN}=1 is set")
    return given


def _gpu_names():
    from servesim.deployment.gpus import GPUS

    return tuple(GPUS)


def deployment_to_data(dep: DeploymentConfig | None) -> dict:
    """The deployment keys for the resolved config, in its backend's names
    (none when not set)."""
    if dep is None:
        return {}
    return {key: getattr(dep, key) for key in keys_of(dep)}


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
