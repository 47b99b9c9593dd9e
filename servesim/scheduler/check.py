"""The debug mode's invariant check (`SERVESIM_CHECK=1`, `servesim run --check`):
after every pass — each `schedule()` and each `update_from_output()` — one
rank's scheduler state is checked against what vLLM's scheduler and block pool
keep true (vllm/v1/core/block_pool.py, kv_cache_manager.py,
sched/scheduler.py; docs/engine.md §2-6). A violation raises
:class:`~servesim.errors.InvariantError` naming the pass, the request or block
and the invariant: it is a bug in servesim, never bad input.

`check_rank` is a Numba kernel over a rank's scheduler arrays (a
`SchedulerArrays`, servesim/scheduler/scheduler_arrays.py: the request table,
the rank's G1 pool arrays, its `running` list, its waiting queue — a ring
from `S[0].waiting_head`, or a heap from 0 under the priority policy), the requests that
hold blocks outside those two (`others`: loads in flight — a CPU-tier load or
a remote pull into the blocks a request took at admission, `waiting_for_kv` —
and blocks a disaggregated prefill worker holds for the decode side; a
CPU-tier store in flight holds no block: it reads G1 blocks without a
reference) and, after `schedule()`, the pass's scheduled entries. The compiled
scheduler calls it from its own kernels when `cfg[0].invariant_check` is set
(`servesim.scheduler.scheduler`). Several
compiled schedulers share one table (workers, DP ranks): each checks its own
requests, and `check_table` checks across them (compiled too, over each rank's
`RankQueues`, after every pass).

The invariants, with vLLM's accounting:
- blocks conserved: free-queue length + blocks held by some request (ref
  count > 0) = usable blocks (`num_gpu_blocks - 1`, the null block 0
  excluded). A cached block nobody holds is free (it stays in the free queue
  until it is handed out again), so "cached only" blocks are part of the free
  count, as in vLLM's `get_num_free_blocks` and `get_usage`;
- the pool's free count equals the free queue's length; the queue is a
  well-formed doubly linked list from HEAD to TAIL of distinct usable blocks,
  holding exactly the blocks of ref count 0; the null block has ref count 1
  and is in no table;
- each block's ref count equals the number of requests whose block table
  holds it (a table holds a block at most once);
- the prefix-cache map: each identity's list of cached blocks links back and
  forth and every block on it carries that identity; a request's first
  `num_cached_blocks` blocks carry its identities, the rest none;
- each request of the rank is in exactly one of running / waiting / others,
  with a status that matches (running: RUNNING; waiting: WAITING or
  PREEMPTED, nothing computed, no blocks; the priority heap ordered); only a
  request in running or others holds blocks; when `cfg[0].invariant_check` is 2 (one
  scheduler on the table) also every RUNNING request of the table is in
  running and every PREEMPTED one waiting;
- running <= max_num_seqs;
- `prompt <= num_tokens <= prompt + max_tokens`, `num_tokens <=
  max_model_len`, `0 <= num_computed_tokens <= num_tokens + placeholders +
  k` (k: draft tokens of speculative decoding) and `< max_model_len`; the
  block table covers the computed tokens and fits the request's capacity,
  `num_cached_blocks <= num_blocks`, registered blocks are full of known
  tokens;
- the rank's kept count of pending prefill tokens (`S[0].pending_prefill_tokens`,
  what the `least_prefill` router reads) equals its scan: the running requests'
  `prefill_target_tokens - num_computed_tokens` where positive plus every
  waiting request's `num_tokens` (`check_pending_prefill`, also run by the
  router at every arrival);
- after `schedule()`: the scheduled tokens sum to the pass's total and stay
  within `max_num_batched_tokens`; each entry is a distinct running request
  with at least one token; with more than one request scheduled no entry
  exceeds `long_prefill_token_threshold` (padding drafts of an admission
  aside).
"""

import os

import numpy as np

from numba.experimental import structref

from servesim.bundles import BundleType, addresses_of, bundle_at, declare
from servesim.errors import InvariantError
from servesim.jit import Entry, njit, plain_python
from servesim.kvcache import block_pool as bp
from servesim.scheduler.request_queue import _before
from servesim.scheduler.request import RequestStatus

