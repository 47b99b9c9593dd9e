"""Sessions and agent graphs (README, "Workloads"): arrivals that follow a
predecessor's finish, prompts that grow by the previous output under
`mooncake-delta`, closed loops counting sessions, session routing, the
outputs, and bad input.

Conventions of the hand computations: block_size 16, linear timing of 10 ms
per pass whatever it holds, a synchronous engine, so a request of prompt P
(P <= budget) and O outputs admitted at t gets token k at t + 10k; a later
turn arrives at its predecessor's last token + its delay.
"""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from helpers import make_config, req, run
from servesim.cli.main import main
from servesim.config.config_types import WorkloadConfig
from servesim.replay.api import simulate
from servesim.results.metrics import summarize
from servesim.results.output import request_lines
from servesim.workload.load import load_workload


def trace(tmp_path, rows, fmt="mooncake", concurrency=None, speedup=1.0, name="t.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = WorkloadConfig(trace=str(path), format=fmt, trace_block_size=16,
                         concurrency=concurrency, speedup=speedup)
    return load_workload(cfg, 16)


def row(P, O, hash_ids, **fields):
    return dict(input_length=P, output_length=O, hash_ids=hash_ids, **fields)


def test_a_later_turn_arrives_at_the_first_finish_plus_its_delay_and_hits_its_prompt(tmp_path):
    # s0: P=32 (ids 1,2), O=3: pass [0,10] prefill, tokens at 10, 20, 30 -> finish 30.
    # s1: arrives 30 + 5 = 35 with P=64 (ids 1,2,3,4): its first 2 blocks are
    # s0's prompt blocks, cached (s0's third block held 2 tokens, never full):
    # 32 cached, 32 computed in [35,45] (token 1 at 45), token 2 at 55.
    w = trace(tmp_path, [row(32, 3, [1, 2], session_id="s", timestamp=0, request_id="t0"),
                         row(64, 2, [1, 2, 3, 4], session_id="s", delay=5, request_id="t1")])
    records, log = run(make_config(), w)
    assert req(records, "t0")["finish_ms"] == 30
    t1 = req(records, "t1")
    assert records.arrival_ms[1] == 35
    assert t1["first_admission_cached_tokens"] == 32
    assert (t1["first_token_ms"], t1["finish_ms"]) == (45, 55)
    assert [p["start_ms"] for p in log] == [0, 10, 20, 35, 45]
    assert records.turn.tolist() == [0, 1]
    assert records.session_ids == ["s"]


def test_mooncake_delta_prompt_is_previous_prompt_plus_output_plus_delta_and_hits_the_output(tmp_path):
    # t0: P=32 (ids 1,2), O=17: prefill [0,10] (token 1 at 10), tokens 2..17 in
    # passes 1..16 -> finish 170. Its KV holds 32 + 16 = 48 tokens: blocks 0-1
    # (prompt) and block 2 (outputs 1-16), all full and cached.
    # t1 (delta 16): prompt 32 + 17 + 16 = 65, arrives 170 + 5 = 175; at most
    # (65-1)//16 = 4 blocks can hit; blocks 0-2 do (block 3 starts with output
    # 17, never computed): 48 cached, 17 computed in [175,185] -> token at 185.
    rows = [row(32, 17, [1, 2], session_id="s", timestamp=0, request_id="t0"),
            row(16, 1, [7], session_id="s", delay_ms=5, request_id="t1")]
    w = trace(tmp_path, rows, fmt="mooncake-delta")
    assert w.input_length.tolist() == [32, 65]
    records, log = run(make_config(), w)
    assert req(records, "t0")["finish_ms"] == 170
    t1 = req(records, "t1")
    assert t1["first_admission_cached_tokens"] == 48
    assert log[-1]["scheduled"] == [{"id": "t1", "tokens": 17, "cached": 48, "kind": "new"}]
    assert (log[-1]["start_ms"], t1["finish_ms"]) == (175, 185)


