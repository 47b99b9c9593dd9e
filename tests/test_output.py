"""Report files (spec README §6, §7 atomic writes, §8 byte-identical output)."""

import json

import numpy as np
import pytest

from servesim.results import output
from servesim.results.metrics import summarize
from servesim.results.output import REQUEST_FIELDS, write_outputs
from servesim.results.records import (
    STATUS_FINISHED,
    STATUS_REJECTED,
    STATUS_UNFINISHED,
    RequestRecords,
    RunStats,
    SimulationResult,
    WorkerStats,
)

NAN = float("nan")


def make_result(pass_log=None, telemetry=None):
    """Three requests:
    a: finished, arrives 0, scheduled 1, tokens reach the client at 10, 14, 20
       -> ttft 10, e2e 20, tpot (20-10)/2 = 5
    b: finished with a single token at 12 (arrives 2) -> ttft 10, e2e 10, tpot null
    c: rejected: never scheduled, every time and pass null
    """
    return SimulationResult(
        records=RequestRecords(
            ids=["a", "b", 7],
            arrival_ms=np.array([0.0, 2.0, 3.0]),
            first_scheduled_ms=np.array([1.0, 2.5, NAN]),
            first_token_ms=np.array([10.0, 12.0, NAN]),
            finish_ms=np.array([20.0, 12.0, NAN]),
            input_length=np.array([100, 50, 99999], dtype=np.int64),
            output_length=np.array([3, 1, 4], dtype=np.int64),
            output_tokens=np.array([3, 1, 0], dtype=np.int64),
            num_preemptions=np.array([1, 0, 0], dtype=np.int64),
            first_admission_cached_tokens=np.array([16, 0, 0], dtype=np.int64),
            cpu_tier_cached_tokens=np.array([0, 0, 0], dtype=np.int64),
            recomputed_tokens=np.array([101, 0, 0], dtype=np.int64),
            worker=np.array([0, 0, 0], dtype=np.int64),
            dp_rank=np.array([0, 0, -1], dtype=np.int64),
            status=np.array([STATUS_FINISHED, STATUS_FINISHED, STATUS_REJECTED], dtype=np.int8),
            first_token_pass=np.array([0, 1, -1], dtype=np.int64),
            finish_pass=np.array([2, 1, -1], dtype=np.int64),
            token_offsets=np.array([0, 3, 4, 4], dtype=np.int64),
            token_client_ms=np.array([10.0, 14.0, 20.0, 12.0]),
        ),
        stats=RunStats(passes=3, workers=[WorkerStats(worker=0, requests=3, passes=3)]),
        pass_log=pass_log,
        telemetry=telemetry,
    )


PASS_LOG = [
    {"pass": 0, "worker": 0, "dp_rank": 0, "start_ms": 0.0, "end_ms": 10.0,
     "scheduled": [{"id": "a", "tokens": 100, "cached": 16, "kind": "new"}],
     "preempted": [], "finished": [], "free_blocks_after_schedule": 90},
]
TELEMETRY = [{"t_ms": 0.0, "running": 1, "waiting": 0, "kv_usage": 0.1}]


def read_lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def write(out, result, per_request=True, pass_log=True, telemetry=True):
    summary = summarize(result, {"engine": {"block_size": 16}}, 0.25)
    return write_outputs(out, summary, result, per_request, pass_log, telemetry)


def test_requests_jsonl_fields_order_and_nulls(tmp_path):
    write(tmp_path, make_result())
    rows = read_lines(tmp_path / "requests.jsonl")
    assert [list(r) for r in rows] == [list(REQUEST_FIELDS)] * 3
    a, b, c = rows
    assert (a["id"], a["ttft_ms"], a["e2e_ms"], a["tpot_ms"]) == ("a", 10.0, 20.0, 5.0)
    assert (a["first_token_pass"], a["finish_pass"], a["status"]) == (0, 2, "finished")
    assert (b["ttft_ms"], b["e2e_ms"], b["tpot_ms"]) == (10.0, 10.0, None)  # one token
    assert c["id"] == 7 and c["status"] == "rejected"
    for key in ("first_scheduled_ms", "first_token_ms", "finish_ms", "ttft_ms", "tpot_ms",
                "e2e_ms", "first_token_pass", "finish_pass"):
        assert c[key] is None, key
    assert (c["input_length"], c["output_length"], c["output_tokens"], c["dp_rank"]) == (99999, 4, 0, -1)


def test_unfinished_request_has_no_latencies(tmp_path):
    result = make_result()
    result.records.status[0] = STATUS_UNFINISHED
    write(tmp_path, result)
    a = read_lines(tmp_path / "requests.jsonl")[0]
    assert (a["status"], a["ttft_ms"], a["tpot_ms"], a["e2e_ms"]) == ("unfinished", None, None, None)
    assert a["first_token_ms"] == 10.0  # the raw time is still reported


