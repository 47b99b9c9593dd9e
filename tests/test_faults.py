"""Set-up and fault paths (README "Errors and faults"): where Numba's cache
goes, one run per output folder, output folders checked before simulating,
full disks, Ctrl-C."""

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import servesim
from servesim.cache import cache_root, kernels_cached, numba_cache_dir, sources_key
from servesim.results import output
from servesim.results.outdir import LOCK

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = Path(servesim.__file__).resolve().parent

from helpers import TINY, answers_ctrl_c, invoke, never_called


class _FillsUp:
    """An open file whose writes fail as on a full disk (ENOSPC) when its name
    contains `full_name`; other files are written as usual."""
    full_name = ""

    def __init__(self, path, *args, **kwargs):
        self.path, self.file = Path(path), open(path, *args, **kwargs)

    def write(self, data):
        if self.full_name in self.path.name:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))
        return self.file.write(data)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()


def full_disk_for(name):
    """A stand-in for `open` under which writing a file named like `name` fills the disk."""
    return type("FillsUp", (_FillsUp,), {"full_name": name})


def cli(*args, env=None, **kwargs):
    """`python -m servesim ARGS` in a subprocess running this checkout."""
    env = dict(os.environ if env is None else env, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "servesim", *map(str, args)], env=env,
                          capture_output=True, text=True, **kwargs)


def cache_files(folder: Path) -> set:
    return {p for p in folder.rglob("*") if p.suffix in (".nbi", ".nbc")}


# --------------------------------------------------------------------------- Numba's cache


def test_numba_cache_folder_precedence(monkeypatch, tmp_path):
    for name in ("SERVESIM_CACHE_DIR", "NUMBA_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == str(tmp_path / "home" / ".cache" / "servesim" / "numba")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == str(tmp_path / "xdg" / "servesim" / "numba")
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "nb"))
    assert cache_root() == str(tmp_path / "nb")
    monkeypatch.setenv("SERVESIM_CACHE_DIR", str(tmp_path / "ss"))
    assert cache_root() == str(tmp_path / "ss" / "numba")
    # the kernels of this source state go to their own sub-folder, and those
    # compiled with index checks to theirs
    monkeypatch.delenv("NUMBA_BOUNDSCHECK", raising=False)
    assert numba_cache_dir() == os.path.join(cache_root(), sources_key())
    monkeypatch.setenv("NUMBA_BOUNDSCHECK", "1")
    assert numba_cache_dir() == os.path.join(cache_root(), sources_key() + "-boundscheck")
    monkeypatch.setenv("NUMBA_BOUNDSCHECK", "0")
    assert numba_cache_dir() == os.path.join(cache_root(), sources_key())


def test_the_cache_sub_folder_follows_every_kernel_source(monkeypatch, tmp_path):
    """Numba checks only a kernel's own file: an edit to a kernel it inlines
    from another module must still reach the cache, so the sub-folder is keyed
    on every kernel module's content; other modules do not matter."""
    import shutil

    from servesim import cache

    copy = tmp_path / "servesim"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "data"))
    monkeypatch.setattr(cache, "PACKAGE_DIR", copy)
    monkeypatch.setattr(cache, "_key", None)
    before = cache.sources_key()
    monkeypatch.setattr(cache, "_key", None)
    (copy / "cli" / "main.py").write_text((copy / "cli" / "main.py").read_text() + "# edit\n")
    assert cache.sources_key() == before  # no kernels there
    monkeypatch.setattr(cache, "_key", None)
    pool = copy / "kvcache" / "block_pool.py"
    pool.write_text(pool.read_text() + "# edit\n")
    assert cache.sources_key() != before


def test_sub_folders_of_other_source_states_unused_for_weeks_are_removed(tmp_path):
    import time

    from servesim import cache

    old, recent, keep = (tmp_path / n for n in ("a" * 16, "b" * 16, "c" * 16))
    old_checked = tmp_path / ("d" * 16 + "-boundscheck")  # kernels compiled with index checks
    other = tmp_path / "not-ours"
    for folder in (old, recent, keep, old_checked, other):
        folder.mkdir()
    weeks = time.time() - (cache.STALE_DAYS + 1) * 86400
    for folder in (old, keep, old_checked, other):
        os.utime(folder, (weeks, weeks))
    cache._remove_stale(str(tmp_path), keep.name)
    assert not old.exists() and not old_checked.exists()
    assert recent.exists() and keep.exists() and other.exists()


