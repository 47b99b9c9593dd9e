"""The prefix cache: a radix tree over tokens (SGLang's `RadixCache` /
`UnifiedRadixCache`; docs/sglang.md, "The radix tree").

A node holds a run of tokens (its key) whose KV slots the tree owns. Matches
and inserts are page granular (`page_size` tokens); a match or insert that
ends inside a node splits it there. Every match and insert stamps the path it
walks with a fresh value of a logical clock (LRU). A request locks the path of
its prefix (`inc_lock_ref`); `evictable_size` counts the tree's tokens on no
locked path; `evict` removes the oldest unlocked leaves, whole nodes.

Only counts of slots are kept, not slot indices: the allocator is a count of
free slots (`TokenPool`).

The tree is arrays (docs/sglang.md, "The compiled path"): `nodes[field,
node]` (int64) holds each node's parent, number of children, lock count,
last stamp, whether it is in the tree, and where its key is in the token
store `tokens` (`KEY_START`, `KEY_LEN`); `edges` is an open-addressing hash
table of the nodes by (parent, first token), SGLang's `children[child_key]`;
`meta` the tree's counters.
Node 0 is the root; an evicted node's row is reused (`NODE_ID` is SGLang's
node id, in creation order, eviction's tie-break); a split keeps both
halves' keys where they are in the store. The rules are kernels over them
(`match_prefix_helper`, `insert_helper`, `inc_lock_ref`, `dec_lock_ref`,
`evict`); `RadixCache` holds the arrays and grows them.
"""

import numpy as np

from servesim.jit import Entry, njit

# the fields of `nodes`
PARENT, NUM_CHILDREN, LOCK_REF, LAST_ACCESS, ALIVE, KEY_START, KEY_LEN, NODE_ID = range(8)
NUM_FIELDS = 8
# the counters in `meta`
(CLOCK, NUM_NODES, STORE_LEN, EVICTABLE, PROTECTED, PAGE_SIZE, LIVE_TOKENS, NEXT_ID,
 FREE_NODE, EDGES_USED, ROOM_LOW) = range(11)
NUM_META = 11
EMPTY, GONE = -1, -2  # `edges` entries that hold no node
ROOT = 0