def test_passes_and_telemetry_lines_keep_key_order(tmp_path):
    write(tmp_path, make_result(PASS_LOG, TELEMETRY))
    assert read_lines(tmp_path / "passes.jsonl") == PASS_LOG
    assert list(read_lines(tmp_path / "passes.jsonl")[0]) == list(PASS_LOG[0])
    assert read_lines(tmp_path / "telemetry.jsonl") == TELEMETRY
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["finished"] == 2 and summary["config"] == {"engine": {"block_size": 16}}
    assert (tmp_path / "summary.json").read_text().startswith('{\n  "requests": 3,')


def test_output_dir_created_and_no_temporary_files_left(tmp_path):
    out = tmp_path / "a" / "b"
    write(out, make_result(PASS_LOG, TELEMETRY))
    assert sorted(p.name for p in out.iterdir()) == [
        ".servesim-manifest", "itl_quantiles.json", "passes.jsonl", "requests.jsonl", "summary.json",
        "telemetry.jsonl",
    ]


def test_repeat_writes_are_byte_identical(tmp_path):
    write(tmp_path / "one", make_result(PASS_LOG, TELEMETRY))
    write(tmp_path / "two", make_result(PASS_LOG, TELEMETRY))
    for name in ("requests.jsonl", "passes.jsonl", "telemetry.jsonl"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()
    s1 = json.loads((tmp_path / "one" / "summary.json").read_text())
    s2 = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert s1 == s2


def test_float_text_is_python_repr(tmp_path):
    result = make_result()
    result.records.arrival_ms[0] = 0.1 + 0.2  # 0.30000000000000004
    write(tmp_path, result)
    line = (tmp_path / "requests.jsonl").read_text().splitlines()[0]
    assert '"arrival_ms": 0.30000000000000004,' in line
    assert line == json.dumps(json.loads(line))  # same text json.dumps would write


def test_each_distinct_float_formatted_once_gives_the_texts_of_repr():
    # requests.jsonl's float columns: repr of every value, null for NaN and inf,
    # whether formatted value by value (short arrays, a negative zero) or once per
    # distinct value (repeated pass instants)
    rng = np.random.default_rng(7)
    instants = np.cumsum(rng.exponential(30.0, 50))
    column = rng.choice(instants, 5000)
    column[::97] = np.nan
    column[5] = np.inf
    column[6] = 0.0
    for arr in (column, column[:10], np.array([0.0, -0.0] * 40), np.array([1e-300, 5e-324, 1.7e308] * 30)):
        expected = [repr(v) if np.isfinite(v) else "null" for v in arr.tolist()]
        assert output._floats(arr) == expected
    # and the integer columns: str of each value, a pass index of -1 null
    counts = rng.choice(np.array([0, 1, 7, 1024, -1, 2**40]), 3000)
    for arr in (counts, counts[:9], np.abs(counts)):
        assert output._ints(arr) == [str(v) for v in arr.tolist()]
        assert output._passes(arr) == ["null" if v < 0 else str(v) for v in arr.tolist()]


def test_stale_files_of_a_previous_run_are_removed(tmp_path):
    write(tmp_path, make_result(PASS_LOG, TELEMETRY))
    (tmp_path / "notes.txt").write_text("mine")
    write(tmp_path, make_result(), per_request=False, pass_log=False, telemetry=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".servesim-manifest", "notes.txt", "summary.json"]


def test_pass_log_not_written_when_result_has_none(tmp_path):
    write(tmp_path, make_result(PASS_LOG))  # a previous run's passes.jsonl
    assert (tmp_path / "passes.jsonl").exists()
    write(tmp_path, make_result(pass_log=None), pass_log=True)
    assert not (tmp_path / "passes.jsonl").exists()


def test_failure_while_writing_leaves_previous_report_untouched(tmp_path):
    write(tmp_path, make_result(PASS_LOG, TELEMETRY))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    bad = make_result([{"pass": object()}], TELEMETRY)  # not JSON: fails in passes.jsonl
    with pytest.raises(TypeError):
        write(tmp_path, bad)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_failure_on_the_last_file_leaves_no_final_files(tmp_path, monkeypatch):
    # requests.jsonl is fully written to its temporary name before summary.json fails.
    def failing_dumps(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(output.json, "dumps", failing_dumps)
    out = tmp_path / "new"
    with pytest.raises(RuntimeError, match="disk full"):
        write(out, make_result(), pass_log=False, telemetry=False)
    assert list(out.iterdir()) == []


def test_nan_in_summary_is_refused_not_written(tmp_path):
    result = make_result()
    summary = summarize(result, {}, 0.1)
    summary["kv_usage_mean"] = NAN
    with pytest.raises(ValueError):
        write_outputs(tmp_path, summary, result, True, False, False)
    assert list(tmp_path.iterdir()) == []
