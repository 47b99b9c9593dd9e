"""Conformance with SGLang 0.5.23: every case of tests/golden/sglang-0.5.23
(a copy of the shared recordings, with its README) is replayed with
`engine.backend: sglang` and compared as the recordings' README says:

- with the pass log, pass for pass: mode, scheduled rows (ids, kinds, tokens,
  prefix, cached, partial, in order), retracted and finished (as sets),
  evicted, free and evictable tokens, running and waiting sizes, the number
  of passes, new_token_ratio to 1e-9 and the times to 1e-6 ms;
- with and without the pass log, per request: retractions, cached tokens,
  first token / finish passes, output tokens, finish
  reason, and the times to 1e-6 ms.
"""

import functools
import json
import re
from pathlib import Path

import attrs
import pytest

from servesim.replay.api import resolve_config
from servesim.replay.api import simulate
from servesim.workload.load import load_workload

FOLDER = Path(__file__).parent / "golden" / "sglang-0.5.23"
TOL = 1e-6
CASES = sorted(d.name for d in FOLDER.iterdir() if d.is_dir())
REQUEST_EXACT = ("num_retractions", "first_admission_cached_tokens", "cached_tokens",
                 "first_token_pass", "finish_pass", "output_tokens", "finish_reason")
EXACT = ("mode", "scheduled", "evicted_tokens", "free_tokens_after_schedule",
         "evictable_tokens_after_schedule", "running_after_schedule", "waiting_after_schedule")


def _read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


@functools.lru_cache(maxsize=None)
def replay_case(name, pass_log):
    config = resolve_config(str(FOLDER / name / "config.yaml"))
    config = attrs.evolve(config, output=attrs.evolve(config.output, pass_log=pass_log))
    return simulate(config, load_workload(config.workload, config.engine.kv_cache.block_size))


def test_recordings_are_all_here():
    readme = (FOLDER / "README.md").read_text()
    listed = set(re.findall(r"^\|\s*`?(\d\d-[\w-]+)`?\s*\|", readme, flags=re.M))
    assert listed and listed == set(CASES)


@pytest.mark.parametrize("name", CASES)
def test_passes_match_sglang(name):
    got = replay_case(name, True).pass_log
    expected = _read_jsonl(FOLDER / name / "expected" / "passes.jsonl")
    for e, g in zip(expected, got):
        where = f"{name} pass {e['pass']}"
        assert g["pass"] == e["pass"], where
        for key in EXACT:
            assert g[key] == e[key], f"{where}: {key}"
        assert sorted(g["retracted"]) == sorted(e["retracted"]), where
        assert sorted(g["finished"]) == sorted(e["finished"]), where
        assert g["new_token_ratio"] == pytest.approx(e["new_token_ratio"], abs=1e-9), where
        assert g["start_ms"] == pytest.approx(e["start_ms"], abs=TOL), where
        assert g["end_ms"] == pytest.approx(e["end_ms"], abs=TOL), where
    assert len(got) == len(expected)


@pytest.mark.parametrize("pass_log", [True, False], ids=["pass-log", "runs"])
@pytest.mark.parametrize("name", CASES)
def test_requests_match_sglang(name, pass_log):
    rec = replay_case(name, pass_log).records
    expected = _read_jsonl(FOLDER / name / "expected" / "requests.jsonl")
    assert rec.ids == [e["id"] for e in expected]
    for i, e in enumerate(expected):
        where = f"{name} {e['id']}"
        for key in REQUEST_EXACT:
            assert getattr(rec, key)[i] == e[key], f"{where}: {key}"
        for key in ("arrival_ms", "first_token_ms", "finish_ms"):
            assert getattr(rec, key)[i] == pytest.approx(e[key], abs=TOL), f"{where}: {key}"
        assert rec.status[i] == 0, where
