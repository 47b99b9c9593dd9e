"""The fitting contract (fitting.md, docs/fitting.md): what `servesim fit`
refuses or warns about, and what a run refuses about a fitted model: fits the
records cannot determine, negative raw and corrected records, empty
worker_id, a capture size that contradicts `engine.launch`, `engine.launch`
with a model fitted on uncorrected records, and a model that prices a pass of
the run's shape below 0 ms."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from fpm_synth import SHORT_EAGER_TOKENS, STALL, synth_workload
from servesim.cli.main import main
from servesim.engine.config import TimingConfig
from servesim.engine.price_floor import PassShape, RunShape, cheapest_pass, corner_passes
from servesim.errors import InputError
from servesim.fitting import DECODE, fit_records, parse_records, predict, write_model
from servesim.kvcache.config import KVCacheConfig
from servesim.config.config import config_from_dict, read_fitted_model
from servesim.scheduler.config import SchedulerConfig
from helpers import make_workload, run_result


def rec(counter, wall_ms=10.0, npr=0, pt=0, dr=1, kv=100, worker="w0"):
    return json.dumps({"worker_id": worker, "counter_id": counter, "wall_time": wall_ms / 1000,
                       "scheduled_requests": {"num_prefill_requests": npr, "sum_prefill_tokens": pt,
                                              "num_decode_requests": dr,
                                              "sum_decode_kv_tokens": kv}})


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


# ------------------------------------------------- fits that are not determined

VARIED = [rec(0, 5, dr=1, kv=100), rec(1, 6, dr=2, kv=100), rec(2, 7, dr=2, kv=300),
          rec(3, 30, npr=1, pt=50, dr=0, kv=0), rec(4, 40, npr=2, pt=60, dr=0, kv=0)]


@pytest.mark.parametrize("lines, fragment", [
    (VARIED[:4], "4 records cannot determine the 5 coefficients of the model (intercept, "
                 "num_prefill_requests, sum_prefill_tokens, num_decode_requests, "
                 "sum_decode_kv_tokens): a fit needs at least 5 records"),
    ([rec(c, 5.0) for c in range(8)],  # identical records
     "the records cannot determine the coefficient(s) of intercept, num_prefill_requests "
     "(0 in every record), sum_prefill_tokens (0 in every record), num_decode_requests "
     "(the same, 1, in every record, so it cannot be told from the intercept), "
     "sum_decode_kv_tokens (the same, 100, in every record, so it cannot be told from the "
     "intercept): the features have rank 1 of 5 over 8 records"),
    ([rec(c, 5 + c, dr=1 + c % 3, kv=100 * (1 + c % 5)) for c in range(10)],  # decode only
     "the coefficient(s) of num_prefill_requests (0 in every record), sum_prefill_tokens "
     "(0 in every record): the features have rank 3 of 5 over 10 records"),
    (VARIED[:3] + [rec(3 + c, 30 + c, npr=1 + c, pt=2048 * (1 + c), dr=0, kv=0)
                   for c in range(3)],  # every prefill request has 2048 tokens
     "the coefficient(s) of num_prefill_requests, sum_prefill_tokens: the features have "
     "rank 4 of 5 over 6 records"),
])
def test_fit_refuses_records_that_cannot_determine_the_coefficients(tmp_path, lines, fragment):
    records = write_lines(tmp_path / "r.jsonl", lines)
    result = cli("fit", records, "-o", tmp_path / "m.yaml")
    assert result.exit_code == 2, result.output
    assert fragment in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "m.yaml").exists()


def test_window_fit_refusal_counts_windows(tmp_path):
    # 12 decode records, --window 4: three windows of 4, fewer than 5.
    records = write_lines(tmp_path / "r.jsonl", [rec(c, 5 + c, dr=1 + c) for c in range(12)])
    result = cli("fit", records, "--window", 4, "-o", tmp_path / "m.yaml")
    assert result.exit_code == 2
    assert "3 windows cannot determine the 5 coefficients" in result.output


def test_five_varied_records_are_enough(tmp_path):
    records = write_lines(tmp_path / "r.jsonl", VARIED)
    result = cli("fit", records, "-o", tmp_path / "m.yaml")
    assert result.exit_code == 0, result.output


# ---------------------------------------------- negative records, empty worker_id


def test_negative_raw_records_are_fitted_as_written_with_one_warning(tmp_path):
    lines = VARIED + [rec(5, -2.5, dr=3, kv=50), rec(6, -1.0, dr=4, kv=70)]
    records = write_lines(tmp_path / "r.jsonl", lines)
    parsed = parse_records(lines)
    assert parsed.wall_ms[5] == -2.5 and parsed.wall_ms[6] == -1.0
    result = CliRunner().invoke(main, ["fit", str(records), "-o", str(tmp_path / "m.yaml")])
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1
    assert warnings[0].startswith("warning: 2 record(s) have a negative wall_time, fitted as written")
    assert "--launch-stall" in warnings[0] and "--window" in warnings[0]
    assert read_fitted_model(str(tmp_path / "m.yaml")) == fit_records(parsed, parsed.wall_ms).coefficients


def test_a_record_below_0_after_launch_stall_is_an_error_naming_it(tmp_path):
    # Capture size 4096 (the stall file's). Line 2 is an eager prefill after a
    # decode pass, whose record carries 180 ms of its launch; line 2's own
    # record is 100 ms, so it would become 100 + 180 = 280 ms, and line 1
    # (30 ms) 30 - 180 = -150 ms.
    stall = tmp_path / "stall.json"
    stall.write_text(json.dumps(STALL))
    records = write_lines(tmp_path / "r.jsonl", [rec(0, 30.0, dr=8), rec(1, 100.0, npr=1, pt=5000, dr=0, kv=0)])
    model = _model(tmp_path, [5.0, 2.0, 0.01, 1.0, 0.0])
    for command in (("fit", records, "--launch-stall", stall, "-o", tmp_path / "fit.yaml"),
                    ("evaluate", records, "--model", model, "--launch-stall", stall)):
        result = cli(*command)
        assert result.exit_code == 2
        assert (f"error: {records}:1: -150 ms after --launch-stall {stall} (recorded 30 ms): a "
                "pass's own time cannot be negative") in result.output
    assert not (tmp_path / "fit.yaml").exists()


def test_capture_size_must_equal_the_stall_files(tmp_path):
    stall = tmp_path / "stall.json"
    stall.write_text(json.dumps(STALL))
    records = write_lines(tmp_path / "r.jsonl", VARIED)
    result = cli("fit", records, "--launch-stall", stall, "--capture-size", 512, "-o", tmp_path / "m.yaml")
    assert result.exit_code == 2
    assert f"--capture-size 512 differs from {stall}: max_cudagraph_capture_size 4096" in result.output


def test_an_empty_worker_id_is_rejected_like_a_missing_one(tmp_path):
    lines = [rec(c, 5 + c, dr=1 + c, worker="") for c in range(3)]
    r = parse_records(lines, "r.jsonl")
    assert list(r.worker) == [-2, -2, -2] and r.worker_ids == []  # no worker, no repeats
    stall = tmp_path / "stall.json"
    stall.write_text(json.dumps(STALL))
    path = write_lines(tmp_path / "r.jsonl", lines)
    for option in (("--launch-stall", stall), ("--window", 2)):
        result = cli("fit", path, *option, "-o", tmp_path / "m.yaml")
        assert result.exit_code == 2
        assert f'{path}:1: record has an empty worker_id (""); {option[0]} needs worker_id' in result.output


# ---------------------------------------- records as the probe generates them


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    """Workloads A and B with eager prefills from just over the capture
    size (some raw records below 0 ms), written to files, with the stall file."""
    d = tmp_path_factory.mktemp("probe")
    synth = {n: synth_workload(n, eager_tokens=SHORT_EAGER_TOKENS) for n in "AB"}
    (d / "stall.json").write_text(json.dumps(STALL))
    return d, synth, {n: s.write(d / f"{n}.jsonl") for n, s in synth.items()}


def _decode_error(model, synth) -> float:
    """Mean signed % error of the model's decode prices against each decode
    pass's own time."""
    predicted = predict(read_fitted_model(str(model)), synth.records())
    decode = synth.kind == DECODE
    return 100 * float(np.mean((predicted[decode] - synth.own_ms[decode]) / synth.own_ms[decode]))


