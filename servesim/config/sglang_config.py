"""`engine:` with `backend: sglang` (docs/sglang.md, "Config"): SGLang's
server-argument names, checked as strictly as vLLM's; a key only the other
backend knows is refused with that backend's name for it."""

import attrs

from servesim.config.validation import BOOL, INT, NUMBER, Section, enum, ge, gt
from servesim.deployment.config import SGLANG_KEYS as DEPLOYMENT_KEYS
from servesim.engine.config import EngineConfig
from servesim.sglang.cluster import ROUTERS as SGLANG_ROUTERS  # noqa: F401  (re-exported: config.py)
from servesim.sglang.config import SGLangConfig

BACKENDS = ("vllm", "sglang")
SGLANG_KEYS = ("backend", *(f.name for f in attrs.fields(SGLangConfig)), "timing", *DEPLOYMENT_KEYS)
# timing types an SGLang engine prices (docs/sglang.md, "Timing"; aic: a deployment's)
SGLANG_TIMING_TYPES = ("fixed", "linear", "polynomial", "fitted", "aic")

# vLLM's engine keys -> what SGLang calls them (None: SGLang has no such knob here)
SGLANG_NAME_OF = {
    "max_num_seqs": "max_running_requests",
    "max_num_batched_tokens": "chunked_prefill_size",
    "enable_chunked_prefill": "chunked_prefill_size (-1 turns chunked prefill off)",
    "block_size": "page_size",
    "num_gpu_blocks": "max_total_tokens (in tokens, not blocks)",
    "enable_prefix_caching": "disable_radix_cache (the opposite sense)",
    "max_model_len": "context_length",
    "gpu_memory_utilization": "mem_fraction_static (the weights and KV pool's share of the GPU's memory)",
    "scheduling_policy": "schedule_policy (fcfs or lpm)",
    "async_scheduling": "disable_overlap_schedule (the opposite sense; overlap is SGLang's default)",
    "long_prefill_token_threshold": None,
    "reserve_full_isl": None,
    "watermark": None,
    "launch": None,
    "detokenize_ms": None,
    "kv_offloading": None,
    "speculative": None,
}
# vLLM keys whose feature servesim's SGLang engine does not model, and SGLang's
# own server arguments for features it does not model: refused naming the feature
SGLANG_UNSUPPORTED = {
    "kv_offloading": "a CPU tier (SGLang's hierarchical cache)",
    "pipeline_parallel_size": "pipeline parallelism",
    "pp_size": "pipeline parallelism",
    "enable_expert_parallel": "expert parallelism",
    "ep_size": "expert parallelism",
    "enable_hierarchical_cache": "the hierarchical cache",
    "hicache_ratio": "the hierarchical cache",
    "hicache_size": "the hierarchical cache",
    "speculative": "speculative decoding",
    "speculative_algorithm": "speculative decoding",
    "speculative_num_steps": "speculative decoding",
    "speculative_num_draft_tokens": "speculative decoding",
    "enable_dp_attention": "DP attention",
    "dp_size": "data parallelism (several workers: cluster.workers)",
    "enable_lora": "LoRA",
    "lora_paths": "LoRA",
    "max_loras_per_batch": "LoRA",
    "disaggregation_mode": "PD disaggregation",
}
# SGLang's keys -> what vLLM calls them
VLLM_NAME_OF = {
    "max_running_requests": "max_num_seqs",
    "chunked_prefill_size": "max_num_batched_tokens (with enable_chunked_prefill)",
    "max_prefill_tokens": None,
    "page_size": "block_size",
    "max_total_tokens": "num_gpu_blocks (in blocks of block_size)",
    "disable_radix_cache": "enable_prefix_caching (the opposite sense)",
    "context_length": "max_model_len",
    "schedule_policy": "scheduling_policy",
    "schedule_conservativeness": None,
    "disable_overlap_schedule": "async_scheduling (the opposite sense)",
    "enable_mixed_chunk": None,
    "ignore_eos": None,
    "mem_fraction_static": "gpu_memory_utilization (of all the GPU's memory, not the weights and "
                           "KV pool's share)",
}


def other_backend_message(key: str, backend: str) -> str | None:
    """The message for `key` under `backend` when only the other backend knows it."""
    if backend == "sglang" and key in SGLANG_UNSUPPORTED:
        return (f"{SGLANG_UNSUPPORTED[key]} is not supported with backend: sglang "
                "(docs/sglang.md, \"Conformance and limits\")")
    if backend == "sglang" and key in SGLANG_NAME_OF:
        name = SGLANG_NAME_OF[key]
        if name is None:
            return f"a vLLM key; SGLang has no {key} (backend: sglang)"
        return f"a vLLM key; SGLang calls it {name} (backend: sglang)"
    if backend == "vllm" and key in VLLM_NAME_OF:
        name = VLLM_NAME_OF[key]
        if name is None:
            return f"an SGLang key (engine.backend: sglang); vLLM has no {key}"
        return f"an SGLang key (engine.backend: sglang); vLLM calls it {name}"
    return None


