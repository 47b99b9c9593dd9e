"""Invariants of the SGLang engine (docs/sglang.md) on random small
workloads: KV slots are conserved between the allocator, the radix tree and
the requests; a locked prefix is never evicted; the tree's evictable count
is what is on no locked path; every request finishes (no starvation)."""

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.sglang.config import SGLangConfig
from servesim.sglang.req import Req
from servesim.sglang.scheduler import Scheduler


class CheckedScheduler(Scheduler):
    """A worker in the debug mode: the invariants of servesim/sglang/check.py
    (slots conserved, locked prefixes in the tree and counted out of the
    evictable tokens, rows within the slots) after every step and result."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, check=True, **kwargs)


@st.composite
def cases(draw):
    page = draw(st.sampled_from([1, 4]))
    # KV pressure: a low initial ratio over-commits the pool, decodes retract
    pressure = draw(st.booleans())
    cfg = SGLangConfig(
        max_total_tokens=page * draw(st.integers(80 // page, 200 // page)),
        page_size=page,
        chunked_prefill_size=draw(st.sampled_from([-1, 16, 48])),
        max_running_requests=draw(st.integers(1, 6)),
        schedule_policy=draw(st.sampled_from(["fcfs", "lpm"])),
        schedule_conservativeness=draw(st.sampled_from([0.05, 0.3, 1.0])),
        disable_radix_cache=draw(st.booleans()),
        disable_overlap_schedule=draw(st.booleans()),
        ignore_eos=False if pressure else draw(st.booleans()),
    )
    if pressure:
        cfg = attrs.evolve(cfg, schedule_conservativeness=0.05, max_running_requests=8)
    if cfg.chunked_prefill:
        cfg = attrs.evolve(cfg, enable_mixed_chunk=draw(st.booleans()))
    n = draw(st.integers(4 if pressure else 1, 8))
    reqs, t = [], 0.0
    for i in range(n):
        t += 0.0 if pressure else draw(st.sampled_from([0.0, 0.0, 3.0, 40.0]))
        family = draw(st.integers(0, 2))
        length = draw(st.integers(2, 30))
        prompt = [family * 100 + k for k in range(draw(st.integers(0, 20)))]
        prompt = (prompt + [10_000 + i * 100 + k for k in range(length)])[:length]
        m = draw(st.integers(20 if pressure else 1, 40))
        eos = 0 if pressure else draw(st.integers(0, m))
        reqs.append(Req(i, f"r{i}", t, prompt, m, eos if eos < m else 0, cfg.ignore_eos))
    return cfg, reqs


@settings(max_examples=60, deadline=None, derandomize=True)
@given(cases())
def test_slots_are_conserved_and_every_request_finishes(case):
    cfg, reqs = case
    scheduler = CheckedScheduler(cfg, reqs, lambda b: 1.0 + 0.01 * b.num_tokens)
    scheduler.run()
    assert all(r.finished for r in reqs)
    assert scheduler.rows_used == 0 and not scheduler.running and not scheduler.waiting
    # everything left is the tree's, and none of it is locked
    assert scheduler.pool.free + scheduler.tree.total_size() == cfg.max_total_tokens
    assert scheduler.tree.evictable_size() == scheduler.tree.total_size()
    for r in reqs:
        limit = r.eos_at if (r.eos_at and not r.ignore_eos) else r.max_new_tokens
        assert len(r.outputs) == limit


@settings(max_examples=30, deadline=None, derandomize=True)
@given(cases(), st.integers(2, 3), st.sampled_from(["round_robin", "least_loaded"]))
def test_workers_on_one_clock_conserve_and_finish(case, num_workers, router):
    """The same invariants on every worker of a cluster; no request is
    scheduled before it arrives, and its worker's passes never go back in time."""
    from servesim.sglang.cluster import Cluster

    cfg, reqs = case
    workers = [CheckedScheduler(cfg, [], lambda b: 1.0 + 0.01 * b.num_tokens)
               for _ in range(num_workers)]
    cluster = Cluster(workers, router)
    cluster.arrivals = reqs
    cluster.run()
    assert all(r.finished for r in reqs)
    assert all(r.first_scheduled_ms >= r.arrival_ms for r in reqs)
    for w in workers:
        starts = [p["start_ms"] for p in w.passes]
        assert starts == sorted(starts)
        assert w.pool.free + w.tree.total_size() == cfg.max_total_tokens
