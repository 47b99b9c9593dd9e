"""Property-based tests of the G1 block pool and the KV cache manager
(docs/engine.md §4-6), as a Hypothesis state machine.

One small pool (4..24 blocks of 1, 2, 4 or 16 tokens) serves fake requests that
are admitted (prefix lookup + allocation with the hits, with or without the
`reserve_full_isl` / watermark checks), grown (chunks, decodes, one async
placeholder ahead), sampled, finished and preempted. After every step the pool
must satisfy its invariants, and it must equal a plain-Python reference model
of the spec's rules (free queue order, ref counts, cache map entries, the
block ids each request holds).
"""

import numpy as np
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from servesim.kvcache import block_pool as bp
from servesim.kvcache.block_pool import BlockPool
from servesim.kvcache.config import KVCacheConfig

NUM_IDENTITIES = 8192  # far more than a run of the machine can create
MAX_WAITING = 5


class PoolDriver:
    """The test's driver of the block pool's kernels (servesim/kvcache/
    block_pool.py) for one request object, as the scheduler calls them
    (servesim/scheduler/kv_cache_manager.py `_allocate`, `cache_blocks`, `_free`, and the
    lookup of `_schedule_waiting`): `get_computed_blocks`, `allocate_slots`
    (registering the full blocks within the known tokens at once) and
    `free`."""

    def __init__(self, pool: BlockPool):
        self.pool = pool
        self.block_size = pool.block_size
        self.enable_caching = pool.enable_caching

    def get_computed_blocks(self, request):
        """`(hit_blocks, num_hit_tokens)`: the cached leading blocks, never
        covering the last token."""
        if not self.enable_caching:
            return np.zeros(0, dtype=np.int64), 0
        max_blocks = (request.num_tokens - 1) // self.block_size
        hits = np.zeros(max_blocks, dtype=np.int64)
        pool = self.pool
        num_hit = bp.find_cached_prefix(pool.blocks, pool.idmap, request.idents,
                                        max_blocks, hits)
        return hits[:num_hit].copy(), num_hit * self.block_size

    def allocate_slots(self, request, num_new_tokens, hit_blocks, num_hit_tokens=0,
                       reserve_tokens=0, extra_blocks=0) -> bool:
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
        if len(hit_blocks):
            request.num_cached_blocks = len(hit_blocks)
        if self.enable_caching:
            num_full = min(total, request.num_tokens) // bs
            if num_full > request.num_cached_blocks:
                bp.cache_full_blocks(pool.blocks, pool.idmap, request.block_table,
                                     request.idents, request.num_cached_blocks, num_full)
                request.num_cached_blocks = num_full
        return True

    def free(self, request):
        bp.free_blocks(self.pool.blocks, self.pool.scalars, request.block_table,
                       request.num_blocks)
        request.num_blocks = 0
        request.num_cached_blocks = 0


