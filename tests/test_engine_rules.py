"""One test per engine rule of docs/engine.md (§3-7, §10): each builds the
smallest timeline that shows its rule and asserts instants, scheduled tokens and
block counts worked out by hand in its comment.

Conventions of the hand computations: block_size 16; "free" is
`free_blocks_after_schedule` (usable blocks = num_gpu_blocks - 1, block 0 is the
null block); timing is linear 10 ms per pass unless a test says otherwise, so
pass k of a busy sync engine runs [10k, 10k + 10]. Block ids in the comments
are pool ids (the free queue starts as 1..N-1). `tok` = tokens scheduled,
`ph` = output placeholders (async).
"""

import pytest

from helpers import (free_blocks, make_config, make_workload, req, run, run_result, sched,
                     times, tokens)

ASYNC = {"async_scheduling": True}


# ---------------------------------------------------------------- §3 passes


def test_chunked_prefill_splits_prompt_and_only_the_completing_pass_samples():
    # budget 64, 32 usable blocks; a: P=150, O=2, alone.
    # pass 0 [0,10]:  a 64 (computed 64 < 150: partial, no token); 4 blocks, free 28
    # pass 1 [10,20]: a 64 (128, partial);                         8 blocks, free 24
    # pass 2 [20,30]: a 22 (150 = P: samples token 1 at 30);      10 blocks, free 22
    # pass 3 [30,40]: a 1  (151 -> ceil(151/16) = 10 blocks);        free 22; token 2, done
    cfg = make_config(num_gpu_blocks=33, max_num_batched_tokens=64)
    records, log = run(cfg, make_workload([dict(id="a", t=0, P=150, O=2)]))
    assert [sched(p) for p in log] == [
        [("a", 64, 0, "new")], [("a", 64, 0, "running")],
        [("a", 22, 0, "running")], [("a", 1, 0, "running")]]
    assert times(log) == [(0, 10), (10, 20), (20, 30), (30, 40)]
    assert free_blocks(log) == [28, 24, 22, 22]
    a = req(records, "a")
    assert (a["first_token_ms"], a["first_token_pass"]) == (30, 2)
    assert (a["finish_ms"], a["finish_pass"], a["output_tokens"]) == (40, 3, 2)


def test_running_requests_are_served_before_admissions_and_share_the_budget():
    # budget 64, 32 usable blocks. a: t=0 P=100 O=3; b: t=5 P=40 O=2.
    # pass 0 [0,10]:  a new 64 (partial); 4 blocks, free 28
    # pass 1 [10,20]: running first: a 36 (completes 100 -> token 1 at 20, 7 blocks);
    #                 then b admitted with the 28 left (partial, 2 blocks); free 23
    # pass 2 [20,30]: a 1 (101, 7 blocks), b 12 (completes 40 -> token 1 at 30,
    #                 3 blocks); free 22
    # pass 3 [30,40]: a 1 (102: token 3, done), b 1 (41: token 2, done); free 22
    cfg = make_config(num_gpu_blocks=33, max_num_batched_tokens=64)
    records, log = run(cfg, make_workload([dict(id="a", t=0, P=100, O=3),
                                           dict(id="b", t=5, P=40, O=2)]))
    assert [sched(p) for p in log] == [
        [("a", 64, 0, "new")],
        [("a", 36, 0, "running"), ("b", 28, 0, "new")],
        [("a", 1, 0, "running"), ("b", 12, 0, "running")],
        [("a", 1, 0, "running"), ("b", 1, 0, "running")]]
    assert times(log) == [(0, 10), (10, 20), (20, 30), (30, 40)]
    assert free_blocks(log) == [28, 23, 22, 22]
    a, b = req(records, "a"), req(records, "b")
    assert (a["first_token_ms"], a["finish_ms"]) == (20, 40)
    assert (b["first_token_ms"], b["first_token_pass"], b["finish_ms"]) == (30, 2, 40)


def test_long_prefill_threshold_applies_only_while_more_than_one_request_is_present():
    # threshold 48, budget 8192. a: t=0 P=80 O=2; b: t=5 P=80 O=1.
    # pass 0 [0,10]:  only a present -> no cap: a 80 (token 1); 5 blocks, free 27
    # pass 1 [10,20]: a running + b waiting -> cap 48... applied per request:
    #                 a 1 (below the cap; 81 -> 6 blocks), b 48 (3 blocks); free 23
    #                 a gets token 2 and finishes at 20 (frees its 6 blocks)
    # pass 2 [20,30]: b alone -> no cap: b 32 (80: token 1, done); 5 blocks, free 27
    cfg = make_config(num_gpu_blocks=33, long_prefill_token_threshold=48)
    records, log = run(cfg, make_workload([dict(id="a", t=0, P=80, O=2),
                                           dict(id="b", t=5, P=80, O=1)]))
    assert tokens(log) == [{"a": 80}, {"a": 1, "b": 48}, {"b": 32}]
    assert free_blocks(log) == [27, 23, 27]
    assert req(records, "b")["finish_ms"] == 30


def test_waiting_head_that_does_not_fit_blocks_smaller_requests_behind_it():
    # 16 usable blocks. a: t=0 P=128 O=2 (8 blocks); b: t=1 P=144 O=1 (9 blocks);
    # c: t=2 P=16 O=1 (1 block).
    # pass 0 [0,10]:  a 128; free 8
    # pass 1 [10,20]: a 1 (computed 128 % 16 == 0 -> 9th block); free 7.
    #                 head b needs 9 > 7: admission stops; c (1 block) is not tried.
    #                 a finishes at 20, frees 9 -> 16 free
    # pass 2 [20,30]: b 144 (free 7), then c 16 (free 6); both finish at 30
    cfg = make_config(num_gpu_blocks=17)
    records, log = run(cfg, make_workload([dict(id="a", t=0, P=128, O=2),
                                           dict(id="b", t=1, P=144, O=1),
                                           dict(id="c", t=2, P=16, O=1)]))
    assert [sched(p) for p in log] == [
        [("a", 128, 0, "new")], [("a", 1, 0, "running")],
        [("b", 144, 0, "new"), ("c", 16, 0, "new")]]
    assert free_blocks(log) == [8, 7, 6]
    assert req(records, "c")["first_token_ms"] == 30


def test_without_chunked_prefill_a_prompt_larger_than_the_remaining_budget_stops_admission():
    # chunked prefill off, budget 100, 64 usable blocks.
    # a: t=0 P=60 O=2; b: t=1 P=100 O=1; c: t=2 P=30 O=1.
    # pass 0 [0,10]:  a 60 (4 blocks); free 60
    # pass 1 [10,20]: a 1 -> budget 99; head b needs 100 > 99: stop (no chunk), and
    #                 c (30 <= 99) is not tried; free 60. a finishes at 20.
    # pass 2 [20,30]: b 100 whole (7 blocks), budget 0 -> c waits; free 57
    # pass 3 [30,40]: c 30 (2 blocks); free 62
    cfg = make_config(num_gpu_blocks=65, max_num_batched_tokens=100,
                      enable_chunked_prefill=False)
    records, log = run(cfg, make_workload([dict(id="a", t=0, P=60, O=2),
                                           dict(id="b", t=1, P=100, O=1),
                                           dict(id="c", t=2, P=30, O=1)]))
    assert tokens(log) == [{"a": 60}, {"a": 1}, {"b": 100}, {"c": 30}]
    assert times(log) == [(0, 10), (10, 20), (20, 30), (30, 40)]
    assert free_blocks(log) == [60, 60, 57, 62]
    assert req(records, "c")["finish_ms"] == 40


