"""Speculative decoding (README.md, "Speculative decoding"): one test per
scheduling rule, each on the smallest timeline that shows it, with the
passes, tokens, drafts and blocks worked out by hand in its comment.

Conventions as in tests/test_engine_rules.py: block_size 16, linear timing of
10 ms per pass, "free" = free_blocks_after_schedule. `spec` is the number of
draft tokens a scheduled entry carries (included in its tokens); `c` is
num_computed_tokens, `nt` num_tokens, `ph` output placeholders (async).
Acceptance comes from each request's `accepted` list (cycled over the
passes that verify real drafts). Speculative decoding runs on the compiled
scheduler only.
"""

import attrs
import numpy as np
import pytest

from helpers import free_blocks, make_config, make_workload, req, times
from servesim.errors import InputError
from servesim.replay.api import make_replay, simulate


def spec_config(k, **engine):
    method = engine.pop("method", "mtp")
    return make_config(speculative={"method": method, "num_speculative_tokens": k}, **engine)


def spec_workload(rows):
    """`make_workload` plus each row's `accepted` list."""
    w = make_workload(rows)
    counts = [len(r.get("accepted", [])) for r in rows]
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    values = np.array([a for r in rows for a in r.get("accepted", [])], dtype=np.int64)
    return attrs.evolve(w, accepted_values=values, accepted_offsets=offsets)


def spec_sched(p):
    return [(e["id"], e["tokens"], e["cached"], e["kind"], e["spec"]) for e in p["scheduled"]]


def run(cfg, rows):
    result = simulate(cfg, spec_workload(rows))
    return result.records, result.pass_log


def spec_counts(records, request_id):
    i = records.ids.index(request_id)
    return int(records.spec_drafted[i]), int(records.spec_accepted[i])


# ------------------------------------------------------- drafts and acceptance


def test_decode_asks_for_one_plus_k_and_rejected_drafts_roll_back():
    # k = 2; a: P=20, O=6, accepted [2, 0, 1]; 32 usable blocks.
    # pass 0 [0,10]:  a new 20 (no drafts yet); slots 20 + 2 lookahead = 22 -> 2 blocks,
    #                 free 30; token 1 (nt 21, c 20); the drafter proposes 2
    # pass 1 [10,20]: a 21 + 2 - 20 = 3 (spec 2), c 23; accepted 2 -> 3 tokens
    #                 (nt 24, c 23, 4 out)
    # pass 2 [20,30]: a 3 (spec 2), c 26; accepted 0 -> 1 token, c 26 - 2 = 24, nt 25
    # pass 3 [30,40]: a 3 (spec 2), c 27; accepted 1 -> 2 tokens, but token 6 is the
    #                 last: the second is trimmed; done at 40
    cfg = spec_config(2, num_gpu_blocks=33)
    records, log = run(cfg, [dict(id="a", t=0, P=20, O=6, accepted=[2, 0, 1])])
    assert [spec_sched(p) for p in log] == [
        [("a", 20, 0, "new", 0)], [("a", 3, 0, "running", 2)],
        [("a", 3, 0, "running", 2)], [("a", 3, 0, "running", 2)]]
    assert times(log) == [(0, 10), (10, 20), (20, 30), (30, 40)]
    assert free_blocks(log) == [30, 30, 30, 30]
    a = req(records, "a")
    assert (a["output_tokens"], a["first_token_ms"], a["finish_ms"], a["finish_pass"]) == (6, 10, 40, 3)
    assert spec_counts(records, "a") == (6, 3)  # accepted before trimming: 2 + 0 + 1


def test_a_budget_short_of_one_plus_k_keeps_b_minus_one_drafts():
    # k = 3, budget 10, max_num_seqs 4; a P=4, b P=3, c P=3, O=3, accepted [0].
    # pass 0: a 4, b 3, c 3 (budget 10 used up); tokens 1
    # pass 1: running order: a 4 (spec 3, budget 6 left), b 4 (spec 3, 2 left),
    #         c gets 2 = 1 + 1 draft; all rejected: 1 token each
    # pass 2: the same; token 3 for everyone, all done
    cfg = spec_config(3, max_num_batched_tokens=10, max_num_seqs=4)
    rows = [dict(id=x, t=0, P=p, O=3, accepted=[0]) for x, p in (("a", 4), ("b", 3), ("c", 3))]
    records, log = run(cfg, rows)
    decode = [("a", 4, 0, "running", 3), ("b", 4, 0, "running", 3), ("c", 2, 0, "running", 1)]
    assert [spec_sched(p) for p in log] == [
        [("a", 4, 0, "new", 0), ("b", 3, 0, "new", 0), ("c", 3, 0, "new", 0)], decode, decode]
    assert [p["finished"] for p in log] == [[], [], ["a", "b", "c"]]
    assert spec_counts(records, "c") == (2, 0)


def test_drafts_are_not_shortened_for_max_tokens_and_overshoot_is_trimmed():
    # k = 3; a: P=4, O=2, accepted [3].
    # pass 0: a 4, token 1 (c 4, nt 5)
    # pass 1: a 1 token from its end still schedules 1 + 3 (spec 3); all 3 accepted
    #         -> 4 tokens, only token 2 is kept (3 trimmed); output_tokens 2
    cfg = spec_config(3)
    records, log = run(cfg, [dict(id="a", t=0, P=4, O=2, accepted=[3])])
    assert [spec_sched(p) for p in log] == [[("a", 4, 0, "new", 0)], [("a", 4, 0, "running", 3)]]
    assert req(records, "a")["output_tokens"] == 2
    assert spec_counts(records, "a") == (3, 3)