def test_plain_mooncake_turns_do_not_hit_the_previous_output(tmp_path):
    # The same session as a plain mooncake trace: t1's ids past the first
    # prompt are its own, so only the 2 prompt blocks hit.
    rows = [row(32, 17, [1, 2], session_id="s", timestamp=0, request_id="t0"),
            row(65, 1, [1, 2, 3, 4, 5], session_id="s", delay=5, request_id="t1")]
    records, _ = run(make_config(), trace(tmp_path, rows))
    assert req(records, "t1")["first_admission_cached_tokens"] == 32


def test_diamond_agent_graph_waits_for_the_latest_dependency(tmp_path):
    # a (root) [0,10] -> finish 10. b waits for a, delay 5: arrives 15, runs
    # [15,25]. c waits for a, tool wait 10: arrives 20 while b's pass runs,
    # admitted at 25, [25,35]. d waits for b and c: max(25, 35) + 2 + 3 = 40,
    # [40,50]. Prompts are unique (no hits).
    rows = [row(16, 1, [1], request_id="a", timestamp=0),
            row(16, 1, [2], request_id="b", wait_for=["a"], delay=5),
            row(16, 1, [3], request_id="c", wait_for=["a"], tool_wait_ms=10),
            row(16, 1, [4], request_id="d", wait_for=["b", "c"], delay_ms=2, tool_wait_ms=3)]
    w = trace(tmp_path, rows, fmt="agentic_mooncake")
    records, _ = run(make_config(), w)
    assert records.arrival_ms.tolist() == [0, 15, 20, 40]
    assert [req(records, x)["finish_ms"] for x in "abcd"] == [10, 25, 35, 50]
    assert records.turn.tolist() == [0, 1, 1, 2]
    assert records.session_ids == ["a"]  # no session_id: the root's graph


def test_dynamo_versioned_agent_graph_delays_each_dependency_on_its_own(tmp_path):
    # The diamond in Dynamo's versioned form: d waits 20 ms after b (finish
    # 25 -> 45) and 2 ms after c (finish 35 -> 37): ready at 45, [45,55].
    header = {"schema": "dynamo.agentic_mooncake", "version": 2, "block_size": 16,
              "hash_id_scope": "local", "source": {"format": "test", "digest": "-"}}

    def v2(rid, hash_ids, deps=(), start=0.0):
        return dict(request_id=rid, play_id="p", session_id="g", model="m", input_length=16,
                    output_length=1, hash_ids=hash_ids, not_before_ms=start,
                    dependencies=[dict(request_id=d, trigger="completion", delay_ms=w,
                                       relation="join" if len(deps) > 1 else "sequence")
                                  for d, w in deps])
    rows = [header, v2("a", [1]), v2("b", [2], [("a", 5)]), v2("c", [3], [("a", 10)]),
            v2("d", [4], [("b", 20), ("c", 2)])]
    records, _ = run(make_config(), trace(tmp_path, rows, fmt="agentic_mooncake"))
    assert records.arrival_ms.tolist() == [0, 15, 20, 45]
    assert [req(records, x)["finish_ms"] for x in "abcd"] == [10, 25, 35, 55]


def test_a_next_turn_without_delay_arrives_after_the_decision_at_its_release(tmp_path):
    # x: P=16 O=3 at 0 keeps the engine busy; session s: s0 P=16 O=1 at 0, s1
    # P=32 (s0's prompt block + 1) with delay 0.
    # pass 0 [0,10]: x 16, s0 16. t=10: s0 done, x token 1; pass 1 is decided at
    # 10: x 1 -> [10,20]; s1, sent when s0's answer reached the client (10),
    # arrives after that decision (docs/engine.md §7 "Ties") and first joins
    # pass 2 [20,30]: x 1, s1 16 computed + 16 cached -> token at 30.
    rows = [row(16, 3, [7], request_id="x", timestamp=0),
            row(16, 1, [1], session_id="s", timestamp=0, request_id="s0"),
            row(32, 1, [1, 2], session_id="s", delay=0, request_id="s1")]
    records, log = run(make_config(), trace(tmp_path, rows))
    s1 = req(records, "s1")
    assert records.arrival_ms.tolist() == [0, 0, 10]
    assert [p["start_ms"] for p in log] == [0, 10, 20]
    assert [[e["id"] for e in p["scheduled"]] for p in log] == [["x", "s0"], ["x"], ["x", "s1"]]
    assert (s1["first_token_ms"], s1["first_admission_cached_tokens"]) == (30, 16)


