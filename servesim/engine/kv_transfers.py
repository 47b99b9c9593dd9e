"""The time side of KV transfers at a worker's decisions and pass ends
(docs/engine.md §9, §13): what the scheduler's connector hooks decided
(scheduler/kv_connector.py, the `kv.KO` rows) put on the CPU tier's lanes
(`_submit_decided`, `_submit_finished_stores`, `_submit`), the jobs done by now
taking effect (`_poll`), the next completion and the stores still reading a
pass's blocks (`_next_completion_ms`, `_store_done_ms`), room for the next
call's jobs (`_kv_room`), and a decode rank's pulls on their links
(`_submit_pulls`, `_next_land`). The tier's own rules are kvcache/cpu_tier.py.
"""

import numpy as np
from numba.core import types
from numba.extending import overload

# (compiled in: Numba's cache of this file does not see pricing.py's kernels
# change; edit this line with them. Table layout 4.)
from servesim.jit import njit
from servesim.kvcache import cpu_tier as ct
from servesim.scheduler import output
from servesim.scheduler.request import KVHandoff, KVLoad
from servesim.engine import kv_handoff



def rank_kv(kv_t, r):
    """Rank r's `kv` bundle, or None for a worker without KV transfers
    (`kv_t` None): one call site per kernel for both specialisations of the
    loop (Numba picks the body by `kv_t`'s type when it compiles)."""
    return None if kv_t is None else kv_t[r]


@overload(rank_kv)
def _rank_kv(kv_t, r):
    if isinstance(kv_t, types.NoneType):
        return lambda kv_t, r: None
    return lambda kv_t, r: kv_t[r]


@njit
def _kv_room(kv_t, sched_t, ranks, width, num_gpu_blocks):
    """Whether every rank's CPU-tier job arrays hold the jobs of one call
    (`RankScheduler._kv`'s bound, which `TierArrays.ensure_room` grows to)."""
    for r in range(ranks):
        kv = kv_t[r]
        KS = kv.KS
        jobs = 2 * width + min(sched_t[r].S[0].num_waiting, num_gpu_blocks)
        if (KS[0].num_jobs + jobs > kv.jobs.shape[0]
                or KS[0].num_job_blocks + 3 * num_gpu_blocks > kv.job_blocks.shape[1]):
            return False
    return True


@njit
def _submit(kv, j, at_ms):
    """A decided CPU-tier job onto its lane at `at_ms` (cpu_tier.submit)."""
    ct.submit(kv.lanes, kv.storing, kv.jobs, kv.job_times, kv.job_blocks, kv.KS, j, at_ms)


@njit
def _next_completion_ms(kv_t, ranks):
    """The earliest finish of a CPU-tier transfer not yet retired on any
    rank (-1.0: none)."""
    t = -1.0
    for r in range(ranks):
        kv = kv_t[r]
        f = ct.next_completion_ms(kv.lanes, kv.job_times, kv.KS)
        if f >= 0 and (t < 0 or f < t):
            t = f
    return t


@njit
def _poll(kv, R, now):
    """The CPU tier's `get_finished` at a decision: transfers done by now
    take effect (a landed load marks its request KVLoad.LANDED)."""
    KS = kv.KS
    if KS[0].lane_len[ct.STORE] or KS[0].lane_len[ct.LOAD]:
        ct.get_finished(kv.tier, kv.slot_of, kv.lanes, kv.jobs, kv.job_times, kv.job_blocks, KS,
                        R, KVLoad.LANDED, now)


@njit
def _submit_decided(kv, now):
    """A decision's `simple_cpu` preemption stores, then its loads, go out at
    the decision instant."""
    KO, KC = kv.KO, kv.KC
    for k in range(KC[output.KO_PSTORES]):
        _submit(kv, KO[output.KO_PSTORES, k], now)
    for k in range(KC[output.KO_LOADS]):
        _submit(kv, KO[output.KO_LOADS, k], now)


@njit
def _submit_finished_stores(kv, at_ms):
    """A finished request's store goes out with its free: at once when
    synchronous; under async scheduling the pass in flight was decided while
    the request still held its blocks, so at that pass's end (`at_ms`)."""
    KO, KC = kv.KO, kv.KC
    for k in range(KC[output.KO_FSTORES]):
        _submit(kv, KO[output.KO_FSTORES, k], at_ms)
    KC[output.KO_FSTORES] = 0


@njit
def _store_done_ms(kv):
    """The instant from which the G1 blocks a decided pass writes may be
    overwritten: the end of the stores still reading them (docs/engine.md §9)."""
    n = kv.KC[output.KO_NEW_BLOCKS]
    if n == 0:
        return 0.0
    return ct.store_done_ms(kv.storing, kv.job_times, kv.KO[output.KO_NEW_BLOCKS], n)


@njit
def _next_land(side_pending_t, side_state_t, XF, ranks):
    """The earliest landing among the ranks' pending handoff transfers
    (-1.0: none)."""
    t = np.inf
    for r in range(ranks):
        t = min(t, kv_handoff.next_land(side_pending_t[r], side_state_t[r][0].num_pending,
                                         XF))
    return t if t < np.inf else -1.0


@njit
def _submit_pulls(R, kv, pending, state, XI, XF, link_free, link_of, xparams, now, pulls, n):
    """A decode rank's pulls and notices decided now go on their prefill
    ranks' links (`HandoffReceiver.submit`); each is listed in `pulls` for its
    sender. Returns the new count."""
    KO, KC = kv.KO, kv.KC
    for k in range(KC[output.KO_LOADS]):
        i = KO[output.KO_LOADS, k]
        tokens = 0
        if R[i].kv_handoff == KVHandoff.PULLING:  # waiting for the pull
            tokens = R[i].num_prompt_tokens - R[i].num_g1_hit_tokens
        kv_handoff.submit_transfer(XI, XF, link_free, i, link_of[i], tokens, xparams[0],
                                    xparams[1], xparams[2], now)
        pulls[n] = i
        n += 1
        if tokens:
            kv_handoff.wait_on(pending, state, i)
    return n
