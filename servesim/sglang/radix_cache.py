"""The prefix cache: a radix tree over tokens (SGLang's `RadixCache` /
`UnifiedRadixCache`; docs/sglang.md, "Radix cache").

A node holds a run of tokens (`key`) whose KV slots the tree owns. Matches
and inserts are page granular (`page_size` tokens); a match or insert that
ends inside a node splits it there. Every match and insert stamps the path it
walks with a fresh value of a logical clock (LRU). A request locks the path of
its prefix (`inc_lock_ref`); `evictable_size` counts the tree's tokens on no
locked path; `evict` removes the oldest unlocked leaves, whole nodes.

Only counts of slots are kept, not slot indices: the allocator is a count of
free slots (`TokenPool`). Keys are int64 arrays (a node's key a view of its
own copy), compared by a compiled loop (`common_prefix`).
"""

import heapq

import numpy as np

from servesim.jit import njit

_EMPTY = np.zeros(0, dtype=np.int64)


@njit
def common_prefix(a, b) -> int:
    """How many leading tokens int64 arrays `a` and `b` share."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class TreeNode:
    __slots__ = ("key", "children", "parent", "lock_ref", "last_access", "id")

    def __init__(self, key, parent, stamp, node_id):
        self.key = key
        self.children = {}
        self.parent = parent
        self.lock_ref = 0
        self.last_access = stamp
        self.id = node_id


class TokenPool:
    """The KV allocator: `max_total_tokens` slots handed out in pages of
    `page_size` (`TokenToKVPoolAllocator`, `PagedTokenToKVPoolAllocator`);
    `free` is its `available_size()`."""

    def __init__(self, size: int, page_size: int):
        self.size = size
        self.page_size = page_size
        self.free = size

    def alloc(self, n: int):
        """Take `n` slots (a multiple of page_size); the caller evicted first."""
        assert n % self.page_size == 0 and 0 <= n <= self.free, (n, self.free)
        self.free -= n

    def release(self, n: int):
        self.free += n
        assert self.free <= self.size


class RadixCache:
    """SGLang's radix tree over token ids, page granular; `disable=True` is the
    class with the radix cache disabled: no hits, no inserts, nothing evictable."""

    def __init__(self, pool: TokenPool, page_size: int, disable: bool = False):
        self.pool = pool
        self.page_size = page_size
        self.disable = disable
        self.clock = 0
        self.next_id = 1
        self.root = TreeNode(_EMPTY, None, 0, 0)
        self.root.lock_ref = 1
        self.evictable = 0
        self.protected = 0
        self.evicted_tokens = 0  # counter, read and reset by the scheduler
        self.leaves = set()  # the nodes without children (the root aside)

    # -- helpers ---------------------------------------------------------------

    def _stamp(self):
        self.clock += 1
        return self.clock

    def _child_key(self, key):
        return int(key[0]) if self.page_size == 1 else key[:self.page_size].tobytes()

    def _key_match(self, a, b) -> int:
        """Common prefix of key arrays a and b, in whole pages."""
        i = common_prefix(a, b)
        return i - i % self.page_size

    def _split_node(self, child: TreeNode, split_len: int, stamp: int) -> TreeNode:
        """Split `child` after `split_len` tokens: a new parent holds the head
        (with the child's lock count), the child keeps the tail."""
        new = TreeNode(child.key[:split_len], child.parent, stamp, self.next_id)
        self.next_id += 1
        new.lock_ref = child.lock_ref
        parent = child.parent
        parent.children[self._child_key(child.key)] = new
        child.key = child.key[split_len:]
        child.parent = new
        new.children[self._child_key(child.key)] = child
        return new

    def total_size(self) -> int:
        total, stack = 0, [self.root]
        while stack:
            node = stack.pop()
            total += len(node.key)
            stack.extend(node.children.values())
        return total

    def evictable_size(self) -> int:
        return self.evictable

    # -- match / insert ----------------------------------------------------------

    def _walk(self, key):
        """Walk `key` down from the root, stamping each node passed with one
        fresh clock value; a node the key leaves inside is split there
        (`_match_prefix_helper`, `_insert_helper`). Returns `(tokens matched,
        the node they end at)`."""
        stamp = self._stamp()
        node = self.root
        node.last_access = stamp
        matched = 0
        while matched < len(key):
            rest = key[matched:]
            child = node.children.get(self._child_key(rest))
            if child is None:
                break
            child.last_access = stamp
            n = self._key_match(child.key, rest)
            if n == 0:
                break
            matched += n
            if n < len(child.key):
                return matched, self._split_node(child, n, stamp)
            node = child
        return matched, node

    def cached_length(self, key) -> int:
        """How many leading tokens of `key` (whole pages) the tree holds, as a
        router sees it: no stamp, no split (`match_prefix` without its side
        effects)."""
        if self.disable:
            return 0
        key = np.asarray(key, dtype=np.int64)[:len(key) - len(key) % self.page_size]
        node, matched = self.root, 0
        while matched < len(key):
            rest = key[matched:]
            child = node.children.get(self._child_key(rest))
            if child is None:
                break
            n = self._key_match(child.key, rest)
            matched += n
            if n < len(child.key):
                break
            node = child
        return matched

    def match_prefix(self, key):
        """The longest cached prefix of `key` (cut to whole pages first) as
        `(length, last node)` (`match_prefix`)."""
        if self.disable:
            return 0, self.root
        return self._walk(np.asarray(key, dtype=np.int64)[:len(key) - len(key) % self.page_size])

    def insert(self, key) -> int:
        """Insert `key` (whole pages); returns how many of its leading tokens
        the tree already held (their slots are the caller's duplicates to
        free). A new leaf holds the rest, which becomes evictable (`insert`)."""
        if self.disable:
            return 0
        assert len(key) % self.page_size == 0
        key = np.asarray(key, dtype=np.int64)
        matched, node = self._walk(key)
        if matched < len(key):
            rest = key[matched:].copy()
            leaf = TreeNode(rest, node, self.clock, self.next_id)
            self.next_id += 1
            node.children[self._child_key(rest)] = leaf
            self.leaves.discard(node)
            self.leaves.add(leaf)
            self.evictable += len(rest)
        return matched

    # -- locks -------------------------------------------------------------------

    def inc_lock_ref(self, node: TreeNode):
        """Lock the path from `node` to the root: its tokens stop being evictable."""
        if self.disable:
            return
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable -= len(node.key)
                self.protected += len(node.key)
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node: TreeNode):
        if self.disable:
            return
        while node is not self.root:
            if node.lock_ref == 1:
                self.evictable += len(node.key)
                self.protected -= len(node.key)
            node.lock_ref -= 1
            assert node.lock_ref >= 0
            node = node.parent

    # -- eviction ----------------------------------------------------------------

    def evict(self, num_tokens: int):
        """Remove unlocked leaves, the least recently stamped first, whole
        nodes, until `num_tokens` tokens are freed or none is left
        (`RadixCache.evict`); a parent that becomes an unlocked leaf joins
        the candidates."""
        if self.disable or num_tokens <= 0:
            return
        heap = [(n.last_access, n.id, n) for n in self.leaves if n.lock_ref == 0]
        heapq.heapify(heap)
        evicted = 0
        while evicted < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            del parent.children[self._child_key(node.key)]
            self.leaves.discard(node)
            evicted += len(node.key)
            self.evictable -= len(node.key)
            self.pool.release(len(node.key))
            if parent is not self.root and not parent.children:
                self.leaves.add(parent)
                if parent.lock_ref == 0:
                    heapq.heappush(heap, (parent.last_access, parent.id, parent))
        self.evicted_tokens += evicted

    def evict_for(self, num_tokens: int):
        """Evict the shortfall when fewer than `num_tokens` slots are free
        (`evict_from_tree_cache`, `evict_for_alloc`)."""
        if self.pool.free < num_tokens:
            self.evict(num_tokens - self.pool.free)
