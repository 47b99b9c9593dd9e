"""Disaggregated prefill/decode serving (servesim/engine/kv_handoff.py,
servesim/replay/disaggregated.py): one test per rule, each with the smallest
timeline that shows it, worked out by hand.

Conventions of the hand computations: block_size 16 and trace_block_size 16
(one hash id per engine block); linear timing of 10 ms per pass on both pools
unless a test says otherwise, so a pass is [t, t + 10]; the link moves
`bytes_per_token: 62500` tokens at 1 GB/s, i.e. 16 tokens (one block) per ms,
and adds `latency_ms` (0.5 unless said otherwise) once the bytes are off the
wire. "free" is `free_blocks_after_schedule`; usable blocks are
`num_gpu_blocks - 1`. A request runs on the prefill worker with max_tokens 1
(its first token, released at that pass's end, is its TTFT), then on a decode
worker with num_tokens = P + 1.
"""

import json

import pytest

from helpers import LINEAR_10MS, make_workload, sched
from servesim.errors import InputError
from servesim.replay.api import resolve_config as api_resolve
from servesim.replay.api import run as api_run
from servesim.config.config import config_from_dict, config_to_dict, load_config
from servesim.replay.api import make_replay
from servesim.config.examples import example_text
from servesim.results.metrics import summarize
from servesim.results.output import request_lines
from servesim.config.preflight import check_run, pool_sizes

LINK = {"bytes_per_token": 62500, "bandwidth_gbps": 1, "latency_ms": 0.5}


def disagg(prefill_workers=1, decode_workers=1, router="round_robin", link=None, prefill=None,
           decode=None, data_parallel_size=1, **engine):
    """The data of a disaggregated config (engine keys as in the YAML)."""
    engine = dict(engine)
    engine.setdefault("max_num_seqs", 16)
    engine.setdefault("timing", dict(LINEAR_10MS))
    cluster = {"mode": "disaggregated", "prefill_workers": prefill_workers,
               "decode_workers": decode_workers, "router": router,
               "data_parallel_size": data_parallel_size,
               "kv_transfer": dict(LINK if link is None else link)}
    if prefill is not None:
        cluster["prefill"] = prefill
    if decode is not None:
        cluster["decode"] = decode
    return {"workload": {"synthetic": {"requests": 1}, "trace_block_size": 16},
            "engine": engine, "cluster": cluster, "output": {"pass_log": True}}


def replay_of(cfg, workload):
    """The replay of `cfg` over `workload`."""
    return make_replay(cfg, workload)


def simulate(data, rows):
    """`(replay, result)` of the rows under the config data."""
    replay = replay_of(config_from_dict(data, source="test"), make_workload(rows))
    return replay, replay.run()


def passes(result, pool, worker=0):
    """`[(start, end, scheduled, free)]` of one worker's logged passes."""
    return [(p["start_ms"], p["end_ms"], sched(p), p["free_blocks_after_schedule"])
            for p in result.pass_log if p["pool"] == pool and p["worker"] == worker]


def row(result, request_id):
    """One request's requests.jsonl line, as a dict."""
    lines = [json.loads(line) for chunk in request_lines(result) for line in chunk]
    return next(r for r in lines if r["id"] == request_id)


def sender(replay, worker=0, rank=0):
    return replay.prefill_workers[worker].ranks[rank].transfers


# ------------------------------------------------------------------ one request


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_one_request_prefill_pass_then_exact_transfer_then_decode_passes(async_scheduling):
    # a: t=0, P=64 (4 blocks), O=3.
    # prefill [0,10]:   a 64 tokens, samples token 1 -> TTFT 10; a finishes there
    #                   (max_tokens 1) and is handed off at 10, its 4 blocks held.
    # decode decides at 10: G1 hit 0, so all 64 prompt tokens are pulled:
    #                   64 x 62500 B at 1 GB/s = 4 ms on the wire [10, 14], + 0.5 ms
    #                   latency -> lands at 14.5; decode idles until then. Its
    #                   blocks are allocated now: 4 for the prompt and the block
    #                   of token 65 (the first token's slot).
    # decode [14.5,24.5]: a admitted, 64 cached, computes 1 token (the first
    #                   token's KV) and samples token 2; it is a decode pass.
    #                   free = 8191 - 5.
    # decode [24.5,34.5]: token 3 -> finished at 34.5.
    # The prefill worker frees a's blocks when the transfer lands (14.5).
    # (Async scheduling gives the same instants: each pool has one request.)
    data = disagg(num_gpu_blocks=8192, async_scheduling=async_scheduling)
    replay, result = simulate(data, [dict(id="a", t=0, P=64, O=3)])
    assert passes(result, "prefill") == [(0.0, 10.0, [("a", 64, 0, "new")], 8187)]
    assert passes(result, "decode") == [(14.5, 24.5, [("a", 1, 64, "new")], 8186),
                                        (24.5, 34.5, [("a", 1, 0, "running")], 8186)]
    a = row(result, "a")
    assert (a["first_token_ms"], a["ttft_ms"], a["finish_ms"], a["tpot_ms"]) == (
        10.0, 10.0, 34.5, 12.25)
    assert (a["kv_transfer_ms"], a["transferred_tokens"], a["output_tokens"]) == (4.5, 64, 3)
    assert (a["prefill_worker"], a["decode_worker"], a["worker"]) == (0, 0, 0)
    assert (a["first_token_pass"], a["finish_pass"]) == (0, 1)  # prefill pass 0, decode pass 1
    job = replay.transfer(0)
    assert (job.submit_ms, job.start_ms, job.finish_ms, job.land_ms) == (10.0, 10.0, 14.0, 14.5)
    assert sender(replay).freed == [(0, 14.5)]
    # the decode pass computing the first token's KV is priced as a decode
    assert result.stats.pools["decode"].busy_ms == 20.0