def ceil_div(a, b):
    return -(-a // b)


class FakeRequest:
    """The attributes PoolDriver needs, plus the test's bookkeeping.

    `max_len` is the most tokens the request may ever have (prompt plus
    output); `idents` covers exactly its `ceil(max_len / block_size)` blocks.
    """

    def __init__(self, name, idents, num_prompt_tokens, max_len):
        self.name = name
        self.idents = idents
        self.block_table = np.zeros(len(idents), dtype=np.int64)
        self.num_blocks = 0
        self.num_cached_blocks = 0
        self.num_tokens = num_prompt_tokens
        self.num_computed_tokens = 0
        self.max_len = max_len
        self.model_table = []  # the reference model's view of its blocks
        self.model_cached = []  # ... and of its registered ones

    def state(self):
        return (self.block_table.copy(), self.num_blocks, self.num_cached_blocks,
                self.num_tokens, self.num_computed_tokens)

    def __repr__(self):
        return (f"FakeRequest({self.name}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens}, max_len={self.max_len}, "
                f"blocks={self.block_table[:self.num_blocks].tolist()})")


class ReferenceModel:
    """The spec's pool rules in plain Python (docs/engine.md §4-5): the free
    queue as a list (head first), ref counts, each block's identity and the
    cache map identity -> its cached blocks, first entry first."""

    def __init__(self, num_gpu_blocks):
        self.queue = list(range(1, num_gpu_blocks))
        self.ref = [0] * num_gpu_blocks
        self.ref[0] = 1
        self.ident = [None] * num_gpu_blocks
        self.cache = {}

    def lookup(self, idents, max_blocks):
        hits = []
        for i in range(max_blocks):
            entries = self.cache.get(int(idents[i]))
            if not entries:
                break
            hits.append(entries[0])
        return hits

    def fits(self, num_held, hits, needed, checked):
        evictable = sum(1 for b in hits if self.ref[b] == 0)
        free = len(self.queue)
        num_new = max(needed - num_held - len(hits), 0)
        return (checked - num_held - len(hits) + evictable <= free
                and num_new + evictable <= free)

    def allocate(self, table, hits, needed):
        for b in hits:
            if self.ref[b] == 0:
                self.queue.remove(b)
            self.ref[b] += 1
            table.append(b)
        for _ in range(max(needed - len(table), 0)):
            b = self.queue.pop(0)
            if self.ident[b] is not None:
                event("cached block evicted")
                self.cache[self.ident[b]].remove(b)
                self.ident[b] = None
            self.ref[b] = 1
            table.append(b)

    def register(self, table, idents, start, stop):
        for i in range(start, stop):
            b = table[i]
            ident = int(idents[i])
            if self.cache.get(ident):
                event("duplicate cached block")
            self.ident[b] = ident
            self.cache.setdefault(ident, []).append(b)

    def free(self, table):
        """Tail first; an uncached block reaching 0 goes to the front (the
        request's tail block ahead of its earlier ones, block_pool.py), a
        cached one to the back."""
        front = 0
        for b in reversed(table):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                if self.ident[b] is None:
                    self.queue.insert(front, b)
                    front += 1
                else:
                    self.queue.append(b)
        table.clear()


class BlockPoolMachine(RuleBasedStateMachine):
    """Fake requests through one PoolDriver, checked after every step."""

    def __init__(self):
        super().__init__()
        self.waiting = []  # new or preempted: computed == 0, no blocks
        self.running = []  # holding blocks
        self.chains = {}  # tuple of prompt-block symbols -> identity
        self.next_ident = 0
        self.next_name = 0

    # -- setup -----------------------------------------------------------------

    @initialize(num_gpu_blocks=st.integers(4, 24), block_size=st.sampled_from([1, 2, 4, 16]),
                caching=st.booleans())
    def make_pool(self, num_gpu_blocks, block_size, caching):
        config = KVCacheConfig(block_size=block_size, num_gpu_blocks=num_gpu_blocks,
                               enable_prefix_caching=caching)
        self.pool = BlockPool(config, NUM_IDENTITIES)
        self.kv = PoolDriver(self.pool)
        self.bs = block_size
        self.n = num_gpu_blocks
        self.model = ReferenceModel(num_gpu_blocks)

    # -- helpers ---------------------------------------------------------------

    def _identity(self, key):
        if key not in self.chains:
            self.chains[key] = self.next_ident
            self.next_ident += 1
        return self.chains[key]

    def _snapshot(self, request):
        pool = self.pool
        return (pool.blocks.copy(), pool.idmap.copy(), pool.scalars.copy(), request.state())

    def _assert_unchanged(self, before, request):
        blocks, idmap, scalars, state = before
        assert np.array_equal(self.pool.blocks, blocks), "failed allocation changed the pool"
        assert np.array_equal(self.pool.idmap, idmap), "failed allocation changed the cache map"
        assert np.array_equal(self.pool.scalars, scalars), "failed allocation changed NUM_FREE"
        after = request.state()
        assert np.array_equal(after[0], state[0]) and after[1:] == state[1:], (
            "failed allocation changed the request")

    def _register_in_model(self, request, total):
        """Mirror the manager: full blocks up to the known tokens are cached."""
        if not self.pool.enable_caching:
            return
        num_full = min(total, request.num_tokens) // self.bs
        start = len(request.model_cached)
        if num_full > start:
            self.model.register(request.model_table, request.idents, start, num_full)
            request.model_cached = request.model_table[:num_full]

    def _allocate(self, request, num_new, hits=(), hit_tokens=0, reserve=0, extra=0):
        """allocate_slots on the real manager and the model; returns success."""
        total = request.num_computed_tokens + hit_tokens + num_new
        needed = ceil_div(total, self.bs)
        checked = max(needed, ceil_div(reserve, self.bs)) + extra
        assert needed <= len(request.idents)
        expected = self.model.fits(len(request.model_table), list(hits), needed, checked)
        before = self._snapshot(request)
        ok = self.kv.allocate_slots(request, num_new, np.asarray(hits, dtype=np.int64),
                                    hit_tokens, reserve, extra)
        assert ok == expected, f"allocate_slots returned {ok}, the spec says {expected}"
        event("allocation " + ("succeeded" if ok else "failed"))
        if hits:
            event("prefix hit")
        if any(self.model.ref[b] == 0 for b in hits):
            event("hit on a free cached block")
        if not ok:
            self._assert_unchanged(before, request)
            return False
        if hits:
            request.model_cached = list(hits)
        self.model.allocate(request.model_table, list(hits), needed)
        self._register_in_model(request, total)
        assert request.num_blocks == needed
        return True

    # -- rules -----------------------------------------------------------------

    @rule(data=st.data())
    def new_request(self, data):
        """A request whose full prompt blocks are chains over a 2-letter
        alphabet (so prefixes are often shared); its partial prompt block and
        output blocks are unique to it. (With MAX_WAITING waiting, the oldest
        one, holding no blocks, is dropped.)"""
        if len(self.waiting) >= MAX_WAITING:
            self.waiting.pop(0)
        bs = self.bs
        prompt = data.draw(st.integers(1, 10 * bs + 3), label="prompt_tokens")
        output = data.draw(st.integers(0, 4 * bs), label="output_tokens")
        max_len = prompt + output
        num_full_prompt = prompt // bs
        symbols = data.draw(st.lists(st.integers(0, 1), min_size=num_full_prompt,
                                     max_size=num_full_prompt), label="prompt_blocks")
        name = f"r{self.next_name}"
        self.next_name += 1
        idents = []
        for i in range(ceil_div(max_len, bs)):
            if i < num_full_prompt:
                idents.append(self._identity(tuple(symbols[:i + 1])))
            else:
                idents.append(self._identity((name, i)))
        assert self.next_ident < NUM_IDENTITIES
        self.waiting.append(FakeRequest(name, np.array(idents, dtype=np.int64), prompt, max_len))

    @rule(data=st.data())
    def admit(self, data):
        """get_computed_blocks + allocate_slots with the hits (§3 waiting loop)."""
        if not self.waiting:
            self.new_request(data)
        request = data.draw(st.sampled_from(self.waiting), label="request")
        hit_blocks, hit = self.kv.get_computed_blocks(request)
        num_hit = len(hit_blocks)
        self._check_lookup(request, hit_blocks, hit)
        num_new = data.draw(st.integers(1, request.num_tokens - hit), label="chunk")
        reserve = request.num_tokens if data.draw(st.booleans(), label="reserve_full_isl") else 0
        extra = data.draw(st.integers(0, 2), label="watermark_blocks")
        if self._allocate(request, num_new, list(hit_blocks), hit, reserve, extra):
            assert request.num_cached_blocks >= min(num_hit, request.num_blocks)
            request.num_computed_tokens = hit + num_new
            self.waiting.remove(request)
            self.running.append(request)

    # Rules below are no-ops when nothing qualifies (rather than preconditions,
    # which make Hypothesis abort many runs while it retries disabled rules).

    @rule(data=st.data())
    def grow(self, data):
        """A running request is scheduled for more tokens: a prefill chunk, a
        decode, or one token beyond its known ones (an async placeholder)."""
        if not any(self._room(r) for r in self.running):
            return
        request = data.draw(st.sampled_from([r for r in self.running if self._room(r)]),
                            label="request")
        limit = min(request.max_len, request.num_tokens + 1) - request.num_computed_tokens
        num_new = data.draw(st.integers(1, limit), label="tokens")
        if self._allocate(request, num_new):
            request.num_computed_tokens += num_new

    @rule(data=st.data())
    def sample(self, data):
        """A pass's output lands: the request has one more known token."""
        if not any(self._can_sample(r) for r in self.running):
            return
        request = data.draw(st.sampled_from([r for r in self.running if self._can_sample(r)]),
                            label="request")
        request.num_tokens += 1

    @rule(data=st.data(), preempt=st.booleans())
    def free(self, data, preempt):
        """Finish (drop) or preempt (back to waiting, computed = 0) a request."""
        if not self.running:
            return
        request = data.draw(st.sampled_from(self.running), label="request")
        self.kv.free(request)
        self.model.free(request.model_table)
        request.model_cached = []
        assert request.num_blocks == 0 and request.num_cached_blocks == 0
        self.running.remove(request)
        if preempt and len(self.waiting) < MAX_WAITING:
            request.num_computed_tokens = 0
            self.waiting.append(request)

    @staticmethod
    def _room(request):
        return request.num_computed_tokens < min(request.max_len, request.num_tokens + 1)

    @staticmethod
    def _can_sample(request):
        return (request.num_computed_tokens >= request.num_tokens
                and request.num_tokens < request.max_len)

    def _check_lookup(self, request, hit_blocks, hit):
        """A hit never covers the last token, never returns a block whose
        identity differs from the request's at that position, and is the
        first entry of the longest cached run (§5)."""
        pool = self.pool
        num_hit = len(hit_blocks)
        assert hit == num_hit * self.bs
        assert num_hit <= (request.num_tokens - 1) // self.bs
        for i, b in enumerate(hit_blocks):
            assert b != 0, "lookup returned the null block"
            assert pool.blocks[bp.IDENT, b] == request.idents[i], (
                f"lookup returned block {b} with identity {pool.blocks[bp.IDENT, b]} "
                f"at position {i}, where the request has {request.idents[i]}")
        if pool.enable_caching:
            expected = self.model.lookup(request.idents, (request.num_tokens - 1) // self.bs)
        else:
            expected = []
        assert list(hit_blocks) == expected

    # -- invariants ------------------------------------------------------------

    def _holders(self):
        counts = np.zeros(self.n, dtype=np.int64)
        for r in self.running:
            for b in r.block_table[:r.num_blocks]:
                counts[b] += 1
        return counts

    @invariant()
    def blocks_are_conserved(self):
        pool = self.pool
        queue = pool.free_queue()
        in_use = int(np.count_nonzero(pool.blocks[bp.REF, 1:self.n] > 0))
        assert len(queue) == pool.num_free_blocks == self.n - 1 - in_use
        held = {int(b) for r in self.running for b in r.block_table[:r.num_blocks]}
        assert pool.num_free_blocks + len(held) == self.n - 1
        for r in self.waiting:
            assert r.num_blocks == 0 and r.num_computed_tokens == 0

    @invariant()
    def null_block_is_never_used(self):
        pool = self.pool
        assert 0 not in pool.free_queue()
        assert pool.blocks[bp.REF, 0] == 1
        assert pool.blocks[bp.IDENT, 0] == bp.NONE
        for r in self.running:
            assert 0 not in r.block_table[:r.num_blocks].tolist()

    @invariant()
    def ref_count_equals_holders(self):
        refs = self.pool.blocks[bp.REF, 1:self.n]
        assert refs.tolist() == self._holders()[1:].tolist()
        for r in self.running:
            table = r.block_table[:r.num_blocks].tolist()
            assert len(set(table)) == len(table), f"{r} holds a block twice"
            assert r.num_blocks == ceil_div(r.num_computed_tokens, self.bs)

    @invariant()
    def free_queue_is_exactly_the_unreferenced_blocks(self):
        pool = self.pool
        queue = pool.free_queue()
        assert len(set(queue)) == len(queue), "a block is twice in the free queue"
        unreferenced = [b for b in range(1, self.n) if pool.blocks[bp.REF, b] == 0]
        assert sorted(queue) == unreferenced
        # the doubly linked list read backwards is the same queue
        head, tail = self.n, self.n + 1
        backwards = []
        b = int(pool.blocks[bp.PREV, tail])
        while b != head:
            backwards.append(b)
            b = int(pool.blocks[bp.PREV, b])
        assert backwards[::-1] == queue
        for b in range(self.n):
            if b not in queue:
                assert pool.blocks[bp.PREV, b] == bp.NONE and pool.blocks[bp.NEXT, b] == bp.NONE

    @invariant()
    def cache_map_is_consistent(self):
        """Every cached block is on its identity's list exactly once; every
        list entry carries that identity; DPREV/DNEXT agree along the list
        that `idmap[identity]` heads."""
        pool = self.pool
        blocks, idmap = pool.blocks, pool.idmap
        cached = {b for b in range(1, self.n) if blocks[bp.IDENT, b] != bp.NONE}
        if not pool.enable_caching:
            assert not cached
        seen = set()
        for ident in np.flatnonzero(idmap != bp.NONE):
            entries = []
            prev = bp.NONE
            b = int(idmap[ident])
            while b != bp.NONE:
                assert blocks[bp.IDENT, b] == ident, f"block {b} on the list of identity {ident}"
                assert blocks[bp.DPREV, b] == prev
                entries.append(b)
                prev, b = b, int(blocks[bp.DNEXT, b])
            assert not seen.intersection(entries)
            seen.update(entries)
        assert seen == cached
        for b in range(self.n):
            if b not in cached:
                assert blocks[bp.DPREV, b] == bp.NONE and blocks[bp.DNEXT, b] == bp.NONE
        # a request's registered blocks carry its identities
        for r in self.running:
            assert r.num_cached_blocks <= r.num_blocks
            for i in range(r.num_cached_blocks):
                b = r.block_table[i]
                if blocks[bp.IDENT, b] != bp.NONE:
                    assert blocks[bp.IDENT, b] == r.idents[i]

    @invariant()
    def held_registered_blocks_stay_cached(self):
        """A block with ref_cnt > 0 is never evicted: every registered block a
        running request holds is still in the cache under its identity."""
        if not self.pool.enable_caching:
            return
        blocks = self.pool.blocks
        for r in self.running:
            for i in range(r.num_cached_blocks):
                assert blocks[bp.IDENT, r.block_table[i]] == r.idents[i]

    @invariant()
    def lookups_of_waiting_requests_match_their_identities(self):
        for r in self.waiting:
            hit_blocks, hit = self.kv.get_computed_blocks(r)
            self._check_lookup(r, hit_blocks, hit)

    @invariant()
    def pool_equals_reference_model(self):
        pool, model = self.pool, self.model
        assert pool.free_queue() == model.queue
        assert pool.blocks[bp.REF, :self.n].tolist() == model.ref
        idents = [None if x == bp.NONE else int(x) for x in pool.blocks[bp.IDENT, :self.n]]
        assert idents == model.ident
        for ident, entries in model.cache.items():
            first = int(pool.idmap[ident])
            assert first == (entries[0] if entries else bp.NONE)
        for r in self.running:
            assert r.block_table[:r.num_blocks].tolist() == r.model_table
            assert r.num_cached_blocks == len(r.model_cached)


BlockPoolMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
test_block_pool_invariants_hold_after_every_step = BlockPoolMachine.TestCase
