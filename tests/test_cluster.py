"""Several workers and attention-DP ranks (docs/engine.md §11, §7 "Attention-DP
ranks"; spec README §3 `cluster`, §4 closed loop, §6 telemetry and per-worker
summary): routing, lockstep passes, the async free rule from the group's pass
boundary, closed-loop releases across workers, telemetry ticks and counters.

Conventions of the hand computations: block_size 16 and trace_block_size 16
(one hash id per engine block); usable blocks per rank = num_gpu_blocks - 1;
"free" is `free_blocks_after_schedule`; timing is linear 10 ms per pass unless
a test says otherwise. `wXrY` is rank Y of worker X. Ranks of a worker run in
lockstep: a pass is decided for all ranks at once and lasts as long as its
slowest rank; a rank with nothing to run logs no pass.
"""

import attrs
import numpy as np
import pytest

from helpers import LINEAR_10MS, free_blocks, make_config, make_workload, req, sched
import servesim
from servesim.errors import InputError
from servesim.replay.api import simulate
from servesim.results.metrics import summarize

LINEAR_10_PLUS_1 = {"type": "linear", "base_ms": 10, "per_token_ms": 1}


def cluster_config(workers=1, dp=1, router="round_robin", timing=None, telemetry_ms=None,
                   pass_log=True, **engine):
    """A validated Config with a `cluster` block; engine keys as in the YAML."""
    return make_config(timing=timing,
                       cluster={"workers": workers, "data_parallel_size": dp, "router": router},
                       output={"pass_log": pass_log, "telemetry_interval_ms": telemetry_ms},
                       **engine)


def workload(rows, concurrency=None):
    """make_workload's rows, plus an optional `dp_rank` per row (pinned rank)."""
    w = make_workload(rows)
    ranks = np.array([row.get("dp_rank", -1) for row in rows], dtype=np.int64)
    return attrs.evolve(w, dp_rank=ranks, concurrency=concurrency)


def sim(config, w):
    """simulate() with the pass log as the config says (off lets a worker
    run compiled stretches of passes)."""
    return simulate(config, w)


def placement(records):
    """`{id: (worker, dp_rank)}`."""
    return {i: (int(w), int(r)) for i, w, r in zip(records.ids, records.worker, records.dp_rank)}


def rank_log(log):
    """`{(worker, dp_rank): [(pass, start_ms, end_ms, scheduled ids), ...]}`."""
    out = {}
    for p in log:
        out.setdefault((p["worker"], p["dp_rank"]), []).append(
            (p["pass"], p["start_ms"], p["end_ms"], [e["id"] for e in p["scheduled"]]))
    return out


def rank_passes(log, worker, rank):
    return [p for p in log if (p["worker"], p["dp_rank"]) == (worker, rank)]


# ------------------------------------------------------------------ routing


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_round_robin_goes_through_workers_first_then_ranks(async_scheduling):
    # 2 workers x 2 ranks; r0..r7 arrive at t = 0..7, P=16 O=1 each.
    # Order: w0r0, w1r0, w0r1, w1r1, then around again.
    # w0: r0 (t=0) -> pass [0,10] on rank 0 alone. r2 (t=2, rank 1), r4 (t=4, rank 0),
    #     r6 (t=6, rank 1) wait for the worker's pass to end (async: decision 1 at t=0
    #     finds r0's last token in flight and nothing else -> waits for end(0) too).
    #     t=10: rank 0 r4, rank 1 r2 r6 -> [10,20].
    # w1: r1 (t=1) -> [1,11] on rank 0; r3, r7 (rank 1), r5 (rank 0) wait;
    #     t=11: rank 0 r5, rank 1 r3 r7 -> [11,21].
    cfg = cluster_config(2, 2, async_scheduling=async_scheduling)
    result = sim(cfg, workload([dict(id=f"r{i}", t=i, P=16, O=1) for i in range(8)]))
    rec = result.records
    assert rec.worker.tolist() == [0, 1, 0, 1, 0, 1, 0, 1]
    assert rec.dp_rank.tolist() == [0, 0, 1, 1, 0, 0, 1, 1]
    assert rank_log(result.pass_log) == {
        (0, 0): [(0, 0, 10, ["r0"]), (1, 10, 20, ["r4"])],
        (0, 1): [(0, 10, 20, ["r2", "r6"])],
        (1, 0): [(0, 1, 11, ["r1"]), (1, 11, 21, ["r5"])],
        (1, 1): [(0, 11, 21, ["r3", "r7"])],
    }
    assert rec.finish_ms.tolist() == [10, 11, 20, 21, 20, 21, 20, 21]