@pytest.mark.cold_compile
def test_a_cold_compile_writes_its_cache_outside_the_package_and_says_so(tmp_path, tiny_config):
    """A run on a cold cache compiles once, says so, and caches the kernels in
    the user's folder, never under the package. When the suite's own cache is
    cold (a fresh machine: CI) the run compiles into it, so the tests after
    this one (conftest runs it first) load those kernels instead of compiling
    them again; otherwise, and always when the suite runs in several
    processes (pytest-xdist: another one may be filling the cache meanwhile),
    into a fresh folder."""
    before = cache_files(PACKAGE)
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    if kernels_cached() or os.environ.get("PYTEST_XDIST_WORKER"):
        env["SERVESIM_CACHE_DIR"] = str(tmp_path / "cache")
        folder = root = tmp_path / "cache" / "numba"
    else:
        folder = Path(numba_cache_dir())  # the child's too: the same root, sources and key
        root = Path(cache_root())
    first = cli("run", tiny_config, "-o", tmp_path / "a", env=env)
    assert first.returncode == 0, first.stderr
    assert first.stderr.count("compiling kernels, once") == 1  # one line on a pipe
    log = json.loads((root / "compile-log.json").read_text())  # the next compile's estimate
    assert log["runs"]["synthetic+timing-fixed"] and all(log["kernels"][k]["seconds"] >= 0
                                                        for k in log["runs"]["synthetic+timing-fixed"])
    assert cache_files(folder), "the kernels were cached in the user's folder"
    assert PACKAGE not in folder.resolve().parents
    assert cache_files(PACKAGE) == before, "nothing written under the package folder"
    second = cli("run", tiny_config, "-o", tmp_path / "b", env=env)
    assert second.returncode == 0, second.stderr
    assert "compiling" not in second.stderr


# --------------------------------------------------------------------------- one folder, one run


def test_a_folder_locked_by_a_live_run_is_refused_at_once(tmp_path, tiny_config, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (out / LOCK).write_text(f"{holder.pid}\n")
        started = never_called(monkeypatch, "run")  # refused before the run, not after it
        result = invoke("run", tiny_config, "-o", out)
        assert not started
    finally:
        holder.kill()
        holder.wait()
    assert result.exit_code == 2
    assert f"output folder is in use by another run (pid {holder.pid})" in result.stderr
    assert "Traceback" not in result.output
    assert sorted(p.name for p in out.iterdir()) == [LOCK]  # the other run's lock is left alone


def test_a_stale_lock_of_a_dead_run_is_taken_over(tmp_path, tiny_config):
    out = tmp_path / "out"
    out.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (out / LOCK).write_text(f"{dead.pid}\n")
    result = invoke("run", tiny_config, "-o", out, "--quiet")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == [".servesim-manifest", "itl_quantiles.json", "requests.jsonl", "summary.json"]


def start_slow_run(tmp_path, requests):
    """A `servesim run` subprocess of `requests` requests (seconds long),
    returned once it holds its output folder's lock: (process, config, out)."""
    config = tmp_path / "slow.yaml"
    config.write_text(TINY.replace("requests: 6", f"requests: {requests}").replace("num_gpu_blocks: 256",
                                                                                   "num_gpu_blocks: 4096"))
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "servesim", "run", str(config), "-o", str(out), "-q"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=answers_ctrl_c)
    deadline = time.monotonic() + 60
    while not (out / LOCK).exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return proc, config, out


