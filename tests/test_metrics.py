"""summary.json figures (spec README §6, "Metrics") on hand-built records."""

import json
import math

import numpy as np
import pytest

from servesim.results.metrics import itl_samples, summarize
from servesim.results.stats import latency_stats, percentiles_of_sorted
from servesim.results.records import (
    STATUS_FINISHED,
    STATUS_REJECTED,
    STATUS_UNFINISHED,
    RequestRecords,
    RunStats,
    SimulationResult,
    WorkerStats,
)

NAN = float("nan")


def make_records(rows):
    """RequestRecords from dicts with keys arrival, tokens (client times),
    status, and optional input, output_length, preempt, recomputed."""
    n = len(rows)
    tokens = [r.get("tokens", []) for r in rows]
    finished = [r["status"] == STATUS_FINISHED for r in rows]
    first = [t[0] if t and f else NAN for t, f in zip(tokens, finished)]
    last = [t[-1] if t and f else NAN for t, f in zip(tokens, finished)]
    offsets = np.zeros(n + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(t) for t in tokens])
    i64 = lambda key, default=0: np.array([r.get(key, default) for r in rows], dtype=np.int64)
    return RequestRecords(
        ids=[r.get("id", f"r{i}") for i, r in enumerate(rows)],
        arrival_ms=np.array([r["arrival"] for r in rows], dtype=np.float64),
        first_scheduled_ms=np.array(
            [r["arrival"] if r["status"] != STATUS_REJECTED else NAN for r in rows]
        ),
        first_token_ms=np.array(first, dtype=np.float64),
        finish_ms=np.array(last, dtype=np.float64),
        input_length=i64("input", 100),
        output_length=np.array([r.get("output_length", len(t)) for r, t in zip(rows, tokens)]),
        output_tokens=np.array([len(t) for t in tokens], dtype=np.int64),
        num_preemptions=i64("preempt"),
        first_admission_cached_tokens=i64("cached"),
        cpu_tier_cached_tokens=i64("cpu_cached"),
        recomputed_tokens=i64("recomputed"),
        worker=i64("worker"),
        dp_rank=i64("dp_rank"),
        status=np.array([r["status"] for r in rows], dtype=np.int8),
        first_token_pass=np.array([1 if f else -1 for f in finished], dtype=np.int64),
        finish_pass=np.array([len(t) if f else -1 for t, f in zip(tokens, finished)], dtype=np.int64),
        token_offsets=offsets,
        token_client_ms=np.array([x for t in tokens for x in t], dtype=np.float64),
    )


# A: arrives 0, tokens reach the client at 10, 15, 25   -> TTFT 10, E2E 25, TPOT 15/2 = 7.5, ITL 5, 10
# B: arrives 5, tokens at 20, 22                        -> TTFT 15, E2E 17, TPOT 2,  ITL 2
# C: arrives 8, one token at 30                         -> TTFT 22, E2E 22, no TPOT, no ITL
# D: rejected (never scheduled, no tokens)              -> excluded
# E: unfinished, tokens at 40, 50                       -> excluded (its gap of 10 too)
ROWS = [
    dict(arrival=0.0, tokens=[10.0, 15.0, 25.0], status=STATUS_FINISHED, input=100, preempt=2, recomputed=64),
    dict(arrival=5.0, tokens=[20.0, 22.0], status=STATUS_FINISHED, input=200),
    dict(arrival=8.0, tokens=[30.0], status=STATUS_FINISHED, input=300),
    dict(arrival=9.0, tokens=[], status=STATUS_REJECTED, input=10000, output_length=5),
    dict(arrival=10.0, tokens=[40.0, 50.0], status=STATUS_UNFINISHED, input=50, preempt=1, recomputed=16),
]


def make_result(rows=ROWS):
    stats = RunStats(
        passes=40,
        preemptions=3,
        prefix_cache_queries=1000,
        prefix_cache_hits=250,
        cpu_tier_hit_tokens=32,
        kv_usage_mean=0.4,
        kv_usage_max=0.9,
        workers=[WorkerStats(worker=0, requests=5, passes=40, busy_ms=45.5, kv_usage_mean=0.4, kv_usage_max=0.9)],
    )
    return SimulationResult(records=make_records(rows), stats=stats)