def test_trace_dp_rank_pins_the_rank_and_round_robin_picks_the_worker_among_those_ranks():
    # 2 workers x 2 ranks, round robin. Pinned requests go round their rank's
    # workers on a counter of their own; unpinned ones keep the global order.
    # a (rank 1) -> w0r1; b (rank 1) -> w1r1; c (free) -> w0r0 (first of the order);
    # d (rank 0) -> w0r0 (rank 0's first); e (rank 1) -> w0r1; f (free) -> w1r0.
    cfg = cluster_config(2, 2)
    rows = [dict(id="a", t=0, P=16, O=1, dp_rank=1), dict(id="b", t=1, P=16, O=1, dp_rank=1),
            dict(id="c", t=2, P=16, O=1), dict(id="d", t=3, P=16, O=1, dp_rank=0),
            dict(id="e", t=4, P=16, O=1, dp_rank=1), dict(id="f", t=5, P=16, O=1)]
    rec = sim(cfg, workload(rows)).records
    assert placement(rec) == {"a": (0, 1), "b": (1, 1), "c": (0, 0), "d": (0, 0),
                              "e": (0, 1), "f": (1, 0)}


@pytest.mark.parametrize("router", ["round_robin", "least_loaded", "least_prefill", "kv_router", "weighted"])
def test_pinned_rank_wins_over_every_router(router):
    # 1 worker x 2 ranks; a, b, c all pinned to rank 1 arrive at t=0: every router
    # would spread them (rank 0 is empty and as good), the pin keeps them on rank 1.
    # Rank 1 alone runs a, b, c (16 tokens each) in pass [0,10]; rank 0 logs nothing.
    cfg = cluster_config(1, 2, router=router)
    result = sim(cfg, workload([dict(id=x, t=0, P=16, O=1, dp_rank=1) for x in "abc"]))
    assert result.records.dp_rank.tolist() == [1, 1, 1]
    assert rank_log(result.pass_log) == {(0, 1): [(0, 0, 10, ["a", "b", "c"])]}


def test_dp_rank_from_a_mooncake_trace_row_pins_the_request(tmp_path):
    # The trace field itself, read by the loader: 1 worker x 2 ranks, round robin.
    # Rows 0 and 1 are pinned to rank 1, row 2 is not: it takes the round-robin
    # order's first target, rank 0.
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"timestamp": 0, "input_length": 16, "output_length": 1, "hash_ids": [1], "dp_rank": 1}\n'
        '{"timestamp": 1, "input_length": 16, "output_length": 1, "hash_ids": [2], "dp_rank": 1}\n'
        '{"timestamp": 2, "input_length": 16, "output_length": 1, "hash_ids": [3]}\n')
    config = {"workload": {"trace": str(trace), "trace_block_size": 16},
              "engine": {"timing": LINEAR_10MS},
              "cluster": {"workers": 1, "data_parallel_size": 2}}
    report = servesim.run(config)
    assert report.records.dp_rank.tolist() == [1, 1, 0]
    with pytest.raises(InputError, match="dp_rank 1 is out of range"):
        servesim.run(config, overrides=["cluster.data_parallel_size=1"])


