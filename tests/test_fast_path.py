"""The compiled path gives exactly the reference path's results.

The compiled scheduler (servesim/scheduler/fast.py) and the compiled pass loop
(servesim/engine/fast_run.py) must reproduce the reference scheduler pass by
pass byte for byte: pass logs, request records, run counters and telemetry, on
random workloads and engine configs.
"""

import attrs
import numpy as np
from hypothesis import given, settings, strategies as st

from servesim.replay.driver import simulate
from servesim.results.output import dict_lines
from helpers import build, engines, make_config, make_workload, requests

def same_records(a, b):
    for field in attrs.fields(type(a)):
        x, y = getattr(a, field.name), getattr(b, field.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype, field.name
            assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), field.name
        else:
            assert x == y, field.name


def same_results(a, b):
    same_records(a.records, b.records)
    assert attrs.asdict(a.stats) == attrs.asdict(b.stats)
    assert a.pass_log == b.pass_log
    assert a.telemetry == b.telemetry


@settings(max_examples=150, deadline=None)
@given(requests, engines)
def test_compiled_scheduler_gives_the_reference_pass_log(spec, engine):
    config, workload = build(spec, engine)           # pass log on: in the compiled buffer
    same_results(simulate(config, workload, path="fast"),
                 simulate(config, workload, path="reference"))


@settings(max_examples=150, deadline=None)
@given(requests, engines, st.sampled_from([None, 7.0, 50.0]))
def test_compiled_runs_of_passes_give_the_reference_results(spec, engine, interval):
    # pass log off
    config, workload = build(spec, engine, output={"pass_log": False,
                                                  "telemetry_interval_ms": interval})
    same_results(simulate(config, workload, path="fast"),
                 simulate(config, workload, path="reference"))


@settings(max_examples=60, deadline=None)
@given(requests, engines, st.integers(1, 4), st.sampled_from(["round_robin", "least_loaded", "kv_aware"]),
       st.sampled_from([None, 2, 5]))
def test_compiled_path_across_workers_and_closed_loop(spec, engine, workers, router, concurrency):
    config, workload = build(spec, engine, output={"pass_log": False},
                             cluster={"workers": workers, "router": router})
    workload = attrs.evolve(workload, concurrency=concurrency)
    same_results(simulate(config, workload, path="fast"),
                 simulate(config, workload, path="reference"))


LAUNCHES = st.sampled_from([None, {"decode_ms": 2.0, "piecewise_ms": 5.0, "eager_ms": 9.0,
                                   "eager_queue_fraction": 0.4,
                                   "max_cudagraph_capture_size": 32}])


@settings(max_examples=80, deadline=None)
@given(requests, engines, st.integers(1, 3), st.integers(1, 2), LAUNCHES, st.booleans(),
       st.sampled_from([None, 3]), st.sampled_from([0.0, 0.3]))
def test_compiled_pass_loop_across_ranks_launch_and_pass_log(spec, engine, dp, workers, launch,
                                                             pass_log, concurrency, detokenize):
    # the compiled loop runs attention-DP ranks in lockstep, launch timing
    # (async) and the pass log in its buffer; the reference path runs pass by pass
    engine = dict(engine, detokenize_ms=detokenize)
    if launch is not None:
        engine.update(launch=launch, async_scheduling=True)
    config, workload = build(spec, engine, output={"pass_log": pass_log,
                                                  "telemetry_interval_ms": 20.0},
                             cluster={"workers": workers, "data_parallel_size": dp})
    workload = attrs.evolve(workload, concurrency=concurrency)
    a = simulate(config, workload, path="fast")
    b = simulate(config, workload, path="reference")
    same_results(a, b)
    assert a.telemetry == b.telemetry
    if pass_log:
        assert len(a.pass_log) == len(b.pass_log)
        assert list(a.pass_log) == b.pass_log
        lines = [line for chunk in a.pass_log.lines(chunk=3) for line in chunk]
        assert lines == dict_lines(b.pass_log)
