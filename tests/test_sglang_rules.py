"""Hand-worked timelines of the SGLang engine's rules (docs/sglang.md), each
run through the scheduler directly: a pass costs `base + per_token x tokens`."""

import pytest

from servesim.sglang.config import SGLangConfig
from servesim.sglang.req import Req
from servesim.sglang.scheduler import Scheduler


def run(specs, base=1.0, per_token=0.1, **cfg):
    """Replay `specs` [(id, arrival_ms, prompt tokens, max_new_tokens)];
    returns (passes, {id: Req})."""
    config = SGLangConfig(**{"disable_overlap_schedule": True, **cfg})
    reqs = [Req(i, rid, t, list(prompt), m, 0, config.ignore_eos)
            for i, (rid, t, prompt, m) in enumerate(specs)]
    scheduler = Scheduler(config, reqs, lambda b: base + per_token * b.num_tokens)
    scheduler.run()
    return scheduler.passes, {r.rid: r for r in reqs}


def rows(p):
    return [(r["id"], r["kind"], r["tokens"], r.get("prefix"), r.get("cached"), r.get("partial"))
            for r in p["scheduled"]]


def test_a_radix_hit_stops_at_the_last_whole_page():
    """page_size 4: r0 (10 tokens, 2 outputs) leaves its prompt's two whole
    pages (8 tokens) in the tree; r1, the same 10 tokens, hits 8 of them (its
    own last token is always computed, and a hit is whole pages), extends 2
    and takes one new page (free 248 - 4); its locked prefix is not evictable."""
    prompt = range(10)
    passes, reqs = run([("r0", 0.0, prompt, 2), ("r1", 100.0, prompt, 1)],
                       max_total_tokens=256, page_size=4, chunked_prefill_size=64)
    assert [p["mode"] for p in passes] == ["extend", "decode", "extend"]
    assert passes[1]["free_tokens_after_schedule"] == 256 - 12  # r0's 3 pages, a decode fits its last
    assert rows(passes[2]) == [("r1", "new", 2, 8, 8, False)]
    assert passes[2]["start_ms"] == 100.0  # idle: the clock jumped to the arrival
    assert passes[2]["free_tokens_after_schedule"] == 256 - 8 - 4
    assert passes[2]["evictable_tokens_after_schedule"] == 0
    assert reqs["r1"].cached_tokens == 8


def test_a_hit_with_page_size_1_is_all_but_the_last_token():
    prompt = range(10)
    passes, _ = run([("r0", 0.0, prompt, 1), ("r1", 100.0, prompt, 1)], max_total_tokens=256)
    assert rows(passes[1]) == [("r1", "new", 1, 9, 9, False)]


def test_lpm_sorts_by_hit_and_deprioritizes_in_batch_sharers():
    """r0 leaves A (40 tokens) in the tree. At 10 ms r1 (unrelated), r2 (A's
    first 30 tokens + 10), r3 (B) and r4 (B again) wait. lpm: hits r1 0, r2 30,
    r3 0, r4 0; in the in-batch check r4 shares 40 >= 32 tokens with r3, checked
    before it, so it goes last; the stable sort puts r2 first, r1 and r3 keep
    their order. r4 gets no hit on r3: r3's prompt is in the tree only once its
    pass is processed."""
    a = list(range(40))
    b = list(range(2000, 2040))
    passes, reqs = run([("r0", 0.0, a, 1), ("r1", 10.0, range(1000, 1020), 1),
                        ("r2", 10.0, a[:30] + list(range(3000, 3010)), 1),
                        ("r3", 10.0, b, 1), ("r4", 10.0, b, 1)],
                       max_total_tokens=1024, chunked_prefill_size=512, schedule_policy="lpm")
    assert rows(passes[1]) == [("r2", "new", 10, 30, 30, False), ("r1", "new", 20, 0, 0, False),
                               ("r3", "new", 40, 0, 0, False), ("r4", "new", 40, 0, 0, False)]
    # fcfs keeps the arrival order
    passes, _ = run([("r0", 0.0, a, 1), ("r1", 10.0, range(1000, 1020), 1),
                     ("r2", 10.0, a[:30] + list(range(3000, 3010)), 1)],
                    max_total_tokens=1024, chunked_prefill_size=512)
    assert [r[0] for r in rows(passes[1])] == ["r1", "r2"]