def test_max_model_len_cuts_the_drafts():
    # k = 3, max_model_len 24; a: P=16, O=8 (max_tokens = min(8, 24 - 16) = 8),
    # accepted [3].
    # pass 0: a 16; slots min(16 + 3, 24) = 19 -> 2 blocks; token 1 (c 16, nt 17)
    # pass 1: ask 17 + 3 - 16 = 4 <= 24 - 16 - 1 = 7: spec 3, c 20; 4 tokens (nt 21)
    # pass 2: ask 4, capped at 24 - 20 - 1 = 3: 3 tokens = 1 + 2 drafts; both
    #         accepted: nt 24 = max_model_len, 8 tokens, done
    cfg = spec_config(3, max_model_len=24)
    records, log = run(cfg, [dict(id="a", t=0, P=16, O=8, accepted=[3])])
    assert [spec_sched(p) for p in log] == [
        [("a", 16, 0, "new", 0)], [("a", 4, 0, "running", 3)], [("a", 3, 0, "running", 2)]]
    assert req(records, "a")["output_tokens"] == 8
    assert spec_counts(records, "a") == (5, 5)


# ------------------------------------------------------------------ KV blocks


def test_every_allocation_reserves_k_lookahead_slots_and_rejection_keeps_blocks():
    # k = 3; a: P=28, O=3, accepted [0]; 32 usable blocks.
    # pass 0: a 28; slots 28 + 3 = 31 -> 2 blocks, free 30 (a plain run: 2 as well)
    # pass 1: a 4 (spec 3), c 32; slots 32 + 3 = 35 -> 3 blocks, free 29 (plain: 29
    #         tokens, 2 blocks); all rejected: c 29
    # pass 2: a 4, c 33, slots 36 -> 3 blocks: the block held past the rollback is
    #         reused, nothing new; free 29
    cfg = spec_config(3, num_gpu_blocks=33)
    records, log = run(cfg, [dict(id="a", t=0, P=28, O=3, accepted=[0])])
    assert free_blocks(log) == [30, 29, 29]
    plain = make_config(num_gpu_blocks=33)
    _, plain_log = run(plain, [dict(id="a", t=0, P=28, O=3)])
    assert free_blocks(plain_log) == [30, 30, 30]


def test_preemption_clears_the_drafts_and_the_resume_samples_one_token():
    # k = 1, 4 usable blocks, prefix caching off; a, b: P=28, O=6, accepted [1].
    # pass 0: a 28 (slots 29 -> 2 blocks), b 28 (2 blocks); free 0
    # pass 1: a 2 (spec 1, c 30, slots 31: 2 blocks), b 2; free 0; both accept:
    #         nt 31, c 30, 3 tokens each
    # pass 2: a 2: c 32, slots 33 -> 3 blocks, none free: b (last) is preempted,
    #         freeing 2; a takes 1, free 1; no admission in a pass that preempted.
    #         a accepts: nt 33, 5 tokens
    # pass 3: a 2 (c 34, slots 35, 3 blocks held); b's 31 tokens need 2 blocks > 1
    #         free: waits. a's 2 tokens: the 6th is its last (the other trimmed)
    # pass 4: b resumed with its drafts cleared: 31 tokens (spec 0), slots 32 -> 2
    #         blocks, free 2; samples token 4
    # pass 5: b 2 (spec 1; its second verification, accepted [1] cycled): tokens 5, 6
    cfg = spec_config(1, num_gpu_blocks=5, enable_prefix_caching=False)
    rows = [dict(id=x, t=0, P=28, O=6, accepted=[1]) for x in ("a", "b")]
    records, log = run(cfg, rows)
    assert [spec_sched(p) for p in log] == [
        [("a", 28, 0, "new", 0), ("b", 28, 0, "new", 0)],
        [("a", 2, 0, "running", 1), ("b", 2, 0, "running", 1)],
        [("a", 2, 0, "running", 1)],
        [("a", 2, 0, "running", 1)],
        [("b", 31, 0, "resumed", 0)],
        [("b", 2, 0, "running", 1)]]
    assert [p["preempted"] for p in log] == [[], [], ["b"], [], [], []]
    assert [p["finished"] for p in log] == [[], [], [], ["a"], [], ["b"]]
    assert free_blocks(log) == [0, 0, 1, 1, 2, 1]
    b = req(records, "b")
    assert (b["num_preemptions"], b["output_tokens"]) == (1, 6)
    assert b["recomputed_tokens"] == 30  # positions 0..29 (incl. an accepted draft) again


# -------------------------------------------------------------------- padding


