"""`servesim sweep` (spec README §2): grid files, one process per point,
sweep.csv / sweep.json, failed points, resuming, the Ray executor."""

import csv
import json
import shutil
import sys

import pytest
from click.testing import CliRunner

from servesim.cli.main import main
from servesim.errors import InputError
from servesim.sweep.sweep import FIGURES, load_grid, point_dir_names

# 20 requests, 20 ms apart, fixed pass times: a run takes milliseconds.
TINY = """\
workload:
  synthetic:
    requests: 20
    input_tokens: 256
    output_tokens: 16
    arrival: constant
    rate: 50
engine:
  block_size: 16
  num_gpu_blocks: 64
  max_num_seqs: 8
  max_num_batched_tokens: 512
  timing: {type: fixed, prefill_ms: 10.0, decode_ms: 5.0}
cluster:
  workers: 2
output:
  telemetry_interval_ms: 50
"""

GRID_2X2 = """\
engine.num_gpu_blocks: [64, 512]
engine.async_scheduling: [false, true]
"""
POINTS_2X2 = [
    {"engine.num_gpu_blocks": 64, "engine.async_scheduling": False},
    {"engine.num_gpu_blocks": 64, "engine.async_scheduling": True},
    {"engine.num_gpu_blocks": 512, "engine.async_scheduling": False},
    {"engine.num_gpu_blocks": 512, "engine.async_scheduling": True},
]


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def read_rows(out):
    with open(out / "sweep.csv", newline="") as f:
        return list(csv.DictReader(f))


def without_wall_time(rows):
    return [{k: v for k, v in row.items() if k != "wall_time_s"} for row in rows]


@pytest.fixture
def files(tmp_path):
    (tmp_path / "tiny.yaml").write_text(TINY)
    (tmp_path / "grid.yaml").write_text(GRID_2X2)
    return tmp_path


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """The 2x2 grid swept once with the local executor (2 processes), shared by
    the tests that only read it (they copy it before changing anything)."""
    base = tmp_path_factory.mktemp("swept")
    (base / "tiny.yaml").write_text(TINY)
    (base / "grid.yaml").write_text(GRID_2X2)
    result = invoke("sweep", base / "tiny.yaml", "--grid", base / "grid.yaml", "-o", base / "out", "--jobs", 2)
    assert result.exit_code == 0, result.output
    return base, result


# ---------------------------------------------------------------- grid files


def test_grid_mapping_is_the_product_keys_in_file_order_values_in_list_order(files):
    grid = load_grid(files / "grid.yaml")
    assert grid.keys == ("engine.num_gpu_blocks", "engine.async_scheduling")
    assert list(grid.points) == POINTS_2X2
    assert point_dir_names(grid) == [
        "000-num_gpu_blocks=64-async_scheduling=false",
        "001-num_gpu_blocks=64-async_scheduling=true",
        "002-num_gpu_blocks=512-async_scheduling=false",
        "003-num_gpu_blocks=512-async_scheduling=true",
    ]


def test_grid_list_forms_give_one_point_per_item(tmp_path):
    points = tmp_path / "points.yaml"
    points.write_text("points:\n  - {engine.num_gpu_blocks: 64}\n"
                      "  - {engine.num_gpu_blocks: 512, engine.async_scheduling: true}\n")
    bare = tmp_path / "bare.yaml"
    bare.write_text("- {engine.num_gpu_blocks: 64}\n- {engine.num_gpu_blocks: 512, engine.async_scheduling: true}\n")
    for path in (points, bare):
        grid = load_grid(path)
        assert grid.keys == ("engine.num_gpu_blocks", "engine.async_scheduling")
        assert list(grid.points) == [{"engine.num_gpu_blocks": 64},
                                     {"engine.num_gpu_blocks": 512, "engine.async_scheduling": True}]


