"""Launch timing, output release and detokenization (docs/engine.md §8), on
timelines worked out by hand.

Common setup: fixed pricing, a pass with prompt tokens costs 100 ms and one
with decodes 10 ms (a mixed pass 110 ms); launch costs decode 2 ms, piecewise
20 ms, eager 50 ms; capture size 16 tokens; async scheduling; block size 16.
"""

from helpers import make_config, make_workload, run

FIXED = {"type": "fixed", "prefill_ms": 100, "decode_ms": 10}
LAUNCH = {"decode_ms": 2, "piecewise_ms": 20, "eager_ms": 50,
          "eager_queue_fraction": 0.0, "max_cudagraph_capture_size": 16}


def config(launch=LAUNCH, **engine):
    engine.setdefault("async_scheduling", True)
    return make_config(timing=FIXED, launch=launch, **engine)


# A (16-token prompt, 4 tokens) arrives at 0; B (32-token prompt, 2 tokens)
# at 105, during pass 1.
TWO = [{"id": "A", "t": 0, "P": 16, "O": 4}, {"id": "B", "t": 105, "P": 32, "O": 2}]


def client_times(records, i):
    a, b = records.token_offsets[i], records.token_offsets[i + 1]
    return list(records.token_client_ms[a:b])


def test_outputs_leave_when_the_next_pass_is_launched():
    # With launch:
    #  p0 decided 0: A prefill (piecewise) GPU [0,100], launch ends 0+20 = 20.
    #  p1 decided max(20, -) = 20: A decode, GPU [100,110], launch ends 22.
    #  p2 decided max(22, end p0 = 100) = 100: A decode, GPU [110,120], launch 102.
    #  B arrives at 105.
    #  p3 decided max(102, end p1 = 110) = 110: A decode + B prefill, 33 tokens
    #     > 16: eager; GPU [120,230]; launch ends max(110+50, 120+0) = 160.
    #  p4 decided max(160, end p2 = 120) = 160: B decode (A's last token is in
    #     flight), GPU [230,240], launch ends 162.
    # Releases: p0 at max(100, 22) = 100, p1 at max(110, 102) = 110,
    # p2 at max(120, 160) = 160, p3 at max(230, 162) = 230, p4 at 240.
    records, passes = run(config(), make_workload(TWO))
    assert [(p["decided_ms"], p["start_ms"], p["end_ms"], p["launch_end_ms"]) for p in passes] == [
        (0, 0, 100, 20), (20, 100, 110, 22), (100, 110, 120, 102),
        (110, 120, 230, 160), (160, 230, 240, 162)]
    assert client_times(records, 0) == [100, 110, 160, 230]
    assert client_times(records, 1) == [230, 240]


def test_without_launch_outputs_leave_at_the_pass_end():
    # Same passes, decided at 0, 0, 100, 110, 120: A's third token leaves at
    # the end of p2, 120.
    records, passes = run(config(launch=None), make_workload(TWO))
    assert [(p["decided_ms"], p["start_ms"], p["end_ms"]) for p in passes] == [
        (0, 0, 100), (0, 100, 110), (100, 110, 120), (110, 120, 230), (120, 230, 240)]
    assert client_times(records, 0) == [100, 110, 120, 230]


def test_launch_never_moves_passes():
    _, with_launch = run(config(), make_workload(TWO))
    _, without = run(config(launch=None), make_workload(TWO))
    assert [(p["start_ms"], p["end_ms"], p["scheduled"]) for p in with_launch] == \
        [(p["start_ms"], p["end_ms"], p["scheduled"]) for p in without]


def test_eager_launch_waits_for_its_queue_fraction():
    # eager_queue_fraction 0.5: p3's launch ends at max(110+50, 120+0.5*110)
    # = 175, so p2's outputs (A's third token) leave at 175 and p4 is decided
    # at 175, launching until 177.
    launch = dict(LAUNCH, eager_queue_fraction=0.5)
    records, passes = run(config(launch=launch), make_workload(TWO))
    assert passes[3]["launch_end_ms"] == 175
    assert passes[4]["decided_ms"] == 175 and passes[4]["launch_end_ms"] == 177
    assert client_times(records, 0) == [100, 110, 175, 230]


def test_a_launch_never_ends_after_its_pass():
    # eager_ms 500: p3's launch would end at 610 but its pass ends at 230.
    launch = dict(LAUNCH, eager_ms=500)
    _, passes = run(config(launch=launch), make_workload(TWO))
    assert passes[3]["launch_end_ms"] == 230


def test_an_arrival_joins_the_first_pass_decided_after_it():
    # C (16 tokens, 1 token) arrives at 10. Without launch the decisions are at
    # 0, 0, 100, ...: C joins p2 (decided at 100). With launch p1 is decided at
    # 20 > 10, so C joins p1.
    rows = [{"id": "A", "t": 0, "P": 16, "O": 4}, {"id": "C", "t": 10, "P": 16, "O": 1}]
    _, passes = run(config(), make_workload(rows))
    assert [e["id"] for e in passes[1]["scheduled"]] == ["A", "C"]
    _, passes = run(config(launch=None), make_workload(rows))
    assert [e["id"] for e in passes[1]["scheduled"]] == ["A"]
    assert [e["id"] for e in passes[2]["scheduled"]] == ["A", "C"]