def test_a_one_token_admission_is_padded_with_k_drafts_next_to_a_running_request():
    # k = 2; a: P=40, O=3, accepted [0]; b: P=1, O=1 at t=5; c: P=1, O=1 at t=100.
    # pass 0 [0,10]:   a new 40, token 1
    # pass 1 [10,20]:  a 3 (spec 2); b has 1 token to compute, a running request was
    #                  scheduled and none is a prefill chunk: padded to 1 + 2 (spec 2,
    #                  never accepted); b's token 1 is its last
    # pass 2 [20,30]:  a 3 (spec 2), token 3, done
    # pass 3 [100,110]: c alone, no cached tokens: not padded (1 token, spec 0)
    cfg = spec_config(2)
    rows = [dict(id="a", t=0, P=40, O=3, accepted=[0]), dict(id="b", t=5, P=1, O=1),
            dict(id="c", t=100, P=1, O=1)]
    records, log = run(cfg, rows)
    assert [spec_sched(p) for p in log] == [
        [("a", 40, 0, "new", 0)],
        [("a", 3, 0, "running", 2), ("b", 3, 0, "new", 2)],
        [("a", 3, 0, "running", 2)],
        [("c", 1, 0, "new", 0)]]
    assert spec_counts(records, "b") == (0, 0)  # padding is not a real draft


def test_only_the_running_loop_makes_an_admission_padded():
    # vLLM 0.33 pads when `not prefill_scheduled and (scheduled_running_reqs or
    # num_computed_tokens > 0)`: both flags come from the running loop only.
    # k = 2; a, b: P=1, O=1, both at t=0.
    # pass 0: nothing running; a (1 token, nothing cached): not padded; b likewise,
    #         though a was admitted before it in the same pass
    cfg = spec_config(2)
    _, log = run(cfg, [dict(id="a", t=0, P=1, O=1), dict(id="b", t=0, P=1, O=1)])
    assert [spec_sched(p) for p in log] == [[("a", 1, 0, "new", 0), ("b", 1, 0, "new", 0)]]


def test_a_running_request_finishing_its_prompt_stops_padding():
    # k = 1, budget 32; a: P=40 ids [1, 2, 3], O=2, accepted [0]; b: P=17 ids [1, 2],
    # O=1 at t=5 (b's block 0 is a's: its hash covers token 16, which b shares).
    # pass 0 [0,10]:  a 32 of 40 (a prefill chunk)
    # pass 1 [10,20]: a 8, its last prompt tokens: it entered the pass a prefill
    #                 chunk (`is_prefill_chunk`), so `prefill_scheduled`; b hits 16,
    #                 1 token to compute, not padded (spec 0)
    cfg = spec_config(1, max_num_batched_tokens=32)
    rows = [dict(id="a", t=0, P=40, O=2, accepted=[0], hash_ids=[1, 2, 3]),
            dict(id="b", t=5, P=17, O=1, hash_ids=[1, 2])]
    _, log = run(cfg, rows)
    assert [spec_sched(p) for p in log][:2] == [
        [("a", 32, 0, "new", 0)], [("a", 8, 0, "running", 0), ("b", 1, 16, "new", 0)]]


def test_padding_that_does_not_fit_the_budget_stops_admission():
    # k = 2, budget 4, max_num_seqs 4; a: P=2, O=3, accepted [0]; b: P=1, O=1 at t=5.
    # pass 0: a 2
    # pass 1: a 3 (spec 2), 1 token of budget left; b would be padded to 3 > 1: break
    # pass 2: the same (a's token 3: done)
    # pass 3 [30,40]: b alone: no running request scheduled, no cached tokens: 1 token
    cfg = spec_config(2, max_num_batched_tokens=4, max_num_seqs=4)
    rows = [dict(id="a", t=0, P=2, O=3, accepted=[0]), dict(id="b", t=5, P=1, O=1)]
    _, log = run(cfg, rows)
    assert [spec_sched(p) for p in log] == [
        [("a", 2, 0, "new", 0)], [("a", 3, 0, "running", 2)], [("a", 3, 0, "running", 2)],
        [("b", 1, 0, "new", 0)]]
    assert times(log)[3] == (30, 40)


# -------------------------------------------------------------- prefix caching


def test_a_block_hash_covers_the_next_blocks_first_token():
    # k = 1; a: P=48 ids [1, 2, 3] at 0; b: P=48 ids [1, 2, 4] at 20; c = a's prompt
    # at 40; O=1 each.
    # Block 1's hash covers token 32, the first of block 2 (id 3 for a, 4 for b): b
    # shares blocks 0 and 1 with a token for token, but hits only block 0 (16; a
    # plain run hits 32). c's lookup stops at floor(47 / 16) = 2 blocks, both a's
    # (block 1's hash needs token 32, which c shares): 32 cached.
    rows = [dict(id="a", t=0, P=48, O=1, hash_ids=[1, 2, 3]),
            dict(id="b", t=20, P=48, O=1, hash_ids=[1, 2, 4]),
            dict(id="c", t=40, P=48, O=1, hash_ids=[1, 2, 3])]
    _, log = run(spec_config(1), rows)
    assert [spec_sched(p) for p in log] == [
        [("a", 48, 0, "new", 0)], [("b", 32, 16, "new", 0)], [("c", 16, 32, "new", 0)]]
    _, plain = run(make_config(), rows)
    assert [p["scheduled"][0]["cached"] for p in plain] == [0, 32, 32]