def test_two_concurrent_runs_into_one_folder(tmp_path):
    # the first run is stopped (SIGSTOP) while it holds its folder, so the two
    # overlap however fast the first would finish
    first, config, out = start_slow_run(tmp_path, 40000)
    first.send_signal(signal.SIGSTOP)
    try:
        second = cli("run", config, "-o", out, "-q")
    finally:
        first.send_signal(signal.SIGCONT)
        _, first_err = first.communicate(timeout=300)
    assert first.returncode == 0, first_err
    assert second.returncode == 2
    assert "output folder is in use by another run" in second.stderr
    assert "Traceback" not in second.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["requests"] == 40000
    assert len((out / "requests.jsonl").read_text().splitlines()) == 40000
    assert sorted(p.name for p in out.iterdir()) == [".servesim-manifest", "itl_quantiles.json", "requests.jsonl", "summary.json"]


def test_a_second_run_replaces_every_output_of_the_first(tmp_path, tiny_config):
    pytest.importorskip("matplotlib")
    out = tmp_path / "out"
    first = invoke("run", tiny_config, "-o", out, "--pass-log", "--telemetry-interval-ms", "5", "--report")
    assert first.exit_code == 0, first.output
    assert (out / "report.html").is_file() and (out / "passes.jsonl").is_file()
    (out / "notes.txt").write_text("mine\n")
    second = invoke("run", tiny_config, "-o", out, "--set", "workload.synthetic.requests=3", "-q")
    assert second.exit_code == 0, second.output
    assert sorted(p.name for p in out.iterdir()) == [
        ".servesim-manifest", "itl_quantiles.json", "notes.txt", "requests.jsonl", "summary.json"]
    assert json.loads((out / "summary.json").read_text())["requests"] == 3
    assert (out / "notes.txt").read_text() == "mine\n"  # not a servesim output: left alone


# --------------------------------------------------------------------------- output folders checked first


def _assert_refused_fast(tiny_config, out, reason, head="error: {out}: cannot create the output folder"):
    with pytest.MonkeyPatch.context() as patch:
        started = never_called(patch, "run")  # refused before the run
        result = invoke("run", tiny_config, "-o", out)
    assert not started
    assert result.exit_code == 2, result.output
    assert head.format(out=out) in result.stderr
    assert reason in result.stderr
    assert "Traceback" not in result.output


def test_a_file_in_place_of_the_output_folder_exits_2_before_simulating(tmp_path, tiny_config):
    (tmp_path / "out").write_text("a file\n")
    _assert_refused_fast(tiny_config, tmp_path / "out", "is a file", head="'{out}'")  # click's check
    assert (tmp_path / "out").read_text() == "a file\n"
    _assert_refused_fast(tiny_config, tmp_path / "out" / "sub", "a file is in the way")


def test_an_output_folder_in_proc_exits_2_before_simulating(tiny_config):
    if not os.path.isdir("/proc/self"):
        pytest.skip("no /proc")
    _assert_refused_fast(tiny_config, Path("/proc/servesim-out"), "")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_parent_exits_2_before_simulating(tmp_path, tiny_config):
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o500)
    try:
        _assert_refused_fast(tiny_config, parent / "out", "Permission denied")
    finally:
        parent.chmod(0o700)


def test_a_read_only_output_folder_exits_2_before_simulating(tmp_path, tiny_config, monkeypatch):
    # as root a chmod does not stop writes: refuse the lock file the way a read-only folder would
    import servesim.results.outdir as outdir

    real_open = os.open

    def read_only(path, flags, *args):
        if str(path).endswith(LOCK):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(outdir.os, "open", read_only)
    out = tmp_path / "out"
    out.mkdir()
    result = invoke("run", tiny_config, "-o", out)
    assert result.exit_code == 2
    assert result.stderr == f"error: {out}: cannot write into the output folder: {os.strerror(errno.EROFS)}\n"
    assert list(out.iterdir()) == []


