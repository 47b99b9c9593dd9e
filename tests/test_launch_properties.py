"""Property tests of launch timing (docs/engine.md §8) on random workloads."""

import numpy as np
from hypothesis import given, settings, strategies as st

from helpers import make_config, make_workload, run

FIXED = {"type": "fixed", "prefill_ms": 30, "decode_ms": 5}

rows = st.lists(
    st.tuples(st.integers(0, 200), st.integers(1, 80), st.integers(1, 12)),
    min_size=1, max_size=8)
launches = st.fixed_dictionaries({
    "decode_ms": st.sampled_from([0.0, 1.0, 3.0]),
    "piecewise_ms": st.sampled_from([0.0, 10.0, 40.0]),
    "eager_ms": st.sampled_from([0.0, 25.0, 90.0]),
    "eager_queue_fraction": st.sampled_from([0.0, 0.4, 1.0]),
    "max_cudagraph_capture_size": st.sampled_from([8, 32, 64]),
})


def workload(spec, burst):
    spec = sorted(spec) if not burst else spec
    return make_workload([{"id": f"r{i}", "t": 0 if burst else t, "P": P, "O": O}
                          for i, (t, P, O) in enumerate(spec)])


def engine(launch, detokenize_ms=0.0):
    return make_config(timing=FIXED, async_scheduling=True, launch=launch,
                       max_num_batched_tokens=64, num_gpu_blocks=64,
                       detokenize_ms=detokenize_ms)


def shape(passes):
    return [(p["start_ms"], p["end_ms"], p["scheduled"], p["preempted"]) for p in passes]


@settings(max_examples=60, deadline=None)
@given(rows, launches)
def test_launch_never_moves_passes_when_all_requests_are_waiting(spec, launch):
    # With every request waiting from the start, decisions moved by launch see
    # the same queues: the passes and their GPU times are those without launch.
    w = workload(spec, burst=True)
    _, with_launch = run(engine(launch), w)
    _, without = run(engine(None), w)
    assert shape(with_launch) == shape(without)


@settings(max_examples=60, deadline=None)
@given(rows)
def test_zero_launch_costs_give_the_async_run(spec):
    zero = {"decode_ms": 0, "piecewise_ms": 0, "eager_ms": 0,
            "eager_queue_fraction": 0.0, "max_cudagraph_capture_size": 16}
    w = workload(spec, burst=False)
    r1, p1 = run(engine(zero), w)
    r2, p2 = run(engine(None), w)
    assert shape(p1) == shape(p2)
    assert np.array_equal(r1.token_client_ms, r2.token_client_ms)


@settings(max_examples=60, deadline=None)
@given(rows, launches, st.sampled_from([0.0, 1.0, 7.5]))
def test_outputs_never_leave_before_their_pass_ends(spec, launch, detok):
    w = workload(spec, burst=False)
    records, passes = run(engine(launch, detok), w)
    end_of = {}
    for p in passes:
        assert p["decided_ms"] <= p["launch_end_ms"] <= p["end_ms"]
        assert p["start_ms"] >= p["decided_ms"]
        end_of[p["pass"]] = p["end_ms"]
    for i in range(len(records.ids)):
        a, b = records.token_offsets[i], records.token_offsets[i + 1]
        times = records.token_client_ms[a:b]
        assert np.all(np.diff(times) >= detok)  # monotone, one detokenization apart
        if b > a:
            assert times[0] >= end_of[records.first_token_pass[i]] + detok
            assert times[-1] >= end_of[records.finish_pass[i]] + detok
            assert times[0] >= records.arrival_ms[i]
