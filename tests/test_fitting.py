"""Fitting pass-time models from forward-pass records (fitting.md): records,
`charge_own_launch`, the window fit, evaluate, the `fit` / `evaluate` commands,
and a replay priced by a fitted model."""

import json
import math

import click
import numpy as np
import pytest
from click.testing import CliRunner
from ruamel.yaml import YAML

from fpm_synth import CAPTURE_SIZE, STALL, TRUE_COEFFICIENTS, synth_workload
from servesim.engine.pricing import FITTED, price_pass
from servesim.errors import InputError
from servesim.cli.fitting import evaluate_command, fit_command
from servesim.fitting import (DECODE, EAGER, PIECEWISE, charge_own_launch, fit_records, fit_windows,
                              load_launch_stall, parse_records, predict, read_records, window_bounds,
                              write_model)
from servesim.config.config import config_from_dict, read_fitted_model
from servesim.replay.api import simulate
from servesim.workload.load import load_workload


def rec(worker="w0", counter=0, wall_ms=10.0, npr=0, pt=0, dr=1, kv=100, **extra):
    """One record line (a dict); worker/counter None leave the field out."""
    r = {"version": 1, "wall_time": wall_ms / 1000.0,
         "scheduled_requests": {"num_prefill_requests": npr, "sum_prefill_tokens": pt,
                                "num_decode_requests": dr, "sum_decode_kv_tokens": kv}}
    if worker is not None:
        r["worker_id"] = worker
    if counter is not None:
        r["counter_id"] = counter
    r.update(extra)
    return r


def lines(*records):
    return [json.dumps(r) if not isinstance(r, str) else r for r in records]


def error_of(call, *args) -> str:
    with pytest.raises(InputError) as info:
        call(*args)
    return str(info.value)


# ------------------------------------------------------------------ records


def test_a_multi_rank_record_sums_features_and_takes_the_slowest_rank():
    r = parse_records(lines(
        rec(counter=0, wall_ms=18.34, npr=1, pt=2048, dr=31, kv=912345),
        [rec(counter=1, wall_ms=10.0, npr=1, pt=100, dr=2, kv=50),
         rec(counter=1, wall_ms=12.0, npr=0, pt=0, dr=3, kv=70)],
    ))
    assert len(r) == 2
    assert r.wall_ms[0] == pytest.approx(18.34)  # seconds -> ms
    assert r.wall_ms[1] == pytest.approx(12.0)  # lockstep: the slowest rank
    assert [r.num_prefill_requests[1], r.sum_prefill_tokens[1], r.num_decode_requests[1],
            r.sum_decode_kv_tokens[1]] == [1, 100, 5, 120]
    assert r.worker_ids == ["w0"] and list(r.counter) == [0, 1]


def test_pass_kind_decode_piecewise_eager_by_capture_size():
    r = parse_records(lines(
        rec(counter=0, dr=512),  # decode: no prefill, 512 tokens <= 512
        rec(counter=1, dr=513),  # eager even without prefill
        rec(counter=2, npr=1, pt=500, dr=12),  # 512 tokens with prefill: piecewise
        rec(counter=3, npr=1, pt=500, dr=13),  # 513: eager
    ))
    assert list(r.kinds(512)) == [DECODE, EAGER, PIECEWISE, EAGER]