def test_fit_on_probe_records_prices_decode_passes_within_1pct(probe):
    d, synth, files = probe
    assert all((s.records().wall_ms < 0).sum() > 100 for s in synth.values())
    raw = CliRunner().invoke(main, ["fit", str(files["A"]), "-o", str(d / "raw.yaml")])
    assert raw.exit_code == 0, raw.output
    assert raw.stderr.count("warning:") == 1 and "negative wall_time" in raw.stderr
    for options, name in (((), "raw"), (("--launch-stall", d / "stall.json"), "stall"),
                          (("--window", 8), "w8")):
        result = cli("fit", files["A"], *options, "-o", d / f"{name}.yaml")
        assert result.exit_code == 0, result.output
    for workload in "AB":
        assert _decode_error(d / "raw.yaml", synth[workload]) > 20  # visibly biased
        assert abs(_decode_error(d / "stall.yaml", synth[workload])) < 1
        assert abs(_decode_error(d / "w8.yaml", synth[workload])) < 1


# -------------------------------------------------------- the run's checks


def _model(tmp_path, coefficients, name="m.yaml", **metadata):
    path = tmp_path / name
    write_model(path, coefficients, 10, 0.9, 0.1,
                {"source": ["r.jsonl"], "launch_stall": None, "window": None, **metadata})
    return path


