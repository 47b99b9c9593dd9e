"""Property-based tests of several workers and attention-DP ranks
(docs/engine.md §11, spec README §3 `cluster`, §4 closed loop, §6): small
random workloads on 1-3 workers of 1-3 ranks, each router, sync and async,
open and closed loop, some requests pinned to a rank, checked for:

- routing: every arrived request is routed exactly once, to a real worker and
  rank (its pinned rank when it has one), and counted by that worker;
- service: no request is admitted twice or served on another rank than its
  own, a finished request produces exactly its output tokens and finishes in
  exactly one logged pass;
- lockstep: the ranks of a worker share pass boundaries (one decision, one
  start, one end per group pass), group passes do not overlap, and the
  worker's `passes` / `busy_ms` are its group passes and their durations;
- closed loop: at most N requests in flight, the k-th release at the k-th
  completion;
- telemetry: one sample per worker and rank per tick, ticks at i·interval,
  counters that sum to the run's totals;
- independence: given the routing, each worker runs as if alone;
- the compiled runs of passes (without the pass log) change nothing.

Workloads are built directly as :class:`Workload` objects (hash ids at
trace_block_size 16, in two prefix families so that least_prefill has prefixes to
find); configs go through `config_from_dict` (the `workload.synthetic` block
is a placeholder the validation needs). CLUSTER_EXAMPLES=N in the environment
runs N examples per property instead of 100 (for a longer search).
"""

import math
import os
import warnings
from collections import Counter, defaultdict

import attrs
import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from servesim.config.config import config_from_dict
from servesim.replay.api import simulate
from servesim.results.records import STATUS_FINISHED, STATUS_REJECTED
from servesim.workload.workload import Workload
from helpers import family_prefix_ids, workload_of

TRACE_BLOCK_SIZE = 16
BLOCK_SIZE = 16