def _reserve_workload():
    return make_workload([dict(id="a", t=0, P=32, O=3), dict(id="b", t=1, P=128, O=1)])


def test_reserve_full_isl_admits_only_when_the_whole_sequence_fits():
    # reserve_full_isl on, budget 32, 8 usable blocks. a: t=0 P=32 O=3; b: t=1 P=128 O=1.
    # pass 0 [0,10]:  a 32 (2 blocks); free 6
    # pass 1 [10,20]: a 1 (computed 32 -> 3rd block); free 5. b: whole 128 tokens
    #                 = 8 blocks > 5 -> not admitted (its first 31-token chunk would fit)
    # pass 2 [20,30]: a 1; free 5; a finishes at 30 (frees 3 -> 8 free)
    # pass 3 [30,40]: b admitted (8 <= 8), takes only its first chunk: 32 tokens,
    #                 2 blocks; free 6
    # passes 4-6:     b 32 each -> 4, 6, 8 blocks; free 4, 2, 0; token at 70
    cfg = make_config(num_gpu_blocks=9, max_num_batched_tokens=32, reserve_full_isl=True)
    records, log = run(cfg, _reserve_workload())
    assert tokens(log) == [{"a": 32}, {"a": 1}, {"a": 1},
                           {"b": 32}, {"b": 32}, {"b": 32}, {"b": 32}]
    assert sched(log[3]) == [("b", 32, 0, "new")]
    assert free_blocks(log) == [6, 5, 5, 6, 4, 2, 0]
    assert req(records, "b")["finish_ms"] == 70


def test_without_reserve_full_isl_a_request_is_admitted_chunk_by_chunk():
    # Same trace, reserve_full_isl off.
    # pass 0 [0,10]:  a 32; free 6
    # pass 1 [10,20]: a 1 (3 blocks, free 5); b admitted for its first chunk:
    #                 31 tokens = 2 blocks; free 3
    # pass 2 [20,30]: a 1; b 31 (62 -> 4 blocks); free 1. a finishes at 30 (+3)
    # pass 3 [30,40]: b 32 (94 -> 6 blocks); free 2
    # pass 4 [40,50]: b 32 (126 -> 8 blocks); free 0
    # pass 5 [50,60]: b 2 (128: token 1, done); free 0
    cfg = make_config(num_gpu_blocks=9, max_num_batched_tokens=32, reserve_full_isl=False)
    records, log = run(cfg, _reserve_workload())
    assert tokens(log) == [{"a": 32}, {"a": 1, "b": 31}, {"a": 1, "b": 31},
                           {"b": 32}, {"b": 32}, {"b": 2}]
    assert sched(log[1])[1] == ("b", 31, 0, "new")
    assert free_blocks(log) == [6, 3, 1, 2, 0, 0]
    assert req(records, "b")["finish_ms"] == 60


def test_reserve_full_isl_does_not_count_hit_blocks_held_by_a_running_request():
    # reserve_full_isl on, budget 64, 8 usable blocks.
    # a: t=0 P=60 hash [1,2,3,4] O=3; b: t=1 P=112 hash [1,2,3,10,11,12,13] O=1.
    # pass 0 [0,10]:  a 60: 4 blocks, full blocks 1-3 cached; free 4
    # pass 1 [10,20]: a 1 (61, 4 blocks), budget 63. b hits 48 (3 blocks a holds,
    #                 ref_cnt 1: no free capacity needed). Whole sequence 7 blocks
    #                 - 3 hit = 4 <= 4 free -> admitted; b 63 (111 -> 7 blocks,
    #                 4 new); free 0
    # pass 2 [20,30]: a 1, b 1 (112: token 1); free 0; both finish at 30
    cfg = make_config(num_gpu_blocks=9, max_num_batched_tokens=64, reserve_full_isl=True)
    records, log = run(cfg, make_workload([
        dict(id="a", t=0, P=60, O=3, hash_ids=[1, 2, 3, 4]),
        dict(id="b", t=1, P=112, O=1, hash_ids=[1, 2, 3, 10, 11, 12, 13])]))
    assert [sched(p) for p in log] == [
        [("a", 60, 0, "new")],
        [("a", 1, 0, "running"), ("b", 63, 48, "new")],
        [("a", 1, 0, "running"), ("b", 1, 0, "running")]]
    assert free_blocks(log) == [4, 0, 0]
    assert req(records, "b")["finish_ms"] == 30


def test_watermark_applies_only_while_running_is_non_empty_counting_same_pass_admissions():
    # 19 usable blocks, watermark 0.1 -> int(0.1 * 20) = 2 blocks.
    # a: t=0 P=288 O=1 (18 blocks); b: t=0 P=16 O=1 (1 block).
    # pass 0 [0,10]:  running empty: a needs 18 (+0) <= 19 -> admitted (18 + 2 = 20
    #                 would not fit); free 1. Now running = [a]: b needs 1 + 2 = 3 > 1
    #                 (it would fit without the watermark) -> waits. a done at 10.
    # pass 1 [10,20]: running empty: b 16; free 18
    cfg = make_config(num_gpu_blocks=20, watermark=0.1)
    records, log = run(cfg, make_workload([dict(id="a", t=0, P=288, O=1),
                                           dict(id="b", t=0, P=16, O=1)]))
    assert [sched(p) for p in log] == [[("a", 288, 0, "new")], [("b", 16, 0, "new")]]
    assert free_blocks(log) == [1, 18]
    assert req(records, "b")["first_token_ms"] == 20


# ------------------------------------------------------------ max_model_len


def test_max_model_len_caps_the_output_and_the_request_finishes():
    # max_model_len 64. a: P=60 O=10 -> max_tokens = min(10, 64 - 60) = 4.
    # pass 0 [0,10]: a 60 (token 1); passes 1-3: a 1 each (computed 61, 62, 63;
    # n <= 64 - computed - 1 holds); token 4 at 40 makes 64 tokens: finished.
    # 4 blocks throughout; 32 usable -> free 28.
    cfg = make_config(num_gpu_blocks=33, max_model_len=64)
    records, log = run(cfg, make_workload([dict(id="a", t=0, P=60, O=10)]))
    assert tokens(log) == [{"a": 60}, {"a": 1}, {"a": 1}, {"a": 1}]
    assert free_blocks(log) == [28, 28, 28, 28]
    assert log[3]["finished"] == ["a"]
    a = req(records, "a")
    assert (a["status"], a["output_tokens"], a["finish_ms"], a["finish_pass"]) == (
        "finished", 4, 40, 3)


def test_prompt_reaching_max_model_len_is_rejected_with_null_times():
    # max_model_len 64. long: P=64 >= 64 -> rejected at arrival (it would fit in
    # 4 blocks). ok: P=63 O=5 -> max_tokens = 1: pass 0 [0,10], done at 10.
    cfg = make_config(num_gpu_blocks=33, max_model_len=64)
    records, log = run(cfg, make_workload([dict(id="long", t=0, P=64, O=5),
                                           dict(id="ok", t=0, P=63, O=5)]))
    assert [sched(p) for p in log] == [[("ok", 63, 0, "new")]]
    long = req(records, "long")
    assert long["status"] == "rejected"
    assert (long["first_token_ms"], long["finish_ms"]) == (None, None)
    assert (long["first_token_pass"], long["finish_pass"], long["output_tokens"]) == (-1, -1, 0)
    assert records.arrival_ms[records.ids.index("long")] == 0
    assert (req(records, "ok")["status"], req(records, "ok")["output_tokens"]) == ("finished", 1)


