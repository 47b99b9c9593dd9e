"""The CPU KV tier (docs/engine.md §9, and §7 "With a CPU tier"): one test per
rule, each with the smallest timeline that shows it, worked out by hand.

Conventions of the hand computations: block_size 16, linear timing of 10 ms per
pass (helpers.make_config), so a busy synchronous engine runs pass k over
[10k, 10k + 10]. A CPU block is `bytes_per_token · block_size` bytes; with
`bytes_per_token: 62500` that is 1e6 B, so one block takes 1 / gbps ms on a
lane (1 GB/s: 1 ms; 0.1 GB/s: 10 ms). Block ids in the comments are G1 pool
ids (the free queue starts as 1..N-1); "free" is `free_blocks_after_schedule`;
a store or load is written [submitted/started, finished]; "a0" is request a's
first block (its identity).
"""

import json

import pytest

from helpers import make_config, make_workload, req, run, sched, times
from servesim.replay.api import run as api_run
from servesim.replay.driver import Replay
from servesim.config.examples import example_text

MB = 62500  # bytes_per_token giving 1e6-byte blocks of 16 tokens


def tier(d2h_gbps=1.0, h2d_gbps=1.0, num_cpu_blocks=16, connector="offloading"):
    return dict(num_cpu_blocks=num_cpu_blocks, bytes_per_token=MB, d2h_gbps=d2h_gbps,
                h2d_gbps=h2d_gbps, connector=connector)


def run_logged(config, workload):
    """`(records, pass_log, jobs, result)`, `jobs` being every transfer of
    worker 0 rank 0 as `(kind, blocks, gpu blocks, submit, start, finish)`; a
    block is named by the first request holding its identity and its index
    there ("a0" is request a's first block)."""
    replay = Replay(config, workload)
    names = {}
    for i, rid in enumerate(workload.request_ids):
        idents = replay.idents[replay.ident_offsets[i]:replay.ident_offsets[i + 1]]
        for k, ident in enumerate(idents.tolist()):
            names.setdefault(ident, f"{rid}{k}")
    connector = replay.workers[0].ranks[0].connector
    result = replay.run()
    jobs = [(j.kind, [names[i] for i in j.identities], j.gpu_blocks, j.submit_ms, j.start_ms,
             j.finish_ms) for j in connector.submitted_jobs()]
    return result.records, result.pass_log, jobs, result


def cpu_cached(records, request_id):
    return int(records.cpu_tier_cached_tokens[records.ids.index(request_id)])


# ------------------------------------------------------------------ loads