def test_sync_outputs_register_the_block_their_token_completes_the_hash_of():
    # k = 1, sync; a: P=32 ids [1, 2], O=1. Its prefill (slots 33 -> blocks 1, 2, 3)
    # registers block 0 only: block 1's hash needs token 32, the first output.
    # Processing the output registers block 1 (cache_blocks on output, sync too);
    # a finishes and is freed tail first: block 3 (no hash) to the front of the
    # free queue, blocks 2 and 1 (cached) to the back.
    cfg = spec_config(1, num_gpu_blocks=9)
    replay = make_replay(cfg, spec_workload([dict(id="a", t=0, P=32, O=1, hash_ids=[1, 2])]))
    replay.run()
    pool = replay.workers[0].ranks[0].pool
    assert pool.free_queue() == [3, 4, 5, 6, 7, 8, 2, 1]
    assert pool.num_cached_blocks() == 2


# ---------------------------------------------------------------------- async


def test_async_schedules_again_before_acceptance_is_known_and_trims_the_surplus():
    # async, k = 2; a: P=4, O=4, accepted [2].
    # decide pass 0 at 0: a 4 (c 4, ph 1; the AsyncScheduler sets 2 placeholder drafts)
    # decide pass 1 at 0: skip? c + 2 - ph = 5 < 8: no. ask 4 + 2 + 1 - 4 = 3 (spec 2);
    #                     c 7, ph 1 + 3 = 4
    # end 0 (10): token 1 (nt 5, ph 3); decide pass 2: 7 + 2 - 3 = 6 < 8, so ask
    #             5 + 2 + 3 - 7 = 3 (spec 2); c 10, ph 6
    # end 1 (20): 2 accepted -> 3 tokens, nt 8: 4 tokens, a done in pass 1; pass 2
    #             turned out unnecessary (its output is dropped)
    cfg = spec_config(2, async_scheduling=True)
    records, log = run(cfg, [dict(id="a", t=0, P=4, O=4, accepted=[2])])
    assert [spec_sched(p) for p in log] == [
        [("a", 4, 0, "new", 0)], [("a", 3, 0, "running", 2)], [("a", 3, 0, "running", 2)]]
    assert times(log) == [(0, 10), (10, 20), (20, 30)]
    a = req(records, "a")
    assert (a["finish_pass"], a["finish_ms"], a["output_tokens"]) == (1, 20, 4)


def test_async_drafts_in_flight_count_against_max_model_len_so_a_decision_is_sat_out():
    # async, k = 1, max_model_len 24; a: P=21, O=3 (max_tokens 3), accepted [0];
    # b: P=4, O=1 at t=15.
    # decide pass 0 at 0: a 21; slots min(21 + 1, 24) = 22; c 21, ph 1
    # decide pass 1 at 0: ask 21 + 1 + 1 - 21 = 2, cap 24 - 1 - 21 = 2: a 2 (spec 1);
    #                     c 23, ph 3
    # end 0 (10): token 1 (nt 22, ph 2); decide pass 2: not skipped (23 + 2 - 2 < 24),
    #             ask 22 + 1 + 2 - 23 = 2 but cap 24 - 1 - 23 = 0 (the draft in flight
    #             counts in c): nothing to run, so wait for pass 1
    # end 1 (20): the draft rejected (c 22, ph 0), token 2 (nt 23); decide pass 2 at 20,
    #             seeing b (t 15 <= 20): a ask 23 + 1 - 22 = 2, cap 24 - 1 - 22 = 1:
    #             a 1 (spec 0); b 4 (not padded: 4 to compute); [20,30], both done
    # A plain async run decides pass 2 at 10 (a 1: c 22, cap 1), before b arrives; at
    # 20 a's last token is in flight (skipped) and b goes alone into [30,40].
    cfg = spec_config(1, async_scheduling=True, max_model_len=24)
    rows = [dict(id="a", t=0, P=21, O=3, accepted=[0]), dict(id="b", t=15, P=4, O=1)]
    records, log = run(cfg, rows)
    assert [spec_sched(p) for p in log] == [
        [("a", 21, 0, "new", 0)], [("a", 2, 0, "running", 1)],
        [("a", 1, 0, "running", 0), ("b", 4, 0, "new", 0)]]
    assert times(log) == [(0, 10), (10, 20), (20, 30)]
    a, b = req(records, "a"), req(records, "b")
    assert (a["output_tokens"], a["finish_ms"], b["finish_ms"]) == (3, 30, 30)
    assert spec_counts(records, "a") == (1, 0)
    plain_records, plain_log = run(make_config(async_scheduling=True, max_model_len=24), rows)
    assert [[(e["id"], e["tokens"]) for e in p["scheduled"]] for p in plain_log] == [
        [("a", 21)], [("a", 1)], [("a", 1)], [("b", 4)]]
    assert times(plain_log) == [(0, 10), (10, 20), (20, 30), (30, 40)]
    assert req(plain_records, "b")["finish_ms"] == 40


def test_compiled_runs_of_passes_agree_with_pass_by_pass():
    # the same workload, pass log off (compiled runs) and on, sync and async
    rows = [dict(id=f"r{i}", t=3.0 * i, P=20 + 7 * i, O=5 + i, accepted=[i % 3, 1])
            for i in range(8)]
    for engine in ({}, {"async_scheduling": True}):
        cfg = spec_config(2, num_gpu_blocks=20, **engine)
        logged = simulate(cfg, spec_workload(rows)).records
        quiet_cfg = attrs.evolve(cfg, output=attrs.evolve(cfg.output, pass_log=False))
        quiet = simulate(quiet_cfg, spec_workload(rows)).records
        for key in ("finish_ms", "first_token_ms", "spec_drafted", "spec_accepted",
                    "output_tokens", "num_preemptions"):
            assert np.array_equal(getattr(logged, key), getattr(quiet, key), equal_nan=True), key