def test_least_loaded_picks_fewest_running_plus_waiting_then_fewest_used_blocks_then_index():
    # 2 workers x 2 ranks; targets in index order w0r0 < w0r1 < w1r0 < w1r1.
    # load = (running + waiting, used blocks).
    # t=0 a P=32 O=20: all (0,0) -> index: w0r0.
    # t=0 b P=16 O=20: w0r0 (1,0), others (0,0) -> w0r1.
    # t=0 c P=48 O=20: w0r0 (1,0), w0r1 (1,0), w1r0 (0,0), w1r1 (0,0) -> w1r0.
    # t=0 both workers decide: a 2 blocks, b 1 block, c 3 blocks.
    # t=1 d P=16 O=1: w0r0 (1,2), w0r1 (1,1), w1r0 (1,3), w1r1 (0,0) -> w1r1 (waits:
    #     w1 is busy until 10).
    # t=2 e P=16 O=1: w1r1 (1,0) - d waits and holds no block - beats (1,1) -> w1r1.
    # t=3 f P=16 O=1: w1r1 now (2,0); w0r1 (1,1) beats w0r0 (1,2), w1r0 (1,3) -> w0r1.
    cfg = cluster_config(2, 2, router="least_loaded")
    rows = [dict(id="a", t=0, P=32, O=20), dict(id="b", t=0, P=16, O=20),
            dict(id="c", t=0, P=48, O=20), dict(id="d", t=1, P=16, O=1),
            dict(id="e", t=2, P=16, O=1), dict(id="f", t=3, P=16, O=1)]
    result = sim(cfg, workload(rows))
    assert placement(result.records) == {"a": (0, 0), "b": (0, 1), "c": (1, 0),
                                         "d": (1, 1), "e": (1, 1), "f": (0, 1)}
    # the blocks the tie-break counted: 8191 usable per rank, less a's 2, b's 1, c's 3
    log = result.pass_log
    assert [free_blocks(rank_passes(log, w, r))[0]
            for w, r in [(0, 0), (0, 1), (1, 0)]] == [8189, 8190, 8188]
    assert rank_log(log)[(1, 1)][0] == (0, 10, 20, ["d", "e"])


def _kv_rows():
    # x and y decode for a while, so that both ranks are busy at t=45.
    return [dict(id="a", t=0, P=64, O=1, hash_ids=[1, 2, 3, 4]),
            dict(id="b", t=20, P=64, O=1, hash_ids=[1, 2, 3, 5]),
            dict(id="x", t=40, P=64, O=50, hash_ids=[1, 2, 3, 6]),
            dict(id="y", t=40, P=64, O=50, hash_ids=[1, 2, 3, 7]),
            dict(id="c", t=45, P=32, O=1, hash_ids=[1, 8]),
            dict(id="d", t=45, P=64, O=1, hash_ids=[1, 2, 3, 9])]


def test_least_prefill_sends_a_request_to_the_rank_holding_its_prefix_unless_load_outweighs_it():
    # 1 worker x 2 ranks, 10 ms passes. cost = (P - cached prefix tokens, at most
    # (P-1)//16 blocks of 16) + prefill tokens queued on the rank (what running
    # requests still have to prefill + every waiting request's tokens); the least
    # wins, ties by index.
    # t=0  a [1,2,3,4] P=64: 64 + 0 on both -> r0. Pass [0,10]: a 64; its full
    #      blocks are cached and stay in r0's free queue when a finishes at 10.
    # t=20 b [1,2,3,5]: r0 (64-48) + 0 = 16, r1 64 -> r0 (round robin: r1).
    #      [20,30]: b 16 new tokens, 48 cached.
    # t=40 x [1,2,3,6]: r0 16, r1 64 -> r0, where it waits (64 tokens queued).
    #      y [1,2,3,7]: r0 16 + 64 = 80 > r1 64 + 0 -> r1: the load outweighs
    #      the 48-token hit.
    #      [40,50]: r0 x 16 (48 cached); r1 y 64. Both keep running (O=50).
    # t=45 c [1,8] P=32: one block can hit, and both ranks hold block 1 (y
    #      registered its blocks when scheduled): r0 16 + 0, r1 16 + 0 -> r0.
    #      d [1,2,3,9]: r0 16 + 32 (c waiting) = 48 > r1 16 + 0 -> r1.
    # t=50 decision: r0 x 1, c 16 (16 cached); r1 y 1, d 16 (48 cached).
    cfg = cluster_config(1, 2, router="least_prefill")
    result = sim(cfg, workload(_kv_rows()))
    rec = result.records
    assert placement(rec) == {"a": (0, 0), "b": (0, 0), "x": (0, 0), "y": (0, 1),
                              "c": (0, 0), "d": (0, 1)}
    assert rec.first_admission_cached_tokens.tolist() == [0, 48, 48, 0, 16, 48]
    log = rank_log(result.pass_log)
    assert log[(0, 0)][:4] == [(0, 0, 10, ["a"]), (1, 20, 30, ["b"]), (2, 40, 50, ["x"]),
                               (3, 50, 60, ["x", "c"])]
    assert log[(0, 1)][:2] == [(0, 40, 50, ["y"]), (1, 50, 60, ["y", "d"])]
    # the same trace under round robin: b lands on r1, where nothing is cached
    rr = sim(cluster_config(1, 2), workload(_kv_rows())).records
    assert placement(rr)["b"] == (0, 1)
    assert req(rr, "b")["first_admission_cached_tokens"] == 0


