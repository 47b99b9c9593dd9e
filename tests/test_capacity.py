"""`servesim capacity` and `servesim search` (servesim/capacity/): the
bracket-and-bisect search against closed forms and a brute-force sweep, the
deployment search against a sweep ranked by hand, outputs, bad input."""

import csv
import json

import pytest
from click.testing import CliRunner

from helpers import ONE_PER_PASS, TRUE_RATE, write
from servesim.capacity.capacity import FOUND, MAX_MET, UNMET, bracket_and_bisect, capacity, run_probe
from servesim.capacity.gpus import gpus_of
from servesim.capacity.load import load_of
from servesim.capacity.search import search
from servesim.config.slo import build_slos
from servesim.cli.main import main
from servesim.errors import InputError
from servesim.replay.api import resolve_config
from servesim.sweep.sweep import sweep

# A closed loop of 4-token requests, at most 4 running: up to 4 in flight
# every request takes exactly 4 passes of 10 ms; a fifth in flight waits.
CLOSED_LOOP = """\
workload:
  synthetic:
    requests: 40
    input_tokens: 16
    output_tokens: 4
    concurrency: 1
engine:
  max_num_seqs: 4
  max_num_batched_tokens: 64
  timing: {type: fixed, prefill_ms: 10, decode_ms: 10}
"""

# Mixed lengths arriving at a constant rate: no closed form, but latency
# grows with the rate.
MIXED = """\
workload:
  synthetic:
    requests: 150
    input_tokens: {distribution: uniform, min: 32, max: 256}
    output_tokens: {distribution: uniform, min: 2, max: 16}
    arrival: constant
    rate: 5
    seed: 7
engine:
  block_size: 16
  num_gpu_blocks: 256
  max_num_seqs: 8
  max_num_batched_tokens: 256
  timing: {type: linear, base_ms: 5, per_token_ms: 0.05}
"""


def meets(config, slos, key, value):
    cfg = resolve_config(config)
    return run_probe(config, (), load_of(cfg), value, slos)["meets"]


# --------------------------------------------------------------------------- the search itself


def test_bisect_on_a_threshold():
    calls = []

    def probe(v):
        calls.append(v)
        return {"meets": v <= 37.3}

    out = bracket_and_bisect(probe, 1.0, precision=0.02, min_value=1 / 1024, max_value=1024)
    assert out.status == FOUND
    assert 37.3 / 1.02 <= out.answer <= 37.3 and out.above > 37.3
    assert out.above <= round(out.answer * 1.02, 4)
    assert calls[:7] == [1, 2, 4, 8, 16, 32, 64] and [p for _, p in out.order].count("confirm") == 1
    assert len(calls) == len(set(calls))  # never the same probe twice


def test_bisect_integers_is_exact():
    out = bracket_and_bisect(lambda v: {"meets": v <= 13}, 1, integer=True, min_value=1, max_value=1000)
    assert (out.status, out.answer, out.above) == (FOUND, 13, 14)


def test_a_non_monotone_confirmation_searches_on():
    def probe(v):
        return {"meets": v <= 10 or 10.19 <= v <= 10.21}

    out = bracket_and_bisect(probe, 10.0, precision=0.02, min_value=0.01, max_value=1000)
    assert out.status == FOUND and out.answer == 10.2 and not probe(out.above)["meets"]
    assert out.notes and "not monotone" in out.notes[0]


def test_unmet_and_max_met():
    out = bracket_and_bisect(lambda v: {"meets": False}, 8.0, min_value=1.0, max_value=64)
    assert out.status == UNMET and out.answer is None and [v for v, _ in out.order] == [8, 4, 2, 1]
    out = bracket_and_bisect(lambda v: {"meets": True}, 8.0, min_value=1.0, max_value=50)
    assert out.status == MAX_MET and out.answer == 50 and [v for v, _ in out.order] == [8, 16, 32, 50]


# --------------------------------------------------------------------------- closed forms