def test_prefix_evicted_from_g1_is_loaded_back_and_counts_as_cached_at_the_boundary():
    # 8 usable G1 blocks; d2h 1 ms/block, h2d 10 ms/block.
    # a: t=0 P=64 O=1 hashes [1,2,3,4]; c: t=20 P=128 O=1 (unique); b: t=40 P=80 O=1
    # hashes [1,2,3,4,5] (a's 64 tokens, then its own block).
    # pass 0 [0,10]:  a 64 (blocks 1-4); free 4. a done at 10. Its 4 full blocks
    #                 (a0-a3) are one store job at the pass end: d2h [10, 14]. a
    #                 frees them to the back: queue 5,6,7,8,4,3,2,1.
    # pass 1 [20,30]: c 128 takes all 8 blocks -> a's cached blocks are evicted
    #                 from G1; free 0. c's 8 blocks stored [30, 38].
    # decision at 40: b's G1 lookup finds nothing; its full blocks are 80 // 16 = 5;
    #                 the tier holds the first 4 (ready since 14) and not the 5th ->
    #                 load 4 blocks (c freed its blocks tail first at 30: queue
    #                 1,2,3,4,8,7,6,5, so they go into G1 blocks 1-4):
    #                 4 x 1e6 B / 0.1 GB/s = 40 ms, h2d [40, 80]. b waits (no
    #                 budget, nothing scheduled); the engine idles until 80.
    # pass 2 [80,90]: b admitted with 64 cached (all from the tier), computes 16
    #                 tokens (one more block: 8); free 8 - 5 = 3. First token at 90.
    #                 Its 5th block is stored at the pass end [90, 91].
    cfg = make_config(num_gpu_blocks=9, kv_offloading=tier(d2h_gbps=1, h2d_gbps=0.1))
    wl = make_workload([dict(id="a", t=0, P=64, O=1, hash_ids=[1, 2, 3, 4]),
                        dict(id="c", t=20, P=128, O=1),
                        dict(id="b", t=40, P=80, O=1, hash_ids=[1, 2, 3, 4, 5])])
    records, log, jobs, result = run_logged(cfg, wl)
    assert [sched(p) for p in log] == [
        [("a", 64, 0, "new")], [("c", 128, 0, "new")], [("b", 16, 64, "new")]]
    assert times(log) == [(0, 10), (20, 30), (80, 90)]
    assert [p["free_blocks_after_schedule"] for p in log] == [4, 0, 3]
    assert jobs == [
        ("store", ["a0", "a1", "a2", "a3"], [1, 2, 3, 4], 10.0, 10.0, 14.0),
        ("store", [f"c{k}" for k in range(8)], [5, 6, 7, 8, 4, 3, 2, 1], 30.0, 30.0, 38.0),
        ("load", ["a0", "a1", "a2", "a3"], [1, 2, 3, 4], 40.0, 40.0, 80.0),
        ("store", ["b4"], [8], 90.0, 90.0, 91.0)]
    b = req(records, "b")
    assert (b["first_token_ms"], b["first_admission_cached_tokens"], b["recomputed_tokens"]) == (
        90.0, 64, 0)
    assert cpu_cached(records, "b") == 64
    stats = result.stats
    assert (stats.cpu_tier_hit_tokens, stats.cpu_tier_loads, stats.cpu_tier_stores) == (64, 1, 3)
    assert (stats.cpu_tier_bytes_loaded, stats.cpu_tier_bytes_stored) == (4e6, 13e6)
    assert stats.cpu_tier_blocks_max == 13  # 4 + 8 + 1, never evicted (16 CPU blocks)
    assert stats.prefix_cache_hits == 0  # G1 statistics count G1 hits only

    # Without the tier b computes its 80 tokens at once: [40, 50].
    records, log = run(make_config(num_gpu_blocks=9), wl)
    assert sched(log[2]) == [("b", 80, 0, "new")] and times(log)[2] == (40, 50)


def test_a_load_may_cover_the_last_token_which_is_then_recomputed():
    # As the first test, but b is a's prompt exactly: P=64, hashes [1,2,3,4].
    # decision at 40: b's full blocks are 64 // 16 = 4 (the lookup goes up to the
    # last token's block, vLLM's `get_num_new_matched_tokens`): all 4 are loaded,
    # h2d [40, 80]; done, they cover all 64 tokens, so b counts 63 as computed and
    # recomputes the last one (`_update_waiting_for_remote_kv`).
    # pass 2 [80,90]: b 1 token, 63 cached; no new block (4 held); free 8 - 4 = 4.
    # (G1 alone never covers the last token's block: a G1 hit here is 48 at most.)
    cfg = make_config(num_gpu_blocks=9, kv_offloading=tier(d2h_gbps=1, h2d_gbps=0.1))
    wl = make_workload([dict(id="a", t=0, P=64, O=1, hash_ids=[1, 2, 3, 4]),
                        dict(id="c", t=20, P=128, O=1),
                        dict(id="b", t=40, P=64, O=1, hash_ids=[1, 2, 3, 4])])
    records, log, jobs, _ = run_logged(cfg, wl)
    assert sched(log[2]) == [("b", 1, 63, "new")] and times(log)[2] == (80, 90)
    assert log[2]["free_blocks_after_schedule"] == 4
    assert jobs[2] == ("load", ["a0", "a1", "a2", "a3"], [1, 2, 3, 4], 40.0, 40.0, 80.0)
    assert cpu_cached(records, "b") == 63