def assert_json_native(value, where="summary"):
    """Exactly JSON types: no numpy scalars (np.float64 subclasses float)."""
    assert type(value) in (dict, list, str, int, float, bool, type(None)), (where, type(value))
    if isinstance(value, dict):
        for k, v in value.items():
            assert type(k) is str
            assert_json_native(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            assert_json_native(v, f"{where}[{i}]")
    elif type(value) is float:
        assert math.isfinite(value), where


def test_summary_keys_in_spec_order():
    s = summarize(make_result(), {"engine": {}}, 0.5)
    assert list(s) == [
        "requests", "finished", "rejected", "unfinished", "duration_ms", "request_rate",
        "input_tokens_per_s", "output_tokens_per_s", "ttft_ms", "tpot_ms", "itl_ms", "e2e_ms",
        "preemptions", "preempted_requests", "recomputed_tokens", "prefix_cache_queries",
        "prefix_cache_hits", "prefix_cache_hit_rate", "cpu_tier_hit_tokens", "kv_usage_mean",
        "kv_usage_max", "passes", "wall_time_s", "passes_per_s", "workers", "config",
    ]
    assert list(s["ttft_ms"]) == ["mean", "p50", "p90", "p95", "p99", "max"]
    assert s["config"] == {"engine": {}}


def test_counts_exclude_rejected_and_unfinished_from_rates():
    s = summarize(make_result(), {}, 0.5)
    assert (s["requests"], s["finished"], s["rejected"], s["unfinished"]) == (5, 3, 1, 1)
    # duration: the last token of a finished request reaches the client at 30 ms
    # (E's token at 50 ms is unfinished and does not count).
    assert s["duration_ms"] == 30.0
    assert s["request_rate"] == pytest.approx(100.0)  # 3 / 0.030 s
    assert s["input_tokens_per_s"] == pytest.approx(20000.0)  # (100+200+300) / 0.030 s
    assert s["output_tokens_per_s"] == pytest.approx(200.0)  # (3+2+1) / 0.030 s


def test_ttft_e2e_over_finished_requests():
    s = summarize(make_result(), {}, 0.5)
    # TTFT samples 10, 15, 22: p90 at rank 0.9*2 = 1.8 -> 15 + 0.8*7 = 20.6
    assert s["ttft_ms"] == {
        "mean": round(47 / 3, 6), "p50": 15.0, "p90": 20.6, "p95": 21.3, "p99": 21.86, "max": 22.0,
    }
    # E2E samples 25, 17, 22 -> sorted 17, 22, 25; p90 rank 1.8 -> 22 + 0.8*3 = 24.4
    assert s["e2e_ms"] == {
        "mean": round(64 / 3, 6), "p50": 22.0, "p90": 24.4, "p95": 24.7, "p99": 24.94, "max": 25.0,
    }


def test_tpot_one_sample_per_request_with_two_tokens():
    s = summarize(make_result(), {}, 0.5)
    # TPOT samples 7.5 (A) and 2.0 (B); C has one token. p90 rank 0.9 -> 2 + 0.9*5.5 = 6.95
    assert s["tpot_ms"] == {
        "mean": 4.75, "p50": 4.75, "p90": 6.95, "p95": 7.225, "p99": 7.445, "max": 7.5,
    }


def test_itl_every_gap_within_finished_requests():
    s = summarize(make_result(), {}, 0.5)
    # gaps 5, 10 (A) and 2 (B); none across request boundaries, none of E.
    # sorted 2, 5, 10: p90 rank 1.8 -> 5 + 0.8*5 = 9.0
    assert s["itl_ms"] == {
        "mean": round(17 / 3, 6), "p50": 5.0, "p90": 9.0, "p95": 9.5, "p99": 9.9, "max": 10.0,
    }


def test_counters_and_speed():
    s = summarize(make_result(), {}, 0.5)
    assert s["preemptions"] == 3
    assert s["preempted_requests"] == 2  # A and E
    assert s["recomputed_tokens"] == 80  # 64 + 16
    assert (s["prefix_cache_queries"], s["prefix_cache_hits"]) == (1000, 250)
    assert s["prefix_cache_hit_rate"] == 0.25
    assert s["cpu_tier_hit_tokens"] == 32
    assert (s["kv_usage_mean"], s["kv_usage_max"]) == (0.4, 0.9)
    assert (s["passes"], s["wall_time_s"], s["passes_per_s"]) == (40, 0.5, 80.0)
    assert s["workers"] == [
        {"worker": 0, "requests": 5, "passes": 40, "busy_ms": 45.5, "kv_usage_mean": 0.4,
         "request_share": 1.0, "prefix_cache_hit_rate": 0.0}
    ]


def test_each_workers_share_and_prefix_hit_rate():
    # w0: A (100 prompt tokens, 50 cached at first admission), B (200, none);
    # w1: C (300, 150 cached), D (rejected: routed there, never admitted).
    # shares 2/4 and 2/4 (routed requests, as `requests` counts them);
    # hit rates 50 / 300 and 150 / 300 (D's prompt is no query).
    rows = [dict(arrival=0.0, tokens=[10.0], status=STATUS_FINISHED, input=100, cached=50),
            dict(arrival=1.0, tokens=[12.0], status=STATUS_FINISHED, input=200),
            dict(arrival=2.0, tokens=[14.0], status=STATUS_FINISHED, input=300, cached=150,
                 worker=1),
            dict(arrival=3.0, tokens=[], status=STATUS_REJECTED, input=10000, worker=1)]
    result = make_result(rows)
    result.stats.workers[:] = [WorkerStats(worker=k, requests=2) for k in (0, 1)]
    s = summarize(result, {}, 0.5)
    assert [(w["request_share"], w["prefix_cache_hit_rate"]) for w in s["workers"]] == [
        (0.5, round(50 / 300, 6)), (0.5, 0.5)]


def test_summary_is_json_native():
    s = summarize(make_result(), {"a": [1, 2.5, None]}, 0.123456789)
    assert_json_native(s)
    assert s["wall_time_s"] == 0.123457
    json.dumps(s, allow_nan=False)


def test_no_finished_request_gives_nulls_and_zero_rates():
    result = make_result([dict(arrival=0.0, status=STATUS_REJECTED)])
    result.stats.prefix_cache_queries = 0
    result.stats.prefix_cache_hits = 0
    s = summarize(result, {}, 0.0)
    assert s["ttft_ms"] == dict.fromkeys(["mean", "p50", "p90", "p95", "p99", "max"])
    assert s["itl_ms"]["p99"] is None
    assert (s["duration_ms"], s["request_rate"], s["output_tokens_per_s"]) == (0.0, 0.0, 0.0)
    assert (s["prefix_cache_hit_rate"], s["passes_per_s"]) == (0.0, 0.0)
    assert_json_native(s)


def test_latency_stats_match_numpy_percentile():
    x = np.random.default_rng(0).exponential(10.0, size=1001)
    st = latency_stats(x)
    for q in (50, 90, 95, 99):
        assert st[f"p{q}"] == round(float(np.percentile(x, q)), 6)
    assert st["max"] == round(float(x.max()), 6)


def test_itl_vectorised_equals_per_request_loop():
    rng = np.random.default_rng(1)
    rows = []
    for i in range(300):
        k = int(rng.integers(0, 6))
        times = list(np.cumsum(rng.uniform(0.5, 3.0, size=k)) + i)
        status = [STATUS_FINISHED, STATUS_FINISHED, STATUS_UNFINISHED][i % 3] if k else STATUS_REJECTED
        rows.append(dict(arrival=float(i), tokens=times, status=status))
    rec = make_records(rows)
    finished = rec.status == STATUS_FINISHED
    expected = [
        b - a
        for r in rows
        if r["status"] == STATUS_FINISHED
        for a, b in zip(r["tokens"], r["tokens"][1:])
    ]
    np.testing.assert_allclose(itl_samples(rec, finished), expected)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 100, 1001])