def test_a_next_turn_reaches_the_engine_after_the_frontends_delay(tmp_path):
    # As above with engine.frontend tokenize_us_per_token 125 (16 tokens: 2 ms,
    # 32: 4 ms): x and s0, sent at 0, reach the engine at 2: pass 0 [2,12]: x 16,
    # s0 16. At 12 s0 is done; pass 1 [12,22]: x 1. s1 is sent at 12 and
    # reaches the engine at 16, during pass 1: pass 2 [22,32]: x 1, s1 16 + 16
    # cached.
    rows = [row(16, 3, [7], request_id="x", timestamp=0),
            row(16, 1, [1], session_id="s", timestamp=0, request_id="s0"),
            row(32, 1, [1, 2], session_id="s", delay=0, request_id="s1")]
    records, log = run(make_config(frontend={"tokenize_us_per_token": 125}),
                       trace(tmp_path, rows))
    assert records.arrival_ms.tolist() == [0, 0, 12]
    assert [p["start_ms"] for p in log] == [2, 12, 22]
    assert [[e["id"] for e in p["scheduled"]] for p in log] == [["x", "s0"], ["x"], ["x", "s1"]]
    assert req(records, "s1")["first_token_ms"] == 32


def test_closed_loop_of_two_sessions_holds_each_slot_through_all_turns(tmp_path):
    # concurrency 2, sessions A, B, C of two turns (P=16, O=1, delay 5):
    # A0, B0 at 0 -> [0,10]; A1, B1 at 15 -> [15,25]; A and B are done at 25,
    # so C0 starts then (its timestamp is ignored) -> [25,35]; C1 at 40 -> [40,50].
    rows = []
    for k, s in enumerate("ABC"):
        rows.append(row(16, 1, [10 * k + 1], session_id=s, timestamp=0, request_id=s + "0"))
        rows.append(row(16, 1, [10 * k + 2], session_id=s, delay=5, request_id=s + "1"))
    w = trace(tmp_path, rows, concurrency=2)
    records, _ = run(make_config(), w)
    assert records.arrival_ms.tolist() == [0, 15, 0, 15, 25, 40]
    assert [req(records, i)["finish_ms"] for i in ("A0", "A1", "B0", "B1", "C0", "C1")] == [
        10, 25, 10, 25, 35, 50]


@pytest.mark.parametrize("router, b1_worker", [("round_robin", 0), ("session_affinity", 1),
                                               ("least_prefill", 1)])
def test_session_affinity_and_least_prefill_keep_a_later_turn_with_its_first(tmp_path, router,
                                                                         b1_worker):
    # 2 workers. A0 -> w0, B0 -> w1 (round robin, and least_prefill's tie by index
    # then by load). B1 (delay 5) arrives before A1 (delay 20): round robin
    # sends it to w0; session_affinity to B0's worker; least_prefill to where B0's
    # 2 prompt blocks are cached.
    rows = [row(32, 1, [1, 2], session_id="A", timestamp=0, request_id="A0"),
            row(32, 1, [5, 6], session_id="B", timestamp=0, request_id="B0"),
            row(48, 1, [1, 2, 3], session_id="A", delay=20, request_id="A1"),
            row(48, 1, [5, 6, 7], session_id="B", delay=5, request_id="B1")]
    cfg = make_config(cluster={"workers": 2, "router": router})
    records, _ = run(cfg, trace(tmp_path, rows))
    worker = dict(zip(records.ids, records.worker.tolist()))
    assert (worker["A0"], worker["B0"], worker["B1"]) == (0, 1, b1_worker)
    if router != "round_robin":
        assert worker["A1"] == 0


