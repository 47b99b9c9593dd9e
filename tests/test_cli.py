"""The `servesim` command line (spec README §2, §7): commands, exit codes,
error messages without tracebacks, report files."""

import json
import os
import subprocess
import sys

import pytest

from helpers import TINY, invoke
from servesim.errors import InputError

def test_help_lists_commands():
    result = invoke("--help")
    assert result.exit_code == 0
    for command in ("run", "validate", "example"):
        assert command in result.output


def test_python_dash_m_servesim_help():
    proc = subprocess.run([sys.executable, "-m", "servesim", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0
    assert "run" in proc.stdout


def test_help_does_not_import_numpy_or_numba():
    code = "import sys, servesim.cli.main; print(sorted(m for m in ('numpy', 'numba') if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.stdout.strip() == "[]"


def test_the_command_runs_numpy_with_one_blas_thread_unless_the_user_chose():
    code = "import os, servesim.cli.main; print(os.environ['OPENBLAS_NUM_THREADS'])"
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.stdout.strip() == "1"
    env["OPENBLAS_NUM_THREADS"] = "3"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.stdout.strip() == "3"


def test_unknown_option_is_a_usage_error():
    result = invoke("run", "--no-such-flag", "x.yaml")
    assert result.exit_code == 2
    assert "Traceback" not in result.output


def test_input_error_exits_2_with_one_message(monkeypatch, tiny_config):
    import servesim.replay.api as api

    def bad_run(*args, **kwargs):
        raise InputError("trace.jsonl line 3: hash_ids has 2 ids, expected 3")

    monkeypatch.setattr(api, "run", bad_run)
    result = invoke("run", tiny_config)
    assert result.exit_code == 2
    assert result.stderr == "error: trace.jsonl line 3: hash_ids has 2 ids, expected 3\n"
    assert "Traceback" not in result.output


def test_internal_error_exits_1_with_traceback(monkeypatch, tiny_config):
    import servesim.replay.api as api

    def broken_run(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(api, "run", broken_run)
    result = invoke("run", tiny_config)
    assert result.exit_code == 1
    assert result.stderr.startswith("internal error: RuntimeError: boom\n")
    assert "Traceback" in result.stderr


def test_missing_config_file_exits_2():
    result = invoke("validate", "no/such/file.yaml")
    assert result.exit_code == 2
    assert "Traceback" not in result.output


# ---------------------------------------------------------------- need config.py, examples.py,
# workload.py and driver.py from the other modules


def test_example_prints_mooncake_by_default():
    result = invoke("example")
    assert result.exit_code == 0
    assert "workload:" in result.output and "mooncake" in result.output


def test_example_help_lists_every_example():
    from servesim.config.examples import EXAMPLES

    result = invoke("example", "--help")
    assert result.exit_code == 0
    listed = result.output.split("Examples (NAME):")[1]
    names = [line.split()[0] for line in listed.splitlines() if line.startswith("  ") and not line.startswith("   ")]
    assert names == list(EXAMPLES)
    assert "Mooncake's conversation trace" in listed and "tensor parallelism 2" in listed


def test_unknown_example_exits_2_listing_names():
    result = invoke("example", "nope")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ")
    assert "mooncake" in result.stderr
    assert "Traceback" not in result.output


def test_validate_ok(tiny_config):
    result = invoke("validate", tiny_config)
    assert result.exit_code == 0, result.output
    assert result.output == f"{tiny_config}: ok (6 requests)\n"


def test_validate_bad_key_exits_2_without_traceback(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(TINY.replace("num_gpu_blocks", "num_gpu_blockz"))
    result = invoke("validate", path)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ")
    assert "num_gpu_blockz" in result.stderr
    assert "Traceback" not in result.output


def test_validate_bad_set_value_exits_2(tiny_config):
    result = invoke("validate", tiny_config, "--set", "engine.num_gpu_blocks=-3")
    assert result.exit_code == 2
    assert "Traceback" not in result.output


@pytest.mark.parametrize("router, key", [
    ("{policy: kv_router, router_temperature: -1}", "cluster.router.router_temperature"),
    ("{policy: kv_router, overlap_score_weight: -2}", "cluster.router.overlap_score_weight"),
    ("{policy: random}", "cluster.router.policy"),
    ("{policy: weighted, scorers: {latency: 2}}", "cluster.router.scorers.latency")])
def test_a_bad_router_knob_exits_2_naming_it(tiny_config, tmp_path, router, key):
    out = tmp_path / "out"
    result = invoke("run", tiny_config, "-o", out, "--set", f"cluster.router={router}")
    assert result.exit_code == 2
    assert f"{key}:" in result.stderr
    assert "Traceback" not in result.output
    assert not out.exists()


def test_run_writes_the_three_files(tiny_config, tmp_path):
    out = tmp_path / "out"
    result = invoke("run", tiny_config, "-o", out, "--pass-log", "--telemetry-interval-ms", "10")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == [
        ".servesim-manifest", "itl_quantiles.json", "passes.jsonl", "requests.jsonl", "summary.json",
        "telemetry.jsonl",
    ]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["requests"] == summary["finished"] == 6
    assert len((out / "requests.jsonl").read_text().splitlines()) == 6
    assert "TTFT" in result.output and str(out) in result.output


def test_run_format_json_prints_the_summary(tiny_config, tmp_path):
    out = tmp_path / "out"
    result = invoke("run", tiny_config, "-o", out, "--format", "json", "--set", "workload.synthetic.requests=3")
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    assert printed["requests"] == 3
    assert printed == json.loads((out / "summary.json").read_text())
    assert sorted(p.name for p in out.iterdir()) == [
        ".servesim-manifest", "itl_quantiles.json", "requests.jsonl", "summary.json"]


def test_run_limit_and_quiet(tiny_config, tmp_path):
    result = invoke("run", tiny_config, "-o", tmp_path / "out", "--limit", "2", "--quiet")
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["requests"] == 2 and summary["config"]["workload"]["limit"] == 2


# ---------------------------------------------------------------- the Python API the CLI goes through


def test_api_run_from_dict_config_object_and_path(tiny_config, tmp_path):
    import servesim
    from servesim.config.config import load_config

    from_path = servesim.run(tiny_config, limit=4, pass_log=True)
    assert from_path.summary["requests"] == 4
    assert from_path.pass_log and from_path.config.output.pass_log
    assert from_path.records.status.size == 4

    from_config = servesim.run(load_config(tiny_config), overrides=["workload.synthetic.requests=2"])
    assert from_config.summary["requests"] == 2

    data = {"workload": {"synthetic": {"requests": 3, "input_tokens": 32, "output_tokens": 2}}}
    from_dict = servesim.run(data)
    assert from_dict.summary["finished"] == 3
    out = from_dict.write(tmp_path / "out")
    assert sorted(p.name for p in out.iterdir()) == [
        ".servesim-manifest", "itl_quantiles.json", "requests.jsonl", "summary.json"]


def test_api_run_progress_reports_total(tiny_config):
    import servesim

    calls = []
    servesim.run(tiny_config, progress=lambda t, done, total: calls.append((t, done, total)))
    assert calls and calls[-1][1:] == (6, 6)


def test_api_run_rejects_bad_limit(tiny_config):
    import servesim

    with pytest.raises(InputError, match="limit"):
        servesim.run(tiny_config, limit=0)


def test_a_broken_invariant_exits_1_with_one_message(monkeypatch, tiny_config):
    import servesim.replay.api as api
    from servesim.errors import InvariantError

    seen = {}

    def broken_run(*args, **kwargs):
        import os

        seen["check"] = os.environ.get("SERVESIM_CHECK")
        raise InvariantError("invariant violated after schedule() of pass 3: running <= "
                             "max_num_seqs; found 3, expected 2")

    monkeypatch.setattr(api, "run", broken_run)
    monkeypatch.setenv("SERVESIM_CHECK", "0")  # restored after the test: --check sets it
    monkeypatch.delenv("SERVESIM_DEBUG", raising=False)
    result = invoke("run", "--check", tiny_config)
    assert seen["check"] == "1"
    assert result.exit_code == 1
    assert result.stderr == ("internal error: invariant violated after schedule() of pass 3: "
                             "running <= max_num_seqs; found 3, expected 2\n")
    monkeypatch.setenv("SERVESIM_DEBUG", "1")
    result = invoke("run", tiny_config)
    assert result.exit_code == 1 and "Traceback" in result.stderr


@pytest.mark.parametrize("command, target", [
    (["run"], "servesim.replay.api.run"),
    (["sweep", "--grid", "GRID"], "servesim.sweep.sweep.sweep"),
    (["capacity", "--slo", "ttft_p99_ms=100", "--set", "workload.synthetic.arrival=constant",
      "--set", "workload.synthetic.rate=10"], "servesim.capacity.capacity.capacity"),
    (["search", "--grid", "GRID", "--rate", "1", "--slo", "ttft_p99_ms=100"],
     "servesim.capacity.search.search"),
])
def test_every_command_that_simulates_takes_check(monkeypatch, tiny_config, tmp_path, command,
                                                  target):
    # --check turns the debug mode on for the simulations the command runs
    import importlib
    import os

    seen = {}

    def stop(*args, **kwargs):
        seen["check"] = os.environ.get("SERVESIM_CHECK")
        raise InputError("stopped here")

    module, name = target.rsplit(".", 1)
    monkeypatch.setattr(importlib.import_module(module), name, stop)
    monkeypatch.setenv("SERVESIM_CHECK", "0")
    grid = tmp_path / "grid.yaml"
    grid.write_text("engine.max_num_seqs: [1, 2]\n")
    args = [str(grid) if a == "GRID" else a for a in command]
    result = invoke(args[0], tiny_config, *args[1:], "--check", "-o", tmp_path / "out")
    assert seen.get("check") == "1", result.output
    assert result.exit_code == 2 and "stopped here" in result.stderr


def test_run_check_runs_clean(monkeypatch, tiny_config, tmp_path):
    monkeypatch.setenv("SERVESIM_CHECK", "0")
    result = invoke("run", "--check", "-q", "-o", tmp_path / "out", tiny_config)
    assert result.exit_code == 0, result.output


def test_a_reader_that_goes_away_gets_no_traceback():
    """`servesim example | head -1`-style pipes: the closed pipe ends the
    command quietly (exit 1, nothing on stderr), not with a BrokenPipeError
    traceback."""
    import os
    import subprocess
    import sys

    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first byte
    proc = subprocess.run([sys.executable, "-m", "servesim", "example", "disaggregated"],
                          stdout=write, stderr=subprocess.PIPE, text=True, timeout=60)
    os.close(write)
    assert proc.returncode == 1 and proc.stderr == ""