# ------------------------------------------------------------------ lockstep


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_ranks_run_in_lockstep_and_an_idle_rank_waits_for_the_group(async_scheduling):
    # 1 worker x 2 ranks, round robin, linear 10 ms + 1 ms per token, 10 usable
    # blocks per rank. a t=0 P=32 O=2 -> r0; b t=0 P=16 O=3 -> r1; c t=60 P=16 O=1 -> r0.
    # pass 0: r0 a 32 (42 ms), r1 b 16 (26 ms) -> both [0,42]: b's token 1 at 42, not 26.
    # pass 1: a 1, b 1 (11 ms each) -> [42,53]; a done at 53.
    # pass 2: r0 nothing; r1 b 1 -> [53,64]; b done at 64.
    # c arrives at 60 on r0, idle but in a busy group: it waits for the group's end.
    # pass 3: r0 c 16 -> [64,90]; r1 nothing.
    # (Async gives the same timeline: decision 1 at t=0 has a 1 and b 1 from
    # placeholders; decision 2 at 42 only b (a's last token is in flight);
    # decision 3 at 53 finds nothing -> waits for end(2) = 64, then sees c.)
    cfg = cluster_config(1, 2, timing=LINEAR_10_PLUS_1, num_gpu_blocks=11,
                         async_scheduling=async_scheduling)
    result = sim(cfg, workload([dict(id="a", t=0, P=32, O=2), dict(id="b", t=0, P=16, O=3),
                                dict(id="c", t=60, P=16, O=1)]))
    assert rank_log(result.pass_log) == {
        (0, 0): [(0, 0, 42, ["a"]), (1, 42, 53, ["a"]), (2, 64, 90, ["c"])],
        (0, 1): [(0, 0, 42, ["b"]), (1, 42, 53, ["b"]), (2, 53, 64, ["b"])],
    }
    rec = result.records
    a, b, c = req(rec, "a"), req(rec, "b"), req(rec, "c")
    assert (a["first_token_ms"], a["finish_ms"]) == (42, 53)
    assert (b["first_token_ms"], b["finish_ms"]) == (42, 64)
    assert rec.first_scheduled_ms.tolist() == [0, 0, 64]
    assert (c["first_token_ms"], c["finish_ms"]) == (90, 90)

    # Per-worker summary: 4 group passes (6 rank passes), busy 42 + 11 + 11 + 26 = 90.
    # KV usage (blocks / 10), time-weighted over [0, 90]:
    #   sync: blocks are taken at the decision at each pass start
    #     r0: a 2 blocks [0,42], 3 blocks [42,53]; c 1 block [64,90]
    #         -> 0.2*42 + 0.3*11 + 0.1*26 = 14.3
    #     r1: b 1 block [0,42], 2 blocks [42,64] -> 0.1*42 + 0.2*22 = 8.6
    #   async: decision 1 (t=0) already takes a's 3rd and b's 2nd block
    #     r0: a 3 blocks [0,53]; c [64,90] -> 0.3*53 + 0.1*26 = 18.5
    #     r1: b 2 blocks [0,64] -> 0.2*64 = 12.8
    #   worker mean = (r0 + r1) / 2 / 90
    area = 18.5 + 12.8 if async_scheduling else 14.3 + 8.6
    stats = result.stats
    assert stats.passes == 6
    (w,) = stats.workers
    assert (w.worker, w.requests, w.passes, w.busy_ms) == (0, 3, 4, 90)
    assert w.kv_usage_mean == pytest.approx(area / 2 / 90, abs=1e-12)
    summary = summarize(result, {}, 0.0)
    assert summary["workers"] == [{"worker": 0, "requests": 3, "passes": 4, "busy_ms": 90.0,
                                   "kv_usage_mean": pytest.approx(area / 180, abs=1e-6),
                                   "request_share": 1.0, "prefix_cache_hit_rate": 0.0}]
    assert summary["passes"] == 6


def _free_rule_rows():
    return [dict(id="a", t=0, P=64, O=3, dp_rank=0),
            dict(id="p", t=0, P=32, O=1, dp_rank=1),
            dict(id="s", t=0, P=16, O=3, dp_rank=1),
            dict(id="q", t=0, P=96, O=1, dp_rank=1)]