# where in the pass the check ran
AFTER_SCHEDULE, AFTER_OUTPUT, AFTER_TAKE_OUT, AT_ARRIVAL = range(4)
WHERE = ("after schedule()", "after update_from_output()", "after taking out a livelocked rank",
         "at an arrival (routing)")

# invariant codes (the first argument of the kernel's InvariantError)
(CONSERVED, NUM_FREE, FREE_QUEUE, FREE_REF, REF_NOT_FREE, REF_COUNT, NULL_BLOCK,
 TABLE_BLOCK, TABLE_DUPLICATE, DUPLICATE, RUNNING_STATUS, WAITING_STATUS, LOST,
 HOLDS_BLOCKS, MAX_SEQS, BUDGET, TOTAL_TOKENS, ENTRY, THRESHOLD, NUM_TOKENS_RANGE,
 COMPUTED_RANGE, COVERAGE, TABLE_SIZE, CACHE_MAP, CACHED_IDENTITY, WAITING_STATE,
 HEAP_ORDER, PENDING_PREFILL) = range(28)

INVARIANTS = {
    CONSERVED: "blocks conserved: free-queue length + held blocks = usable blocks",
    NUM_FREE: "the pool's free count equals the free queue's length",
    FREE_QUEUE: "the free queue is a doubly linked list of distinct usable blocks",
    FREE_REF: "a block in the free queue has ref count 0",
    REF_NOT_FREE: "a block of ref count 0 is in the free queue",
    REF_COUNT: "a block's ref count equals the requests whose block table holds it",
    NULL_BLOCK: "the null block (0) has ref count 1 and is in no block table",
    TABLE_BLOCK: "a block table holds only usable block ids",
    TABLE_DUPLICATE: "a block table holds a block at most once",
    DUPLICATE: "a request is in exactly one of running / waiting / loads in flight",
    RUNNING_STATUS: "a request in running is RUNNING",
    WAITING_STATUS: "a request in waiting is WAITING or PREEMPTED",
    LOST: "a RUNNING request is in running, a PREEMPTED one in waiting (or waiting for "
          "its load)",
    HOLDS_BLOCKS: "only a request in running (or holding blocks for a load or a "
                  "transfer) holds blocks",
    MAX_SEQS: "running <= max_num_seqs",
    BUDGET: "a pass's scheduled tokens <= max_num_batched_tokens",
    TOTAL_TOKENS: "a pass's total tokens are the sum of its entries",
    ENTRY: "a scheduled entry is a running request, once, with at least one token",
    THRESHOLD: "an entry's tokens <= long_prefill_token_threshold",
    NUM_TOKENS_RANGE: "prompt <= num_tokens <= prompt + max_tokens, <= max_model_len",
    COMPUTED_RANGE: "0 <= num_computed_tokens <= num_tokens + placeholders (+ drafts), "
                    "< max_model_len",
    COVERAGE: "the block table covers num_computed_tokens",
    TABLE_SIZE: "num_cached_blocks <= num_blocks <= the table's capacity, registered "
                "blocks full of known tokens",
    CACHE_MAP: "the prefix-cache map links each identity's cached blocks, all of "
               "that identity",
    CACHED_IDENTITY: "a request's registered blocks carry its identities, the others none",
    WAITING_STATE: "a waiting request has no computed tokens, placeholders or blocks",
    HEAP_ORDER: "the priority waiting queue is a heap on (priority, arrival, id)",
    PENDING_PREFILL: "the rank's pending prefill tokens (kept count) = its running requests' "
                     "rest of prefill + its waiting requests' tokens (scan)",
}


def enabled() -> bool:
    """The debug mode is on: SERVESIM_CHECK set to anything but "" or "0"."""
    return os.environ.get("SERVESIM_CHECK", "") not in ("", "0")


