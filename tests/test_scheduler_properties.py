"""Property-based tests of whole simulations (docs/engine.md §1-8): small
random workloads through small random engines, checked against invariants
that hold for every config: budgets, block counts, completion, causality of
token times, pass timing, admissions, determinism and the pool at the end.

Workloads are built directly as :class:`Workload` objects (1-12 requests,
hash ids at trace_block_size 16 with shared prefixes); configs go through
`config_from_dict` (the `workload.synthetic` block is a placeholder the
validation needs; the workload passed to the simulation is ours).
"""

import math
import warnings

import attrs
import numpy as np
from hypothesis import event, given, settings
from hypothesis import strategies as st

from servesim.config.config import config_from_dict
from servesim.replay.driver import Replay
from servesim.results.records import STATUS_FINISHED, STATUS_REJECTED, STATUS_UNFINISHED
from helpers import SETTINGS, ceil_div, engine_configs, expected_max_tokens, rejected_at_arrival, workloads

MAX_PASSES = 200_000  # far beyond any run here: more means the engine loops

# --------------------------------------------------------------------------- strategies


def make_config(engine, cluster):
    return config_from_dict({
        "workload": {"synthetic": {"requests": 1}},  # placeholder; see module docstring
        "engine": engine,
        "cluster": cluster,
        "output": {"pass_log": True},
    })


@st.composite
def scenarios(draw, fit=False, chunked=None):
    """(engine keys, cluster keys, workload); mostly one worker of one rank."""
    engine = draw(engine_configs(chunked))
    cluster = {"workers": draw(st.sampled_from([1, 1, 1, 2]), label="workers"),
               "data_parallel_size": draw(st.sampled_from([1, 1, 1, 2]), label="dp"),
               "router": draw(st.sampled_from(["round_robin", "least_loaded", "least_prefill", "kv_router", "weighted"]),
                              label="router")}
    return engine, cluster, draw(workloads(engine, fit=fit))


# --------------------------------------------------------------------------- helpers


def run(scenario):
    """(Replay, SimulationResult); fails instead of looping for ever."""
    engine, cluster, workload = scenario
    passes = [0]

    def progress(_now, _done):
        passes[0] += 512
        assert passes[0] <= MAX_PASSES, "the simulation does not terminate"

    config = make_config(engine, cluster)
    replay = Replay(config, workload, progress)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "could never finish" is expected for some inputs
        result = replay.run()
    stats = result.stats
    status = result.records.status
    event("preemptions" if stats.preemptions else "no preemption")
    event("prefix hits" if stats.prefix_cache_hits else "no prefix hit")
    if (status == STATUS_UNFINISHED).any():
        event("some request unfinished")
    if (status == STATUS_REJECTED).any():
        event("some request rejected")
    if (status == STATUS_FINISHED).all():
        event("all finished")
    return replay, result


def fits_alone(engine, workload):
    """A request fits when its most computed tokens, P + max_tokens - 1 (the
    last sampled token needs no KV), fit the usable blocks."""
    most = workload.input_length + expected_max_tokens(engine, workload) - 1
    return ceil_div(most, engine["block_size"]) <= engine["num_gpu_blocks"] - 1


def tokens_of(records, i):
    return records.token_client_ms[records.token_offsets[i]:records.token_offsets[i + 1]]


# --------------------------------------------------------------------------- properties


@SETTINGS
@given(scenarios())
def test_pass_respects_token_budget_and_max_num_seqs(scenario):
    engine, _, _ = scenario
    _, result = run(scenario)
    for p in result.pass_log:
        tokens = [e["tokens"] for e in p["scheduled"]]
        assert tokens, "an empty pass was logged"
        assert all(t > 0 for t in tokens), p
        assert sum(tokens) <= engine["max_num_batched_tokens"], p
        assert len(tokens) <= engine["max_num_seqs"], p
        assert len({e["id"] for e in p["scheduled"]}) == len(tokens), "a request twice in a pass"


