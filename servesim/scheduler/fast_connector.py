"""The CPU tier's connector for the compiled scheduler (docs/engine.md §9): the
interface the engine core asks of a rank's transfers (`poll`, `submit`,
`store_done_ms`, `next_completion_ms`, and the summary counters) over the
arrays and kernels of `servesim.kvcache.cpu_tier_kernels`. Jobs are ids into
those arrays; the scheduler side (lookup, loads, stores) runs inside the
compiled scheduler's kernels (`servesim.scheduler.fast`).

The per-pass work is compiled (`get_finished`, `submit`, `store_done_ms`,
`next_completion_ms` in cpu_tier_kernels.py), so a compiled pass loop can call
it on the same arrays; the methods here are thin wrappers for the engine
core's pass-by-pass path.
"""

import numpy as np

from servesim.kvcache import cpu_tier_kernels as ct
from servesim.scheduler.fast_table import KVLoad


class JobView:
    """A read-only view of one job (for tests): its kind, blocks and
    instants, read from the tier's arrays when asked."""

    __slots__ = ("_tier", "_j")

    def __init__(self, tier, j):
        self._tier = tier
        self._j = j

    def _field(self, f):
        return int(self._tier.jobs[self._j, f])

    kind = property(lambda self: (ct.STORE_NAME, ct.LOAD_NAME)[self._field(ct.J_KIND)])
    nbytes = property(lambda self: self._field(ct.J_BYTES))
    num_blocks = property(lambda self: self._field(ct.J_N))
    submit_ms = property(lambda self: float(self._tier.job_times[self._j, ct.JT_SUBMIT]))
    start_ms = property(lambda self: float(self._tier.job_times[self._j, ct.JT_START]))
    finish_ms = property(lambda self: float(self._tier.job_times[self._j, ct.JT_FINISH]))

    def _blocks(self, row):
        off, n = self._field(ct.J_OFF), self._field(ct.J_N)
        return self._tier.job_blocks[row, off:off + n].tolist()

    identities = property(lambda self: self._blocks(0))
    gpu_blocks = property(lambda self: self._blocks(1))


class FastCPUConnector:
    """One rank's CPU tier with its lanes, as arrays (`tier`, a
    :class:`~servesim.kvcache.cpu_tier_kernels.TierArrays`).
    `submitted_jobs()` lists every job submitted so far (for tests)."""

    def __init__(self, config, pool, table):
        self.config = config
        self.block_size = pool.block_size
        self.stores_as_blocks_fill = config.connector == "offloading"
        self.tier = ct.TierArrays(config, pool.block_size, len(pool.idmap), pool.num_gpu_blocks)
        self.table = table

    num_blocks = property(lambda self: len(self.tier))
    hit_tokens = property(lambda self: int(self.tier.KS[ct.K_HIT_TOKENS]))
    num_loads = property(lambda self: int(self.tier.KS[ct.K_NUM_LOADS]))
    num_stores = property(lambda self: int(self.tier.KS[ct.K_NUM_STORES]))
    bytes_loaded = property(lambda self: int(self.tier.KS[ct.K_BYTES_LOADED]))
    bytes_stored = property(lambda self: int(self.tier.KS[ct.K_BYTES_STORED]))

    def submit(self, job: int, at_ms: float):
        """Put job `job` on its lane at `at_ms` (see `cpu_tier_kernels.submit`)."""
        t = self.tier
        ct.submit(t.lanes, t.storing, t.jobs, t.job_times, t.job_blocks, t.KS, t.KF, job,
                  at_ms)

    def poll(self, now: float):
        """Let every transfer finished by `now` take effect; a landed load
        marks its request `KVLoad.LANDED`."""
        t = self.tier
        if t.KS[ct.K_LEN + ct.STORE] or t.KS[ct.K_LEN + ct.LOAD]:
            ct.get_finished(t.tier, t.slot_of, t.lanes, t.jobs, t.job_times, t.job_blocks,
                            t.KS, t.KF, self.table.R, KVLoad.LANDED, now)

    def store_done_ms(self, gpu_blocks) -> float:
        """The instant from which these G1 blocks may be overwritten."""
        blocks = np.asarray(gpu_blocks, dtype=np.int64)
        if not len(blocks):
            return 0.0
        return ct.store_done_ms(self.tier.storing, self.tier.job_times, blocks, len(blocks))

    def next_completion_ms(self):
        """The earliest finish of a transfer not yet retired, or None."""
        t = self.tier
        if not (t.KS[ct.K_LEN + ct.STORE] or t.KS[ct.K_LEN + ct.LOAD]):
            return None
        return float(ct.next_completion_ms(t.lanes, t.job_times, t.KS))

    def submitted_jobs(self) -> list:
        """Views of every job submitted, in submission order (job ids only
        grow and every job keeps its row; `J_SEQ` is its submission's rank)."""
        t = self.tier
        seq = t.jobs[:t.KS[ct.K_JOBS], ct.J_SEQ]
        order = np.flatnonzero(seq >= 0)
        return [JobView(t, int(j)) for j in order[np.argsort(seq[order], kind="stable")]]

    def jobs_in_flight(self, kind: str) -> list:
        """Views of the jobs not yet retired on the lane of `kind` ("store",
        "load"), in service order (for tests)."""
        lane = ct.STORE if kind == ct.STORE_NAME else ct.LOAD
        return [JobView(self.tier, j) for j in self.tier.lane_jobs(lane)]