def test_summary_has_pools_and_transfers_and_the_prefill_pools_prefix_cache():
    # As above; the prefill pool holds 4 blocks of 8191 over [0, 14.5] of a
    # 34.5 ms run; the decode pool 5 blocks over [10, 34.5]: the prompt's 4 and
    # the first token's slot are allocated before the transfer.
    _, result = simulate(disagg(num_gpu_blocks=8192), [dict(id="a", t=0, P=64, O=3)])
    s = summarize(result, {}, 0.0)
    keys = list(s)
    assert keys[keys.index("workers") + 1:keys.index("workers") + 3] == ["pools", "kv_transfer"]
    assert [(w["pool"], w["worker"], w["passes"]) for w in s["workers"]] == [
        ("prefill", 0, 1), ("decode", 0, 2)]
    prefill, decode = s["pools"]["prefill"], s["pools"]["decode"]
    assert (prefill["workers"], prefill["requests"], prefill["passes"], prefill["busy_ms"]) == (
        1, 1, 1, 10.0)
    assert (decode["workers"], decode["requests"], decode["passes"], decode["busy_ms"]) == (
        1, 1, 2, 20.0)
    assert prefill["kv_usage_mean"] == round(4 / 8191 * 14.5 / 34.5, 6)
    assert decode["kv_usage_mean"] == round(5 * 24.5 / 8191 / 34.5, 6)
    assert s["kv_transfer"] == {
        "handoffs": 1, "transfers": 1, "transferred_tokens": 64, "transferred_bytes": 4_000_000,
        "kv_transfer_ms": {"mean": 4.5, "p50": 4.5, "p90": 4.5, "p95": 4.5, "p99": 4.5,
                           "max": 4.5}}
    # one prefix lookup per request, on the prefill worker (64 tokens queried)
    assert (s["prefix_cache_queries"], s["prefix_cache_hits"]) == (64, 0)


def test_a_one_token_request_finishes_on_the_prefill_worker_and_is_never_handed_off():
    # b: P=32, O=1: the prefill pass [0,10] produces its only token; its blocks
    # are freed at once (nothing to hold), no decode worker ever sees it.
    replay, result = simulate(disagg(num_gpu_blocks=64), [dict(id="b", t=0, P=32, O=1)])
    assert passes(result, "decode") == []
    b = row(result, "b")
    assert (b["status"], b["output_tokens"], b["finish_ms"]) == ("finished", 1, 10.0)
    assert (b["worker"], b["dp_rank"], b["decode_worker"], b["kv_transfer_ms"],
            b["transferred_tokens"], b["prefill_worker"]) == (None, None, None, None, None, 0)
    assert sender(replay).freed == [] and replay.transfer(0) is None
    assert not replay.prefill_workers[0].ranks[0].scheduler.has_requests()
    assert replay.prefill_workers[0].ranks[0].pool.num_free_blocks == 63


# ------------------------------------------------------------------ what moves


