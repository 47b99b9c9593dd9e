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
  `match_prefix_helper`);
- the running batch and the waiting queue hold distinct requests, none
  finished in the waiting queue; at most one chunked request.
"""

import numpy as np

from servesim.errors import InvariantError


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
    children = tree.children()
    for r in holders:
        node, depth, keys = r.last_node, 0, []
        while node is not None and node != tree.root:
            parent = tree.parent(node)
            if node not in children.get(parent, ()):
                fail("the request's locked prefix is no longer in the tree", r)
            locks[node] = locks.get(node, 0) + 1
            depth += tree.key_len(node)
            keys.append(tree.key(node))
            node = parent
        if not tree.disable and depth != r.tree_len:
            fail(f"the locked prefix is {depth} tokens deep, tree_len {r.tree_len}", r)
        if not tree.disable and keys and not np.array_equal(np.concatenate(keys[::-1]),
                                                            r.fill_prefix(r.tree_len)):
            fail("the locked prefix's tokens are not the request's first tree_len tokens", r)
    unlocked, total_in_tree, stack = 0, 0, [tree.root]
    while stack:
        node = stack.pop()
        stack.extend(children.get(node, ()))
        if node == tree.root:
            continue
        total_in_tree += tree.key_len(node)
        if tree.lock_ref(node) < locks.get(node, 0):
            fail(f"a node locked {tree.lock_ref(node)} times is on {locks[node]} holders' paths")
        if tree.lock_ref(node) == 0:
            unlocked += tree.key_len(node)
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