def test_a_full_disk_exits_2_and_keeps_the_previous_outputs(tmp_path, tiny_config, monkeypatch):
    out = tmp_path / "out"
    assert invoke("run", tiny_config, "-o", out, "-q").exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real = output._write_text

    def fills_the_disk(path, chunks):
        if path.name == "itl_quantiles.json":  # the second file written
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real(path, chunks)

    monkeypatch.setattr(output, "_write_text", fills_the_disk)
    result = invoke("run", tiny_config, "-o", out, "-q", "--set", "workload.synthetic.requests=3")
    assert result.exit_code == 2
    assert "No space left on device" in result.stderr and "previous outputs are kept" in result.stderr
    assert "Traceback" not in result.output
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_a_full_disk_under_the_pass_log_writer_thread_exits_2(tmp_path, tiny_config, monkeypatch):
    # passes.jsonl's chunks are written on a second thread (output._Writer);
    # its error must reach the command as the same clean message
    out = tmp_path / "out"
    assert invoke("run", tiny_config, "-o", out, "-q").exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    monkeypatch.setattr(output, "open", full_disk_for("passes.jsonl"), raising=False)
    result = invoke("run", tiny_config, "-o", out, "-q", "--pass-log")
    assert result.exit_code == 2
    assert "No space left on device" in result.stderr and "previous outputs are kept" in result.stderr
    assert "Traceback" not in result.output
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_the_writer_thread_writes_in_order_and_raises_its_error_on_the_next_call():
    written = []

    class File:
        def write(self, data):
            if data == b"bad":
                raise OSError(errno.EIO, "boom")
            written.append(bytes(data))

    with output._Writer(File()) as writer:
        for k in range(50):
            writer.write(b"%d," % k)
    assert b"".join(written) == b"".join(b"%d," % k for k in range(50))
    with pytest.raises(OSError, match="boom"):
        with output._Writer(File()) as writer:
            writer.write(b"bad")
            writer.write(b"never")  # raises the first write's error
    assert written[-1] == b"49,"


# --------------------------------------------------------------------------- Ctrl-C


def test_ctrl_c_on_run_exits_130_and_leaves_no_lock(tmp_path):
    proc, _, out = start_slow_run(tmp_path, 400000)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert not out.exists() or list(out.iterdir()) == []


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the swallowing, by design
def test_a_ctrl_c_swallowed_while_numba_compiles_is_not_lost():
    # Ctrl-C raised inside a callback from C code (llvmlite's object cache,
    # while Numba compiles) is printed as "Exception ignored" by ctypes and
    # lost; under `remembered()` (`servesim run`) it is raised again once the
    # run returns, before anything is written
    import ctypes

    from servesim.cli.ctrl_c import remembered

    def pressed_in_a_callback():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)  # (not reached: the handler raises first, inside the callback)

    callback = ctypes.CFUNCTYPE(None)(pressed_in_a_callback)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # even in a background job
    try:
        callback()  # swallowed: no KeyboardInterrupt comes out
        hook = sys.unraisablehook
        reported = []
        sys.unraisablehook = reported.append
        try:
            with remembered() as ctrl_c:
                callback()
                with pytest.raises(KeyboardInterrupt):
                    ctrl_c.check()
            assert reported == []  # no "Exception ignored ... Traceback" for the user
            callback()  # outside it, C code's swallowed interrupt is reported as before
            assert [r.exc_type for r in reported] == [KeyboardInterrupt]
        finally:
            sys.unraisablehook = hook
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with pytest.raises(KeyboardInterrupt):  # what the lost interrupt broke: interrupted
            with remembered():
                callback()
                raise RuntimeError("no compiled object yet")  # as Numba then fails
        with pytest.raises(RuntimeError):  # no Ctrl-C: errors are themselves
            with remembered() as ctrl_c:
                ctrl_c.check()  # nothing raised
                raise RuntimeError("a bug")
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_swallowed_ctrl_c_stops_the_run_at_its_next_return_to_python(tmp_path, monkeypatch):
    # a Ctrl-C swallowed while Numba compiled (as above) must not leave the
    # user waiting for the whole run: the run stops at its first return to
    # Python (every 4,096 arrivals at the latest), writing nothing
    from servesim.cli import ctrl_c
    from servesim.replay import driver

    def swallowed_before_the_run(self):
        self.pressed = True

    reached_the_end = []
    close_unfinished = driver.Replay._close_unfinished
    monkeypatch.setattr(ctrl_c._CtrlC, "__init__", swallowed_before_the_run)
    monkeypatch.setattr(driver, "_PROGRESS_EVERY_S", 0.0)
    monkeypatch.setattr(driver.Replay, "_close_unfinished",
                        lambda self: reached_the_end.append(1) or close_unfinished(self))
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # even in a background job
    try:
        config = tmp_path / "long.yaml"
        config.write_text(TINY.replace("requests: 6", "requests: 40000"))
        out = tmp_path / "out"
        result = invoke("run", config, "-o", out, "-q")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert result.exit_code == 130, result.output
    assert "interrupted" in result.stderr
    assert reached_the_end == []
    assert not out.exists() or list(out.iterdir()) == []