def test_a_decode_worker_holding_the_prefix_pulls_only_the_missing_blocks_and_least_prefill_picks_it():
    # Two decode workers, router least_prefill (prefill side: one worker).
    # a: t=0,  P=64, O=2, hashes [1,2,3,4]; b: t=30, P=64, O=2, hashes [1,2,3,9].
    # a: prefill [0,10]; the decode workers tie (nothing cached, no load): decode 0.
    #    Pull 64 tokens: wire [10,14], lands 14.5; decode 0 [14.5,24.5] samples
    #    token 2 -> done; its prompt blocks were registered when the pull landed.
    #    The prefill worker frees a's blocks at 14.5 (they stay cached).
    # b: prefill [30,40]: G1 hit of a's first 3 blocks (48 tokens), computes 16;
    #    free 63 - 3 (hit blocks, taken out of the free queue) - 1 = 59.
    #    Handoff at 40: least_prefill scores decode 0 at 3 blocks, decode 1 at 0 ->
    #    decode 0, whose G1 hit is 48 tokens: only 64 - 48 = 16 tokens are pulled:
    #    1 ms on the wire [40,41], lands 41.5. decode 0 [41.5,51.5]: b 1 token,
    #    64 cached (48 from G1, 16 pulled).
    data = disagg(decode_workers=2, router="least_prefill", num_gpu_blocks=64)
    replay, result = simulate(data, [dict(id="a", t=0, P=64, O=2, hash_ids=[1, 2, 3, 4]),
                                     dict(id="b", t=30, P=64, O=2, hash_ids=[1, 2, 3, 9])])
    assert passes(result, "prefill") == [(0.0, 10.0, [("a", 64, 0, "new")], 59),
                                         (30.0, 40.0, [("b", 16, 48, "new")], 59)]
    assert passes(result, "decode", 0) == [(14.5, 24.5, [("a", 1, 64, "new")], 58),
                                           (41.5, 51.5, [("b", 1, 64, "new")], 58)]
    assert passes(result, "decode", 1) == []
    a, b = row(result, "a"), row(result, "b")
    assert (a["transferred_tokens"], a["kv_transfer_ms"]) == (64, 4.5)
    assert (b["transferred_tokens"], b["kv_transfer_ms"], b["decode_worker"]) == (16, 1.5, 0)
    assert (b["first_admission_cached_tokens"], b["finish_ms"]) == (48, 51.5)
    assert sender(replay).freed == [(0, 14.5), (1, 41.5)]
    # the decode pool's prefix cache: queries of 65 tokens each, b's 48-token hit
    decode = result.stats.pools["decode"]
    assert (decode.prefix_cache_queries, decode.prefix_cache_hits) == (130, 48)


def test_a_decode_worker_holding_the_whole_prompt_pulls_nothing_and_notifies_the_prefill_worker():
    # a: t=0, P=64, O=2, hashes [1,2,3,4]: as above, done on the decode worker at
    # 24.5, which keeps its 4 prompt blocks cached. c: t=30, the same prompt.
    # prefill [30,40]: c hits 48 tokens (never the last token's block), computes 16.
    # Handoff at 40: the decode worker's lookup for 65 tokens may cover all 4
    # prompt blocks: hit 64 = P, nothing to pull. c is admitted at once:
    # decode [40,50] computes the first token's KV, samples token 2.
    # The notice (no bytes) reaches the prefill worker after the latency: it
    # frees c's blocks at 40.5 (idle, it wakes for it).
    replay, result = simulate(disagg(num_gpu_blocks=64),
                              [dict(id="a", t=0, P=64, O=2, hash_ids=[1, 2, 3, 4]),
                               dict(id="c", t=30, P=64, O=2, hash_ids=[1, 2, 3, 4])])
    assert passes(result, "decode") == [(14.5, 24.5, [("a", 1, 64, "new")], 58),
                                        (40.0, 50.0, [("c", 1, 64, "new")], 58)]
    c = row(result, "c")
    assert (c["transferred_tokens"], c["kv_transfer_ms"], c["finish_ms"]) == (0, 0.0, 50.0)
    assert sender(replay).freed == [(0, 14.5), (1, 40.5)]
    s = summarize(result, {}, 0.0)["kv_transfer"]
    assert (s["handoffs"], s["transfers"], s["transferred_tokens"]) == (2, 1, 64)


def test_transfers_from_one_prefill_worker_queue_fifo_on_its_link():
    # One prefill worker, two decode workers, round robin. a and b (P=64 each)
    # arrive at 0 and share prefill [0,10] (128 tokens). At 10 a goes to decode 0
    # and b to decode 1; both pull 64 tokens over the prefill worker's one link:
    # a's on the wire [10,14] -> lands 14.5; b's queues behind it: [14,18] -> 18.5.
    # (Latency is pipelined: it does not hold the wire.)
    replay, result = simulate(disagg(decode_workers=2, num_gpu_blocks=64),
                              [dict(id="a", t=0, P=64, O=2), dict(id="b", t=0, P=64, O=2)])
    assert passes(result, "prefill") == [
        (0.0, 10.0, [("a", 64, 0, "new"), ("b", 64, 0, "new")], 55)]
    assert passes(result, "decode", 0) == [(14.5, 24.5, [("a", 1, 64, "new")], 58)]
    assert passes(result, "decode", 1) == [(18.5, 28.5, [("b", 1, 64, "new")], 58)]
    jobs = [(replay.transfer(i).start_ms, replay.transfer(i).finish_ms, replay.transfer(i).land_ms)
            for i in range(2)]
    assert jobs == [(10.0, 14.0, 14.5), (14.0, 18.0, 18.5)]
    assert (row(result, "a")["kv_transfer_ms"], row(result, "b")["kv_transfer_ms"]) == (4.5, 8.5)
    assert sender(replay).freed == [(0, 14.5), (1, 18.5)]


# ------------------------------------------------------------------ back-pressure


