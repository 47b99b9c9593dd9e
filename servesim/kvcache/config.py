"""Configuration of one rank's G1 (GPU) KV block pool and of its CPU tier."""

import attrs


@attrs.frozen
class KVCacheConfig:
    """`engine.block_size`, `engine.num_gpu_blocks`, `engine.enable_prefix_caching`.

    `num_gpu_blocks` counts vLLM's null block 0 (`num_usable_blocks`).
    """

    block_size: int = 16
    num_gpu_blocks: int = 8192
    enable_prefix_caching: bool = True

    @property
    def num_usable_blocks(self) -> int:
        """The blocks requests can hold: all but vLLM's null block 0, which is
        never handed out (vllm/v1/core/block_pool.py `BlockPool.__init__`).
        The one statement of the rule; kernels read it from the scheduler's
        `cfg[0].num_usable_blocks` and block_pool.py's `usable_blocks`."""
        return self.num_gpu_blocks - 1


@attrs.frozen
class KVOffloadingConfig:
    """`engine.kv_offloading`: the CPU tier (docs/engine.md §9).

    `num_cpu_blocks` CPU blocks of `block_size` tokens, `bytes_per_token ·
    block_size` bytes each; `d2h_gbps` / `h2d_gbps` are the bandwidths (GB/s)
    of the device-to-host and host-to-device lanes. `connector` is
    `offloading` (stores blocks as they fill) or `simple_cpu` (stores a
    request's blocks when it finishes or is preempted).
    """

    num_cpu_blocks: int
    bytes_per_token: int
    d2h_gbps: float
    h2d_gbps: float
    connector: str = "offloading"  # offloading | simple_cpu
