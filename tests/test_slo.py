"""SLOs (servesim/config/slo.py): `--slo` and `slo:` parsing, bad input,
and checking a run against them, goodput included."""

import pytest
from click.testing import CliRunner

from servesim.config.slo import (build_slos, evaluate, goodput_fraction, load_slos, parse_slo_option,
                                   slos_from_dict)
from servesim.cli.main import main
from servesim.errors import InputError
from servesim.replay.api import run

from helpers import ONE_PER_PASS as AT_10, write

# One request per 10 ms pass (max_num_seqs 1, one output token): at a
# constant rate r > 100 req/s request i waits, TTFT_i = 10 + i * (10 - 1000/r).
ONE_PER_PASS = AT_10.replace("rate: 10\n", "rate: 150\n")
assert ONE_PER_PASS != AT_10


def test_options_and_block_merge(tmp_path):
    path = write(tmp_path, ONE_PER_PASS + "slo:\n  ttft_p90_ms: 2000\n  e2e_p50_ms: 900\n")
    slos = load_slos(path, ["ttft_p90_ms=1500", "itl_p99_ms=100"])
    assert slos.targets() == {"ttft_p90_ms": 1500.0, "e2e_p50_ms": 900.0, "itl_p99_ms": 100.0}
    assert [p[1:3] for p in slos.percentiles] == [("ttft_ms", "p90"), ("e2e_ms", "p50"), ("itl_ms", "p99")]
    assert slos_from_dict(slos.to_dict()) == slos
    assert slos.allow_rejected == 0 and "allow_rejected" not in slos.to_dict()
    assert "no request rejected or unfinished" in slos.describe()
    allowing = load_slos(path, ["ttft_p90_ms=1500"], allow_rejected=0.05)
    assert allowing.allow_rejected == 0.05 and slos_from_dict(allowing.to_dict()) == allowing
    assert "at most 0.05 of the requests rejected or unfinished" in allowing.describe()
    with pytest.raises(InputError, match=r"--allow-rejected: must be a fraction of the requests in \[0, 1\], got 2"):
        load_slos(path, allow_rejected=2)


def test_goodput_with_per_request_targets():
    slos = build_slos([("goodput", 0.9), ("ttft_ms", 200), ("tpot_ms", 20)])
    assert slos.goodput == 0.9 and slos.per_request == (("ttft_ms", 200.0), ("tpot_ms", 20.0))
    assert slos.names == ["goodput"]


@pytest.mark.parametrize("items, needle", [
    ([("ttft_p75_ms", 10)], "statistic 'p75' is not offered; offered: mean, p50, p90, p95, p99"),
    ([("ttft_max_ms", 10)], "'max' is not offered"),
    ([("ttft_p90_ms", 10), ("allow_rejected", 1.5)], "allow_rejected: must be a fraction of the requests in [0, 1]"),
    ([("ttft_p90_ms", 10), ("allow_rejected", -0.1)], "allow_rejected: must be a fraction"),
    ([("allow_rejected", 0.1)], "no SLO given"),
    ([("tfft_p90_ms", 10)], "unknown SLO metric (did you mean 'ttft_p90_ms'?)"),
    ([("latency", 10)], "unknown SLO metric"),
    ([("ttft_p90_ms", 0)], "must be a number > 0"),
    ([("itl_p99_ms", -5)], "must be a number > 0"),
    ([("ttft_p90_ms", "fast")], "must be a number"),
    ([("goodput", 1.5), ("ttft_ms", 10)], "fraction in (0, 1]"),
    ([("goodput", 0), ("ttft_ms", 10)], "fraction in (0, 1]"),
    ([("ttft_ms", 100)], "add goodput=FRACTION"),
    ([("goodput", 0.9)], "needs at least one per-request target"),
    ([("goodput", 0.9), ("itl_ms", 10)], "ITL has no per-request value"),
    ([], "no SLO given"),
])
def test_bad_slos(items, needle):
    with pytest.raises(InputError, match=None) as e:
        build_slos(items)
    assert needle in str(e.value)


def test_bad_option_text():
    with pytest.raises(InputError, match="expected METRIC=VALUE"):
        parse_slo_option("ttft_p90_ms")
    with pytest.raises(InputError, match="must be a number, got 'abc'"):
        parse_slo_option("ttft_p90_ms=abc")


