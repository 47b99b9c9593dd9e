"""The CPU tier's connector for the compiled scheduler (docs/engine.md §9): one
rank's tier as the arrays and kernels of `servesim.kvcache.cpu_tier`,
with the summary counters and views of its jobs for tests. Jobs are ids into
those arrays; the scheduler side (lookup, loads, stores) runs inside the
compiled scheduler's kernels (`servesim.scheduler.scheduler`), the time side
(`get_finished`, `submit`, `store_done_ms`, `next_completion_ms`) inside the
compiled pass loop (`servesim.engine.pass_loop`), on the same arrays.
"""

import numpy as np

from servesim.kvcache import cpu_tier as ct


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


class CPUTierConnector:
    """One rank's CPU tier with its lanes, as arrays (`tier`, a
    :class:`~servesim.kvcache.cpu_tier.TierArrays`).
    `submitted_jobs()` lists every job submitted so far (for tests)."""

    def __init__(self, config, pool, table):
        self.config = config
        self.block_size = pool.block_size
        self.stores_as_blocks_fill = config.connector == "offloading"
        self.tier = ct.TierArrays(config, pool.block_size, len(pool.idmap), pool.num_gpu_blocks)
        self.table = table

    num_blocks = property(lambda self: len(self.tier))
    hit_tokens = property(lambda self: int(self.tier.KS[0]["hit_tokens"]))
    num_loads = property(lambda self: int(self.tier.KS[0]["num_loads"]))
    num_stores = property(lambda self: int(self.tier.KS[0]["num_stores"]))
    bytes_loaded = property(lambda self: int(self.tier.KS[0]["bytes_loaded"]))
    bytes_stored = property(lambda self: int(self.tier.KS[0]["bytes_stored"]))

    def submitted_jobs(self) -> list:
        """Views of every job submitted, in submission order (job ids only
        grow and every job keeps its row; `J_SEQ` is its submission's rank)."""
        t = self.tier
        seq = t.jobs[:t.KS[0]["num_jobs"], ct.J_SEQ]
        order = np.flatnonzero(seq >= 0)
        return [JobView(t, int(j)) for j in order[np.argsort(seq[order], kind="stable")]]

    def jobs_in_flight(self, kind: str) -> list:
        """Views of the jobs not yet retired on the lane of `kind` ("store",
        "load"), in service order (for tests)."""
        lane = ct.STORE if kind == ct.STORE_NAME else ct.LOAD
        return [JobView(self.tier, j) for j in self.tier.lane_jobs(lane)]
