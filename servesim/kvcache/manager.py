"""vLLM's `KVCacheManager` for one full-attention group
(vllm/v1/core/kv_cache_manager.py): prefix lookup, slot allocation with
registration of full blocks, and freeing, over a :class:`BlockPool`.

A request here is any object with `idents`, `block_table`, `num_blocks`,
`num_cached_blocks`, `num_tokens` and `num_computed_tokens` (the scheduler's
`Request`).
"""

import numpy as np

from servesim.kvcache import block_pool as bp
from servesim.kvcache.block_pool import BlockPool

_NO_BLOCKS = np.zeros(0, dtype=np.int64)


class KVCacheManager:
    def __init__(self, pool: BlockPool):
        self.pool = pool
        self.block_size = pool.block_size
        self.enable_caching = pool.enable_caching
        self._hits = np.zeros(64, dtype=np.int64)

    def get_computed_blocks(self, request):
        """Prefix-cache lookup (`get_computed_blocks`): the leading blocks of the
        request already cached, never covering its last token —
        `min(cached run, floor((num_tokens - 1) / block_size))` blocks.
        Returns `(hit_blocks, num_hit_tokens)`."""
        if not self.enable_caching:
            return _NO_BLOCKS, 0
        max_blocks = (request.num_tokens - 1) // self.block_size
        if max_blocks > len(self._hits):
            self._hits = np.zeros(max(max_blocks, 2 * len(self._hits)), dtype=np.int64)
        pool = self.pool
        num_hit = bp.find_cached_prefix(pool.blocks, pool.idmap, request.idents,
                                        max_blocks, self._hits)
        return self._hits[:num_hit].copy(), num_hit * self.block_size

    def allocate_slots(self, request, num_new_tokens, hit_blocks=_NO_BLOCKS,
                       num_hit_tokens=0, reserve_tokens=0, extra_blocks=0,
                       delay_cache=False) -> bool:
        """Blocks for `num_computed_tokens + num_hit_tokens + num_new_tokens`
        tokens; on success the full blocks among them (up to the request's
        known tokens) are registered in the prefix cache at once, so a request
        admitted later in the same pass can hit them — unless `delay_cache`
        (blocks a CPU-tier load will fill: registered by `cache_blocks` once
        the load is done, vLLM's `delay_cache_blocks`).

        The free-block check covers `max(those blocks, reserve_tokens' blocks)
        + extra_blocks` (the admission checks of `reserve_full_isl` and
        `watermark`), counting hit blocks nobody holds as used. Returns False,
        changing nothing, when it does not fit.
        """
        bs = self.block_size
        pool = self.pool
        total = request.num_computed_tokens + num_hit_tokens + num_new_tokens
        needed = -(-total // bs)
        checked = max(needed, -(-reserve_tokens // bs)) + extra_blocks
        held = bp.allocate_slots(pool.blocks, pool.idmap, pool.scalars,
                                 request.block_table, request.num_blocks,
                                 hit_blocks, len(hit_blocks), needed, checked)
        if held < 0:
            return False
        request.num_blocks = held
        if len(hit_blocks):  # hits are registered blocks already
            request.num_cached_blocks = len(hit_blocks)
        if not delay_cache:
            self.cache_blocks(request, total)
        return True

    def cache_blocks(self, request, num_tokens):
        """Register the request's held blocks that are full within
        `min(num_tokens, request.num_tokens)` tokens and not registered yet
        (`KVCacheManager.cache_blocks`, vllm/v1/core/kv_cache_manager.py).

        Called by `allocate_slots` for the tokens a pass will compute, and by
        the scheduler's `update_from_output` for a RUNNING request when its
        sampled token arrives, with `num_computed_tokens` minus the tokens
        still in flight (vLLM's async scheduler,
        vllm/v1/core/sched/async_scheduler.py `_update_request_with_output`):
        under async scheduling allocation sees only known tokens, so the block
        a pass fills with an in-flight token is registered here — also for a
        request finishing on that token, before its blocks are freed (it then
        goes back to the free queue as a cached block). Without tokens in
        flight allocation has already registered every block the pass
        filled, and the call changes nothing."""
        if self.enable_caching:
            num_full = min(num_tokens, request.num_tokens) // self.block_size
            if num_full > request.num_cached_blocks:
                pool = self.pool
                bp.cache_full_blocks(pool.blocks, pool.idmap, request.block_table,
                                     request.idents, request.num_cached_blocks, num_full)
                request.num_cached_blocks = num_full

    def free(self, request):
        """Free all of a request's blocks, tail first (`KVCacheManager.free`)."""
        bp.free_blocks(self.pool.blocks, self.pool.scalars, request.block_table,
                       request.num_blocks)
        request.num_blocks = 0
        request.num_cached_blocks = 0
