"""A pure-Python model of one rank's CPU KV tier (docs/engine.md §9): the
test oracle that tests/test_cpu_tier_kernels_vs_model.py and
tests/test_cpu_tier_properties.py hold the kernels of
servesim/kvcache/cpu_tier.py to, operation by operation. The rules
are stated there; this is their second statement in objects, for tests only
(vLLM: vllm/v1/kv_offload/lru_manager.py, offloading_connector.py).

Callers pass "now". Times are in ms.
"""

import bisect
from collections import OrderedDict

from servesim.kvcache.config import KVOffloadingConfig

STORE = "store"
LOAD = "load"

_READY, _REFS = 0, 1  # fields of a tier entry


class CPUTier:
    """The CPU block store: identity -> [ready, refs], in LRU order (vLLM's
    `LRUOffloadingManager`; a pending block is vLLM's `ref_cnt == -1`)."""

    def __init__(self, num_blocks: int):
        self.capacity = num_blocks
        self._entries = OrderedDict()
        self.max_blocks = 0
        self._order_version = 0  # bumped whenever the LRU order changes
        self._last_touch = (None, -1)  # (identities, order version right after)

    def __len__(self):
        return len(self._entries)

    def __contains__(self, identity):
        return identity in self._entries

    def identities(self) -> list:
        """Identities held, least recently used first (for tests)."""
        return list(self._entries)

    def entry(self, identity):
        """`(ready, refs)` of a held block (for tests)."""
        ready, refs = self._entries[identity]
        return ready, refs

    def is_ready(self, identity) -> bool:
        entry = self._entries.get(identity)
        return entry is not None and entry[_READY]

    def lookup(self, identities):
        """`(hits, pending)`: the run of leading ready blocks, and whether it
        stopped at a pending one."""
        hits = 0
        for identity in identities:
            entry = self._entries.get(identity)
            if entry is None:
                return hits, False
            if not entry[_READY]:
                return hits, True
            hits += 1
        return hits, False

    def touch(self, identities):
        """Mark the blocks most recently used, the first one last. (The same
        touch again with nothing reordered since is skipped: a waiting head
        that cannot be admitted looks its blocks up at every pass.)"""
        last, version = self._last_touch
        if version == self._order_version and identities == last:
            return
        entries = self._entries
        for identity in reversed(identities):
            if identity in entries:
                entries.move_to_end(identity)
        self._order_version += 1
        self._last_touch = (identities, self._order_version)

    def add_pending(self, identities) -> bool:
        """Make room for and insert `identities` (none of them held) as pending
        blocks, evicting least-recently-used ready unreferenced blocks; False,
        changing nothing, if that cannot make enough room."""
        entries = self._entries
        to_evict = len(entries) + len(identities) - self.capacity
        if to_evict > 0:
            victims = []
            for identity, entry in entries.items():
                if entry[_READY] and entry[_REFS] == 0:
                    victims.append(identity)
                    if len(victims) == to_evict:
                        break
            else:
                return False
            for identity in victims:
                del entries[identity]
        for identity in identities:
            entries[identity] = [False, 0]
        self._order_version += 1
        if len(entries) > self.max_blocks:
            self.max_blocks = len(entries)
        return True

    def complete_store(self, identities):
        for identity in identities:
            self._entries[identity][_READY] = True

    def ref(self, identities):
        """A load reads these blocks: they cannot be evicted until `unref`."""
        for identity in identities:
            self._entries[identity][_REFS] += 1

    def unref(self, identities):
        for identity in identities:
            self._entries[identity][_REFS] -= 1