def test_async_dp_blocks_freed_in_pass_k_serve_pass_k_plus_2_from_the_group_boundary():
    # 1 worker x 2 ranks, async, linear 10 ms + 1 ms/token, 8 usable blocks per rank.
    # r0: a P=64 O=3.   r1: p P=32 O=1, s P=16 O=3, q P=96 O=1 (6 blocks).
    # decide 0 (t=0): r0 a 64 (4 blocks, free 4) -> 74 ms.
    #                 r1 p 32 (2), s 16 (1) -> free 5; q needs 6: waits -> 58 ms.
    #                 pass 0 [0,74]: r1's own batch would end at 58.
    # decide 1 (t=0): r0 a 1 (65 tokens -> 5 blocks, free 3).
    #                 r1 p's last token is in flight: skipped; s 1 (17 -> 2 blocks);
    #                 p still holds its 2 blocks: free 4 < 6, q waits. [74,85]
    # t=74 (the group's end, not r1's 58): pass 0 outputs; p finishes and frees 2.
    # decide 2 (t=74): r0 a 1 (66 tokens, 5 blocks, free 3);
    #                  r1 s 1 (18, 2 blocks) + q 96 (6) -> free 0; 10 + 97 = 107 ms.
    #                  pass 2 [85,192].
    # decide 3 (t=85): every last token is in flight -> nothing; all done at 192.
    cfg = cluster_config(1, 2, timing=LINEAR_10_PLUS_1, num_gpu_blocks=9,
                         async_scheduling=True)
    result = sim(cfg, workload(_free_rule_rows()))
    log = result.pass_log
    assert [sched(p) for p in rank_passes(log, 0, 1)] == [
        [("p", 32, 0, "new"), ("s", 16, 0, "new")],
        [("s", 1, 0, "running")],
        [("s", 1, 0, "running"), ("q", 96, 0, "new")]]
    assert free_blocks(rank_passes(log, 0, 0)) == [4, 3, 3]
    assert free_blocks(rank_passes(log, 0, 1)) == [5, 4, 0]
    assert rank_log(log)[(0, 1)] == [(0, 0, 74, ["p", "s"]), (1, 74, 85, ["s"]),
                                     (2, 85, 192, ["s", "q"])]
    # decision 2 is taken at the group's end(0) = 74 on both ranks
    assert [p["decided_ms"] for p in log if p["pass"] == 2] == [74, 74]
    p, q = req(result.records, "p"), req(result.records, "q")
    assert (p["finish_ms"], p["finish_pass"]) == (74, 0)
    assert (q["first_token_ms"], q["first_token_pass"]) == (192, 2)


def test_sync_dp_blocks_freed_in_pass_k_serve_pass_k_plus_1_at_the_group_end():
    # The same trace, synchronous: decide 1 is at the group's end(0) = 74, after
    # p's blocks are freed.
    # pass 0 [0,74]: as above; free r0 4, r1 5.
    # t=74 decide 1: r0 a 1 (5 blocks, free 3); r1 s 1 (2 blocks) + q 96 (6) -> free 0;
    #      10 + 97 = 107 ms -> [74,181]; q finishes at 181 and frees its 6 blocks.
    # decide 2 (t=181): r0 a 1 (66 tokens, free 3); r1 s 1 (18, 2 blocks, free 6)
    #      -> [181,192].
    cfg = cluster_config(1, 2, timing=LINEAR_10_PLUS_1, num_gpu_blocks=9)
    result = sim(cfg, workload(_free_rule_rows()))
    log = result.pass_log
    assert free_blocks(rank_passes(log, 0, 0)) == [4, 3, 3]
    assert free_blocks(rank_passes(log, 0, 1)) == [5, 0, 6]
    assert rank_log(log)[(0, 1)] == [(0, 0, 74, ["p", "s"]), (1, 74, 181, ["s", "q"]),
                                     (2, 181, 192, ["s"])]
    assert req(result.records, "q")["first_token_ms"] == 181


# ---------------------------------------------------------------- closed loop


def _in_flight_max(rec):
    """Most requests in flight at once (a request is in flight over
    [arrival, finish); a release at a finish instant does not overlap)."""
    events = sorted([(float(t), 1) for t in rec.arrival_ms] +
                    [(float(t), -1) for t in rec.finish_ms], key=lambda e: (e[0], e[1]))
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