@SETTINGS
@given(scenarios())
def test_free_blocks_after_schedule_within_pool(scenario):
    engine, _, _ = scenario
    _, result = run(scenario)
    for p in result.pass_log:
        assert 0 <= p["free_blocks_after_schedule"] <= engine["num_gpu_blocks"] - 1, p


@SETTINGS
@given(scenarios())
def test_rejected_exactly_the_prompts_that_can_never_fit(scenario):
    engine, _, workload = scenario
    _, result = run(scenario)
    records = result.records
    rejected = rejected_at_arrival(engine, workload)
    assert ((records.status == STATUS_REJECTED) == rejected).all()
    assert (records.output_tokens[rejected] == 0).all()
    assert np.isnan(records.first_scheduled_ms[rejected]).all()


@SETTINGS
@given(scenarios(fit=True))
def test_requests_that_fit_finish_with_exactly_their_output_length(scenario):
    """Every request fits alone: each one finishes with `max_tokens` tokens."""
    engine, _, workload = scenario
    _, result = run(scenario)
    records = result.records
    assert not rejected_at_arrival(engine, workload).any()
    assert fits_alone(engine, workload).all()
    assert (records.status == STATUS_FINISHED).all(), list(zip(records.ids, records.status))
    assert (records.output_tokens == expected_max_tokens(engine, workload)).all()
    assert not result.warnings


@SETTINGS
@given(scenarios())
def test_finished_requests_have_exactly_their_output_length(scenario):
    """Mixed workloads: a finished request has exactly `max_tokens` tokens,
    any other fewer; and if every accepted request fits, all finish."""
    engine, _, workload = scenario
    _, result = run(scenario)
    records = result.records
    max_tokens = expected_max_tokens(engine, workload)
    finished = records.status == STATUS_FINISHED
    accepted = ~rejected_at_arrival(engine, workload)
    assert (records.output_tokens[finished] == max_tokens[finished]).all()
    unfinished = accepted & ~finished
    assert (records.output_tokens[unfinished] < max_tokens[unfinished]).all()
    if fits_alone(engine, workload)[accepted].all():
        assert finished[accepted].all(), list(zip(records.ids, records.status))


@SETTINGS
@given(scenarios())
def test_token_times_are_causal_and_ordered(scenario):
    """arrival <= first_scheduled <= first_token <= finish; a request's token
    client times never decrease; no token before its request's arrival."""
    _, _, workload = scenario
    _, result = run(scenario)
    r = result.records
    for i in range(len(workload)):
        times = tokens_of(r, i)
        assert len(times) == r.output_tokens[i]
        assert not np.isnan(times).any()
        if len(times) == 0:
            assert math.isnan(r.first_token_ms[i]) and math.isnan(r.finish_ms[i])
            continue
        assert (np.diff(times) >= 0).all(), (r.ids[i], times)
        assert times[0] >= r.arrival_ms[i]
        assert r.first_token_ms[i] == times[0] and r.finish_ms[i] == times[-1]
        assert r.arrival_ms[i] <= r.first_scheduled_ms[i] <= r.first_token_ms[i] <= r.finish_ms[i]
        assert 0 <= r.first_token_pass[i] <= r.finish_pass[i]


@SETTINGS
@given(scenarios())
def test_passes_of_a_rank_are_ordered_and_never_overlap(scenario):
    """Per rank: pass indices 0, 1, 2, ... in log order, start <= end, and each
    pass starts no earlier than the one before it ends. Ranks of a worker run
    in lockstep (§11): two passes of one worker are the same interval or
    disjoint."""
    _, result = run(scenario)
    log = result.pass_log
    assert result.stats.passes == len(log)
    by_rank = {}
    for p in log:
        assert p["start_ms"] <= p["end_ms"], p
        by_rank.setdefault((p["worker"], p["dp_rank"]), []).append(p)
    for passes in by_rank.values():
        assert [p["pass"] for p in passes] == list(range(len(passes)))
        for prev, nxt in zip(passes, passes[1:]):
            assert prev["end_ms"] <= nxt["start_ms"], (prev, nxt)
    for worker in {p["worker"] for p in log}:
        intervals = sorted({(p["start_ms"], p["end_ms"]) for p in log if p["worker"] == worker})
        for (s1, e1), (s2, e2) in zip(intervals, intervals[1:]):
            assert e1 <= s2, (worker, (s1, e1), (s2, e2))


