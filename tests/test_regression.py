"""Outputs byte-identical to those of the code before the one-scheduler
refactor (issue 14): every case of tests/regression/cases.py, with and without
the pass log, against the sha256 digests frozen in tests/regression/frozen.json."""

import json
import os

import pytest

from regression.cases import cases
from regression.freeze import run_case

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "regression", "frozen.json")) as f:
    FROZEN = json.load(f)
CASES = cases()


@pytest.mark.parametrize("key", sorted(FROZEN))
def test_outputs_match_the_frozen_digests(key, tmp_path):
    name, mode = key.rsplit("-", 1)
    found = run_case(name, CASES[name], mode == "passlog", str(tmp_path))
    assert found == FROZEN[key]
