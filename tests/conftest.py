"""Test-session settings: the property tests (tests/test_*_properties.py)
run with the debug mode's invariant check on (SERVESIM_CHECK=1,
servesim/scheduler/check.py), so every pass of every generated run is
checked."""

import pytest


@pytest.fixture(autouse=True, scope="module")
def _invariant_check_in_property_tests(request):
    if not request.module.__name__.endswith("_properties"):
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SERVESIM_CHECK", "1")
        yield