def test_prompt_needing_more_blocks_than_usable_is_rejected():
    # 4 usable blocks (num_gpu_blocks 5). big: P=65 -> 5 blocks > 4: rejected.
    # fits: P=64 -> exactly 4 blocks: pass 0 [0,10], free 0.
    cfg = make_config(num_gpu_blocks=5)
    records, log = run(cfg, make_workload([dict(id="big", t=0, P=65, O=1),
                                           dict(id="fits", t=0, P=64, O=1)]))
    assert [sched(p) for p in log] == [[("fits", 64, 0, "new")]]
    assert free_blocks(log) == [0]
    big = req(records, "big")
    assert (big["status"], big["first_token_ms"], big["finish_ms"]) == ("rejected", None, None)
    assert req(records, "fits")["finish_ms"] == 10


def test_request_outgrowing_the_pool_alone_is_unfinished_and_the_run_terminates():
    # 4 usable blocks = 64 tokens. a: t=0 P=32 O=100 (admission checks only its
    # current 32 tokens, not P + O). b: t=400 P=16 O=1.
    # pass 0 [0,10]: a 32 (2 blocks, free 2), token 1.
    # pass k (1..32) [10k, 10k+10]: a 1, computed 31+k -> 32+k: 3 blocks for k <= 16
    #   (free 1), 4 blocks for k = 17..32 (free 0); token k+1 at 10k+10.
    # decision at 330: computed 64 needs a 5th block; a is alone, preempts itself
    #   -> taken out as unfinished with 33 tokens; no pass 33 for it.
    # b arrives at 400 to an idle engine: pass 33 [400, 410].
    cfg = make_config(num_gpu_blocks=5)
    with pytest.warns(UserWarning, match="could never finish"):
        result = run_result(cfg, make_workload([dict(id="a", t=0, P=32, O=100),
                                                dict(id="b", t=400, P=16, O=1)]))
    log = result.pass_log
    assert len(log) == 34
    assert times(log)[:2] == [(0, 10), (10, 20)]
    assert times(log)[32:] == [(320, 330), (400, 410)]
    assert free_blocks(log)[:33] == [2] + [1] * 16 + [0] * 16
    assert sched(log[33]) == [("b", 16, 0, "new")]
    a = req(result.records, "a")
    assert (a["status"], a["output_tokens"], a["num_preemptions"]) == ("unfinished", 33, 1)
    assert req(result.records, "b")["status"] == "finished"
    assert result.stats.preemptions == 1


# ---------------------------------------------------------------- §4 blocks


def test_null_block_is_never_allocated_so_usable_blocks_are_num_gpu_blocks_minus_one():
    # num_gpu_blocks 10 -> 9 usable. a: P=144 = 9 full blocks: fits exactly, free 0,
    # KV usage 1 - 0/9 = 1. b: P=145 needs 10 blocks -> rejected.
    cfg = make_config(num_gpu_blocks=10)
    result = run_result(cfg, make_workload([dict(id="a", t=0, P=144, O=1),
                                            dict(id="b", t=0, P=145, O=1)]))
    assert free_blocks(result.pass_log) == [0]
    assert req(result.records, "b")["status"] == "rejected"
    assert result.stats.kv_usage_max == 1.0


def test_decode_needs_a_new_block_exactly_when_computed_is_a_multiple_of_block_size():
    # 32 usable. a: P=15 O=3.
    # pass 0: a 15 -> 1 block, free 31
    # pass 1: computed 15 -> 16: still 1 block (15 % 16 != 0), free 31
    # pass 2: computed 16 -> 17: 16 % 16 == 0 -> 2nd block, free 30
    cfg = make_config(num_gpu_blocks=33)
    _, log = run(cfg, make_workload([dict(id="a", t=0, P=15, O=3)]))
    assert tokens(log) == [{"a": 15}, {"a": 1}, {"a": 1}]
    assert free_blocks(log) == [31, 31, 30]


def test_hit_blocks_with_ref_cnt_zero_use_free_capacity():
    # 8 usable blocks. c: t=0 P=20 O=3 (2 blocks); a: t=0 P=64 hash [1,2,3,4] O=1;
    # b: t=5 P=112 hash [1..7] O=1.
    # pass 0 [0,10]:  c 20 (blocks 1,2), a 64 (blocks 3-6, cached); free 2.
    #                 a finishes at 10: its 4 cached blocks go back with ref_cnt 0 -> free 6
    # pass 1 [10,20]: c 1. b hits 64 (4 blocks, all ref_cnt 0) and needs 7 - 4 = 3 new
    #                 blocks, but touching the 4 hits takes them out of the free queue:
    #                 3 + 4 = 7 > 6 -> not admitted; free 6
    # pass 2 [20,30]: same; c finishes at 30 (frees 2 -> 8)
    # pass 3 [30,40]: b: 7 <= 8 -> admitted, cached 64, 48 tokens; free 8 - 7 = 1
    cfg = make_config(num_gpu_blocks=9)
    records, log = run(cfg, make_workload([
        dict(id="c", t=0, P=20, O=3),
        dict(id="a", t=0, P=64, O=1, hash_ids=[1, 2, 3, 4]),
        dict(id="b", t=5, P=112, O=1, hash_ids=[1, 2, 3, 4, 5, 6, 7])]))
    assert [sched(p) for p in log] == [
        [("c", 20, 0, "new"), ("a", 64, 0, "new")],
        [("c", 1, 0, "running")], [("c", 1, 0, "running")],
        [("b", 48, 64, "new")]]
    assert free_blocks(log) == [2, 6, 6, 1]
    assert req(records, "b")["finish_ms"] == 40


def test_free_queue_reuses_uncached_blocks_first_and_evicts_cached_chains_tail_first():
    # 6 usable blocks (ids 1-6), one request at a time, each O=1.
    # a t=0  P=64 hash [1,2,3,4]: blocks 1,2,3,4 (all cached). Freed tail first to
    #        the back: queue [5,6 | 4,3,2,1].                       free 2 at schedule
    # b t=20 P=20 (own ids): pops 5,6; 5 cached, 6 a partial (uncached) block.
    #        Freed: 6 -> front, 5 -> back: queue [6,4,3,2,1,5].      free 4
    # c t=40 P=40 (own ids): pops 6 (the uncached block first), then 4 and 3: a's
    #        chain loses its tail (ids 4, 3); its prefix 1, 2 survives.   free 3
    # d t=60 P=64 hash [1,2,3,4]: hits blocks 1,2 = 32 tokens, computes 32 more.
    #        (Uncached-last reuse would leave a hit of 16; head-first eviction 0.)
    #        touches 1,2 and pops 2 new: free 6 - 4 = 2
    # The engine idles between requests: passes [0,10], [20,30], [40,50], [60,70].
    cfg = make_config(num_gpu_blocks=7)
    records, log = run(cfg, make_workload([
        dict(id="a", t=0, P=64, O=1, hash_ids=[1, 2, 3, 4]),
        dict(id="b", t=20, P=20, O=1),
        dict(id="c", t=40, P=40, O=1),
        dict(id="d", t=60, P=64, O=1, hash_ids=[1, 2, 3, 4])]))
    assert sched(log[3]) == [("d", 32, 32, "new")]
    assert times(log) == [(0, 10), (20, 30), (40, 50), (60, 70)]
    assert free_blocks(log) == [2, 4, 3, 2]
    assert req(records, "d")["first_admission_cached_tokens"] == 32


# ---------------------------------------------------------- §5 prefix cache