@pytest.mark.parametrize("grid_text, expected", [
    # a typo is caught against the config, before anything runs, at its grid line
    ("engine.async_scheduling: [false]\nengine.num_gpu_blocs: [64]\n",
     [":2: engine.num_gpu_blocs: point 0", "unknown key", "did you mean 'num_gpu_blocks'"]),
    ("engine.num_gpu_blocks: [64, -3]\n", [":1: engine.num_gpu_blocks: point 1", "must be an integer >= 2"]),
    ("engine.num_gpu_blocks: 64\n", [":1: engine.num_gpu_blocks: must be a non-empty list"]),
    ("engine.num_gpu_blocks: [64, 64]\n", [":1: engine.num_gpu_blocks: value 64 appears twice"]),
    ("points:\n  - {engine.num_gpu_blocks: 64}\n  - {engine.num_gpu_blocks: 64}\n", [":3: point 1: the same as point 0"]),
    ("points: [{engine.num_gpu_blocks: 64}]\nengine.max_num_seqs: [4]\n", [":2: engine.max_num_seqs: a grid with points:"]),
    ("{}\n", ["empty grid"]),
    ("42\n", ["the grid must be a mapping"]),
    ("engine.num gpu: [1]\n", [":1: 'engine.num gpu': not a dotted config key"]),
])
def test_bad_grid_exits_2_naming_the_grid_file_and_key_and_runs_nothing(files, grid_text, expected):
    (files / "grid.yaml").write_text(grid_text)
    result = invoke("sweep", files / "tiny.yaml", "--grid", files / "grid.yaml", "-o", files / "out")
    assert result.exit_code == 2, result.output
    message = result.stderr
    assert message.startswith(f"error: {files / 'grid.yaml'}") and message.count("\n") == 1
    for part in expected:
        assert part in message
    assert "Traceback" not in result.output
    assert not (files / "out").exists()


# ---------------------------------------------------------------- running


def test_sweep_2x2_gives_4_rows_equal_to_4_single_runs(swept):
    import servesim

    base, result = swept
    out = base / "out"
    assert "4 points: 4 ok, 0 failed" in result.output
    rows = read_rows(out)
    assert [(r["point"], r["engine.num_gpu_blocks"], r["engine.async_scheduling"], r["status"], r["error"])
            for r in rows] == [("0", "64", "false", "ok", ""), ("1", "64", "true", "ok", ""),
                               ("2", "512", "false", "ok", ""), ("3", "512", "true", "ok", "")]
    assert list(rows[0]) == ["point", "engine.num_gpu_blocks", "engine.async_scheduling", "status", "error",
                             *FIGURES, "dir"]
    for row, point in zip(rows, POINTS_2X2):
        overrides = [f"{k}={json.dumps(v)}" for k, v in point.items()]
        summary = servesim.run(base / "tiny.yaml", overrides=overrides).summary
        for column, (key, sub) in FIGURES.items():
            if column == "wall_time_s":
                continue
            expected = summary[key] if sub is None else summary[key][sub]
            assert float(row[column]) == expected, column
        written = json.loads((out / row["dir"] / "summary.json").read_text())
        assert {k: v for k, v in written.items() if k != "wall_time_s" and k != "passes_per_s"} == {
            k: v for k, v in summary.items() if k != "wall_time_s" and k != "passes_per_s"}
        assert (out / row["dir"] / "telemetry.jsonl").is_file()
    # the async points do differ: the sweep really applied the overrides
    assert rows[0]["ttft_ms_mean"] != rows[1]["ttft_ms_mean"]
    doc = json.loads((out / "sweep.json").read_text())
    assert doc["keys"] == ["engine.num_gpu_blocks", "engine.async_scheduling"]
    assert [p["values"] for p in doc["points"]] == POINTS_2X2
    assert [p["status"] for p in doc["points"]] == ["ok"] * 4 and doc["failed"] == 0


