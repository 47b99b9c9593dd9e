"""Test configuration: tests/ on sys.path, so every test module imports what
it shares one way (`from helpers import ...`, `from fpm_synth import ...`,
`from regression.cases import ...`) from any directory pytest starts in; the
fixtures shared between test modules; the Hypothesis profiles; and the debug
mode's invariant check (SERVESIM_CHECK=1, servesim/scheduler/check.py), on in
the property tests (tests/test_*_properties.py) so every pass of every
generated run is checked.

Hypothesis profiles (each module's own `settings` keep their example counts
and deadlines; a profile fills in the rest):
- `servesim` (the default): `derandomize=True`, so every run, CI's included,
  tries the same examples (seeded from each test's source) and a green suite
  stays green; `print_blob=True`, so a failure prints the
  `@reproduce_failure(...)` line that replays it.
- `explore` (`HYPOTHESIS_PROFILE=explore`): random examples, for hunting new
  bugs locally; `--hypothesis-seed=N` then picks the seed (README.md,
  "Testing and debugging").
The profile is loaded here before anything builds a `settings` object
(helpers.SETTINGS below), since a `settings` object copies the profile that
is loaded when it is made."""

import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

settings.register_profile("servesim", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "servesim"))

TESTS = str(Path(__file__).resolve().parent)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

from helpers import TINY  # noqa: E402  (tests/ is on sys.path from here)


def pytest_collection_modifyitems(items):
    """The cold-compile test (tests/test_faults.py, marked `cold_compile`)
    runs first: on a cold cache its compile fills the suite's cache."""
    items.sort(key=lambda item: item.get_closest_marker("cold_compile") is None)


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
