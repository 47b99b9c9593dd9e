"""The SGLang engine's compiled path (docs/sglang.md, "The compiled path"):
the radix tree over node arrays and its kernels (splits, the edge table's
growth, LRU eviction with its tie-break, the token store's compaction), and
the request table's `append_outputs`. The timelines of tests/test_sglang_rules.py
and the recordings check the same rules end to end."""

import numpy as np

from servesim.sglang.radix_cache import PARENT, RadixCache, TokenPool
from servesim.sglang.req import (
    APPENDED,
    DONE,
    DROPPED_AT,
    NUM_OUTPUTS,
    REACHED_STOP,
    SKIPPED,
    Req,
    ReqTable,
)


def tree(size=10_000, page=2):
    pool = TokenPool(size, page)
    return RadixCache(pool, page), pool


def key(*tokens):
    return np.array(tokens, dtype=np.int64)


def test_a_match_inside_a_node_splits_it_and_both_halves_keep_their_tokens():
    t, _ = tree()
    assert t.insert(key(1, 2, 3, 4, 5, 6))[0] == 0
    assert t.total_size() == 6 and t.evictable_size() == 6
    # (1, 2, 3, 4, 9, 9) shares two pages: a split after 4 tokens
    assert t.insert(key(1, 2, 3, 4, 9, 9))[0] == 4
    assert t.total_size() == 8
    assert t.match_prefix(key(1, 2, 3, 4, 5, 6))[0] == 6
    assert t.match_prefix(key(1, 2, 3, 4, 9, 9, 7))[0] == 6  # (cut to whole pages)
    assert t.match_prefix(key(1, 2, 3, 5))[0] == 2  # a page boundary inside the head
    assert t.cached_length(key(1, 2, 3, 4, 5)) == 4
    reached = t.reachable() == 1
    assert reached.sum() == 4 and (t.nodes[PARENT, :len(reached)][reached] == t.root).sum() == 1


def test_locks_take_a_path_out_of_the_evictable_tokens_and_eviction_spares_it():
    t, pool = tree(size=100)
    pool.alloc(12)  # (the slots the inserted keys came from)
    t.insert(key(1, 2, 3, 4))
    t.insert(key(5, 6, 7, 8))
    t.insert(key(9, 9, 8, 8))
    _, node = t.match_prefix(key(5, 6, 7, 8))
    t.inc_lock_ref(node)
    assert t.evictable_size() == 8
    t.evict(100)
    assert t.total_size() == 4 and pool.free == 96
    assert t.cached_length(key(5, 6, 7, 8)) == 4 and t.cached_length(key(1, 2, 3, 4)) == 0
    t.dec_lock_ref(node)
    assert t.evictable_size() == 4


def test_eviction_takes_the_least_recently_stamped_leaf_first_then_its_parent():
    t, pool = tree(size=1000)
    pool.alloc(8)  # (the tokens the three inserts add)
    t.insert(key(1, 1, 2, 2))  # leaf a
    t.insert(key(1, 1, 3, 3))  # splits a: (1, 1) with leaves (2, 2) and (3, 3)
    t.insert(key(7, 7))        # leaf c
    t.match_prefix(key(1, 1, 2, 2))  # a's path is the most recent
    t.evict(2)  # the oldest leaf: (3, 3)
    assert t.cached_length(key(1, 1, 3, 3)) == 2 and t.cached_length(key(7, 7)) == 2
    t.evict(2)  # then c, stamped before the match
    assert t.cached_length(key(7, 7)) == 0
    t.evict(4)  # a's leaf, then (1, 1), a leaf now
    assert t.total_size() == 0 and t.evictable_size() == 0 and pool.free == 1000


def test_many_children_grow_the_edge_table_and_evicted_keys_leave_the_store():
    t, pool = tree(size=1 << 20)
    for round_ in range(6):
        keys = [key(round_ * 10_000 + i, i, 5, 6) for i in range(300)]
        for k in keys:
            pool.alloc(4)
            t.insert(k)
        assert all(t.cached_length(k) == 4 for k in keys)
        reached = t.reachable() == 1
        assert (t.nodes[PARENT, :len(reached)][reached] == t.root).sum() == 300
        t.evict(1 << 20)
        assert t.total_size() == 0 and all(t.cached_length(k) == 0 for k in keys)
    # rows of evicted nodes are reused; the store holds about what is live
    assert t.nodes.shape[1] <= 1024 and len(t.tokens) <= 16 * 300 * 4


def test_append_outputs_skips_finished_rows_and_tokens_dropped_from_that_pass():
    table = ReqTable()
    reqs = [Req(i, f"r{i}", 0.0, [1, 2, 3], m, 0, False) for i, m in enumerate([1, 5, 5])]
    for r in reqs:
        table.adopt(r)
    table.cols[DROPPED_AT, 2] = 7  # r2 retracted while pass 7 ran
    slots = np.arange(3, dtype=np.int64)
    status = table.append_outputs(slots, 10.0, 7)[:3].tolist()
    assert status == [REACHED_STOP, APPENDED, SKIPPED]
    assert reqs[0].check_finished() and table.cols[DONE, 0] == 1
    status = table.append_outputs(slots, 12.0, 8)[:3].tolist()
    assert status == [SKIPPED, APPENDED, APPENDED]
    assert table.cols[NUM_OUTPUTS].tolist()[:3] == [1, 2, 1]
    assert reqs[1].fill_len == 5 and list(reqs[1].token_ms) == [10.0, 12.0]
    assert list(reqs[2].token_ms) == [12.0]