def describe(exc: InvariantError, request_ids=None) -> str:
    """The message of a kernel's InvariantError `(code, where, pass, request,
    block, actual, expected)`, naming the request by its id when
    `request_ids` is given."""
    code, where, pass_index, request, block, actual, expected = exc.args
    when = (f"after the rank's {pass_index} passes" if where == AT_ARRIVAL
            else f"of pass {pass_index}")
    parts = [f"invariant violated {WHERE[where]} {when}: {INVARIANTS[code]}"]
    if request >= 0:
        name = repr(str(request_ids[request])) if request_ids is not None else f"#{request}"
        parts.append(f"request {name}")
    if block >= 0:
        parts.append(f"block {block}")
    parts.append(f"found {actual}, expected {expected}")
    return "; ".join(parts)


@njit(inline="always")  # out of line, its constant arguments made 35 specialisations to compile
def _fail(code, where, pass_index, request, block, actual, expected):
    raise InvariantError(code, where, pass_index, request, block, actual, expected)


@njit
def _check_pool(blocks, idmap, pscal, holders, where, pass_index):
    """Free queue, ref counts, conservation and the cache map of one pool;
    `holders[b]` counts the tables holding block b."""
    num_blocks = blocks.shape[1] - 2
    head = num_blocks
    tail = num_blocks + 1
    usable = bp.usable_blocks(num_blocks)
    in_queue = np.zeros(num_blocks, dtype=np.bool_)
    free = 0
    prev = head
    b = blocks[bp.NEXT, head]
    while b != tail:
        if b <= 0 or b >= num_blocks or in_queue[b] or free >= usable:
            _fail(FREE_QUEUE, where, pass_index, -1, b, free, usable)
        if blocks[bp.PREV, b] != prev:
            _fail(FREE_QUEUE, where, pass_index, -1, b, blocks[bp.PREV, b], prev)
        if blocks[bp.REF, b] != 0:
            _fail(FREE_REF, where, pass_index, -1, b, blocks[bp.REF, b], 0)
        in_queue[b] = True
        free += 1
        prev = b
        b = blocks[bp.NEXT, b]
    if blocks[bp.PREV, tail] != prev:
        _fail(FREE_QUEUE, where, pass_index, -1, tail, blocks[bp.PREV, tail], prev)
    if pscal[bp.NUM_FREE] != free:
        _fail(NUM_FREE, where, pass_index, -1, -1, pscal[bp.NUM_FREE], free)
    if blocks[bp.REF, 0] != 1 or holders[0] != 0:
        _fail(NULL_BLOCK, where, pass_index, -1, 0, blocks[bp.REF, 0], 1)
    held = 0
    for b in range(1, num_blocks):
        ref = blocks[bp.REF, b]
        if ref == 0 and not in_queue[b]:
            _fail(REF_NOT_FREE, where, pass_index, -1, b, ref, 0)
        if ref != holders[b]:
            _fail(REF_COUNT, where, pass_index, -1, b, ref, holders[b])
        if ref > 0:
            held += 1
    if free + held != usable:
        _fail(CONSERVED, where, pass_index, -1, -1, free + held, usable)
    # the cache map, from both ends
    for b in range(1, num_blocks):
        ident = blocks[bp.IDENT, b]
        if ident == bp.NONE:
            continue
        if ident < 0 or ident >= len(idmap):
            _fail(CACHE_MAP, where, pass_index, -1, b, ident, len(idmap))
        p = blocks[bp.DPREV, b]
        if p == bp.NONE:
            if idmap[ident] != b:
                _fail(CACHE_MAP, where, pass_index, -1, b, idmap[ident], b)
        elif blocks[bp.DNEXT, p] != b or blocks[bp.IDENT, p] != ident:
            _fail(CACHE_MAP, where, pass_index, -1, b, blocks[bp.DNEXT, p], b)
        n = blocks[bp.DNEXT, b]
        if n != bp.NONE and blocks[bp.DPREV, n] != b:
            _fail(CACHE_MAP, where, pass_index, -1, b, blocks[bp.DPREV, n], b)
    for ident in range(len(idmap)):
        b = idmap[ident]
        if b == bp.NONE:
            continue
        if b <= 0 or b >= num_blocks or blocks[bp.IDENT, b] != ident:
            _fail(CACHE_MAP, where, pass_index, -1, b, ident, -1)
        if blocks[bp.DPREV, b] != bp.NONE:
            _fail(CACHE_MAP, where, pass_index, -1, b, blocks[bp.DPREV, b], bp.NONE)


