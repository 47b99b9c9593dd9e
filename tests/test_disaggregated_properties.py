"""Property-based tests of disaggregated prefill/decode serving
(servesim/engine/kv_handoff.py, servesim/replay/disaggregated.py): small random
workloads through random prefill and decode pools, checked before every
decision and after every pass's outputs on every rank of both pools, and at
the end:

- blocks are conserved on every rank of both pools: each G1 block's ref count
  equals the requests holding it (running, waiting for a pull, or — on a
  prefill rank — finished and held for a decode worker), the free count the
  blocks nobody holds; a request waiting for a pull holds its blocks, counts
  nothing as computed, and until the pull lands its prefill worker still holds
  the source blocks;
- every handed-off request's KV is freed on the prefill side exactly once,
  after its transfer has landed (and nothing else is freed that way); at the
  end no prefill block is held and no pull is pending;
- transfers on one prefill rank's link are FIFO, back to back, and take
  latency + tokens · bytes_per_token / bandwidth;
- when everything fits (both pools hold every request at once), every request
  finishes with exactly its output tokens, its first token from the end of
  its prefill pass, the rest from a decode worker that admitted it with its
  whole prompt cached (pulled or already held) no earlier than the pull landed;
- a run is deterministic: the same pass log, records, summary and transfers.
"""

import warnings
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from servesim.kvcache.block_pool import REF
from servesim.config.config import config_from_dict
from servesim.replay.api import make_replay
from servesim.results.metrics import summarize
from servesim.results.output import request_lines
from servesim.results.records import STATUS_FINISHED, STATUS_UNFINISHED
from helpers import after_every_event, family_prefix_ids, workload_of
from servesim.scheduler.request import KVLoad, RequestStatus