# ------------------------------------------------------------ pricing, launch


def test_pricing_counts_draft_tokens_and_a_fitted_model_prices_them():
    # k = 2; a: P=10, O=2, accepted [0]. linear 1 ms + 1 ms per token: pass 0 prices
    # 10 tokens (11 ms), pass 1 1 + 2 drafts (4 ms).
    cfg = spec_config(2, timing={"type": "linear", "base_ms": 1, "per_token_ms": 1})
    _, log = run(cfg, [dict(id="a", t=0, P=10, O=2, accepted=[0])])
    assert times(log) == [(0, 11), (11, 15)]
    from servesim.engine.pricing import FITTED, price_pass

    params = np.array([1.0, 0.0, 0.0, 2.0, 0.0, 0.5])
    # one decode request with 2 drafts: 1 + 2 * 1 + 0.5 * 2
    assert price_pass(FITTED, params, 0, 0, 1, 10, 3, 1, 1.0, 2) == 4.0


def test_a_fitted_model_prices_padding_drafts_once_as_draft_tokens(tmp_path):
    # A record's features are disjoint (tokens = sum_prefill_tokens +
    # num_decode_requests + sum_draft_tokens, servesim/fitting/records.py), so a
    # padded admission's drafts are draft tokens, not prefill tokens as well.
    # k = 2; the padding timeline above: pass 1 holds a (decode, context 41, 2
    # drafts) and b (prefill of 1 token padded with 2 drafts).
    from servesim.fitting import write_model

    c = [1.0, 2.0, 0.5, 3.0, 0.01, 0.25]
    model = tmp_path / "m.yaml"
    write_model(model, c, 10, 0.9, 0.1, {"source": ["r.jsonl"], "launch_stall": None,
                                         "window": None})
    cfg = spec_config(2, timing={"type": "fitted", "model": str(model)})
    rows = [dict(id="a", t=0, P=40, O=3, accepted=[0]), dict(id="b", t=5, P=1, O=1)]
    _, log = run(cfg, rows)
    assert spec_sched(log[1]) == [("a", 3, 0, "running", 2), ("b", 3, 0, "new", 2)]
    assert log[1]["end_ms"] - log[1]["start_ms"] == pytest.approx(
        c[0] + c[1] * 1 + c[2] * 1 + c[3] * 1 + c[4] * 41 + c[5] * 4)


def test_polynomial_and_linear_price_a_decodes_drafts_and_padding_once():
    # docs/engine.md §12. Pass: one decode (context 100, 3 drafts), one prefill of
    # 1 token padded with 3 drafts (prefill_tokens 4, 3 of them padding); draft
    # tokens 6 in all, tokens 1 + 3 + 4 = 8, KV capacity 1000 (u = 0.1).
    from servesim.engine.pricing import LINEAR, POLYNOMIAL, price_pass

    a, b, c = 4.209989e-07, 1.518344e-02, 16.50142
    decode = max(1.0, -25.74 * 0.01 + 54.01 * 0.1 + 5.74)
    none = np.zeros(6)
    # polynomial: the 3 decode drafts join the 4 prefill tokens (padding once)
    assert price_pass(POLYNOMIAL, none, 4, 1, 1, 100, 8, 2, 1000.0, 6, 0, 3) == pytest.approx(
        a * 49 + b * 7 + c + decode)
    # without a prompt token the drafts cost the quadratic without its constant
    assert price_pass(POLYNOMIAL, none, 0, 0, 1, 100, 4, 1, 1000.0, 3) == pytest.approx(
        a * 9 + b * 3 + decode)
    # no drafts: the plain pass's price
    assert price_pass(POLYNOMIAL, none, 0, 0, 1, 100, 1, 1, 1000.0) == pytest.approx(decode)
    # linear: every token once, drafts and padding included: 2 + 0.5 * 8 + 1 * 2 + 0.01 * 100
    lin = np.array([2.0, 0.5, 1.0, 0.01, 0.0, 0.0])
    assert price_pass(LINEAR, lin, 4, 1, 1, 100, 8, 2, 1000.0, 6, 0, 3) == pytest.approx(9.0)


@pytest.mark.parametrize("timing", [
    {"type": "linear", "base_ms": 1.0, "per_token_ms": 0.05, "per_context_token_ms": 0.001},
    {"type": "polynomial"}])
def test_with_no_draft_accepted_every_method_is_slower_than_the_plain_run(timing):
    # Target of issue 40: 0% acceptance, so a pass yields what a plain pass does
    # and pays for its drafts: TPOT speedup (--baseline) < 1 for every method,
    # at a low and a high concurrency.
    from servesim.replay.api import run as api_run

    for method in ("mtp", "eagle", "ngram"):
        for seqs in (2, 32):
            cfg = {"workload": {"synthetic": {
                       "requests": 32, "input_tokens": 64, "output_tokens": 24,
                       "arrival": "burst", "seed": 1}},
                   "engine": {"block_size": 16, "num_gpu_blocks": 1024, "max_num_seqs": seqs,
                              "async_scheduling": False, "timing": timing,
                              "speculative": {"method": method, "num_speculative_tokens": 3,
                                              "acceptance_rates": [0.0, 0.0, 0.0]}}}
            block = api_run(cfg, baseline=True).summary["speculative"]
            assert block["accepted_tokens"] == 0 and block["draft_tokens"] > 0
            assert block["tpot_speedup"] < 1, (method, seqs)


