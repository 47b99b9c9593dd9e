"""The G1 block pool: vLLM's `BlockPool`, `FreeKVCacheBlockQueue` and the
prefix-cache map, as Numba kernels over NumPy arrays.

Rules (vllm/v1/core/block_pool.py, kv_cache_utils.py, kv_cache_manager.py):

- Block 0 is the null block and is never allocated; blocks 1..N-1 start in the
  free queue in id order.
- A block with `ref_cnt == 0` is in the free queue, cached or not; cached free
  blocks count as free and are evicted when popped.
- New blocks are popped from the head of the free queue; a popped block that
  carries an identity is evicted from the cache map then.
- A prefix hit "touches" a block: out of the free queue if its `ref_cnt` was 0,
  then `ref_cnt += 1`.
- Freeing walks a request's blocks tail first: `ref_cnt -= 1`; a block reaching
  0 goes to the front of the queue without an identity, to the back with one.
- A block that becomes full is registered under its identity at allocation
  time; a second block with an identity already cached is kept as a duplicate
  entry, and lookups take the first entry still cached.

State layout: `blocks[ROW, b]` for b in 0..N-1 plus two queue sentinels
(HEAD = N, TAIL = N + 1); `idmap[identity]` is the first of the cached blocks of
one identity, linked through DPREV/DNEXT in the order they were cached (a
duplicate is rare, so appending walks the list); `scalars[NUM_FREE]`.
"""

import numpy as np

from servesim.kvcache.config import KVCacheConfig
from servesim.jit import njit

REF, IDENT, PREV, NEXT, DPREV, DNEXT = range(6)
NUM_FREE = 0
NONE = -1

# The KV events (vLLM's `BlockStored` / `BlockRemoved`, BlockPool's
# `kv_event_queue`) as the router's indexer sees them: `events` is a tuple
# (`ev`, `ev_t`, `view`) — a ring of events (`ev[EV_HEADER:]`, identity * 2 +
# kind) with their times (`ev_t[EV_T0:]`), the header (queue on, head,
# count, how many are stamped with their time, how many reached the view
# early because the ring was full) and the lag (`ev_t[EV_LAG]`); `view[ident]`
# is 1 where the router believes the identity cached. Events concern
# identities: one is stored when its first cached block is registered,
# removed when its last cached block is evicted. Without a lag a pool's
# `events` is None: the kernels here take None for no queue, and Numba
# prunes their branches on it, so a run without a lag compiles none of the
# queue's kernels (`_queue_event`, `stamp_events`, `see_events`).
EV_ON, EV_HEAD, EV_COUNT, EV_STAMPED, EV_EARLY = range(5)
EV_HEADER = 5
EV_LAG, EV_T0 = 0, 1
STORED, REMOVED = 0, 1


@njit(inline="always")
def usable_blocks(num_gpu_blocks):
    """servesim's own: `KVCacheConfig.num_usable_blocks` in kernels, all but the
    null block 0 (docs/engine.md §4)."""
    return num_gpu_blocks - 1


@njit
def _queue_remove(blocks, b):
    """`FreeKVCacheBlockQueue.remove` (vllm/v1/core/kv_cache_utils.py): unlink
    block b from the free queue, wherever it stands."""
    p = blocks[PREV, b]
    n = blocks[NEXT, b]
    blocks[NEXT, p] = n
    blocks[PREV, n] = p
    blocks[PREV, b] = NONE
    blocks[NEXT, b] = NONE


@njit
def _queue_insert_after(blocks, p, b):
    """`FreeKVCacheBlockQueue.append` (vllm/v1/core/kv_cache_utils.py): link
    block b into the free queue right after p.

    - p = the tail sentinel's predecessor: vLLM's append (the back);
    - p = the head sentinel or a block just freed: the front, where
      `free_blocks` puts uncached blocks (docs/engine.md §4).
    """
    n = blocks[NEXT, p]
    blocks[PREV, b] = p
    blocks[NEXT, b] = n
    blocks[NEXT, p] = b
    blocks[PREV, n] = b


