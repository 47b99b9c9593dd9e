"""vLLM's start-up limits on a named deployment (docs/deployment.md, "Start-up
limits"), as vLLM 0.33 applies them before it serves anything. Each function
is named after the vLLM function whose check it states and returns the value
vLLM would use, or raises InputError with vLLM's reason and the numbers.
"""

import os

from servesim.deployment.specs import ModelSpec
from servesim.errors import InputError

# vLLM's override of the context-length limit (vllm/envs.py)
ALLOW_LONG_MAX_MODEL_LEN = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"


def verify_with_parallel_config(model: ModelSpec, tensor_parallel_size: int,
                                engine: str = "vLLM") -> None:
    """vLLM's `ModelConfig.verify_with_parallel_config`: the attention heads
    split evenly over the TP ranks; and its QKV projection
    (`QKVParallelLinear`) splits the KV heads evenly when TP does not exceed
    them, else replicates each on TP / KV-heads ranks, which must be whole.
    An MLA model's latent is replicated on every rank (no KV-head check).
    SGLang's `QKVParallelLinear` (sglang/srt/layers/linear.py) divides the
    heads by the same rules (`engine` names the one that refuses)."""
    tp = tensor_parallel_size
    if model.num_heads % tp:
        raise InputError(f"the model's {model.num_heads} attention heads must be "
                         f"divisible by tensor_parallel_size {tp} ({engine} refuses to start)")
    kv = model.num_kv_heads
    if not model.is_mla and (kv % tp if tp <= kv else tp % kv):
        raise InputError(f"the model's {kv} KV heads must be divisible by "
                         f"tensor_parallel_size {tp}, or {tp} by them ({engine} splits or "
                         "replicates whole KV heads; it refuses to start)")


def get_and_verify_max_len(model: ModelSpec, max_model_len: int | None) -> int:
    """vLLM's `_get_and_verify_max_len`: without `max_model_len` the engine
    serves the model's context length (`ModelSpec.derived_max_model_len`,
    from its config.json as vLLM derives it); a larger `max_model_len` is refused unless
    VLLM_ALLOW_LONG_MAX_MODEL_LEN is set to 1 or true (vllm/envs.py reads it
    stripped and case-blind; then the value is taken as given). Messages name
    no key: the caller does."""
    top = model.derived_max_model_len
    if max_model_len is None:
        return top
    allowed = os.environ.get(ALLOW_LONG_MAX_MODEL_LEN, "0").strip().lower() in ("1", "true")
    if max_model_len > top and not allowed:
        raise InputError(f"{max_model_len} is greater than the model's context length "
                         f"({top}, derived from the config.json of {model.name}); vLLM refuses it "
                         f"unless {ALLOW_LONG_MAX_MODEL_LEN}=1 is set")
    return max_model_len


def check_enough_kv_cache_memory(num_gpu_blocks: int, block_size: int, max_model_len: int,
                                 bytes_per_token: int) -> None:
    """vLLM's `check_enough_kv_cache_memory` (vllm/v1/core/kv_cache_utils.py):
    the KV cache must hold one request of `max_model_len` tokens, i.e.
    `ceil(max_model_len / block_size)` blocks, in the blocks a request can
    use: `num_gpu_blocks - 1`, as the block pool holds its null block back
    (vLLM checks against the memory less one block since vllm-project/vllm#47272).
    Otherwise vLLM refuses to start and names the largest length that fits,
    `(num_gpu_blocks - 1) × block_size`."""
    needed = -(-max_model_len // block_size)
    usable = num_gpu_blocks - 1
    if needed > usable:
        gib = 1 << 30
        per_block = bytes_per_token * block_size
        raise InputError(
            f"one request of max_model_len {max_model_len} needs "
            f"{needed * per_block / gib:.2f} GiB of KV cache ({needed} blocks), more than the "
            f"{usable * per_block / gib:.2f} GiB ({usable} blocks, the null block aside) the "
            f"deployment leaves; the largest max_model_len that fits is {usable * block_size} "
            "(vLLM refuses to start: lower max_model_len, or raise gpu_memory_utilization or "
            "tensor_parallel_size)")