def test_resumed_sweep_does_not_rerun_finished_points(swept, tmp_path):
    base, _ = swept
    out = tmp_path / "out"
    shutil.copytree(base / "out", out)
    shutil.copy(base / "tiny.yaml", tmp_path)
    shutil.copy(base / "grid.yaml", tmp_path)
    before_rows = read_rows(out)
    summaries = [out / r["dir"] / "summary.json" for r in before_rows]
    mtimes = [p.stat().st_mtime_ns for p in summaries]
    shutil.rmtree(summaries[2].parent)  # point 2 never finished
    stale = json.loads(summaries[0].read_text())  # point 0 holds another config's summary
    stale["config"]["engine"]["num_gpu_blocks"] = 999
    summaries[0].write_text(json.dumps(stale))

    result = invoke("sweep", tmp_path / "tiny.yaml", "--grid", tmp_path / "grid.yaml", "-o", out)
    assert result.exit_code == 0, result.output
    assert "4 points: 4 ok, 0 failed, 2 already done" in result.output
    assert [summaries[1].stat().st_mtime_ns, summaries[3].stat().st_mtime_ns] == [mtimes[1], mtimes[3]]
    assert summaries[2].is_file()
    assert json.loads(summaries[0].read_text())["config"]["engine"]["num_gpu_blocks"] == 64
    doc = json.loads((out / "sweep.json").read_text())
    assert [p["resumed"] for p in doc["points"]] == [False, True, False, True]
    assert without_wall_time(read_rows(out)) == without_wall_time(before_rows)


def _mooncake_rows(n, bad_line=None):
    rows = []
    for i in range(n):
        row = {"timestamp": 10 * i, "input_length": 600, "output_length": 8, "hash_ids": [2 * i, 2 * i + 1]}
        if i + 1 == bad_line:
            row["hash_ids"] = [2 * i]  # 600 tokens need 2 blocks of 512
        rows.append(json.dumps(row))
    return "\n".join(rows) + "\n"


def test_a_failing_point_is_recorded_and_the_others_complete(tmp_path):
    # The trace only turns out to be bad when the point loads it, at run time.
    (tmp_path / "good.jsonl").write_text(_mooncake_rows(10))
    (tmp_path / "bad.jsonl").write_text(_mooncake_rows(10, bad_line=4))
    (tmp_path / "trace.yaml").write_text(
        "workload: {trace: good.jsonl, trace_block_size: 512}\n"
        "engine: {block_size: 16, num_gpu_blocks: 512, timing: {type: fixed, prefill_ms: 10, decode_ms: 5}}\n")
    (tmp_path / "grid.yaml").write_text(
        "points:\n  - {workload.trace: good.jsonl}\n  - {workload.trace: bad.jsonl}\n"
        "  - {workload.trace: good.jsonl, engine.max_num_seqs: 2}\n")
    out = tmp_path / "out"
    result = invoke("sweep", tmp_path / "trace.yaml", "--grid", tmp_path / "grid.yaml", "-o", out, "-j", 2)
    assert result.exit_code == 1, result.output
    assert "3 points: 2 ok, 1 failed" in result.stdout
    assert "failed: point 1 (points/001-trace=bad.jsonl)" in result.stderr
    assert "bad.jsonl:4" in result.stderr
    rows = read_rows(out)
    assert [r["status"] for r in rows] == ["ok", "failed", "ok"]
    assert "bad.jsonl:4" in rows[1]["error"] and rows[1]["requests"] == ""
    assert rows[0]["finished"] == rows[2]["finished"] == "10"
    assert rows[2]["engine.max_num_seqs"] == "2" and rows[0]["engine.max_num_seqs"] == ""
    assert "bad.jsonl:4" in (out / rows[1]["dir"] / "error.txt").read_text()
    assert not (out / rows[1]["dir"] / "summary.json").exists()
    doc = json.loads((out / "sweep.json").read_text())
    assert [p["status"] for p in doc["points"]] == ["ok", "failed", "ok"] and doc["failed"] == 1


# ---------------------------------------------------------------- Ray