def _config(model, launch=None, **engine):
    data = {"workload": {"synthetic": {"requests": 3, "input_tokens": 40, "output_tokens": 4}},
            "engine": {"block_size": 16, "num_gpu_blocks": 65, "max_num_seqs": 4,
                       "max_num_batched_tokens": 64, "timing": {"type": "fitted", "model": str(model)},
                       **engine}}
    if launch is not None:
        data["engine"].update(async_scheduling=True, launch=launch)
    return config_from_dict(data, source="c.yaml")


def test_the_corner_passes_of_a_small_engine():
    # M = min(4 seqs, 10 tokens) = 4; contexts up to min(max_model_len 50,
    # (6 - 1) * 16 = 80) = 50 tokens per decode request.
    shape = RunShape.of(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=10, max_model_len=50),
                        KVCacheConfig(block_size=16, num_gpu_blocks=6))
    assert shape == RunShape(4, 10, 50, "max_model_len")
    # (p, d) corners (0,1) (0,4) (1,0) (1,1) (1,3) (4,0), with prefill tokens
    # from p to 10 - d and contexts from d to 50·d.
    assert [(c.num_prefill_requests, c.prefill_tokens, c.decode_requests, c.decode_context)
            for c in corner_passes(shape)] == [
        (0, 0, 1, 1), (0, 0, 1, 50), (0, 0, 4, 4), (0, 0, 4, 200),
        (1, 1, 0, 0), (1, 10, 0, 0), (1, 1, 1, 1), (1, 1, 1, 50), (1, 9, 1, 1), (1, 9, 1, 50),
        (1, 1, 3, 3), (1, 1, 3, 150), (1, 7, 3, 3), (1, 7, 3, 150), (4, 4, 0, 0), (4, 10, 0, 0)]
    # Without max_model_len the pool bounds a request: 5 blocks of 16.
    assert RunShape.of(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=10),
                       KVCacheConfig(block_size=16, num_gpu_blocks=6)).max_context == 80


def test_the_cheapest_corner_of_a_plane_is_its_minimum():
    # 10 - 3·p + 0.5·T - 1·d + 0.01·C over the shape above: the minimum over
    # every integer pass, by brute force, equals the cheapest corner's.
    timing = TimingConfig(type="fitted", coefficients_ms=(10.0, -3.0, 0.5, -1.0, 0.01))
    scheduler = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=10, max_model_len=50)
    kv = KVCacheConfig(block_size=16, num_gpu_blocks=6)
    _, corner, price = cheapest_pass(timing, scheduler, kv)
    brute = min(10 - 3 * p + 0.5 * t - d + 0.01 * c
                for p in range(5) for d in range(5 - p) if p + d
                for t in (range(p, 11 - d) if p else [0]) for c in range(d, 50 * d + 1))
    assert price == pytest.approx(brute)
    assert corner == PassShape(4, 4, 0, 0)  # 10 - 12 + 2 = 0


