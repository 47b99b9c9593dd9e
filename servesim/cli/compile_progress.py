"""What a Numba compile shows while it runs (README "Set up"): `servesim run`,
`capacity` and `warmup` watch Numba's `numba:compile` events (one per kernel
specialization compiled: a cache miss) and say on stderr how far the compile
is.

- On a terminal, one line kept up to date: kernels compiled of those
  expected, seconds spent compiling, and the seconds left by the previous
  compile's log; it ends with the kernels compiled and the seconds they took.
- On a pipe (a CI log), one line when the first kernel starts compiling,
  with the same expectation.

The log, `compile-log.json` in the kernel cache's root (servesim/cache.py),
holds each kernel's own compile seconds (nested compiles not counted twice)
and specializations as last measured, and, for each kind of run
(`features_key`: the config's features that decide what compiles), the
kernels such a run compiled. The next compile of that kind expects those of
its kernels the cache lacks, and their measured seconds; with no log for it
(the first compile of that kind), it shows the count and elapsed time only.
Nothing is shown when nothing compiles (a warm cache).
"""

import json
import os
import sys
import threading
import time
from pathlib import Path

LOG_NAME = "compile-log.json"
TICK_S = 0.5  # how often the terminal line is redrawn while compiling
_clock = time.perf_counter


def features_key(cfg) -> str:
    """The features of a resolved config that decide which kernels a run
    compiles (the compile log's key): the workload's kind, the timing, the
    cluster's shape and the engine's optional parts."""
    c, e, w = cfg.cluster, cfg.engine, cfg.workload
    tags = ["trace" if w.trace is not None else "synthetic", f"timing-{e.timing.type}"]
    sessions = (w.format in ("mooncake-delta", "agentic_mooncake")
                or (w.synthetic is not None and w.synthetic.sessions is not None))
    tags += [name for name, on in (
        ("disaggregated", c.disaggregated),
        ("cluster", not c.disaggregated and (c.workers > 1 or c.data_parallel_size > 1)),
        ("cpu-tier", e.kv_offloading is not None),
        ("speculative", e.speculative is not None),
        ("async", e.scheduler.async_scheduling),
        ("launch", e.launch is not None),
        ("sessions", sessions),
        ("concurrency", w.concurrency is not None
         or (w.synthetic is not None and w.synthetic.concurrency is not None)),
    ) if on]
    return "+".join(tags)


def for_command(config, overrides=(), quiet=False):
    """The compile's progress for a command replaying CONFIG (a path) with
    `overrides`, keyed by its features (resolved only if something
    compiles); a no-op context (giving None) when quiet."""
    import contextlib

    if quiet:
        return contextlib.nullcontext()

    def key():
        from servesim.replay.api import resolve_config

        return features_key(resolve_config(config, tuple(overrides)))

    return CompileProgress(key)


def log_path() -> Path:
    from servesim.cache import cache_root

    return Path(cache_root()) / LOG_NAME