@njit
def common_prefix(a, b) -> int:
    """How many leading tokens int64 arrays `a` and `b` share."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


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


def _key(key):
    """`key` as the kernels take it: a writeable C-contiguous int64 array."""
    key = np.asarray(key, dtype=np.int64)
    if not (key.flags.c_contiguous and key.flags.writeable):
        key = key.copy()
    return key


class RadixCache:
    """SGLang's radix tree over token ids, page granular; `disable=True` is the
    class with the radix cache disabled: no hits, no inserts, nothing evictable.
    Nodes are numbers (the root is `root`, 0)."""

    root = ROOT

    def __init__(self, pool: TokenPool, page_size: int, disable: bool = False):
        self.pool = pool
        self.page_size = page_size
        self.disable = disable
        self.nodes = np.zeros((NUM_FIELDS, 64), dtype=np.int64)
        self.nodes[PARENT, ROOT] = -1
        self.nodes[LOCK_REF, ROOT] = 1
        self.nodes[ALIVE, ROOT] = 1
        self.tokens = np.zeros(1024, dtype=np.int64)
        self._spare = None  # the store compaction copies into next
        self.meta = np.zeros(NUM_META, dtype=np.int64)
        self.meta[NUM_NODES] = 1
        self.meta[NEXT_ID] = 1
        self.meta[FREE_NODE] = -1
        self.meta[PAGE_SIZE] = page_size
        self.edges = np.full(128, EMPTY, dtype=np.int64)
        self.heap = np.zeros(64, dtype=np.int64)  # `evict`'s candidates
        self.evicted_tokens = 0  # counter, read and reset by the scheduler

    # -- the arrays' room --------------------------------------------------------

    def _room(self, new_tokens: int):
        """Room for two more rows (a split and a leaf), three more edges and
        `new_tokens` more key tokens in the store (after it, until a kernel
        sets `ROOM_LOW`, a match has its room); a full store drops the keys
        of evicted nodes first (`compact_tokens`), and grows (to four times
        what it must hold) when that would leave it over half full; the
        edges are rehashed (`rehash_edges`) when over half the table is or
        was in use."""
        _, n, store_len, _, _, _, live, _, _, used, _ = self.meta.tolist()
        if n + 2 > self.nodes.shape[1]:
            nodes = np.zeros((NUM_FIELDS, 2 * self.nodes.shape[1]), dtype=np.int64)
            nodes[:, :n] = self.nodes[:, :n]
            self.nodes = nodes
        if 2 * (used + 3) > len(self.edges):
            size = len(self.edges)
            while 4 * (n + 3) > size:  # (the nodes at most half of the new table)
                size *= 2
            self.edges = np.full(size, EMPTY, dtype=np.int64)
            _REHASH(self.nodes, self.tokens, self.meta, self.edges)
        if store_len + new_tokens > len(self.tokens):
            size = len(self.tokens)
            if 2 * (live + new_tokens) > size:
                size = max(2 * size, 4 * (live + new_tokens))
            spare = self._spare  # (the last store: its pages are in memory already)
            if spare is None or len(spare) != size:
                spare = np.zeros(size, dtype=np.int64)
            _COMPACT(self.nodes, self.tokens, self.meta, spare)
            self.tokens, self._spare = spare, (self.tokens if len(self.tokens) == size else None)
        self.meta[ROOM_LOW] = 0

    # -- sizes -------------------------------------------------------------------

    def total_size(self) -> int:
        return int(self.meta[LIVE_TOKENS])

    def evictable_size(self) -> int:
        return int(self.meta[EVICTABLE])

    # -- match / insert ----------------------------------------------------------

    def cached_length(self, key) -> int:
        """How many leading tokens of `key` (whole pages) the tree holds, as a
        router sees it: no stamp, no split (`match_prefix` without its side
        effects)."""
        if self.disable:
            return 0
        key = _key(key)
        key = key[:len(key) - len(key) % self.page_size]
        return int(_MATCH(self.nodes, self.tokens, self.meta, self.edges, key, False, -1, 0)[0])

    def match_prefix(self, key, held=None):
        """The longest cached prefix of `key` (cut to whole pages first) as
        `(length, last node)` (`match_prefix`: `match_prefix_helper`).
        `held`: `(node, length)`, a path of the tree known to spell
        `key[:length]` (the walk passes it without comparing)."""
        if self.disable:
            return 0, ROOT
        key = _key(key)
        if self.meta[ROOM_LOW]:  # (a split takes a row and an edge)
            self._room(0)
        node, length = held if held is not None and held[0] is not None else (-1, 0)
        matched, node = _MATCH(self.nodes, self.tokens, self.meta, self.edges,
                               key[:len(key) - len(key) % self.page_size], True, node, length)
        return int(matched), int(node)

    def match_prefixes(self, keys):
        """`match_prefix` of each of `keys` in turn, for their side effects
        only (fresh stamps, splits): the waiting queue's prefix refresh."""
        if self.disable:
            return
        page = self.page_size
        meta = self.meta
        for key in keys:
            key = _key(key)
            if meta[ROOM_LOW]:
                self._room(0)
            _MATCH(self.nodes, self.tokens, meta, self.edges, key[:len(key) - len(key) % page], True,
                   -1, 0)

    def insert(self, key, held=None):
        """Insert `key` (whole pages); returns how many of its leading tokens
        the tree already held (their slots are the caller's duplicates to
        free) and the node the key ends at. A new leaf holds the rest, which
        becomes evictable (`insert`: `insert_helper`). `held` as for
        `match_prefix`."""
        if self.disable:
            return 0, ROOT
        assert len(key) % self.page_size == 0
        key = _key(key)
        self._room(len(key))
        node, length = held if held is not None and held[0] is not None else (-1, 0)
        matched, node = _INSERT(self.nodes, self.tokens, self.meta, self.edges, key, node, length)
        return int(matched), int(node)

    # -- locks -------------------------------------------------------------------

    def inc_lock_ref(self, node: int):
        """Lock the path from `node` to the root: its tokens stop being evictable."""
        if self.disable:
            return
        _INC_LOCK_REF(self.nodes, self.meta, node)

    def dec_lock_ref(self, node: int):
        if self.disable:
            return
        _DEC_LOCK_REF(self.nodes, self.meta, node)

    # -- eviction ----------------------------------------------------------------

    def evict(self, num_tokens: int):
        """Remove unlocked leaves, the least recently stamped first, whole
        nodes, until `num_tokens` tokens are freed or none is left
        (`RadixCache.evict`); their slots go back to the pool."""
        if self.disable or num_tokens <= 0:
            return
        if len(self.heap) < self.meta[NUM_NODES]:
            self.heap = np.zeros(self.nodes.shape[1], dtype=np.int64)
        evicted = int(_EVICT(self.nodes, self.tokens, self.meta, self.edges, num_tokens, self.heap))
        if evicted:
            self.pool.release(evicted)
        self.evicted_tokens += evicted

    def evict_for(self, num_tokens: int):
        """Evict the shortfall when fewer than `num_tokens` slots are free
        (`evict_from_tree_cache`, `evict_for_alloc`)."""
        if self.pool.free < num_tokens:
            self.evict(num_tokens - self.pool.free)

    # -- reading the tree (the debug mode's check) ---------------------------------

    def reachable(self):
        """Per row, whether it is a node the root reaches by the tree's edges
        (`reachable_nodes`; the root aside), an int64 array."""
        out = np.zeros(self.nodes.shape[1], dtype=np.int64)
        reachable_nodes(self.nodes, self.tokens, self.meta, self.edges, out)
        return out[:int(self.meta[NUM_NODES])]

    def key(self, node: int):
        """The tokens of `node`'s key (a view of the store)."""
        start = int(self.nodes[KEY_START, node])
        return self.tokens[start:start + int(self.nodes[KEY_LEN, node])]