# --------------------------------------------------------------------------- smaller things


def test_a_trace_path_that_is_a_directory_says_so(tmp_path, tiny_config):
    (tmp_path / "traces").mkdir()
    result = invoke("validate", tiny_config, "--set", "workload.synthetic=null",
                    "--set", f"workload.trace={tmp_path / 'traces'}")
    assert result.exit_code == 2
    assert result.stderr == (f"error: {tiny_config}: --set workload.trace: {tmp_path / 'traces'} "
                             f"is a directory, not a trace file\n")


@pytest.mark.parametrize("tokens", ["32", "{distribution: uniform, min: 16, max: 48}"])
def test_a_shared_prefix_longer_than_every_prompt_is_rejected(tiny_config, tokens):
    result = invoke("validate", tiny_config, "--set", f"workload.synthetic.input_tokens={tokens}",
                    "--set", "workload.synthetic.shared_prefix_tokens=64")
    assert result.exit_code == 2
    assert "workload.synthetic.shared_prefix_tokens: 64 is longer than any prompt (input_tokens is at most" \
        in result.stderr


def test_a_run_where_every_request_is_rejected_exits_0_and_says_why(tmp_path, tiny_config):
    result = invoke("run", tiny_config, "-o", tmp_path / "out", "-q", "--set", "engine.num_gpu_blocks=3")
    assert result.exit_code == 0
    assert result.stderr == ("warning: every request was rejected at arrival, nothing was simulated "
                             "(prompt needs more KV blocks than a rank holds (2 usable blocks): "
                             "0, 1, 2, 3, 4 and 1 more)\n")
    result = invoke("run", tiny_config, "-o", tmp_path / "out", "-q", "--set", "engine.max_model_len=64")
    assert result.stderr.startswith("warning: every request was rejected at arrival, nothing was simulated "
                                    "(prompt not shorter than max_model_len (64): 0, 1, 2")


def test_could_never_finish_is_printed_once_with_its_cause(tmp_path, tiny_config):
    result = invoke("run", tiny_config, "-o", tmp_path / "out", "-q",
                    "--set", "engine.enable_chunked_prefill=false", "--set", "engine.max_num_batched_tokens=32",
                    "--set", "engine.max_num_seqs=4")
    assert result.exit_code == 0
    assert result.stderr == ("warning: 6 request(s) could never finish (prompt longer than "
                             "max_num_batched_tokens (32) with chunked prefill off: 0, 1, 2, 3, 4 and 1 more)\n")
    # 64 prompt tokens fit the 7 usable blocks of 16; 64 + 100 output tokens never do
    result = invoke("run", tiny_config, "-o", tmp_path / "out", "-q", "--set", "engine.num_gpu_blocks=8",
                    "--set", "workload.synthetic.output_tokens=100")
    assert result.stderr.count("could never finish") == 1
    assert "prompt plus output outgrows the KV cache (7 usable blocks): 0" in result.stderr


def test_a_yaml_alias_bomb_is_refused_quickly(tmp_path, tiny_config):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 10)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n" + TINY)
    for args in (("validate", bomb), ("sweep", tiny_config, "--grid", bomb, "-o", tmp_path / "s")):
        result = invoke(*args)  # (expanded, the aliases would be 10^10 values)
        assert result.exit_code == 2
        assert result.stderr == (f"error: {bomb}: more than 100000 values once aliases are expanded "
                                 f"(an alias bomb?); refused\n")