def test_request_admitted_later_in_the_same_pass_hits_blocks_of_an_earlier_chunk():
    # threshold 48, 32 usable. a: t=0 P=64 hash [1,2,3,4] O=1;
    # b: t=0 P=80 hash [1,2,3,4,5] O=1.
    # pass 0 [0,10]: 2 requests present -> cap 48. a 48 (partial): its 3 full blocks
    #                (ids 1,2,3) are registered when scheduled. b then hits 48 (block 4
    #                of a is not full yet), computes 32 <= 48 -> samples, done at 10.
    #                Blocks: a 3 + b (3 shared + 2 new) = 5 used; free 27
    # pass 1 [10,20]: a alone -> no cap: a 16 (64: token 1); a takes a 4th block,
    #                b's 2 own blocks are free again -> 32 - 4 = 28
    cfg = make_config(num_gpu_blocks=33, long_prefill_token_threshold=48)
    records, log = run(cfg, make_workload([
        dict(id="a", t=0, P=64, O=1, hash_ids=[1, 2, 3, 4]),
        dict(id="b", t=0, P=80, O=1, hash_ids=[1, 2, 3, 4, 5])]))
    assert [sched(p) for p in log] == [
        [("a", 48, 0, "new"), ("b", 32, 48, "new")], [("a", 16, 0, "running")]]
    assert free_blocks(log) == [27, 28]
    assert req(records, "b")["finish_ms"] == 10
    assert req(records, "a")["finish_ms"] == 20


def test_prefix_lookup_never_covers_the_last_token():
    # a t=0 P=32 hash [1,2] O=1 caches 2 blocks.
    # b t=20 identical P=32: hit = 16 * min(2, floor(31/16) = 1) = 16, computes 16.
    # c t=40 P=33 hash [1,2,3]: hit = 16 * min(2, floor(32/16) = 2) = 32, computes 1.
    cfg = make_config(num_gpu_blocks=33)
    records, log = run(cfg, make_workload([
        dict(id="a", t=0, P=32, O=1, hash_ids=[1, 2]),
        dict(id="b", t=20, P=32, O=1, hash_ids=[1, 2]),
        dict(id="c", t=40, P=33, O=1, hash_ids=[1, 2, 3])]))
    assert [sched(p) for p in log] == [
        [("a", 32, 0, "new")], [("b", 16, 16, "new")], [("c", 1, 32, "new")]]
    assert times(log) == [(0, 10), (20, 30), (40, 50)]
    assert [req(records, r)["first_admission_cached_tokens"] for r in "abc"] == [0, 16, 32]


# ---------------------------------------------------------- §6 sync engine


def _k_plus_2_workload():
    # a finishes in pass 0 and holds 4 of 7 usable blocks; c keeps the engine busy;
    # b needs a's blocks.
    return make_workload([dict(id="a", t=0, P=64, O=1), dict(id="c", t=0, P=17, O=3),
                          dict(id="b", t=0, P=64, O=1)])


def test_sync_finished_request_blocks_serve_the_next_pass():
    # 7 usable. pass 0 [0,10]: a 64 (4 blocks), c 17 (2 blocks); free 1; b (4) waits.
    # a finishes at 10 and is freed at once -> 5 free.
    # pass 1 [10,20]: c 1 (18, 2 blocks), b 64 (4 blocks); free 1. b done at 20.
    # pass 2 [20,30]: c 1; free 7 - 2 = 5; c done at 30.
    cfg = make_config(num_gpu_blocks=8)
    records, log = run(cfg, _k_plus_2_workload())
    assert [sched(p) for p in log] == [
        [("a", 64, 0, "new"), ("c", 17, 0, "new")],
        [("c", 1, 0, "running"), ("b", 64, 0, "new")],
        [("c", 1, 0, "running")]]
    assert free_blocks(log) == [1, 1, 5]
    assert req(records, "b")["first_token_ms"] == 20


def test_fcfs_preemption_takes_the_last_running_request_which_resumes_from_the_front():
    # 4 usable blocks (ids 1-4). a: t=0 P=32 O=3; b: t=0 P=32 O=3; c: t=5 P=16 O=1.
    # pass 0 [0,10]:  a 32 (blocks 1,2), b 32 (blocks 3,4), all cached; free 0
    # pass 1 [10,20]: c joins waiting. a needs a 3rd block (computed 32): none free ->
    #                 preempt the last running request, b: its blocks go back tail
    #                 first (queue [4,3]) and b goes to the FRONT of waiting [b, c].
    #                 a pops block 4 (evicting b's 2nd block); free 1. No admission in
    #                 a pass that preempted.
    # pass 2 [20,30]: a 1 (34, 3 blocks); head b (33 tokens: 32 + 1 generated) hits
    #                 16 (block 3) and needs 3 - 1 + 1 (hit with ref_cnt 0) = 3 > 1;
    #                 c (1 block) would fit but is behind b. free 1. a done at 30,
    #                 frees 3 -> 4 free.
    # pass 3 [30,40]: b resumed: cached 16, recomputes 17 (tokens 16..32) -> token 2;
    #                 3 blocks, free 1; then c 16 (1 block), free 0. c done at 40.
    # pass 4 [40,50]: b 1 (34, 3 blocks) -> token 3, done at 50; free 1.
    # b: recomputed = 16 tokens (16..31 were computed before; token 32 never was).
    cfg = make_config(num_gpu_blocks=5)
    result = run_result(cfg, make_workload([dict(id="a", t=0, P=32, O=3),
                                            dict(id="b", t=0, P=32, O=3),
                                            dict(id="c", t=5, P=16, O=1)]))
    log = result.pass_log
    assert [sched(p) for p in log] == [
        [("a", 32, 0, "new"), ("b", 32, 0, "new")],
        [("a", 1, 0, "running")],
        [("a", 1, 0, "running")],
        [("b", 17, 16, "resumed"), ("c", 16, 0, "new")],
        [("b", 1, 0, "running")]]
    assert [p["preempted"] for p in log] == [[], ["b"], [], [], []]
    assert times(log) == [(0, 10), (10, 20), (20, 30), (30, 40), (40, 50)]
    assert free_blocks(log) == [0, 1, 1, 0, 1]
    b = req(result.records, "b")
    assert (b["num_preemptions"], b["recomputed_tokens"], b["output_tokens"]) == (1, 16, 3)
    assert (b["first_token_ms"], b["finish_ms"], b["finish_pass"]) == (10, 50, 4)
    assert b["first_admission_cached_tokens"] == 0
    assert req(result.records, "a")["finish_ms"] == 30
    assert result.stats.preemptions == 1


def _one_token_left_workload():
    # a, b: two 32-token prompts that grow past 2 blocks with 5 usable blocks;
    # c: later, a's prompt again.
    return make_workload([dict(id="a", t=0, P=32, O=3, hash_ids=[1, 2]),
                          dict(id="b", t=0, P=32, O=3, hash_ids=[3, 4]),
                          dict(id="c", t=100, P=32, O=1, hash_ids=[1, 2])])


