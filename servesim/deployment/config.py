"""`engine.model`, `engine.gpu` and the parallelism and precision keys, in
vLLM's names (docs/deployment.md)."""

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
    kv_cache_dtype: str = "auto"  # auto | fp8
    gpu_memory_utilization: float = 0.9
    # whether num_gpu_blocks was derived (not given); not part of the config's identity
    derived_num_gpu_blocks: bool = attrs.field(default=False, eq=False)


KEYS = tuple(f.name for f in attrs.fields(DeploymentConfig) if f.name != "derived_num_gpu_blocks")