@pytest.mark.parametrize("pass_log", [True, False])
def test_closed_loop_releases_the_next_request_at_each_completion_across_workers(pass_log):
    # concurrency 2, 2 workers x 1 rank, round robin; the trace's timestamps are ignored.
    # a P=16 O=3, b O=1, c O=2, d O=1, e O=1 (all P=16).
    # t=0: a -> w0, b -> w1; both [0,10].
    # t=10: w0 decides a's next pass first: a 1 -> [10,20]; b finishes on w1 and
    #       releases c, which arrives after every decision at 10 (docs/engine.md
    #       §7 "Ties") -> w0 (round robin), so it first joins w0's pass at 20.
    # t=20: a 1, c 16 -> [20,30]: a finishes (token 3), c has token 1.
    # t=30: w0 decides c 1 -> [30,40]; a's completion releases d -> w1 (idle) at 30:
    #       [30,40].
    # t=40: c and d finish; the first of their completions releases e -> w0 (round
    #       robin) at 40: [40,50].
    # (Without the pass log the fast path runs compiled stretches of passes.)
    rows = [dict(id="a", t=100, P=16, O=3), dict(id="b", t=200, P=16, O=1),
            dict(id="c", t=300, P=16, O=2), dict(id="d", t=400, P=16, O=1),
            dict(id="e", t=500, P=16, O=1)]
    cfg = cluster_config(2, 1, pass_log=pass_log)
    rec = sim(cfg, workload(rows, concurrency=2)).records
    assert rec.arrival_ms.tolist() == [0, 0, 10, 30, 40]
    assert rec.finish_ms.tolist() == [30, 10, 40, 40, 50]
    assert rec.worker.tolist() == [0, 1, 0, 1, 0]
    assert _in_flight_max(rec) == 2


@pytest.mark.parametrize("pass_log", [True, False])
def test_closed_loop_releases_the_next_request_when_the_last_token_reaches_the_client(pass_log):
    # concurrency 1, one worker, 10 ms passes, detokenize_ms 2: a (P=16, O=2)
    # runs [0,10] and [10,20]; its tokens reach the client at 12 and 22, so
    # the client sends b at 22 (not at a's engine release, 20): b runs
    # [22,32] and its token reaches the client at 34.
    rows = [dict(id="a", t=0, P=16, O=2), dict(id="b", t=0, P=16, O=1)]
    cfg = cluster_config(1, 1, pass_log=pass_log, detokenize_ms=2.0)
    rec = sim(cfg, workload(rows, concurrency=1)).records
    assert rec.first_token_ms.tolist() == [12, 34]
    assert rec.finish_ms.tolist() == [22, 34]
    assert rec.arrival_ms.tolist() == [0, 22]


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("pass_log", [True, False])
def test_closed_loop_never_has_more_than_n_in_flight_and_releases_at_finish_instants(
        async_scheduling, pass_log):
    # 3 workers x 2 ranks, concurrency 4, 20 requests of mixed sizes: every request
    # after the first 4 arrives at the finish instant of an earlier one, the k-th
    # release at the k-th completion (in time order), and at most 4 are in flight.
    rows = [dict(id=f"r{i}", t=0, P=16 * (1 + i % 3), O=1 + (7 * i) % 5) for i in range(20)]
    cfg = cluster_config(3, 2, timing=LINEAR_10_PLUS_1, pass_log=pass_log,
                         async_scheduling=async_scheduling)
    rec = sim(cfg, workload(rows, concurrency=4)).records
    assert (rec.status == 0).all()
    assert rec.arrival_ms[:4].tolist() == [0, 0, 0, 0]
    finishes = sorted(rec.finish_ms.tolist())
    assert rec.arrival_ms[4:].tolist() == finishes[:16]
    assert _in_flight_max(rec) == 4


# ------------------------------------------------------------------ telemetry