def test_resumed_request_whose_hit_leaves_one_token_is_priced_as_prefill():
    # fixed timing: prefill 30 ms, decode 5 ms. 5 usable blocks (ids 1-5).
    # pass 0 [0,30]:   a 32 (1,2), b 32 (3,4), prefill; free 1
    # pass 1 [30,35]:  a 1 pops block 5; b needs a 3rd block: none -> b is the last
    #                  running request, preempts itself (blocks 4,3 to the back, both
    #                  still cached); decode only; free 2
    # pass 2 [35,40]:  a 1; b (33 tokens) would hit 32 but needs 3 - 2 + 2 = 3 > 2;
    #                  a done at 40 (frees 3 -> 5)
    # pass 3 [40,70]:  b resumed, cached 32, computes 1 token: computed 32 < 33 (its
    #                  token count at resume) -> a prefill request: 30 ms, not 5;
    #                  free 5 - 3 = 2; token 2 at 70
    # pass 4 [70,75]:  b 1 decode -> token 3, done at 75; free 2
    # pass 5 [100,130]: c hits 16 of a's cached prompt (last-token rule), computes 16
    #                  prefill tokens: 2 blocks (1 hit + 1 new), free 5 - 2 = 3
    cfg = make_config(num_gpu_blocks=6, timing={"type": "fixed", "prefill_ms": 30,
                                                "decode_ms": 5})
    records, log = run(cfg, _one_token_left_workload())
    assert [sched(p) for p in log] == [
        [("a", 32, 0, "new"), ("b", 32, 0, "new")],
        [("a", 1, 0, "running")],
        [("a", 1, 0, "running")],
        [("b", 1, 32, "resumed")],
        [("b", 1, 0, "running")],
        [("c", 16, 16, "new")]]
    assert log[1]["preempted"] == ["b"]
    assert times(log) == [(0, 30), (30, 35), (35, 40), (40, 70), (70, 75), (100, 130)]
    assert free_blocks(log) == [1, 2, 2, 2, 2, 3]
    b = req(records, "b")
    assert (b["num_preemptions"], b["recomputed_tokens"], b["finish_ms"]) == (1, 0, 75)


def test_prefix_cache_stats_count_admissions_with_preempted_ones_apart():
    # Same timeline as the previous test. Admissions of never-preempted requests:
    # a (32 tokens, hit 0), b (32, 0), c (32, hit 16) -> queries 96, hits 16.
    # b's resume (33 tokens, hit 32) -> preempted_queries 33, preempted_hits 32.
    # (b's failed lookup in pass 2 is not an admission and is not counted.)
    cfg = make_config(num_gpu_blocks=6)
    stats = run_result(cfg, _one_token_left_workload()).stats
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (96, 16)
    assert (stats.preempted_prefix_cache_queries, stats.preempted_prefix_cache_hits) == (33, 32)
    assert stats.preemptions == 1


def test_priority_victim_is_the_worst_running_request_and_its_scheduled_tokens_return_to_budget():
    # priority policy, budget 20, reserve_full_isl off, 5 usable blocks (ids 1-5).
    # x: t=0 priority 1 P=16 O=4; y: t=5 priority 0 P=15 O=4; z: t=5 priority 0 P=41 O=1.
    # pass 0 [0,10]:  x 16 (block 1, cached); free 4
    # pass 1 [10,20]: x 1 (17 -> block 2); y before z (same priority and arrival,
    #                 "y" < "z"): y 15 (block 3); z 4 (the budget left; block 4); free 1
    # pass 2 [20,30]: x 1, y 1 (16: block 3 full), z 18 (22 -> block 5); free 0
    # pass 3 [30,40]: x 1 is scheduled first (19, fits in 2 blocks). y needs a 2nd
    #                 block: the victim is the largest (priority, arrival) = x, first
    #                 in running, not the last (z). x leaves the pass, its token goes
    #                 back to the budget (19 -> 20); its blocks 2 (uncached, front)
    #                 and 1 (back) are freed. y 1 pops 2 (budget 19); z gets all 19
    #                 it still needs (41 -> 3 blocks, pops 1): samples, done at 40.
    #                 With x's token kept, z would get 18 and sample nothing.
    # pass 4 [40,50]: z's 3 blocks freed (free 3). y 1; x resumes with its 19 tokens
    #                 (16 + 3 generated), nothing cached (block 1 went to z):
    #                 2 blocks; free 1. x and y get their 4th token at 50.
    # x recomputes 18 tokens (it had computed 18 before: 16 + 2 decodes).
    cfg = make_config(num_gpu_blocks=6, max_num_batched_tokens=20, max_num_seqs=3,
                      scheduling_policy="priority", reserve_full_isl=False)
    records, log = run(cfg, make_workload([
        dict(id="x", t=0, P=16, O=4, priority=1),
        dict(id="y", t=5, P=15, O=4, priority=0),
        dict(id="z", t=5, P=41, O=1, priority=0)]))
    assert [sched(p) for p in log] == [
        [("x", 16, 0, "new")],
        [("x", 1, 0, "running"), ("y", 15, 0, "new"), ("z", 4, 0, "new")],
        [("x", 1, 0, "running"), ("y", 1, 0, "running"), ("z", 18, 0, "running")],
        [("y", 1, 0, "running"), ("z", 19, 0, "running")],
        [("y", 1, 0, "running"), ("x", 19, 0, "resumed")]]
    assert [p["preempted"] for p in log] == [[], [], [], ["x"], []]
    assert log[3]["finished"] == ["z"]
    assert free_blocks(log) == [4, 1, 0, 0, 1]
    x = req(records, "x")
    assert (x["num_preemptions"], x["recomputed_tokens"], x["finish_ms"]) == (1, 18, 50)
    assert (req(records, "z")["finish_ms"], req(records, "y")["finish_ms"]) == (40, 50)


def test_no_admission_in_a_pass_that_preempted():
    # priority policy, 4 usable blocks (ids 1-4).
    # y: t=0 p0 P=31 O=4; x: t=0 p1 P=32 O=4; w: t=5 p0 P=16 O=1.
    # pass 0 [0,10]:  y 31 (blocks 1,2), x 32 (blocks 3,4, cached); free 0
    # pass 1 [10,20]: y 1 (32, fits in 2 blocks). x needs a 3rd block: the worst
    #                 running request is x itself -> preempts itself (blocks 4,3 to the
    #                 back); free 2. w (1 block) would fit, but a pass that preempted
    #                 admits nobody.
    # pass 2 [20,30]: y 1 (computed 32 -> 3rd block, pops 4); w (0,5) before x (1,0):
    #                 w 16 (pops 3), free 0; x (33 tokens, its blocks evicted) waits.
    # pass 3 [30,40]: y 1 (34, 3 blocks), free 1; y done at 40 (frees 3 -> 4)
    # pass 4 [40,50]: x resumed, cached 0, 33 tokens (3 blocks), free 1; token 2 at 50
    # passes 5, 6:    x 1 each, free 1; done at 70. x recomputes 32 tokens.
    cfg = make_config(num_gpu_blocks=5, scheduling_policy="priority")
    records, log = run(cfg, make_workload([
        dict(id="y", t=0, P=31, O=4, priority=0),
        dict(id="x", t=0, P=32, O=4, priority=1),
        dict(id="w", t=5, P=16, O=1, priority=0)]))
    assert [sched(p) for p in log] == [
        [("y", 31, 0, "new"), ("x", 32, 0, "new")],
        [("y", 1, 0, "running")],
        [("y", 1, 0, "running"), ("w", 16, 0, "new")],
        [("y", 1, 0, "running")],
        [("x", 33, 0, "resumed")],
        [("x", 1, 0, "running")], [("x", 1, 0, "running")]]
    assert log[1]["preempted"] == ["x"]
    assert free_blocks(log) == [0, 2, 0, 1, 1, 1, 1]
    x = req(records, "x")
    assert (x["num_preemptions"], x["recomputed_tokens"], x["finish_ms"]) == (1, 32, 70)
    assert req(records, "w")["finish_ms"] == 30