# -- the kernels ------------------------------------------------------------------------


@njit
def _edge_slot(edges, parent, token) -> int:
    """Where the probe for the children of `parent` whose key begins with
    `token` starts in `edges`."""
    h = token ^ (parent * 40503)  # (no product overflows: node rows < 2^47)
    h ^= h >> 7
    h ^= h >> 17
    h ^= h >> 31
    return h & (len(edges) - 1)


@njit
def _edge_of(nodes, tokens, meta, edges, node, key, start) -> int:
    """The child of `node` whose key begins with the page of `key` at
    `start` (SGLang's `children[child_key]`), or -1."""
    page = meta[PAGE_SIZE]
    mask = len(edges) - 1
    i = _edge_slot(edges, node, key[start])
    while True:
        child = edges[i]
        if child == EMPTY:
            return -1
        if child >= 0 and nodes[PARENT, child] == node:
            s = nodes[KEY_START, child]
            same = True
            for k in range(page):
                if tokens[s + k] != key[start + k]:
                    same = False
                    break
            if same:
                return child
        i = (i + 1) & mask


@njit
def _add_edge(nodes, tokens, meta, edges, child):
    """`child` into `edges` under its parent and first token."""
    mask = len(edges) - 1
    i = _edge_slot(edges, nodes[PARENT, child], tokens[nodes[KEY_START, child]])
    while edges[i] >= 0:
        i = (i + 1) & mask
    if edges[i] == EMPTY:
        meta[EDGES_USED] += 1
    edges[i] = child


@njit
def _edge_index(nodes, tokens, edges, child) -> int:
    """Where `child` is in `edges` (it is there)."""
    mask = len(edges) - 1
    i = _edge_slot(edges, nodes[PARENT, child], tokens[nodes[KEY_START, child]])
    while edges[i] != child:
        i = (i + 1) & mask
    return i


@njit
def reachable_nodes(nodes, tokens, meta, edges, out):
    """The debug mode's view of the tree: `out[node]` 1 for each node in the
    tree that its parent's edge leads to, and its parent's, up to the root
    (SGLang's `children` walked from the root), else 0."""
    for node in range(1, meta[NUM_NODES]):
        if nodes[ALIVE, node] == 0:
            continue
        parent = nodes[PARENT, node]
        s = nodes[KEY_START, node]
        key = tokens[s:s + nodes[KEY_LEN, node]]
        if parent >= 0 and _edge_of(nodes, tokens, meta, edges, parent, key, 0) == node:
            out[node] = 1
    n = meta[NUM_NODES]
    for node in range(1, n):
        if out[node] != 1:
            continue
        p, steps = nodes[PARENT, node], 0
        while p != ROOT:
            if out[p] != 1 or steps > n:  # (an unlinked ancestor, or a cycle)
                out[node] = 0
                break
            p, steps = nodes[PARENT, p], steps + 1


@njit
def rehash_edges(nodes, tokens, meta, edges):
    """Every node in the tree (the root aside) into the empty table `edges`."""
    meta[EDGES_USED] = 0
    for node in range(1, meta[NUM_NODES]):
        if nodes[ALIVE, node] != 0:
            _add_edge(nodes, tokens, meta, edges, node)


@njit
def _new_node(nodes, meta, parent, key_start, key_len, stamp):
    """A node with the next id, in an evicted node's row if there is one."""
    node = meta[FREE_NODE]
    if node >= 0:
        meta[FREE_NODE] = nodes[PARENT, node]
    else:
        node = meta[NUM_NODES]
        meta[NUM_NODES] = node + 1
    nodes[NODE_ID, node] = meta[NEXT_ID]
    meta[NEXT_ID] += 1
    nodes[PARENT, node] = parent
    nodes[NUM_CHILDREN, node] = 0
    nodes[LOCK_REF, node] = 0
    nodes[LAST_ACCESS, node] = stamp
    nodes[ALIVE, node] = 1
    nodes[KEY_START, node] = key_start
    nodes[KEY_LEN, node] = key_len
    return node