def test_load_finished_mid_pass_takes_effect_at_the_next_pass_boundary():
    # 9 usable G1 blocks; d2h 1 ms/block, h2d 12.5 ms/block (0.08 GB/s).
    # d: t=0 P=16 O=40 keeps the engine busy with one decode per pass.
    # a: t=0 P=64 O=1 hashes [1,2,3,4]; c: t=12 P=80 O=1; b: t=35 P=80 O=1 hashes
    # [1,2,3,4,5].
    # pass 0 [0,10]:  d 16 (block 1), a 64 (blocks 2-5); free 4. Stores at 10: d's
    #                 block [10, 11], then a's 4 blocks [11, 15]. a done: its blocks
    #                 go to the back, deepest first: queue 6,7,8,9,5,4,3,2.
    # pass 1 [10,20]: d 1 (17 tokens: block 6); free 7.
    # pass 2 [20,30]: d 1; c 80 takes 7,8,9 and a's 5,4 (a's blocks 3 and 2 leave
    #                 G1; its blocks 0,1 in G1 blocks 2,3 stay cached); free 2.
    # pass 3 [30,40]: d 1; free 7 (c done at 30).
    # decision at 40: b hits a's first 2 blocks in G1 (32 tokens); the next 2 are in
    #                 the tier, the 5th nowhere -> load 2 blocks (G1 blocks 4,5):
    #                 2 x 12.5 = 25 ms, h2d [40, 65]; b waits; free 7 - 2 - 2 = 3.
    # pass 4 [40,50], pass 5 [50,60]: d only (load not done).
    # pass 6 [60,70]: d only: decided at 60, the load ends at 65, mid-pass.
    # pass 7 [70,80]: the decision at 70 sees it: b admitted, 64 cached (32 G1 + 32
    #                 CPU), 16 computed; first token at 80 (not 75).
    cfg = make_config(num_gpu_blocks=10, kv_offloading=tier(d2h_gbps=1, h2d_gbps=0.08))
    wl = make_workload([dict(id="d", t=0, P=16, O=40),
                        dict(id="a", t=0, P=64, O=1, hash_ids=[1, 2, 3, 4]),
                        dict(id="c", t=12, P=80, O=1),
                        dict(id="b", t=35, P=80, O=1, hash_ids=[1, 2, 3, 4, 5])])
    records, log, jobs, result = run_logged(cfg, wl)
    assert [sched(p) for p in log[:8]] == [
        [("d", 16, 0, "new"), ("a", 64, 0, "new")],
        [("d", 1, 0, "running")],
        [("d", 1, 0, "running"), ("c", 80, 0, "new")],
        [("d", 1, 0, "running")],
        [("d", 1, 0, "running")],
        [("d", 1, 0, "running")],
        [("d", 1, 0, "running")],
        [("d", 1, 0, "running"), ("b", 16, 64, "new")]]
    assert times(log[:8]) == [(10 * k, 10 * k + 10) for k in range(8)]
    assert [p["free_blocks_after_schedule"] for p in log[:8]] == [4, 7, 2, 7, 3, 3, 3, 2]
    assert jobs[3] == ("load", ["a2", "a3"], [4, 5], 40.0, 40.0, 65.0)
    b = req(records, "b")
    assert (b["first_token_ms"], b["first_token_pass"], b["first_admission_cached_tokens"]) == (
        80.0, 7, 64)
    assert cpu_cached(records, "b") == 32
    assert result.stats.prefix_cache_hits == 32  # b's G1 part