@njit
def _see_oldest(ev, ev_t, view):
    """servesim's own: the oldest queued KV event reaches the router's view
    (docs/engine.md §11)."""
    cap = ev.shape[0] - EV_HEADER
    code = ev[EV_HEADER + ev[EV_HEAD]]
    view[code >> 1] = 1 - (code & 1)
    ev[EV_HEAD] = (ev[EV_HEAD] + 1) % cap
    ev[EV_COUNT] -= 1
    if ev[EV_STAMPED] > 0:
        ev[EV_STAMPED] -= 1


@njit
def _queue_event(events, ident, kind):
    """`BlockPool.kv_event_queue` (vllm/v1/core/block_pool.py): its append of
    a `BlockStored` or `BlockRemoved`, identity `ident` stored or removed.

    - The ring full: its oldest event reaches the view now, counted in
      EV_EARLY (docs/engine.md §11).
    """
    ev, ev_t, view = events
    if not ev[EV_ON]:
        return
    cap = ev.shape[0] - EV_HEADER
    if ev[EV_COUNT] == cap:
        _see_oldest(ev, ev_t, view)
        ev[EV_EARLY] += 1
    ev[EV_HEADER + (ev[EV_HEAD] + ev[EV_COUNT]) % cap] = ident * 2 + kind
    ev[EV_COUNT] += 1


@njit
def stamp_events(events, now):
    """servesim's own: the KV events queued since the last call happened at
    `now` (docs/engine.md §11).

    - The pass loop calls this after every decision and every pass end.
    - Those `lag` old or more reach the view (`see_events`: whoever asks
      later asks at `now` or after).
    - None (no lag, no queue): nothing to do.
    """
    if events is None:
        return
    ev, ev_t, view = events
    if not ev[EV_ON]:
        return
    cap = ev.shape[0] - EV_HEADER
    for k in range(ev[EV_STAMPED], ev[EV_COUNT]):
        ev_t[EV_T0 + (ev[EV_HEAD] + k) % cap] = now
    ev[EV_STAMPED] = ev[EV_COUNT]
    see_events(events, now - ev_t[EV_LAG])


@njit
def see_events(events, until):
    """servesim's own: the router's indexer takes the KV events that
    happened at or before `until`, in order, so its view is the cache as it
    was then (docs/engine.md §11)."""
    ev, ev_t, view = events
    while ev[EV_STAMPED] > 0 and ev_t[EV_T0 + ev[EV_HEAD]] <= until:
        _see_oldest(ev, ev_t, view)


@njit
def viewed_prefix(view, idents, max_blocks):
    """servesim's own: the longest run of leading identities the router's
    view holds cached (docs/engine.md §11)."""
    n = 0
    while n < max_blocks and view[idents[n]]:
        n += 1
    return n


def event_queue(num_identities: int, num_gpu_blocks: int, lag_ms: float):
    """The `events` tuple of a pool: with `lag_ms` > 0 a ring of
    max(4 * num_gpu_blocks, 4096) events and a view of every identity;
    otherwise None (no queue: the kernels that queue, stamp and read events
    are compiled away, see above)."""
    if not lag_ms > 0:
        return None
    cap = max(4 * num_gpu_blocks, 4096)
    ev = np.zeros(EV_HEADER + cap, dtype=np.int64)
    ev[EV_ON] = 1
    ev_t = np.zeros(EV_T0 + cap, dtype=np.float64)
    ev_t[EV_LAG] = lag_ms
    return ev, ev_t, np.zeros(max(num_identities, 1), dtype=np.uint8)