MAX_EVENTS = 100_000
SETTINGS = settings(max_examples=60, deadline=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def scenarios(draw, ample=False):
    """(config data, workload): 1-8 requests of up to 96 prompt tokens in two
    prefix families, open or closed loop, 1-2 prefill and decode workers (1-2
    DP ranks), small pools (or ample ones), random scheduler keys, a slow or
    fast link."""
    n = draw(st.integers(1, 8), label="num_requests")
    input_length, output_length, hash_ids = [], [], []
    unique = 1000
    for _ in range(n):
        prompt = draw(st.integers(1, 96), label="input_length")
        output_length.append(draw(st.integers(1, 24), label="output_length"))
        num_ids = -(-prompt // 16)
        shared = draw(st.integers(0, num_ids), label="shared")
        family = draw(st.integers(0, 1), label="family")
        ids, unique = family_prefix_ids(num_ids, shared, family, unique)
        input_length.append(prompt)
        hash_ids.append(ids)
    arrivals = sorted(draw(st.lists(st.integers(0, 80), min_size=n, max_size=n), label="arrivals"))
    priority = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n), label="priority")
    concurrency = draw(st.sampled_from([None, None, 1, 3]), label="concurrency")
    workload = workload_of(arrivals, input_length, output_length, hash_ids, priority=priority,
                           concurrency=concurrency)
    total_blocks = sum(-(-(p + o) // 16) for p, o in zip(input_length, output_length))

    def blocks(label):
        return total_blocks + 2 if ample else draw(st.integers(3, 16), label=label)

    engine = {
        "block_size": 16,
        "enable_prefix_caching": draw(st.booleans(), label="prefix_caching"),
        "max_num_seqs": draw(st.integers(1, 6), label="max_num_seqs"),
        "max_num_batched_tokens": draw(st.sampled_from([32, 64, 8192]), label="budget"),
        "async_scheduling": draw(st.booleans(), label="async"),
        "scheduling_policy": draw(st.sampled_from(["fcfs", "fcfs", "priority"]), label="policy"),
        "reserve_full_isl": draw(st.booleans(), label="reserve_full_isl"),
        "long_prefill_token_threshold": draw(st.sampled_from([0, 0, 16]), label="threshold"),
        "timing": {"type": "linear", "base_ms": 3, "per_token_ms": 0.05},
    }
    cluster = {
        "mode": "disaggregated",
        "prefill_workers": draw(st.integers(1, 2), label="prefill_workers"),
        "decode_workers": draw(st.integers(1, 2), label="decode_workers"),
        "data_parallel_size": draw(st.sampled_from([1, 1, 2]), label="dp"),
        "router": draw(st.sampled_from(["round_robin", "least_loaded", "least_prefill", "kv_router", {"policy": "kv_router", "kv_event_lag_ms": 15.0}, "weighted"]),
                       label="router"),
        "prefill": {"num_gpu_blocks": blocks("prefill_blocks")},
        "decode": {"num_gpu_blocks": blocks("decode_blocks"),
                   "async_scheduling": draw(st.booleans(), label="decode_async")},
        "kv_transfer": {"bytes_per_token": 62500,  # 16 tokens = 1e6 B
                        "bandwidth_gbps": draw(st.sampled_from([0.05, 0.5, 5.0]), label="gbps"),
                        "latency_ms": draw(st.sampled_from([0.0, 0.5, 3.0]), label="latency")},
    }
    data = {"workload": {"synthetic": {"requests": 1}}, "engine": engine, "cluster": cluster,
            "output": {"pass_log": True}}
    return data, workload


def held(scheduler) -> int:
    """Finished requests whose blocks a prefill rank holds for a transfer."""
    return int(scheduler.S[0]["num_delayed_free_requests"])


def held_requests(scheduler, here) -> list:
    """`(num_blocks, remote_decode)` of each request held for a transfer
    (`here`: the requests routed to this rank; the ranks of a pool share
    one table)."""
    R = scheduler.table.R
    rows = np.flatnonzero(here & (R["status"] == RequestStatus.FINISHED)
                          & (R["num_held_blocks"] > 0))
    return [(int(R["num_held_blocks"][i]), bool(R["do_remote_decode"][i]))
            for i in rows]


def waiting_for_pulls(scheduler) -> list:
    """`(request index, blocks held, tokens computed, pull landed)` of each
    request waiting for its pull."""
    R = scheduler.table.R
    return [(i, int(R["num_held_blocks"][i]), int(R["num_computed_tokens"][i]),
            R["kv_load"][i] != KVLoad.IN_FLIGHT)
           for i in scheduler.waiting_for_kv]


def check_rank(replay, pool, core, rank, now):
    """Blocks conserved on one rank; requests waiting for a pull hold their
    blocks while their source blocks are still held on the prefill side."""
    if pool == "prefill":
        present, worker_of, rank_of = (replay.arrived, replay.prefill_worker_of,
                                       replay.prefill_rank_of)
    else:
        present = [replay.handed_off(i) for i in range(len(replay.workload))]
        worker_of, rank_of = replay.worker_of, replay.rank_of
    here = (np.asarray(present, dtype=bool) & (worker_of == core.index)
            & (rank_of == rank.index))
    holders = Counter()
    for i in np.flatnonzero(here):
        holders.update(replay.blocks_of(pool, i))
    blocks = rank.pool
    refs = blocks.blocks[REF, 1:blocks.num_gpu_blocks]
    assert refs.tolist() == [holders[b] for b in range(1, blocks.num_gpu_blocks)]
    assert blocks.num_free_blocks == int((refs == 0).sum()) == len(blocks.free_queue())
    scheduler = rank.scheduler
    if pool == "prefill":
        requests = held_requests(scheduler, here)
        assert len(requests) == held(scheduler)
        for num_blocks, remote_decode in requests:  # held for a decode worker
            assert num_blocks > 0 and remote_decode
    for i, num_blocks, computed, landed in waiting_for_pulls(scheduler):
        assert num_blocks > 0
        if not landed:
            assert computed == 0
            job = replay.transfer(i)
            if job.land_ms > now:  # in flight: the source is still there
                assert replay.sender_of(i).holds(i)


def check_pools(replay):
    """`check_rank` on every rank of both pools."""
    for pool, cores in (("prefill", replay.prefill_workers), ("decode", replay.decode_workers)):
        for core in cores:
            for rank in core.ranks:
                check_rank(replay, pool, core, rank, replay.loop.now)


def run_checked(data, workload, corrupt=None):
    """Run with the checks on every rank of both pools after each event of any
    worker (the compiled loops stop after each, `after_every_event`);
    returns (replay, result). `corrupt(replay, events)`, if given, runs before
    each check (to show that a broken rule is caught during the run)."""
    replay = make_replay(config_from_dict(data, source="test"), workload)
    events = [0]

    def hook(core):
        events[0] += 1
        assert events[0] <= MAX_EVENTS, "the simulation does not terminate"
        if corrupt is not None:
            corrupt(replay, events[0])
        check_pools(replay)

    after_every_event(replay, hook)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = replay.run()
    if corrupt is None:
        note_events(replay, result, workload)
    return replay, result


def note_events(replay, result, workload):
    """Hypothesis events: what the drawn scenario exercised."""
    event("preemptions" if result.stats.preemptions else "no preemption")
    n = len(workload)
    jobs = [replay.transfer(i) for i in range(n)]
    event("partial pulls" if any(j is not None and 0 < j.tokens < workload.input_length[i]
                                 for i, j in enumerate(jobs)) else "no partial pull")
    event("a handoff with nothing held" if any(
        replay.handed_off(i) and jobs[i] is None and result.records.transferred_tokens[i] == 0
        for i in range(n)) else "every handoff held its blocks")


def check_transfers(replay, data):
    """Freed exactly once after landing; every link FIFO with exact times;
    nothing held or pending at the end."""
    link = data["cluster"]["kv_transfer"]
    freed = Counter()
    for core in replay.prefill_workers:
        for rank in core.ranks:
            sender = rank.transfers
            freed.update(i for i, _ in sender.freed)
            for i, t in sender.freed:
                job = replay.transfer(i)
                assert job is not None and t >= job.land_ms and job.freed_ms == t
            assert not held(rank.scheduler)
            assert rank.pool.num_free_blocks == rank.pool.num_gpu_blocks - 1
            jobs = [replay.transfer(i) for i in range(len(replay.workload))
                    if replay.transfer(i) is not None and replay.sender_of(i) is sender]
            wire = sorted((j for j in jobs if j.tokens), key=lambda j: (j.submit_ms, j.start_ms))
            previous_end = 0.0
            for j in wire:
                assert j.start_ms >= max(j.submit_ms, previous_end)
                seconds = j.tokens * link["bytes_per_token"] / (link["bandwidth_gbps"] * 1e9)
                assert abs(j.finish_ms - j.start_ms - 1000 * seconds) < 1e-9
                assert j.land_ms == j.finish_ms + link["latency_ms"]
                previous_end = j.finish_ms
            for j in jobs:
                if not j.tokens:  # a notice: no wire, the latency only
                    assert j.land_ms == j.submit_ms + link["latency_ms"]
    moved = [i for i in range(len(replay.workload)) if replay.transfer(i) is not None]
    assert freed == Counter(moved)  # exactly once each, and only those
    for core in replay.decode_workers:
        for rank in core.ranks:
            assert not rank.scheduler.waiting_for_kv


def test_the_cross_pool_check_runs_during_the_run_and_catches_a_source_freed_early():
    # 2 requests of 64 prompt tokens on a 0.05 GB/s link: each pull of 4
    # blocks (4e6 B) is in flight for 80 ms, so the decode rank waits on it
    # over several events. Dropping the prefill side's hold on a request
    # whose pull is still in flight (its source blocks freed early) breaks the
    # rule `check_rank` states, and the run fails at that event, not after it.
    workload = workload_of([0, 0], [64, 64], [4, 4], [[1, 2, 3, 4], [5, 6, 7, 8]])
    data = {"workload": {"synthetic": {"requests": 1}},
            "engine": {"block_size": 16,
                       "timing": {"type": "linear", "base_ms": 3, "per_token_ms": 0.05}},
            "cluster": {"mode": "disaggregated", "prefill_workers": 1, "decode_workers": 1,
                        "prefill": {"num_gpu_blocks": 16}, "decode": {"num_gpu_blocks": 16},
                        "kv_transfer": {"bytes_per_token": 62500, "bandwidth_gbps": 0.05}}}
    replay, result = run_checked(data, workload, corrupt=lambda replay, event: None)  # it holds
    assert (result.records.status == STATUS_FINISHED).all()
    broken = []

    def free_a_source_early(replay, event):
        for core in replay.decode_workers:
            for rank in core.ranks:
                for i, _, _, landed in waiting_for_pulls(rank.scheduler):
                    if not landed and not broken:
                        replay.sides.prefill.R["num_held_blocks"][i] = 0
                        broken.append(event)

    with pytest.raises(AssertionError):
        run_checked(data, workload, corrupt=free_a_source_early)
    assert broken


@settings(SETTINGS, max_examples=300)
@given(scenario=scenarios())
def test_blocks_are_conserved_and_prefill_kv_is_freed_once_after_its_transfer(scenario):
    data, workload = scenario
    replay, result = run_checked(data, workload)
    check_transfers(replay, data)
    for i, status in enumerate(result.records.status):
        if status == STATUS_FINISHED:
            assert replay.blocks_of("prefill", i) == replay.blocks_of("decode", i) == []
    # FCFS never livelocks: a request is unfinished only if its whole sequence
    # outgrows a decode rank (blocks held for transfers come back)
    if data["engine"]["scheduling_policy"] == "fcfs":
        usable = data["cluster"]["decode"]["num_gpu_blocks"] - 1
        for i in np.flatnonzero(result.records.status == STATUS_UNFINISHED):
            P, O = int(workload.input_length[i]), int(workload.output_length[i])
            assert -(-(P + O - 1) // 16) > usable, result.records.ids[i]


@settings(SETTINGS, max_examples=200)
@given(scenario=scenarios(ample=True))
def test_when_everything_fits_every_request_finishes_with_exactly_its_output_tokens(scenario):
    data, workload = scenario
    replay, result = run_checked(data, workload)
    check_transfers(replay, data)
    records = result.records
    assert (records.status == STATUS_FINISHED).all()
    assert records.output_tokens.tolist() == workload.output_length.tolist()
    assert result.stats.preemptions == 0
    first_token_end = {}
    for p in result.pass_log:
        if p["pool"] == "prefill":
            for rid in p["finished"]:
                first_token_end[rid] = p["end_ms"]
    decode_entries = {}
    for p in result.pass_log:
        if p["pool"] == "decode":
            for e in p["scheduled"]:
                decode_entries.setdefault(e["id"], (p["start_ms"], e))
    for i, rid in enumerate(records.ids):
        P, O = int(workload.input_length[i]), int(workload.output_length[i])
        assert records.first_token_ms[i] == first_token_end[rid]
        times = records.token_client_ms[records.token_offsets[i]:records.token_offsets[i + 1]]
        assert (np.diff(times) >= 0).all()
        if O == 1:
            assert not replay.handed_off(i) and records.decode_worker[i] == -1
            continue
        start, entry = decode_entries[rid]
        # admitted once, with the whole prompt's KV: 1 token to compute
        assert (entry["kind"], entry["tokens"], entry["cached"]) == ("new", 1, P)
        job = replay.transfer(i)
        assert 0 <= records.transferred_tokens[i] == job.tokens <= P
        if job.tokens:
            assert start >= job.land_ms
            assert records.kv_transfer_ms[i] == job.land_ms - job.submit_ms
        assert records.worker[i] == records.decode_worker[i] >= 0


@settings(SETTINGS, max_examples=200)
@given(scenario=scenarios())
def test_a_disaggregated_run_is_deterministic(scenario):
    # the same pass log, request lines, summary (pools and transfers included)
    # and transfers, run after run
    data, workload = scenario
    cfg = config_from_dict(data, source="test")
    results = []
    for _ in range(2):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            replay = make_replay(cfg, workload)
            result = replay.run()
        lines = [line for chunk in request_lines(result) for line in chunk]
        results.append((result.pass_log, lines, summarize(result, {}, 0.0),
                        [replay.transfer(i) for i in range(len(workload))]))
    reference, compiled = results  # first and second run
    assert compiled[0] == reference[0]
    assert compiled[1] == reference[1]
    assert compiled[2] == reference[2]
    assert compiled[3] == reference[3]