def test_percentiles_of_sorted_equal_numpy_percentile(n):
    rng = np.random.default_rng(n)
    for x in (rng.exponential(10.0, size=n), np.round(rng.exponential(10.0, size=n), 1)):
        expected = np.percentile(x, [50, 90, 95, 99])
        assert percentiles_of_sorted(np.sort(x)) == expected.tolist()


@pytest.mark.parametrize("n", [1, 2, 3, 7, 100, 1001, 20000])
def test_quantiles_of_sorted_are_bit_identical_to_numpy_quantile(n):
    from servesim.results.metrics import ITL_QUANTILE_STEPS
    from servesim.results.stats import quantiles_of_sorted
    rng = np.random.default_rng(n)
    q = np.linspace(0.0, 1.0, ITL_QUANTILE_STEPS + 1)
    for x in (rng.exponential(10.0, size=n), np.round(rng.exponential(10.0, size=n), 1),
              rng.uniform(1e-3, 1e6, size=n), np.full(n, 2.5)):
        expected = np.quantile(x, q)
        got = quantiles_of_sorted(np.sort(x), q)
        assert got.tobytes() == expected.tobytes()


@pytest.mark.parametrize("n", [1, 2, 3, 7, 100, 1001, 20000])
def test_partitioned_at_the_read_ranks_the_itl_figures_are_the_sorted_ones(n):
    # itl_figures partitions the gaps instead of sorting them: both figures
    # must read exactly what they read on the sorted gaps
    from servesim.results.metrics import ITL_QUANTILE_STEPS, _read_ranks, place_order_statistics
    from servesim.results.stats import _sorted_stats, quantiles_of_sorted
    rng = np.random.default_rng(n)
    q = np.linspace(0.0, 1.0, ITL_QUANTILE_STEPS + 1)
    samples = (rng.exponential(10.0, size=n), np.round(rng.exponential(10.0, size=n), 1),
               np.full(n, 2.5))
    for k, x in enumerate(samples):
        ordered = np.sort(x)
        partitioned = x.copy()
        partitioned.partition(_read_ranks(n, q))
        if k == 0 and n > 1000:  # (a partition, not a sort)
            assert not np.array_equal(partitioned, ordered)
        assert (quantiles_of_sorted(partitioned, q).tobytes()
                == quantiles_of_sorted(ordered, q).tobytes())
        assert _sorted_stats(1.0, partitioned) == _sorted_stats(1.0, ordered)
        # what itl_figures does: few distinct values counted, many partitioned
        placed = x.copy()
        place_order_statistics(placed, _read_ranks(n, q))
        assert quantiles_of_sorted(placed, q).tobytes() == quantiles_of_sorted(ordered, q).tobytes()
        assert _sorted_stats(1.0, placed) == _sorted_stats(1.0, ordered)