@pytest.mark.parametrize("line, fragment", [
    ('{"wall_time": 0.1,', "r.jsonl:2: malformed JSON"),
    ('"text"', "r.jsonl:2: a record must be a JSON object or a non-empty list"),
    ("[]", "r.jsonl:2: a record must be a JSON object or a non-empty list"),
    (rec(counter=1, scheduled_requests=None), "r.jsonl:2: missing field 'scheduled_requests'"),
    ({"worker_id": "w0", "counter_id": 1, "scheduled_requests": rec()["scheduled_requests"]},
     "r.jsonl:2: missing field 'wall_time' (seconds)"),
    (rec(counter=1, wall_time="0.1"), "r.jsonl:2: 'wall_time' must be a number (seconds)"),
    ('{"worker_id": "w0", "counter_id": 1, "wall_time": NaN, "scheduled_requests": '
     '{"num_prefill_requests": 0, "sum_prefill_tokens": 0, "num_decode_requests": 1, '
     '"sum_decode_kv_tokens": 5}}', "r.jsonl:2: 'wall_time' must be finite (seconds), got nan"),
    (rec(counter=1, wall_ms=math.inf), "r.jsonl:2: 'wall_time' must be finite"),
    (rec(counter=1, dr=-1), "r.jsonl:2: 'scheduled_requests.num_decode_requests' must be >= 0"),
    (rec(counter=1, kv="many"), "'scheduled_requests.sum_decode_kv_tokens' must be a number"),
    (rec(counter=1, pt=True), "'scheduled_requests.sum_prefill_tokens' must be a number"),
    ([rec(counter=1), {"wall_time": 0.1}], "r.jsonl:2: rank 1: missing field 'scheduled_requests'"),
    (rec(counter=1.5), "r.jsonl:2: counter_id must be an integer >= 0"),
    (rec(worker=["w"], counter=1), "r.jsonl:2: worker_id must be a string or an integer"),
    (rec(counter=0), "r.jsonl:2: repeated (worker_id 'w0', counter_id 0), first at r.jsonl:1"),
])
def test_bad_record_names_file_and_line(line, fragment):
    message = error_of(parse_records, lines(rec(counter=0), line), "r.jsonl")
    assert fragment in message


def test_records_without_ids_are_accepted_by_a_plain_fit():
    # Six records whose features vary independently (five coefficients), and
    # two of them identical: without ids there is no repeated-id error.
    shapes = [dict(dr=1, kv=100), dict(dr=1, kv=100), dict(dr=2, kv=100), dict(dr=2, kv=300),
              dict(npr=1, pt=50, dr=0, kv=0), dict(npr=2, pt=60, dr=0, kv=0)]
    r = parse_records(lines(*(rec(worker=None, counter=None, wall_ms=5.0 + i, **f)
                              for i, f in enumerate(shapes))))
    assert list(r.worker) == [-1] * 6
    assert fit_records(r, r.wall_ms).rows == 6


def test_a_repeated_id_across_files_names_both(tmp_path):
    a = tmp_path / "a.jsonl"
    b = tmp_path / "b.jsonl"
    a.write_text("\n".join(lines(rec(counter=0), rec(counter=1))) + "\n")
    b.write_text("\n".join(lines(rec(counter=2), rec(counter=1))) + "\n")
    assert error_of(read_records, [a, b]) == (
        f"{b}:2: repeated (worker_id 'w0', counter_id 1), first at {a}:2; "
        "each pass of a worker is recorded once")


def test_blank_lines_only_at_the_end_and_empty_files(tmp_path):
    assert len(parse_records(lines(rec(counter=0), "", "  "))) == 1
    assert "r.jsonl:2: blank line inside" in error_of(
        parse_records, lines(rec(counter=0), "", rec(counter=1)), "r.jsonl")
    assert error_of(parse_records, [], "r.jsonl") == "r.jsonl: no records (an empty file)"
    assert "records file not found" in error_of(read_records, [tmp_path / "nope.jsonl"])


# ------------------------------------------------------------ launch stall

SMALL_STALL = {"max_cudagraph_capture_size": 100,
               "stall_ms": {"decode": {"piecewise": 5.0, "eager": 20.0},
                            "prefill": {"piecewise": 1.0, "eager": 30.0}}}


def test_each_record_gives_up_what_it_carries_and_takes_back_its_own_launch():
    # Capture size 100. Worker w0: decode, eager prefill, piecewise prefill,
    # decode, (gap), piecewise prefill. Worker w1: decode, mixed piecewise,
    # eager decode-only. File order is scrambled across workers.
    r = parse_records(lines(
        rec("w0", 1, 50.0, npr=1, pt=200, dr=0, kv=0),  # eager; carries prefill->piecewise 1
        rec("w1", 0, 12.0, dr=4),  # carries decode->piecewise 5
        rec("w0", 0, 30.0, dr=4),  # carries decode->eager 20
        rec("w0", 2, 30.0, npr=1, pt=50, dr=0, kv=0),  # next is decode: carries 0
        rec("w1", 1, 45.0, npr=1, pt=30, dr=20),  # mixed = prefill carrier; next eager: 30
        rec("w0", 7, 40.0, npr=1, pt=50, dr=0, kv=0),  # after the gap: keeps its own launch
        rec("w0", 3, 8.0, dr=4),  # next is after a gap: carries 0
        rec("w1", 2, 60.0, dr=150),  # 150 tokens > 100: eager without prefill
    ))
    wall = charge_own_launch(r, SMALL_STALL)
    # wall'[i] = wall[i] - carried[i] + carried[i-1]
    assert list(wall) == [50 - 1 + 20, 12 - 5, 30 - 20, 30 - 0 + 1, 45 - 30 + 5, 40, 8, 60 + 30]
    assert list(r.wall_ms) == [50, 12, 30, 30, 45, 40, 8, 60]  # records unchanged


