"""The CPU KV tier of vLLM's CPU offloading (docs/engine.md §9): one rank's
CPU block store, its two copy lanes and the connector's bookkeeping, as
arrays and Numba kernels for the scheduler (servesim/scheduler/scheduler.py).

vLLM: vllm/v1/kv_offload/lru_manager.py (`LRUOffloadingManager`: `lookup`,
`touch`, `prepare_load`, `complete_load`, `prepare_store`,
`complete_store`), vllm/distributed/kv_transfer/kv_connector/v1/
offloading_connector.py (`OffloadingConnectorScheduler`:
`get_num_new_matched_tokens`, `update_state_after_alloc`,
`_get_reqs_to_store`, `request_finished`), and the worker's copy handler
over the CPU backend (vllm/v1/kv_offload/cpu.py, worker/cpu_gpu.py:
`transfer_async`, `get_finished`).

Rules:

- The tier holds at most `num_cpu_blocks` blocks, keyed by the prefix cache's
  block identities (`servesim.workload.prefix`), least recently used first.
- A block is *pending* from the moment its store is prepared (at the decision
  that schedules it) until the store completes: a pending block is not a hit,
  cannot be evicted, and a lookup that reaches it must wait and ask again.
- A store job covers the given blocks not in the tier yet (pending ones
  included). It makes room by evicting least-recently-used ready blocks that
  no load is reading; when that is not enough the whole job is dropped
  (`prepare_store` returns NO_JOB) and nothing changes.
- A lookup walks the request's consecutive full blocks from the first one past
  its G1 hit (up to the block of its last token) and touches all of its blocks
  in the tier, the first block last (so the deepest blocks of a prefix are
  evicted first). It must wait when it stops at a pending block, or when a
  block it hits is being loaded for another request (vLLM then asks again at
  a later pass rather than load the block twice).
- Transfers run on one device-to-host lane (stores) and one host-to-device lane
  (loads), FIFO each in the order of their submission instants (ties: order of
  submission); a job of `n` bytes takes `n / (GB/s · 1e9)` s. A completion
  takes effect when `poll(now)` is called at or after it — the engine calls it
  at each decision, so a transfer done mid-pass counts from the next pass
  boundary.
- A GPU block read by a store in flight must not be overwritten before the
  store completes: `store_done_ms(blocks)` is the first instant the given
  blocks may be written again, and a load into such blocks starts no earlier.

Callers pass "now": nothing here knows simulated time beyond the lanes'
bookkeeping. Times are in ms.

State of one rank's tier (a :class:`TierArrays`):

- `tier[ROW, s]` for slots s in 0..C-1 plus the LRU list's sentinels
  (HEAD = C, TAIL = C + 1), C = min(num_cpu_blocks, the workload's block
  identities) (the tier can never hold more): a held block's identity, READY (0 while its
  store is pending: vLLM's `ref_cnt == -1`), REFS (loads in flight reading
  it) and its neighbours in LRU order, least recently used first (HEAD's
  next). `slot_of[identity]` is its slot or -1; `free_slots[:KS[0].num_free_slots]`
  the slots holding nothing.
- Jobs (stores, loads) are rows of `jobs` (kind, loading request or -1,
  offset and count of its blocks in `job_blocks`, bytes, submission
  sequence) and `job_times` (submit, start, finish); `job_blocks[0, k]` is a
  block's identity, `job_blocks[1, k]` its G1 block. Job ids only grow; a
  job is never reused.
- Each lane is `lanes[LANE, :]`: the job ids not yet retired, in service
  order, from `KS[0].lane_head[LANE]` for `KS[0].lane_len[LANE]` entries.
- `storing[b]` is the latest store job submitted that reads G1 block b (-1:
  none). A retired job's finish is at or before the last poll, so it cannot
  raise `store_done_ms` past "now" — the bound every caller takes a max with.

A load's landing is reported to the compiled scheduler by setting its
request's `R[i].kv_load` to `KVLoad.LANDED` (`servesim.scheduler.request`): the
admission path that waits for it does not know where the KV comes from.
"""

import numpy as np

from servesim.jit import njit, records