def test_launch_classifies_a_pass_by_its_tokens_drafts_included():
    # async, k = 3, capture size 8; a, b, c: P=4, O=3, accepted [0].
    # pass 0, decided at 0: three prompts of 4 (12 tokens > 8): eager, so its launch
    #   ends at max(0 + 3, its GPU start 0) = 3; on the GPU [0, 10]
    # pass 1, decided at 3: three decodes of 1 + 3 = 12 tokens, no prompt token.
    #   Counting drafts it is eager: launch ends at max(3 + 3, GPU start 10) = 10;
    #   a decode launch (1 token each, 3 <= 8) would have ended at 3 + 1 = 4
    cfg = spec_config(3, async_scheduling=True, launch={"decode_ms": 1, "piecewise_ms": 2,
                                                        "eager_ms": 3,
                                                        "max_cudagraph_capture_size": 8})
    rows = [dict(id=x, t=0, P=4, O=3, accepted=[0]) for x in "abc"]
    _, log = run(cfg, rows)
    assert [sum(e["tokens"] for e in p["scheduled"]) for p in log[:2]] == [12, 12]
    assert [(p["decided_ms"], p["launch_end_ms"], p["start_ms"]) for p in log[:2]] == [
        (0, 3, 0), (3, 10, 10)]


# ------------------------------------------------------------------ bad input

SPEC_TRACE = """\
{"request_id": "a", "timestamp": 0, "input_length": 20, "output_length": 4, "hash_ids": [1, 2], "accepted": [1, 0]}
{"request_id": "b", "timestamp": 1, "input_length": 20, "output_length": 4, "hash_ids": [3, 4]%s}
"""
SPEC_CONFIG = """\
workload:
  trace: trace.jsonl
  trace_block_size: 16
engine:
  num_gpu_blocks: 64
  max_num_seqs: 8
  async_scheduling: %s
  speculative:
    method: %s
    num_speculative_tokens: %s
    acceptance_rates: %s
  timing: {type: linear, base_ms: 1.0, per_token_ms: 0.1}
"""


def _cli(tmp_path, accepted="", method="mtp", k="2", rates="[0.5, 0.5]", async_="false",
         command="run", extra=()):
    from click.testing import CliRunner

    from servesim.cli.main import main

    (tmp_path / "trace.jsonl").write_text(SPEC_TRACE % accepted)
    (tmp_path / "c.yaml").write_text(SPEC_CONFIG % (async_, method, k, rates))
    args = [command, str(tmp_path / "c.yaml")]
    if command == "run":
        args += ["-q", "-o", str(tmp_path / "out")]
    return CliRunner().invoke(main, args + list(extra))


@pytest.mark.parametrize("accepted, message", [
    (', "accepted": [0, 3]', r"trace.jsonl:2: accepted: entries must be in 0..2 "
                             r"\(engine.speculative.num_speculative_tokens\), got 3"),
    (', "accepted": [-1]', r"trace.jsonl:2: accepted must be a non-empty list of integers >= 0"),
    (', "accepted": [1.5]', r"trace.jsonl:2: accepted must be a non-empty list of integers"),
    (', "accepted": 2', r"trace.jsonl:2: accepted must be a non-empty list of integers"),
])
@pytest.mark.parametrize("command", ["run", "validate"])
def test_bad_accepted_lists_exit_2_naming_file_line_and_key(tmp_path, accepted, message,
                                                             command):
    result = _cli(tmp_path, accepted=accepted, command=command)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    import re

    assert re.search(message, result.output), result.output
    assert not (tmp_path / "out").exists()  # nothing half-written


@pytest.mark.parametrize("overrides, message", [
    (dict(rates="[0.5, 1.5]"), r"c.yaml:\d+: engine.speculative.acceptance_rates: must be a "
                               r"number >= 0 and <= 1, got 1.5"),
    (dict(rates="[0.5]"), r"c.yaml:\d+: engine.speculative.acceptance_rates: must be a list "
                          r"of 2 numbers"),
    (dict(k="0", rates="[]"), r"c.yaml:\d+: engine.speculative.num_speculative_tokens: must be "
                              r"an integer >= 1 and <= 8, got 0"),
    (dict(k="9", rates="[]"), r"engine.speculative.num_speculative_tokens: .*got 9"),
    (dict(method="medusa"), r"engine.speculative.method: must be one of mtp, eagle, ngram"),
    (dict(method="ngram", async_="true"),
     r"c.yaml:\d+: engine.speculative.method: ngram needs engine.async_scheduling: false"),
])
def test_bad_speculative_config_exits_2_naming_the_keys(tmp_path, overrides, message):
    import re

    result = _cli(tmp_path, **overrides)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert re.search(message, result.output), result.output


