"""Configuration of one rank's G1 (GPU) KV block pool."""

import attrs


@attrs.frozen
class KVCacheConfig:
    """`engine.block_size`, `engine.num_gpu_blocks`, `engine.enable_prefix_caching`.

    `num_gpu_blocks` counts vLLM's null block 0, so `num_gpu_blocks - 1` blocks
    are usable (vllm/v1/core/block_pool.py).
    """

    block_size: int = 16
    num_gpu_blocks: int = 8192
    enable_prefix_caching: bool = True

    @property
    def num_usable_blocks(self) -> int:
        return self.num_gpu_blocks - 1