class TransferJob:
    """One store (device to host) or load (host to device) of whole blocks:
    their identities and GPU block ids, its bytes, and — once submitted — its
    submission, start and finish instants. `request` is the loading request
    (None for stores); `done` is set when a `poll` retires the job."""

    __slots__ = ("kind", "identities", "gpu_blocks", "nbytes", "request", "submit_ms",
                 "start_ms", "finish_ms", "done")

    def __init__(self, kind, identities, gpu_blocks, nbytes, request=None):
        self.kind = kind
        self.identities = identities
        self.gpu_blocks = gpu_blocks
        self.nbytes = nbytes
        self.request = request
        self.submit_ms = self.start_ms = self.finish_ms = float("nan")
        self.done = False

    @property
    def num_blocks(self) -> int:
        return len(self.identities)

    def __repr__(self):
        return (f"TransferJob({self.kind}, blocks={self.num_blocks}, submit={self.submit_ms}, "
                f"start={self.start_ms}, finish={self.finish_ms})")


class TransferLane:
    """One copy lane, FIFO by submission instant (ties: submission order).

    A job may be submitted for a future instant (a store that goes out at the
    end of a pass already decided); the jobs not yet retired are kept in
    service order and their start and finish instants recomputed from the
    insertion point on. A job is never inserted ahead of one already started,
    because nothing is submitted for an instant before "now"."""

    def __init__(self, gbps: float):
        self.bytes_per_ms = gbps * 1e6  # GB/s = 1e9 B/s = 1e6 B/ms
        self._jobs = []
        self._keys = []
        self._seq = 0
        self._free_ms = 0.0  # finish of the last retired job

    def submit(self, job: TransferJob, at_ms: float):
        job.submit_ms = at_ms
        self._seq += 1
        key = (at_ms, self._seq)
        i = bisect.bisect_right(self._keys, key)
        self._keys.insert(i, key)
        self._jobs.insert(i, job)
        t = self._jobs[i - 1].finish_ms if i else self._free_ms
        for queued in self._jobs[i:]:
            queued.start_ms = max(t, queued.submit_ms)
            queued.finish_ms = queued.start_ms + queued.nbytes / self.bytes_per_ms
            t = queued.finish_ms

    def retire(self, now: float) -> list:
        """Take out the jobs finished by `now`, in order."""
        jobs = self._jobs
        n = 0
        while n < len(jobs) and jobs[n].finish_ms <= now:
            n += 1
        if not n:
            return []
        done = jobs[:n]
        del jobs[:n]
        del self._keys[:n]
        self._free_ms = done[-1].finish_ms
        return done

    def next_finish_ms(self):
        return self._jobs[0].finish_ms if self._jobs else None

    def __len__(self):
        return len(self._jobs)