def test_ray_executor_gives_the_same_rows_as_the_local_one(swept, tmp_path):
    pytest.importorskip("ray", reason="Ray is an optional extra (pip install 'servesim[ray]'); not installed")
    base, _ = swept
    out = tmp_path / "out"
    result = invoke("sweep", base / "tiny.yaml", "--grid", base / "grid.yaml", "-o", out,
                    "--executor", "ray", "--jobs", 2)
    assert result.exit_code == 0, result.output
    assert without_wall_time(read_rows(out)) == without_wall_time(read_rows(base / "out"))
    for row in read_rows(out):
        assert (out / row["dir"] / "summary.json").is_file()


def test_ray_executor_without_ray_exits_2_with_the_install_hint(files, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    result = invoke("sweep", files / "tiny.yaml", "--grid", files / "grid.yaml", "-o", files / "out",
                    "--executor", "ray")
    assert result.exit_code == 2
    assert "pip install 'servesim[ray]'" in result.stderr
    assert not (files / "out").exists()


def test_ray_address_needs_the_ray_executor(files):
    with pytest.raises(InputError, match="--ray-address"):
        from servesim.sweep.sweep import sweep

        sweep(files / "tiny.yaml", files / "grid.yaml", files / "out", ray_address="auto")


def test_an_output_folder_that_cannot_be_made_exits_2_before_any_point(files):
    (files / "afile").write_text("")
    result = invoke("sweep", files / "tiny.yaml", "--grid", files / "grid.yaml", "-o", files / "afile" / "sub")
    assert result.exit_code == 2 and "a file is in the way" in result.output
    assert "Traceback" not in result.output


def test_a_second_sweep_on_a_folder_in_use_exits_2(files):
    from servesim.results.outdir import LOCK

    (files / "out").mkdir()
    (files / "out" / LOCK).write_text("1\n")  # pid 1 is alive: the folder is in use
    result = invoke("sweep", files / "tiny.yaml", "--grid", files / "grid.yaml", "-o", files / "out")
    assert result.exit_code == 2 and "in use" in result.output
    assert not (files / "out" / "points").exists()


# ---------------------------------------------------------------- faults: Ctrl-C, resume fingerprints


def test_sigint_stops_a_sweep_within_seconds_exit_130_and_rerunning_resumes(tmp_path):
    import os
    import signal
    import subprocess
    import time
    from pathlib import Path

    from helpers import answers_ctrl_c

    root = Path(__file__).resolve().parents[1]
    # each point runs for a second or more, so the interrupt lands mid-point
    (tmp_path / "slow.yaml").write_text(TINY.replace("requests: 20", "requests: 30000")
                                         .replace("rate: 50", "rate: 5000").replace("num_gpu_blocks: 64",
                                                                                     "num_gpu_blocks: 4096"))
    (tmp_path / "grid.yaml").write_text("engine.max_num_seqs: [8, 9, 10, 11, 12, 13]\n")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "servesim", "sweep", str(tmp_path / "slow.yaml"), "--grid",
           str(tmp_path / "grid.yaml"), "-o", str(out)]
    proc = subprocess.Popen(cmd, env=dict(os.environ, PYTHONPATH=str(root)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=answers_ctrl_c)
    first = out / "points" / "000-max_num_seqs=8" / "summary.json"
    deadline = time.monotonic() + 120
    while not first.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    time.sleep(0.3)  # the second point is running now
    proc.send_signal(signal.SIGINT)
    sent = time.monotonic()
    _, err = proc.communicate(timeout=30)
    assert time.monotonic() - sent < 5
    assert proc.returncode == 130, err
    assert err.count("interrupted") == 1 and "Traceback" not in err
    rows = read_rows(out)
    assert len(rows) == 6 and rows[0]["status"] == "ok" and rows[0]["finished"] == "30000"
    ok = [r for r in rows if r["status"] == "ok"]
    assert all(r["error"] == "not run" and r["requests"] == "" for r in rows[len(ok):])
    dirs = sorted(p.name for p in (out / "points").iterdir())
    assert dirs == [r["dir"].split("/")[1] for r in ok]  # the point in flight was removed

    again = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=str(root)), capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 0, again.stderr
    assert f"6 points: 6 ok, 0 failed, {len(ok)} already done" in again.stdout


