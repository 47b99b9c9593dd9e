"""The compile's progress (servesim/cli/compile_progress.py), driven by
stand-ins of Numba's `numba:compile` events on a stand-in clock: the line on a
pipe and on a terminal, the log of measured seconds, and the next compile's
estimate from it; `servesim warmup`'s options."""

import io
import json
from types import SimpleNamespace

import pytest

from helpers import invoke
from servesim.cli import compile_progress as cp


class Clock:
    now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock(monkeypatch, tmp_path):
    monkeypatch.setenv("SERVESIM_CACHE_DIR", str(tmp_path / "cache"))  # an empty cache and log
    c = Clock()
    monkeypatch.setattr(cp, "_clock", c)
    return c


def kernel(name):
    """An event of a servesim kernel (or, for a name outside the package, Numba's own)."""
    from servesim.kvcache import block_pool

    if name == "numba":
        return SimpleNamespace(data={"dispatcher": SimpleNamespace(py_func=json.dumps)})
    return SimpleNamespace(data={"dispatcher": getattr(block_pool, name)})


# allocate_slots compiles 0-4 s, calling free_blocks (1-2 s) and one of
# Numba's overloads (2.5-3 s: counted as allocate_slots' own); kv_usage
# compiles 14-16 s. Own seconds: 3, 1 and 2; 6 s of compiling in all.
EVENTS = [(0.0, "start", "allocate_slots"), (1.0, "start", "free_blocks"), (2.0, "end", "free_blocks"),
          (2.5, "start", "numba"), (3.0, "end", "numba"), (4.0, "end", "allocate_slots"),
          (14.0, "start", "kv_usage"), (16.0, "end", "kv_usage")]


def compile_once(clock, live, key="synthetic+timing-fixed"):
    out = io.StringIO()
    base = clock.now
    with cp.CompileProgress(lambda: key, stream=out, live=live) as p:
        for at, what, name in EVENTS:
            clock.now = base + at
            (p.on_start if what == "start" else p.on_end)(kernel(name))
    return p, out.getvalue()


def test_a_first_compile_says_so_once_on_a_pipe_and_logs_each_kernel_s_own_seconds(clock):
    p, text = compile_once(clock, live=False)
    assert text == "compiling kernels, once (no earlier compile of this kind to estimate from)\n"
    assert p.done == 3 and p.compiling_s == 6.0  # 4 + 2 s in compiles; the 10 s between them not
    log = json.loads(cp.log_path().read_text())
    assert log["kernels"] == {"kvcache/block_pool.py:allocate_slots": {"seconds": 3.0, "specializations": 1},
                              "kvcache/block_pool.py:free_blocks": {"seconds": 1.0, "specializations": 1},
                              "kvcache/block_pool.py:kv_usage": {"seconds": 2.0, "specializations": 1}}
    assert log["runs"] == {"synthetic+timing-fixed": sorted(log["kernels"])}


def test_the_next_compile_of_that_kind_expects_the_logged_kernels_the_cache_lacks(clock):
    compile_once(clock, live=False)
    _, text = compile_once(clock, live=False)
    assert text == "compiling kernels, once: 3 expected, ~6.0 s (measured on the last compile)\n"
    # another kind of run has no estimate yet
    _, other = compile_once(clock, live=False, key="trace+timing-polynomial")
    assert "no earlier compile of this kind" in other
    # a kernel whose index the cache holds is not expected
    from servesim.cache import PACKAGE_DIR, _subfolder, numba_cache_dir
    from pathlib import Path

    folder = Path(numba_cache_dir()) / _subfolder(str(PACKAGE_DIR / "kvcache"))
    folder.mkdir(parents=True)
    (folder / "block_pool.kv_usage-120.py311.nbi").write_bytes(b"")
    assert cp.expected(cp.read_log(), "synthetic+timing-fixed") == (2, 4.0)


def test_on_a_terminal_the_line_counts_kernels_elapsed_and_left(clock):
    compile_once(clock, live=False)
    _, text = compile_once(clock, live=True)
    frames = text.split("\r\033[K")[1:]
    assert "compiling kernels: 1 of 3 done, 2.0 s, ~4.0 s left" in frames  # free_blocks, at 2 s
    assert "compiling kernels: 2 of 3 done, 4.0 s, ~2.0 s left" in frames
    assert frames[-1] == "compiling kernels: 3 compiled in 6.0 s\n"


def test_nothing_compiled_shows_nothing_and_logs_nothing(clock):
    out = io.StringIO()
    with cp.CompileProgress(lambda: "k", stream=out, live=True):
        pass
    assert out.getvalue() == "" and not cp.log_path().exists()


def test_an_unreadable_log_only_loses_the_estimate(clock):
    cp.log_path().parent.mkdir(parents=True)
    cp.log_path().write_text("{not json")
    _, text = compile_once(clock, live=False)
    assert "no earlier compile of this kind" in text
    assert "synthetic+timing-fixed" in json.loads(cp.log_path().read_text())["runs"]


def test_features_key_names_what_decides_the_compile():
    from helpers import make_config

    assert cp.features_key(make_config()) == "synthetic+timing-linear"
    assert cp.features_key(make_config(cluster={"workers": 2}, async_scheduling=True)) == \
        "synthetic+timing-linear+cluster+async"


def test_warmup_refuses_an_unknown_feature_naming_the_examples():
    result = invoke("warmup", "--features", "mooncake,nope")
    assert result.exit_code == 2
    assert "--features: unknown example 'nope'; available: deployment, mooncake" in result.output
    assert "Traceback" not in result.output


def test_warmup_of_a_compiled_example_says_so(tmp_path):
    result = invoke("warmup", "--features", "synthetic")  # the suite's cache holds its kernels by now
    assert result.exit_code == 0, result.output
    assert result.output.startswith("synthetic: ")
    assert "kernel(s) compiled" in result.output or "already compiled" in result.output