def test_speedup_divides_first_turn_timestamps_and_delays(tmp_path):
    # speedup 2: s1 starts at 100 / 2 = 50 -> [50,60]; s0 [0,10], its turn 2
    # at 10 + 40 / 2 = 30 -> [30,40].
    rows = [row(16, 1, [1], session_id="s0", timestamp=0),
            row(16, 1, [2], session_id="s1", timestamp=100),
            row(16, 1, [3], session_id="s0", delay=40)]
    records, _ = run(make_config(), trace(tmp_path, rows, speedup=2.0))
    assert records.arrival_ms.tolist() == [0, 50, 30]


def synthetic_sessions(**sessions):
    return {"workload": {"synthetic": {"sessions": sessions, "seed": 3}},
            "engine": {"block_size": 16, "num_gpu_blocks": 2048, "max_num_seqs": 16,
                       "max_num_batched_tokens": 512,
                       "timing": {"type": "linear", "base_ms": 5, "per_token_ms": 0.01}}}


def test_synthetic_sessions_grow_their_prompt_and_wait_their_think_time():
    from servesim.config.config import config_from_dict

    cfg = config_from_dict(synthetic_sessions(count=3, turns=3, new_input_tokens=100,
                                              output_tokens=20, think_time=250))
    w = load_workload(cfg.workload, 16)
    assert w.input_length.tolist() == [100, 220, 340] * 3
    result = simulate(cfg, w)
    r = result.records
    for s in range(3):
        for t in (1, 2):
            i = 3 * s + t
            assert r.arrival_ms[i] == r.finish_ms[i - 1] + 250
    # turn 2's hit: turn 1's prompt and output but its last token, in full blocks
    assert r.first_admission_cached_tokens[1] == (100 + 19) // 16 * 16
    assert r.first_admission_cached_tokens[2] == (220 + 19) // 16 * 16


def test_synthetic_sessions_share_a_prefix_within_a_group():
    from servesim.config.config import config_from_dict

    # trace blocks of 32 engine blocks = 512 tokens; a first prompt of 1024 has
    # 2, half of them (1) shared by the sessions of a group; group of s = s % 2.
    cfg = config_from_dict(synthetic_sessions(count=4, turns=1, new_input_tokens=1024,
                                              shared_prefix_ratio=0.5, prefix_groups=2))
    w = load_workload(cfg.workload, 16)
    first = [w.hash_flat[w.hash_offsets[i]] for i in range(4)]
    assert first[0] == first[2] != first[1] == first[3]
    assert w.hash_flat[w.hash_offsets[0] + 1] != w.hash_flat[w.hash_offsets[2] + 1]


def _limited_summary(data, limit):
    from servesim.replay.api import run as api_run

    report = api_run(data, limit=limit)
    return report.summary["sessions"], report.result.warnings


def test_a_limit_that_cuts_a_session_reports_it_cut_not_completed():
    # 3 sessions of 3 turns, session by session: --limit 7 keeps s0 and s1 whole
    # and s2's first turn only. s2 is not completed (its later turns never run):
    # completed 2 of 3, 1 truncated, and the run says so. --limit 6 cuts none.
    data = synthetic_sessions(count=3, turns=3, new_input_tokens=100, output_tokens=4,
                              think_time=10)
    sessions, warnings = _limited_summary(data, 7)
    assert (sessions["sessions"], sessions["completed_sessions"],
            sessions["truncated_sessions"]) == (3, 2, 1)
    assert len(warnings) == 1 and warnings[0].startswith(
        "workload.limit=7 cuts 1 session(s) short (2): their later turns are not replayed")
    sessions, warnings = _limited_summary(data, 6)
    assert (sessions["sessions"], sessions["completed_sessions"]) == (2, 2)
    assert "truncated_sessions" not in sessions and warnings == []