def check_backend_keys(ctx, data, backend: str, path_of):
    """Refuse a key of the other backend, naming this backend's name for it."""
    for key in data:
        message = other_backend_message(key, backend)
        if message is not None:
            ctx.fail(path_of(key), message)


def parse_sglang_engine(ctx, data, path_of, parse_timing) -> EngineConfig:
    """The EngineConfig of an `engine:` block with `backend: sglang`."""
    check_backend_keys(ctx, data, "sglang", path_of)
    from servesim.config.deployment_config import (
        read_sglang_deployment,
        sglang_capacity,
    )

    s = Section(ctx, data, "engine", SGLANG_KEYS, path_of)
    dep, spec = read_sglang_deployment(ctx, s)
    d = SGLangConfig() if dep is None else _deployment_defaults(dep)
    page_size = s.get("page_size", INT, d.page_size, ge(1))
    total = s.get("max_total_tokens", INT, d.max_total_tokens, ge(2))
    if total % page_size and (dep is None or s.given("max_total_tokens")):
        ctx.fail(s.sub("max_total_tokens"), f"must be a multiple of {s.sub('page_size')} "
                 f"({page_size}), got {total}")
    chunk = s.get("chunked_prefill_size", INT, d.chunked_prefill_size)
    if chunk == 0 or chunk < -1:
        ctx.fail(s.sub("chunked_prefill_size"), f"must be a number of tokens >= 1, or -1 to "
                 f"turn chunked prefill off, got {chunk}")
    mixed = s.get("enable_mixed_chunk", BOOL, d.enable_mixed_chunk)
    if mixed and chunk == -1:
        ctx.fail(s.sub("enable_mixed_chunk"), f"needs chunked prefill ({s.sub('chunked_prefill_size')} "
                 "is -1)")
    cfg = SGLangConfig(
        max_total_tokens=total,
        page_size=page_size,
        chunked_prefill_size=chunk,
        max_prefill_tokens=s.get("max_prefill_tokens", INT, d.max_prefill_tokens, ge(1)),
        max_running_requests=s.get("max_running_requests", INT, d.max_running_requests, ge(1)),
        schedule_policy=s.get("schedule_policy", enum("fcfs", "lpm"), d.schedule_policy),
        schedule_conservativeness=float(s.get("schedule_conservativeness", NUMBER,
                                              d.schedule_conservativeness, gt(0))),
        disable_radix_cache=s.get("disable_radix_cache", BOOL, d.disable_radix_cache),
        disable_overlap_schedule=s.get("disable_overlap_schedule", BOOL, d.disable_overlap_schedule),
        enable_mixed_chunk=mixed,
        context_length=s.get("context_length", INT, d.context_length, ge(2)),
        ignore_eos=s.get("ignore_eos", BOOL, d.ignore_eos),
    )
    if dep is not None:
        dep, cfg = sglang_capacity(ctx, s, dep, spec, cfg)
    timing = parse_timing(ctx, s.data.get("timing"), s.sub("timing"))
    if timing.type not in SGLANG_TIMING_TYPES:
        ctx.fail(s.sub("timing"), f"type {timing.type} is not supported with backend: sglang "
                 f"(accepted: {', '.join(SGLANG_TIMING_TYPES)})")
    if timing.type == "aic" and dep is None:
        ctx.fail(s.sub("timing"), f"type aic requires a deployment: {s.sub('model')} and {s.sub('gpu')}")
    return EngineConfig(timing=timing, sglang=cfg, deployment=dep)


def _deployment_defaults(dep) -> SGLangConfig:
    """SGLang's defaults that a deployment's GPU sets: `chunked_prefill_size`
    by its memory (servesim/deployment/sglang_capacity.py); the capacity,
    `context_length` and `max_running_requests` are derived after the keys
    are read (config/deployment_config.py `sglang_capacity`)."""
    from servesim.deployment.kv_capacity import gpu_spec
    from servesim.deployment.sglang_capacity import default_chunked_prefill_size

    return SGLangConfig(chunked_prefill_size=default_chunked_prefill_size(gpu_spec(dep.gpu)))


def sglang_engine_to_data(engine: EngineConfig, timing_data: dict) -> dict:
    from servesim.config.deployment_config import deployment_to_data

    return {"backend": "sglang", **attrs.asdict(engine.sglang), "timing": timing_data,
            **deployment_to_data(engine.deployment)}