def test_an_explicit_zero_stall_moves_nothing():
    zero = {"max_cudagraph_capture_size": 100,
            "stall_ms": {c: {"piecewise": 0, "eager": 0} for c in ("decode", "prefill")}}
    r = parse_records(lines(rec("w0", 0, 30.0), rec("w0", 1, 50.0, npr=1, pt=200, dr=0)))
    assert np.array_equal(charge_own_launch(r, zero), r.wall_ms)


def test_launch_stall_needs_worker_and_counter_ids():
    r = parse_records(lines(rec(counter=0), rec(counter=None)), "r.jsonl")
    assert error_of(charge_own_launch, r, SMALL_STALL).startswith(
        "r.jsonl:2: record has no counter_id; --launch-stall needs worker_id and counter_id")
    r = parse_records(lines(rec(worker=None, counter=0)), "r.jsonl")
    assert "r.jsonl:1: record has no worker_id; --window needs" in error_of(
        fit_windows, r, r.wall_ms, 4, 512)


def test_charge_own_launch_recovers_the_synthetic_own_times():
    s = synth_workload("B", passes_per_worker=800)
    assert np.allclose(charge_own_launch(s.records(), STALL), s.own_ms, rtol=0, atol=1e-9)


def _stall_text(**changes):
    data = json.loads(json.dumps(SMALL_STALL))
    for path, value in changes.items():
        *parents, key = path.split("__")
        node = data
        for p in parents:
            node = node[p]
        if value is _DROP:
            del node[key]
        else:
            node[key] = value
    return json.dumps(data)


_DROP = object()


@pytest.mark.parametrize("text, fragment", [
    (_stall_text(stall_ms=_DROP), "stall_ms: missing key (needs exactly "
                                  "max_cudagraph_capture_size, stall_ms)"),
    (_stall_text(max_cudagraph_capture_size=_DROP), "max_cudagraph_capture_size: missing key"),
    (_stall_text(extra=1), "extra: unknown key (accepted: max_cudagraph_capture_size, stall_ms)"),
    (_stall_text(stall_ms__prefill=_DROP), "stall_ms.prefill: missing carrier"),
    (_stall_text(stall_ms__mixed={}), "stall_ms.mixed: unknown carrier (accepted: decode, prefill)"),
    (_stall_text(stall_ms__decode__eager=_DROP), "stall_ms.decode.eager: missing next-pass kind"),
    (_stall_text(stall_ms__decode__decode=0.0), "stall_ms.decode.decode: unknown next-pass kind"),
    (_stall_text(stall_ms__prefill__eager=-1.0), "stall_ms.prefill.eager: must be a finite number >= 0 (ms), got -1.0"),
    (_stall_text(stall_ms__prefill__eager=math.nan), "stall_ms.prefill.eager: must be a finite number >= 0 (ms), got NaN"),
    (_stall_text(stall_ms__decode__piecewise=math.inf), "got Infinity"),
    (_stall_text(stall_ms__decode__piecewise="5"), 'stall_ms.decode.piecewise: must be a finite number >= 0 (ms), got "5"'),
    (_stall_text(stall_ms__decode__piecewise=True), "got true"),
    (_stall_text(stall_ms__decode=[1, 2]), "stall_ms.decode: must be an object"),
    (_stall_text(max_cudagraph_capture_size=0), "max_cudagraph_capture_size: must be a positive integer (tokens), got 0"),
    (_stall_text(max_cudagraph_capture_size=-512), "got -512"),
    (_stall_text(max_cudagraph_capture_size=512.0), "got 512.0"),
    (_stall_text(max_cudagraph_capture_size="512"), 'got "512"'),
    ('{"max_cudagraph_capture_size": 512,\n "stall_ms": {', ":2: malformed JSON"),
    ('{"max_cudagraph_capture_size": 512, "max_cudagraph_capture_size": 256, "stall_ms": {}}',
     "key 'max_cudagraph_capture_size' is given twice"),
    ("[1, 2]", "a stall file must be a JSON object"),
])
def test_bad_stall_file_is_named_with_its_key(tmp_path, text, fragment):
    path = tmp_path / "stall.json"
    path.write_text(text)
    message = error_of(load_launch_stall, path)
    assert message.startswith(str(path))
    assert fragment in message