@njit
def _check_request(R, idents, tables, blocks, holders, seen, i, bs, spec_k, max_model_len,
                   where, pass_index):
    """One request's counters and block table; counts its blocks in `holders`."""
    prompt = R[i].num_prompt_tokens
    num_tokens = R[i].num_tokens
    if num_tokens < prompt or num_tokens > prompt + R[i].max_tokens or num_tokens > max_model_len:
        _fail(NUM_TOKENS_RANGE, where, pass_index, i, -1, num_tokens, prompt)
    computed = R[i].num_computed_tokens
    bound = num_tokens + R[i].num_output_placeholders + spec_k
    if (computed < 0 or computed > bound or computed >= max_model_len
        or R[i].num_output_placeholders < 0):
        _fail(COMPUTED_RANGE, where, pass_index, i, -1, computed, bound)
    num_held = R[i].num_held_blocks
    num_cached = R[i].num_cached_blocks
    if (num_held > R[i].block_capacity or num_cached < 0 or num_cached > num_held
            or num_cached * bs > num_tokens):
        _fail(TABLE_SIZE, where, pass_index, i, -1, num_held, R[i].block_capacity)
    if num_held * bs < computed:
        _fail(COVERAGE, where, pass_index, i, -1, num_held * bs, computed)
    num_blocks = blocks.shape[1] - 2
    off = R[i].block_offset
    for k in range(num_held):
        b = tables[off + k]
        if b <= 0 or b >= num_blocks:
            _fail(TABLE_BLOCK, where, pass_index, i, b, k, num_held)
        if seen[b] == i + 1:
            _fail(TABLE_DUPLICATE, where, pass_index, i, b, k, num_held)
        seen[b] = i + 1
        holders[b] += 1
        ident = blocks[bp.IDENT, b]
        expected = idents[off + k] if k < num_cached else bp.NONE
        if ident != expected:
            _fail(CACHED_IDENTITY, where, pass_index, i, b, ident, expected)


@njit
def check_pending_prefill(R, running, n_run, wq, wq_head, wq_len, pending, where, pass_index):
    """The kept count of a rank's pending prefill tokens (`pending`,
    servesim/scheduler/scheduler.py `pending_prefill_tokens`) against its scan of
    the running list and the waiting queue (from `wq_head`, `wq_len` long)."""
    total = 0
    for k in range(n_run):
        i = running[k]
        if R[i].prefill_target_tokens > R[i].num_computed_tokens:
            total += R[i].prefill_target_tokens - R[i].num_computed_tokens
    cap = len(wq)
    for k in range(wq_len):
        total += R[wq[(wq_head + k) % cap]].num_tokens
    if pending != total:
        _fail(PENDING_PREFILL, where, pass_index, -1, -1, pending, total)