def test_preempted_request_reloads_its_blocks_from_the_tier_instead_of_recomputing():
    # 5 usable G1 blocks; sync; h2d 2.5 ms/block (0.4 GB/s). a, b: t=0 P=32 O=40.
    # pass 0 [0,10]:  a 32 (blocks 1,2), b 32 (3,4); free 1. Stores at 10: a's two
    #                 blocks [10,12], b's [12,14].
    # pass 1 [10,20]: a 1 (33 tokens: block 5); b needs a block, none is free: b
    #                 (last) preempts itself; its cached blocks go to the back (4, 3).
    # passes 2..39:   a alone; b's admission needs 3 blocks (reserve_full_isl), at
    #                 most 2 are free. a's 4th block (pass 17) evicts b's block 4 from
    #                 G1, its 5th (pass 33) b's block 3. a done at 400.
    # decision at 400: b (33 tokens) hits nothing in G1; its 2 full blocks are in the
    #                 tier -> load [400, 405]; nothing else to run: idle until 405.
    # pass 40 [405,415]: b resumed with 32 cached, computes 1 token (the first
    #                 output, never computed before): nothing is recomputed.
    # Without the tier b recomputes its 32 prompt tokens at 400.
    cfg = make_config(num_gpu_blocks=6, kv_offloading=tier(h2d_gbps=0.4))
    wl = make_workload([dict(id="a", t=0, P=32, O=40), dict(id="b", t=0, P=32, O=40)])
    records, log, jobs, _ = run_logged(cfg, wl)
    assert log[1]["preempted"] == ["b"]
    assert [p["free_blocks_after_schedule"] for p in (log[16], log[17], log[32], log[33])] == [
        2, 1, 1, 0]
    assert sched(log[40]) == [("b", 1, 32, "resumed")] and times([log[40]]) == [(405, 415)]
    assert ("load", ["b0", "b1"], [3, 4], 400.0, 400.0, 405.0) in jobs
    b = req(records, "b")
    assert (b["num_preemptions"], b["recomputed_tokens"], b["finish_ms"]) == (1, 0, 795.0)
    assert cpu_cached(records, "b") == 32

    records, log = run(make_config(num_gpu_blocks=6), wl)
    assert sched(log[40]) == [("b", 33, 0, "resumed")] and times([log[40]]) == [(400, 410)]
    assert req(records, "b")["recomputed_tokens"] == 32


def test_load_into_blocks_a_store_still_reads_waits_for_that_store():
    # 8 usable G1 blocks, d2h 10 ms/block, h2d 1 ms/block.
    # a: t=0 P=48 O=1 hashes [1,2,3]; c: t=10 P=128 O=1; b: t=20 P=40 O=1 hashes
    # [1,2,9] (a's first two blocks, then a partial block of its own).
    # pass 0 [0,10]:  a 48 (blocks 1-3); its 3 blocks stored [10, 40]; freed to the
    #                 back: queue 4,5,6,7,8,3,2,1.
    # pass 1 [40,50]: c 128 takes all 8 blocks, among them a's 3, 2, 1, which the
    #                 store reads until 40: the pass starts at 40, not 10. c's 8
    #                 blocks are stored [50, 130]; freed at 50 to the back, tail
    #                 first: queue 1,2,3,8,7,6,5,4.
    # decision at 50: b misses in G1 (a's blocks were evicted), finds a0 and a1 ready
    #                 in the tier (b has 40 // 16 = 2 full blocks) -> load them into
    #                 G1 blocks 1, 2; c's store still reads those until 130, so the
    #                 load goes out then: [130, 132]. Nothing runs: the idle engine
    #                 wakes at 130 (c's store ends; the load is not done) and 132.
    # pass 2 [132,142]: b admitted with 32 cached, computes 8.
    cfg = make_config(num_gpu_blocks=9, kv_offloading=tier(d2h_gbps=0.1, h2d_gbps=1))
    wl = make_workload([dict(id="a", t=0, P=48, O=1, hash_ids=[1, 2, 3]),
                        dict(id="c", t=10, P=128, O=1),
                        dict(id="b", t=20, P=40, O=1, hash_ids=[1, 2, 9])])
    records, log, jobs, _ = run_logged(cfg, wl)
    assert [sched(p) for p in log] == [
        [("a", 48, 0, "new")], [("c", 128, 0, "new")], [("b", 8, 32, "new")]]
    assert times(log) == [(0, 10), (40, 50), (132, 142)]
    assert jobs[:3] == [
        ("store", ["a0", "a1", "a2"], [1, 2, 3], 10.0, 10.0, 40.0),
        ("store", [f"c{k}" for k in range(8)], [4, 5, 6, 7, 8, 3, 2, 1], 50.0, 50.0, 130.0),
        ("load", ["a0", "a1"], [1, 2], 130.0, 130.0, 132.0)]
    assert cpu_cached(records, "b") == 32