def test_stall_file_loads_as_its_exact_contents(tmp_path):
    path = tmp_path / "stall.json"
    path.write_text(json.dumps(STALL))
    assert load_launch_stall(path) == STALL


# -------------------------------------------------------------- window fit


def test_windows_end_only_before_a_decode_pass_or_at_a_gap():
    # W = 2, capture 100: w0 counters 0..7 are D P P D D E D D, then a gap,
    # then 10, 11 (D D). Windows: [0 1 2] (2 would end at 1, but 2 is not a
    # decode pass), [3 4 5], [6 7] (ends at the gap), [10 11] (the end).
    kinds = "DPPDDEDD"
    recs = [rec("w0", c, npr=int(k == "P"), pt={"D": 0, "P": 50, "E": 500}[k],
                dr=0 if k == "P" else 4) for c, k in enumerate(kinds)]
    recs += [rec("w0", 10), rec("w0", 11)]
    r = parse_records(lines(*reversed(recs)))
    order, starts = window_bounds(r, 2, 100)
    assert list(r.counter[order]) == [0, 1, 2, 3, 4, 5, 6, 7, 10, 11]
    assert list(starts) == [0, 3, 6, 8]


# ------------------------------------------------------------------ evaluate


def test_vectorised_prediction_equals_the_pricing_kernel():
    s = synth_workload("A", passes_per_worker=300)
    r = s.records()
    for coefficients in (TRUE_COEFFICIENTS, (-30.0, 16.3, 0.021, 0.27, -3e-6)):
        params = np.zeros(6)  # the kernel's six parameters (PassPricer pads them)
        params[:len(coefficients)] = coefficients
        kernel = [price_pass(FITTED, params, r.sum_prefill_tokens[i], r.num_prefill_requests[i],
                             r.num_decode_requests[i], r.sum_decode_kv_tokens[i],
                             r.tokens[i], 0, 1.0) for i in range(len(r))]
        assert predict(coefficients, r).tolist() == kernel
    assert (predict((-30.0, 16.3, 0.021, 0.27, -3e-6), r) == 0).any()  # clamped at 0


# ----------------------------------------------------- accuracy (synthetic)


@pytest.fixture(scope="module")
def workloads():
    return {name: synth_workload(name) for name in ("A", "B")}


@pytest.fixture(scope="module")
def records(workloads):
    return {name: s.records() for name, s in workloads.items()}


def _errors(coefficients, synth, records) -> tuple:
    """(mean signed % error on decode passes, total % error), against own times."""
    predicted = predict(coefficients, records)
    decode = synth.kind == DECODE
    own = synth.own_ms
    return (100 * np.mean((predicted[decode] - own[decode]) / own[decode]),
            100 * (predicted.sum() / own.sum() - 1))


def test_a_fit_on_raw_records_misprices_decode_passes(workloads, records):
    fit = fit_records(records["A"], records["A"].wall_ms)
    for name in ("A", "B"):
        decode_error, _ = _errors(fit.coefficients, workloads[name], records[name])
        assert decode_error > 20
    assert abs(_errors(fit.coefficients, workloads["B"], records["B"])[1]) > 10


def test_launch_stall_fit_prices_decode_passes_and_totals_within_1pct(workloads, records):
    a = records["A"]
    fit = fit_records(a, charge_own_launch(a, STALL))
    assert fit.coefficients == pytest.approx(TRUE_COEFFICIENTS, rel=0.02)
    for name in ("A", "B"):
        decode_error, total_error = _errors(fit.coefficients, workloads[name], records[name])
        assert abs(decode_error) < 1 and abs(total_error) < 1


def test_window_fit_prices_decode_passes_and_totals_within_1pct(workloads, records):
    a = records["A"]
    fit = fit_windows(a, a.wall_ms, 8, 512)  # no stall values
    for name in ("A", "B"):
        decode_error, total_error = _errors(fit.coefficients, workloads[name], records[name])
        assert abs(decode_error) < 1 and abs(total_error) < 1