def test_a_full_decode_pool_makes_the_handoff_wait_while_the_prefill_worker_holds_the_blocks():
    # Decode pool: num_gpu_blocks 6 (5 usable); prefill pool: 64 (63 usable).
    # Link without latency: 48 tokens take 3 ms.
    # a: t=0, P=48, O=20. prefill [0,10]; pull of 48 tokens decided at 10, with
    #    the blocks of 49 tokens (4 <= 5 free) -> lands 13.
    #    decode pass k over [13 + 10k, 23 + 10k] computes token 49 + k: 4 blocks
    #    until k = 15, a 5th from k = 16 (token 65); pass 18 samples token 20:
    #    a finishes at 203 and frees all 5 blocks.
    # b: t=20, P=48, O=2. prefill [20,30] (free 63 - 3 = 60); handed off at 30.
    #    At decode's decisions (33, 43, ...) b heads the waiting queue but its
    #    admission needs 4 free blocks (49 tokens) and only 1 (then 0) is free:
    #    it waits, head of line, and the prefill worker keeps its 3 blocks.
    # c: t=100, P=16, O=1 (never handed off): prefill [100,110], free 63 - 3 - 1 = 59:
    #    b's blocks are still held.
    # At 203 b is admitted for the pull: lands 206; decode [206,216] -> b done.
    # The prefill worker frees b's blocks at 206 (it is idle and wakes for it).
    # d: t=210, P=16, O=1: prefill [210,220], free 63 - 1 = 62.
    data = disagg(num_gpu_blocks=64, decode={"num_gpu_blocks": 6},
                  link={"bytes_per_token": 62500, "bandwidth_gbps": 1, "latency_ms": 0})
    replay, result = simulate(data, [dict(id="a", t=0, P=48, O=20), dict(id="b", t=20, P=48, O=2),
                                     dict(id="c", t=100, P=16, O=1),
                                     dict(id="d", t=210, P=16, O=1)])
    assert passes(result, "prefill") == [(0.0, 10.0, [("a", 48, 0, "new")], 60),
                                         (20.0, 30.0, [("b", 48, 0, "new")], 60),
                                         (100.0, 110.0, [("c", 16, 0, "new")], 59),
                                         (210.0, 220.0, [("d", 16, 0, "new")], 62)]
    decode = passes(result, "decode")
    assert decode[0] == (13.0, 23.0, [("a", 1, 48, "new")], 1)
    assert decode[16] == (173.0, 183.0, [("a", 1, 0, "running")], 0)  # a's 5th block
    assert decode[18][:2] == (193.0, 203.0)
    assert decode[19] == (206.0, 216.0, [("b", 1, 48, "new")], 1)
    assert len(decode) == 20
    b = row(result, "b")
    assert (b["first_token_ms"], b["finish_ms"], b["kv_transfer_ms"]) == (30.0, 216.0, 3.0)
    assert sender(replay).freed == [(0, 13.0), (1, 206.0)]
    assert replay.transfer(1).submit_ms == 203.0


def test_a_request_preempted_with_its_first_token_in_flight_is_handed_off_with_nothing_to_pull():
    # Async scheduling; prefill pool of 3 blocks (2 usable), budget 32,
    # long_prefill_token_threshold 16, reserve_full_isl off. Decode pool ample.
    # y: t=0, P=32, O=2; x: t=0, P=16, O=2.
    # prefill pass 0 [0,10]: y 16 (block 1, thr), x 16 (block 2, samples); free 0.
    # decision for pass 1 at 0: y needs its 2nd block, none free -> the last
    #   running request, x, is preempted (its blocks freed; its token in flight);
    #   pass 1 [10,20]: y 16, samples.
    # At 10 x's token lands: x has its one prefill token and finishes there, with
    #   no blocks left: handed off, the decode worker has nothing to pull and
    #   computes x's 16 prompt tokens and the first token's KV itself:
    #   decode [10,20] x 17 (a prefill there), token 2 at 20.
    # At 20 y is handed off; the decode worker (its pass just ended) decides at 20:
    #   pull 32 tokens: 2 ms + 0.5 -> 22.5; decode [22.5,32.5] y 1 token, 32 cached.
    data = disagg(num_gpu_blocks=64, async_scheduling=True, max_num_batched_tokens=32,
                  long_prefill_token_threshold=16,
                  prefill={"num_gpu_blocks": 3, "reserve_full_isl": False})
    replay, result = simulate(data, [dict(id="y", t=0, P=32, O=2), dict(id="x", t=0, P=16, O=2)])
    prefill = [p for p in result.pass_log if p["pool"] == "prefill"]
    assert [(sched(p), p["preempted"]) for p in prefill] == [
        ([("y", 16, 0, "new"), ("x", 16, 0, "new")], []),
        ([("y", 16, 0, "running")], ["x"])]
    assert passes(result, "decode") == [(10.0, 20.0, [("x", 17, 0, "new")], 61),
                                        (22.5, 32.5, [("y", 1, 32, "new")], 60)]
    x, y = row(result, "x"), row(result, "y")
    assert (x["ttft_ms"], x["finish_ms"], x["num_preemptions"], x["recomputed_tokens"]) == (
        10.0, 20.0, 1, 16)
    assert (x["transferred_tokens"], x["kv_transfer_ms"]) == (0, 0.0)
    assert (y["transferred_tokens"], y["kv_transfer_ms"], y["finish_ms"]) == (32, 2.5, 32.5)
    assert sender(replay).freed == [(0, 22.5)]  # x had nothing to free