def test_constant_rate_closed_form(tmp_path):
    config = write(tmp_path, ONE_PER_PASS)
    slos = build_slos([("ttft_p99_ms", 15)])
    doc = capacity(config, slos, precision=0.02)
    assert doc["status"] == FOUND and doc["load"]["key"] == "workload.synthetic.rate"
    assert TRUE_RATE / 1.02 <= doc["capacity"] <= TRUE_RATE < doc["above"]
    assert doc["binding_slo"] == "ttft_p99_ms"
    assert meets(config, slos, None, doc["capacity"]) and not meets(config, slos, None, doc["above"])
    assert doc["above"] == pytest.approx(doc["capacity"] * 1.02, rel=1e-5)
    # tighter precision, tighter answer
    fine = capacity(config, slos, precision=0.001)
    assert TRUE_RATE / 1.001 <= fine["capacity"] <= TRUE_RATE


def test_closed_loop_closed_form(tmp_path):
    config = write(tmp_path, CLOSED_LOOP)
    doc = capacity(config, build_slos([("e2e_p99_ms", 45)]))
    assert doc["load"]["key"] == "workload.synthetic.concurrency"
    assert (doc["status"], doc["capacity"], doc["above"]) == (FOUND, 4, 5)
    at = next(p for p in doc["probes"] if p["rate"] == 4)
    assert at["metrics"]["e2e_p99_ms"] == 40.0


def test_brute_force_sweep_agrees(tmp_path):
    config = write(tmp_path, MIXED)
    slos = build_slos([("ttft_p90_ms", 60), ("tpot_p90_ms", 12)])
    doc = capacity(config, slos, precision=0.02)
    assert doc["status"] == FOUND
    answer, above = doc["capacity"], doc["above"]
    grid = sorted({round(answer * f, 4) for f in (0.25, 0.5, 0.7, 0.85, 0.95, 1.0)}
                  | {round(above * f, 4) for f in (1.0, 1.1, 1.3, 1.6, 2.0)})
    out = sweep(config, write(tmp_path, f"workload.synthetic.rate: {grid}\n", "g.yaml"), tmp_path / "sw", jobs=2)
    with open(tmp_path / "sw" / "sweep.csv") as f:
        rows = list(csv.DictReader(f))
    assert not out.failed
    for row in rows:
        rate = float(row["workload.synthetic.rate"])
        ok = float(row["ttft_ms_p90"]) <= 60 and float(row["tpot_ms_p90"]) <= 12
        assert ok == (rate <= answer), (rate, answer, row["ttft_ms_p90"], row["tpot_ms_p90"])


def test_capacity_is_deterministic(tmp_path):
    config = write(tmp_path, MIXED)
    slos = build_slos([("ttft_p90_ms", 60)])
    a, b = (capacity(config, slos) for _ in range(2))
    a.pop("wall_time_s"), b.pop("wall_time_s")
    assert json.dumps(a) == json.dumps(b)


# --------------------------------------------------------------------------- the CLI


def test_cli_capacity_writes_json_and_report(tmp_path):
    config = write(tmp_path, ONE_PER_PASS + "slo:\n  ttft_p99_ms: 15\n")
    out = tmp_path / "o"
    result = CliRunner().invoke(main, ["capacity", config, "-o", str(out), "--report"])
    assert result.exit_code == 0, result.output
    assert "capacity: workload.synthetic.rate=" in result.output and "ttft_p99_ms" in result.output
    doc = json.loads((out / "capacity.json").read_text())
    assert doc["status"] == FOUND and len(doc["probes"]) >= 8
    html = (out / "report.html").read_text()
    assert 'data-plot="probe-curve"' in html and "binding SLO" in html


def test_cli_unmet_exits_1_with_the_probe_table(tmp_path):
    config = write(tmp_path, ONE_PER_PASS)
    result = CliRunner().invoke(main, ["capacity", config, "--slo", "ttft_p99_ms=5", "--min-rate", "2.5",
                                       "-o", str(tmp_path / "o")])
    assert result.exit_code == 1
    assert "no load meets the SLOs" in result.output and "ttft_p99_ms is 10" in result.output
    assert [line.split()[2] for line in result.output.splitlines() if " bracket " in line] == ["2.5", "5", "10"]