def test_the_cheapest_pass_with_drafts_is_the_minimum_over_every_pass():
    # 10 - 3·p + 0.5·T - 1·d + 0.01·C - 0.8·D with k = 2 drafts per request over
    # the shape above (T + d + D <= 10, D <= 2 (p + d)): brute force agrees.
    c = (10.0, -3.0, 0.5, -1.0, 0.01, -0.8)
    timing = TimingConfig(type="fitted", coefficients_ms=c)
    scheduler = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=10, max_model_len=50)
    kv = KVCacheConfig(block_size=16, num_gpu_blocks=6)
    shape, corner, price = cheapest_pass(timing, scheduler, kv, 2)
    assert shape.drafts_per_request == 2
    brute = min(c[0] + c[1] * p + c[2] * t + c[3] * d + c[4] * x + c[5] * k
                for p in range(5) for d in range(5 - p) if p + d
                for k in range(0, 2 * (p + d) + 1) if d + k + (p > 0) * p <= 10
                for t in (range(p, 11 - d - k) if p else [0]) for x in range(d, 50 * d + 1))
    assert price == pytest.approx(brute)
    assert corner.draft_tokens > 0
    # without speculative decoding the draft coefficient prices nothing
    assert cheapest_pass(timing, scheduler, kv)[2] == cheapest_pass(
        TimingConfig(type="fitted", coefficients_ms=c[:5]), scheduler, kv)[2]


def test_a_draft_coefficient_below_0_is_refused_with_speculative_decoding(tmp_path):
    # [5, 2, 0.01, 1, 0, -0.5], budget 64, 4 seqs, k = 3 (at most 3 drafts a
    # request): the cheapest pass is 4 decodes of 1 + 3 tokens, 5 + 4 - 0.5·12 =
    # 3 ms (1 prefill of 1 token + 3 decodes, 12 drafts: 4.01; 1 decode: 4.5):
    # accepted. With -1 per draft the same pass prices 5 + 4 - 12 = -3 ms: refused.
    fine = _model(tmp_path, [5.0, 2.0, 0.01, 1.0, 0.0, -0.5], "fine.yaml")
    spec = {"speculative": {"method": "mtp", "num_speculative_tokens": 3}}
    _config(fine, **spec)
    bad = _model(tmp_path, [5.0, 2.0, 0.01, 1.0, 0.0, -1.0], "bad.yaml")
    _config(bad)  # no drafts without speculative decoding: every pass >= 5 ms
    with pytest.raises(InputError) as info:
        _config(bad, **spec)
    assert str(info.value).startswith(
        f"c.yaml: engine.timing: the fitted model {bad} prices a pass this run can schedule at "
        "-3 ms (below 0): 4 decode request(s) holding 4 context tokens in all, with 12 draft "
        "tokens (= intercept 5 + num_decode_requests 4 x 1 + sum_draft_tokens 12 x -1). The "
        "run's passes have up to 4 requests (max_num_seqs) and 64 tokens "
        "(max_num_batched_tokens) a pass, decode contexts of 1 to 1024 tokens each "
        "(num_gpu_blocks), up to 3 draft tokens per request (num_speculative_tokens)")


def test_a_model_that_prices_a_pass_below_0_is_refused_at_load(tmp_path):
    # Coefficients [5, 2, -0.1, 1, 0], budget 64 tokens, 4 seqs. Corners:
    # decode only >= 5 + 1 = 6; 4 prefills of 64 tokens 5 + 8 - 6.4 = 6.6;
    # 1 prefill + 1 decode, 63 + 1 tokens: 5 + 2 - 6.3 + 1 = 1.7; the cheapest
    # is 1 prefill request of 64 tokens: 5 + 2 - 6.4 = 0.6 > 0: accepted.
    fine = _model(tmp_path, [5.0, 2.0, -0.1, 1.0, 0.0], "fine.yaml")
    _config(fine)
    # With -0.2 per token it is 5 + 2 - 12.8 = -5.8 ms.
    bad = _model(tmp_path, [5.0, 2.0, -0.2, 1.0, 0.0], "bad.yaml")
    with pytest.raises(InputError) as info:
        _config(bad)
    assert str(info.value).startswith(
        f"c.yaml: engine.timing: the fitted model {bad} prices a pass this run can schedule at "
        "-5.8 ms (below 0): 1 prefill request(s) of 64 tokens in all (= intercept 5 + "
        "num_prefill_requests 1 x 2 + sum_prefill_tokens 64 x -0.2). The run's passes have up to "
        "4 requests (max_num_seqs) and 64 tokens (max_num_batched_tokens) a pass, decode contexts "
        "of 1 to 1024 tokens each (num_gpu_blocks)")
    # A smaller token budget makes the same model safe: 5 + 2 - 0.2·32 = 0.6.
    _config(bad, max_num_batched_tokens=32)