# tier rows
T_IDENT, T_READY, T_REFS, T_PREV, T_NEXT = range(5)
NUM_TIER_ROWS = 5
# job rows
J_KIND, J_REQ, J_OFF, J_N, J_BYTES, J_SEQ = range(6)
NUM_JOB_FIELDS = 6
JT_SUBMIT, JT_START, JT_FINISH = range(3)
STORE, LOAD = 0, 1  # job kinds, and lane indices (d2h carries stores, h2d loads)
STORE_NAME, LOAD_NAME = "store", "load"  # job kinds by name (cpu_tier_connector.JobView.kind)
# KS[0]: the tier's scalars, one record (`TIER_DTYPE`)
TIER_DTYPE = np.dtype([
    ("num_blocks", np.int64), ("max_blocks", np.int64),  # blocks held, the most ever held
    # num_cpu_blocks (the slots are fewer when the workload has fewer identities)
    ("capacity", np.int64),
    ("num_free_slots", np.int64),  # free_slots[:num_free_slots]
    ("num_jobs", np.int64), ("num_job_blocks", np.int64),  # jobs made, job_blocks used
    ("seq", np.int64),  # the last submission sequence drawn
    ("num_loads", np.int64), ("num_stores", np.int64),
    ("bytes_loaded", np.int64), ("bytes_stored", np.int64), ("hit_tokens", np.int64),
    ("block_bytes", np.int64), ("block_size", np.int64),
    ("fill", np.int64),  # the `offloading` connector: stores follow the computed blocks
    # per lane (STORE, LOAD): its queue `lanes[lane, lane_head:lane_head + lane_len]`,
    # its rate in bytes per ms, the finish of its last retired job
    ("lane_head", np.int64, (2,)), ("lane_len", np.int64, (2,)),
    ("lane_rate", np.float64, (2,)), ("lane_free_ms", np.float64, (2,)),
])
NO_JOB = -1  # prepare_store: the tier has no room, nothing changed
EMPTY_JOB = -2  # prepare_store: every block is in the tier already


# -- the LRU store (LRUOffloadingManager) ---------------------------------------


@njit(inline="always")
def _unlink(tier, s):
    """servesim's own: take slot s out of the tier's LRU list, the linked list
    that stands for `LRUOffloadingManager`'s ordered dict (docs/engine.md §9)."""
    p = tier[T_PREV, s]
    n = tier[T_NEXT, s]
    tier[T_NEXT, p] = n
    tier[T_PREV, n] = p


@njit(inline="always")
def _link_last(tier, s):
    """servesim's own: link slot s at the most recently used end of the
    tier's LRU list (docs/engine.md §9)."""
    tail = tier.shape[1] - 1
    p = tier[T_PREV, tail]
    tier[T_PREV, s] = p
    tier[T_NEXT, s] = tail
    tier[T_NEXT, p] = s
    tier[T_PREV, tail] = s


@njit
def init_tier(tier, slot_of, free_slots, KS):
    """`LRUOffloadingManager.__init__` (vllm/v1/kv_offload/lru_manager.py): an
    empty tier, every slot free and the LRU list empty."""
    cap = tier.shape[1] - 2
    head, tail = cap, cap + 1
    tier[:, :] = -1
    tier[T_NEXT, head] = tail
    tier[T_PREV, tail] = head
    slot_of[:] = -1
    for k in range(cap):
        free_slots[k] = cap - 1 - k  # popped from the end: slot 0 first
    KS[0].num_free_slots = cap
    KS[0].num_blocks = 0


@njit
def lookup(tier, slot_of, identities, start, stop):
    """`LRUOffloadingManager.lookup` (vllm/v1/kv_offload/lru_manager.py):
    the run of leading ready blocks among `identities[start:stop]`, and
    whether it stopped at a pending one.

    - A pending block is never a hit.
    - Returns `hits`, negated minus one when it stopped at a pending block.
    """
    hits = 0
    for k in range(start, stop):
        s = slot_of[identities[k]]
        if s < 0:
            return hits
        if tier[T_READY, s] == 0:
            return -hits - 1
        hits += 1
    return hits


@njit
def touch(tier, slot_of, identities, stop):
    """`LRUOffloadingManager.touch`: the held blocks among `identities[:stop]`
    become the most recently used.

    - The first one last, so the deepest blocks of a prefix are evicted first.
    - Order only: no block enters or leaves.
    """
    for k in range(stop - 1, -1, -1):
        s = slot_of[identities[k]]
        if s >= 0:
            _unlink(tier, s)
            _link_last(tier, s)