def test_pending_store_makes_the_request_wait_and_lets_others_pass():
    # 5 usable G1 blocks, simple_cpu (stores at finish), d2h 10 ms/block, h2d 1 ms.
    # a: t=0 P=48 O=1 hashes [1,2,3]; then at t=5, in this order: c P=64 O=1;
    # b P=64 O=1 hashes [1,2,3,4] (a's 48 tokens, then its own block); e P=16 O=1.
    # pass 0 [0,10]:  a 48 (blocks 1-3); free 2. a done at 10: its 3 blocks are
    #                 stored with its free, [10, 40] — pending in the tier until the
    #                 first decision at or after 40; freed: queue 4,5,3,2,1.
    # decision at 10: c takes 4,5,3,2 (a2, a1 leave G1); b hits a0 in G1 (block 1),
    #                 and its next block, a1, is pending in the tier: b waits, keeping
    #                 its place, and e behind it is admitted: it takes block 1 (a0
    #                 leaves G1). Pass 1 = c 64, e 16, free 0; it writes blocks a's
    #                 store reads until 40: [40, 50].
    #                 At 50 c and e finish: c's 4 blocks stored [50, 90], e's 1 block
    #                 [90, 100]; queue 2,3,5,4,1 (each tail first, cached).
    # decision at 50: a's store is done: b misses in G1, finds a0-a2 ready in the
    #                 tier (b4 is nowhere) -> load 3 blocks into 2,3,5, which c's
    #                 store reads until 90: h2d [90, 93]. Idle: wakes at 90 (a store
    #                 ends, nothing to do) and at 93.
    # pass 2 [93,103]: b admitted with 48 cached, all from the tier, computes 16.
    cfg = make_config(num_gpu_blocks=6, kv_offloading=tier(d2h_gbps=0.1, h2d_gbps=1,
                                                          connector="simple_cpu"))
    wl = make_workload([dict(id="a", t=0, P=48, O=1, hash_ids=[1, 2, 3]),
                        dict(id="c", t=5, P=64, O=1),
                        dict(id="b", t=5, P=64, O=1, hash_ids=[1, 2, 3, 4]),
                        dict(id="e", t=5, P=16, O=1)])
    records, log, jobs, _ = run_logged(cfg, wl)
    assert [sched(p) for p in log] == [
        [("a", 48, 0, "new")], [("c", 64, 0, "new"), ("e", 16, 0, "new")],
        [("b", 16, 48, "new")]]
    assert times(log) == [(0, 10), (40, 50), (93, 103)]
    assert [p["free_blocks_after_schedule"] for p in log] == [2, 0, 1]
    assert jobs == [
        ("store", ["a0", "a1", "a2"], [1, 2, 3], 10.0, 10.0, 40.0),
        ("store", ["c0", "c1", "c2", "c3"], [4, 5, 3, 2], 50.0, 50.0, 90.0),
        ("store", ["e0"], [1], 50.0, 90.0, 100.0),
        ("load", ["a0", "a1", "a2"], [2, 3, 5], 90.0, 90.0, 93.0),
        ("store", ["b3"], [4], 103.0, 103.0, 113.0)]
    assert cpu_cached(records, "b") == 48


# ------------------------------------------------------------------ stores