def test_retraction_takes_the_last_request_out_and_resets_the_ratio():
    """Pool 140, two 10-token prompts with max_new_tokens 100, initial ratio
    0.07 (conservativeness 0.1). r0 reserves 10 + 100 + 1 = 111: r1 waits;
    next step r0's reservation is 99 x 0.07, r1 fits (111 < 130 - 6.93).
    From pass 2 both decode, 2 slots a pass: after pass 61 the pool is full
    (free 120 - 2 x 60 = 0), both have 61 tokens. Pass 62 cannot decode both:
    tied on (61 outputs, -10), the later one, r1, is retracted: its 60 own
    slots freed uncached, its prompt unlocked (evictable 10), nothing to evict
    (60 free >= 20 x 1). ratio = (61 + 20) / (100 + 1). r1 waits (its 71-token
    fill does not fit the budget) until r0 finishes, then re-prefills 61
    tokens on a 10-token hit."""
    passes, reqs = run([("r0", 0.0, range(10), 100), ("r1", 0.0, range(100, 110), 100)],
                       max_total_tokens=140, chunked_prefill_size=256,
                       schedule_conservativeness=0.1, ignore_eos=False)
    assert rows(passes[0]) == [("r0", "new", 10, 0, 0, False)]
    assert rows(passes[1]) == [("r1", "new", 10, 0, 0, False)]
    assert all(p["mode"] == "decode" and len(p["scheduled"]) == 2 for p in passes[2:62])
    assert passes[61]["free_tokens_after_schedule"] == 0
    p = passes[62]
    assert p["retracted"] == ["r1"] and [r["id"] for r in p["scheduled"]] == ["r0"]
    assert p["new_token_ratio"] == pytest.approx(81 / 101, abs=1e-12)
    assert (p["evicted_tokens"], p["free_tokens_after_schedule"],
            p["evictable_tokens_after_schedule"]) == (0, 59, 10)
    assert (p["running_after_schedule"], p["waiting_after_schedule"]) == (1, 1)
    assert reqs["r0"].finish_pass == 100
    assert rows(passes[101]) == [("r1", "retracted", 61, 10, 10, False)]
    r1 = reqs["r1"]
    assert (r1.num_retractions, r1.cached_tokens, len(r1.outputs)) == (1, 0, 100)


def test_the_chunked_request_goes_first_and_samples_only_at_its_last_chunk():
    """chunked_prefill_size 64: r0 (150 tokens) runs as 64 + 64 + 22; a chunk
    that leaves input samples nothing; its last chunk leaves 42 of the budget
    for r1 (30 tokens), behind it in the same pass."""
    passes, reqs = run([("r0", 0.0, range(150), 2), ("r1", 0.0, range(500, 530), 2)],
                       max_total_tokens=1024, chunked_prefill_size=64)
    assert rows(passes[0]) == [("r0", "new", 64, 0, 0, True)]
    assert rows(passes[1]) == [("r0", "chunk", 64, 64, 0, True)]
    assert rows(passes[2]) == [("r0", "chunk", 22, 128, 0, False), ("r1", "new", 30, 0, 0, False)]
    assert [p["mode"] for p in passes] == ["extend"] * 3 + ["decode"]
    assert reqs["r0"].first_token_pass == 2 and reqs["r0"].finish_pass == 3


@pytest.mark.parametrize("overlap", [False, True], ids=["normal", "overlap"])
def test_overlap_decides_a_pass_before_the_previous_one_ends(overlap):
    """r0 (10 tokens, 3 outputs) runs pass 0 (0-2 ms); r1 arrives at 1 ms.
    Without overlap pass 1 is decided at 2 ms: r1's prefill. With overlap pass
    1 is decided at 0 ms, while pass 0 runs: r1 is not there yet, r0 decodes
    its future token (2-3.1 ms); pass 2, decided at 2 ms, is r1's prefill,
    starting when pass 1 ends. r1's one token is foreseen (its in-flight
    prefill finishes it by length): pass 3 decodes r0 alone."""
    passes, reqs = run([("r0", 0.0, range(10), 3), ("r1", 1.0, range(100, 110), 1)],
                       max_total_tokens=256, chunked_prefill_size=64,
                       disable_overlap_schedule=not overlap)
    modes = [(p["mode"], [r["id"] for r in p["scheduled"]], p["start_ms"]) for p in passes]
    if not overlap:
        assert modes[:2] == [("extend", ["r0"], 0.0), ("extend", ["r1"], 2.0)]
        assert reqs["r1"].first_scheduled_ms == 2.0
    else:
        assert modes[:3] == [("extend", ["r0"], 0.0), ("decode", ["r0"], 2.0),
                             ("extend", ["r1"], pytest.approx(3.1))]
        assert reqs["r1"].first_scheduled_ms == 2.0
        assert [m[1] for m in modes[3:]] == [["r0"]]
    assert reqs["r0"].finish_reason == "length" and len(reqs["r0"].outputs) == 3


def test_a_closed_loop_release_joins_after_the_decision_at_its_instant():
    """concurrency 2, no overlap: r0 (1 output) and r1 (3 outputs) start at 0
    (pass 0, 0-2 ms). r0 finishes there and releases r2 at 2 ms, after the
    decision taken at 2 ms: pass 1 decodes r1 alone (2-3.1 ms), pass 2 is
    r2's prefill. Each request's arrival is its release instant."""
    from servesim.config.config import config_from_dict
    from servesim.replay.api import simulate
    from tests.helpers import workload_of

    config = config_from_dict({
        "workload": {"synthetic": {"requests": 1}, "trace_block_size": 16},
        "engine": {"backend": "sglang", "max_total_tokens": 256, "chunked_prefill_size": 64,
                   "disable_overlap_schedule": True,
                   "timing": {"type": "linear", "base_ms": 1.0, "per_token_ms": 0.1}},
        "output": {"pass_log": True}}, source="test")
    workload = workload_of([0.0, 0.0, 0.0], [5, 5, 10], [1, 3, 1], [[1], [2], [3]],
                           concurrency=2)
    result = simulate(config, workload)
    passes = result.pass_log
    assert [(p["mode"], [r["id"] for r in p["scheduled"]], p["start_ms"]) for p in passes[:3]] == [
        ("extend", ["r0", "r1"], 0.0), ("decode", ["r1"], 2.0),
        ("extend", ["r2"], pytest.approx(3.1))]
    assert list(result.records.arrival_ms) == [0.0, 0.0, 2.0]
    assert list(result.records.finish_reason) == ["length"] * 3