def test_cli_set_slo_overrides_the_config_slo_block(tmp_path):
    config = write(tmp_path, ONE_PER_PASS + "slo:\n  ttft_p99_ms: 50\n")
    args = ["capacity", config, "--min-rate", "2.5", "--max-rate", "50", "-o", str(tmp_path / "o")]
    assert CliRunner().invoke(main, args).exit_code == 0
    result = CliRunner().invoke(main, [*args, "--set", "slo.ttft_p99_ms=5"])
    assert result.exit_code == 1 and "no load meets the SLOs" in result.output
    result = CliRunner().invoke(main, [*args, "--set", "slo.ttft_p99_ms=0"])
    assert result.exit_code == 2 and "--set slo.ttft_p99_ms" in result.output, result.output


def test_cli_every_probe_meets_up_to_the_max(tmp_path):
    config = write(tmp_path, ONE_PER_PASS)
    result = CliRunner().invoke(main, ["capacity", config, "--slo", "ttft_p99_ms=50", "--max-rate", "50",
                                       "-o", str(tmp_path / "o")])
    assert result.exit_code == 0
    assert "every probe meets the SLOs up to the maximum workload.synthetic.rate=50.0" in result.output


@pytest.mark.parametrize("args, needle", [
    (["--slo", "ttft_p75_ms=100"], "'p75' is not offered"),
    (["--slo", "queue_p90_ms=100"], "unknown SLO metric"),
    (["--slo", "ttft_p90_ms=0"], "must be a number > 0"),
    ([], "no SLO given"),
    (["--slo", "ttft_p90_ms=100", "--precision", "0"], "--precision"),
    (["--slo", "ttft_p90_ms=100", "--start", "5000", "--max-rate", "100"], "must lie between"),
    (["--slo", "ttft_p90_ms=100", "--max-rate", "inf"], "--max-rate: must be a finite number > 0, got inf"),
    (["--slo", "ttft_p90_ms=100", "--start", "nan"], "--start: must be a finite number > 0, got nan"),
    # the config's rate is 10 req/s: the floor is 10 / 2^20
    (["--slo", "ttft_p90_ms=0.001", "--min-rate", "1e-300"],
     "--min-rate: 1e-300 is below the lowest load servesim probes, 9.53674e-06 (workload.synthetic.rate 10"),
    (["--slo", "ttft_p90_ms=0.001", "--start", "1e-9", "--min-rate", "1e-10"], "--start: 1e-09 is below"),
])
def test_cli_bad_input(tmp_path, args, needle):
    config = write(tmp_path, ONE_PER_PASS)
    result = CliRunner().invoke(main, ["capacity", config, *args, "-o", str(tmp_path / "o")])
    assert result.exit_code == 2 and needle in result.output and "Traceback" not in result.output
    assert not (tmp_path / "o").exists()


def test_a_burst_has_no_load(tmp_path):
    config = write(tmp_path, ONE_PER_PASS.replace("arrival: constant", "arrival: burst"))
    result = CliRunner().invoke(main, ["capacity", config, "--slo", "ttft_p90_ms=10"])
    assert result.exit_code == 2 and "a burst" in result.output and "no load to vary" in result.output


# --------------------------------------------------------------------------- GPUs


def test_gpus_of():
    assert gpus_of({"cluster": {"workers": 3, "data_parallel_size": 2}, "engine": {}}) == 6
    assert gpus_of({"cluster": {"workers": 2}, "engine": {"tensor_parallel_size": 4,
                                                         "pipeline_parallel_size": 2}}) == 16
    disagg = {"engine": {"tensor_parallel_size": 2},
              "cluster": {"mode": "disaggregated", "prefill_workers": 1, "decode_workers": 3,
                          "data_parallel_size": 1, "prefill": {"tensor_parallel_size": 4}, "decode": {}}}
    assert gpus_of(disagg) == 1 * 4 + 3 * 2