def test_priority_waiting_order_is_priority_then_arrival_then_id_as_string():
    # priority policy, max_num_seqs 1: one admission per pass, each request done in
    # its pass (O=1). lo (p1, t0), r9 (p0, t0), r10 (p0, t0), r2 (p0, t5).
    # decision 0:  {lo, r9, r10} -> r10 ("r10" < "r9" as strings)
    # decision 10: {lo, r9, r2}  -> r9 (arrival 0 < 5)
    # decision 20: {lo, r2}      -> r2 (priority 0 < 1)
    # decision 30: lo
    cfg = make_config(max_num_seqs=1, scheduling_policy="priority")
    _, log = run(cfg, make_workload([
        dict(id="lo", t=0, P=16, O=1, priority=1), dict(id="r9", t=0, P=16, O=1),
        dict(id="r10", t=0, P=16, O=1), dict(id="r2", t=5, P=16, O=1)]))
    assert [sched(p)[0][0] for p in log] == ["r10", "r9", "r2", "lo"]
    assert times(log) == [(0, 10), (10, 20), (20, 30), (30, 40)]


# ---------------------------------------------------------- §7 async engine


def test_async_decides_from_placeholders_and_skips_a_request_whose_last_token_is_in_flight():
    # a: t=0 P=16 O=1; b: t=0 P=16 O=3.
    # decide 0 (t=0):  a 16, b 16; both sample -> ph 1. Pass 0 [0,10].
    # decide 1 (t=0, pass 0 in flight): a: computed 16 + 2 - ph 1 = 17 >= 16 + 1 ->
    #                  its last token is in flight: skipped. b: 17 < 19 -> 1 token from
    #                  the placeholder (computed 17, ph 2). Pass 1 [10,20].
    # t=10: pass 0 outputs: a done; b token 1. decide 2: b 1 (computed 18). [20,30]
    # t=20: b token 2. decide 3: b 18 + 2 - 1 = 19 >= 19: skipped -> nothing to run.
    # t=30: b token 3, done.
    cfg = make_config(**ASYNC)
    records, log = run(cfg, make_workload([dict(id="a", t=0, P=16, O=1),
                                           dict(id="b", t=0, P=16, O=3)]))
    assert tokens(log) == [{"a": 16, "b": 16}, {"b": 1}, {"b": 1}]
    assert times(log) == [(0, 10), (10, 20), (20, 30)]
    a, b = req(records, "a"), req(records, "b")
    assert (a["finish_ms"], a["finish_pass"], a["output_tokens"]) == (10, 0, 1)
    assert (b["finish_ms"], b["finish_pass"], b["output_tokens"]) == (30, 2, 3)


def test_blocks_freed_in_pass_k_serve_pass_k_plus_2():
    # Async, same trace as test_sync_finished_request_blocks_serve_the_next_pass.
    # 7 usable. decide 0 (t=0): a 64 (4 blocks), c 17 (2); b (4) does not fit; free 1.
    # decide 1 (t=0): a's last token is in flight -> skipped; c 1 (18); a still holds
    #                 its blocks (pass 0's outputs are not processed): b waits; free 1.
    # t=10: pass 0 outputs: a finishes, frees 4 (free 5). Pass 1 starts [10,20];
    # decide 2 (t=10): c 1 (19), b 64 -> free 1.    Pass 2 [20,30]: b's token at 30.
    # decide 3 (t=20): c and b have their last tokens in flight -> nothing.
    cfg = make_config(num_gpu_blocks=8, **ASYNC)
    records, log = run(cfg, _k_plus_2_workload())
    assert [sched(p) for p in log] == [
        [("a", 64, 0, "new"), ("c", 17, 0, "new")],
        [("c", 1, 0, "running")],
        [("c", 1, 0, "running"), ("b", 64, 0, "new")]]
    assert times(log) == [(0, 10), (10, 20), (20, 30)]
    assert free_blocks(log) == [1, 1, 1]
    b = req(records, "b")
    assert (b["first_token_ms"], b["first_token_pass"]) == (30, 2)


def test_async_arrival_during_pass_k_of_a_busy_engine_first_joins_pass_k_plus_2():
    # a: t=0 P=16 O=5; b: t=5 P=16 O=1.
    # decide 0 (t=0): a 16 -> pass 0 [0,10]; decide 1 (t=0): a 1 -> pass 1.
    # b arrives at 5, during pass 0: pass 1 is already decided.
    # decide 2 (t=10, when pass 1 starts): a 1, b 16 -> pass 2 [20,30].
    # decide 3 (t=20): a 1 (computed 19, b skipped) -> [30,40]; decide 4 (t=30): a 1 ->
    # [40,50]; decide 5 (t=40): a 20 + 2 - 1 = 21 >= 21 -> nothing; a done at 50.
    cfg = make_config(**ASYNC)
    records, log = run(cfg, make_workload([dict(id="a", t=0, P=16, O=5),
                                           dict(id="b", t=5, P=16, O=1)]))
    assert tokens(log) == [{"a": 16}, {"a": 1}, {"a": 1, "b": 16}, {"a": 1}, {"a": 1}]
    assert times(log) == [(0, 10), (10, 20), (20, 30), (30, 40), (40, 50)]
    assert req(records, "b")["first_token_ms"] == 30
    assert req(records, "a")["finish_ms"] == 50


def test_async_arrival_at_the_decision_instant_of_a_busy_engine_joins_the_next_decision():
    # As above with b arriving at exactly t=10, when pass 0 ends, pass 1 starts and
    # pass 2 is decided: b joins decision 3 (t=20) -> pass 3 [30,40].
    # decide 3: a 1 (computed 19), b 16; decide 4 (t=30): a 1 (20), b skipped.
    cfg = make_config(**ASYNC)
    records, log = run(cfg, make_workload([dict(id="a", t=0, P=16, O=5),
                                           dict(id="b", t=10, P=16, O=1)]))
    assert tokens(log) == [{"a": 16}, {"a": 1}, {"a": 1}, {"a": 1, "b": 16}, {"a": 1}]
    assert times(log) == [(0, 10), (10, 20), (20, 30), (30, 40), (40, 50)]
    assert req(records, "b")["first_token_ms"] == 40


def test_sync_arrival_at_exactly_the_end_of_pass_k_joins_pass_k_plus_1():
    # a: t=0 P=16 O=3; b: t=10 P=16 O=1.
    # pass 0 [0,10]: a 16. Pass 1 is decided at 10 after pass 0's outputs and after
    # arrivals at 10: a 1, b 16 [10,20]. pass 2 [20,30]: a 1.
    cfg = make_config()
    records, log = run(cfg, make_workload([dict(id="a", t=0, P=16, O=3),
                                           dict(id="b", t=10, P=16, O=1)]))
    assert tokens(log) == [{"a": 16}, {"a": 1, "b": 16}, {"a": 1}]
    assert times(log) == [(0, 10), (10, 20), (20, 30)]
    assert req(records, "b")["first_token_ms"] == 20


def _closed_loop_of_two():
    """Closed loop of 2: a (P=16, O=4) and b (P=16, O=1) start at 0; b's
    finish releases c (P=16, O=1). The trace's timestamps are ignored."""
    import attrs

    return attrs.evolve(make_workload([dict(id="a", t=0, P=16, O=4),
                                       dict(id="b", t=0, P=16, O=1),
                                       dict(id="c", t=0, P=16, O=1)]), concurrency=2)


