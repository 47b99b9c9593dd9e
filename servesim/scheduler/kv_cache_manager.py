"""vLLM's `KVCacheManager` (vllm/v1/core/kv_cache_manager.py) as kernels over a
rank's arrays: the only calls the scheduler makes into its block pool.

- `_allocate`: `allocate_slots`, the new blocks a step needs (with lookahead
  slots for drafts), or nothing when the pool can't hold them;
- `cache_blocks`: full blocks hashed into the prefix cache as tokens are computed;
- `_free`: a request's blocks back to the free queue (reverse order);
- `fits_the_pool`, `can_ever_fit`: whether a prompt could ever be admitted.

The block pool itself is servesim/kvcache/block_pool.py.

NOTE(refcounts): `_allocate` is compiled without reference counts (servesim/jit.py).
"""



from servesim.jit import njit
from servesim.kvcache import block_pool as bp



# No reference counts in here, whoever calls it (the waiting loop counts its
# own; module docstring): the running loop calls it for every running request at
# every pass (benchmarks/RESULTS.md, 2026-12-04).
@njit(_nrt=False)  # NOTE(refcounts): an entry point, compiled without counts (servesim/jit.py)
def _allocate(s, i, num_new, hits, num_hit, reserve_tokens, extra_blocks, delay_cache=False):
    """`KVCacheManager.allocate_slots` (vllm/v1/core/kv_cache_manager.py): the
    blocks request i's next tokens need, over its table.

    - Slots cover `min(total + num_lookahead_tokens, max_model_len)` tokens
      (the lookahead is k under speculative decoding, else 0).
    - Blocks are registered when full within the known tokens, and only once
      the hash lookahead token exists; registered at once, so a request
      admitted later in the same pass can hit them.
    - Unless `delay_cache`: blocks a load will fill, registered by
      `_finish_load` (vLLM's `delay_cache_blocks`).
    - The free-block check covers `max(those blocks, reserve_tokens' blocks)
      + extra_blocks` (the admission checks of `reserve_full_isl` and
      `watermark`), counting hit blocks nobody holds as used.
    - When it does not fit it returns False, changing nothing.
    - A rank with `kv` then notes the blocks it took for the pass
      (`_note_new_blocks`).
    """
    R, cfg = s.R, s.cfg
    bs = cfg[0].block_size
    off = R[i].block_offset
    end = off + R[i].block_capacity
    total = R[i].num_computed_tokens + num_hit * bs + num_new
    needed = -(-min(total + cfg[0].num_lookahead_tokens, cfg[0].max_model_len) // bs)
    checked = max(needed, -(-reserve_tokens // bs)) + extra_blocks
    if num_hit > 0 or checked > R[i].num_held_blocks:
        held = bp.allocate_slots(s.blocks, s.idmap, s.pscal, s.tables[off:end],
                                 R[i].num_held_blocks, hits, num_hit, needed, checked, s.events)
        if held < 0:
            return False
        R[i].num_held_blocks = held
    # else: the blocks it holds cover the tokens and the check (most decodes)
    if num_hit > 0:
        R[i].num_cached_blocks = num_hit
    if not delay_cache:
        cache_blocks(s, i, total)
    return True


@njit(inline="always")  # runs for every sampled token: kept to a compare
def cache_blocks(s, i, num_tokens):
    """`KVCacheManager.cache_blocks` (vllm/v1/core/kv_cache_manager.py): over
    the table, register request i's held blocks full within `min(num_tokens,
    its known tokens)` not registered yet.

    - Called by `_allocate` and, for a RUNNING request whose sampled token
      arrives, by `update_from_output` with the tokens whose pass has
      completed.
    - Most calls fill no new block: inlined, they cost the one compare before
      the out-of-line registration.
    """
    R, cfg = s.R, s.cfg
    bs = cfg[0].block_size
    # a block may be full
    if cfg[0].enable_caching and num_tokens >= (R[i].num_cached_blocks + 1) * bs:
        # with a hash lookahead token, a block's hash exists once the next token does
        num_full = min(num_tokens, R[i].num_tokens - cfg[0].num_hash_lookahead_tokens) // bs
        if num_full > R[i].num_cached_blocks:
            _cache_full_blocks(s, i, num_full)


@njit
def _cache_full_blocks(s, i, num_full):
    """`SingleTypeKVCacheManager.cache_blocks`
    (vllm/v1/core/single_type_kv_cache_manager.py): request i's blocks from
    its `num_cached_blocks` to `num_full` go to `BlockPool.cache_full_blocks`,
    and it counts them cached."""
    R = s.R
    off = R[i].block_offset
    end = off + R[i].block_capacity
    bp.cache_full_blocks(s.blocks, s.idmap, s.tables[off:end], s.idents[off:end],
                         R[i].num_cached_blocks, num_full, s.events)
    R[i].num_cached_blocks = num_full


@njit
def _free(s, i):
    """`KVCacheManager.free` (vllm/v1/core/kv_cache_manager.py): request i's
    blocks back to the pool in reverse order (`BlockPool.free_blocks`, tail
    first); it holds none and has none cached after."""
    R = s.R
    off = R[i].block_offset
    bp.free_blocks(s.blocks, s.pscal, s.tables[off:off + R[i].block_capacity],
                   R[i].num_held_blocks)
    R[i].num_held_blocks = 0
    R[i].num_cached_blocks = 0


@njit(inline="always")
def fits_the_pool(cfg, num_tokens):
    """servesim's own: whether `num_tokens` tokens' slots fit in the usable
    blocks (docs/engine.md §3).

    - The slots include the lookahead slots of speculative decoding
      (`allocate_slots`' `num_lookahead_tokens`,
      vllm/v1/core/kv_cache_manager.py), capped at max_model_len like every
      allocation.
    - A request that does not fit can never be admitted: at arrival
      `can_ever_fit` rejects it; on resume after outgrowing the pool the
      waiting loop takes it out.
    """
    slots = min(num_tokens + cfg[0].num_lookahead_tokens, cfg[0].max_model_len)
    return -(-slots // cfg[0].block_size) <= cfg[0].num_usable_blocks


@njit
def can_ever_fit(cfg, num_prompt_tokens):
    """servesim's own: whether a prompt may be queued; one that could never
    be admitted is rejected at arrival (docs/engine.md §3).

    - Rejected: a prompt reaching max_model_len, or whose prefill needs more
      blocks than usable.
    - The prefill that completes a prompt also reserves the lookahead slots
      of speculative decoding (`allocate_slots`' `num_lookahead_tokens`,
      vllm/v1/core/kv_cache_manager.py), capped at max_model_len like every
      allocation, so those count too.
    - Such a request could never be admitted and would hold the queue behind
      it forever.
    """
    return num_prompt_tokens < cfg[0].max_model_len and fits_the_pool(cfg, num_prompt_tokens)