# --------------------------------------------------------------------------- search


GRID = "cluster.workers: [1, 2, 3]\nengine.max_num_seqs: [1, 2]\nengine.max_num_batched_tokens: [16, 32]\n"


def hand_ranking(tmp_path, config, rate, target):
    """A full sweep at `rate`, ranked by hand: points with TTFT p90 <= target
    by workers (GPUs), then margin, then grid order."""
    at_rate = write(tmp_path, open(config).read().replace("rate: 10", f"rate: {rate}"), "at_rate.yaml")
    sweep(at_rate, write(tmp_path, GRID, "g.yaml"), tmp_path / "sweep", jobs=2)
    with open(tmp_path / "sweep" / "sweep.csv") as f:
        rows = list(csv.DictReader(f))
    ok = [r for r in rows if float(r["ttft_ms_p90"]) <= target]
    ok.sort(key=lambda r: (int(r["cluster.workers"]), -(1 - float(r["ttft_ms_p90"]) / target), int(r["point"])))
    return [int(r["point"]) for r in ok]


def test_search_matches_a_sweep_ranked_by_hand(tmp_path):
    config = write(tmp_path, ONE_PER_PASS)
    slos = build_slos([("ttft_p90_ms", 30)])
    expected = hand_ranking(tmp_path, config, 250, 30)
    grid = write(tmp_path, GRID, "g.yaml")
    full = search(config, grid, slos, tmp_path / "full", rate=250, jobs=2, skip=False)
    assert full["ranking"] == expected and full["winner"] == expected[0]
    fast = search(config, grid, slos, tmp_path / "fast", rate=250, jobs=2)
    assert fast["winner"] == expected[0]
    winner_gpus = fast["points"][fast["winner"]]["gpus"]
    skipped = [p for p in fast["points"] if p["status"] == "skipped"]
    assert skipped and all(p["gpus"] > winner_gpus for p in skipped)
    assert all(p["status"] == "ok" for p in fast["points"] if p["gpus"] <= winner_gpus)
    # resuming runs nothing again and gives the same answer
    again = search(config, grid, slos, tmp_path / "fast", rate=250, jobs=2)
    assert all(p["resumed"] for p in again["points"] if p["status"] == "ok")
    assert again["ranking"] == fast["ranking"]
    with open(tmp_path / "fast" / "search.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["rank"] for r in rows if r["rank"]] and rows[fast["winner"]]["rank"] == "1"


def test_search_by_capacity_ranks_rate_per_gpu(tmp_path):
    config = write(tmp_path, ONE_PER_PASS)
    slos = build_slos([("ttft_p99_ms", 15)])
    grid = write(tmp_path, "cluster.workers: [1, 2]\n", "g.yaml")
    doc = search(config, grid, slos, tmp_path / "s", capacity_mode=True, jobs=2)
    per_gpu = [capacity(config, slos, overrides=(f"cluster.workers={w}",))["request_rate_per_gpu"] for w in (1, 2)]
    assert [p["request_rate_per_gpu"] for p in doc["points"]] == per_gpu
    assert doc["winner"] == max(range(2), key=lambda i: (per_gpu[i], -i))
    result = CliRunner().invoke(main, ["report", str(tmp_path / "s")])
    assert result.exit_code == 0 and 'data-plot="pareto"' in (tmp_path / "s" / "report.html").read_text()


def test_search_bad_input(tmp_path):
    config = write(tmp_path, ONE_PER_PASS)
    slos = build_slos([("ttft_p99_ms", 15)])
    grid = write(tmp_path, "workload.synthetic.rate: [1, 2]\n", "g.yaml")
    with pytest.raises(InputError, match="may not set the load"):
        search(config, grid, slos, tmp_path / "s", rate=5)
    ok_grid = write(tmp_path, "cluster.workers: [1, 2]\n", "ok.yaml")
    with pytest.raises(InputError, match="either --rate"):
        search(config, ok_grid, slos, tmp_path / "s", rate=5, capacity_mode=True)
    with pytest.raises(InputError, match="--rate: must be"):
        search(config, ok_grid, slos, tmp_path / "s", rate=-1)
    with pytest.raises(InputError, match="--rate: must be"):
        search(config, ok_grid, slos, tmp_path / "s", rate=float("inf"))
    for bounds, message in (({"max_rate": float("inf")}, "--max-rate: must be a finite"),
                            ({"min_rate": 1e-300}, "--min-rate: 1e-300 is below")):
        with pytest.raises(InputError, match=message):  # before any point
            search(config, ok_grid, slos, tmp_path / "s", capacity_mode=True, **bounds)
        assert not (tmp_path / "s").exists()
    result = CliRunner().invoke(main, ["search", config, "--grid", ok_grid, "--slo", "ttft_p99_ms=1",
                                       "--rate", "5", "-o", str(tmp_path / "none")])
    assert result.exit_code == 1 and "no point meets the SLOs" in result.output


# --------------------------------------------------------------------------- rejected and unfinished requests

# MIXED with max_model_len 128 rejects the prompts of 128 tokens or more at
# arrival (93 of its 150): the rest see a lighter load and lower latency.
SHEDDING_GRID = "engine.max_model_len: [4096, 128]\n"


def test_a_point_that_rejects_requests_never_wins(tmp_path):
    config = write(tmp_path, MIXED)
    grid = write(tmp_path, SHEDDING_GRID, "g.yaml")
    out = tmp_path / "s"
    result = CliRunner().invoke(main, ["search", config, "--grid", grid, "--slo", "ttft_p90_ms=60",
                                       "--rate", "40", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "no request rejected or unfinished (--allow-rejected FRACTION allows some)" in result.output
    doc = json.loads((out / "search.json").read_text())
    keeps, sheds = doc["points"]
    assert (keeps["rejected"], keeps["unfinished"], sheds["rejected"], sheds["unfinished"]) == (0, 0, 93, 0)
    # the shedding point's latency is lower (its margin larger), yet it misses: the gate binds
    assert sheds["margin"] > keeps["margin"] and sheds["metrics"]["ttft_p90_ms"] <= 60
    assert not sheds["meets"] and sheds["binding_slo"] == "completed" and "completed" in sheds["violated"]
    assert doc["winner"] == 0 and doc["ranking"] == [0]
    with open(out / "search.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["rejected"], r["unfinished"], r["meets"]) for r in rows] == [("0", "0", "true"), ("93", "0", "false")]
    # allowed up to 60% of the requests: 93/150 = 62% still misses; 65% lets it win on margin
    assert search(config, grid, build_slos([("ttft_p90_ms", 60), ("allow_rejected", 0.6)]), tmp_path / "a",
                  rate=40)["ranking"] == [0]
    allowed = search(config, grid, build_slos([("ttft_p90_ms", 60), ("allow_rejected", 0.65)]),
                     tmp_path / "b", rate=40)
    assert allowed["ranking"] == [1, 0] and allowed["slo"]["allow_rejected"] == 0.65
    # a result recorded before the gate existed (no allowance in its file) is not resumed
    old = out / keeps["dir"] / "slo.json"
    recorded = json.loads(old.read_text())
    del recorded["allow_rejected"]
    old.write_text(json.dumps(recorded))
    again = search(config, grid, build_slos([("ttft_p90_ms", 60)]), out, rate=40)
    assert [p["resumed"] for p in again["points"]] == [False, True]
    result = CliRunner().invoke(main, ["search", config, "--grid", grid, "--slo", "ttft_p90_ms=60", "--rate", "40",
                                       "--allow-rejected", "0.65", "-o", str(tmp_path / "b"), "--report"])
    assert result.exit_code == 0, result.output
    assert "at most 0.65 of the requests rejected or unfinished" in result.output
    assert "1. point 1 (engine.max_model_len=128): 1 GPU(s), margin" in result.output
    assert "93 rejected + 0 unfinished" in result.output
    page = (tmp_path / "b" / "report.html").read_text()
    assert "<th>rejected</th><th>unfinished</th>" in page and "<td>93</td>" in page


def test_capacity_names_the_rejected_requests_when_they_bind(tmp_path):
    config = write(tmp_path, MIXED)
    result = CliRunner().invoke(main, ["capacity", config, "--slo", "ttft_p90_ms=60", "--set",
                                       "engine.max_model_len=128", "--max-rate", "10", "-o", str(tmp_path / "o")])
    # rejections at arrival do not go away at a lower load: no load meets
    assert result.exit_code == 1, result.output
    assert "93 of 150 requests rejected and 0 unfinished (allowed: 0 of the requests" in result.output
    assert "93+0*" in result.output
    result = CliRunner().invoke(main, ["capacity", config, "--slo", "ttft_p90_ms=60", "--set",
                                       "engine.max_model_len=128", "--allow-rejected", "nan",
                                       "-o", str(tmp_path / "o")])
    assert result.exit_code == 2 and "--allow-rejected: must be a fraction of the requests in [0, 1]" in result.output


# --------------------------------------------------------------------------- lower bounds


def test_search_by_capacity_marks_a_lower_bound(tmp_path):
    # one worker sustains ~TRUE_RATE; two would sustain twice that, but
    # --max-rate stops them first: their capacity is only a lower bound
    config = write(tmp_path, ONE_PER_PASS)
    grid = write(tmp_path, "cluster.workers: [1, 2]\n", "g.yaml")
    out = tmp_path / "s"
    doc = search(config, grid, build_slos([("ttft_p99_ms", 15)]), out, capacity_mode=True,
                 max_rate=1.5 * TRUE_RATE)
    one, two = doc["points"]
    assert (one["capacity_status"], one["capacity_is_lower_bound"]) == (FOUND, False)
    assert (two["capacity_status"], two["capacity_is_lower_bound"]) == (MAX_MET, True)
    with open(out / "search.csv") as f:
        assert [r["capacity_is_lower_bound"] for r in csv.DictReader(f)] == ["false", "true"]
    assert doc["ranking"] == [0, 1]  # 1 GPU at ~TRUE_RATE beats 2 at >= 0.75 TRUE_RATE per GPU


def test_a_lower_bound_ranks_after_an_exact_capacity_of_equal_value():
    from servesim.capacity.search import SearchPoint, _capacity_key

    def point(index, gpus, above):
        row = {"request_rate_per_gpu": 5.0, "capacity": 10.0, "above": above}
        return SearchPoint(index, {}, "", gpus, {}, row=row)

    bound, exact, exact_more_gpus = point(0, 1, None), point(1, 2, 10.2), point(2, 4, 10.2)
    ranked = sorted([bound, exact, exact_more_gpus], key=_capacity_key)
    assert [p.index for p in ranked] == [1, 2, 0]


# --------------------------------------------------------------------------- sessions

def sessions_config(tmp_path, name="sessions.yaml", **sessions):
    """test_sessions' synthetic sessions (its compiled engine), 20 of 2 turns, as a config file."""
    from test_sessions import synthetic_sessions

    keys = dict(count=20, turns=2, new_input_tokens={"distribution": "uniform", "min": 50, "max": 200},
                output_tokens={"distribution": "uniform", "min": 5, "max": 30}, think_time=100)
    return write(tmp_path, json.dumps(synthetic_sessions(**keys, **sessions)), name)


def test_capacity_varies_the_session_rate(tmp_path):
    config = sessions_config(tmp_path, sessions_per_second=5)
    load = load_of(resolve_config(config))
    assert (load.key, load.unit, load.start) == ("workload.synthetic.sessions.sessions_per_second", "sessions/s", 5)
    assert resolve_config(config, (load.override(40),)).workload.synthetic.sessions.sessions_per_second == 40
    doc = capacity(config, build_slos([("ttft_p90_ms", 20)]), max_rate=640)
    assert doc["status"] == FOUND and doc["load"]["key"] == load.key
    assert meets(config, build_slos([("ttft_p90_ms", 20)]), None, doc["capacity"])
    assert not meets(config, build_slos([("ttft_p90_ms", 20)]), None, doc["above"])
    at_0 = sessions_config(tmp_path, "burst.yaml")
    result = CliRunner().invoke(main, ["capacity", at_0, "--slo", "ttft_p90_ms=20"])
    assert result.exit_code == 2 and "sessions that all start at 0 have no load to vary" in result.output


def test_cli_an_unwritable_output_folder_fails_before_any_probe(tmp_path):
    config = write(tmp_path, ONE_PER_PASS)
    (tmp_path / "afile").write_text("")
    result = CliRunner().invoke(main, ["capacity", config, "--slo", "ttft_p99_ms=15",
                                       "-o", str(tmp_path / "afile" / "o")])
    assert result.exit_code == 2 and "a file is in the way" in result.output
    assert "probe" not in result.output and "Traceback" not in result.output


def test_cli_search_an_unwritable_output_folder_fails_before_any_point(tmp_path):
    config = write(tmp_path, ONE_PER_PASS)
    grid = write(tmp_path, "cluster.workers: [1, 2]\n", "g.yaml")
    (tmp_path / "afile").write_text("")
    result = CliRunner().invoke(main, ["search", config, "--grid", grid, "--slo", "ttft_p99_ms=15",
                                       "--rate", "5", "-o", str(tmp_path / "afile" / "sub")])
    assert result.exit_code == 2 and "a file is in the way" in result.output
    assert "Traceback" not in result.output


def test_run_and_validate_both_refuse_a_bad_slo_block(tmp_path):
    config = write(tmp_path, ONE_PER_PASS + "slo:\n  ttft_p99_ms: abc\n")
    for args in (["validate", config], ["run", config, "-o", str(tmp_path / "o"), "-q"]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2 and "ttft_p99_ms" in result.output, result.output
    assert not (tmp_path / "o").exists()


# --------------------------------------------------------------------------- warnings

# Prompts of 8-24 tokens, a 16-token budget and chunked prefill off: every
# probe has requests that can never finish, and warns so.
NEVER_FINISH = ONE_PER_PASS.replace("input_tokens: 16", "input_tokens: {distribution: uniform, min: 8, max: 24}") \
    .replace("max_num_batched_tokens: 16", "max_num_batched_tokens: 16\n  enable_chunked_prefill: false")


def _warning_lines(text):
    assert "UserWarning" not in text and ".py:" not in text, text
    lines = [line for line in text.splitlines() if line.startswith("warning: ")]
    assert lines and len(lines) == len(set(lines)), text
    assert all("could never finish" in line for line in lines), text
    return lines


def test_capacity_prints_each_warning_once_as_a_warning_line(tmp_path):
    config = write(tmp_path, NEVER_FINISH)
    # (the requests that never finish are allowed: the test is about the warnings)
    result = CliRunner().invoke(main, ["capacity", config, "--slo", "ttft_p99_ms=50", "--allow-rejected", "1",
                                       "-q", "-o", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    _warning_lines(result.output)


def test_search_points_print_each_warning_once_as_a_warning_line(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    config = write(tmp_path, NEVER_FINISH)
    grid = write(tmp_path, "cluster.workers: [1, 2]\n", "g.yaml")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    # the points run in worker processes: their stderr is the command's
    result = subprocess.run([sys.executable, "-m", "servesim", "search", config, "--grid", grid,
                             "--slo", "ttft_p99_ms=50", "--allow-rejected", "1", "--rate", "10",
                             "-o", str(tmp_path / "s")],
                            env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert len(_warning_lines(result.stderr)) == 1  # both points warn the same text