def test_a_request_alone_on_a_prefill_worker_waits_for_blocks_held_for_a_transfer():
    # Prefill pool 4 blocks (3 usable), budget 16, reserve_full_isl off; a slow
    # link without latency: 32 tokens = 2e6 B at 0.05 GB/s = 40 ms.
    # a: t=0, P=32, O=2: prefill [0,10] 16, [10,20] 16 (samples); handed off at
    #    20, the pull is on the wire [20,60]: a's 2 blocks are held until 60.
    # b: t=20, P=32, O=1: prefill [20,30] b 16 (the last free block).
    #    Decision at 30: b needs a 2nd block, none is free; alone in running it
    #    preempts itself — but the held blocks come back, so it is not taken out
    #    as unfinishable: it waits (its first block stays cached; re-admitting it
    #    needs that block and a new one, 2 free, and 1 is).
    # At 60 the pull lands: a's blocks are freed, b resumes with 16 cached:
    #    prefill [60,70] b 16 -> done at 70; decode [60,70] a 1 token.
    data = disagg(num_gpu_blocks=64, max_num_batched_tokens=16,
                  prefill={"num_gpu_blocks": 4, "reserve_full_isl": False},
                  link={"bytes_per_token": 62500, "bandwidth_gbps": 0.05, "latency_ms": 0})
    replay, result = simulate(data, [dict(id="a", t=0, P=32, O=2), dict(id="b", t=20, P=32, O=1)])
    assert passes(result, "prefill") == [(0.0, 10.0, [("a", 16, 0, "new")], 2),
                                         (10.0, 20.0, [("a", 16, 0, "running")], 1),
                                         (20.0, 30.0, [("b", 16, 0, "new")], 0),
                                         (60.0, 70.0, [("b", 16, 16, "resumed")], 1)]
    assert passes(result, "decode") == [(60.0, 70.0, [("a", 1, 32, "new")], 60)]
    b = row(result, "b")
    assert (b["status"], b["finish_ms"], b["num_preemptions"], b["recomputed_tokens"]) == (
        "finished", 70.0, 1, 0)
    assert sender(replay).freed == [(0, 60.0)]


# ------------------------------------------------------------------ pools


def test_pool_overrides_set_each_pools_engine_and_detokenization():
    # prefill: fixed 7 ms prefill passes, detokenize 1 ms; decode: fixed 3 ms
    # decode passes, detokenize 0.25 ms.
    # a: P=32, O=3. prefill [0,7] -> token 1 leaves at 7, reaches the client at 8.
    # Pull of 32 tokens: 2 ms + 0.5 -> lands 9.5; decode [9.5,12.5] and
    # [12.5,15.5] (decode passes: decode_ms only) -> tokens at 12.75 and 15.75.
    data = disagg(num_gpu_blocks=64,
                  prefill={"timing": {"type": "fixed", "prefill_ms": 7, "decode_ms": 100},
                           "detokenize_ms": 1.0},
                  decode={"timing": {"type": "fixed", "prefill_ms": 100, "decode_ms": 3},
                          "detokenize_ms": 0.25, "max_num_seqs": 4})
    replay, result = simulate(data, [dict(id="a", t=0, P=32, O=3)])
    assert [p[:2] for p in passes(result, "prefill")] == [(0.0, 7.0)]
    assert [p[:2] for p in passes(result, "decode")] == [(9.5, 12.5), (12.5, 15.5)]
    a = row(result, "a")
    assert (a["first_token_ms"], a["finish_ms"]) == (8.0, 15.75)
    assert result.records.token_client_ms.tolist() == [8.0, 12.75, 15.75]
    cfg = replay.config
    assert cfg.cluster.decode.scheduler.max_num_seqs == 4
    assert cfg.cluster.prefill.scheduler.max_num_seqs == 16  # from engine


def test_a_prompt_that_cannot_fit_the_decode_pool_is_rejected_at_arrival():
    # Decode pool of 4 blocks (3 usable, 48 tokens): a prompt of 48 tokens plus its
    # first token needs 4 blocks there -> rejected at arrival, never prefilled.
    # A 48-token prompt asking for one token never reaches a decode worker: it runs.
    _, result = simulate(disagg(num_gpu_blocks=64, decode={"num_gpu_blocks": 4}),
                         [dict(id="a", t=0, P=48, O=2), dict(id="b", t=0, P=48, O=1)])
    assert [row(result, r)["status"] for r in "ab"] == ["rejected", "finished"]
    assert [p[2] for p in passes(result, "prefill")] == [[("b", 48, 0, "new")]]


