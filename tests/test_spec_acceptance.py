"""Per-request acceptance (README.md, "Speculative decoding"):
`acceptance_profiles` (each request draws a named profile) and
`mean_acceptance_length` (one rate at every position), seeded and
deterministic; the summary's per-profile figures; bad input named."""

import json

import pytest
from click.testing import CliRunner

from servesim.cli.main import main
from servesim.errors import InputError
from servesim.replay.api import run
from servesim.scheduler.speculative import expected_accepted, rates_for_length


def config(**speculative):
    return {"workload": {"synthetic": {"requests": 40, "input_tokens": 64, "output_tokens": 40,
                                       "concurrency": 6, "seed": 2}},
            "engine": {"block_size": 16, "num_gpu_blocks": 1024, "max_num_seqs": 16,
                       "timing": {"type": "linear", "base_ms": 10, "per_token_ms": 0.01},
                       "speculative": {"method": "eagle", "num_speculative_tokens": 3,
                                       **speculative}}}


def outcome(report):
    r = report.records
    return (list(r.spec_drafted), list(r.spec_accepted), list(r.finish_ms),
            [(p["start_ms"], [(e["id"], e["tokens"], e["spec"]) for e in p["scheduled"]])
             for p in report.pass_log])


def test_one_profile_replays_its_rates_exactly():
    # a profile's lists are drawn with the scheduler's own per-position draws,
    # so one profile of rates r is the run of acceptance_rates r, pass for pass
    rates = [0.8, 0.5, 0.3]
    plain = run(config(acceptance_rates=rates), pass_log=True)
    one = run(config(acceptance_profiles={"only": {"acceptance_rates": rates}}), pass_log=True)
    assert outcome(one) == outcome(plain)
    assert one.summary["speculative"]["profiles"]["only"]["requests"] == 40


def test_profiles_are_drawn_per_request_deterministically_and_reported():
    spec = {"acceptance_profiles": {"code": {"weight": 1, "acceptance_rates": [1.0, 1.0, 1.0]},
                                    "chat": {"weight": 1, "acceptance_rates": [0.0, 0.0, 0.0]}}}
    a = run(config(**spec), pass_log=True)
    assert outcome(a) == outcome(run(config(**spec), pass_log=True))
    profiles = a.summary["speculative"]["profiles"]
    assert profiles["code"]["requests"] + profiles["chat"]["requests"] == 40
    assert profiles["code"]["requests"] > 5 and profiles["chat"]["requests"] > 5
    # every request accepts all of its drafts or none of them
    assert profiles["code"]["acceptance_rate"] == 1.0 and profiles["chat"]["acceptance_rate"] == 0.0
    for d, acc in zip(a.records.spec_drafted, a.records.spec_accepted):
        assert acc in (0, d)
    # another seed draws other profiles
    other = run(config(seed=7, **spec), pass_log=False).summary["speculative"]["profiles"]
    assert other != profiles


def test_mean_acceptance_length_is_one_rate_at_every_position():
    rates = rates_for_length(2.2, 3)
    assert len(set(rates)) == 1 and 1 + expected_accepted(rates) == pytest.approx(2.2, abs=1e-9)
    assert rates_for_length(1.0, 2) == (0.0, 0.0) and rates_for_length(3.0, 2) == (1.0, 1.0)
    s = run(config(mean_acceptance_length=2.2), pass_log=False).summary
    assert s["config"]["engine"]["speculative"]["acceptance_rates"] == list(rates)
    profiles = {"p": {"mean_acceptance_length": 2.2}}
    s = run(config(acceptance_profiles=profiles), pass_log=False).summary
    assert s["speculative"]["profiles"]["p"]["acceptance_rates"] == list(rates)


@pytest.mark.parametrize("speculative, message", [
    ({"acceptance_profiles": {"a": {"acceptance_rates": [0.5, 1.5, 0.1]}}},
     r"engine.speculative.acceptance_profiles.a.acceptance_rates: .*1.5"),
    ({"acceptance_profiles": {"a": {"weight": 0, "acceptance_rates": [0.5, 0.5, 0.1]}}},
     r"engine.speculative.acceptance_profiles.a.weight"),
    ({"acceptance_profiles": {"a": {"weight": 1}}},
     r"engine.speculative.acceptance_profiles.a: needs acceptance_rates or mean_acceptance_length"),
    ({"acceptance_profiles": {"a": {"acceptance_rates": [0.5, 0.5]}}},
     r"engine.speculative.acceptance_profiles.a.acceptance_rates: must be a list of 3"),
    ({"acceptance_profiles": {}}, r"engine.speculative.acceptance_profiles: must be a mapping"),
    ({"acceptance_profiles": {"a": {"mean_acceptance_length": 2}}, "acceptance_rates": [0.1] * 3},
     r"engine.speculative.acceptance_rates: give acceptance_rates or "
     r"engine.speculative.acceptance_profiles, not both"),
    ({"mean_acceptance_length": 4.5}, r"engine.speculative.mean_acceptance_length: .*4.5"),
    ({"mean_acceptance_length": 2, "acceptance_rates": [0.1] * 3},
     r"engine.speculative.mean_acceptance_length: give engine.speculative.acceptance_rates or"),
])
def test_bad_acceptance_input_is_named(speculative, message):
    with pytest.raises(InputError, match=message):
        run(config(**speculative), pass_log=False)


def test_bad_profile_on_the_command_line_exits_2_naming_the_key(tmp_path):
    (tmp_path / "c.yaml").write_text(json.dumps(config(acceptance_profiles={
        "a": {"acceptance_rates": [0.5, -1, 0.1]}})))
    result = CliRunner().invoke(main, ["run", str(tmp_path / "c.yaml"), "-q", "-o",
                                       str(tmp_path / "out")])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "engine.speculative.acceptance_profiles.a.acceptance_rates" in result.output
    assert not (tmp_path / "out").exists()