def test_store_in_flight_delays_the_pass_that_reuses_its_block():
    # 5 usable G1 blocks, d2h 10 ms/block. a: t=0 P=32 O=1.
    # pass 0 [0,10]: a 32 (blocks 1,2); a done; its 2 blocks stored [10, 30]; freed
    #                to the back, deepest first: queue 3,4,5,2,1.
    # b: t=5 P=64 O=1 needs 4 blocks: 3,4,5 and 2 -> block 2 is overwritten by pass 1,
    #    which therefore starts when the store ends: [30, 40].
    # b': t=5 P=48 O=1 needs only 3,4,5: pass 1 runs at once, [10, 20]; its own
    #    store queues behind a's on the lane: [20 -> 30, 60].
    cfg = make_config(num_gpu_blocks=6, kv_offloading=tier(d2h_gbps=0.1))
    a = dict(id="a", t=0, P=32, O=1)
    records, log, jobs, _ = run_logged(cfg, make_workload([a, dict(id="b", t=5, P=64, O=1)]))
    assert times(log) == [(0, 10), (30, 40)]
    assert jobs == [("store", ["a0", "a1"], [1, 2], 10.0, 10.0, 30.0),
                    ("store", ["b0", "b1", "b2", "b3"], [3, 4, 5, 2], 40.0, 40.0, 80.0)]
    assert req(records, "b")["first_token_ms"] == 40.0

    records, log, jobs, _ = run_logged(cfg, make_workload([a, dict(id="b", t=5, P=48, O=1)]))
    assert times(log) == [(0, 10), (10, 20)]
    assert jobs[1] == ("store", ["b0", "b1", "b2"], [3, 4, 5], 20.0, 30.0, 60.0)


@pytest.mark.parametrize("async_scheduling, submitted_at", [(False, 100.0), (True, 110.0)])
def test_simple_cpu_stores_a_finished_request_with_its_free(async_scheduling, submitted_at):
    # simple_cpu, d2h 1 ms/block, ample KV. a: t=0 P=23 O=10; b: t=0 P=16 O=20.
    # Pass k runs [10k, 10k + 10] in both modes (b keeps the engine busy).
    # a: pass 0 computes 23 tokens (token 1), passes 1-9 one each (tokens 2-10): it
    # finishes in pass 9 with 32 tokens computed, so its last block (tokens 16-31)
    # is full and its two blocks (identities 0 and 3; G1 blocks 1, 2) are stored.
    # Sync: freed when pass 9's outputs are processed, at 100 -> store [100, 102].
    # Async: pass 10 was decided (at 90) while a still held its blocks; its free
    # goes out with pass 10, so the store is submitted at its end: [110, 112].
    # (b's own store goes out when it finishes in pass 19, at 200.)
    cfg = make_config(num_gpu_blocks=20, async_scheduling=async_scheduling,
                      kv_offloading=tier(connector="simple_cpu"))
    wl = make_workload([dict(id="a", t=0, P=23, O=10), dict(id="b", t=0, P=16, O=20)])
    records, log, jobs, _ = run_logged(cfg, wl)
    assert log[9]["finished"] == ["a"] and times(log[9:11]) == [(90, 100), (100, 110)]
    assert jobs == [
        ("store", ["a0", "a1"], [1, 2], submitted_at, submitted_at, submitted_at + 2),
        ("store", ["b0", "b1"], [3, 4], 200.0, 200.0, 202.0)]


def test_offloading_stores_blocks_as_they_fill_known_tokens_only():
    # offloading, d2h 1 ms/block. a: t=0 P=20 O=15 alone, sync: block 0 is full
    # after pass 0 (20 tokens) -> stored at 10; block 1 fills when 32 tokens are
    # computed, in pass 12 -> stored at its end, 130. Async: pass 12 computes token
    # 32 before token 31 is known (it is a placeholder then), so block 1 is stored
    # with a's next pass, 13, at 140.
    wl = make_workload([dict(id="a", t=0, P=20, O=15)])
    _, _, jobs, _ = run_logged(make_config(kv_offloading=tier()), wl)
    assert [(j[1], j[3]) for j in jobs] == [(["a0"], 10.0), (["a1"], 130.0)]
    _, _, jobs, _ = run_logged(make_config(kv_offloading=tier(), async_scheduling=True), wl)
    assert [(j[1], j[3]) for j in jobs] == [(["a0"], 10.0), (["a1"], 140.0)]