def test_detokenizer_delays_each_token_in_order():
    # client(i) = max(release(i), client(i-1)) + detokenize_ms.
    # 1 ms: A's releases 100, 110, 160, 230 reach the client at 101, 111, 161, 231.
    records, _ = run(config(detokenize_ms=1.0), make_workload(TWO))
    assert client_times(records, 0) == [101, 111, 161, 231]
    assert records.first_token_ms[0] == 101 and records.finish_ms[0] == 231
    # 15 ms: 115, max(110, 115) + 15 = 130, max(160, 130) + 15 = 175, 245.
    records, _ = run(config(detokenize_ms=15.0), make_workload(TWO))
    assert client_times(records, 0) == [115, 130, 175, 245]


def test_first_scheduled_is_the_gpu_start_of_the_first_pass():
    # B is first scheduled in p3, decided at 110 but started on the GPU at 120.
    records, _ = run(config(), make_workload(TWO))
    assert records.first_scheduled_ms[1] == 120


def test_zero_launch_costs_equal_async_without_launch():
    # An eager launch with zero costs ends at its GPU start, which is the
    # decision instant async scheduling gives without launch anyway.
    zero = {"decode_ms": 0, "piecewise_ms": 0, "eager_ms": 0,
            "eager_queue_fraction": 0.0, "max_cudagraph_capture_size": 16}
    rows = TWO + [{"id": "D", "t": 111, "P": 40, "O": 3}]
    r1, p1 = run(config(launch=zero), make_workload(rows))
    r2, p2 = run(config(launch=None), make_workload(rows))
    assert [(p["start_ms"], p["end_ms"], p["scheduled"]) for p in p1] == \
        [(p["start_ms"], p["end_ms"], p["scheduled"]) for p in p2]
    assert list(r1.token_client_ms) == list(r2.token_client_ms)


# ---------------------------------------------------- eager decode-only batch

THREE = [{"id": x, "t": 0, "P": 16, "O": 3} for x in "ABC"]


def test_a_decode_only_batch_over_the_capture_size_launches_eager():
    # Three requests (16-token prompts, 3 tokens each) at 0; capture size 2,
    # so a pass of their three decodes (3 tokens, no prompt) is eager, not a
    # CUDA-graph decode.
    #  p0 decided 0: 48 prompt tokens > 2, eager: GPU [0,100], launch ends
    #     max(0+50, 0+0·100) = 50.
    #  p1 decided max(launch_end p0 = 50, -) = 50: the three decodes, eager:
    #     GPU [max(100, 50) = 100, 110], launch ends max(50+50, 100+0) = 100.
    #  p2 decided max(100, end p0 = 100) = 100: the last three decodes, eager:
    #     GPU [110,120], launch ends min(max(100+50, 110), 120) = 120.
    #  No p3 is decided (nothing left to schedule).
    # Releases: p0 at max(100, 100) = 100; p1 at max(110, launch_end p2 = 120)
    # = 120; p2 at its end, 120.
    # With capture size 16 the decode batches are decode launches (2 ms):
    # p1 launches until 52, p2 until 102, so p1's outputs leave at its end,
    # 110: the eager decode batch holds the tokens before it 10 ms longer.
    records, passes = run(config(launch=dict(LAUNCH, max_cudagraph_capture_size=2)),
                          make_workload(THREE))
    assert [(p["decided_ms"], p["start_ms"], p["end_ms"], p["launch_end_ms"])
            for p in passes] == [(0, 0, 100, 50), (50, 100, 110, 100), (100, 110, 120, 120)]
    assert [len(p["scheduled"]) for p in passes] == [3, 3, 3]
    assert all(client_times(records, i) == [100, 120, 120] for i in range(3))

    records, passes = run(config(), make_workload(THREE))
    assert [p["launch_end_ms"] for p in passes] == [50, 52, 102]
    assert all(client_times(records, i) == [100, 110, 120] for i in range(3))


# ------------------------------------- held outputs before completions

ZERO_DECODE = {"type": "fixed", "prefill_ms": 100, "decode_ms": 0}


def test_held_outputs_are_released_before_the_completion_at_the_same_instant():
    # A: 16-token prompt, 2 tokens; prefill 100 ms, decode 0 ms.
    # With launch (piecewise 20, decode 2):
    #  p0 decided 0: A's prefill, piecewise: GPU [0,100], launch ends 20.
    #  p1 decided max(20, -) = 20: A's last decode: GPU [max(100, 20), +0] =
    #     [100,100], launch ends min(22, 100) = 22.
    #  p0's first token is held until max(end p0, launch_end p1) = 100; p1's
    #  token (the completion) leaves at its end, 100, with no pass after it.
    # Both leave at 100, the held one first: token 1 then token 2. With a
    # 1 ms detokenizer: client 1 = 100 + 1 = 101, client 2 = max(100, 101) + 1
    # = 102; TTFT is token 1's time and the finish token 2's.
    # Without launch p1 is decided at 0 (its launch costs nothing) and the
    # instants are the same.
    for launch, p1_decided, p1_launch_end in ((LAUNCH, 20, 22), (None, 0, 0)):
        cfg = make_config(timing=ZERO_DECODE, launch=launch, async_scheduling=True,
                          detokenize_ms=1.0)
        records, passes = run(cfg, make_workload([{"id": "A", "t": 0, "P": 16, "O": 2}]))
        assert [(p["decided_ms"], p["start_ms"], p["end_ms"], p["launch_end_ms"])
                for p in passes] == [(0, 0, 100, 20 if launch else 0),
                                     (p1_decided, 100, 100, p1_launch_end)]
        assert client_times(records, 0) == [101, 102]
        assert records.first_token_ms[0] == 101 and records.finish_ms[0] == 102
        assert records.output_tokens[0] == 2
