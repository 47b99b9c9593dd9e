"""The compiled path gives exactly the reference path's results.

The compiled scheduler (servesim/scheduler/fast.py) and compiled runs of
synchronous passes (servesim/engine/fast_run.py) must reproduce the reference
scheduler byte for byte: pass logs, request records, run counters and
telemetry, on random workloads and engine configs.
"""

import attrs
import numpy as np
from hypothesis import given, settings, strategies as st

from servesim.replay.driver import simulate
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
    same_records(a.records, b.records)
    assert attrs.asdict(a.stats) == attrs.asdict(b.stats)
    assert a.pass_log == b.pass_log
    assert a.telemetry == b.telemetry


@settings(max_examples=150, deadline=None)
@given(requests, engines)
def test_compiled_scheduler_gives_the_reference_pass_log(spec, engine):
    config, workload = build(spec, engine)           # pass log on: pass by pass
    same_results(simulate(config, workload, path="fast"),
                 simulate(config, workload, path="reference"))


@settings(max_examples=150, deadline=None)
@given(requests, engines, st.sampled_from([None, 7.0, 50.0]))
def test_compiled_runs_of_passes_give_the_reference_results(spec, engine, interval):
    # pass log off, so synchronous runs of passes go through engine/fast_run.py
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