def test_sync_closed_loop_follow_up_first_joins_pass_k_plus_2():
    # A request released by an output arrives after every decision at its
    # release instant (§7 "Ties"): the client has the output only after the
    # engine processed it and decided the next pass.
    # pass 0 [0,10]: a 16, b 16. t=10: pass 0's outputs: b finishes, a token 1;
    # pass 1 is decided at 10: a 1 -> [10,20]; then c, released by b's output at
    # 10, arrives (arrival_ms 10) and first joins pass 2 [20,30]: a 1, c 16.
    # t=30: c's token (done), a token 3; pass 3 [30,40]: a 1, done at 40.
    records, log = run(make_config(), _closed_loop_of_two())
    assert tokens(log) == [{"a": 16, "b": 16}, {"a": 1}, {"a": 1, "c": 16}, {"a": 1}]
    assert times(log) == [(0, 10), (10, 20), (20, 30), (30, 40)]
    c = req(records, "c")
    assert records.arrival_ms.tolist() == [0, 0, 10]
    assert (c["first_token_ms"], c["first_token_pass"]) == (30, 2)
    assert req(records, "a")["finish_ms"] == 40


def test_async_closed_loop_follow_up_joins_the_decision_after_its_release():
    # Async, same workload. decide 0 (t=0): a 16, b 16 -> pass 0 [0,10];
    # decide 1 (t=0): b's last token is in flight (skipped), a 1 (computed 17,
    # ph 2) -> pass 1 [10,20].
    # t=10: pass 0's outputs (b done, a token 1), then decide 2 (t=10, when pass 1
    # starts): a 17 + 2 - 1 = 18 < 20 -> a 1 -> pass 2 [20,30]. c, released by b's
    # output at 10, arrives after that decision.
    # t=20: a token 2; decide 3: a 18 + 2 - 1 = 19 < 20 -> a 1; c 16 -> pass 3 [30,40].
    # t=30: a token 3; decide 4: a 19 + 2 - 1 = 20 >= 20 and c 16 + 2 - 1 >= 17:
    # both last tokens in flight -> nothing; t=40: a and c done.
    records, log = run(make_config(**ASYNC), _closed_loop_of_two())
    assert tokens(log) == [{"a": 16, "b": 16}, {"a": 1}, {"a": 1}, {"a": 1, "c": 16}]
    assert times(log) == [(0, 10), (10, 20), (20, 30), (30, 40)]
    c = req(records, "c")
    assert records.arrival_ms.tolist() == [0, 0, 10]
    assert (c["first_token_ms"], c["first_token_pass"]) == (40, 3)


def test_requests_released_together_wake_an_idle_engine_into_one_pass():
    # Closed loop of 2: a, b (P=16, O=1) [0,10] both finish at 10 and release c
    # and d at 10. Nothing is left to decide at 10, so the first released arrival
    # wakes the idle engine, which decides after every arrival released at 10:
    # c 16, d 16 -> [10,20].
    import attrs

    w = attrs.evolve(make_workload([dict(id=x, t=0, P=16, O=1) for x in "abcd"]),
                     concurrency=2)
    records, log = run(make_config(), w)
    assert tokens(log) == [{"a": 16, "b": 16}, {"c": 16, "d": 16}]
    assert times(log) == [(0, 10), (10, 20)]
    assert records.arrival_ms.tolist() == [0, 0, 10, 10]


def test_frontend_delays_each_arrival_by_its_prompt_and_a_short_prompt_can_overtake(monkeypatch):
    # engine.frontend: request_ms 2, tokenize_us_per_token 250 (0.25 ms a token).
    # a: sent t=0, P=32 -> reaches the engine at 0 + 2 + 8 = 10; b: sent t=1,
    # P=16 -> 1 + 2 + 4 = 7, before a. Sync: b wakes the idle engine at 7:
    # pass 0 [7,17] b 16; a arrives during it; pass 1 is decided at 17 (b done):
    # a 32 [17,27]; pass 2 [27,37] a 1. TTFT counts from the send time, as a
    # benchmark client measures it: a 27 - 0, b 17 - 1. The worker's compiled
    # loop admits the arrivals in that order (no arrival goes through the
    # replay's event loop one by one).
    from servesim.replay.driver import Replay

    def one_by_one(self, k):
        raise AssertionError("an open-loop arrival went through the event loop")

    monkeypatch.setattr(Replay, "_on_open_arrival", one_by_one)
    cfg = make_config(frontend={"request_ms": 2, "tokenize_us_per_token": 250})
    w = make_workload([dict(id="a", t=0, P=32, O=2), dict(id="b", t=1, P=16, O=1)])
    records, log = run(cfg, w)
    assert tokens(log) == [{"b": 16}, {"a": 32}, {"a": 1}]
    assert times(log) == [(7, 17), (17, 27), (27, 37)]
    assert records.arrival_ms.tolist() == [0, 1]
    assert (req(records, "a")["first_token_ms"], req(records, "b")["first_token_ms"]) == (27, 17)
    # request_ms alone keeps the order: a reaches the engine at 5, b at 6; pass 0 [5,15] a 32; pass 1 [15,25] a 1,
    # b 16 (b arrived during pass 0)
    records, log = run(make_config(frontend={"request_ms": 5}), w)
    assert tokens(log) == [{"a": 32}, {"a": 1, "b": 16}]
    assert times(log) == [(5, 15), (15, 25)]
    assert records.arrival_ms.tolist() == [0, 1]
    assert req(records, "b")["first_token_ms"] == 25


def test_frontend_delays_a_closed_loops_released_request_after_its_send():
    # _closed_loop_of_two with request_ms 5: a and b are sent at 0 and reach the
    # engine at 5: pass 0 [5,15] a 16, b 16. At 15 b finishes (a token 1); pass 1
    # is decided at 15: a 1 [15,25]. c is sent at 15 and arrives at 20, during
    # pass 1: pass 2 [25,35] a 1, c 16; pass 3 [35,45] a 1. c's TTFT: 35 - 15.
    records, log = run(make_config(frontend={"request_ms": 5}), _closed_loop_of_two())
    assert tokens(log) == [{"a": 16, "b": 16}, {"a": 1}, {"a": 1, "c": 16}, {"a": 1}]
    assert times(log) == [(5, 15), (15, 25), (25, 35), (35, 45)]
    assert records.arrival_ms.tolist() == [0, 0, 15]
    assert req(records, "c")["first_token_ms"] == 35


def _three_tokens():
    return make_workload([dict(id="a", t=0, P=16, O=3)])


def test_sync_host_time_runs_between_passes():
    # host_ms_per_pass 2 (engine/launch.py): a pass starts on the GPU 2 ms after
    # its decision. Sync: a (P=16, O=3) wakes the engine at 0: pass 0 [2,12];
    # pass 1 is decided at 12 (pass 0's outputs): [14,24]; pass 2 [26,36].
    records, log = run(make_config(host_ms_per_pass=2), _three_tokens())
    assert times(log) == [(2, 12), (14, 24), (26, 36)]
    assert req(records, "a")["finish_ms"] == 36


def test_async_host_time_hides_under_the_pass_in_flight_and_shows_where_longer():
    # Async, host 2 < 10 ms a pass: decide 0 at 0: pass 0 [2,12]; decide 1 at 0
    # (a 1 on a placeholder): ready at 2, starts when pass 0 ends: [12,22];
    # decide 2 at 12: ready at 14 < 22: [22,32]. Only the first pass waits.
    records, log = run(make_config(host_ms_per_pass=2, **ASYNC), _three_tokens())
    assert times(log) == [(2, 12), (12, 22), (22, 32)]
    assert req(records, "a")["finish_ms"] == 32
    # host 15 > 10: decide 0 at 0: [15,25]; decide 1 at 0: ready 15, after pass
    # 0: [25,35]; decide 2 at 25 (pass 0's end): ready 40 > 35: [40,50], 5 ms
    # of the host time shown.
    records, log = run(make_config(host_ms_per_pass=15, **ASYNC), _three_tokens())
    assert times(log) == [(15, 25), (25, 35), (40, 50)]