def test_telemetry_samples_each_rank_at_each_tick_with_the_state_after_its_events():
    # 1 worker x 2 ranks, round robin, 10 usable blocks per rank, interval 6 ms.
    # a t=0 P=32 O=2 -> r0; b t=0 P=16 O=1 -> r1; c t=6 P=16 O=1 -> r0.
    # pass 0 [0,10]: r0 a 32 (2 blocks), r1 b 16 (1 block). b done at 10.
    # pass 1 [10,20]: r0 a 1 (33 tokens -> 3 blocks), c 16 (1 block); both done at 20.
    # tick 6 (c's arrival at 6 included): r0 running 1 waiting 1, usage 0.2, 2 cached
    #        blocks (a's full ones); r1 running 1, usage 0.1, 1 cached. Counters over
    #        (0,6]: r0 1 pass, 32 tokens, 32 queried; r1 1 pass, 16 tokens, 16 queried.
    # tick 12: r0 running 2 (a, c), usage 0.4, cached 3 (a's 2 + c's 1); 1 pass,
    #        17 tokens, 16 queried (c). r1 idle: usage 0, b's block still cached.
    # tick 18: same state, no counts.  final sample at 20: everything freed (cached
    # blocks stay cached), no counts.
    cfg = cluster_config(1, 2, num_gpu_blocks=11, telemetry_ms=6)
    result = sim(cfg, workload([dict(id="a", t=0, P=32, O=2), dict(id="b", t=0, P=16, O=1),
                                dict(id="c", t=6, P=16, O=1)]))
    keys = ("t_ms", "worker", "dp_rank", "running", "waiting", "kv_usage", "cached_blocks",
            "cpu_tier_blocks", "preemptions", "prefix_queries", "prefix_hits",
            "tokens_scheduled", "passes")
    got = [tuple(s[k] for k in keys) for s in result.telemetry]
    assert got == [
        (6, 0, 0, 1, 1, 0.2, 2, 0, 0, 32, 0, 32, 1),
        (6, 0, 1, 1, 0, 0.1, 1, 0, 0, 16, 0, 16, 1),
        (12, 0, 0, 2, 0, 0.4, 3, 0, 0, 16, 0, 17, 1),
        (12, 0, 1, 0, 0, 0.0, 1, 0, 0, 0, 0, 0, 0),
        (18, 0, 0, 2, 0, 0.4, 3, 0, 0, 0, 0, 0, 0),
        (18, 0, 1, 0, 0, 0.0, 1, 0, 0, 0, 0, 0, 0),
        (20, 0, 0, 0, 0, 0.0, 3, 0, 0, 0, 0, 0, 0),
        (20, 0, 1, 0, 0, 0.0, 1, 0, 0, 0, 0, 0, 0),
    ]


