"""The exception types: bad input, and a broken invariant (debug mode); and
how warnings reach the terminal.

Every invalid config key, trace line or flag raises :class:`InputError` with a
message that names the file, line or key path; the CLI maps it to exit code 2
and prints the message without a traceback.

A Python warning is shown as one line `warning: TEXT` on stderr, each text
once, with no source path or code line (README "Errors and faults"): the CLI
shows warnings so while a command runs (`cli/main.py`), and so does every
local worker process of a sweep or a search (`sweep/executors.py`), so a
message that probes or points repeat is printed once.
"""

import contextlib
import sys
import warnings


class InputError(Exception):
    """Invalid user input: a config key, a trace row, a flag."""


class InvariantError(Exception):
    """A scheduler invariant broke (the debug mode, `SERVESIM_CHECK=1`):
    a bug in servesim, not in the input. Raised by the compiled check with
    `(code, where, pass, request, block, actual, expected)`
    (servesim/scheduler/check.py); the replay re-raises it with one message
    naming the request by its id. The CLI prints that message and exits 1,
    with the traceback only when SERVESIM_DEBUG is set."""

    def __str__(self):
        if len(self.args) == 7:  # as raised by the kernel (check.describe names it)
            return ("invariant {} violated (where {}, pass {}, request #{}, block {}): "
                    "found {}, expected {}".format(*self.args))
        return super().__str__()


def _shower(shown: set):
    def show(message, category, filename, lineno, file=None, line=None):
        text = str(message)
        if text in shown:
            return
        shown.add(text)
        stream = sys.stderr if file is None else file
        try:
            stream.write(f"warning: {text}\n")
            stream.flush()
        except (OSError, ValueError, AttributeError):  # no stderr to write to, as Python's own
            pass

    return show


def show_warnings_as_lines() -> None:
    """For the rest of this process (a worker's initializer)."""
    warnings.showwarning = _shower(set())
    warnings.simplefilter("always", UserWarning)  # shown once by text here, not once per source line


@contextlib.contextmanager
def warnings_as_lines():
    """While the block runs (a CLI command); the warning filters and the
    shower are restored after it."""
    with warnings.catch_warnings():
        show_warnings_as_lines()
        yield
