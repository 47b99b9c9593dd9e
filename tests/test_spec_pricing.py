"""Speculative decoding priced by the `aic` tables (docs/deployment.md,
"Speculative decoding"): a verification pass and a drafter step worked out
by hand on the committed fixture table (tests/fixtures/README.md) with a
hand-made LM head, then against direct calls of aiconfigurator-core (skipped
without the extra)."""

import importlib.util
import json
import os

import numpy as np
import pytest

from servesim.deployment import table_pricing as tp
from servesim.engine.pricing import TABLE, price_pass

HAS_AIC = importlib.util.find_spec("aiconfigurator_core") is not None
needs_aic = pytest.mark.skipif(not HAS_AIC, reason="aiconfigurator-core not installed")
FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "aic_qwen3_32b_h200_tp2.json")


def plain_table():
    with open(FIXTURE) as f:
        return np.array(json.load(f)["table"])


def spec_table(k=3, drafter=tp.DRAFT_LAYER, layers=64):
    # an LM head of 0.5 ms at 1 row rising to 1.5 ms at 512
    return tp.with_speculative(plain_table(), k, drafter, 0.01, layers, [1.0, 512.0], [0.5, 1.5])


def head(rows):
    return 0.5 + (rows - 1) / 511


def test_a_plain_table_is_unchanged_and_has_no_speculative_slots():
    table = plain_table()
    assert table[tp.SPEC_K] == 0 and table[tp.N_H] == 0
    assert price_pass(TABLE, table, 0, 0, 4, 4000, 4, 4, 1.0) == tp.table_pass_ms(table, 0, 0, 0, 4, 4000)


def test_a_verification_pass_with_its_drafter_steps_by_hand():
    t = spec_table()
    # 4 decode requests of 1000 tokens of context, 3 drafts each: 16 decode
    # queries of 1000 tokens each (aiconfigurator's (nextn + 1) batch)
    verify = tp.table_pass_ms(t, 0, 0, 0, 16, 16000)
    # the first draft step: one layer of the verification pass (its LM head
    # over 16 rows out) and the head over the 4 requests
    first = (verify - head(16)) / 64 + head(4)
    # two more steps: one layer of a decode pass of the 4 requests, the head
    step = (tp.table_pass_ms(t, 0, 0, 0, 4, 4000) - head(4)) / 64 + head(4)
    got = price_pass(TABLE, t, 0, 0, 4, 4000, 16, 4, 1.0, 12, 0, 0)
    assert got == pytest.approx(verify + first + 2 * step, rel=1e-12)
    assert got > price_pass(TABLE, plain_table(), 0, 0, 4, 4000, 4, 4, 1.0)


def test_padding_drafts_of_an_admission_count_once():
    t = spec_table(k=2)
    # a mixed pass: one admission of 100 prompt tokens + 2 padding drafts
    # (already in its prefill tokens), 3 decodes of 500 context with 2 drafts
    verify = tp.table_pass_ms(t, 102, 1, 0, 9, 4500)
    first = (verify - head(9 + 1)) / 64 + head(4)
    step = (tp.table_pass_ms(t, 0, 0, 0, 4, 1500 + 102) - head(4)) / 64 + head(4)
    got = price_pass(TABLE, t, 102, 1, 3, 1500, 111, 4, 1.0, 8, 0, 2)
    assert got == pytest.approx(verify + first + step, rel=1e-12)


def test_ngram_is_a_cpu_lookup_per_request_and_k1_has_one_draft_step():
    t = spec_table(drafter=tp.DRAFT_CPU)
    verify = tp.table_pass_ms(t, 0, 0, 0, 16, 16000)
    assert price_pass(TABLE, t, 0, 0, 4, 4000, 16, 4, 1.0, 12, 0, 0) == pytest.approx(verify + 0.04)
    t1 = spec_table(k=1)
    verify = tp.table_pass_ms(t1, 0, 0, 0, 8, 8000)
    assert price_pass(TABLE, t1, 0, 0, 4, 4000, 8, 4, 1.0, 4, 0, 0) == \
        pytest.approx(verify + (verify - head(8)) / 64 + head(4), rel=1e-12)


def test_calibration_factors_scale_the_passes_the_draft_steps_take_a_share_of():
    t = tp.with_factors(spec_table(), (1.0, 2.0, 1.0))
    verify = 2 * tp.table_pass_ms(plain_table(), 0, 0, 0, 16, 16000)
    step = (2 * tp.table_pass_ms(plain_table(), 0, 0, 0, 4, 4000) - head(4)) / 64 + head(4)
    want = verify + (verify - head(16)) / 64 + head(4) + 2 * step  # the heads unscaled
    assert price_pass(TABLE, t, 0, 0, 4, 4000, 16, 4, 1.0, 12, 0, 0) == pytest.approx(want, rel=1e-12)


# ------------------------------------------------- against the database


ENGINE = {"model": "Qwen/Qwen3-32B", "gpu": "h200_sxm", "tensor_parallel_size": 2,
          "max_num_batched_tokens": 512, "max_num_seqs": 16, "max_model_len": 2048,
          "timing": {"type": "aic"}}


def _engine(**speculative):
    from servesim.config.config import config_from_dict

    data = {"workload": {"synthetic": {"requests": 1, "input_tokens": 100, "output_tokens": 10}},
            "engine": {**ENGINE, "speculative": {"num_speculative_tokens": 3, **speculative}}}
    return config_from_dict(data).engine


@needs_aic
def test_a_verification_pass_and_a_draft_step_against_direct_database_calls(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    from servesim.deployment import aic
    from servesim.deployment.aic_tables import pricing_table

    engine = _engine(method="eagle")
    t = pricing_table(engine)
    direct = aic.DirectModel(engine.deployment)
    layers = 64
    assert t[tp.N_LAYERS] == layers
    # the head's nodes are the database's logits GEMM itself
    rows = [1, 8, 16, 64]
    heads = aic.head_times(engine.deployment, rows)
    for r, h in zip(rows, heads):
        assert tp._head_ms(t, r) == pytest.approx(h, rel=0.02)
    b, c = 8, 1000
    verify = direct(0, 0, 0, 4 * b, 4 * b * c)  # 8 requests x (1 + 3) queries of 1000
    h_b, h_v = aic.head_times(engine.deployment, [b, 4 * b])
    step = (direct(0, 0, 0, b, b * c) - h_b) / layers + h_b
    first = (verify - h_v) / layers + h_b
    want = verify + first + 2 * step
    got = price_pass(TABLE, t, 0, 0, b, b * c, 4 * b, b, 1.0, 3 * b, 0, 0)
    assert got == pytest.approx(want, rel=0.02)


@needs_aic
def test_no_acceptance_is_slower_than_the_plain_run_for_every_method(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    from servesim.replay.api import run

    for method in ("mtp", "eagle", "ngram"):
        engine = {**ENGINE, "model": "XiaomiMiMo/MiMo-7B-Base", "tensor_parallel_size": 1} \
            if method == "mtp" else dict(ENGINE)
        if method == "ngram":
            engine["async_scheduling"] = False
        engine["speculative"] = {"method": method, "num_speculative_tokens": 2,
                                 "acceptance_rates": [0.0, 0.0]}
        report = run({"workload": {"synthetic": {"requests": 24, "input_tokens": 300,
                                                 "output_tokens": 30, "concurrency": 8, "seed": 3}},
                      "engine": engine}, baseline=True, pass_log=False)
        assert report.summary["speculative"]["tpot_speedup"] < 1, method