@pytest.mark.parametrize("workers,dp,end_ms", [(1, 1, 193.24), (2, 2, 130.99)])
def test_telemetry_ticks_are_multiples_of_the_interval_without_drift(workers, dp, end_ms):
    # interval 0.1 ms over a run of 100+ ms: tick i is at exactly i * 0.1 (summing
    # 0.1 ten times gives 0.9999999999999999, not 1.0); one sample per worker and
    # rank per tick, in (worker, rank) order, then a final partial sample at the end
    # of the run, which is not a multiple of 0.1 here (passes of 10.03 ms + 0.25 ms
    # per token + 0.5 ms per request): ticks 0.1 .. 193.2 then 193.24 on one worker,
    # 0.1 .. 130.9 then 130.99 on two.
    timing = {"type": "linear", "base_ms": 10.03, "per_token_ms": 0.25, "per_request_ms": 0.5}
    rows = [dict(id=f"r{i}", t=3 * i, P=16 + 8 * i, O=3 + i % 4) for i in range(8)]
    for pass_log in (True, False):
        cfg = cluster_config(workers, dp, timing=timing, telemetry_ms=0.1, pass_log=pass_log)
        result = sim(cfg, workload(rows))
        end = float(np.nanmax(result.records.finish_ms))
        samples = result.telemetry
        per_tick = workers * dp
        assert len(samples) % per_tick == 0
        ticks = [samples[i]["t_ms"] for i in range(0, len(samples), per_tick)]
        n = len(ticks) - 1
        assert ticks[:n] == [i * 0.1 for i in range(1, n + 1)]
        assert end == pytest.approx(end_ms, abs=1e-9)
        assert n == int(end_ms * 10) and ticks[n] == end
        order = [(w, r) for w in range(workers) for r in range(dp)]
        for i in range(0, len(samples), per_tick):
            group = samples[i:i + per_tick]
            assert [(s["worker"], s["dp_rank"]) for s in group] == order
            assert len({s["t_ms"] for s in group}) == 1


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("workers,dp", [(1, 1), (2, 2)])
def test_telemetry_interval_counters_sum_to_the_run_totals(workers, dp, async_scheduling):
    # A run with prefix hits (a shared 64-token prefix) and preemptions (12 usable
    # blocks per rank, outputs of 20-35 tokens); every request finishes. The
    # per-interval counters summed over each rank's samples equal that rank's
    # totals (passes and tokens from the pass log; preemptions, prefix queries and
    # hits from its requests' records: every request is admitted once unpreempted,
    # querying its prompt), and over all samples the run's (RunStats). Checked with
    # the pass log on and off (off: compiled stretches of passes on the fast path,
    # cut at ticks) - the telemetry is the same.
    rows = [dict(id=f"r{i}", t=5 * i, P=64 + 16 * (i % 3), O=20 + 5 * (i % 4),
                 hash_ids=[1, 2, 3, 4] + [100 + 10 * i + k for k in range(i % 3)])
            for i in range(12)]
    results = []
    for pass_log in (True, False):
        cfg = cluster_config(workers, dp, num_gpu_blocks=13, telemetry_ms=7,
                             pass_log=pass_log, async_scheduling=async_scheduling)
        result = sim(cfg, workload(rows))
        results.append(result)
        stats, samples = result.stats, result.telemetry
        assert (result.records.status == 0).all()
        assert stats.preemptions > 0 and stats.prefix_cache_hits > 0
        assert sum(s["preemptions"] for s in samples) == stats.preemptions
        assert sum(s["prefix_queries"] for s in samples) == stats.prefix_cache_queries
        assert sum(s["prefix_hits"] for s in samples) == stats.prefix_cache_hits
        assert sum(s["passes"] for s in samples) == stats.passes
    log = results[0].pass_log
    rec = results[0].records
    for w in range(workers):
        for r in range(dp):
            mine = [s for s in results[0].telemetry if (s["worker"], s["dp_rank"]) == (w, r)]
            passes = rank_passes(log, w, r)
            here = (rec.worker == w) & (rec.dp_rank == r)
            assert sum(s["passes"] for s in mine) == len(passes)
            assert sum(s["tokens_scheduled"] for s in mine) == sum(
                e["tokens"] for p in passes for e in p["scheduled"])
            assert sum(s["preemptions"] for s in mine) == rec.num_preemptions[here].sum()
            assert sum(s["prefix_queries"] for s in mine) == rec.input_length[here].sum()
            assert sum(s["prefix_hits"] for s in mine) == \
                rec.first_admission_cached_tokens[here].sum()
    assert results[0].telemetry == results[1].telemetry


# ------------------------------------------------------------ per-worker summary


def test_per_worker_summary_counts_requests_passes_and_busy_time_of_each_worker():
    # 2 workers x 2 ranks, round robin, linear 10 + 1/token, P=16 O=2 at t = 0, 1, 2, 3:
    # r0 -> w0r0, r1 -> w1r0, r2 -> w0r1, r3 -> w1r1.
    # w0: [0,26] r0 16; r2 waits; then r0 1 (11 ms) + r2 16 (26 ms) -> [26,52];
    #     [52,63]: r2 1. 3 passes, busy 26 + 26 + 11 = 63.
    # w1: [1,27] r1; [27,53] r1 1 + r3 16; [53,64] r3 1. 3 passes, busy 63.
    cfg = cluster_config(2, 2, timing=LINEAR_10_PLUS_1)
    result = sim(cfg, workload([dict(id=f"r{i}", t=i, P=16, O=2) for i in range(4)]))
    log = result.pass_log
    assert rank_log(log) == {
        (0, 0): [(0, 0, 26, ["r0"]), (1, 26, 52, ["r0"])],
        (0, 1): [(0, 26, 52, ["r2"]), (1, 52, 63, ["r2"])],
        (1, 0): [(0, 1, 27, ["r1"]), (1, 27, 53, ["r1"])],
        (1, 1): [(0, 27, 53, ["r3"]), (1, 53, 64, ["r3"])],
    }
    summary = summarize(result, {}, 0.0)
    assert [(w["worker"], w["requests"], w["passes"], w["busy_ms"])
            for w in summary["workers"]] == [(0, 2, 3, 63), (1, 2, 3, 63)]
    for w in result.stats.workers:
        group = {(p["start_ms"], p["end_ms"]) for p in log if p["worker"] == w.worker}
        assert w.busy_ms == sum(end - start for start, end in group)
        assert w.passes == len(group)
    assert result.records.worker.tolist() == [0, 1, 0, 1]
    assert result.records.dp_rank.tolist() == [0, 0, 1, 1]