def test_async_empty_decision_waits_for_the_pass_in_flight_and_decides_again_at_its_end():
    # Async, 2 usable blocks. a: t=0 P=16 O=1; b: t=5 P=16 O=1; c: t=10 P=16 O=1.
    # decide 0 (t=0): a 16 (1 block, free 1) -> pass 0 [0,10].
    # decide 1 (t=0): a's last token is in flight -> nothing: wait for pass 0
    #                 (b, arriving at 5, is not admitted into that decision).
    # t=10: pass 0 outputs: a done, its block freed (free 2); decide again at 10,
    #       seeing arrivals <= 10: b 16 and c 16 -> pass 1 [10,20]; free 0.
    cfg = make_config(num_gpu_blocks=3, **ASYNC)
    records, log = run(cfg, make_workload([dict(id="a", t=0, P=16, O=1),
                                           dict(id="b", t=5, P=16, O=1),
                                           dict(id="c", t=10, P=16, O=1)]))
    assert [sched(p) for p in log] == [
        [("a", 16, 0, "new")], [("b", 16, 0, "new"), ("c", 16, 0, "new")]]
    assert times(log) == [(0, 10), (10, 20)]
    assert free_blocks(log) == [1, 0]
    assert req(records, "c")["finish_ms"] == 20


def test_async_next_pass_starts_on_the_gpu_when_the_previous_one_ends():
    # linear 10 ms + 1 ms/token. a: t=0 P=16 O=3.
    # pass 0: 10 + 16 = 26 -> [0,26]; pass 1 decided at 0, starts at end(0) = 26:
    # 10 + 1 -> [26,37]; pass 2 decided at 26 -> [37,48]. Tokens at 26, 37, 48.
    cfg = make_config(timing={"type": "linear", "base_ms": 10, "per_token_ms": 1}, **ASYNC)
    records, log = run(cfg, make_workload([dict(id="a", t=0, P=16, O=3)]))
    assert times(log) == [(0, 26), (26, 37), (37, 48)]
    a = req(records, "a")
    assert (a["first_token_ms"], a["finish_ms"]) == (26, 48)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_request_arriving_after_the_engine_drained_starts_a_pass_at_its_arrival(async_scheduling):
    # a: t=0 P=16 O=1 -> [0,10]; the engine drains at 10 (the empty finishing step
    # costs nothing). b: t=10.3 -> pass 1 [10.3, 20.3].
    cfg = make_config(async_scheduling=async_scheduling)
    records, log = run(cfg, make_workload([dict(id="a", t=0, P=16, O=1),
                                           dict(id="b", t=10.3, P=16, O=1)]))
    assert times(log) == [(0, 10), (10.3, pytest.approx(20.3, abs=1e-9))]
    assert req(records, "b")["first_token_ms"] == pytest.approx(20.3, abs=1e-9)


# ------------------------------------------------------------ §10 pricing


def test_fixed_pricing_charges_prefill_and_decode_in_a_mixed_pass():
    # fixed: prefill 30, decode 5. a: t=0 P=16 O=3; b: t=5 P=16 O=1.
    # pass 0: a prefill only -> 30 [0,30]; pass 1: a decode + b prefill -> 35 [30,65];
    # pass 2: a decode only -> 5 [65,70].
    cfg = make_config(timing={"type": "fixed", "prefill_ms": 30, "decode_ms": 5})
    records, log = run(cfg, make_workload([dict(id="a", t=0, P=16, O=3),
                                           dict(id="b", t=5, P=16, O=1)]))
    assert tokens(log) == [{"a": 16}, {"a": 1, "b": 16}, {"a": 1}]
    assert times(log) == [(0, 30), (30, 65), (65, 70)]
    assert (req(records, "b")["finish_ms"], req(records, "a")["finish_ms"]) == (65, 70)


LINEAR_FULL = {"type": "linear", "base_ms": 10, "per_token_ms": 0.1, "per_request_ms": 2,
               "per_context_token_ms": 0.01}


def test_linear_pricing_counts_requests_and_the_known_decode_context():
    # 10 + 0.1·tokens + 2·requests + 0.01·decode_context.
    # a: t=0 P=100 O=3; b: t=5 P=50 O=1.
    # pass 0: a prefill 100: 10 + 10 + 2 + 0 = 22 -> [0, 22]
    # pass 1: a decode (context 101 = 100 + 1 generated), b prefill 50:
    #         10 + 0.1·51 + 2·2 + 0.01·101 = 10 + 5.1 + 4 + 1.01 = 20.11 -> [22, 42.11]
    # pass 2: a decode (context 102): 10 + 0.1 + 2 + 1.02 = 13.12 -> [42.11, 55.23]
    cfg = make_config(timing=LINEAR_FULL)
    _, log = run(cfg, make_workload([dict(id="a", t=0, P=100, O=3),
                                     dict(id="b", t=5, P=50, O=1)]))
    assert tokens(log) == [{"a": 100}, {"a": 1, "b": 50}, {"a": 1}]
    assert times(log) == [pytest.approx(t, abs=1e-9) for t in
                          [(0, 22), (22, 42.11), (42.11, 55.23)]]


def test_async_decode_context_counts_known_tokens_not_placeholders():
    # Async, same pricing. a: t=0 P=100 O=3.
    # pass 0 (decided at 0): prefill 100: 22 -> [0, 22]
    # pass 1 (decided at 0, token 1 not known yet): context 100:
    #         10 + 0.1 + 2 + 1.00 = 13.1 -> [22, 35.1]
    # pass 2 (decided at 22, token 1 known): context 101: 13.11 -> [35.1, 48.21]
    cfg = make_config(timing=LINEAR_FULL, **ASYNC)
    records, log = run(cfg, make_workload([dict(id="a", t=0, P=100, O=3)]))
    assert times(log) == [pytest.approx(t, abs=1e-9) for t in
                          [(0, 22), (22, 35.1), (35.1, 48.21)]]
    assert req(records, "a")["finish_ms"] == pytest.approx(48.21, abs=1e-9)


def test_polynomial_pricing_sums_the_prefill_and_decode_terms():
    # num_gpu_blocks 100 -> u = decode_context / 1600.
    # a: t=0 P=1000 O=3; b: t=1 P=200 O=1.
    # pass 0: T = 1000: 4.209989e-07·1e6 + 1.518344e-02·1000 + 16.50142
    #         = 0.4209989 + 15.18344 + 16.50142 = 32.1058589
    # pass 1: prefill T = 200: 0.016839956 + 3.036688 + 16.50142 = 19.554947956
    #         decode a, context 1001: u = 0.625625, u² = 0.391406640625
    #         -25.74·u² + 54.01·u + 5.74 = -10.0748069296875 + 33.79000625 + 5.74
    #         = 29.4551993203125 -> 49.0101472763125 in all
    # pass 2: decode only, context 1002: u = 0.62625, u² = 0.3921890625
    #         -25.74·u² = -10.09494646875; 54.01·u = 33.8237625
    #         -10.09494646875 + 33.8237625 + 5.74 = 29.46881603125
    cfg = make_config(num_gpu_blocks=100, timing={"type": "polynomial"})
    _, log = run(cfg, make_workload([dict(id="a", t=0, P=1000, O=3),
                                     dict(id="b", t=1, P=200, O=1)]))
    assert tokens(log) == [{"a": 1000}, {"a": 1, "b": 200}, {"a": 1}]
    durations = [end - start for start, end in times(log)]
    assert durations == [pytest.approx(d, abs=1e-9) for d in
                         [32.1058589, 49.0101472763125, 29.46881603125]]
    assert times(log)[1][0] == pytest.approx(32.1058589, abs=1e-9)