@njit(inline="always")  # once per evicted block: a call spread its arrays over ~20 stack words
def _uncache(blocks, idmap, b, events):
    """`BlockPool._maybe_evict_cached_block` (vllm/v1/core/block_pool.py):
    drop block b from its identity's list of cached blocks.

    - Its identity's other cached blocks stay cached.
    - The last one dropped: the identity is removed (`BlockRemoved`).
    """
    ident = blocks[IDENT, b]
    p = blocks[DPREV, b]
    n = blocks[DNEXT, b]
    if p == NONE:
        idmap[ident] = n
    else:
        blocks[DNEXT, p] = n
    if n != NONE:
        blocks[DPREV, n] = p
    blocks[IDENT, b] = NONE
    blocks[DPREV, b] = NONE
    blocks[DNEXT, b] = NONE
    if events is not None and idmap[ident] == NONE:
        _queue_event(events, ident, REMOVED)


@njit
def init_pool(blocks, idmap, scalars):
    """`BlockPool.__init__` (vllm/v1/core/block_pool.py): an empty pool.

    - Blocks 1..N-1 in the free queue in id order, the cache map empty.
    - The null block 0 is never free (ref count 1, never in the queue).
    """
    num_blocks = blocks.shape[1] - 2
    head = num_blocks
    tail = num_blocks + 1
    blocks[:, :] = NONE
    blocks[REF, :] = 0
    idmap[:] = NONE
    blocks[NEXT, head] = tail
    blocks[PREV, tail] = head
    for b in range(1, num_blocks):
        _queue_insert_after(blocks, blocks[PREV, tail], b)
    blocks[REF, 0] = 1  # the null block is never free
    scalars[NUM_FREE] = usable_blocks(num_blocks)


@njit
def kv_usage(scalars, num_gpu_blocks):
    """`BlockPool.get_usage` (vllm/v1/core/block_pool.py): vLLM's KV cache
    usage, 1 - free blocks / usable blocks."""
    return 1.0 - scalars[NUM_FREE] / usable_blocks(num_gpu_blocks)


@njit
def find_cached_prefix(blocks, idmap, idents, max_blocks, out):
    """`FullAttentionManager.find_longest_cache_hit`
    (vllm/v1/core/single_type_kv_cache_manager.py): the longest run of
    leading identities with a cached block.

    - Fills `out` with those blocks, the first entry of each identity
      (`BlockPool.get_cached_block`), and returns the run length.
    """
    n = 0
    for i in range(max_blocks):
        b = idmap[idents[i]]
        if b == NONE:
            break
        out[i] = b
        n += 1
    return n


@njit
def count_evictable(blocks, hit_blocks, num_hit):
    """`SingleTypeKVCacheManager.get_num_blocks_to_allocate`
    (vllm/v1/core/single_type_kv_cache_manager.py): the hit blocks nobody
    holds; touching them takes them out of the free queue, so they use free
    capacity (`KVCacheManager.allocate_slots`)."""
    n = 0
    for i in range(num_hit):
        if blocks[REF, hit_blocks[i]] == 0:
            n += 1
    return n


@njit
def allocate_slots(blocks, idmap, scalars, table, num_held, hit_blocks, num_hit,
                   num_blocks_needed, num_blocks_checked, events=None):
    """`KVCacheManager.allocate_slots` (vllm/v1/core/kv_cache_manager.py):
    give `table` `num_blocks_needed` blocks, or fail (-1) changing nothing.

    - The check: `num_blocks_checked` blocks beyond those already held and
      hit, plus the evictable hits, must fit in the free queue.
    - Touch the `num_hit` hit blocks (`BlockPool.touch`: out of the free
      queue if nobody held them, then `ref_cnt += 1`).
    - Pop the new blocks from the head of the free queue
      (`BlockPool.get_new_blocks`), evicting their cache entries.
    - Returns the new number of held blocks.
    """
    evictable = count_evictable(blocks, hit_blocks, num_hit)
    if num_blocks_checked - num_held - num_hit + evictable > scalars[NUM_FREE]:
        return -1
    num_new = num_blocks_needed - num_held - num_hit
    if num_new < 0:
        num_new = 0
    if num_new + evictable > scalars[NUM_FREE]:
        return -1
    for i in range(num_hit):
        b = hit_blocks[i]
        if blocks[REF, b] == 0:
            _queue_remove(blocks, b)
            scalars[NUM_FREE] -= 1
        blocks[REF, b] += 1
        table[num_held] = b
        num_held += 1
    head = blocks.shape[1] - 2
    for _ in range(num_new):
        b = blocks[NEXT, head]
        _queue_remove(blocks, b)
        scalars[NUM_FREE] -= 1
        if blocks[IDENT, b] != NONE:
            _uncache(blocks, idmap, b, events)
        blocks[REF, b] = 1
        table[num_held] = b
        num_held += 1
    return num_held


