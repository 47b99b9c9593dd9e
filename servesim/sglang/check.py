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
  whole, `tree_len` tokens deep;
- the running batch and the waiting queue hold distinct requests, none
  finished in the waiting queue; at most one chunked request.
"""

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
    for r in holders:
        node, depth = r.last_node, 0
        while node is not None and node is not tree.root:
            if node.parent is None or node.parent.children.get(tree._child_key(node.key)) is not node:
                fail("the request's locked prefix is no longer in the tree", r)
            locks[id(node)] = locks.get(id(node), 0) + 1
            depth += len(node.key)
            node = node.parent
        if not tree.disable and depth != r.tree_len:
            fail(f"the locked prefix is {depth} tokens deep, tree_len {r.tree_len}", r)
    unlocked, stack = 0, [tree.root]
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        if node is tree.root:
            continue
        if node.lock_ref < locks.get(id(node), 0):
            fail(f"a node locked {node.lock_ref} times is on {locks[id(node)]} holders' paths")
        if node.lock_ref == 0:
            unlocked += len(node.key)
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