@SETTINGS
@given(scenarios())
def test_each_request_is_scheduled_new_exactly_once_and_never_before_arrival(scenario):
    """A request's first entry in the pass log is its one `new` admission;
    it is `resumed` at most once per preemption; no pass it is in starts
    before it arrives."""
    _, result = run(scenario)
    r = result.records
    index = {rid: i for i, rid in enumerate(r.ids)}
    kinds = {rid: [] for rid in r.ids}
    for p in result.pass_log:
        for e in p["scheduled"]:
            kinds[e["id"]].append(e["kind"])
            assert p["start_ms"] >= r.arrival_ms[index[e["id"]]], (p, e)
    for rid, seen in kinds.items():
        i = index[rid]
        if not seen:
            assert math.isnan(r.first_scheduled_ms[i])
            continue
        assert seen[0] == "new" and seen.count("new") == 1, (rid, seen)
        assert seen.count("resumed") <= r.num_preemptions[i], (rid, seen)
        assert r.first_scheduled_ms[i] == min(
            p["start_ms"] for p in result.pass_log if any(e["id"] == rid for e in p["scheduled"]))


def assert_same_results(first, second):
    assert first.pass_log == second.pass_log
    a, b = first.records, second.records
    for name in ("arrival_ms", "first_scheduled_ms", "first_token_ms", "finish_ms",
                 "token_client_ms"):
        assert np.array_equal(getattr(a, name), getattr(b, name), equal_nan=True), name
    for name in ("output_tokens", "status", "num_preemptions", "first_admission_cached_tokens",
                 "recomputed_tokens", "first_token_pass", "finish_pass", "token_offsets",
                 "worker", "dp_rank"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert attrs.asdict(first.stats) == attrs.asdict(second.stats)


@settings(SETTINGS, max_examples=40)
@given(scenarios())
def test_simulation_is_deterministic(scenario):
    _, first = run(scenario)
    _, second = run(scenario)
    assert_same_results(first, second)


@SETTINGS
@given(scenarios())
def test_every_usable_block_is_free_at_the_end(scenario):
    engine, _, _ = scenario
    replay, result = run(scenario)
    usable = list(range(1, engine["num_gpu_blocks"]))
    for worker in replay.workers:
        for rank in worker.ranks:
            assert rank.pool.num_free_blocks == len(usable), (worker.index, rank.index)
            assert sorted(rank.pool.free_queue()) == usable
            assert not rank.scheduler.has_requests()
    status = result.records.status
    assert set(status.tolist()) <= {STATUS_FINISHED, STATUS_REJECTED, STATUS_UNFINISHED}


@SETTINGS
@given(scenarios())
def test_tokens_are_released_at_the_end_of_their_pass(scenario):
    """Without launch costs or detokenization a token reaches the client when
    its pass ends (§7-8): the first and last token times are the ends of
    `first_token_pass` and `finish_pass` on the request's rank, and a
    finished request is in exactly one pass's `finished` list, that of its
    `finish_pass`."""
    _, result = run(scenario)
    r = result.records
    log = {(p["worker"], p["dp_rank"], p["pass"]): p for p in result.pass_log}
    finished_in = {}
    for p in result.pass_log:
        for rid in p["finished"]:
            assert rid not in finished_in, f"{rid} finished twice"
            finished_in[rid] = (p["worker"], p["dp_rank"], p["pass"])
    for i, rid in enumerate(r.ids):
        if r.output_tokens[i] == 0:
            assert r.first_token_pass[i] == r.finish_pass[i] == -1
            assert rid not in finished_in
            continue
        rank = (int(r.worker[i]), int(r.dp_rank[i]))
        assert r.first_token_ms[i] == log[(*rank, int(r.first_token_pass[i]))]["end_ms"]
        assert r.finish_ms[i] == log[(*rank, int(r.finish_pass[i]))]["end_ms"]
        if r.status[i] == STATUS_FINISHED:
            assert finished_in[rid] == (*rank, int(r.finish_pass[i]))
        else:
            assert rid not in finished_in


@SETTINGS
@given(scenarios())
def test_prefix_cache_stats_match_the_admissions_in_the_pass_log(scenario):
    """Every admission is logged with its hit (§5): `new` entries sum to
    queries (their prompts) and hits; `resumed` ones to the preempted hits.
    A hit is whole blocks, never the last token, and 0 without caching."""
    engine, _, workload = scenario
    _, result = run(scenario)
    r = result.records
    index = {rid: i for i, rid in enumerate(r.ids)}
    bs = engine["block_size"]
    queries = hits = preempted_hits = 0
    for p in result.pass_log:
        for e in p["scheduled"]:
            i = index[e["id"]]
            if e["kind"] == "running":
                assert e["cached"] == 0
                continue
            assert e["cached"] % bs == 0
            if not engine["enable_prefix_caching"]:
                assert e["cached"] == 0
            if e["kind"] == "new":
                prompt = int(workload.input_length[i])
                assert e["cached"] <= (prompt - 1) // bs * bs
                assert e["cached"] == r.first_admission_cached_tokens[i]
                queries += prompt
                hits += e["cached"]
            else:
                preempted_hits += e["cached"]
    stats = result.stats
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (queries, hits)
    assert stats.preempted_prefix_cache_hits == preempted_hits


@SETTINGS
@given(scenarios())
def test_requests_never_preempted_compute_each_token_once(scenario):
    """A finished request that was never preempted is scheduled for exactly
    P + max_tokens - 1 tokens beyond its prefix hit (the last sampled token is
    never computed), and recomputes nothing."""
    engine, _, workload = scenario
    _, result = run(scenario)
    r = result.records
    max_tokens = expected_max_tokens(engine, workload)
    scheduled = {rid: 0 for rid in r.ids}
    for p in result.pass_log:
        for e in p["scheduled"]:
            scheduled[e["id"]] += e["tokens"]
    for i, rid in enumerate(r.ids):
        if r.status[i] == STATUS_FINISHED and r.num_preemptions[i] == 0:
            computed = scheduled[rid] + r.first_admission_cached_tokens[i]
            assert computed == workload.input_length[i] + max_tokens[i] - 1, rid
            assert r.recomputed_tokens[i] == 0, rid


@SETTINGS
@given(scenarios(chunked=False))
def test_without_chunked_prefill_prompts_are_scheduled_whole(scenario):
    _, _, workload = scenario
    _, result = run(scenario)
    index = {rid: i for i, rid in enumerate(result.records.ids)}
    for p in result.pass_log:
        for e in p["scheduled"]:
            if e["kind"] == "new":
                assert e["tokens"] + e["cached"] == workload.input_length[index[e["id"]]], (p, e)


@SETTINGS
@given(scenarios())
def test_preempted_requests_are_not_scheduled_in_the_same_pass(scenario):
    """A preempting pass admits nobody (§3) and schedules none of its victims."""
    _, result = run(scenario)
    for p in result.pass_log:
        ids = {e["id"] for e in p["scheduled"]}
        assert not ids.intersection(p["preempted"]), p
        if p["preempted"]:
            assert all(e["kind"] == "running" for e in p["scheduled"]), p