def test_a_timing_that_would_price_drafts_at_0_is_refused_with_speculative_decoding(tmp_path):
    # fixed prices a pass by its kind; a five-feature fitted model has no draft
    # coefficient: both would make drafts free, so both are refused naming the key
    from servesim.fitting import write_model

    with pytest.raises(InputError, match=r"engine.timing: type fixed prices a pass by its kind, "
                       r"not by its tokens, so engine.speculative's draft tokens would cost "
                       r"nothing; use aic, linear or polynomial timing"):
        spec_config(2, timing={"type": "fixed", "prefill_ms": 1.0, "decode_ms": 1.0})
    model = tmp_path / "m5.yaml"
    write_model(model, [1.0, 2.0, 0.5, 3.0, 0.01], 10, 0.9, 0.1,
                {"source": ["r.jsonl"], "launch_stall": None, "window": None})
    with pytest.raises(InputError, match=r"engine.timing.model: .*m5.yaml has no sum_draft_tokens "
                       r"coefficient .* refit on records with scheduled_requests.sum_draft_tokens"):
        spec_config(2, timing={"type": "fitted", "model": str(model)})
    # the same model and fixed timing run without speculative decoding
    make_config(timing={"type": "fitted", "model": str(model)})
    make_config(timing={"type": "fixed", "prefill_ms": 1.0, "decode_ms": 1.0})
    # on the command line: exit 2, the key named, no traceback
    result = _cli(tmp_path, extra=["--set", "engine.timing={type: fixed, prefill_ms: 1, decode_ms: 1}"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "engine.timing: type fixed prices a pass by its kind" in result.output, result.output


def test_ngram_with_launch_and_speculative_with_the_cpu_tier_or_disaggregated_mode_are_rejected():
    with pytest.raises(InputError, match="engine.speculative.method: ngram does not combine "
                                         "with engine.launch"):
        make_config(speculative={"method": "ngram", "num_speculative_tokens": 1},
                    launch={"decode_ms": 1})
    with pytest.raises(InputError, match="engine.speculative: does not combine with "
                                         "engine.kv_offloading"):
        make_config(speculative={"method": "mtp", "num_speculative_tokens": 1},
                    kv_offloading={"num_cpu_blocks": 8, "bytes_per_token": 1,
                                   "d2h_gbps": 1, "h2d_gbps": 1})
    cluster = {"mode": "disaggregated", "kv_transfer": {"bytes_per_token": 1,
                                                        "bandwidth_gbps": 1}}
    with pytest.raises(InputError, match="engine.speculative: is not supported on "
                                         "disaggregated prefill workers"):
        make_config(speculative={"method": "mtp", "num_speculative_tokens": 1},
                    cluster=cluster)


def test_a_speculative_run_writes_its_fields_and_summary(tmp_path):
    import json

    result = _cli(tmp_path, accepted=', "accepted": [2]')
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp_path / "out" / "requests.jsonl").open()]
    # a: 20 + 4 tokens, accepted [1, 0]: passes 1 (2 drafts, 1 accepted: 2 tokens),
    # 2 (0 accepted: token 4); b: accepted [2]: one verification gives 3 tokens
    assert [(r["spec_drafted"], r["spec_accepted"], r["spec_acceptance_rate"]) for r in rows] == [
        (4, 1, 0.25), (2, 2, 1.0)]
    spec = json.loads((tmp_path / "out" / "summary.json").read_text())["speculative"]
    assert spec["verification_passes"] == 3
    assert spec["mean_acceptance_length"] == pytest.approx(1 + 3 / 3)
    assert spec["acceptance_rate_per_position"] == [pytest.approx(2 / 3), pytest.approx(1 / 3)]


# ------------------------------------------------------- fitting and the report


def test_fit_on_records_with_draft_tokens_learns_their_cost_and_prices_a_run(tmp_path):
    # pass time = 2 + 3 per prefill + 0.01 per prefill token + 0.5 per decode
    # request + 1e-5 per context token + 0.25 per draft token (exact records)
    import json

    from click.testing import CliRunner

    from servesim.cli.main import main

    rng = np.random.default_rng(3)
    lines = []
    for n in range(200):
        reqs, drafts = int(rng.integers(1, 64)), int(rng.integers(0, 200))
        prefill = int(rng.integers(0, 2))
        tokens = int(rng.integers(100, 2000)) * prefill
        context = int(rng.integers(500, 1500)) * reqs  # varies on its own: the fit is determined
        ms = 2 + 3 * prefill + 0.01 * tokens + 0.5 * reqs + 1e-5 * context + 0.25 * drafts
        lines.append(json.dumps({"worker_id": "w", "counter_id": n, "wall_time": ms / 1000,
                                 "scheduled_requests": {
                                     "num_prefill_requests": prefill, "sum_prefill_tokens": tokens,
                                     "num_decode_requests": reqs,
                                     "sum_decode_kv_tokens": context,
                                     "sum_draft_tokens": drafts}}))
    (tmp_path / "fpm.jsonl").write_text("\n".join(lines) + "\n")
    result = CliRunner().invoke(main, ["fit", str(tmp_path / "fpm.jsonl"), "-o",
                                       str(tmp_path / "model.yaml")])
    assert result.exit_code == 0, result.output
    from servesim.config.config import read_fitted_model

    coefficients = read_fitted_model(str(tmp_path / "model.yaml"))
    assert len(coefficients) == 6 and coefficients[5] == pytest.approx(0.25, rel=1e-6)
    cfg = spec_config(2, timing={"type": "fitted", "model": str(tmp_path / "model.yaml")})
    _, log = run(cfg, [dict(id="a", t=0, P=10, O=2, accepted=[0])])
    # pass 1: one decode request of 1 + 2 drafts
    c = coefficients
    assert log[1]["end_ms"] - log[1]["start_ms"] == pytest.approx(
        c[0] + c[3] + c[4] * 11 + c[5] * 2)