@pytest.mark.parametrize("fmt, rows, limit, cut", [
    # interleaved chat sessions: a's second turn is row 3, beyond --limit 2
    ("mooncake", [row(16, 1, [1], session_id="a", timestamp=0),
                  row(16, 1, [2], session_id="b", timestamp=1),
                  row(32, 1, [1, 3], session_id="a", delay=1)], 2, ["a"]),
    ("mooncake", [row(16, 1, [1], session_id="a", timestamp=0),
                  row(16, 1, [2], timestamp=1),  # a one-turn request: never cut
                  row(32, 1, [1, 3], session_id="b", timestamp=2)], 2, []),
    ("mooncake-delta", [row(16, 1, [1], session_id="a", timestamp=0),
                        row(16, 1, [2], session_id="a", delay=1)], 1, ["a"]),
    # an agent graph: c (row 3, no session_id) waits for a, so a's graph is cut
    ("agentic_mooncake", [row(16, 1, [1], request_id="a", timestamp=0),
                          row(16, 1, [2], request_id="b", timestamp=0),
                          row(16, 1, [3], request_id="c", wait_for=["a"])], 2, ["a"]),
])
def test_a_limited_session_trace_marks_the_sessions_it_cuts(tmp_path, fmt, rows, limit, cut):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    w = load_workload(WorkloadConfig(trace=str(path), format=fmt, trace_block_size=16,
                                     limit=limit), 16)
    plan = w.sessions
    truncated = [] if plan.truncated is None else [
        name for name, t in zip(plan.session_ids, plan.truncated.tolist()) if t]
    assert truncated == cut
    s = summarize(simulate(make_config(), w), {}, 0.0)["sessions"]
    assert s["completed_sessions"] == len(plan.session_ids) - len(cut)


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("cluster", [None, {"workers": 3, "router": "least_prefill"},
                                     {"workers": 3, "router": "session_affinity"}])
def test_runs_without_the_pass_log_give_the_logged_results(async_scheduling, cluster):
    # no pass log: a worker runs passes in its compiled loop up to the
    # sessions' horizon (it may run ahead of the others by the smallest think
    # time) and returns at every finish; with the log, several workers stop at
    # every event to log their passes in order. Both must give the same results
    from servesim.config.config import config_from_dict

    data = synthetic_sessions(count=40, turns=3, new_input_tokens={"distribution": "uniform",
                              "min": 50, "max": 400}, output_tokens={"distribution": "uniform",
                              "min": 5, "max": 60}, think_time={"distribution": "uniform",
                              "min": 1, "max": 300}, sessions_per_second=20,
                              shared_prefix_ratio=0.5, prefix_groups=3)
    data["engine"]["async_scheduling"] = async_scheduling
    if cluster is not None:
        data["cluster"] = cluster
    data["output"] = {"pass_log": True}
    logged_cfg = config_from_dict(data)
    data["output"] = {"pass_log": False}
    cfg = config_from_dict(data)
    w = load_workload(cfg.workload, 16)
    ref = simulate(logged_cfg, w).records
    fast = simulate(cfg, w).records
    for name in ("arrival_ms", "first_token_ms", "finish_ms", "first_admission_cached_tokens"):
        np.testing.assert_array_equal(getattr(ref, name), getattr(fast, name))
    assert np.isfinite(ref.finish_ms).all()


def test_outputs_carry_session_and_turn_and_the_summary_per_turn_figures(tmp_path):
    rows = [row(32, 3, [1, 2], session_id="s", timestamp=0, request_id="t0"),
            row(64, 2, [1, 2, 3, 4], session_id="s", delay=5, request_id="t1"),
            row(16, 1, [9], timestamp=1)]
    w = trace(tmp_path, rows)
    cfg = make_config(output={"pass_log": False})
    result = simulate(cfg, w)
    lines = [json.loads(x) for chunk in request_lines(result) for x in chunk]
    assert [(x["id"], x["session_id"], x["turn"]) for x in lines] == [
        ("t0", "s", 0), ("t1", "s", 1), ("2", "2", 0)]
    assert list(lines[0])[:3] == ["id", "session_id", "turn"]
    s = summarize(result, {}, 1.0)["sessions"]
    assert (s["sessions"], s["completed_sessions"], s["turns_max"]) == (2, 2, 2)
    # t0 TTFT 10; the one-turn row arrives at 1 during pass [0,10], joins
    # [10,20]: 19; t1 10 (arrives 30 + 5, token 45)
    assert s["ttft_ms_mean_by_turn"] == [14.5, 10.0]
    assert s["prefix_cache_hit_rate_by_turn"] == [0.0, 0.5]  # 32 of t1's 64
    assert s["duration_ms"]["max"] == 55.0  # session s: 0 to t1's last token