def read_log() -> dict:
    """The compile log, or an empty one (missing or unreadable: no estimate)."""
    try:
        log = json.loads(log_path().read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return {"kernels": {}, "runs": {}}
    if not isinstance(log, dict) or not isinstance(log.get("kernels"), dict) \
            or not isinstance(log.get("runs"), dict):
        return {"kernels": {}, "runs": {}}
    return log


def _write_log(log: dict) -> None:
    """Atomically; a cache folder that cannot be written only loses the estimate."""
    path = log_path()
    tmp = path.with_name(f"{LOG_NAME}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(log, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)


def kernel_id(dispatcher):
    """`module path:qualified name` of a servesim kernel (its path under the
    package), or None for one of Numba's own (its overloads' implementations,
    compiled again in every compiling process and never cached: their time
    counts as the servesim kernel's that calls them)."""
    from servesim.cache import PACKAGE_DIR

    func = getattr(dispatcher, "py_func", None)
    try:
        rel = Path(func.__code__.co_filename).resolve().relative_to(PACKAGE_DIR)
    except (AttributeError, ValueError, OSError):
        return None
    return f"{rel.as_posix()}:{func.__qualname__}"


def expected(log: dict, key: str):
    """`(kernels, seconds)` a compile of a `key` run is expected to take, from
    the log: its kernels whose index the cache lacks, with their logged
    specializations and seconds; None when the log has no such run."""
    from servesim.cache import kernel_cached

    names = log["runs"].get(key)
    if not isinstance(names, list):
        return None
    count, seconds = 0, 0.0
    for name in names:
        entry = log["kernels"].get(name)
        path, _, qualname = name.partition(":")
        if not isinstance(entry, dict) or kernel_cached(path, qualname):
            continue
        count += int(entry.get("specializations", 1))
        seconds += float(entry.get("seconds", 0.0))
    return count, seconds


def _seconds(s: float) -> str:
    return f"{s:.0f} s" if s >= 10 else f"{s:.1f} s"


class CompileProgress:
    """Within a `with` block: the compile's progress on `stream` (stderr),
    a live line if it is a terminal, else one line. `key()` gives the run's
    `features_key`; it is called at the first compile only (a warm run pays
    nothing for it). `label` starts every line."""

    def __init__(self, key, label="compiling kernels", stream=None, live=None):
        self.key_of = key
        self.label = label
        self.stream = sys.stderr if stream is None else stream
        self.live = self.stream.isatty() if live is None else live
        self.lock = threading.RLock()
        self.key = None
        self.expect = None  # (kernels, seconds) or None
        self.done = 0
        self.compiling_s = 0.0  # seconds inside outermost compiles, finished ones
        self.burst_start = None
        self.stack = []  # [start, seconds of nested compiles] per compile in progress
        self.measured = {}  # kernel id -> [seconds, specializations]
        self.line_open = False
        self.drawn = None  # the live line's text
        self.stop = threading.Event()
        self.ticker = None

    # ----------------------------------------------------------- Numba events

    def on_start(self, ev):
        with self.lock:
            now = _clock()
            if self.key is None:
                self._begin()
            if not self.stack:
                self.burst_start = now
            self.stack.append([now, 0.0])

    def on_end(self, ev):
        with self.lock:
            now = _clock()
            start, nested = self.stack.pop()
            took = now - start
            if not self.stack:
                self.compiling_s += now - self.burst_start
            name = kernel_id((ev.data or {}).get("dispatcher"))
            if name is None:
                return  # Numba's own: its time stays its caller's
            if self.stack:
                self.stack[-1][1] += took
            entry = self.measured.setdefault(name, [0.0, 0])
            entry[0] += took - nested
            entry[1] += 1
            self.done += 1
            if self.live:
                self._draw()

    # ----------------------------------------------------------------- lines

    def _begin(self):
        try:
            self.key = self.key_of()
        except Exception:  # an estimate is not worth a failed run
            self.key = ""
        self.expect = expected(read_log(), self.key) if self.key else None
        if self.live:
            self.ticker = threading.Thread(target=self._tick, daemon=True)
            self.ticker.start()
            self._draw()
        else:
            self._write(self._first_line() + "\n")

    def _first_line(self) -> str:
        if self.expect is None or not self.expect[0]:
            return f"{self.label}, once (no earlier compile of this kind to estimate from)"
        kernels, seconds = self.expect
        return f"{self.label}, once: {kernels} expected, ~{_seconds(seconds)} (measured on the last compile)"

    def elapsed(self) -> float:
        with self.lock:
            running = _clock() - self.burst_start if self.stack else 0.0
            return self.compiling_s + running

    def _status(self) -> str:
        elapsed = self.elapsed()
        if self.expect is None or not self.expect[0]:
            return f"{self.label}: {self.done} done, {_seconds(elapsed)}"
        kernels, seconds = self.expect
        left = max(seconds - elapsed, 0.0)
        return (f"{self.label}: {min(self.done, kernels)} of {kernels} done, {_seconds(elapsed)}, "
                f"~{_seconds(left)} left")

    def _draw(self, text=None):
        text = self._status() if text is None else text
        if text != self.drawn or not self.line_open:
            self._write("\r\033[K" + text)
            self.drawn, self.line_open = text, True

    def _write(self, text):
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            pass

    def _tick(self):
        while not self.stop.wait(TICK_S):
            with self.lock:
                if self.stack:
                    self._draw()

    def pause(self):
        """End the live line (something else is about to draw: the run's
        progress bar); a later compile starts a new one."""
        with self.lock:
            if self.line_open:
                self._write("\n")
                self.line_open = False

    # ------------------------------------------------------------------ block

    def __enter__(self):
        from numba.core import event

        progress = self

        class Forward(event.Listener):
            def on_start(self, ev):
                progress.on_start(ev)

            def on_end(self, ev):
                progress.on_end(ev)

        self.listener = Forward()
        event.register("numba:compile", self.listener)
        return self

    def __exit__(self, *exc):
        from numba.core import event

        event.unregister("numba:compile", self.listener)
        self.stop.set()
        if self.ticker is not None:
            self.ticker.join()
        if not self.done:
            return False
        if self.live:
            with self.lock:
                self._draw(f"{self.label}: {self.done} compiled in {_seconds(self.compiling_s)}")
                self.pause()
        if exc[0] is None and self.key:
            self._record()
        return False

    def _record(self):
        """The measured seconds into the log, and this run's kernels under
        its key (with those it found cached, as logged before)."""
        log = read_log()
        for name, (seconds, count) in self.measured.items():
            log["kernels"][name] = {"seconds": round(seconds, 3), "specializations": count}
        runs = log["runs"].get(self.key)
        names = set(runs) if isinstance(runs, list) else set()
        log["runs"][self.key] = sorted(names | set(self.measured))
        _write_log(log)