# ---------------------------------------------------------------- commands


class _Group(click.Group):
    """Maps InputError to exit 2, as the servesim group does."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except InputError as e:
            click.echo(f"error: {e}", err=True)
            ctx.exit(2)


@click.group(cls=_Group)
def cli():
    pass


cli.add_command(fit_command)
cli.add_command(evaluate_command)


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture
def files(tmp_path):
    """Workload A records, its stall file, and an all-zero stall file."""
    records_path = synth_workload("A", passes_per_worker=1500).write(tmp_path / "a.jsonl")
    stall_text = json.dumps(STALL, indent=1)
    stall_path = tmp_path / "stall.json"
    stall_path.write_text(stall_text)
    zero = {"max_cudagraph_capture_size": CAPTURE_SIZE,
            "stall_ms": {c: {"piecewise": 0.0, "eager": 0.0} for c in ("decode", "prefill")}}
    zero_path = tmp_path / "zero.json"
    zero_path.write_text(json.dumps(zero))
    return {"records": records_path, "stall": stall_path, "zero": zero_path, "dir": tmp_path}


def _model(path) -> dict:
    return YAML(typ="safe").load(path.read_text())


def test_fit_writes_a_model_that_loads_and_records_its_inputs(files):
    out = files["dir"] / "raw.yaml"
    result = run("fit", files["records"], "-o", out)
    assert result.exit_code == 0, result.output
    assert "coefficients (ms):" in result.output and f"model          {out}" in result.output
    model = _model(out)
    assert model["type"] == "fitted" and model["records"] == 3000
    assert model["metadata"] == {"source": [str(files["records"])], "launch_stall": None,
                                 "window": None}
    raw = fit_records(read_records([files["records"]]), read_records([files["records"]]).wall_ms)
    assert read_fitted_model(str(out)) == raw.coefficients


def test_launch_stall_changes_the_fit_only_when_given(files):
    d = files["dir"]
    assert run("fit", files["records"], "-o", d / "raw.yaml").exit_code == 0
    assert run("fit", files["records"], "--launch-stall", files["zero"], "-o", d / "zero.yaml").exit_code == 0
    result = run("fit", files["records"], "--launch-stall", files["stall"], "-o", d / "stall.yaml")
    assert result.exit_code == 0, result.output
    raw, zero, stall = (read_fitted_model(str(d / n)) for n in ("raw.yaml", "zero.yaml", "stall.yaml"))
    assert zero == raw  # an explicit 0 moves nothing
    assert stall != raw
    assert stall == pytest.approx(TRUE_COEFFICIENTS, rel=0.05)
    assert _model(d / "stall.yaml")["metadata"]["launch_stall"] == json.loads(files["stall"].read_text())


def test_fit_with_window_records_it(files):
    out = files["dir"] / "w.yaml"
    result = run("fit", files["records"], "--window", 8, "-o", out)
    assert result.exit_code == 0, result.output
    assert "windows of >= 8 records (capture size 512)" in result.output
    assert _model(out)["metadata"]["window"] == 8
    r = read_records([files["records"]])
    assert read_fitted_model(str(out)) == fit_windows(r, r.wall_ms, 8, 512).coefficients


def test_evaluate_table_and_json_with_and_without_launch_stall(files):
    d = files["dir"]
    run("fit", files["records"], "--launch-stall", files["stall"], "-o", d / "m.yaml")
    table = run("evaluate", files["records"], "--model", d / "m.yaml", "--capture-size", CAPTURE_SIZE)
    assert table.exit_code == 0, table.output
    for word in ("decode", "piecewise", "eager", "total"):
        assert word in table.output

    def report(*extra):
        result = run("evaluate", files["records"], "--model", d / "m.yaml", "--format", "json", *extra)
        assert result.exit_code == 0, result.output
        return json.loads(result.output)

    raw = report("--capture-size", CAPTURE_SIZE)
    corrected = report("--launch-stall", files["stall"])  # capture size from the stall file
    assert corrected["capture_size"] == raw["capture_size"] == CAPTURE_SIZE
    assert raw["kinds"]["decode"]["records"] == corrected["kinds"]["decode"]["records"] > 0
    # Raw decode records carry their successors' launches: the model looks cheap.
    assert raw["kinds"]["decode"]["mean_error_pct"] < -5
    assert abs(corrected["kinds"]["decode"]["mean_error_pct"]) < 1
    assert corrected["total"]["predicted_ms"] == raw["total"]["predicted_ms"]
    assert report("--capture-size", 512)["capture_size"] == 512


def test_bad_inputs_exit_2_with_a_message_naming_the_file(files):
    d = files["dir"]
    bad_stall = d / "bad.json"
    bad_stall.write_text(json.dumps({"max_cudagraph_capture_size": 4096,
                                     "stall_ms": {"decode": {"piecewise": 1, "eager": 2}}}))
    bad_records = d / "bad.jsonl"
    bad_records.write_text(json.dumps(rec(counter=0)) + "\n{oops\n")
    repeated = d / "repeated.jsonl"
    repeated.write_text("\n".join(lines(rec(counter=3), rec(counter=3))) + "\n")
    anonymous = d / "anonymous.jsonl"
    anonymous.write_text("\n".join(lines(rec(counter=None), rec(counter=None))) + "\n")
    cases = [
        (("fit", files["records"], "--launch-stall", bad_stall, "-o", d / "m.yaml"),
         f"{bad_stall}: stall_ms.prefill: missing carrier"),
        (("fit", bad_records, "-o", d / "m.yaml"), f"{bad_records}:2: malformed JSON"),
        (("fit", repeated, "-o", d / "m.yaml"), f"{repeated}:2: repeated (worker_id 'w0', counter_id 3)"),
        (("fit", anonymous, "--launch-stall", files["stall"], "-o", d / "m.yaml"),
         f"{anonymous}:1: record has no counter_id; --launch-stall needs"),
        (("fit", anonymous, "--window", 4, "-o", d / "m.yaml"), f"{anonymous}:1: record has no counter_id; --window"),
        (("evaluate", files["records"], "--model", files["stall"]), f"{files['stall']}"),
        (("evaluate", files["records"], "--model", d / "none.yaml"), f"{d / 'none.yaml'}: fitted model file not found"),
    ]
    for args, fragment in cases:
        result = run(*args)
        assert result.exit_code == 2, (args, result.output)
        assert f"error: {fragment}" in result.output
        assert "Traceback" not in result.output
    assert not (d / "m.yaml").exists()  # no model from a failed fit
    assert run("fit", files["records"], "--window", 0, "-o", d / "m.yaml").exit_code == 2
    assert run("fit", files["records"], "--capture-size", 0, "-o", d / "m.yaml").exit_code == 2


# ------------------------------------------------------------------ replay


def test_a_replay_priced_by_a_fitted_model_equals_the_same_linear_model(tmp_path):
    # fitted [b, 0, c, c, 0] = b + c·prefill_tokens + c·decode_requests, and
    # every decode request schedules exactly one token, so it is
    # linear {base_ms: b, per_token_ms: c} on every pass. b and c are dyadic:
    # both sums are exact, so the times are equal, not just close.
    b, c = 3.0, 0.125
    model = tmp_path / "model.yaml"
    write_model(model, [b, 0.0, c, c, 0.0], 1, 1.0, 0.0,
                {"source": ["none"], "launch_stall": None, "window": None})
    base = {
        "workload": {"synthetic": {"requests": 40, "seed": 1, "arrival": "poisson", "rate": 20.0,
                                   "input_tokens": {"distribution": "uniform", "min": 100, "max": 3000},
                                   "output_tokens": {"distribution": "uniform", "min": 5, "max": 60}}},
        "engine": {"block_size": 16, "num_gpu_blocks": 2048, "max_num_batched_tokens": 1024},
        "output": {"pass_log": True},
    }

    def passes(timing):
        config = config_from_dict({**base, "engine": {**base["engine"], "timing": timing}})
        workload = load_workload(config.workload, config.engine.kv_cache.block_size)
        return simulate(config, workload).pass_log

    fitted = passes({"type": "fitted", "model": str(model)})
    linear = passes({"type": "linear", "base_ms": b, "per_token_ms": c})
    assert len(fitted) == len(linear) > 50
    assert [(p["start_ms"], p["end_ms"]) for p in fitted] == [(p["start_ms"], p["end_ms"]) for p in linear]
    kinds = {e["kind"] for p in fitted for e in p["scheduled"]}
    assert {"new", "running"} <= kinds  # prefill and decode passes both priced
