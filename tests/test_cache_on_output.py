"""Registration of full blocks when a pass's outputs are processed
(`cache_blocks` called from `update_from_output`, servesim/scheduler/scheduler.py; vLLM's
vllm/v1/core/sched/async_scheduler.py `_update_request_with_output`).

Under async scheduling allocation registers only blocks full within the
request's *known* tokens, so the block a decode fills with a token still in
flight is registered when that token's pass's outputs are processed — also for
the request that finishes on that token, before its blocks are freed: the
block then goes back to the free queue as a cached block (to the back), not
as an uncached one (to the front), and a later allocation evicts a different
block. A request preempted before its in-flight output arrives registers
nothing. Without tokens in flight (sync engines) allocation has registered
every block the pass fills, and the call changes nothing.

The timeline is checked with the pass log (passes and records) and without
it (compiled runs of passes: request records only).
"""

import attrs
import pytest
from hypothesis import event, given, settings

import numpy as np

from servesim.kvcache.block_pool import IDENT, NONE
from servesim.replay.driver import Replay
from servesim.replay.api import simulate
from servesim.scheduler.request import RequestStatus
from helpers import after_every_event, build, engines, free_blocks, make_config, make_workload, req, requests, sched, times


def _finishing_block_workload():
    return make_workload([dict(id="a", t=0, P=15, O=2),
                          dict(id="x", t=0, P=32, O=18),
                          dict(id="c", t=0, P=32, O=2, hash_ids=[1, 2])])


@pytest.mark.parametrize("pass_log", [True, False], ids=["pass-log", "compiled-runs"])
def test_finishing_request_frees_its_last_block_cached_so_an_allocation_evicts_another(pass_log):
    # Async, 5 usable blocks (ids 1-5), 10 ms per pass, block_size 16.
    # a: P=15 O=2 (15 + 2 - 1 = 16: its second pass fills its only block);
    # x: P=32 O=18; c: P=32 hash [1,2] O=2. All arrive at 0, admitted a, x, c.
    # decide 0 (t=0):  a 15 -> block 1; x 32 -> blocks 2,3; c 32 -> blocks 4 (id 1),
    #                  5 (id 2), both registered (prompt). free 0. All ph 1.
    # decide 1 (t=0):  a 1 (computed 16; a block full of 15 prompt tokens + its
    #                  in-flight token 1: known tokens 15, so NOT registered here).
    #                  x 1 (33) needs a 3rd block, none free: preempt c (last
    #                  running), freed tail first to the back: queue [5, 4]; x pops
    #                  5 (evicts id 2). queue [4]. free 1, no admission.
    # t=10: pass 0's outputs: a token 1 (computed 16 - ph 1 = 15: nothing to
    #       register); x token 1; c (preempted) token 1 -> 33 tokens, registers nothing.
    # decide 2 (t=10): a skipped (last token in flight); x 1 (34). c: hit id 1 =
    #       16 tokens, needs 3 blocks (2 new + 1 hit with ref 0) > free 1. free 1.
    # t=20: pass 1's outputs: a token 2, finishes. cache_blocks(a, 16 - 0): its
    #       block 1 is registered, then freed as a cached block to the BACK:
    #       queue [4, 1]. (Without the rule: uncached, to the front: [1, 4].)
    # decides 3..16: x 1 each (35..48, 3 blocks); c still does not fit. free 2.
    # decide 17 (t=160): x 49 needs a 4th block: pops the front, block 4 — c's
    #       block of id 1 is evicted (without the rule: a's block 1, c's kept).
    #       free 1. x's token 18 (its last) comes from this pass.
    # decide 18 (t=170): x skipped (last token in flight); c does not fit.
    #       Nothing scheduled: the empty-pass rule waits for pass 17.
    # t=180: x finishes, frees its 4 blocks. decide at 180: c resumes with no hit:
    #       33 tokens computed again (without the rule: 16 cached, 17 computed);
    #       recomputed 32 (tokens below its previous high of 32). free 5 - 3 = 2.
    config = make_config(num_gpu_blocks=6, async_scheduling=True,
                         output={"pass_log": pass_log})
    result = simulate(config, _finishing_block_workload())
    records = result.records
    if pass_log:
        log = result.pass_log
        assert [sched(p) for p in log] == (
            [[("a", 15, 0, "new"), ("x", 32, 0, "new"), ("c", 32, 0, "new")],
             [("a", 1, 0, "running"), ("x", 1, 0, "running")]]
            + [[("x", 1, 0, "running")]] * 16
            + [[("c", 33, 0, "resumed")]])
        assert [p["preempted"] for p in log[:3]] == [[], ["c"], []]
        assert free_blocks(log) == [0, 1, 1] + [2] * 14 + [1, 2]
        assert times(log) == [(10 * k, 10 * k + 10) for k in range(19)]
    a, x, c = req(records, "a"), req(records, "x"), req(records, "c")
    assert (a["finish_ms"], a["finish_pass"], a["output_tokens"]) == (20, 1, 2)
    assert (x["finish_ms"], x["finish_pass"], x["output_tokens"]) == (180, 17, 18)
    assert (c["num_preemptions"], c["first_admission_cached_tokens"]) == (1, 0)
    assert (c["finish_ms"], c["finish_pass"], c["output_tokens"]) == (190, 18, 2)
    assert c["recomputed_tokens"] == 32


