"""`engine.model`, `engine.gpu` and the parallelism and precision keys, in
vLLM's names (docs/deployment.md), or in SGLang's under `backend: sglang`
(docs/sglang.md, "Deployments")."""

import attrs


@attrs.frozen
class DeploymentConfig:
    model: str  # a database model name or a folder holding config.json
    gpu: str  # a system of the performance database
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    enable_expert_parallel: bool = False
    dtype: str = "auto"  # auto | bfloat16 | float16 (activations and unquantized weights)
    quantization: str | None = None  # None | fp8 (weights)
    kv_cache_dtype: str = "auto"  # auto | fp8; under SGLang auto | bf16 | bfloat16 | fp8_e4m3
    gpu_memory_utilization: float = 0.9
    # the engine whose start-up rules derive the capacity and whose database
    # data prices the passes: "vllm" or "sglang" (engine.backend, not a key)
    backend: str = "vllm"
    # SGLang's memory key (backend sglang): weights + KV pool over the GPU's memory
    mem_fraction_static: float | None = None
    # whether num_gpu_blocks (max_total_tokens under SGLang) was derived (not
    # given); not part of the config's identity
    derived_num_gpu_blocks: bool = attrs.field(default=False, eq=False)


# the keys a vLLM engine reads
KEYS = ("model", "gpu", "tensor_parallel_size", "pipeline_parallel_size", "enable_expert_parallel",
        "dtype", "quantization", "kv_cache_dtype", "gpu_memory_utilization")
# the keys an SGLang engine reads (servesim models no pipeline or expert parallelism there)
SGLANG_KEYS = ("model", "gpu", "tensor_parallel_size", "dtype", "quantization", "kv_cache_dtype",
               "mem_fraction_static")
# SGLang's KV dtypes (`--kv-cache-dtype`, sglang/srt/arg_groups/fields/model.py) servesim prices
SGLANG_KV_CACHE_DTYPES = ("auto", "bf16", "bfloat16", "fp8_e4m3")


def keys_of(dep: DeploymentConfig) -> tuple:
    """The config keys of a deployment, in its backend's names."""
    return SGLANG_KEYS if dep.backend == "sglang" else KEYS


def fp8_kv(dep: DeploymentConfig) -> bool:
    """Whether the KV cache is stored in fp8 (vLLM's `fp8`, SGLang's `fp8_e4m3`)."""
    return dep.kv_cache_dtype in ("fp8", "fp8_e4m3")
