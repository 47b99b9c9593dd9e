"""Property-based tests of the CPU tier (docs/engine.md §9, §7 "With a CPU
tier"): a stateful machine over the tier alone, and small random simulations
with the tier on, checked at every decision and at the end:

- G1 + CPU bookkeeping conserves blocks: every G1 block's ref count equals the
  requests holding it (running, waiting for a load, or anything else), the
  free count equals the blocks nobody holds; the tier never holds more than
  `num_cpu_blocks`, each identity once; a tier block is pending exactly while
  a store of it is on the device-to-host lane, and referenced exactly by the
  loads on the host-to-device lane;
- lanes are FIFO by submission instant and take bytes / bandwidth;
- under async scheduling no request of the pass in flight is preempted;
- nothing is loaded that was not stored (and the store done) before;
- without the key (or with `kv_offloading: null`) a run is byte-identical to
  a run without the tier's code paths, and a tier that can never be hit
  (unique prompts, no preemption) changes no scheduling decision, only delays
  passes.
"""

import json
import types
import warnings
from collections import Counter

import attrs
import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from servesim.kvcache import cpu_tier as ct
from servesim.kvcache.block_pool import REF
from cpu_tier_model import CPUTier
from servesim.config.config import config_from_dict
from servesim.replay.driver import Replay
from servesim.results.metrics import summarize
from servesim.results.records import STATUS_FINISHED
from servesim.scheduler import request as ft
from helpers import after_every_event, family_prefix_ids, workload_of

TRACE_BLOCK_SIZE = 16
MAX_PASSES = 100_000
SETTINGS = settings(max_examples=80, deadline=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# --------------------------------------------------------------------------- the tier alone


class CPUTierMachine(RuleBasedStateMachine):
    """Stores, completions, loads and lookups on a small tier, against a
    model of which blocks must survive (pending or referenced ones)."""

    CAPACITY = 4
    UNIVERSE = 8

    def __init__(self):
        super().__init__()
        self.tier = CPUTier(self.CAPACITY)
        self.pending = set()
        self.refs = Counter()

    @rule(ids=st.lists(st.integers(0, UNIVERSE - 1), min_size=1, max_size=3, unique=True))
    def store(self, ids):
        new = [i for i in ids if i not in self.tier]
        before = self.tier.identities()
        evictable = sum(1 for i in before if i not in self.pending and not self.refs[i])
        ok = self.tier.add_pending(new)
        assert ok == (len(before) + len(new) - self.CAPACITY <= evictable)
        if ok:
            self.pending.update(new)
            assert self.tier.identities()[len(self.tier) - len(new):] == new
        else:
            assert self.tier.identities() == before

    @rule(k=st.integers(0, UNIVERSE - 1))
    def complete_store(self, k):
        if self.pending:
            i = sorted(self.pending)[k % len(self.pending)]
            self.tier.complete_store([i])
            self.pending.discard(i)

    @rule(ids=st.lists(st.integers(0, UNIVERSE - 1), max_size=4, unique=True))
    def lookup_then_load(self, ids):
        hits, pending = self.tier.lookup(ids)
        run = ids[:hits]
        assert all(self.tier.is_ready(i) for i in run)
        if hits < len(ids):
            assert pending == (ids[hits] in self.pending)
            assert not self.tier.is_ready(ids[hits])
        self.tier.ref(run)
        self.refs.update(run)

    @rule(k=st.integers(0, UNIVERSE - 1))
    def complete_load(self, k):
        loading = sorted(+self.refs)
        if loading:
            i = loading[k % len(loading)]
            self.tier.unref([i])
            self.refs[i] -= 1

    @rule(ids=st.lists(st.integers(0, UNIVERSE - 1), max_size=4, unique=True))
    def touch(self, ids):
        held = [i for i in ids if i in self.tier]
        self.tier.touch(ids)
        if held:  # the first held identity is now the most recently used
            assert self.tier.identities()[-1] == held[0]

    @invariant()
    def never_over_capacity_and_unique(self):
        ids = self.tier.identities()
        assert len(ids) <= self.CAPACITY and len(set(ids)) == len(ids)
        assert self.tier.max_blocks <= self.CAPACITY

    @invariant()
    def pending_and_referenced_blocks_survive(self):
        for i in self.pending | set(+self.refs):
            assert i in self.tier
        for i in self.pending:
            assert not self.tier.is_ready(i)


CPUTierMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40,
                                            deadline=None)
