"""Sessions and agent graphs under `backend: sglang` (docs/sglang.md,
"Sessions"): a later turn arrives at its predecessor's finish plus its delay;
in an accumulating session its prompt holds the earlier turn's outputs, which
are the session stream's tokens, so the radix tree hits them; session routing.

Conventions of the hand computations: page_size 1, no overlap, every pass
10 ms (linear timing, nothing per token), trace blocks of 16 tokens.
"""

import json

from servesim.config.config import config_from_dict
from servesim.config.config_types import WorkloadConfig
from servesim.replay.api import simulate
from servesim.workload.load import load_workload


def _run(tmp_path, rows, fmt="mooncake", workers=1, router="round_robin"):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = config_from_dict({
        "workload": {"trace": str(path), "format": fmt, "trace_block_size": 16},
        "engine": {"backend": "sglang", "max_total_tokens": 4096, "disable_overlap_schedule": True,
                   "timing": {"type": "linear", "base_ms": 10.0, "per_token_ms": 0.0}},
        "cluster": {"workers": workers, "router": router},
        "output": {"pass_log": True}}, source="test")
    workload = load_workload(WorkloadConfig(trace=str(path), format=fmt, trace_block_size=16), 16)
    result = simulate(config, workload)
    return result.records, result.pass_log


def _row(P, O, hash_ids, **fields):
    return dict(input_length=P, output_length=O, hash_ids=hash_ids, **fields)


def _extend_rows(log, rid):
    return [r for p in log for r in p["scheduled"] if r["id"] == rid and r["kind"] != "decode"]


def test_an_accumulating_turn_hits_the_previous_prompt_and_outputs(tmp_path):
    """t0: 32 tokens (ids 1, 2), 17 outputs: extend [0,10] (token 1), tokens
    2..17 in decodes 1..16, finish 170; its committed KV, prompt + 16 outputs
    (48 tokens), goes into the tree. t1 (mooncake-delta, 16 new tokens):
    prompt 32 + 17 + 16 = 65, arrives 170 + 5 = 175; its tokens 32-48 are t0's
    outputs (the session's stream), so it hits 48 tokens and extends 17 in
    [175,185]."""
    rows = [_row(32, 17, [1, 2], session_id="s", timestamp=0, request_id="t0"),
            _row(16, 1, [7], session_id="s", delay_ms=5, request_id="t1")]
    records, log = _run(tmp_path, rows, fmt="mooncake-delta")
    assert records.input_length.tolist() == [32, 65]
    assert records.finish_ms.tolist() == [170, 185]
    assert records.arrival_ms.tolist() == [0, 175]
    assert _extend_rows(log, "t1") == [{"id": "t1", "kind": "new", "tokens": 17, "prefix": 48,
                                        "cached": 48, "partial": False}]
    assert log[-1]["start_ms"] == 175
    assert records.cached_tokens.tolist() == [0, 48]
    assert records.turn.tolist() == [0, 1] and records.session_ids == ["s"]


def test_plain_turns_hit_only_the_shared_prompt(tmp_path):
    """The same session as a plain mooncake trace: t1's tokens past 32 come
    from its own hash ids, not t0's outputs: it hits the 32 prompt tokens."""
    rows = [_row(32, 17, [1, 2], session_id="s", timestamp=0, request_id="t0"),
            _row(65, 1, [1, 2, 3, 4, 5], session_id="s", delay=5, request_id="t1")]
    records, log = _run(tmp_path, rows)
    assert _extend_rows(log, "t1")[0]["prefix"] == 32
    assert records.arrival_ms.tolist() == [0, 175]


def test_a_next_turn_without_delay_joins_after_the_decision_at_its_release(tmp_path):
    """x: 16 tokens, 3 outputs keeps the engine busy; s0 (16 tokens, 1 output)
    finishes with pass 0 at 10; s1 (delay 0, 32 tokens: s0's prompt + 16),
    sent then, arrives after the decision taken at 10 (x's decode [10,20]) and
    is admitted at 20: it hits s0's 16 cached tokens (s0's one output never
    entered the KV) and extends 16 in [20,30]."""
    rows = [_row(16, 3, [7], request_id="x", timestamp=0),
            _row(16, 1, [1], session_id="s", timestamp=0, request_id="s0"),
            _row(32, 1, [1, 2], session_id="s", delay=0, request_id="s1")]
    records, log = _run(tmp_path, rows)
    assert records.arrival_ms.tolist() == [0, 0, 10]
    assert [p["start_ms"] for p in log[:3]] == [0, 10, 20]
    assert [[r["id"] for r in p["scheduled"]] for p in log[:3]] == [["x", "s0"], ["x"], ["s1"]]
    assert _extend_rows(log, "s1")[0]["prefix"] == 16
    assert records.finish_ms[2] == 30


def test_agent_graph_waits_for_its_latest_dependency(tmp_path):
    """a [0,10] -> b arrives 15 ([15,25]), c (tool wait 10) 20, admitted at
    25 ([25,35]); d waits for both: max(25, 35) + 2 + 3 = 40, [40,50]."""
    rows = [_row(16, 1, [1], request_id="a", timestamp=0),
            _row(16, 1, [2], request_id="b", wait_for=["a"], delay=5),
            _row(16, 1, [3], request_id="c", wait_for=["a"], tool_wait_ms=10),
            _row(16, 1, [4], request_id="d", wait_for=["b", "c"], delay_ms=2, tool_wait_ms=3)]
    records, _ = _run(tmp_path, rows, fmt="agentic_mooncake")
    assert records.arrival_ms.tolist() == [0, 15, 20, 40]
    assert records.finish_ms.tolist() == [10, 25, 35, 50]


def test_session_affinity_keeps_a_sessions_turns_on_its_first_workers(tmp_path):
    """Two sessions over two workers: their first turns go round robin (0, 1),
    their later turns follow them; round robin would alternate."""
    rows = [_row(16, 1, [1], session_id="a", timestamp=0, request_id="a0"),
            _row(16, 1, [2], session_id="b", timestamp=0, request_id="b0"),
            _row(32, 1, [1, 3], session_id="a", delay=5, request_id="a1"),
            _row(32, 1, [2, 4], session_id="b", delay=50, request_id="b1"),
            _row(48, 1, [1, 3, 5], session_id="a", delay=5, request_id="a2")]
    records, _ = _run(tmp_path, rows, workers=2, router="session_affinity")
    assert records.worker.tolist() == [0, 1, 0, 1, 0]
    assert records.cached_tokens.tolist() == [0, 0, 16, 16, 32]
    records, _ = _run(tmp_path, rows, workers=2, router="round_robin")
    assert records.worker.tolist() != [0, 1, 0, 1, 0]