def test_resume_reruns_points_whose_trace_changed_or_whose_outputs_are_incomplete(tmp_path):
    (tmp_path / "trace.jsonl").write_text(_mooncake_rows(10))
    (tmp_path / "trace.yaml").write_text(
        "workload: {trace: trace.jsonl, trace_block_size: 512}\n"
        "engine: {block_size: 16, num_gpu_blocks: 512, timing: {type: fixed, prefill_ms: 10, decode_ms: 5}}\n")
    (tmp_path / "grid.yaml").write_text("engine.max_num_seqs: [2, 4]\n")
    out = tmp_path / "out"
    args = ("sweep", tmp_path / "trace.yaml", "--grid", tmp_path / "grid.yaml", "-o", out)
    assert invoke(*args).exit_code == 0
    again = invoke(*args)
    assert "2 points: 2 ok, 0 failed, 2 already done" in again.stdout

    # an edited trace (same size, same config): every point reruns
    text = (tmp_path / "trace.jsonl").read_text()
    (tmp_path / "trace.jsonl").write_text(text.replace('"output_length": 8', '"output_length": 9', 1))
    edited = invoke(*args)
    assert edited.exit_code == 0 and "2 points: 2 ok, 0 failed;" in edited.stdout
    rows = read_rows(out)
    for row in rows:  # the reruns read the edited trace
        first = json.loads((out / row["dir"] / "requests.jsonl").read_text().splitlines()[0])
        assert first["output_length"] == 9
    assert "2 already done" in invoke(*args).stdout

    # a point missing an output its config asks for reruns
    (out / rows[1]["dir"] / "requests.jsonl").unlink()
    resumed = invoke(*args)
    assert "2 points: 2 ok, 0 failed, 1 already done" in resumed.stdout
    assert (out / rows[1]["dir"] / "requests.jsonl").is_file()


def test_resume_reruns_points_whose_fitted_model_changed(tmp_path):
    """Every file a point reads is in its fingerprint, not only the trace."""
    model = ("type: fitted\nfeatures: [intercept, num_prefill_requests, sum_prefill_tokens, "
             "num_decode_requests, sum_decode_kv_tokens]\ncoefficients_ms: [5.0, 1.0, 0.01, 0.2, 0.0]\n")
    (tmp_path / "m.yaml").write_text(model)
    (tmp_path / "trace.jsonl").write_text(_mooncake_rows(10))
    (tmp_path / "c.yaml").write_text(
        "workload: {trace: trace.jsonl, trace_block_size: 512}\n"
        "engine: {block_size: 16, num_gpu_blocks: 512, timing: {type: fitted, model: m.yaml}}\n")
    (tmp_path / "grid.yaml").write_text("engine.max_num_seqs: [2, 4]\n")
    args = ("sweep", tmp_path / "c.yaml", "--grid", tmp_path / "grid.yaml", "-o", tmp_path / "out")
    assert invoke(*args).exit_code == 0
    assert "2 already done" in invoke(*args).stdout
    (tmp_path / "m.yaml").write_text(model.replace("[5.0,", "[7.0,"))  # same path, same size
    edited = invoke(*args)
    assert edited.exit_code == 0 and "2 points: 2 ok, 0 failed;" in edited.stdout


def test_a_local_worker_counts_references_with_plain_adds():
    """A local sweep worker runs one point at a time on its one thread, so it
    takes the `servesim run` command's plain reference counts (servesim/jit.py)."""
    from servesim import jit
    from servesim.sweep.executors import local_executor

    assert list(local_executor(jit.refcounts_are_plain, [(0, ())])) == [(0, True)]


