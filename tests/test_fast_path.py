"""The compiled pass loop's ways of running agree.

A worker without KV transfers runs its passes inside one compiled loop
(servesim/engine/fast_run.py). With the pass log on it writes the log into its
buffer and, with several workers, stops at every event so that passes go into
the log in event order; with it off it runs up to the next outside event
(arrival, telemetry tick, a closed loop's release). Both must give the same
request records, run counters and telemetry, on random workloads and engine
configs, and a run is deterministic. The rules themselves are held to
hand-worked timelines in tests/test_engine_rules.py.
"""

import attrs
import numpy as np
from hypothesis import given, settings, strategies as st

from servesim.replay.driver import simulate
from servesim.results.output import dict_lines
from helpers import build, engines, requests

def same_records(a, b):
    for field in attrs.fields(type(a)):
        x, y = getattr(a, field.name), getattr(b, field.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype, field.name
            assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), field.name
        else:
            assert x == y, field.name


def same_results(a, b):
    """Same records, counters and telemetry (the pass log aside)."""
    same_records(a.records, b.records)
    assert attrs.asdict(a.stats) == attrs.asdict(b.stats)
    assert a.telemetry == b.telemetry


def with_pass_log(config, on):
    return attrs.evolve(config, output=attrs.evolve(config.output, pass_log=on))


@settings(max_examples=100, deadline=None)
@given(requests, engines)
def test_a_run_is_deterministic(spec, engine):
    config, workload = build(spec, engine)           # pass log on: in the compiled buffer
    a, b = simulate(config, workload), simulate(config, workload)
    same_results(a, b)
    assert list(a.pass_log) == list(b.pass_log)


@settings(max_examples=150, deadline=None)
@given(requests, engines, st.sampled_from([None, 7.0, 50.0]))
def test_runs_without_the_pass_log_give_the_logged_results(spec, engine, interval):
    config, workload = build(spec, engine, output={"pass_log": False,
                                                  "telemetry_interval_ms": interval})
    same_results(simulate(config, workload), simulate(with_pass_log(config, True), workload))


@settings(max_examples=60, deadline=None)
@given(requests, engines, st.integers(1, 4), st.sampled_from(["round_robin", "least_loaded", "kv_aware"]),
       st.sampled_from([None, 2, 5]))
def test_compiled_runs_across_workers_and_closed_loop(spec, engine, workers, router, concurrency):
    config, workload = build(spec, engine, output={"pass_log": False},
                             cluster={"workers": workers, "router": router})
    workload = attrs.evolve(workload, concurrency=concurrency)
    same_results(simulate(config, workload), simulate(with_pass_log(config, True), workload))


LAUNCHES = st.sampled_from([None, {"decode_ms": 2.0, "piecewise_ms": 5.0, "eager_ms": 9.0,
                                   "eager_queue_fraction": 0.4,
                                   "max_cudagraph_capture_size": 32}])


@settings(max_examples=80, deadline=None)
@given(requests, engines, st.integers(1, 3), st.integers(1, 2), LAUNCHES, st.booleans(),
       st.sampled_from([None, 3]), st.sampled_from([0.0, 0.3]))
def test_compiled_pass_loop_across_ranks_launch_and_pass_log(spec, engine, dp, workers, launch,
                                                             pass_log, concurrency, detokenize):
    # the compiled loop runs attention-DP ranks in lockstep, launch timing
    # (async) and the pass log in its buffer; with the log off it runs further
    engine = dict(engine, detokenize_ms=detokenize)
    if launch is not None:
        engine.update(launch=launch, async_scheduling=True)
    config, workload = build(spec, engine, output={"pass_log": pass_log,
                                                  "telemetry_interval_ms": 20.0},
                             cluster={"workers": workers, "data_parallel_size": dp})
    workload = attrs.evolve(workload, concurrency=concurrency)
    a = simulate(config, workload)
    b = simulate(with_pass_log(config, not pass_log), workload)
    same_results(a, b)
    log = a.pass_log if pass_log else b.pass_log
    lines = [line for chunk in log.lines(chunk=3) for line in chunk]
    assert lines == dict_lines(list(log))
    assert len(log) == len(list(log))