def test_aggregated_outputs_have_no_disaggregated_keys():
    data = disagg(num_gpu_blocks=64)
    data["cluster"] = {"workers": 1}
    cfg = config_from_dict(data, source="test")
    assert config_to_dict(cfg)["cluster"] == {"workers": 1, "data_parallel_size": 1,
                                              "router": "round_robin"}
    result = replay_of(cfg, make_workload([dict(id="a", t=0, P=64, O=3)])).run()
    line = json.loads(next(iter(request_lines(result)))[0])
    assert "decode_worker" not in line and "kv_transfer_ms" not in line
    s = summarize(result, {}, 0.0)
    assert "pools" not in s and "kv_transfer" not in s and "pool" not in s["workers"][0]
    assert "pool" not in result.pass_log[0]


# ------------------------------------------------------------------ validation


def _error(data) -> str:
    with pytest.raises(InputError) as e:
        config_from_dict(data, source="c.yaml")
    return str(e.value)


@pytest.mark.parametrize("change, expected", [
    (lambda d: d["cluster"].pop("kv_transfer"), "cluster.kv_transfer: required key is missing"),
    (lambda d: d["cluster"]["kv_transfer"].update(bandwidth_gbps=0),
     "cluster.kv_transfer.bandwidth_gbps: must be a number > 0, got 0"),
    (lambda d: d["cluster"]["kv_transfer"].update(bytes_per_tokn=1),
     "cluster.kv_transfer.bytes_per_tokn: unknown key (did you mean 'bytes_per_token'?)"),
    (lambda d: d["cluster"].update(prefill={"async_scheduling": True, "launch": {"decode_ms": 1}}),
     "cluster.prefill.launch: is not supported on disaggregated prefill workers"),
    (lambda d: d["engine"].update(async_scheduling=True, launch={"decode_ms": 1}),
     "engine.launch: is not supported on disaggregated prefill workers"),
    (lambda d: d["cluster"].update(decode={"kv_offloading": {
        "num_cpu_blocks": 8, "bytes_per_token": 1, "d2h_gbps": 1, "h2d_gbps": 1}}),
     "cluster.decode.kv_offloading: is not supported on disaggregated decode workers"),
    (lambda d: d["cluster"].update(decode={"num_gpu_blokcs": 8}),
     "cluster.decode.num_gpu_blokcs: unknown key (did you mean 'num_gpu_blocks'?)"),
    (lambda d: d["cluster"].update(decode={"max_num_seqs": 0}),
     "cluster.decode.max_num_seqs: must be an integer >= 1, got 0"),
    (lambda d: d["cluster"].update(prefill={"max_num_batched_tokens": 8}),
     "cluster.prefill.max_num_batched_tokens: must be >= engine.max_num_seqs (16), got 8"),
    (lambda d: d["cluster"].update(decode={"timing": {"type": "fixed", "prefill_ms": 1}}),
     "cluster.decode.timing.decode_ms: required key is missing"),
    (lambda d: d["cluster"].update(prefill={"block_size": 32}),
     "cluster.prefill.block_size: must equal engine.block_size (16), got 32"),
    (lambda d: d["cluster"].update(decode=[1]), "cluster.decode: must be a mapping of engine keys"),
    (lambda d: d["cluster"].update(workers=2),
     "cluster.workers: applies only to cluster.mode: aggregated"),
    (lambda d: d["cluster"].update(mode="split"),
     "cluster.mode: must be one of aggregated, disaggregated, got 'split'"),
    (lambda d: d["cluster"].update(prefill_workers=0),
     "cluster.prefill_workers: must be an integer >= 1, got 0"),
    (lambda d: d["cluster"].update(mode="aggregated"),
     "cluster.prefill_workers: applies only to cluster.mode: disaggregated"),
])
def test_invalid_disaggregated_configs_name_the_key(change, expected):
    data = disagg()
    change(data)
    assert expected in _error(data)


@pytest.mark.parametrize("pool, key, meant", [
    ("decode", "data_parallel_sise", "data_parallel_size"),  # a pool key, not an engine key
    ("prefill", "dataparallel_size", "data_parallel_size"),
    ("decode", "tensor_paralel_size", "tensor_parallel_size"),
    ("prefill", "max_num_seq", "max_num_seqs"),
    ("decode", "pipline_parallel_size", "pipeline_parallel_size"),
])
def test_a_misspelt_pool_key_suggests_the_closest_key_of_the_pool(pool, key, meant):
    # a pool's mapping takes the engine keys and its own data_parallel_size
    data = disagg()
    data["cluster"][pool] = {key: 2}
    assert f"cluster.{pool}.{key}: unknown key (did you mean {meant!r}?)" in _error(data)