@njit
def prepare_store_blocks(tier, slot_of, free_slots, KS, new, n):
    """`LRUOffloadingManager.prepare_store`: make room for the `n` identities
    `new[:n]` (none of them held) and insert them as pending blocks.

    - They go to the most recently used end, in order.
    - Room comes from evicting least-recently-used blocks that are ready and
      that no load reads.
    - If that cannot make room: change nothing and return False (the job is
      dropped).
    - Invariant: the tier never holds more than its capacity
      (`num_cpu_blocks`), each identity once.
    """
    head = tier.shape[1] - 2
    to_evict = KS[0].num_blocks + n - KS[0].capacity
    if to_evict > 0:
        found = 0
        s = tier[T_NEXT, head]
        while s != head + 1 and found < to_evict:
            if tier[T_READY, s] == 1 and tier[T_REFS, s] == 0:
                found += 1
            s = tier[T_NEXT, s]
        if found < to_evict:
            return False
        s = tier[T_NEXT, head]
        while to_evict > 0:
            nxt = tier[T_NEXT, s]
            if tier[T_READY, s] == 1 and tier[T_REFS, s] == 0:
                _unlink(tier, s)
                slot_of[tier[T_IDENT, s]] = -1
                tier[T_IDENT, s] = -1
                free_slots[KS[0].num_free_slots] = s
                KS[0].num_free_slots += 1
                KS[0].num_blocks -= 1
                to_evict -= 1
            s = nxt
    for k in range(n):
        KS[0].num_free_slots -= 1
        s = free_slots[KS[0].num_free_slots]
        tier[T_IDENT, s] = new[k]
        tier[T_READY, s] = 0
        tier[T_REFS, s] = 0
        slot_of[new[k]] = s
        _link_last(tier, s)
    KS[0].num_blocks += n
    if KS[0].num_blocks > KS[0].max_blocks:
        KS[0].max_blocks = KS[0].num_blocks
    return True


@njit
def complete_store(tier, slot_of, job_blocks, off, n):
    """`LRUOffloadingManager.complete_store`: a store's blocks become ready
    (they were pending, so still held)."""
    for k in range(off, off + n):
        tier[T_READY, slot_of[job_blocks[0, k]]] = 1


@njit
def complete_load(tier, slot_of, job_blocks, off, n):
    """`LRUOffloadingManager.complete_load`: a load's blocks are no longer
    read by it (evictable again once no load reads them)."""
    for k in range(off, off + n):
        tier[T_REFS, slot_of[job_blocks[0, k]]] -= 1


# -- jobs ------------------------------------------------------------------------


@njit
def _new_job(jobs, job_times, KS, kind, request, nblocks, job_blocks):
    """servesim's own: a new row of `jobs` for a store or a load of `nblocks`
    blocks, its times unset (docs/engine.md §9).

    - Job ids only grow; a job is never reused.
    - No room: a RuntimeError (`TierArrays.ensure_room` grows the arrays
      beforehand; kernels never grow them).
    """
    j = KS[0].num_jobs
    if j >= len(jobs) or KS[0].num_job_blocks + nblocks > job_blocks.shape[1]:
        raise RuntimeError("CPU tier: no room for a job (TierArrays.ensure_room)")
    KS[0].num_jobs = j + 1
    jobs[j, J_KIND] = kind
    jobs[j, J_REQ] = request
    jobs[j, J_OFF] = KS[0].num_job_blocks
    jobs[j, J_N] = nblocks
    jobs[j, J_BYTES] = nblocks * KS[0].block_bytes
    jobs[j, J_SEQ] = -1
    job_times[j, JT_SUBMIT] = np.nan
    job_times[j, JT_START] = np.nan
    job_times[j, JT_FINISH] = np.nan
    KS[0].num_job_blocks += nblocks
    return j


# -- the connector's scheduler side (OffloadingConnectorScheduler) ---------------