@njit
def cache_full_blocks(blocks, idmap, table, idents, num_cached, num_full, events=None):
    """`BlockPool.cache_full_blocks` (vllm/v1/core/block_pool.py): register
    table[num_cached:num_full] under their identities.

    - A block is appended after any block already cached with the same
      identity (a duplicate entry).
    - The first block of an identity: the identity is stored (`BlockStored`).
    """
    for i in range(num_cached, num_full):
        b = table[i]
        ident = idents[i]
        last = idmap[ident]
        blocks[IDENT, b] = ident
        blocks[DNEXT, b] = NONE
        if last == NONE:
            idmap[ident] = b
            if events is not None:
                _queue_event(events, ident, STORED)
        else:
            while blocks[DNEXT, last] != NONE:
                last = blocks[DNEXT, last]
            blocks[DNEXT, last] = b
        blocks[DPREV, b] = last


@njit
def free_blocks(blocks, scalars, table, num_held):
    """`BlockPool.free_blocks` (vllm/v1/core/block_pool.py): release a
    request's blocks, tail first (docs/engine.md §4).

    - `ref_cnt -= 1` on each block.
    - Uncached blocks that reach 0 go to the front of the free queue (the
      request's tail block ahead of its earlier ones).
    - Cached blocks that reach 0 go to the back.
    """
    head = blocks.shape[1] - 2
    tail = head + 1
    front = head
    for i in range(num_held - 1, -1, -1):
        b = table[i]
        blocks[REF, b] -= 1
        if blocks[REF, b] == 0:
            if blocks[IDENT, b] == NONE:
                _queue_insert_after(blocks, front, b)
                front = b
            else:
                _queue_insert_after(blocks, blocks[PREV, tail], b)
            scalars[NUM_FREE] += 1


class BlockPool:
    """One rank's G1 pool: the arrays the kernels above work on.

    `num_identities` bounds the dense block identities the prefix cache can
    hold (see `servesim.workload.prefix`); `kv_event_lag_ms` > 0 queues the
    pool's KV events for a router that sees them that late (`events`).
    """

    def __init__(self, config: KVCacheConfig, num_identities: int, kv_event_lag_ms: float = 0.0):
        self.config = config
        self.block_size = config.block_size
        self.num_gpu_blocks = config.num_gpu_blocks
        self.enable_caching = config.enable_prefix_caching
        self.blocks = np.empty((6, config.num_gpu_blocks + 2), dtype=np.int64)
        # int32: the cache map is as long as the workload has block identities
        self.idmap = np.empty(max(num_identities, 1), dtype=np.int32)
        self.scalars = np.zeros(1, dtype=np.int64)
        init_pool(self.blocks, self.idmap, self.scalars)
        # the KV events the router sees `kv_event_lag_ms` late (None at 0)
        self.events = event_queue(num_identities, config.num_gpu_blocks, kv_event_lag_ms)

    @property
    def num_free_blocks(self) -> int:
        return int(self.scalars[NUM_FREE])

    @property
    def usage(self) -> float:
        """vLLM's KV usage (`kv_usage`)."""
        return kv_usage(self.scalars, self.num_gpu_blocks)

    def free_queue(self) -> list:
        """The free queue head to tail (for tests and invariants)."""
        head = self.num_gpu_blocks
        out = []
        b = int(self.blocks[NEXT, head])
        while b != head + 1:
            out.append(b)
            b = int(self.blocks[NEXT, b])
        return out

    def num_cached_blocks(self) -> int:
        return int(np.count_nonzero(self.blocks[IDENT, 1:self.num_gpu_blocks] != NONE))