def test_errors_in_a_yaml_file_name_the_line_and_the_pool_key(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "workload: {synthetic: {requests: 1}}\n"
        "engine: {async_scheduling: true}\n"
        "cluster:\n"
        "  mode: disaggregated\n"
        "  kv_transfer: {bytes_per_token: 1, bandwidth_gbps: 1}\n"
        "  decode:\n"
        "    launch: {decode_ms: 1}\n")
    with pytest.raises(InputError) as e:
        load_config(path)
    assert f"{path}:7: cluster.decode.launch: is not supported" in str(e.value)


def test_a_disaggregated_config_round_trips_with_each_pools_differences_from_engine():
    cfg = config_from_dict(disagg(decode={"num_gpu_blocks": 128, "max_num_seqs": 16}),
                           source="test")
    data = config_to_dict(cfg)
    assert list(data["cluster"]) == ["mode", "prefill_workers", "decode_workers",
                                     "data_parallel_size", "router", "prefill", "decode",
                                     "kv_transfer"]
    # only what differs from engine (max_num_seqs: 16 is engine's too)
    assert data["cluster"]["prefill"] == {} and data["cluster"]["decode"] == {"num_gpu_blocks": 128}
    assert data["cluster"]["kv_transfer"] == LINK
    assert config_from_dict(data, source="test") == cfg
    # so an engine override given to a resolved config reaches both pools
    again = api_resolve(cfg, ["engine.max_num_batched_tokens=4096"])
    assert again.cluster.prefill.scheduler.max_num_batched_tokens == 4096
    assert again.cluster.decode.scheduler.max_num_batched_tokens == 4096
    assert again.cluster.decode.kv_cache.num_gpu_blocks == 128


def test_the_disaggregated_example_runs(tmp_path):
    path = tmp_path / "disaggregated.yaml"
    path.write_text(example_text("disaggregated"))
    report = api_run(path, limit=40)
    s = report.summary
    assert s["finished"] == 40 and set(s["pools"]) == {"prefill", "decode"}
    # every request asking for more than one token is handed off
    assert s["kv_transfer"]["handoffs"] == int((report.records.output_length > 1).sum()) == 39
    report.write(tmp_path / "out")
    line = json.loads((tmp_path / "out" / "requests.jsonl").read_text().splitlines()[0])
    assert {"prefill_worker", "decode_worker", "kv_transfer_ms", "transferred_tokens"} <= set(line)


# ------------------------------------------------------------------ per-pool DP width


