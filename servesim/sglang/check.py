"""The debug mode's invariant check under `backend: sglang` (`servesim run
--check`, `SERVESIM_CHECK=1`; docs/sglang.md, "Debugging"): after every
scheduling step and every processed result, one worker's state is checked
against what SGLang's allocator, radix cache and scheduler keep true. A
violation raises :class:`~servesim.errors.InvariantError` naming the pass,
the request and the invariant: a bug in servesim, never bad input.

The invariants:
- slots conserved: free slots + the tree's tokens + every row holder's own
  slots (`ceil_page(seq_len) - tree_len`, never negative) = `max_total_tokens`;
- request rows: the rows in use are the requests holding one, at most the
  worker's slots (`min(max_running_requests, max_total_tokens // 2)`);
- the tree's evictable count is the tokens of its nodes on no locked path;
  each node's lock count is at least the number of holders whose locked
  path passes through it, and a holder's locked path is still in the tree,
  whole, `tree_len` tokens deep, spelling its first `tree_len` tokens (the
  compiled walks pass it without comparing: radix_cache.py's
  `match_prefix_helper`; compared when the holder's prefix changes or the
  token store is compacted, as a locked path's tokens change only then);
  the tree's token count is its nodes';
- the running batch and the waiting queue hold distinct requests, none
  finished in the waiting queue; at most one chunked request.
"""

import numpy as np

from servesim.errors import InvariantError
from servesim.sglang.radix_cache import KEY_LEN, LOCK_REF, PARENT


def check_scheduler(s, where: str):
    """Check worker `s` (a Scheduler) after `where` ("schedule" or "result");
    raise InvariantError on the first broken invariant."""
    passes = s.num_passes

    def fail(invariant, req=None):
        who = f", request {req.rid}" if req is not None else ""
        raise InvariantError(f"SGLang invariant violated after {where} (pass {passes}{who}): "
                             f"{invariant}")

    tree = s.tree
    holders = [r for r in s.reqs if r.has_row]
    own = 0
    for r in holders:
        mine = s.ceil_page(r.seq_len) - r.tree_len
        if mine < 0:
            fail(f"the request owns {mine} slots (seq_len {r.seq_len}, tree_len {r.tree_len})", r)
        own += mine
    total = tree.total_size()
    if s.pool.free + total + own != s.pool.size:
        fail(f"slots not conserved: {s.pool.free} free + {total} in the tree + {own} owned by "
             f"requests != {s.pool.size}")
    if s.rows_used != len(holders) or s.rows_used > s.max_num_reqs:
        fail(f"{s.rows_used} request rows in use, {len(holders)} holders, {s.max_num_reqs} rows")
    locks = {}
    reach = tree.reachable()
    parents = tree.nodes[PARENT, :len(reach)].tolist()
    key_len = tree.nodes[KEY_LEN, :len(reach)].tolist()
    lock_ref = tree.nodes[LOCK_REF, :len(reach)].tolist()
    reached = reach.tolist()
    # the holders' prefixes whose tokens were compared, as (node, tree_len, store):
    # a locked path's tokens change only if the store is compacted
    compared = s.__dict__.setdefault("_checked_prefixes", {})
    for r in holders:
        node, depth, path = r.last_node, 0, []
        while node is not None and node != tree.root:
            if not reached[node]:
                fail("the request's locked prefix is no longer in the tree", r)
            locks[node] = locks.get(node, 0) + 1
            depth += key_len[node]
            path.append(node)
            node = parents[node]
        if not tree.disable and depth != r.tree_len:
            fail(f"the locked prefix is {depth} tokens deep, tree_len {r.tree_len}", r)
        seen_as = (r.last_node, r.tree_len, id(tree.tokens))
        if not tree.disable and path and compared.get(id(r)) != seen_as:
            if not np.array_equal(np.concatenate([tree.key(n) for n in path[::-1]]),
                                  r.fill_prefix(r.tree_len)):
                fail("the locked prefix's tokens are not the request's first tree_len tokens", r)
            compared[id(r)] = seen_as
    for node, count in locks.items():
        if lock_ref[node] < count:
            fail(f"a node locked {lock_ref[node]} times is on {count} holders' paths")
    in_tree = reach.astype(bool)
    key_lens = tree.nodes[KEY_LEN, :len(reach)]
    total_in_tree = int(key_lens[in_tree].sum())
    unlocked = int(key_lens[in_tree & (tree.nodes[LOCK_REF, :len(reach)] == 0)].sum())
    if total_in_tree != total:
        fail(f"the tree's nodes hold {total_in_tree} tokens, its count says {total}")
    if tree.evictable_size() != unlocked:
        fail(f"evictable count {tree.evictable_size()} != {unlocked} unlocked tokens in the tree")
    seen = set()
    for r in s.running + s.waiting:
        if id(r) in seen:
            fail("the request is twice in the running batch and the waiting queue", r)
        seen.add(id(r))
    for r in s.waiting:
        if r.finished:
            fail("a finished request is waiting", r)