@njit
def _split_node(nodes, tokens, meta, edges, child, split_len, stamp):
    """`_split_node`: split `child` after `split_len` tokens: a new node in
    its place holds the head (with the child's lock count), the child keeps
    the tail under it."""
    parent = nodes[PARENT, child]
    new = _new_node(nodes, meta, parent, nodes[KEY_START, child], split_len, stamp)
    nodes[LOCK_REF, new] = nodes[LOCK_REF, child]
    edges[_edge_index(nodes, tokens, edges, child)] = new  # (same parent, same first page)
    nodes[KEY_START, child] += split_len
    nodes[KEY_LEN, child] -= split_len
    nodes[PARENT, child] = new
    nodes[NUM_CHILDREN, new] = 1
    _add_edge(nodes, tokens, meta, edges, child)
    return new


@njit
def match_prefix_helper(nodes, tokens, meta, edges, key, touch, held_node, held_len):
    """`_match_prefix_helper` / `_insert_helper`'s walk: `key` (whole pages)
    down from the root, in whole pages; with `touch`, each node passed is
    stamped with one fresh clock value and a node the key leaves inside is
    split there (else the walk is a router's look, `cached_length`).
    Returns `(tokens matched, the node they end at)`.

    `held_node` / `held_len` (-1 / 0: none): a path the caller knows spells
    `key[:held_len]`, from the root to `held_node` (a request's locked
    prefix: `tree_len` tokens of its fill, checked by the debug mode), so
    the walk passes it without comparing its tokens: children are unique by
    their first page, so the walk would take that path, each node whole."""
    page = meta[PAGE_SIZE]
    stamp = 0
    if touch:
        meta[CLOCK] += 1
        stamp = meta[CLOCK]
        nodes[LAST_ACCESS, ROOT] = stamp
    node = ROOT
    matched = 0
    n_key = len(key)
    if held_len > 0 and held_len <= n_key:
        node = held_node
        matched = held_len
        if touch:
            p = held_node
            while p != ROOT:
                nodes[LAST_ACCESS, p] = stamp
                p = nodes[PARENT, p]
    while matched < n_key:
        child = _edge_of(nodes, tokens, meta, edges, node, key, matched)
        if child < 0:
            break
        if touch:
            nodes[LAST_ACCESS, child] = stamp
        s = nodes[KEY_START, child]
        m = min(nodes[KEY_LEN, child], n_key - matched)
        n = m
        for i in range(m):
            if tokens[s + i] != key[matched + i]:
                n = i
                break
        n -= n % page
        if n == 0:
            break
        matched += n
        if n < nodes[KEY_LEN, child]:
            if touch:
                new = _split_node(nodes, tokens, meta, edges, child, n, stamp)
                _note_room(nodes, meta, edges)
                return matched, new
            return matched, node
        node = child
    return matched, node


@njit
def _note_room(nodes, meta, edges):
    """`ROOM_LOW` when the next walk might split without a free row or edge."""
    if meta[NUM_NODES] + 2 > nodes.shape[1] or 2 * (meta[EDGES_USED] + 3) > len(edges):
        meta[ROOM_LOW] = 1


@njit
def insert_helper(nodes, tokens, meta, edges, key, held_node, held_len):
    """`insert`: walk `key` (whole pages, `match_prefix_helper`, with the
    caller's held path); a new leaf (stamped as the walk) holds the rest,
    copied into the store, and is evictable. Returns `(the tokens the tree
    already held, the node the key now ends at)`. The caller made room: two
    nodes, three edges, `len(key)` tokens."""
    matched, node = match_prefix_helper(nodes, tokens, meta, edges, key, True, held_node, held_len)
    rest = len(key) - matched
    if rest > 0:
        start = meta[STORE_LEN]
        for i in range(rest):
            tokens[start + i] = key[matched + i]
        meta[STORE_LEN] = start + rest
        leaf = _new_node(nodes, meta, node, start, rest, meta[CLOCK])
        nodes[NUM_CHILDREN, node] += 1
        _add_edge(nodes, tokens, meta, edges, leaf)
        meta[EVICTABLE] += rest
        meta[LIVE_TOKENS] += rest
        node = leaf
        _note_room(nodes, meta, edges)
    return matched, node