@njit
def get_num_new_matched_tokens(tier, slot_of, idents, num_tokens, block_size, first_block):
    """`OffloadingConnectorScheduler.get_num_new_matched_tokens`
    (vllm/distributed/kv_transfer/kv_connector/v1/offloading_connector.py):
    the number of blocks to load past a G1 hit of `first_block` blocks.

    - Those are the run of ready tier blocks from there among the request's
      full blocks, `num_tokens // block_size` (the block of its last token
      included: the caller recomputes that token).
    - Every full block held is touched first.
    - -1 when the request must wait and ask again at a later pass: the run
      stops at a block whose store is pending, or a block of it is being
      loaded for another request (REFS > 0: only loads reference tier
      blocks).
    """
    num_full = num_tokens // block_size
    if num_full <= first_block:
        return 0
    touch(tier, slot_of, idents, num_full)
    hits = lookup(tier, slot_of, idents, first_block, num_full)
    if hits < 0:
        return -1
    for k in range(first_block, first_block + hits):
        if tier[T_REFS, slot_of[idents[k]]] > 0:
            return -1
    return hits


@njit
def update_state_after_alloc(tier, slot_of, jobs, job_times, job_blocks, KS, request,
                             idents, table, first_block, num_blocks):
    """`OffloadingConnectorScheduler.update_state_after_alloc`: with the
    manager's `prepare_load`, a load of the request's blocks found by
    `get_num_new_matched_tokens`.

    - The blocks `[first_block, first_block + num_blocks)` load into the G1
      blocks the request now holds there.
    - The tier blocks are referenced (cannot be evicted) until the load
      completes.
    - Returns the job id.
    """
    j = _new_job(jobs, job_times, KS, LOAD, request, num_blocks, job_blocks)
    off = jobs[j, J_OFF]
    for k in range(num_blocks):
        ident = idents[first_block + k]
        tier[T_REFS, slot_of[ident]] += 1
        job_blocks[0, off + k] = ident
        job_blocks[1, off + k] = table[first_block + k]
    return j


@njit(_nrt=True)  # NOTE(refcounts): it allocates (`new`), reached uncounted
def prepare_store(tier, slot_of, free_slots, jobs, job_times, job_blocks, KS, idents, table,
                  first_block, stop_block):
    """`OffloadingConnectorScheduler._get_reqs_to_store`: for one request, a
    store of its blocks `[first_block, stop_block)` not in the tier yet.

    - Pending blocks count as in the tier.
    - The stored blocks enter the tier as pending now.
    - Returns the job id; NO_JOB when the tier cannot make room (nothing
      changes: the caller tries again later); EMPTY_JOB when every block is
      there.
    """
    n = 0
    new = np.empty(stop_block - first_block, dtype=np.int64)
    for k in range(first_block, stop_block):
        if slot_of[idents[k]] < 0:
            new[n] = idents[k]
            n += 1
    if n == 0:
        return EMPTY_JOB
    if not prepare_store_blocks(tier, slot_of, free_slots, KS, new, n):
        return NO_JOB
    j = _new_job(jobs, job_times, KS, STORE, -1, n, job_blocks)
    off = jobs[j, J_OFF]
    m = 0
    for k in range(first_block, stop_block):
        if m < n and idents[k] == new[m]:
            job_blocks[0, off + m] = new[m]
            job_blocks[1, off + m] = table[k]
            m += 1
    return j


# -- the lanes (the worker's transfer_async / get_finished) ----------------------


@njit
def transfer_async(lanes, jobs, job_times, KS, j, at_ms):
    """`OffloadingHandler.transfer_async` (vllm/v1/kv_offload/worker/worker.py):
    put job j on its lane at `at_ms`, with servesim's own lane timing
    (docs/engine.md §9).

    - Stores go device to host, loads host to device.
    - A lane is FIFO by submission instant, ties in submission order: j goes
      after every queued job submitted at or before `at_ms`.
    - The start and finish of the jobs from there on are recomputed: start =
      max(previous finish, submission); a job of n bytes takes n / rate.
    - Nothing is submitted for an instant before the last poll, so j never
      goes ahead of a job already started.
    """
    lane = jobs[j, J_KIND]
    KS[0].seq += 1
    jobs[j, J_SEQ] = KS[0].seq
    job_times[j, JT_SUBMIT] = at_ms
    head = KS[0].lane_head[lane]
    n = KS[0].lane_len[lane]
    q = lanes[lane]
    pos = head + n
    while pos > head and job_times[q[pos - 1], JT_SUBMIT] > at_ms:
        q[pos] = q[pos - 1]
        pos -= 1
    q[pos] = j
    KS[0].lane_len[lane] = n + 1
    t = job_times[q[pos - 1], JT_FINISH] if pos > head else KS[0].lane_free_ms[lane]
    rate = KS[0].lane_rate[lane]
    for k in range(pos, head + n + 1):
        queued = q[k]
        start = max(t, job_times[queued, JT_SUBMIT])
        job_times[queued, JT_START] = start
        t = start + jobs[queued, J_BYTES] / rate
        job_times[queued, JT_FINISH] = t