def test_independent_requests_keep_their_outputs(tmp_path):
    # without session fields nothing session-shaped appears
    w = trace(tmp_path, [row(16, 1, [1], timestamp=0)])
    result = simulate(make_config(output={"pass_log": False}), w)
    assert result.records.session is None
    line = json.loads(next(iter(request_lines(result)))[0])
    assert "session_id" not in line
    assert "sessions" not in summarize(result, {}, 1.0)


# ------------------------------------------------------------------ bad input

CONFIG = """\
workload:
  trace: {trace}
  format: {fmt}
  trace_block_size: 16
engine:
  block_size: 16
  num_gpu_blocks: 256
  timing: {{type: fixed, prefill_ms: 10.0, decode_ms: 5.0}}
"""


@pytest.mark.parametrize("fmt, rows, line, words", [
    ("mooncake", [row(16, 1, [1], session_id="s", timestamp=0, delay=5)], 1, "first turn"),
    ("mooncake", [row(16, 1, [1], session_id="s", timestamp=0),
                  row(16, 1, [1], session_id="s", delay=-1)], 2, "negative delay"),
    ("agentic_mooncake", [row(16, 1, [1], request_id="a", timestamp=0),
                          row(16, 1, [2], request_id="b", wait_for=["c"]),
                          row(16, 1, [3], request_id="c", wait_for=["b"])], 2, "cycle"),
    ("agentic_mooncake", [row(16, 1, [1], request_id="a", timestamp=0),
                          row(16, 1, [2], request_id="b", wait_for=["zz"])], 2, "unknown"),
    ("mooncake-delta", [row(16, 1, [1], session_id="s", timestamp=0),
                        row(-4, 1, [], session_id="s", delay=1)], 2, "shrink"),
    # vLLM refuses an empty prompt: a first turn carries the whole prompt
    ("mooncake-delta", [row(16, 1, [1], session_id="s", timestamp=0),
                        row(0, 1, [], session_id="t", timestamp=1)], 2, "input_length 0: a session's first turn"),
    ("mooncake-delta", [row(-3, 1, [], session_id="s", timestamp=0)], 1, "at least 1 token"),
    ("agentic_mooncake", [{"schema": "dynamo.agentic_mooncake", "version": 2, "block_size": 16},
                          dict(row(16, 1, [1], request_id="a", not_before_ms=0), session_id="g"),
                          dict(row(16, 1, [2], request_id="b", session_id="g"),
                               dependencies=[{"request_id": "a", "trigger": "dispatch",
                                              "delay_ms": 0, "relation": "spawn"}])],
     3, "trigger"),
])
def test_bad_session_input_exits_2_naming_file_and_line(tmp_path, fmt, rows, line, words):
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = tmp_path / "c.yaml"
    config.write_text(CONFIG.format(trace=path, fmt=fmt))
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["run", str(config), "-o", str(out)])
    assert result.exit_code == 2, result.output
    assert f"{path}:{line}:" in result.output
    assert words in result.output
    assert "Traceback" not in result.output
    assert not out.exists()


def test_session_rows_carry_their_accepted_lists(tmp_path):
    # k = 2 with acceptance rates 1: without a list every draft is accepted.
    # t0 (P=16, O=3, accepted [2]): pass 1 verifies 2 drafts, accepts 2 (3 tokens,
    # trimmed to its last); t1 (accepted [0]) and t2 (O=3, none) follow: t1's two
    # verifications accept none, t2's first accepts 2.
    rows = [row(16, 3, [1], session_id="s", timestamp=0, request_id="t0", accepted=[2]),
            row(32, 3, [1, 2], session_id="s", delay=5, request_id="t1", accepted=[0]),
            row(48, 3, [1, 2, 3], session_id="s", delay=5, request_id="t2")]
    w = trace(tmp_path, rows)
    assert w.accepted_values.tolist() == [2, 0] and w.accepted_offsets.tolist() == [0, 1, 2, 2]
    cfg = make_config(speculative={"method": "mtp", "num_speculative_tokens": 2,
                                   "acceptance_rates": [1.0, 1.0]})
    records, _ = run(cfg, w)
    assert records.spec_accepted.tolist() == [2, 0, 2]