def test_an_interrupted_local_sweep_leaves_no_pool_thread_for_the_exit_to_wake():
    """Ctrl-C in a local sweep terminates the workers and waits for the pool's
    manager thread: one still closing its pipe when the interpreter exits made
    concurrent.futures print an EBADF traceback after "interrupted"."""
    import threading
    import time

    import pytest

    from servesim.sweep.executors import local_executor

    sweep = local_executor(time.sleep, [(0, (0.0,)), (1, (60.0,))], jobs=2)
    assert next(sweep) == (0, None)  # the second task is running now
    with pytest.raises(KeyboardInterrupt):
        sweep.throw(KeyboardInterrupt)
    managers = [t for t in threading.enumerate() if type(t).__name__ == "_ExecutorManagerThread"]
    assert managers == []


def test_the_debug_mode_goes_with_each_ray_task(monkeypatch):
    """--check reaches Ray workers that did not inherit the caller's
    environment (Ray started before SERVESIM_CHECK was set, as a cluster's)."""
    ray = pytest.importorskip("ray", reason="Ray is an optional extra; not installed")
    from servesim.scheduler import check
    from servesim.sweep.executors import ray_executor

    monkeypatch.delenv("SERVESIM_CHECK", raising=False)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        monkeypatch.setenv("SERVESIM_CHECK", "1")
        assert list(ray_executor(check.enabled, [(0, ())])) == [(0, True)]
    finally:
        ray.shutdown()


SPEC_BASE = """\
workload:
  synthetic: {requests: 24, input_tokens: 200, output_tokens: 30, concurrency: 4, seed: 1}
engine:
  num_gpu_blocks: 2000
  timing: {type: linear, base_ms: 10, per_token_ms: 0.01}
"""


def test_engine_speculative_is_a_grid_axis_with_speedups_over_the_plain_point(tmp_path):
    # null unsets engine.speculative (the plain point); each speculative point
    # gets its mean acceptance length and its speedups over the plain point of
    # the same concurrency, and the report plots the speedup against the load
    (tmp_path / "c.yaml").write_text(SPEC_BASE)
    (tmp_path / "g.yaml").write_text(
        "engine.speculative: [null, {method: eagle, num_speculative_tokens: 2}]\n"
        "workload.synthetic.concurrency: [2, 8]\n")
    out = tmp_path / "out"
    result = invoke("sweep", tmp_path / "c.yaml", "--grid", tmp_path / "g.yaml", "-o", out)
    assert result.exit_code == 0, result.output
    rows = read_rows(out)
    assert [r["mean_acceptance_length"] for r in rows[:2]] == ["", ""]
    for plain, spec in zip(rows[:2], rows[2:]):
        summary = json.loads((out / spec["dir"] / "summary.json").read_text())
        assert float(spec["mean_acceptance_length"]) == summary["speculative"]["mean_acceptance_length"]
        want = float(plain["tpot_ms_mean"]) / float(spec["tpot_ms_mean"])
        assert float(spec["tpot_speedup"]) == pytest.approx(want, abs=1e-4)
        want = float(spec["output_tokens_per_s"]) / float(plain["output_tokens_per_s"])
        assert float(spec["throughput_speedup"]) == pytest.approx(want, abs=1e-4)
    assert invoke("report", out).exit_code == 0
    assert "speedup against workload.synthetic.concurrency" in (out / "report.html").read_text()
    # its legends and ticks name a speculative value by method, k and acceptance
    from servesim.results.report import _spec_label

    assert [_spec_label(r["engine.speculative"]) for r in rows[1:3]] == ["plain", "eagle k=2"]
    assert _spec_label('{"method": "mtp", "num_speculative_tokens": 3, '
                       '"acceptance_rates": [0.5, 0.5, 0.5]}') == "mtp k=3, rates [0.5, 0.5, 0.5]"
    # a grid without engine.speculative keeps its columns
    from servesim.sweep.sweep import csv_columns

    (tmp_path / "g2.yaml").write_text("workload.synthetic.concurrency: [2, 8]\n")
    assert "tpot_speedup" not in csv_columns(load_grid(tmp_path / "g2.yaml"))
    assert "tpot_speedup" in csv_columns(load_grid(tmp_path / "g.yaml"))