TestCPUTier = CPUTierMachine.TestCase


class KernelTier:
    """The compiled tier (servesim/kvcache/cpu_tier.py) behind the
    `CPUTier` interface, each operation through the kernel the compiled
    scheduler calls."""

    def __init__(self, capacity, universe):
        config = types.SimpleNamespace(num_cpu_blocks=capacity, bytes_per_token=1,
                                       connector="simple_cpu", d2h_gbps=1.0, h2d_gbps=1.0)
        self.t = ct.TierArrays(config, 16, universe, 4)

    def __len__(self):
        return len(self.t)

    def __contains__(self, identity):
        return identity in self.t

    def identities(self):
        return self.t.identities()

    def is_ready(self, identity):
        return self.t.is_ready(identity)

    max_blocks = property(lambda self: self.t.max_blocks)

    def add_pending(self, new):
        t = self.t
        return bool(ct.prepare_store_blocks(t.tier, t.slot_of, t.free_slots, t.KS,
                                            np.array(new, dtype=np.int64), len(new)))

    def _blocks(self, ids):
        return np.array([ids, [0] * len(ids)], dtype=np.int64).reshape(2, len(ids))

    def complete_store(self, ids):
        ct.complete_store(self.t.tier, self.t.slot_of, self._blocks(ids), 0, len(ids))

    def lookup(self, ids):
        n = ct.lookup(self.t.tier, self.t.slot_of, np.array(ids, dtype=np.int64), 0, len(ids))
        return (n, False) if n >= 0 else (-n - 1, True)

    def ref(self, ids):  # a load's references, as the connector's load takes them
        t = self.t
        t.ensure_room(1, len(ids))
        ct.update_state_after_alloc(t.tier, t.slot_of, t.jobs, t.job_times, t.job_blocks,
                                    t.KS, 0, np.array(ids, dtype=np.int64),
                                    np.zeros(len(ids), dtype=np.int32), 0, len(ids))

    def unref(self, ids):
        ct.complete_load(self.t.tier, self.t.slot_of, self._blocks(ids), 0, len(ids))

    def touch(self, ids):
        ct.touch(self.t.tier, self.t.slot_of, np.array(ids, dtype=np.int64), len(ids))


class PairedTier:
    """The model `CPUTier` (tests/cpu_tier_model.py) and the compiled one in lockstep: every
    operation must give the same answer and leave the same LRU order."""

    def __init__(self, capacity, universe):
        self.a = CPUTier(capacity)
        self.b = KernelTier(capacity, universe)

    def _both(self, name, *args):
        x = getattr(self.a, name)(*args)
        y = getattr(self.b, name)(*args)
        assert x == y, (name, args, x, y)
        assert self.a.identities() == self.b.identities()
        assert self.a.max_blocks == self.b.max_blocks
        return x

    def __len__(self):
        return self._both("__len__")

    def __contains__(self, identity):
        return self._both("__contains__", identity)

    def __getattr__(self, name):
        return lambda *args: self._both(name, *args)

    @property
    def max_blocks(self):
        return self._both("__getattribute__", "max_blocks")


class PairedTierMachine(CPUTierMachine):
    """The same machine over the compiled tier checked against the model."""

    def __init__(self):
        super().__init__()
        self.tier = PairedTier(self.CAPACITY, self.UNIVERSE)


PairedTierMachine.TestCase.settings = CPUTierMachine.TestCase.settings
TestCompiledCPUTier = PairedTierMachine.TestCase


# --------------------------------------------------------------------------- simulations


