"""The one exception type for bad input.

Every invalid config key, trace line or flag raises :class:`InputError` with a
message that names the file, line or key path; the CLI maps it to exit code 2
and prints the message without a traceback.
"""


class InputError(Exception):
    """Invalid user input: a config key, a trace row, a flag."""
