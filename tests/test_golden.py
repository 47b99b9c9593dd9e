"""Conformance with vLLM 0.33: every recorded scenario of every recordings set
in tests/golden (copies of the shared recordings, each with its README) is
replayed and must match as the recordings' README says.

Each scenario is replayed both with the pass log and without it — the way
users run it, which hands stretches of passes to compiled runs:

- with the pass log, pass for pass: scheduled entries (ids, tokens, cached,
  kind, and any further keys the recording has, in order), preempted and
  finished (as sets), free blocks after schedule, the number of passes, and
  sync start and end times to 1e-6 ms;
- in both modes, per request: the preemptions, first-admission hit,
  first-token and finish passes (and output tokens where given), and the
  first-token and finish times to 1e-6 ms where the recording has them.

A further recordings set plugs in by adding its folder to FOLDERS;
`vllm-0.33-spec` holds speculative decoding (MTP).
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

GOLDEN = Path(__file__).parent / "golden"
FOLDERS = ["vllm-0.33", "vllm-0.33-spec"]
TOL = 1e-6
SCENARIOS = [(folder, d.name) for folder in FOLDERS
             for d in sorted((GOLDEN / folder).iterdir()) if d.is_dir()]
REPLAYS = [(folder, name, pass_log) for folder, name in SCENARIOS
           for pass_log in (True, False)]
LOGGED = [r for r in REPLAYS if r[2]]


def _read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _replay_id(replay):
    folder, name, pass_log = replay
    return f"{folder}/{name}-{'pass-log' if pass_log else 'runs'}"


@functools.lru_cache(maxsize=None)
def replay_scenario(folder, name, pass_log):
    """`(scenario dir, SimulationResult)` of one recorded scenario, with or
    without the pass log."""
    d = GOLDEN / folder / name
    config = resolve_config(str(d / "config.yaml"))
    config = attrs.evolve(config, output=attrs.evolve(config.output, pass_log=pass_log))
    workload = load_workload(config.workload, config.engine.kv_cache.block_size)
    return d, simulate(config, workload)


@pytest.fixture
def replay(request):
    return replay_scenario(*request.param)


@pytest.mark.parametrize("folder", FOLDERS)
def test_recordings_are_all_here(folder):
    """Every scenario the set's README lists has its folder, and no more."""
    readme = (GOLDEN / folder / "README.md").read_text()
    listed = set(re.findall(r"^\|\s*`?(\d\d-[\w-]+)`?\s*\|", readme, flags=re.M))
    assert listed and listed == {name for f, name in SCENARIOS if f == folder}


@pytest.mark.parametrize("replay", LOGGED, ids=_replay_id, indirect=True)
def test_passes_match_vllm(replay):
    d, result = replay
    got = result.pass_log
    expected = _read_jsonl(d / "expected" / "passes.jsonl")
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


@pytest.mark.parametrize("replay", REPLAYS, ids=_replay_id, indirect=True)
def test_requests_match_vllm(replay):
    d, result = replay
    rec = result.records
    expected = _read_jsonl(d / "expected" / "requests.jsonl")
    assert rec.ids == [e["id"] for e in expected]
    for i, e in enumerate(expected):
        where = f"{d.name} {e['id']}"
        assert rec.arrival_ms[i] == pytest.approx(e["arrival_ms"], abs=TOL), where
        assert rec.num_preemptions[i] == e["num_preemptions"], where
        assert rec.first_admission_cached_tokens[i] == e["first_admission_cached_tokens"], where
        assert rec.first_token_pass[i] == e["first_token_pass"], where
        assert rec.finish_pass[i] == e["finish_pass"], where
        if "output_tokens" in e:
            assert rec.output_tokens[i] == e["output_tokens"], where
        for key in ("first_token_ms", "finish_ms"):
            if e[key] is not None:
                assert getattr(rec, key)[i] == pytest.approx(e[key], abs=TOL), where
        assert rec.status[i] == 0, where