def test_the_raw_fit_of_probe_records_is_refused_by_a_run(probe, tmp_path):
    # The raw fit learns a negative price per prefill token (the launches its
    # records carry): a budget of 8192 tokens prices a long prefill below 0.
    d, _, _ = probe
    data = {"workload": {"synthetic": {"requests": 3}},
            "engine": {"timing": {"type": "fitted", "model": str(d / "raw.yaml")}}}
    with pytest.raises(InputError, match=r"engine.timing: the fitted model .* prices a pass "
                                         r"this run can schedule at -\d"):
        config_from_dict(data, source="c.yaml")
    data["engine"]["timing"]["model"] = str(d / "stall.yaml")
    config_from_dict(data, source="c.yaml")


LAUNCH = {"decode_ms": 1, "piecewise_ms": 2, "eager_ms": 5, "max_cudagraph_capture_size": 512}


def test_launch_capture_size_must_match_the_models(tmp_path):
    stall = {"max_cudagraph_capture_size": 4096, "stall_ms": STALL["stall_ms"]}
    for name, metadata in (("stall.yaml", {"launch_stall": stall}),
                           ("window.yaml", {"window": 8, "capture_size": 4096})):
        model = _model(tmp_path, [5.0, 2.0, 0.01, 1.0, 0.0], name, **metadata)
        with pytest.raises(InputError) as info:
            _config(model, launch=LAUNCH)
        assert str(info.value).startswith(
            "c.yaml: engine.launch.max_cudagraph_capture_size: 512 differs from the fitted "
            f"model's capture size 4096 ({model}, metadata)")
        _config(model, launch=dict(LAUNCH, max_cudagraph_capture_size=4096))
        _config(model)  # no launch: nothing to contradict


def test_launch_with_a_model_fitted_on_uncorrected_records_warns_once(tmp_path):
    raw = _model(tmp_path, [5.0, 2.0, 0.01, 1.0, 0.0], "raw.yaml")
    window = _model(tmp_path, [5.0, 2.0, 0.01, 1.0, 0.0], "w.yaml", window=8, capture_size=512)
    workload = make_workload([{"id": "A", "t": 0, "P": 16, "O": 3}])
    warnings = run_result(_config(raw, launch=LAUNCH), workload).warnings
    assert len(warnings) == 1 and "counted twice" in warnings[0] and str(raw) in warnings[0]
    assert run_result(_config(window, launch=LAUNCH), workload).warnings == []
    assert run_result(_config(raw), workload).warnings == []


@pytest.mark.parametrize("timing", [
    TimingConfig(type="fixed", prefill_ms=0.0, decode_ms=0.0),
    TimingConfig(type="fixed", prefill_ms=3.0, decode_ms=1.0),
    TimingConfig(type="linear", base_ms=0.0, per_token_ms=0.01, per_request_ms=0.0,
                 per_context_token_ms=1e-6),
    TimingConfig(type="polynomial"),
])
def test_the_types_the_check_skips_never_price_a_corner_below_0(timing):
    # NEVER_NEGATIVE: checked here on the corners, through the pricing kernel's code.
    from servesim.engine.price_floor import NEVER_NEGATIVE

    assert timing.type in NEVER_NEGATIVE
    for seqs, budget, blocks in ((1, 1, 2), (4, 10, 6), (256, 8192, 8193)):
        _, _, price = cheapest_pass(timing, SchedulerConfig(max_num_seqs=seqs, max_num_batched_tokens=budget),
                                    KVCacheConfig(block_size=16, num_gpu_blocks=blocks))
        assert price >= 0