@njit
def inc_lock_ref(nodes, meta, node):
    """`inc_lock_ref`: lock the path from `node` to the root; a node locked
    the first time stops being evictable."""
    while node != ROOT:
        if nodes[LOCK_REF, node] == 0:
            meta[EVICTABLE] -= nodes[KEY_LEN, node]
            meta[PROTECTED] += nodes[KEY_LEN, node]
        nodes[LOCK_REF, node] += 1
        node = nodes[PARENT, node]


@njit
def dec_lock_ref(nodes, meta, node):
    """`dec_lock_ref`: unlock the path from `node` to the root; a node
    unlocked the last time becomes evictable."""
    while node != ROOT:
        if nodes[LOCK_REF, node] == 1:
            meta[EVICTABLE] += nodes[KEY_LEN, node]
            meta[PROTECTED] -= nodes[KEY_LEN, node]
        nodes[LOCK_REF, node] -= 1
        assert nodes[LOCK_REF, node] >= 0
        node = nodes[PARENT, node]


@njit
def _older(nodes, a, b) -> bool:
    """Whether node `a` comes before `b` in eviction order: (stamp, id)."""
    sa, sb = nodes[LAST_ACCESS, a], nodes[LAST_ACCESS, b]
    return sa < sb or (sa == sb and nodes[NODE_ID, a] < nodes[NODE_ID, b])


@njit
def _heap_push(nodes, heap, n, node):
    i = n
    heap[i] = node
    while i > 0:
        up = (i - 1) // 2
        if not _older(nodes, heap[i], heap[up]):
            break
        heap[up], heap[i] = heap[i], heap[up]
        i = up
    return n + 1


@njit
def _heap_pop(nodes, heap, n):
    top = heap[0]
    n -= 1
    heap[0] = heap[n]
    i = 0
    while True:
        left = 2 * i + 1
        if left >= n:
            break
        first = left
        if left + 1 < n and _older(nodes, heap[left + 1], heap[left]):
            first = left + 1
        if not _older(nodes, heap[first], heap[i]):
            break
        heap[i], heap[first] = heap[first], heap[i]
        i = first
    return top, n


@njit
def evict(nodes, tokens, meta, edges, num_tokens, heap) -> int:
    """`RadixCache.evict`: remove unlocked leaves (the root aside), the least
    recently stamped first (then the oldest node), whole nodes, until
    `num_tokens` tokens are freed or none is left; a parent that becomes an
    unlocked leaf joins the candidates. Returns the tokens freed. `heap`:
    scratch of one entry per row."""
    n = 0
    for node in range(1, meta[NUM_NODES]):
        if nodes[ALIVE, node] != 0 and nodes[NUM_CHILDREN, node] == 0 and nodes[LOCK_REF, node] == 0:
            n = _heap_push(nodes, heap, n, node)
    evicted = 0
    while evicted < num_tokens and n > 0:
        node, n = _heap_pop(nodes, heap, n)
        parent = nodes[PARENT, node]
        edges[_edge_index(nodes, tokens, edges, node)] = GONE
        nodes[NUM_CHILDREN, parent] -= 1
        nodes[ALIVE, node] = 0
        nodes[PARENT, node] = meta[FREE_NODE]  # (its row is free)
        meta[FREE_NODE] = node
        size = nodes[KEY_LEN, node]
        evicted += size
        meta[EVICTABLE] -= size
        meta[LIVE_TOKENS] -= size
        if parent != ROOT and nodes[NUM_CHILDREN, parent] == 0 and nodes[LOCK_REF, parent] == 0:
            n = _heap_push(nodes, heap, n, parent)
    return evicted


@njit
def compact_tokens(nodes, tokens, meta, new_tokens):
    """Copy the keys of the nodes in the tree into `new_tokens`, in node
    order, and point the nodes there (the keys of evicted nodes are dropped)."""
    at = 0
    for node in range(1, meta[NUM_NODES]):
        if nodes[ALIVE, node] == 0:
            continue
        s = nodes[KEY_START, node]
        for i in range(nodes[KEY_LEN, node]):
            new_tokens[at + i] = tokens[s + i]
        nodes[KEY_START, node] = at
        at += nodes[KEY_LEN, node]
    meta[STORE_LEN] = at


_MATCH = Entry(match_prefix_helper)
_INSERT = Entry(insert_helper)
_INC_LOCK_REF = Entry(inc_lock_ref)
_DEC_LOCK_REF = Entry(dec_lock_ref)
_EVICT = Entry(evict)
_COMPACT = Entry(compact_tokens)
_REHASH = Entry(rehash_edges)
