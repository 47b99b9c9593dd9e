"""Each worker's load over time in summary.json (`workers[*].load`, README.md
"Outputs"; servesim/results/worker_load.py), from the telemetry samples, and
in the run's table: hand-worked on two workers, round robin against a policy
that piles the work on one of them.

Conventions as tests/test_cluster.py (block_size 16, linear 10 ms passes);
telemetry every 10 ms. A sample stands for the interval it closes, so the
samples at 10, 20, ..., 90 weigh 10 ms each and the final one at 93 weighs 3.
"""

import numpy as np
import pytest

from test_cluster import cluster_config, placement, sim, workload
from servesim.cli.main import format_table
from servesim.results.metrics import summarize
from servesim.results.worker_load import downsample, sample_weights, time_weighted_quantile

PREFIX = list(range(1, 11))  # 10 blocks, the same for every request


def _rows():
    # x at 3; q1..q3 at 53 (x finished at 23: its 10 blocks cached on x's worker).
    # P=160 O=2: two passes each; max_num_seqs 1, so a second request waits.
    return ([dict(id="x", t=3, P=160, O=2, hash_ids=PREFIX)]
            + [dict(id=f"q{k}", t=53, P=160, O=2, hash_ids=PREFIX) for k in (1, 2, 3)])


def _run(router):
    # 63 usable blocks per worker: a request holds 10 blocks in its first
    # pass (10/63 = 0.15873), 11 in its second (token 161: 11/63 = 0.174603).
    cfg = cluster_config(2, 1, router=router, telemetry_ms=10, pass_log=False,
                         max_num_seqs=1, num_gpu_blocks=64)
    result = sim(cfg, workload(_rows()))
    return result, summarize(result, {}, 1.0)


def _figures(summary):
    return [{q: w["load"][q] for q in ("running", "waiting", "kv_usage")}
            for w in summary["workers"]]


LOW, HIGH = 0.15873, 0.174603  # 10/63, 11/63


def test_round_robin_balances_the_running_requests_and_shows_the_queue_where_it_formed():
    # x -> w0, q1 -> w1, q2 -> w0, q3 -> w1.
    # w0: x [3,13] [13,23], q2 [53,63] [63,73]: running at 10, 20, 60, 70 -> 40/93.
    # w1: q1 [53,73], q3 waits until 73, runs [73,93]: running at 60..90 -> 40/93,
    #     waiting at 60, 70 -> 20/93; p90: the 73 ms at 0 are < 90% of 93 -> 1.
    # KV on both: 10/63 and 11/63 for 20 ms each -> (21/63) * 20 / 93 = 0.071685.
    result, summary = _run("round_robin")
    assert placement(result.records) == {"x": (0, 0), "q1": (1, 0), "q2": (0, 0), "q3": (1, 0)}
    kv = {"mean": 0.071685, "p90": HIGH, "max": HIGH}
    assert _figures(summary) == [
        {"running": {"mean": 0.43, "p90": 1.0, "max": 1.0},
         "waiting": {"mean": 0.0, "p90": 0.0, "max": 0.0}, "kv_usage": kv},
        {"running": {"mean": 0.43, "p90": 1.0, "max": 1.0},
         "waiting": {"mean": 0.215, "p90": 1.0, "max": 1.0}, "kv_usage": kv},
    ]
    assert summary["workers"][1]["load"]["series"] == {
        "t_ms": [10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 93.0],
        "waiting": [0.0] * 5 + [1.0, 1.0, 0.0, 0.0, 0.0],
        "running": [0.0] * 5 + [1.0, 1.0, 1.0, 1.0, 0.0],
        "kv_usage": [0.0] * 5 + [LOW, HIGH, LOW, HIGH, 0.0]}


def test_a_policy_that_follows_the_cached_prefix_shows_one_worker_loaded():
    # least_prefill: q1 -> w0 (16 uncached tokens against 160 on w1), q2 -> w1
    # (w0's 16 + q1's queued 160 = 176 > 160), q3 -> w0 (16 + 160 on w0 against
    # 16 + 160 on w1: equal, the first wins).
    # w0: x [3,23], q1 [53,73], q3 waits until 73, runs [73,93]:
    #     running at 10, 20, 60..90 -> 60/93; waiting at 60, 70 -> 20/93;
    #     KV three requests' 10/63 + 11/63 for 10 ms each -> 10/93.
    # w1: q2 [53,73]: running 20/93 (p90 1: the 73 ms at 0 are < 83.7);
    #     KV (21/63) * 10 / 93; p90: 0 for 73 ms, 10/63 for 10 -> 83 < 83.7 -> 11/63.
    result, summary = _run("least_prefill")
    assert placement(result.records) == {"x": (0, 0), "q1": (0, 0), "q2": (1, 0), "q3": (0, 0)}
    assert _figures(summary) == [
        {"running": {"mean": 0.645, "p90": 1.0, "max": 1.0},
         "waiting": {"mean": 0.215, "p90": 1.0, "max": 1.0},
         "kv_usage": {"mean": 0.107527, "p90": HIGH, "max": HIGH}},
        {"running": {"mean": 0.215, "p90": 1.0, "max": 1.0},
         "waiting": {"mean": 0.0, "p90": 0.0, "max": 0.0},
         "kv_usage": {"mean": 0.035842, "p90": HIGH, "max": HIGH}},
    ]
    table = format_table(summary, "out").splitlines()
    at = table.index(f"{'worker load':<16}{'running mean/p90':<20}{'waiting mean/p90':<20}"
                     "KV usage mean/p90")
    assert table[at + 1:at + 3] == [
        f"  {'0':<14}{'0.65 / 1':<20}{'0.21 / 1':<20}10.8% / 17.5%",
        f"  {'1':<14}{'0.21 / 1':<20}{'0.00 / 0':<20}3.6% / 17.5%"]


def test_without_telemetry_the_workers_have_no_load():
    cfg = cluster_config(2, 1, pass_log=False, max_num_seqs=1, num_gpu_blocks=64)
    summary = summarize(sim(cfg, workload(_rows())), {}, 1.0)
    assert all("load" not in w for w in summary["workers"])
    assert "worker load" not in format_table(summary, "out")


def test_the_series_merges_consecutive_samples_by_their_weighted_mean():
    # 250 samples 1 ms apart, waiting 0, 0, 3 repeated: runs of ceil(250/100) = 3,
    # each of mean 1, stamped 3, 6, ..., 249; the last run is sample 250 alone (0).
    times = np.arange(1.0, 251.0)
    values = np.tile([0.0, 0.0, 3.0], 84)[:250]
    t, merged = downsample(times, values, sample_weights(times), 100)
    assert t.tolist() == [3.0 * k for k in range(1, 84)] + [250.0]
    assert merged.tolist() == [1.0] * 83 + [0.0]


@pytest.mark.parametrize("q, expected", [(0.5, 1.0), (0.6, 1.0), (0.61, 5.0), (1.0, 5.0)])
def test_the_quantile_is_the_least_value_held_for_that_share_of_the_time(q, expected):
    # 0 for 2 ms, 1 for 4 ms, 5 for 4 ms (weights as listed, values out of order):
    # at or below 1 for 6 ms of 10.
    values = np.array([5.0, 0.0, 1.0, 5.0])
    weights = np.array([2.0, 2.0, 4.0, 2.0])
    assert time_weighted_quantile(values, weights, q) == expected


def test_a_run_that_ends_at_zero_weighs_its_samples_alike():
    assert sample_weights(np.array([0.0])).tolist() == [1.0]
    assert sample_weights(np.array([2.0, 5.0])).tolist() == [2.0, 3.0]
