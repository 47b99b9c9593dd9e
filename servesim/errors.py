"""The exception types: bad input, and a broken invariant (debug mode).

Every invalid config key, trace line or flag raises :class:`InputError` with a
message that names the file, line or key path; the CLI maps it to exit code 2
and prints the message without a traceback.
"""


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
