"""Test configuration: tests/ on sys.path, so every test module imports what
it shares one way (`from helpers import ...`, `from fpm_synth import ...`,
`from regression.cases import ...`) from any directory pytest starts in, and
the fixtures shared between test modules. The property tests
(tests/test_*_properties.py) run with the debug mode's invariant check on
(SERVESIM_CHECK=1, servesim/scheduler/check.py), so every pass of every
generated run is checked."""

import sys
from pathlib import Path

import pytest

TESTS = str(Path(__file__).resolve().parent)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

from helpers import TINY  # noqa: E402  (tests/ is on sys.path from here)


@pytest.fixture
def tiny_config(tmp_path):
    """The CLI's tiny synthetic run (helpers.TINY) as a config file."""
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    return path


@pytest.fixture(autouse=True, scope="module")
def _invariant_check_in_property_tests(request):
    if not request.module.__name__.endswith("_properties"):
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SERVESIM_CHECK", "1")
        yield