def test_a_recursive_mapping_given_to_the_api_is_refused():
    from servesim.errors import InputError
    from servesim.config.config import config_from_dict

    data = {"workload": {"synthetic": {"requests": 1}}}
    data["engine"] = data
    with pytest.raises(InputError, match="engine: a recursive alias"):
        config_from_dict(data)


def test_an_unreachable_ray_cluster_fails_within_the_timeout():
    from servesim.errors import InputError
    from servesim.sweep.executors import connect

    start = time.perf_counter()
    with pytest.raises(InputError, match=r"^--ray-address ray://nowhere:1: cannot connect to Ray within 0.5 s"):
        connect(lambda: time.sleep(30), "ray://nowhere:1", timeout_s=0.5)
    assert time.perf_counter() - start < 3

    def refused():
        raise ConnectionError("connection refused")

    with pytest.raises(InputError, match="cannot connect to Ray: ConnectionError: connection refused"):
        connect(refused, "10.0.0.1:6379", timeout_s=5)


def test_relative_paths_in_set_values_are_relative_to_the_current_folder(tmp_path, monkeypatch):
    (tmp_path / "conf").mkdir()
    (tmp_path / "data").mkdir()
    rows = [{"timestamp": 10 * i, "input_length": 100, "output_length": 4, "hash_ids": [i]} for i in range(3)]
    (tmp_path / "data" / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = tmp_path / "conf" / "c.yaml"
    config.write_text(TINY)
    monkeypatch.chdir(tmp_path / "data")
    result = invoke("validate", config, "--set", "workload.synthetic=null", "--set", "workload.trace=t.jsonl")
    assert result.exit_code == 0, result.output
    assert "ok (3 requests)" in result.stdout


def test_relative_paths_in_a_grid_are_relative_to_the_grid_file(tmp_path, monkeypatch):
    for folder in ("conf", "grids", "elsewhere"):
        (tmp_path / folder).mkdir()
    rows = [{"timestamp": 10 * i, "input_length": 100, "output_length": 4, "hash_ids": [i]} for i in range(3)]
    (tmp_path / "grids" / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = tmp_path / "conf" / "c.yaml"
    config.write_text(TINY)
    grid = tmp_path / "grids" / "g.yaml"
    grid.write_text("points:\n  - {workload.synthetic: null, workload.trace: t.jsonl}\n")
    monkeypatch.chdir(tmp_path / "elsewhere")
    result = invoke("sweep", config, "--grid", grid, "-o", tmp_path / "out")
    assert result.exit_code == 0, result.output
    summary = json.loads(next((tmp_path / "out" / "points").glob("*/summary.json")).read_text())
    assert summary["requests"] == 3
    assert summary["config"]["workload"]["trace"] == str(tmp_path / "grids" / "t.jsonl")


# ------------------------------------------------- nothing of the user's replaced (issue 39)


def test_an_empty_output_path_is_refused(tmp_path, tiny_config, monkeypatch):
    """`-o "$OUT"` with OUT unset wrote into the current folder."""
    monkeypatch.chdir(tmp_path)
    for command in (("run", tiny_config), ("sweep", tiny_config, "--grid", tiny_config)):
        result = invoke(*command, "-o", "")
        assert result.exit_code == 2, result.output
        assert result.stderr.startswith("error: output folder: an empty path (an unset shell variable?)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.yaml"]


@pytest.mark.parametrize("folder", [".", "mine"])
def test_the_user_s_own_files_named_like_outputs_are_never_replaced(tmp_path, tiny_config, monkeypatch,
                                                                    folder):
    """`-o .`, or any folder that never held a run: a report.html,
    passes.jsonl or telemetry.jsonl servesim did not write is refused before
    simulating, and every file is kept."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / folder
    out.mkdir(exist_ok=True)
    for name in ("report.html", "passes.jsonl", "telemetry.jsonl"):
        (out / name).write_text(f"my {name}\n")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    for flags in ((), ("--pass-log", "--telemetry-interval-ms", "5", "--report")):
        result = invoke("run", tiny_config, "-o", folder, "-q", *flags)
        assert result.exit_code == 2, result.output
        assert result.stderr.startswith("error: ") and "servesim did not write" in result.stderr
        assert "Traceback" not in result.output
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    (out / "report.html").unlink()
    (out / "passes.jsonl").unlink()
    (out / "telemetry.jsonl").unlink()
    (out / "notes.txt").write_text("mine\n")
    assert invoke("run", tiny_config, "-o", folder, "-q", "--pass-log").exit_code == 0
    # servesim's own files are replaced by the next run, the user's left alone
    assert invoke("run", tiny_config, "-o", folder, "-q").exit_code == 0
    assert not (out / "passes.jsonl").exists() and (out / "notes.txt").read_text() == "mine\n"


def test_report_never_replaces_the_user_s_report_html(tmp_path, tiny_config):
    out = tmp_path / "out"
    assert invoke("run", tiny_config, "-o", out, "-q").exit_code == 0
    (out / "report.html").write_text("my notes\n")
    result = invoke("report", out)
    assert result.exit_code == 2 and "report.html: a file servesim did not write" in result.stderr
    assert (out / "report.html").read_text() == "my notes\n"


@pytest.mark.parametrize("command", [["report", "{out}"], ["run", "{config}", "-o", "{out}", "-q", "--report"]])
def test_a_full_disk_under_the_html_report_exits_2_and_leaves_no_temporary(tmp_path, tiny_config,
                                                                           monkeypatch, command):
    from servesim.results import outdir

    out = tmp_path / "out"
    assert invoke("run", tiny_config, "-o", out, "-q").exit_code == 0
    finished = {p.name: p.read_bytes() for p in out.iterdir()}

    monkeypatch.setattr(outdir, "open", full_disk_for("report.html"), raising=False)
    result = invoke(*[a.format(out=out, config=tiny_config) for a in command])
    assert result.exit_code == 2, result.output
    assert result.stderr == f"error: {out / 'report.html'}: cannot write: {os.strerror(errno.ENOSPC)}\n"
    left = {p.name: p.read_bytes() for p in out.iterdir()}
    if command[0] == "report":
        assert left == finished
    else:  # the run's own outputs were written before its report: they are kept
        assert set(left) == set(finished)


@pytest.mark.parametrize("text", ["", "garbage\n", "0\n", "\xff\xfe"])
def test_a_lock_that_holds_no_pid_is_taken_over(tmp_path, tiny_config, text):
    """A lock left empty or garbled by a run killed while writing it: stale
    once it is a few seconds old (younger, its owner may be writing it)."""
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK).write_bytes(text.encode("latin-1"))
    old = time.time() - 60
    os.utime(out / LOCK, (old, old))
    result = invoke("run", tiny_config, "-o", out, "-q")
    assert result.exit_code == 0, result.output
    assert not (out / LOCK).exists() and (out / "summary.json").is_file()


def test_a_young_lock_with_no_pid_yet_is_waited_for(tmp_path, tiny_config):
    """A lock just created, its pid not yet written: the run looks again,
    and finds its owner alive."""
    import threading

    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK).write_text("")
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    writer = threading.Timer(0.3, lambda: (out / LOCK).write_text(f"{holder.pid}\n"))
    writer.start()
    try:
        result = invoke("run", tiny_config, "-o", out, "-q")
    finally:
        writer.join()
        holder.kill()
        holder.wait()
    assert result.exit_code == 2
    assert f"output folder is in use by another run (pid {holder.pid})" in result.stderr


def test_a_full_disk_while_taking_the_lock_leaves_no_new_folder(tmp_path, tiny_config, monkeypatch):
    from servesim.results import outdir

    def fills_the_disk(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(outdir.os, "write", fills_the_disk)
    out = tmp_path / "new"
    result = invoke("run", tiny_config, "-o", out, "-q")
    monkeypatch.undo()
    assert result.exit_code == 2
    assert result.stderr == f"error: {out}: cannot write into the output folder: {os.strerror(errno.ENOSPC)}\n"
    assert not out.exists()


GRID = "engine.max_num_seqs: [1, 2]\n"


@pytest.mark.parametrize("command, name", [
    ("sweep", "sweep.csv"), ("sweep", "points"), ("sweep", "sweep.json"),
    ("search", "search.csv"), ("search", "points"), ("capacity", "capacity.json"),
])
@pytest.mark.parametrize("kind", ["file", "folder"])
def test_something_in_the_way_of_a_result_file_is_refused_before_any_point(tmp_path, tiny_config,
                                                                           command, name, kind):
    """It was a traceback after every point ran (sweep.csv a folder) or the
    user's file replaced (capacity.json, points/ a file)."""
    out = tmp_path / "out"
    out.mkdir()
    (out / name).mkdir() if kind == "folder" else (out / name).write_text("mine\n")
    grid = tmp_path / "grid.yaml"
    grid.write_text(GRID)
    extra = {"sweep": ["--grid", grid], "search": ["--grid", grid, "--slo", "ttft_p99_ms=100", "--rate", "2"],
             "capacity": ["--slo", "ttft_p99_ms=100"]}[command]
    config = tmp_path / "c.yaml"
    config.write_text(TINY.replace("arrival: burst", "arrival: constant\n    rate: 2"))
    result = invoke(command, config, "-o", out, *extra)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"error: {out / name}: a {kind} servesim did not write is in the way")
    assert "Traceback" not in result.output
    assert sorted(p.name for p in out.iterdir()) == [name]  # no point ran


def test_a_sweep_whose_result_file_cannot_be_written_keeps_its_points(tmp_path, tiny_config, monkeypatch):
    from servesim.results import outdir

    real = outdir._replace_text

    def fills_the_disk(path, text):
        if path.name == "sweep.csv":
            raise outdir.output_error(path, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), "write")
        real(path, text)

    grid = tmp_path / "grid.yaml"
    grid.write_text(GRID)
    monkeypatch.setattr(outdir, "_replace_text", fills_the_disk)
    out = tmp_path / "out"
    result = invoke("sweep", tiny_config, "--grid", grid, "-o", out)
    assert result.exit_code == 2, result.output
    assert result.stderr == f"error: {out / 'sweep.csv'}: cannot write: {os.strerror(errno.ENOSPC)}\n"
    assert len(list((out / "points").glob("*/summary.json"))) == 2
    assert not list(out.glob(".*.tmp"))