@pytest.mark.parametrize("pass_log", [True, False], ids=["pass-log", "compiled-runs"])
def test_sync_engine_registers_the_finishing_block_at_allocation_already(pass_log):
    # The same trace, synchronous. a's block is registered when its second pass
    # is scheduled (token 1 is known then), so a frees it cached in both cases
    # and the output call adds nothing.
    # pass 0 [0,10]:  a 15 (block 1), x 32 (2,3), c 32 (4,5). free 0.
    # pass 1 [10,20]: a 1 (16, registered), x 1 (33) needs a block: preempt c
    #                 (queue [5, 4]); x pops 5. free 1. a finishes at 20: block 1
    #                 to the back (cached): queue [4, 1]. c's lookup: id 1 hit,
    #                 3 blocks needed > 2 free.
    # passes 2..16: x 1 each (34..48).    pass 17 [170,180]: x 48 -> 49 needs a
    # 4th block: pops 4 (c's id 1). x samples token 18 at 180 and finishes.
    # pass 18 [180,190]: c resumes from 0: 33 tokens, recomputed 32.
    config = make_config(num_gpu_blocks=6, output={"pass_log": pass_log})
    result = simulate(config, _finishing_block_workload())
    if pass_log:
        log = result.pass_log
        assert sched(log[18]) == [("c", 33, 0, "resumed")]
        assert len(log) == 19
        assert free_blocks(log) == [0, 1] + [2] * 15 + [1, 2]
    c = req(result.records, "c")
    assert (c["finish_ms"], c["num_preemptions"], c["recomputed_tokens"]) == (190, 1, 32)


@settings(max_examples=40, deadline=None)
@given(spec=requests, engine=engines)
def test_output_registration_covers_completed_tokens_and_adds_nothing_when_sync(
        spec, engine):
    """After each pass's outputs every RUNNING request — and a finishing one
    before its blocks are freed — has registered every block full within its
    completed tokens (`num_computed_tokens` minus placeholders, known tokens
    only); in sync mode the output call registers nothing (allocation did it
    already)."""
    config, workload = build(spec, engine)
    config = attrs.evolve(config, output=attrs.evolve(config.output, pass_log=False))
    caching = engine["enable_prefix_caching"]
    sync = not engine["async_scheduling"]
    replay = Replay(config, workload)
    table = replay.store.table
    R = table.R
    state = {"registered_on_output": 0, "checked_finishes": 0}

    def completed_blocks(i, block_size):
        completed = min(R["num_computed_tokens"][i] - R["num_output_placeholders"][i],
                        R["num_tokens"][i])
        return completed // block_size

    cores = {}

    def num_cached(pool):
        return int((pool.blocks[IDENT, 1:pool.num_gpu_blocks] != NONE).sum())

    def after_event(core):
        # the event just run: a pass's outputs when the passes in flight went
        # down by one with no launch (nothing is allocated there, so the
        # blocks it adds to the cache are the output call's registrations),
        # else a decision
        ws = core.compiled.state
        before = cores.setdefault(core.index, {"count": 0, "launched": 0, "finished": set(),
                                               "cached": [0] * len(core.ranks)})
        count, launched = int(ws["num_in_flight"]), int(ws["num_passes"])
        cached = [num_cached(rank.pool) for rank in core.ranks]
        done = set(np.flatnonzero(R["status"] == RequestStatus.FINISHED).tolist())
        if count - before["count"] - (launched - before["launched"]) == -1:
            state["registered_on_output"] += sum(cached) - sum(before["cached"])
            if caching:
                for rank in core.ranks:
                    scheduler = rank.scheduler
                    block_size = rank.pool.block_size
                    for i in scheduler.running[:scheduler.S[0]["num_running"]].tolist():
                        assert R["num_cached_blocks"][i] >= completed_blocks(i, block_size), i
                    for i in done - before["finished"]:  # freed: its full blocks went back cached
                        if replay.rank_of[i] != rank.index or replay.worker_of[i] != core.index:
                            continue
                        off = R["block_offset"][i]
                        idents = table.idents[off:off + completed_blocks(i, block_size)]
                        assert (rank.pool.idmap[idents] != NONE).all(), i
                        state["checked_finishes"] += 1
        before.update(count=count, launched=launched, cached=cached, finished=done)

    after_every_event(replay, after_event)
    replay.run()
    event(f"finishes checked: {min(state['checked_finishes'], 3)}+")
    if sync:
        assert state["registered_on_output"] == 0
