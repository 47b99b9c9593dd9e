"""Conformance with vLLM 0.33 under speculative decoding (MTP): every
recording in tests/golden/vllm-0.33-spec (a copy of the shared recordings,
with their README) is replayed through the public API, pass by pass (with
the pass log) and as compiled runs of passes (without it), and must match as
that README says: scheduled entries (ids, tokens, cached, kind, spec, in
order), preempted and finished (as sets), free blocks after schedule, the
number of passes, times for sync and timed async scenarios, and per request
the preemptions, first-admission hit, first-token and finish passes, output
tokens and times.
"""

import json
from pathlib import Path

import pytest

import servesim

GOLDEN = Path(__file__).parent / "golden" / "vllm-0.33-spec"
SCENARIOS = sorted(p.name for p in GOLDEN.iterdir() if p.is_dir())
TOL = 1e-6


def _read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(scope="module", params=SCENARIOS)
def scenario(request):
    d = GOLDEN / request.param
    with_log = servesim.run(str(d / "config.yaml"), pass_log=True)
    without_log = servesim.run(str(d / "config.yaml"))
    return d, with_log, without_log


def test_recordings_are_all_here():
    assert len(SCENARIOS) == 9


def test_passes_match_vllm(scenario):
    d, report, _ = scenario
    expected = _read_jsonl(d / "expected" / "passes.jsonl")
    got = report.pass_log
    for e, g in zip(expected, got):
        where = f"{d.name} pass {e['pass']}"
        assert g["pass"] == e["pass"], where
        assert g["scheduled"] == e["scheduled"], where
        assert sorted(g["preempted"]) == sorted(e["preempted"]), where
        assert sorted(g["finished"]) == sorted(e["finished"]), where
        assert g["free_blocks_after_schedule"] == e["free_blocks_after_schedule"], where
        if e["start_ms"] is not None:
            assert g["start_ms"] == pytest.approx(e["start_ms"], abs=TOL), where
            assert g["end_ms"] == pytest.approx(e["end_ms"], abs=TOL), where
    assert len(got) == len(expected)


def _check_requests(d, rec):
    expected = _read_jsonl(d / "expected" / "requests.jsonl")
    assert rec.ids == [e["id"] for e in expected]
    for i, e in enumerate(expected):
        where = f"{d.name} {e['id']}"
        assert rec.arrival_ms[i] == pytest.approx(e["arrival_ms"], abs=TOL), where
        assert rec.num_preemptions[i] == e["num_preemptions"], where
        assert rec.first_admission_cached_tokens[i] == e["first_admission_cached_tokens"], where
        assert rec.first_token_pass[i] == e["first_token_pass"], where
        assert rec.finish_pass[i] == e["finish_pass"], where
        assert rec.output_tokens[i] == e["output_tokens"], where
        for key in ("first_token_ms", "finish_ms"):
            if e[key] is not None:
                assert getattr(rec, key)[i] == pytest.approx(e[key], abs=TOL), where
        assert rec.status[i] == 0, where


def test_requests_match_vllm(scenario):
    d, report, _ = scenario
    _check_requests(d, report.records)


def test_requests_match_vllm_without_pass_log(scenario):
    """Compiled runs of passes (no pass log) give the same requests."""
    d, _, report = scenario
    _check_requests(d, report.records)