def test_each_pool_routes_over_its_own_data_parallel_ranks():
    # Prefill workers of 2 DP ranks, decode workers of 4, round robin: a, b
    # (t=0) and c, d (t=100) go to prefill ranks 0, 1, 0, 1 and, at their
    # handoffs, to decode ranks 0, 1, 2, 3. a and b share the lockstep prefill
    # pass [0,10] and are handed off at 10 in rank order; each prefill rank
    # has its own link, so both pulls of 32 tokens are on the wire [10,12].
    data = disagg(num_gpu_blocks=64, prefill={"data_parallel_size": 2},
                  decode={"data_parallel_size": 4})
    replay, result = simulate(data, [dict(id=r, t=100 * (k // 2), P=32, O=3)
                                     for k, r in enumerate("abcd")])
    assert [len(core.ranks) for core in replay.prefill_workers + replay.decode_workers] == [2, 4]
    rows = [row(result, r) for r in "abcd"]
    assert [r["prefill_dp_rank"] for r in rows] == [0, 1, 0, 1]
    assert [r["dp_rank"] for r in rows] == [0, 1, 2, 3]
    assert all(r["status"] == "finished" and r["output_tokens"] == 3 for r in rows)
    assert [(replay.transfer(i).start_ms, replay.transfer(i).finish_ms) for i in range(4)] == [
        (10.0, 12.0), (10.0, 12.0), (110.0, 112.0), (110.0, 112.0)]
    s = summarize(result, config_to_dict(replay.config), 0.0)
    assert [s["pools"][p]["data_parallel_size"] for p in ("prefill", "decode")] == [2, 4]
    assert [p.ranks for p in pool_sizes(replay.config)] == [2, 4]


def test_a_pools_data_parallel_size_defaults_to_the_clusters_and_round_trips():
    cfg = config_from_dict(disagg(data_parallel_size=2, decode={"data_parallel_size": 3}),
                           source="test")
    c = cfg.cluster
    assert (c.pool_data_parallel_size("prefill"), c.pool_data_parallel_size("decode")) == (2, 3)
    assert c.data_parallel_widths() == [("cluster.data_parallel_size", 2),
                                        ("cluster.decode.data_parallel_size", 3)]
    data = config_to_dict(cfg)
    assert data["cluster"]["prefill"] == {} and data["cluster"]["decode"] == {"data_parallel_size": 3}
    assert config_from_dict(data, source="test") == cfg
    # the cluster's width still reaches a pool without its own
    again = api_resolve(cfg, ["cluster.data_parallel_size=4"])
    assert again.cluster.pool_data_parallel_size("prefill") == 4
    assert again.cluster.pool_data_parallel_size("decode") == 3
    # an aggregated summary, or pools of the cluster's width, report no pool width
    s = summarize(simulate(disagg(num_gpu_blocks=64), [dict(id="a", t=0, P=32, O=2)])[1], {}, 0.0)
    assert all("data_parallel_size" not in p for p in s["pools"].values())


@pytest.mark.parametrize("pool, value, expected", [
    ("decode", 0, "cluster.decode.data_parallel_size: must be an integer >= 1, got 0"),
    ("prefill", "two", "cluster.prefill.data_parallel_size: must be an integer >= 1, got 'two'"),
    ("prefill", 1.5, "cluster.prefill.data_parallel_size: must be an integer >= 1, got 1.5"),
])
def test_an_invalid_pool_data_parallel_size_names_the_key(pool, value, expected):
    assert expected in _error(disagg(**{pool: {"data_parallel_size": value}}))


def test_a_pinned_dp_rank_must_exist_in_both_pools():
    data = disagg(num_gpu_blocks=64, prefill={"data_parallel_size": 2},
                  decode={"data_parallel_size": 4})
    cfg = config_from_dict(data, source="test")
    workload = make_workload([dict(id="a", t=0, P=32, O=2)])
    workload.dp_rank[:] = 3
    with pytest.raises(InputError, match=r"dp_rank 3 is out of range "
                                         r"\(cluster.prefill.data_parallel_size is 2\)"):
        check_run(cfg, workload)
    workload.dp_rank[:] = 1  # pinned to rank 1 in both pools
    result = replay_of(cfg, workload).run()
    assert (row(result, "a")["prefill_dp_rank"], row(result, "a")["dp_rank"]) == (1, 1)


def test_the_cli_runs_dp_2_prefill_and_dp_4_decode_end_to_end(tmp_path):
    from click.testing import CliRunner

    from servesim.cli.main import main

    path = tmp_path / "d.yaml"
    path.write_text(example_text("disaggregated"))
    out = tmp_path / "out"
    args = ["run", str(path), "--limit", "60", "-o", str(out), "-q", "--pass-log",
            "--set", "cluster.prefill.data_parallel_size=2",
            "--set", "cluster.decode.data_parallel_size=4"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["finished"] == 60
    assert summary["config"]["cluster"]["decode"]["data_parallel_size"] == 4
    assert [summary["pools"][p]["data_parallel_size"] for p in ("prefill", "decode")] == [2, 4]
    lines = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert {r["prefill_dp_rank"] for r in lines} == {0, 1}
    assert {r["dp_rank"] for r in lines if r["dp_rank"] is not None} == {0, 1, 2, 3}
    passes_ = [json.loads(line) for line in (out / "passes.jsonl").read_text().splitlines()]
    assert {(p["pool"], p["dp_rank"]) for p in passes_} == {
        ("prefill", 0), ("prefill", 1), ("decode", 0), ("decode", 1), ("decode", 2), ("decode", 3)}
    bad = CliRunner().invoke(main, ["run", str(path), "--limit", "5", "-o", str(tmp_path / "x"),
                                    "-q", "--set", "cluster.decode.data_parallel_size=0"])
    assert bad.exit_code == 2
    assert "cluster.decode.data_parallel_size: must be an integer >= 1, got 0" in bad.output


def test_the_report_names_each_pools_dp_width_when_they_differ():
    from servesim.results.report import _workload_text

    data = config_to_dict(config_from_dict(disagg(decode={"data_parallel_size": 4}),
                                           source="test"))
    assert "1 prefill worker(s) × 1 DP rank(s) + 1 decode worker(s) × 4" in _workload_text(data)
    same = config_to_dict(config_from_dict(disagg(data_parallel_size=2), source="test"))
    assert "1 prefill + 1 decode worker(s) × 2 DP rank(s)" in _workload_text(same)


def test_the_frontend_delays_each_arrival_at_the_prefill_pool():
    # engine.frontend request_ms 2, tokenize_us_per_token 250 (as in
    # test_engine_rules): a, sent at 0 with P=32, reaches the prefill worker at
    # 10; b, sent at 1 with P=16, at 7, first. Prefill pass [7,17]: b 16; a
    # arrived during it: [17,27]: a 32. The records keep the send times.
    data = disagg(frontend={"request_ms": 2, "tokenize_us_per_token": 250})
    _, result = simulate(data, [dict(id="a", t=0, P=32, O=2), dict(id="b", t=1, P=16, O=2)])
    assert [(p[0], p[1], [e[0] for e in p[2]]) for p in passes(result, "prefill")] == [
        (7, 17, ["b"]), (17, 27, ["a"])]
    assert result.records.arrival_ms.tolist() == [0, 1]