@st.composite
def scenarios(draw, unique_prompts=False, ample=False, burst=False, reuse=False):
    """(engine keys, workload): 1-8 requests of up to 96 prompt tokens in two
    prefix families (or unique prompts), a small G1 pool (or an ample one),
    either connector, a small CPU tier and slow or fast lanes. `reuse`: 4-12
    requests arriving over 600 ms, so that prefixes leave G1 and come back."""
    n = draw(st.integers(4, 12) if reuse else st.integers(1, 8), label="num_requests")
    input_length, output_length, hash_ids = [], [], []
    unique = 1000
    for _ in range(n):
        prompt = draw(st.integers(1, 96), label="input_length")
        output_length.append(draw(st.integers(1, 24), label="output_length"))
        num_ids = -(-prompt // TRACE_BLOCK_SIZE)
        shared = 0 if unique_prompts else draw(st.integers(0, num_ids), label="shared")
        family = draw(st.integers(0, 1), label="family")
        ids, unique = family_prefix_ids(num_ids, shared, family, unique)
        input_length.append(prompt)
        hash_ids.append(ids)
    if burst:
        arrivals = [0] * n
    else:
        arrivals = sorted(draw(st.lists(st.integers(0, 600 if reuse else 80), min_size=n,
                                        max_size=n), label="arrivals"))
    workload = workload_of(arrivals, input_length, output_length, hash_ids,
                           trace_block_size=TRACE_BLOCK_SIZE)
    total_blocks = sum(-(-(p + o) // 16) for p, o in zip(input_length, output_length))
    engine = {
        "block_size": 16,
        "num_gpu_blocks": (total_blocks + 2 if ample
                           else draw(st.integers(4, 16), label="num_gpu_blocks")),
        "enable_prefix_caching": draw(st.booleans(), label="prefix_caching") or ample,
        "max_num_seqs": draw(st.integers(1, 6), label="max_num_seqs"),
        "max_num_batched_tokens": draw(st.sampled_from([32, 64, 8192]), label="budget"),
        "async_scheduling": draw(st.booleans(), label="async"),
        "scheduling_policy": draw(st.sampled_from(["fcfs", "fcfs", "priority"]), label="policy"),
        "timing": {"type": "linear", "base_ms": 10, "per_token_ms": 0},
        "kv_offloading": {
            "num_cpu_blocks": draw(st.integers(1, 12) | st.integers(12, 64), label="cpu_blocks"),
            "bytes_per_token": 62500,  # 1e6-byte blocks
            "d2h_gbps": draw(st.sampled_from([0.05, 0.5, 5.0]), label="d2h"),
            "h2d_gbps": draw(st.sampled_from([0.05, 0.5, 5.0]), label="h2d"),
            "connector": draw(st.sampled_from(["offloading", "simple_cpu"]), label="connector"),
        },
    }
    return engine, workload


def make_config(engine, data_parallel_size=1):
    return config_from_dict({"workload": {"synthetic": {"requests": 1}}, "engine": engine,
                             "cluster": {"data_parallel_size": data_parallel_size},
                             "output": {"pass_log": True}})


class View:
    """One request's scheduler state: row i of the scheduler's table."""

    def __init__(self, replay, i):
        t = replay.store.table
        R = t.R
        self.exists = not np.isnan(t.R["arrival_time"][i])
        off = R["block_offset"][i]
        self.blocks = t.tables[off:off + R["num_held_blocks"][i]].tolist()
        self.computed = int(R["num_computed_tokens"][i])
        self.loading = R["kv_load"][i] != ft.KVLoad.NONE
        self.in_flight = int(R["num_passes_in_flight"][i])


def check_g1(replay, rank):
    """Every G1 block's ref count equals its holders; free = blocks nobody holds."""
    pool = rank.pool
    holders = Counter()
    for i in range(len(replay.workload)):
        view = View(replay, i)
        if view.exists and replay.rank_of[i] == rank.index:
            holders.update(view.blocks)
    refs = pool.blocks[REF, 1:pool.num_gpu_blocks]
    assert refs.tolist() == [holders[b] for b in range(1, pool.num_gpu_blocks)]
    assert pool.num_free_blocks == int((refs == 0).sum()) == len(pool.free_queue())
    for request in rank.scheduler.waiting_for_kv:  # they hold their blocks while waiting
        view = View(replay, request)
        assert len(view.blocks) > 0
        if view.loading:  # nothing counts as computed before the load is done
            assert view.computed == 0


def check_tier(connector):
    """Capacity, uniqueness; pending <=> a store on the d2h lane, refs <=>
    loads on the h2d lane (checked before a decision's schedule, when every
    decided store has been submitted and finished transfers polled)."""
    tier = connector.tier
    ids = tier.identities()
    assert len(ids) <= tier.capacity and len(set(ids)) == len(ids)
    storing = {i for job in connector.jobs_in_flight("store") for i in job.identities}
    loading = Counter(i for job in connector.jobs_in_flight("load") for i in job.identities)
    for i in ids:
        ready, refs = tier.entry(i)
        assert ready == (i not in storing)
        assert refs == loading[i]
    assert storing <= set(ids) and set(loading) <= set(ids)


def run_checked(engine, workload, data_parallel_size=1):
    """Run with invariant checks on every rank after each event of the
    compiled pass loop (a decision, with every job it decided submitted and
    the transfers finished by then polled; a pass's outputs); returns
    (replay, result, jobs of every rank). The horizon stops the loop after
    every event (it bounds the events run, never moves them)."""
    replay = Replay(make_config(engine, data_parallel_size), workload)
    events = [0]
    ranks = replay.workers[0].ranks
    R = replay.store.table.R
    before = {"preemptions": R["num_preemptions"].copy(),
              "in_flight": R["num_passes_in_flight"] > 0}

    def check_event(core):
        for rank in ranks:
            check_tier(rank.connector)
            check_g1(replay, rank)
        events[0] += 1
        assert events[0] <= 2 * MAX_PASSES, "the simulation does not terminate"
        # §7: a request the pass in flight runs is never preempted
        preempted = R["num_preemptions"] > before["preemptions"]
        assert not (preempted & before["in_flight"]).any()
        before["preemptions"] = R["num_preemptions"].copy()
        before["in_flight"] = R["num_passes_in_flight"] > 0

    after_every_event(replay, check_event)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = replay.run()
    assert events[0] > 0 or not result.stats.passes  # the checks ran
    event("cpu loads" if result.stats.cpu_tier_loads else "no cpu load")
    event("preemptions" if result.stats.preemptions else "no preemption")
    return replay, result, [rank.connector.submitted_jobs() for rank in ranks]


@settings(SETTINGS, max_examples=200)
@given(scenarios(), st.sampled_from([1, 1, 2]))
def test_bookkeeping_conserves_blocks_and_loads_only_what_was_stored(scenario, dp):
    engine, workload = scenario
    replay, result, logs = run_checked(engine, workload, dp)
    tier_cfg = engine["kv_offloading"]
    for rank, jobs in zip(replay.workers[0].ranks, logs):
        assert rank.connector.tier.max_blocks <= tier_cfg["num_cpu_blocks"]
        check_jobs(tier_cfg, jobs)
    jobs = [job for jobs in logs for job in jobs]

    # counters agree with the jobs and with the per-request figures
    stats = result.stats
    assert stats.cpu_tier_loads == sum(j.kind == "load" for j in jobs)
    assert stats.cpu_tier_stores == sum(j.kind == "store" for j in jobs)
    assert stats.cpu_tier_bytes_loaded == sum(j.nbytes for j in jobs if j.kind == "load")
    assert stats.cpu_tier_hit_tokens == int(result.records.cpu_tier_cached_tokens.sum())
    loaded = sum(16 * j.num_blocks for j in jobs if j.kind == "load")
    assert stats.cpu_tier_hit_tokens <= loaded
    # a request that finished left no block behind
    for i, status in enumerate(result.records.status):
        view = View(replay, i)
        if view.exists and status == STATUS_FINISHED:
            assert view.blocks == [] and not view.loading


def check_jobs(tier_cfg, jobs):
    """One rank's transfers: nothing is loaded that was not stored (and the
    store done) before; each lane is FIFO by submission instant, back to back,
    and takes bytes / bandwidth."""
    block_bytes = 62500 * 16
    stored_at = {}
    for job in jobs:
        if job.kind == "store":
            for i in job.identities:
                stored_at.setdefault(i, job.finish_ms)
        else:
            for i in job.identities:
                assert i in stored_at and stored_at[i] <= job.submit_ms

    for kind, gbps in (("store", tier_cfg["d2h_gbps"]), ("load", tier_cfg["h2d_gbps"])):
        lane = sorted((j for j in jobs if j.kind == kind), key=lambda j: j.start_ms)
        assert [j.submit_ms for j in lane] == sorted(j.submit_ms for j in lane)
        previous_end = 0.0
        for j in lane:
            assert j.start_ms >= max(j.submit_ms, previous_end)
            assert j.nbytes == block_bytes * j.num_blocks
            assert abs(j.finish_ms - j.start_ms - j.nbytes / (gbps * 1e6)) < 1e-9
            previous_end = j.finish_ms


def _strip(result):
    """summary.json (no wall time), passes and per-request arrays, as text."""
    summary = summarize(result, {}, 0.0)
    records = {k: v.tolist() for k, v in attrs.asdict(result.records, recurse=False).items()
               if isinstance(v, np.ndarray)}
    return tuple(json.dumps(x, sort_keys=True) for x in (summary, list(result.pass_log), records))


@settings(SETTINGS, max_examples=40)
@given(scenarios())
def test_no_key_and_a_null_key_give_byte_identical_runs(scenario):
    engine, workload = scenario
    engine = dict(engine)
    del engine["kv_offloading"]
    without = Replay(make_config(engine), workload)
    null = Replay(make_config({**engine, "kv_offloading": None}), workload)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a, b = without.run(), null.run()
    assert _strip(a) == _strip(b)
    assert all(rank.connector is None for w in null.workers for rank in w.ranks)
    assert "cpu_tier_loads" not in summarize(b, {}, 0.0)


@settings(SETTINGS, max_examples=60)
@given(scenarios(unique_prompts=True, ample=True, burst=True))
def test_a_tier_that_is_never_hit_changes_no_decision_only_delays(scenario):
    # Unique prompts, every request at 0, a pool holding every request at once:
    # no preemption, so nobody ever looks up a block of its own, and nobody else
    # has it. Same passes (scheduled, finished, free blocks) and results; a
    # pass may only start later (a block it reuses is still being stored).
    engine, workload = scenario
    with_tier = run_checked(engine, workload)[1]
    engine = {k: v for k, v in engine.items() if k != "kv_offloading"}
    plain = Replay(make_config(engine), workload).run()
    assert with_tier.stats.cpu_tier_loads == 0 and with_tier.stats.cpu_tier_hit_tokens == 0
    assert plain.stats.preemptions == with_tier.stats.preemptions == 0

    def decisions(log):
        return [(p["scheduled"], p["finished"], p["preempted"], p["free_blocks_after_schedule"])
                for p in log]

    assert decisions(with_tier.pass_log) == decisions(plain.pass_log)
    for p, q in zip(with_tier.pass_log, plain.pass_log):
        assert p["start_ms"] >= q["start_ms"]
        assert abs((p["end_ms"] - p["start_ms"]) - (q["end_ms"] - q["start_ms"])) < 1e-9
    for field in ("output_tokens", "num_preemptions", "first_admission_cached_tokens",
                  "recomputed_tokens", "first_token_pass", "finish_pass"):
        assert (getattr(with_tier.records, field) == getattr(plain.records, field)).all()
