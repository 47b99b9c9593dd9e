"""The CPU tier's compiled lanes and connector kernels
(servesim/kvcache/cpu_tier.py) against the reference objects
(tests/cpu_tier_model.py, the test oracle): the same submissions and polls give the same
start and finish instants, the same `store_done_ms` and
`next_completion_ms`, and a landed load marks its request; plus the
connector's answers (`get_num_new_matched_tokens`, `prepare_store`) on hand
cases."""

import types

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.kvcache import cpu_tier as ct
from servesim.kvcache.config import KVOffloadingConfig
from servesim.scheduler.request import REQUEST_DTYPE
from cpu_tier_model import LOAD, STORE, CPUOffloadConnector, TransferJob

BLOCK_SIZE = 16
NUM_GPU_BLOCKS = 8


def tier_config(num_cpu_blocks=64, connector="offloading", d2h=0.5, h2d=2.0):
    return types.SimpleNamespace(num_cpu_blocks=num_cpu_blocks, bytes_per_token=62500,
                                 connector=connector, d2h_gbps=d2h, h2d_gbps=h2d)


def kernel_submit(t, kind, identities, gpu_blocks, request, at):
    """Make and submit a job on the compiled tier, its blocks pending (store)
    or referenced (load) as the scheduler side leaves them."""
    t.ensure_room(1, len(identities))
    ids = np.array(identities, dtype=np.int64)
    table = np.array(gpu_blocks, dtype=np.int32)
    if kind == STORE:
        j = ct.prepare_store(t.tier, t.slot_of, t.free_slots, t.jobs, t.job_times,
                             t.job_blocks, t.KS, ids, table, 0, len(ids))
    else:
        j = ct.update_state_after_alloc(t.tier, t.slot_of, t.jobs, t.job_times, t.job_blocks,
                                        t.KS, request, ids, table, 0, len(ids))
    assert j >= 0
    ct.submit(t.lanes, t.storing, t.jobs, t.job_times, t.job_blocks, t.KS, j, at)
    return j


@st.composite
def schedules(draw):
    """Steps of (kind, gpu blocks, submission delay past now, poll advance)."""
    steps = []
    for _ in range(draw(st.integers(1, 25))):
        steps.append((draw(st.sampled_from([STORE, LOAD])),
                      draw(st.lists(st.integers(1, NUM_GPU_BLOCKS - 1), min_size=1, max_size=3,
                                    unique=True)),
                      draw(st.sampled_from([0.0, 0.0, 1.5, 4.0])),
                      draw(st.sampled_from([0.0, 0.5, 2.0, 7.0]))))
    return steps


@settings(max_examples=150, deadline=None)
@given(schedules())
def test_lanes_match_the_reference_connector(steps):
    config = tier_config()
    ref = CPUOffloadConnector(KVOffloadingConfig(**vars(config)), BLOCK_SIZE)
    t = ct.TierArrays(config, BLOCK_SIZE, 1000, NUM_GPU_BLOCKS)
    R = np.zeros(len(steps), dtype=REQUEST_DTYPE)  # a request table: kv_load is read
    ref_jobs, ids = [], []
    stored = []  # identities ready or pending, for loads to read
    now = 0.0
    next_ident = 0
    for k, (kind, gpu_blocks, delay, advance) in enumerate(steps):
        if kind == LOAD:
            ready = [i for i in stored if ref.tier.is_ready(i)]
            if not ready:
                kind = STORE
            else:
                identities = ready[:len(gpu_blocks)]
                gpu_blocks = gpu_blocks[:len(identities)]
                delay = 0.0  # loads go out at the decision that queues them
        if kind == STORE:
            identities = list(range(next_ident, next_ident + len(gpu_blocks)))
            next_ident += len(gpu_blocks)
            assert ref.tier.add_pending(identities)
            stored.extend(identities)
        else:
            ref.tier.ref(identities)
            for i in identities:
                ref._loading[i] = ref._loading.get(i, 0) + 1
        job = TransferJob(kind, identities, gpu_blocks,
                          len(identities) * ref.block_bytes, request=k)
        ref.submit(job, now + delay)
        ref_jobs.append(job)
        ids.append(kernel_submit(t, kind, identities, gpu_blocks, k, now + delay))
        for b in range(1, NUM_GPU_BLOCKS):
            # a retired store's end is not past the last poll: equal past "now"
            found = ct.store_done_ms(t.storing, t.job_times, np.array([b], dtype=np.int64), 1)
            assert max(now, ref.store_done_ms([b])) == max(now, found)
        now += advance
        ref.poll(now)
        ct.get_finished(t.tier, t.slot_of, t.lanes, t.jobs, t.job_times, t.job_blocks, t.KS,
                        R, 2, now)
        expected = ref.next_completion_ms()
        found = ct.next_completion_ms(t.lanes, t.job_times, t.KS)
        assert (expected is None and found < 0) or expected == found
        for job, j in zip(ref_jobs, ids):
            assert (job.submit_ms, job.start_ms, job.finish_ms) == tuple(t.job_times[j])
            if job.kind == LOAD:
                assert bool(R["kv_load"][job.request] == 2) == job.done
        for i in stored:
            assert ref.tier.entry(i) == t.entry(i)
    assert ref.num_stores == t.KS[0]["num_stores"] and ref.num_loads == t.KS[0]["num_loads"]
    assert ref.bytes_stored == t.KS[0]["bytes_stored"]
    assert ref.bytes_loaded == t.KS[0]["bytes_loaded"]


