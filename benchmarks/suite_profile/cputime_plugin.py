"""Measurement only: `pytest -p cputime_plugin` (this folder on PYTHONPATH) appends
each test's wall seconds, CPU seconds of the pytest process and CPU seconds of the
child processes it waited for to $SUITE_TIMES_LOG, one JSON line a test."""

import json
import os
import time

import pytest

OUT = os.environ.get("SUITE_TIMES_LOG", "suite-times.jsonl")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    start, before = time.perf_counter(), os.times()
    yield
    after = os.times()
    row = dict(test=item.nodeid, wall=round(time.perf_counter() - start, 3),
               cpu=round(after.user - before.user + after.system - before.system, 3),
               child_cpu=round(after.children_user - before.children_user
                               + after.children_system - before.children_system, 3))
    with open(OUT, "a") as fh:
        fh.write(json.dumps(row) + "\n")