@njit
def store_done_ms(storing, job_times, gpu_blocks, n):
    """servesim's own: the instant from which G1 blocks `gpu_blocks[:n]` may
    be overwritten (docs/engine.md §9).

    - The end of the latest store submitted reading any of them; 0 if none.
    - A retired store's end is not after the last poll.
    """
    t = 0.0
    for k in range(n):
        j = storing[gpu_blocks[k]]
        if j >= 0 and job_times[j, JT_FINISH] > t:
            t = job_times[j, JT_FINISH]
    return t


@njit
def submit(lanes, storing, jobs, job_times, job_blocks, KS, j, at_ms):
    """servesim's own: the engine's submission of a decided job at `at_ms`
    (docs/engine.md §9).

    - A store goes on the device-to-host lane and marks its G1 blocks as read.
    - A load goes on the host-to-device lane no earlier than the end of the
      stores still reading the G1 blocks it writes.
    - Counts jobs and bytes.
    """
    off = jobs[j, J_OFF]
    n = jobs[j, J_N]
    if jobs[j, J_KIND] == STORE:
        transfer_async(lanes, jobs, job_times, KS, j, at_ms)
        for k in range(off, off + n):
            storing[job_blocks[1, k]] = j
        KS[0].num_stores += 1
        KS[0].bytes_stored += jobs[j, J_BYTES]
    else:
        t = store_done_ms(storing, job_times, job_blocks[1, off:off + n], n)
        transfer_async(lanes, jobs, job_times, KS, j, max(at_ms, t))
        KS[0].num_loads += 1
        KS[0].bytes_loaded += jobs[j, J_BYTES]


@njit
def get_finished(tier, slot_of, lanes, jobs, job_times, job_blocks, KS, R,
                 landed, now):
    """`OffloadingHandler.get_finished` (vllm/v1/kv_offload/worker/worker.py):
    let every transfer finished by `now` take effect, each lane in service
    order.

    - Stored blocks become ready (`complete_store`).
    - Loaded blocks are no longer read (`complete_load`), and the loading
      request's `R[i].kv_load` becomes `landed`.
    - Returns how many jobs retired.
    """
    retired = 0
    for lane in range(2):
        q = lanes[lane]
        head = KS[0].lane_head[lane]
        n = KS[0].lane_len[lane]
        while n > 0 and job_times[q[head], JT_FINISH] <= now:
            j = q[head]
            KS[0].lane_free_ms[lane] = job_times[j, JT_FINISH]
            if lane == STORE:
                complete_store(tier, slot_of, job_blocks, jobs[j, J_OFF], jobs[j, J_N])
            else:
                complete_load(tier, slot_of, job_blocks, jobs[j, J_OFF], jobs[j, J_N])
                R[jobs[j, J_REQ]].kv_load = landed
            head += 1
            n -= 1
            retired += 1
        KS[0].lane_head[lane] = head
        KS[0].lane_len[lane] = n
    return retired


@njit
def next_completion_ms(lanes, job_times, KS):
    """servesim's own: the earliest finish of a transfer not yet retired, or
    -1.0 if none (the idle engine's wake, docs/engine.md §9)."""
    t = -1.0
    for lane in range(2):
        if KS[0].lane_len[lane] > 0:
            f = job_times[lanes[lane][KS[0].lane_head[lane]], JT_FINISH]
            if t < 0 or f < t:
                t = f
    return t


