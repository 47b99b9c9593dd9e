"""Ctrl-C that nothing can lose.

Python turns Ctrl-C into a KeyboardInterrupt raised wherever the main thread
is. While Numba compiles, that is often inside a callback that C code made
into Python (llvmlite's object cache); ctypes prints "Exception ignored on
calling ctypes callback function ... KeyboardInterrupt" and carries on, so the
interrupt would be lost and the run would finish and write its outputs.
`remembered()` keeps a note of every Ctrl-C as well: `check()` raises it again
at the next safe point (after the run, before its outputs are written), and an
error that comes out after it (what the swallowed interrupt broke) is reported
as the interrupt.
"""

import contextlib
import signal
import sys
import threading


class _CtrlC:
    def __init__(self):
        self.pressed = False

    def check(self):
        """Raise KeyboardInterrupt if Ctrl-C was pressed, even if the
        exception it raised then was swallowed."""
        if self.pressed:
            raise KeyboardInterrupt

    def _handler(self, signum, frame):
        self.pressed = True
        raise KeyboardInterrupt

    def _unraisable(self, previous):
        """The hook for exceptions C code swallows: a KeyboardInterrupt from
        our own Ctrl-C is already remembered (and raised again by `check()`),
        so its "Exception ignored ... Traceback" report is not printed; every
        other report goes to the hook that was there before."""
        def hook(unraisable):
            if self.pressed and unraisable.exc_type is KeyboardInterrupt:
                return
            previous(unraisable)
        return hook


@contextlib.contextmanager
def remembered():
    """Within it, Ctrl-C raises KeyboardInterrupt as usual and is also
    remembered (`check()`). A process that ignores SIGINT (started as a
    shell's background job) keeps ignoring it; off the main thread, which
    never sees the signal, nothing changes."""
    ctrl_c = _CtrlC()
    previous = signal.getsignal(signal.SIGINT)
    if (previous is not signal.default_int_handler
            or threading.current_thread() is not threading.main_thread()):
        yield ctrl_c
        return
    signal.signal(signal.SIGINT, ctrl_c._handler)
    previous_hook = sys.unraisablehook
    sys.unraisablehook = ctrl_c._unraisable(previous_hook)
    try:
        yield ctrl_c
    except Exception:
        # what failed because its interrupt was swallowed (Numba then finds
        # no object code for the function it was compiling) was interrupted
        if ctrl_c.pressed:
            raise KeyboardInterrupt from None
        raise
    finally:
        sys.unraisablehook = previous_hook
        signal.signal(signal.SIGINT, previous)