def test_few_distinct_gaps_are_counted_not_partitioned():
    # a run's gaps repeat its pass durations: counted by value (every distinct
    # value found, every sample counted), and every order statistic read is the
    # sorted array's; too many distinct values for the table, and the count
    # gives up (it is a partition then)
    from servesim.results import metrics
    from servesim.results.metrics import ITL_QUANTILE_STEPS, _read_ranks
    from servesim.results.stats import _sorted_stats, quantiles_of_sorted
    rng = np.random.default_rng(3)
    q = np.linspace(0.0, 1.0, ITL_QUANTILE_STEPS + 1)
    durations = np.cumsum(rng.exponential(5.0, 301))[1:] - np.cumsum(rng.exponential(5.0, 301))[:-1]
    few = rng.choice(np.abs(durations), 50000)
    few[:7] = 0.0
    many = rng.exponential(10.0, 50000)
    for x, counted in ((few, True), (many, False)):
        placed = x.copy()
        ordered = np.sort(x)
        limit = len(x) // metrics._MAX_DISTINCT_SHARE
        table = np.full(1 << max(int(2 * limit - 1).bit_length(), 2), -1, dtype=np.int64)
        found, counts = np.empty(limit, dtype=np.int64), np.empty(limit, dtype=np.int64)
        used = metrics._distinct_counts(x.view(np.int64), table, np.uint64(64 - int(np.log2(len(table)))),
                                        found, counts)
        assert (used >= 0) == counted
        if counted:
            assert used == len(np.unique(x)) and counts[:used].sum() == len(x)
            assert sorted(found[:used].view(np.float64)) == sorted(np.unique(x))
        metrics.place_order_statistics(placed, _read_ranks(len(x), q))
        assert quantiles_of_sorted(placed, q).tobytes() == quantiles_of_sorted(ordered, q).tobytes()
        assert _sorted_stats(1.0, placed) == _sorted_stats(1.0, ordered)


def test_summary_and_itl_quantiles_share_one_distribution():
    # summarize leaves itl_quantiles.json's dict on the result; it equals the
    # one computed on its own, and the summary's ITL figures are its points
    from servesim.results.metrics import itl_quantiles
    result = make_result()
    s = summarize(result, {}, 0.5)
    assert result.itl_quantiles == itl_quantiles(result.records)
    q = result.itl_quantiles
    assert s["itl_ms"]["max"] == q["itl_ms"][-1] and s["itl_ms"]["p50"] == q["itl_ms"][100]


def test_itl_quantiles_are_numpy_quantiles_of_every_gap_of_finished_requests():
    # finished: a (0, 10, 14, 20 -> gaps 10, 4, 6... with arrival at 0 the
    # tokens are 10, 14, 20: gaps 4 and 6), b one token (no gap); the gaps of
    # unfinished and rejected requests do not count.
    from servesim.results.metrics import itl_quantiles
    records = make_records([
        {"arrival": 0.0, "tokens": [10.0, 14.0, 20.0], "status": STATUS_FINISHED},
        {"arrival": 1.0, "tokens": [12.0], "status": STATUS_FINISHED},
        {"arrival": 2.0, "tokens": [15.0, 40.0], "status": STATUS_UNFINISHED},
        {"arrival": 3.0, "status": STATUS_REJECTED},
    ])
    q = itl_quantiles(records)
    assert q["samples"] == 2
    assert q["quantiles"][0] == 0.0 and q["quantiles"][-1] == 1.0 and len(q["quantiles"]) == 201
    assert q["itl_ms"][0] == 4.0 and q["itl_ms"][-1] == 6.0
    assert q["itl_ms"][100] == 5.0  # the median of {4, 6}
    assert q["itl_ms"] == [round(float(v), 6) for v in np.quantile([4.0, 6.0], q["quantiles"])]