@njit
def check_rank(s, others, sched_req, sched_tok, sched_capped, n_sched, total_tokens, where,
               pass_index):
    """Check the state of the rank `s` (the invariants of the module
    docstring); raise InvariantError at the first violation. `n_sched < 0`:
    not after a `schedule()` (no pass entries to check); else the pass's
    entries are `sched_req[:n_sched]` with `sched_tok` tokens each
    (`sched_capped` of them under the long-prefill threshold), and
    `total_tokens` the pass's total."""
    R, idents, tables, blocks, running, wq = s.R, s.idents, s.tables, s.blocks, s.running, s.wq
    cfg = s.cfg
    priority = cfg[0].priority_scheduling
    max_seqs = cfg[0].max_num_seqs
    bs = cfg[0].block_size
    spec_k = cfg[0].num_speculative_tokens
    max_model_len = cfg[0].max_model_len
    n_run = s.S[0].num_running
    wq_head = 0 if priority else s.S[0].waiting_head
    wq_len = s.S[0].num_waiting
    n_others = len(others)
    n = len(R)
    # where each request is: 1 running, 2 waiting, 3 others
    place = np.zeros(n, dtype=np.int8)
    num_blocks = blocks.shape[1] - 2
    holders = np.zeros(num_blocks, dtype=np.int64)
    seen = np.zeros(num_blocks, dtype=np.int64)
    if n_run > max_seqs:
        _fail(MAX_SEQS, where, pass_index, -1, -1, n_run, max_seqs)
    for k in range(n_run):
        i = running[k]
        if place[i] != 0:
            _fail(DUPLICATE, where, pass_index, i, -1, place[i], 1)
        place[i] = 1
        if R[i].status != RequestStatus.RUNNING:
            _fail(RUNNING_STATUS, where, pass_index, i, -1, R[i].status, RequestStatus.RUNNING)
        _check_request(R, idents, tables, blocks, holders, seen, i, bs, spec_k, max_model_len,
                       where, pass_index)
    cap = len(wq)
    for k in range(wq_len):
        i = wq[(wq_head + k) % cap]
        if place[i] != 0:
            _fail(DUPLICATE, where, pass_index, i, -1, place[i], 2)
        place[i] = 2
        status = R[i].status
        if status != RequestStatus.WAITING and status != RequestStatus.PREEMPTED:
            _fail(WAITING_STATUS, where, pass_index, i, -1, status, RequestStatus.WAITING)
        if (R[i].num_computed_tokens != 0 or R[i].num_output_placeholders != 0
            or R[i].num_held_blocks != 0):
            _fail(WAITING_STATE, where, pass_index, i, -1, R[i].num_computed_tokens, 0)
        if priority and k > 0 and _before(R, i, wq[(k - 1) // 2]):
            _fail(HEAP_ORDER, where, pass_index, i, -1, k, (k - 1) // 2)
    for k in range(n_others):
        i = others[k]
        if place[i] != 0:
            _fail(DUPLICATE, where, pass_index, i, -1, place[i], 3)
        place[i] = 3
        for j in range(R[i].num_held_blocks):
            b = tables[R[i].block_offset + j]
            if b <= 0 or b >= num_blocks:
                _fail(TABLE_BLOCK, where, pass_index, i, b, j, R[i].num_held_blocks)
            holders[b] += 1
    if cfg[0].invariant_check == 2:  # the whole table (others' requests are in their queues)
        for i in range(n):
            if place[i] != 0:
                continue
            if R[i].num_held_blocks != 0:
                _fail(HOLDS_BLOCKS, where, pass_index, i, -1, R[i].num_held_blocks, 0)
            status = R[i].status
            if status == RequestStatus.RUNNING or status == RequestStatus.PREEMPTED:
                _fail(LOST, where, pass_index, i, -1, status, -1)
    _check_pool(blocks, s.idmap, s.pscal, holders, where, pass_index)
    check_pending_prefill(R, running, n_run, wq, wq_head, wq_len, s.S[0].pending_prefill_tokens,
                          where, pass_index)
    if n_sched < 0:
        return
    total = 0
    scheduled = np.zeros(n, dtype=np.bool_)
    for e in range(n_sched):
        i = sched_req[e]
        tokens = sched_tok[e]
        if i < 0 or i >= n or place[i] != 1 or scheduled[i] or tokens <= 0:
            _fail(ENTRY, where, pass_index, i, -1, tokens, 1)
        scheduled[i] = True
        threshold = cfg[0].long_prefill_token_threshold
        if threshold > 0 and n_sched > 1 and sched_capped[e] > threshold:
            _fail(THRESHOLD, where, pass_index, i, -1, sched_capped[e], threshold)
        total += tokens
    if total != total_tokens:
        _fail(TOTAL_TOKENS, where, pass_index, -1, -1, total_tokens, total)
    if total > cfg[0].max_num_batched_tokens:
        _fail(BUDGET, where, pass_index, -1, -1, total, cfg[0].max_num_batched_tokens)


# -- across the schedulers sharing a table ----------------------------------------

QUEUE_FIELDS = ("S", "cfg", "running", "wq", "held", "wfk")


class RankQueuesType(BundleType):
    pass


class RankQueues(structref.StructRefProxy):
    """One rank's queues as the check across schedulers reads them, in the
    order of `QUEUE_FIELDS`: its state `S` and configuration `cfg` records,
    `running`, the waiting queue `wq`, `held` (blocks held for a decode
    worker) and `wfk` (`waiting_for_kv`; empty on a rank without `kv`). Make
    with `new_rank_queues` (`RankScheduler.queues`)."""


@njit
def _new_rank_queues(*fields):
    return RankQueues(*fields)


new_rank_queues = declare(RankQueuesType, RankQueues, QUEUE_FIELDS, _new_rank_queues)


@njit
def _prefix(num, cap):
    """The length of Python's `queue[:num]` for a queue of `cap` entries."""
    if num > cap:
        return cap
    if num < 0:
        return max(0, cap + num)
    return num


@njit
def _count_members(queue, head, num, count, flags):
    """Count each of the `num` requests of `queue` (a ring from `head`) in
    `count`, and flag it in `flags`."""
    cap = len(queue)
    n = len(count)
    for k in range(num):
        i = queue[(head + k) % cap]
        if i < 0 or i >= n:
            raise IndexError("a rank's queue holds a request outside its table")
        count[i] += 1
        flags[i] = True


@njit
def _check_across(R, addresses, first, where, pass_index):
    """`check_table` over the table `R` and the `RankQueues` of its
    schedulers (`addresses`, of `first`'s type: `bundle_at`): each request
    counted once per queue it is in (running, waiting, or holding blocks
    outside the two: waiting for its load, or held for a decode worker);
    the first request breaking each rule, in the order of `check_table`,
    raises."""
    n = len(R)
    count = np.zeros(n, dtype=np.int64)
    running = np.zeros(n, dtype=np.bool_)
    waiting = np.zeros(n, dtype=np.bool_)
    holding = np.zeros(n, dtype=np.bool_)
    for k in range(len(addresses)):
        q = bundle_at(addresses, k, first)
        S = q.S
        _count_members(q.running, 0, _prefix(S[0].num_running, len(q.running)), count, running)
        head = 0 if q.cfg[0].priority_scheduling else S[0].waiting_head
        _count_members(q.wq, head, S[0].num_waiting, count, waiting)
        _count_members(q.wfk, 0, _prefix(S[0].num_waiting_for_kv, len(q.wfk)), count, holding)
        _count_members(q.held, 0, _prefix(S[0].num_delayed_free_requests, len(q.held)), count,
                       holding)
    for i in range(n):
        if count[i] > 1:
            _fail(DUPLICATE, where, pass_index, i, -1, count[i], 1)
    for i in range(n):
        status = R[i].status
        if ((status == RequestStatus.RUNNING and not running[i])
                or (status == RequestStatus.PREEMPTED and not waiting[i] and not holding[i])):
            _fail(LOST, where, pass_index, i, -1, status, -1)
    for i in range(n):
        if R[i].num_held_blocks != 0 and not running[i] and not holding[i]:
            _fail(HOLDS_BLOCKS, where, pass_index, i, -1, R[i].num_held_blocks, 0)


class _AcrossSchedulers:
    """A table's check across its schedulers: their `RankQueues` by address
    and the compiled check as an `Entry` (the table's and the bundles' types
    are typed once, at the first call). Made again when a rank's bundle is
    (`RankScheduler.queues`)."""

    def __init__(self, queues):
        if not plain_python() and len({q._numba_type_ for q in queues}) > 1:
            raise TypeError("the schedulers sharing a table have queues of different types")
        self.queues = queues
        self.addresses = addresses_of(queues)
        self.entry = Entry(_check_across)

    def __call__(self, R, where, pass_index):
        self.entry(R, self.addresses, self.queues[0], where, pass_index)


def check_table(table, where, pass_index):
    """Across the compiled schedulers sharing a request table (several
    workers or DP ranks, each checked alone by `check_rank`): a request is in
    one queue of one scheduler at most, a RUNNING one in some `running`, a
    PREEMPTED one in some waiting queue or waiting for its load
    (`waiting_for_kv`: a preempted request's CPU-tier load), and one holding
    blocks is running or holds them for a load in flight (or for a decode
    worker). The replay calls it after each pass when more than one
    scheduler shares the table; compiled (`_check_across`), as it runs
    after every pass."""
    queues = [scheduler.queues() for scheduler in table.checked_schedulers]
    across = table.check_across
    if across is None or across.queues != queues:
        across = table.check_across = _AcrossSchedulers(queues)
    across(table.R, where, pass_index)