class TierArrays:
    """One rank's CPU tier and lanes as arrays (see the module docstring).
    `ensure_room(jobs, blocks)` grows the job arrays so that that many more
    jobs and job blocks fit (kernels never grow them)."""

    def __init__(self, config, block_size: int, num_identities: int, num_gpu_blocks: int):
        self.capacity = config.num_cpu_blocks
        slots = min(self.capacity, num_identities)  # it never holds more
        self._head = slots
        self.tier = np.empty((NUM_TIER_ROWS, slots + 2), dtype=np.int64)
        self.slot_of = np.empty(max(num_identities, 1), dtype=np.int32)
        self.free_slots = np.empty(max(slots, 1), dtype=np.int64)
        self.KS = records(1, TIER_DTYPE)
        init_tier(self.tier, self.slot_of, self.free_slots, self.KS)
        self.KS[0]["capacity"] = self.capacity
        self.KS[0]["block_bytes"] = config.bytes_per_token * block_size
        self.KS[0]["fill"] = config.connector == "offloading"
        self.KS[0]["block_size"] = block_size
        self.KS[0]["lane_rate"][STORE] = config.d2h_gbps * 1e6  # GB/s = 1e6 B/ms
        self.KS[0]["lane_rate"][LOAD] = config.h2d_gbps * 1e6
        self.storing = np.full(num_gpu_blocks, -1, dtype=np.int64)
        n = 64
        self.jobs = np.zeros((n, NUM_JOB_FIELDS), dtype=np.int64)
        self.job_times = np.zeros((n, 3), dtype=np.float64)
        self.job_blocks = np.zeros((2, n), dtype=np.int64)
        self.lanes = np.zeros((2, n), dtype=np.int64)

    @classmethod
    def empty(cls):
        """A tier of no blocks (the `kv` arrays of a source other than the
        CPU tier, which never touches them)."""
        import types

        config = types.SimpleNamespace(num_cpu_blocks=0, bytes_per_token=0, connector="none",
                                       d2h_gbps=1.0, h2d_gbps=1.0)
        return cls(config, 1, 1, 1)

    def ensure_room(self, num_jobs: int, num_blocks: int) -> bool:
        """True if an array was replaced (callers holding them must re-read)."""
        KS = self.KS
        grown = False
        need = KS[0]["num_jobs"] + num_jobs
        if need > len(self.jobs):
            size = max(need, 2 * len(self.jobs))
            self.jobs = _grown(self.jobs, size, 0)
            self.job_times = _grown(self.job_times, size, 0)
            self.lanes = _grown(self.lanes, size + 1, 1)
            grown = True
        need = KS[0]["num_job_blocks"] + num_blocks
        if need > self.job_blocks.shape[1]:
            self.job_blocks = _grown(self.job_blocks, max(need, 2 * self.job_blocks.shape[1]), 1)
            grown = True
        return grown

    def arrays(self):
        """The tuple the compiled scheduler takes (`servesim.scheduler.scheduler`)."""
        return (self.tier, self.slot_of, self.free_slots, self.jobs, self.job_times,
                self.job_blocks, self.KS)

    # -- for tests and summaries -----------------------------------------------

    def __len__(self):
        return int(self.KS[0]["num_blocks"])

    def __contains__(self, identity):
        return self.slot_of[identity] >= 0

    max_blocks = property(lambda self: int(self.KS[0]["max_blocks"]))

    def identities(self) -> list:
        """Identities held, least recently used first."""
        out = []
        tier = self.tier
        s = int(tier[T_NEXT, self._head])
        while s != self._head + 1:
            out.append(int(tier[T_IDENT, s]))
            s = int(tier[T_NEXT, s])
        return out

    def entry(self, identity):
        """`(ready, refs)` of a held block."""
        s = self.slot_of[identity]
        return bool(self.tier[T_READY, s]), int(self.tier[T_REFS, s])

    def is_ready(self, identity) -> bool:
        s = self.slot_of[identity]
        return bool(s >= 0 and self.tier[T_READY, s])

    def lane_jobs(self, lane) -> list:
        """Job ids not retired on a lane, in service order."""
        head, n = int(self.KS[0]["lane_head"][lane]), int(self.KS[0]["lane_len"][lane])
        return self.lanes[lane, head:head + n].tolist()


def _grown(a, size, axis):
    shape = list(a.shape)
    shape[axis] = size
    out = np.zeros(shape, dtype=a.dtype)
    if axis == 0:
        out[:len(a)] = a
    else:
        out[:, :a.shape[1]] = a
    return out