SETTINGS = settings(max_examples=int(os.environ.get("CLUSTER_EXAMPLES", 100)),
                    deadline=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def ceil_div(a, b):
    return -(-a // b)


@st.composite
def scenarios(draw, closed_loop=None):
    """(config, workload). With `closed_loop` True every request fits the pool
    alone (so all finish and the closed loop's releases are exact); None
    draws open or closed loop."""
    workers = draw(st.integers(1, 3), label="workers")
    dp = draw(st.integers(1, 3), label="data_parallel_size")
    router = draw(st.sampled_from(["round_robin", "least_loaded", "least_prefill", "kv_router", {"policy": "kv_router", "kv_event_lag_ms": 15.0}, "weighted"]), label="router")
    async_scheduling = draw(st.booleans(), label="async_scheduling")
    num_gpu_blocks = draw(st.integers(8, 24) | st.integers(8, 64), label="num_gpu_blocks")
    if closed_loop is None:
        closed_loop = draw(st.booleans(), label="closed_loop")
    concurrency = draw(st.integers(1, 5), label="concurrency") if closed_loop else None
    telemetry = draw(st.sampled_from([None, 2.5, 7.0, 0.3]), label="telemetry_interval_ms")
    config = config_from_dict({
        "workload": {"synthetic": {"requests": 1}},  # placeholder, see module docstring
        "engine": {
            "block_size": BLOCK_SIZE,
            "num_gpu_blocks": num_gpu_blocks,
            "max_num_seqs": draw(st.integers(1, 8), label="max_num_seqs"),
            "max_num_batched_tokens": draw(st.sampled_from([16, 64, 256]), label="budget"),
            "async_scheduling": async_scheduling,
            "timing": {"type": "linear",
                       "base_ms": draw(st.sampled_from([1.0, 2.5]), label="base_ms"),
                       "per_token_ms": draw(st.sampled_from([0.0, 0.1]), label="per_token_ms")},
        },
        "cluster": {"workers": workers, "data_parallel_size": dp, "router": router},
        "output": {"pass_log": True, "telemetry_interval_ms": telemetry},
    })

    usable_tokens = (num_gpu_blocks - 1) * BLOCK_SIZE
    n = draw(st.integers(1, 14), label="num_requests")
    arrivals = sorted(draw(st.lists(st.integers(0, 40), min_size=n, max_size=n),
                           label="arrivals"))
    prompts, outputs, ranks, hash_ids = [], [], [], []
    unique = 1000
    for _ in range(n):
        max_prompt = min(160, usable_tokens) if closed_loop else 160
        prompt = draw(st.integers(1, max_prompt), label="input_length")
        max_output = 30
        if closed_loop:  # the most tokens ever computed, P + O - 1, fit the pool
            max_output = max(1, min(max_output, usable_tokens - prompt + 1))
        outputs.append(draw(st.integers(1, max_output), label="output_length"))
        prompts.append(prompt)
        num_ids = ceil_div(prompt, TRACE_BLOCK_SIZE)
        shared = draw(st.integers(0, num_ids), label="shared_trace_blocks")
        family = draw(st.integers(0, 1), label="prefix_family")
        ids, unique = family_prefix_ids(num_ids, shared, family, unique)
        hash_ids.append(ids)
        pinned = draw(st.integers(0, 3), label="pinned") == 0  # one in four
        ranks.append(draw(st.integers(0, dp - 1), label="dp_rank") if pinned else -1)
    workload = workload_of(arrivals, prompts, outputs, hash_ids, dp_rank=ranks,
                           trace_block_size=TRACE_BLOCK_SIZE, concurrency=concurrency)
    return config, workload


def run(scenario, pass_log=True):
    config, workload = scenario
    if not pass_log:
        config = attrs.evolve(config, output=attrs.evolve(config.output, pass_log=False))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "could never finish" is expected for some inputs
        result = simulate(config, workload)
    status = result.records.status
    event("preemptions" if result.stats.preemptions else "no preemption")
    event("prefix hits" if result.stats.prefix_cache_hits else "no prefix hit")
    event("all finished" if (status == STATUS_FINISHED).all() else "not all finished")
    return result


# --------------------------------------------------------------------------- properties


@SETTINGS
@given(scenarios())
def test_every_request_is_routed_once_and_served_by_its_rank_at_most_once(scenario):
    config, workload = scenario
    cluster = config.cluster
    result = run(scenario)
    rec, log = result.records, result.pass_log
    n = len(workload)
    # routed exactly once, to a real target, its pinned rank if any
    assert ((rec.worker >= 0) & (rec.worker < cluster.workers)).all()
    assert ((rec.dp_rank >= 0) & (rec.dp_rank < cluster.data_parallel_size)).all()
    pinned = workload.dp_rank >= 0
    assert (rec.dp_rank[pinned] == workload.dp_rank[pinned]).all()
    # a worker's `requests` counts every request routed to it (rejected ones
    # too), so the workers' requests add up to the workload
    per_worker = Counter(int(w) for w in rec.worker)
    assert [w.requests for w in result.stats.workers] == [
        per_worker[w] for w in range(cluster.workers)]
    assert sum(w.requests for w in result.stats.workers) == len(workload)
    if workload.concurrency is None:
        assert (rec.arrival_ms == workload.arrival_ms).all()

    index = {rid: i for i, rid in enumerate(rec.ids)}
    new, finished_in = Counter(), Counter()
    for p in log:
        for e in p["scheduled"]:
            i = index[e["id"]]
            assert (rec.worker[i], rec.dp_rank[i]) == (p["worker"], p["dp_rank"])
            if e["kind"] == "new":
                new[e["id"]] += 1
        for rid in p["finished"]:
            i = index[rid]
            assert (rec.worker[i], rec.dp_rank[i]) == (p["worker"], p["dp_rank"])
            finished_in[rid] += 1
    assert max(new.values(), default=0) <= 1
    for i in range(n):
        rid = rec.ids[i]
        if rec.status[i] == STATUS_FINISHED:
            assert new[rid] == 1 and finished_in[rid] == 1
            assert rec.output_tokens[i] == workload.output_length[i]
            assert len(rec.token_client_ms[rec.token_offsets[i]:rec.token_offsets[i + 1]]) \
                == workload.output_length[i]
        else:
            assert finished_in[rid] == 0
        if rec.status[i] == STATUS_REJECTED:
            assert new[rid] == 0


@SETTINGS
@given(scenarios())
def test_ranks_of_a_worker_share_pass_boundaries(scenario):
    result = run(scenario)
    groups = defaultdict(dict)  # worker -> start -> (decided, end)
    next_index = Counter()
    for p in result.pass_log:
        # each rank's passes are logged in order, indexed from 0
        key = (p["worker"], p["dp_rank"])
        assert p["pass"] == next_index[key]
        next_index[key] += 1
        bounds = (p["decided_ms"], p["end_ms"])
        assert groups[p["worker"]].setdefault(p["start_ms"], bounds) == bounds
    for w in result.stats.workers:
        passes = sorted(groups[w.worker].items())
        for (start, (decided, end)), (next_start, _) in zip(passes, passes[1:]):
            assert decided <= start < end <= next_start
        assert w.passes == len(passes)
        assert math.isclose(w.busy_ms, sum(end - start for start, (_, end) in passes),
                            rel_tol=1e-12, abs_tol=1e-9)
    assert result.stats.passes == len(result.pass_log)


@SETTINGS
@given(scenarios(closed_loop=True))
def test_closed_loop_keeps_at_most_n_in_flight_and_releases_at_completions(scenario):
    config, workload = scenario
    n, concurrency = len(workload), workload.concurrency
    rec = run(scenario).records
    assert (rec.status == STATUS_FINISHED).all()
    first = min(n, concurrency)
    assert (rec.arrival_ms[:first] == 0).all()
    assert rec.arrival_ms[first:].tolist() == sorted(rec.finish_ms.tolist())[:n - first]
    # in flight over [arrival, finish): a release at a finish instant does not overlap
    steps = sorted([(t, 1) for t in rec.arrival_ms.tolist()] +
                   [(t, -1) for t in rec.finish_ms.tolist()], key=lambda s: (s[0], s[1]))
    in_flight = np.cumsum([s for _, s in steps])
    assert in_flight.max() == first


@SETTINGS
@given(scenarios())
def test_telemetry_samples_every_rank_at_every_tick_and_counters_sum_to_totals(scenario):
    config, _ = scenario
    interval = config.output.telemetry_interval_ms
    if interval is None:
        return
    result = run(scenario)
    samples, stats, log = result.telemetry, result.stats, result.pass_log
    targets = [(w, r) for w in range(config.cluster.workers)
               for r in range(config.cluster.data_parallel_size)]
    per_tick = len(targets)
    assert len(samples) % per_tick == 0
    ticks = []
    for i in range(0, len(samples), per_tick):
        group = samples[i:i + per_tick]
        assert [(s["worker"], s["dp_rank"]) for s in group] == targets
        assert len({s["t_ms"] for s in group}) == 1
        ticks.append(group[0]["t_ms"])
    # ticks at i * interval (computed, no drift) up to the run's end, the last
    # event; then a partial sample at the end unless it fell on a tick
    end = max([p["end_ms"] for p in log] + result.records.arrival_ms.tolist())
    m = 0
    while (m + 1) * interval <= end:
        m += 1
    assert ticks[:m] == [i * interval for i in range(1, m + 1)]
    assert len(ticks) - m == (0 if m and m * interval == end else 1)
    assert ticks[-1] == end
    assert sum(s["preemptions"] for s in samples) == stats.preemptions
    assert sum(s["prefix_queries"] for s in samples) == stats.prefix_cache_queries
    assert sum(s["prefix_hits"] for s in samples) == stats.prefix_cache_hits
    assert sum(s["passes"] for s in samples) == stats.passes == len(log)
    assert sum(s["tokens_scheduled"] for s in samples) == sum(
        e["tokens"] for p in log for e in p["scheduled"])


def _same(a, b):
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
    return a == b


@SETTINGS
@given(scenarios())
def test_the_pass_log_changes_no_result(scenario):
    # without the pass log a worker runs compiled stretches of passes
    # between outside events (arrivals, closed-loop releases, telemetry ticks)
    logged, unlogged = run(scenario), run(scenario, pass_log=False)
    assert unlogged.pass_log is None
    for name in logged.records.__attrs_attrs__:
        assert _same(getattr(logged.records, name.name),
                     getattr(unlogged.records, name.name)), name.name
    assert logged.telemetry == unlogged.telemetry
    assert attrs.asdict(logged.stats) == attrs.asdict(unlogged.stats)


@SETTINGS
@given(scenarios(closed_loop=False))
def test_each_worker_runs_as_if_alone_with_the_requests_routed_to_it(scenario):
    # Open loop, routing aside, workers share nothing: replaying one worker's
    # requests (same arrivals, each pinned to the rank it was routed to) on a
    # single worker of the same ranks gives that worker's pass log and results.
    config, workload = scenario
    result = run(scenario)
    rec = result.records
    alone_config = attrs.evolve(config, cluster=attrs.evolve(config.cluster, workers=1))
    for w in range(config.cluster.workers):
        mine = np.flatnonzero(rec.worker == w)
        if not len(mine):
            continue
        sub = _subset(workload, mine, rec.dp_rank[mine])
        alone = run((alone_config, sub))
        assert alone.records.dp_rank.tolist() == rec.dp_rank[mine].tolist()
        for name in ("arrival_ms", "first_scheduled_ms", "first_token_ms", "finish_ms",
                     "output_tokens", "num_preemptions", "first_admission_cached_tokens",
                     "recomputed_tokens", "status", "first_token_pass", "finish_pass"):
            assert _same(getattr(alone.records, name), getattr(rec, name)[mine]), name
        assert alone.pass_log == [dict(p, worker=0) for p in result.pass_log
                                  if p["worker"] == w]


def _subset(workload, rows, ranks):
    hash_ids = [workload.hash_flat[workload.hash_offsets[i]:workload.hash_offsets[i + 1]]
                for i in rows]
    return Workload(
        request_ids=[workload.request_ids[i] for i in rows],
        arrival_ms=workload.arrival_ms[rows],
        input_length=workload.input_length[rows],
        output_length=workload.output_length[rows],
        priority=workload.priority[rows],
        dp_rank=np.asarray(ranks, dtype=np.int64),
        hash_flat=np.concatenate(hash_ids).astype(np.int64),
        hash_offsets=np.concatenate([[0], np.cumsum([len(h) for h in hash_ids])]).astype(np.int64),
        trace_block_size=workload.trace_block_size,
    )


# ------------------------------------------------------------ the frontend's delay
# and the host time per pass: small open-loop runs of unique prompts on one or
# two workers, linear 10 ms passes


def _small_requests(data, min_n):
    """`(sent, prompts, outputs, hash ids)` of 1-8 requests sent in 0-40 ms."""
    n = data.draw(st.integers(min_n, 8))
    sent = sorted(data.draw(st.lists(st.integers(0, 40), min_size=n, max_size=n)))
    prompts = data.draw(st.lists(st.integers(1, 96), min_size=n, max_size=n))
    outputs = data.draw(st.lists(st.integers(1, 4), min_size=n, max_size=n))
    ids = [list(range(1000 + 10 * i, 1000 + 10 * i + ceil_div(p, TRACE_BLOCK_SIZE)))
           for i, p in enumerate(prompts)]
    return sent, prompts, outputs, ids


def _small_config(data, **engine):
    """A sync or async engine (`engine`'s keys added) on one or two workers."""
    engine = {"block_size": BLOCK_SIZE, "num_gpu_blocks": 64, "max_num_seqs": 16,
              "async_scheduling": data.draw(st.booleans()),
              "timing": {"type": "linear", "base_ms": 10, "per_token_ms": 0}, **engine}
    cluster = {"workers": data.draw(st.integers(1, 2)),
               "router": data.draw(st.sampled_from(["round_robin", "least_loaded"]))}
    return config_from_dict({"workload": {"synthetic": {"requests": 1}}, "engine": engine,
                             "cluster": cluster, "output": {"pass_log": True}})


SMALL_SETTINGS = settings(max_examples=int(os.environ.get("CLUSTER_EXAMPLES", 15)),
                          deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])


@SMALL_SETTINGS
@given(st.data())
def test_a_frontend_delay_is_the_same_run_as_the_trace_sent_at_the_engine_arrivals(data):
    # engine.frontend (docs/engine.md §8): a request sent at t reaches the engine
    # at t + request_ms + tokenize_us_per_token * P / 1000. The run equals the run
    # without a frontend of the trace whose requests are sent at those times, in
    # their order (stable): same passes, same token times per request.
    sent, prompts, outputs, ids = _small_requests(data, 2)
    n = len(sent)
    request_ms = data.draw(st.sampled_from([0.0, 1.0, 3.0]))
    per_token_us = data.draw(st.sampled_from([0.0, 125.0, 250.0]))
    frontend = {"request_ms": request_ms, "tokenize_us_per_token": per_token_us}
    delayed_config = _small_config(data, frontend=frontend)
    plain_config = attrs.evolve(delayed_config,
                                engine=attrs.evolve(delayed_config.engine, frontend=None))
    names = [f"r{i}" for i in range(n)]
    delayed = simulate(delayed_config, workload_of(sent, prompts, outputs, ids, ids=names))
    at = np.array(sent, dtype=np.float64) + request_ms + per_token_us * np.array(prompts) / 1000.0
    order = np.argsort(at, kind="stable").tolist()
    plain = simulate(plain_config, workload_of(at[order].tolist(), [prompts[i] for i in order],
                                               [outputs[i] for i in order],
                                               [ids[i] for i in order],
                                               ids=[names[i] for i in order]))

    def passes(result):
        return [(p["worker"], p["start_ms"], p["end_ms"],
                 [(e["id"], e["tokens"]) for e in p["scheduled"]]) for p in result.pass_log]

    def token_times(result):
        r = result.records
        return {r.ids[i]: (float(r.first_token_ms[i]), float(r.finish_ms[i])) for i in range(n)}

    assert passes(delayed) == passes(plain)
    assert token_times(delayed) == token_times(plain)
    assert delayed.records.arrival_ms.tolist() == [float(t) for t in sent]


@SMALL_SETTINGS
@given(st.data())
def test_each_pass_starts_when_the_host_is_done_with_it_and_the_gpu_is_free(data):
    # engine.host_ms_per_pass h (engine/launch.py): every pass starts on the GPU
    # at max(its decision + h, the end of the pass before it on its worker) —
    # sync and async, one or two workers (no CPU tier: nothing else delays a start)
    sent, prompts, outputs, ids = _small_requests(data, 1)
    host = data.draw(st.sampled_from([0.5, 4.0, 15.0]))
    result = simulate(_small_config(data, host_ms_per_pass=host),
                      workload_of(sent, prompts, outputs, ids))
    last_end = {}
    for p in sorted(result.pass_log, key=lambda p: (p["worker"], p["start_ms"])):
        free = last_end.get(p["worker"], -math.inf)
        assert p["start_ms"] == max(p["decided_ms"] + host, free)
        last_end[p["worker"]] = p["end_ms"]