def test_ctrl_c_on_search_writes_search_csv_and_removes_the_interrupted_points(tmp_path, monkeypatch):
    """Ctrl-C after the first point: search.csv lists it and the others as
    not run, no empty point folder is left, exit 130, and the same search
    resumes (the Ctrl-C itself is what the local executor gets: a
    KeyboardInterrupt thrown into it while it waits for the next point)."""
    import csv

    from helpers import ONE_PER_PASS
    from servesim.sweep import executors

    real = executors.local_executor

    def ctrl_c_after_the_first_point(fn, todo, **kwargs):
        points = real(fn, todo, **kwargs)
        yield next(points)
        points.throw(KeyboardInterrupt)

    config = tmp_path / "c.yaml"
    config.write_text(ONE_PER_PASS)
    grid = tmp_path / "g.yaml"
    grid.write_text("engine.max_num_seqs: [1, 2, 3]\n")
    out = tmp_path / "out"
    command = ("search", config, "--grid", grid, "--slo", "ttft_p99_ms=1000", "--rate", "50", "-o", out)
    monkeypatch.setitem(executors.EXECUTORS, "local", ctrl_c_after_the_first_point)
    result = invoke(*command)
    assert result.exit_code == 130, result.output
    assert result.stderr.count("interrupted") == 1 and "search.csv holds the points that finished" in result.stderr
    with open(out / "search.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["status"] for r in rows] == ["ok", "failed", "failed"]
    assert [r["error"] for r in rows[1:]] == ["not run", "not run"]
    left = sorted((out / "points").iterdir())
    assert rows[0]["dir"].split("/")[1] in [p.name for p in left]
    assert all((p / "slo.json").is_file() for p in left)  # a point done as Ctrl-C came is kept
    monkeypatch.setitem(executors.EXECUTORS, "local", real)
    again = invoke(*command)
    assert again.exit_code == 0, again.output
    assert f"3 points: 3 ok, 0 failed, 0 skipped, {len(left)} already done" in again.stdout