def test_lookup_waits_on_a_pending_block_or_one_being_loaded_and_touches_first_block_last():
    t = ct.TierArrays(tier_config(num_cpu_blocks=8), BLOCK_SIZE, 100, NUM_GPU_BLOCKS)
    idents = np.array([10, 11, 12, 13], dtype=np.int64)
    table = np.array([1, 2, 3, 4], dtype=np.int32)
    args = (t.tier, t.slot_of, t.free_slots, t.jobs, t.job_times, t.job_blocks, t.KS)
    t.ensure_room(4, 16)
    j = ct.prepare_store(*args, idents, table, 0, 3)  # 10, 11, 12 pending
    assert j >= 0 and t.identities() == [10, 11, 12]
    assert ct.prepare_store(*args, idents, table, 0, 3) == ct.EMPTY_JOB  # all there
    # 64 tokens: 4 full blocks; G1 hit of 1 block; the run from block 1 is pending
    match = (t.tier, t.slot_of, idents, 64, BLOCK_SIZE)
    assert ct.get_num_new_matched_tokens(*match, 1) == -1
    assert t.identities() == [12, 11, 10]  # touched, the first held block last
    ct.complete_store(t.tier, t.slot_of, t.job_blocks, t.jobs[j, ct.J_OFF], 3)
    assert ct.get_num_new_matched_tokens(*match, 1) == 2  # 11, 12 (13 is not held)
    assert ct.get_num_new_matched_tokens(*match, 4) == 0  # nothing past the hit
    load = ct.update_state_after_alloc(t.tier, t.slot_of, t.jobs, t.job_times, t.job_blocks,
                                       t.KS, 0, idents, table, 1, 2)
    assert t.entry(11) == (True, 1) and t.entry(12) == (True, 1)
    assert ct.get_num_new_matched_tokens(*match, 1) == -1  # being loaded for another
    ct.complete_load(t.tier, t.slot_of, t.job_blocks, t.jobs[load, ct.J_OFF], 2)
    assert ct.get_num_new_matched_tokens(*match, 1) == 2


def test_prepare_store_evicts_ready_unreferenced_blocks_or_drops_the_job():
    t = ct.TierArrays(tier_config(num_cpu_blocks=3), BLOCK_SIZE, 100, NUM_GPU_BLOCKS)
    args = (t.tier, t.slot_of, t.free_slots, t.jobs, t.job_times, t.job_blocks, t.KS)
    t.ensure_room(8, 32)
    a = np.array([1, 2, 3], dtype=np.int64)
    table = np.array([1, 2, 3], dtype=np.int32)
    j = ct.prepare_store(*args, a, table, 0, 3)
    assert t.identities() == [1, 2, 3] and t.max_blocks == 3
    b = np.array([7, 8], dtype=np.int64)
    assert ct.prepare_store(*args, b, table, 0, 2) == ct.NO_JOB  # all pending: dropped
    assert t.identities() == [1, 2, 3]
    ct.complete_store(t.tier, t.slot_of, t.job_blocks, t.jobs[j, ct.J_OFF], 3)
    ct.update_state_after_alloc(t.tier, t.slot_of, t.jobs, t.job_times, t.job_blocks, t.KS,
                                0, a, table, 0, 1)  # a load reads 1
    k = ct.prepare_store(*args, b, table, 0, 2)
    assert k >= 0 and t.identities() == [1, 7, 8]  # 2, 3 evicted; 1 is referenced
    off = t.jobs[k, ct.J_OFF]
    assert t.job_blocks[:, off:off + 2].tolist() == [[7, 8], [1, 2]]
    assert t.jobs[k, ct.J_BYTES] == 2 * 62500 * BLOCK_SIZE and len(t) == 3
