"""The debug switches of the command line (README, "Debugging"):

- `--check` (`run`, `sweep`, `capacity`, `search`) or SERVESIM_CHECK=1: check the
  scheduler's invariants after every pass (servesim/scheduler/check.py). A
  violation is a bug in servesim: the command prints one message naming the
  pass, the request and the invariant, and exits 1.
- SERVESIM_DEBUG=1: print the traceback of such a violation too.

Light on purpose (click and os only): the CLI imports it at start.
"""

import os

import click


def _enable_check(ctx, param, value):
    if value:  # the environment carries it to sweep points run in other processes
        os.environ["SERVESIM_CHECK"] = "1"


def check_option(command):
    """The `--check` flag of a command that runs simulations."""
    return click.option(
        "--check", is_flag=True, expose_value=False, callback=_enable_check,
        help="Debug mode: check the scheduler's invariants after every pass "
             "(same as SERVESIM_CHECK=1; slower).")(command)


def traceback_wanted() -> bool:
    return os.environ.get("SERVESIM_DEBUG", "") not in ("", "0")
