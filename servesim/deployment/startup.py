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


def verify_with_parallel_config(model: ModelSpec, tensor_parallel_size: int) -> None:
    """vLLM's `ModelConfig.verify_with_parallel_config`: the attention heads
    split evenly over the TP ranks; and its QKV projection
    (`QKVParallelLinear`) splits the KV heads evenly when TP does not exceed
    them, else replicates each on TP / KV-heads ranks, which must be whole.
    An MLA model's latent is replicated on every rank (no KV-head check)."""
    tp = tensor_parallel_size
    if model.num_heads % tp:
        raise InputError(f"the model's {model.num_heads} attention heads must be "
                         f"divisible by tensor_parallel_size {tp} (vLLM refuses to start)")
    kv = model.num_kv_heads
    if not model.is_mla and (kv % tp if tp <= kv else tp % kv):
        raise InputError(f"the model's {kv} KV heads must be divisible by "
                         f"tensor_parallel_size {tp}, or {tp} by them (vLLM splits or "
                         "replicates whole KV heads; it refuses to start)")


def get_and_verify_max_len(model: ModelSpec, max_model_len: int | None) -> int:
    """vLLM's `_get_and_verify_max_len`: without `max_model_len` the engine
    serves the model's context length (`max_position_embeddings` of its
    config.json); a larger `max_model_len` is refused unless
    VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 is set (then taken as given). Messages name no key: the caller does."""
    top = model.max_position_embeddings
    if max_model_len is None:
        return top
    if max_model_len > top and os.environ.get(ALLOW_LONG_MAX_MODEL_LEN) != "1":
        raise InputError(f"{max_model_len} is greater than the model's context length "
                         f"({top}, max_position_embeddings of {model.name}); vLLM refuses it "
                         f"unless {ALLOW_LONG_MAX_MODEL_LEN}=1 is set")
    return max_model_len


def check_enough_kv_cache_memory(num_gpu_blocks: int, block_size: int, max_model_len: int,
                                 bytes_per_token: int) -> None:
    """vLLM's `check_enough_kv_cache_memory` (vllm/v1/core/kv_cache_utils.py):
    the KV cache must hold one request of `max_model_len` tokens, i.e.
    `ceil(max_model_len / block_size)` blocks; otherwise vLLM refuses to
    start and names the largest length that fits, `num_gpu_blocks ×
    block_size`."""
    needed = -(-max_model_len // block_size)
    if needed > num_gpu_blocks:
        gib = 1 << 30
        per_block = bytes_per_token * block_size
        raise InputError(
            f"one request of max_model_len {max_model_len} needs "
            f"{needed * per_block / gib:.2f} GiB of KV cache ({needed} blocks), more than the "
            f"{num_gpu_blocks * per_block / gib:.2f} GiB ({num_gpu_blocks} blocks) the deployment "
            f"leaves; the largest max_model_len that fits is {num_gpu_blocks * block_size} "
            "(vLLM refuses to start: lower max_model_len, or raise gpu_memory_utilization or "
            "tensor_parallel_size)")