def test_block_error_names_file_and_line(tmp_path):
    path = write(tmp_path, ONE_PER_PASS + "slo:\n  ttft_p90_ms: 2000\n  tpot_p80_ms: 5\n")
    with pytest.raises(InputError) as e:
        load_slos(path)
    assert f"{path}:14: slo.tpot_p80_ms" in str(e.value)
    result = CliRunner().invoke(main, ["validate", path])
    assert result.exit_code == 2 and "tpot_p80_ms" in result.output and "Traceback" not in result.output
    result = CliRunner().invoke(main, ["capacity", path, "--slo", "ttft_p90_ms=-1", "-o", str(tmp_path / "o")])
    assert result.exit_code == 2 and "--slo ttft_p90_ms: the target must be a number > 0" in result.output
    assert not (tmp_path / "o").exists()


def test_repeated_option_is_an_error(tmp_path):
    path = write(tmp_path, ONE_PER_PASS)
    with pytest.raises(InputError, match="given twice"):
        load_slos(path, ["ttft_p90_ms=1", "ttft_p90_ms=2"])


def test_a_run_with_an_slo_block_still_replays(tmp_path):
    path = write(tmp_path, ONE_PER_PASS + "slo:\n  ttft_p90_ms: 2000\n")
    assert run(path).summary["finished"] == 100


def test_evaluate_against_the_closed_form(tmp_path):
    report = run(write(tmp_path, ONE_PER_PASS))
    d = 10 - 1000 / 150
    # p90 of 10 + i*d over i = 0..99 (linear interpolation): rank 89.1
    p90 = 10 + 89.1 * d
    assert report.summary["ttft_ms"]["p90"] == pytest.approx(p90, abs=1e-5)
    slos = build_slos([("ttft_p90_ms", 320.0), ("e2e_p50_ms", 1000.0)])
    ev = evaluate(slos, report.summary, report.records)
    assert ev["meets"] is True and ev["violated"] == []
    assert ev["ratios"]["ttft_p90_ms"] == pytest.approx(p90 / 320, abs=1e-6)
    assert ev["margin"] == pytest.approx(1 - p90 / 320, abs=1e-6)
    # the mean: 10 + 49.5 d over i = 0..99; a mean target beside a percentile
    mean = build_slos([("ttft_mean_ms", 10 + 49.5 * d + 0.01), ("ttft_p90_ms", 320.0)])
    ev = evaluate(mean, report.summary, report.records)
    assert ev["meets"] is True and ev["metrics"]["ttft_mean_ms"] == pytest.approx(10 + 49.5 * d, abs=1e-5)
    ev = evaluate(build_slos([("ttft_mean_ms", 10 + 49.5 * d - 0.01)]), report.summary, report.records)
    assert ev["violated"] == ["ttft_mean_ms"]
    tight = build_slos([("ttft_p90_ms", 250.0), ("e2e_p50_ms", 100.0)])
    ev = evaluate(tight, report.summary, report.records)
    assert ev["meets"] is False and ev["violated"] == ["ttft_p90_ms", "e2e_p50_ms"]


def test_goodput_counts_requests_meeting_every_target(tmp_path):
    report = run(write(tmp_path, ONE_PER_PASS))
    d = 10 - 1000 / 150
    good = sum(10 + i * d <= 40 for i in range(100))  # TTFT <= 40 ms: i <= 9
    assert good == 10
    assert goodput_fraction(report.records, (("ttft_ms", 40.0),)) == pytest.approx(0.10)
    # one output token: no TPOT, so a TPOT target never fails a request
    assert goodput_fraction(report.records, (("ttft_ms", 40.0), ("tpot_ms", 0.001))) == pytest.approx(0.10)
    assert goodput_fraction(report.records, (("ttft_ms", 40.0), ("e2e_ms", 20.0))) == pytest.approx(0.04)  # i <= 3
    slos = build_slos([("goodput", 0.1), ("ttft_ms", 40.0)])
    assert evaluate(slos, report.summary, report.records)["meets"] is True
    slos = build_slos([("goodput", 0.11), ("ttft_ms", 40.0)])
    ev = evaluate(slos, report.summary, report.records)
    assert ev["meets"] is False and ev["metrics"]["goodput"] == pytest.approx(0.1)