def test_the_report_names_the_acceptance(tmp_path):
    pytest.importorskip("matplotlib")
    result = _cli(tmp_path, extra=["--report"])
    assert result.exit_code == 0, result.output
    html = (tmp_path / "out" / "report.html").read_text()
    assert "speculative mtp, k = 2" in html
    assert "mean acceptance length" in html


def test_baseline_reports_the_plain_runs_tpot_and_the_speedup(tmp_path):
    import json

    from servesim.replay.api import run as api_run

    result = _cli(tmp_path, extra=["--baseline"])
    assert result.exit_code == 0, result.output
    spec = json.loads((tmp_path / "out" / "summary.json").read_text())
    plain = api_run(str(tmp_path / "c.yaml"), overrides=["engine.speculative=null"]).summary
    block = spec["speculative"]
    assert block["baseline_tpot_ms"] == plain["tpot_ms"]
    assert block["tpot_speedup"] == pytest.approx(plain["tpot_ms"]["mean"] / spec["tpot_ms"]["mean"],
                                                  rel=1e-5)
    no_spec = _cli(tmp_path, extra=["--baseline", "--set", "engine.speculative=null"])
    assert no_spec.exit_code == 2 and "--baseline" in no_spec.output


def test_the_run_table_shows_the_drafts_and_the_baseline(tmp_path):
    import json

    from click.testing import CliRunner

    from servesim.cli.main import main

    _cli(tmp_path, command="validate")  # writes the trace and the config
    result = CliRunner().invoke(main, ["run", str(tmp_path / "c.yaml"), "-o", str(tmp_path / "out"),
                                       "--baseline"])
    assert result.exit_code == 0, result.output
    spec = json.loads((tmp_path / "out" / "summary.json").read_text())["speculative"]
    assert spec["draft_tokens"] > 0 and spec["tpot_speedup"] is not None
    assert (f"speculative     mtp, 2 drafts a pass: {spec['accepted_tokens']} / {spec['draft_tokens']} "
            f"accepted ({spec['acceptance_rate'] * 100:.1f}%), mean acceptance length "
            f"{spec['mean_acceptance_length']:.2f}\n") in result.output
    assert (f"baseline        TPOT {spec['baseline_tpot_ms']['mean']:.2f} ms mean without speculative "
            f"decoding; speedup {spec['tpot_speedup']:.2f}x\n") in result.output
    plain = CliRunner().invoke(main, ["run", str(tmp_path / "c.yaml"), "-o", str(tmp_path / "plain"),
                                      "--set", "engine.speculative=null"])
    assert plain.exit_code == 0 and "speculative " not in plain.output and "baseline " not in plain.output


def test_baseline_passes_on_the_plain_runs_warnings(tmp_path):
    # 8 usable blocks, k = 2: a (P=127) needs 127 + 2 lookahead slots, 9 blocks, so
    # the speculative run rejects it at arrival (no warning: b runs). The plain run
    # admits it (8 blocks), and it outgrows the pool at its 129th token: it could
    # never finish, which the baseline's TPOT leaves out, so the run says so.
    from click.testing import CliRunner

    from servesim.cli.main import main

    (tmp_path / "trace.jsonl").write_text(
        '{"request_id": "a", "timestamp": 0, "input_length": 127, "output_length": 4, '
        '"hash_ids": [1, 2, 3, 4, 5, 6, 7, 8]}\n'
        '{"request_id": "b", "timestamp": 0, "input_length": 10, "output_length": 2, '
        '"hash_ids": [9]}\n')
    (tmp_path / "c.yaml").write_text((SPEC_CONFIG % ("false", "mtp", "2", "[0.5, 0.5]"))
                                     .replace("num_gpu_blocks: 64", "num_gpu_blocks: 9"))
    args = ["run", str(tmp_path / "c.yaml"), "-q", "-o", str(tmp_path / "out")]
    alone = CliRunner().invoke(main, args)
    assert alone.exit_code == 0 and "warning" not in alone.output
    result = CliRunner().invoke(main, args + ["--baseline"])
    assert result.exit_code == 0, result.output
    assert ("warning: --baseline (the run without engine.speculative): 1 request(s) could "
            "never finish" in result.output)


def test_a_prompt_whose_lookahead_slots_never_fit_is_rejected_at_arrival():
    # k = 2, block 16, 8 usable blocks (128 slots). The prefill that completes a
    # prompt also reserves k lookahead slots: a (P=127) needs 129 slots = 9 blocks,
    # more than the pool holds, so it is rejected at arrival instead of holding
    # the queue forever; b (P=120) needs 122 = 8 blocks, and its decode (121 + 2
    # drafts + 2 lookahead = 125) still 8, so it runs; c runs after b.
    from servesim.results.records import STATUS_FINISHED, STATUS_REJECTED

    cfg = spec_config(2, num_gpu_blocks=9)
    records, log = run(cfg, [dict(id="a", t=0, P=127, O=2, accepted=[0]),
                             dict(id="b", t=0, P=120, O=2, accepted=[0]),
                             dict(id="c", t=0, P=10, O=2, accepted=[0])])
    assert records.status.tolist() == [STATUS_REJECTED, STATUS_FINISHED, STATUS_FINISHED]
    assert spec_sched(log[0]) == [("b", 120, 0, "new", 0)]