class CPUOffloadConnector:
    """One rank's CPU tier with its lanes: what the scheduler asks at
    admission (`lookup`, `prepare_load`) and when blocks fill or are freed
    (`prepare_store`), and what the engine core does over time (`submit`,
    `poll`, `store_done_ms`). Counters feed the summary; `log`, when set to a
    list before the run, collects every submitted job (for tests)."""

    def __init__(self, config: KVOffloadingConfig, block_size: int):
        self.config = config
        self.block_size = block_size
        self.block_bytes = config.bytes_per_token * block_size
        self.stores_as_blocks_fill = config.connector == "offloading"
        self.tier = CPUTier(config.num_cpu_blocks)
        self.d2h = TransferLane(config.d2h_gbps)
        self.h2d = TransferLane(config.h2d_gbps)
        self._storing = {}  # GPU block -> the latest store job reading it, until retired
        self._loading = {}  # identity -> loads in flight reading it
        self.num_loads = self.num_stores = 0
        self.bytes_loaded = self.bytes_stored = 0
        self.hit_tokens = 0
        self.log = None

    @property
    def num_blocks(self) -> int:
        return len(self.tier)

    # -- scheduler side --------------------------------------------------------

    def lookup(self, request, first_block: int):
        """Blocks to load past a G1 hit of `first_block` blocks
        (`get_num_new_matched_tokens`): the run of ready blocks from there
        among the request's full blocks, `num_tokens // block_size` (the block
        of the last token included: the caller recomputes that token). Returns
        `(num_blocks, wait)`; `wait` when the run stops at a block whose store
        is pending, or a block of it is being loaded for another request —
        vLLM then asks again at a later pass."""
        num_full = request.num_tokens // self.block_size
        if num_full <= first_block:
            return 0, False
        identities = request.idents[:num_full].tolist()
        self.tier.touch(identities)
        hits, pending = self.tier.lookup(identities[first_block:])
        if pending:
            return 0, True
        if hits and self._loading and any(
                i in self._loading for i in identities[first_block:first_block + hits]):
            return 0, True
        return hits, False

    def prepare_load(self, request, first_block: int, num_blocks: int) -> TransferJob:
        """A load of the request's blocks `[first_block, first_block +
        num_blocks)` (found by `lookup`) into the G1 blocks it now holds there;
        the CPU blocks are protected from eviction until it completes."""
        stop = first_block + num_blocks
        identities = request.idents[first_block:stop].tolist()
        self.tier.ref(identities)
        for identity in identities:
            self._loading[identity] = self._loading.get(identity, 0) + 1
        return TransferJob(LOAD, identities, request.block_table[first_block:stop].tolist(),
                           num_blocks * self.block_bytes, request)

    def prepare_store(self, request, first_block: int, stop_block: int):
        """A store of the request's blocks `[first_block, stop_block)` not in
        the tier yet; they enter it as pending now. None when the tier cannot
        make room (nothing changes); a job of 0 blocks when all are there."""
        identities = request.idents[first_block:stop_block].tolist()
        tier = self.tier
        positions = [first_block + k for k, i in enumerate(identities) if i not in tier]
        new = [identities[p - first_block] for p in positions]
        if new and not tier.add_pending(new):
            return None
        table = request.block_table
        return TransferJob(STORE, new, [int(table[p]) for p in positions],
                           len(new) * self.block_bytes)

    # -- engine side -----------------------------------------------------------

    def submit(self, job: TransferJob, at_ms: float):
        """Put a job on its lane at `at_ms`; a load into G1 blocks that a store
        in flight still reads goes out when that store completes."""
        if not job.num_blocks:
            return
        if job.kind == STORE:
            self.d2h.submit(job, at_ms)
            for b in job.gpu_blocks:
                self._storing[b] = job
            self.num_stores += 1
            self.bytes_stored += job.nbytes
        else:
            self.h2d.submit(job, max(at_ms, self.store_done_ms(job.gpu_blocks)))
            self.num_loads += 1
            self.bytes_loaded += job.nbytes
        if self.log is not None:
            self.log.append(job)

    def jobs_in_flight(self, kind: str) -> list:
        """The jobs not yet retired on the lane of `kind` (STORE, LOAD), in
        service order (for tests)."""
        return list((self.d2h if kind == STORE else self.h2d)._jobs)

    def poll(self, now: float):
        """Let every transfer finished by `now` take effect: stored blocks
        become ready, loaded blocks unprotected, and a loading request's
        job `done`."""
        for job in self.d2h.retire(now):
            self.tier.complete_store(job.identities)
            for b in job.gpu_blocks:
                if self._storing.get(b) is job:
                    del self._storing[b]
            job.done = True
        for job in self.h2d.retire(now):
            self.tier.unref(job.identities)
            for identity in job.identities:
                left = self._loading[identity] - 1
                if left:
                    self._loading[identity] = left
                else:
                    del self._loading[identity]
            job.done = True

    def store_done_ms(self, gpu_blocks) -> float:
        """The instant from which these G1 blocks may be overwritten: the end
        of the last store in flight reading any of them (0 if none)."""
        storing = self._storing
        if not storing:
            return 0.0
        t = 0.0
        for b in gpu_blocks:
            job = storing.get(b)
            if job is not None and job.finish_ms > t:
                t = job.finish_ms
        return t

    def next_completion_ms(self):
        """The earliest finish of a transfer not yet retired, or None."""
        times = [t for t in (self.d2h.next_finish_ms(), self.h2d.next_finish_ms())
                 if t is not None]
        return min(times) if times else None