def test_an_agent_graph_after_a_header_names_the_line_of_a_bad_accepted_list(tmp_path):
    from servesim.errors import InputError

    rows = [{"schema": "dynamo.agentic_mooncake", "version": 2, "block_size": 16},
            dict(row(16, 1, [1], request_id="a", not_before_ms=0), session_id="g"),
            dict(row(16, 1, [2], request_id="b", session_id="g", accepted=[-1]),
                 dependencies=[{"request_id": "a", "trigger": "completion", "delay_ms": 0,
                                "relation": "sequence"}])]
    with pytest.raises(InputError, match=r"t.jsonl:3: accepted must be a non-empty list"):
        trace(tmp_path, rows, fmt="agentic_mooncake")
    from servesim.config.speculative_config import check_accepted

    rows[2]["accepted"] = [3]  # over k = 2: checked against the config, same line
    with pytest.raises(InputError, match=r"t.jsonl:3: accepted: entries must be in 0..2"):
        check_accepted(trace(tmp_path, rows, fmt="agentic_mooncake"), 2)


def test_sessions_need_an_aggregated_cluster(tmp_path):
    from servesim.errors import InputError

    w = trace(tmp_path, [row(16, 1, [1], session_id="s", timestamp=0)])
    cfg = make_config(cluster={"mode": "disaggregated", "prefill_workers": 1,
                               "decode_workers": 1,
                               "kv_transfer": {"bytes_per_token": 1000, "bandwidth_gbps": 10}})
    with pytest.raises(InputError, match="aggregated"):
        simulate(cfg, w)


def test_the_run_table_shows_the_sessions(tmp_path):
    path = tmp_path / "s.jsonl"
    rows = [row(16, 2, [1], session_id="s", timestamp=0), row(16, 2, [3], session_id="t", timestamp=1),
            row(32, 2, [1, 2], session_id="s", delay=5)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = tmp_path / "c.yaml"
    config.write_text(CONFIG.format(trace=path, fmt="mooncake"))
    result = CliRunner().invoke(main, ["run", str(config), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    s = json.loads((tmp_path / "out" / "summary.json").read_text())["sessions"]
    assert (s["sessions"], s["completed_sessions"], s["turns_max"]) == (2, 2, 2)
    assert "sessions        2 (2 completed), 1.50 turns mean, 2 max\n" in result.output
    first, later = s["ttft_ms_first_turn"]["mean"], s["ttft_ms_later_turns"]["mean"]
    assert (f"  turns         TTFT mean first {first:.2f} ms, later {later:.2f} ms; prefix hit first "
            f"{s['prefix_cache_hit_rate_first_turn'] * 100:.1f}%, later "
            f"{s['prefix_cache_hit_rate_later_turns'] * 100:.1f}%\n") in result.output
    # --limit 2 cuts session s short
    cut = CliRunner().invoke(main, ["run", str(config), "-o", str(tmp_path / "cut"), "--limit", "2"])
    assert cut.exit_code == 0 and "sessions        2 (1 completed, 1 cut by workload.limit)" in cut.output


def test_telemetry_on_a_session_trace_spans_the_known_arrivals(tmp_path):
    # later turns have no arrival before the run (NaN): the telemetry bound
    # checks the first turns' span, and the run writes its samples
    path = tmp_path / "s.jsonl"
    rows = [row(16, 2, [1], session_id="s", timestamp=0), row(16, 2, [2], session_id="s", delay=5)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = tmp_path / "c.yaml"
    config.write_text(CONFIG.format(trace=path, fmt="mooncake"))
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["run", str(config), "-o", str(out), "-q",
                                       "--telemetry-interval-ms", "10"])
    assert result.exit_code == 0, result.output
    assert (out / "telemetry.jsonl").read_text().count("\n") >= 2