@pytest.mark.parametrize("async_scheduling, a1_at, b1_at",
                         [(False, 130.0, 170.0), (True, 140.0, 180.0)])
def test_offloading_stores_a_finished_requests_last_block_with_its_free(
        async_scheduling, a1_at, b1_at):
    # offloading, d2h 1 ms/block, ample KV. a: t=0 P=20 O=13; b: t=0 P=16 O=20.
    # Pass k runs [10k, 10k + 10] in both modes (b keeps the engine busy).
    # G1 blocks: a0 = 1, a1 = 2 (pass 0); b0 = 3 (pass 0), b1 = 4 (pass 1).
    # pass 0 fills a0 (20 tokens) and b0 (16): stored at 10, a0 [10, 11], b0 [11, 12].
    # a computes 20 + k tokens in pass k and samples token k + 1: its last pass,
    # 12, computes token 32 (20 + 13 - 1), filling a1.
    # Sync: token 31 is known when pass 12 is decided: a1 goes with pass 12, at 130.
    # Async: pass 12 is decided before token 31's output (known tokens 31): its
    # store cannot take a1, and a is not scheduled again. a finishes when pass
    # 12's outputs are processed (130); a1 is stored with its free, at the end of
    # the pass in flight then (pass 13): 140. Same blocks, one pass later.
    # b1 fills in pass 16 (32 computed): sync stored at 170; async with b's next
    # pass, 17, at 180 (as blocks fill, known tokens only). b finishes in pass 19
    # with 35 computed: nothing more to store.
    cfg = make_config(num_gpu_blocks=20, async_scheduling=async_scheduling,
                      kv_offloading=tier())
    wl = make_workload([dict(id="a", t=0, P=20, O=13), dict(id="b", t=0, P=16, O=20)])
    records, log, jobs, result = run_logged(cfg, wl)
    assert log[12]["finished"] == ["a"] and times(log[12:14]) == [(120, 130), (130, 140)]
    assert jobs == [
        ("store", ["a0"], [1], 10.0, 10.0, 11.0),
        ("store", ["b0"], [3], 10.0, 11.0, 12.0),
        ("store", ["a1"], [2], a1_at, a1_at, a1_at + 1),
        ("store", ["b1"], [4], b1_at, b1_at, b1_at + 1)]


def test_full_tier_evicts_least_recently_used_ready_blocks():
    # 3 CPU blocks, simple_cpu, d2h 1 ms/block. a: t=0 P=32 O=1 finishes at 10: a0,
    # a1 stored [10, 12], inserted in that order (a0 least recently used). b: t=20
    # P=32 O=1 finishes at 30: b0, b1 need 2 places, 1 is free -> the least recently
    # used ready block, a0, is evicted (vLLM's LRUOffloadingManager inserts a job's
    # blocks first to last; only a lookup's touch puts a prefix's first block last).
    cfg = make_config(kv_offloading=tier(num_cpu_blocks=3, connector="simple_cpu"))
    wl = make_workload([dict(id="a", t=0, P=32, O=1), dict(id="b", t=20, P=32, O=1)])
    replay = Replay(cfg, wl)
    result = replay.run()
    idents = {name: replay.idents[replay.ident_offsets[i] + k]
              for i, rid in enumerate("ab") for k, name in enumerate((rid + "0", rid + "1"))}
    tier_ = replay.workers[0].ranks[0].connector.tier
    assert tier_.identities() == [idents["a1"], idents["b0"], idents["b1"]]
    assert result.stats.cpu_tier_blocks_max == 3


