"""Measurement only (benchmarks/RESULTS.md, 2026-12-07 "start-up and the suite"):
put this folder on PYTHONPATH with SUITE_COMPILE_LOG=FILE and every Numba compile
(a `numba:compile` event: one kernel specialization, a cache miss) of this process
and its child processes is appended to FILE as a JSON line with the pytest test
running (PYTEST_CURRENT_TEST, which child processes inherit), the kernel, its
argument types and its seconds (own, and with the kernels it compiled inside)."""

import os
import sys

LOG = os.environ.get("SUITE_COMPILE_LOG")

if LOG:
    import importlib.abc
    import importlib.util
    import json
    import time

    def _listen():
        from numba.core import event

        stack = []

        class Compiles(event.Listener):
            def on_start(self, ev):
                stack.append([time.perf_counter(), 0.0])

            def on_end(self, ev):
                start, nested = stack.pop()
                took = time.perf_counter() - start
                if stack:
                    stack[-1][1] += took
                data = ev.data or {}
                func = getattr(data.get("dispatcher"), "py_func", None)
                row = dict(test=os.environ.get("PYTEST_CURRENT_TEST", ""), pid=os.getpid(),
                           kernel=f"{getattr(func, '__module__', '?')}:{getattr(func, '__qualname__', '?')}",
                           sig=str(data.get("args")), self_s=round(took - nested, 4),
                           total_s=round(took, 4), depth=len(stack))
                with open(LOG, "a") as fh:
                    fh.write(json.dumps(row) + "\n")

        event.register("numba:compile", Compiles())

    class _AfterDispatcher(importlib.abc.MetaPathFinder):
        """Listens once numba.core.dispatcher (which defines the events) is imported."""

        def find_spec(self, name, path, target=None):
            if name != "numba.core.dispatcher":
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                _listen()

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _AfterDispatcher())