def test_store_that_does_not_fit_the_tier_is_dropped():
    # 1 CPU block, simple_cpu: a's 2 blocks can never fit -> no store, no transfer,
    # and nothing ever loads.
    cfg = make_config(kv_offloading=tier(num_cpu_blocks=1, connector="simple_cpu"))
    _, _, jobs, result = run_logged(cfg, make_workload([dict(id="a", t=0, P=32, O=1)]))
    assert jobs == [] and result.stats.cpu_tier_blocks_max == 0


# ------------------------------------------------------------------ async preemption


def test_async_preemption_stops_at_a_request_in_the_pass_in_flight():
    # Async, 7 usable G1 blocks. a, b: t=0 P=32 O=3; c: t=0 P=20 O=3.
    # pass 0 (decided at 0):  a 32, b 32, c 20 -> 6 blocks, free 1.
    # pass 1 (decided at 0, pass 0 in flight): a 1 (33 tokens: the last free block);
    #   b needs a block; the victim would be c, but c runs in pass 0, in flight: vLLM
    #   frees its blocks only after that pass, so the preemption loop stops and b
    #   waits a pass (and c, behind it, is not scheduled either). free 0.
    # pass 2 (decided at 10, after pass 0's outputs): a 1; b needs a block; c is not
    #   in the pass in flight (pass 1) -> preempted; b takes its block. free 1.
    # Without a tier pass 1 preempts c at once (its in-flight token still lands).
    cfg = make_config(num_gpu_blocks=8, async_scheduling=True, kv_offloading=tier())
    wl = make_workload([dict(id="a", t=0, P=32, O=3), dict(id="b", t=0, P=32, O=3),
                        dict(id="c", t=0, P=20, O=3)])
    records, log = run(cfg, wl)
    assert [(sched(p), p["preempted"]) for p in log[:3]] == [
        ([("a", 32, 0, "new"), ("b", 32, 0, "new"), ("c", 20, 0, "new")], []),
        ([("a", 1, 0, "running")], []),
        ([("a", 1, 0, "running"), ("b", 1, 0, "running")], ["c"])]
    assert [p["free_blocks_after_schedule"] for p in log[:3]] == [1, 0, 1]
    assert req(records, "c")["num_preemptions"] == 1

    records, log = run(make_config(num_gpu_blocks=8, async_scheduling=True), wl)
    assert [(sched(p), p["preempted"]) for p in log[:2]] == [
        ([("a", 32, 0, "new"), ("b", 32, 0, "new"), ("c", 20, 0, "new")], []),
        ([("a", 1, 0, "running"), ("b", 1, 0, "running")], ["c"])]


# ------------------------------------------------------------------ reporting


def test_summary_telemetry_and_example_report_the_tier():
    # The cpu-tier example runs; its summary has the CPU-tier keys right after
    # cpu_tier_hit_tokens, and telemetry samples count the tier's blocks.
    cfg = example_text("cpu-tier")
    import io

    from ruamel.yaml import YAML
    data = YAML(typ="safe").load(io.StringIO(cfg))
    report = api_run(data, limit=150, telemetry_interval_ms=10_000)
    s = report.summary
    keys = list(s)
    i = keys.index("cpu_tier_hit_tokens")
    assert keys[i:i + 6] == ["cpu_tier_hit_tokens", "cpu_tier_loads", "cpu_tier_stores",
                             "cpu_tier_bytes_loaded", "cpu_tier_bytes_stored",
                             "cpu_tier_blocks_max"]
    assert s["finished"] == 150 and s["cpu_tier_stores"] > 0
    assert s["cpu_tier_bytes_stored"] % (131072 * 64) == 0
    assert 0 < s["cpu_tier_blocks_max"] <= 16384
    assert max(t["cpu_tier_blocks"] for t in report.telemetry) == s["cpu_tier_blocks_max"]
    assert json.dumps(s)  # JSON-native

    data["engine"].pop("kv_offloading")
    s = api_run(data, limit=20).summary
    assert "cpu_tier_loads" not in s and s["cpu_tier_hit_tokens"] == 0
