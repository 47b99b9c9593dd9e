"""Property-based tests of speculative decoding (README.md,
"Speculative decoding") on random small workloads and engines (the
strategies of tests/test_scheduler_properties.py):

- with every acceptance rate 0, the schedule is a plain run's except for the
  draft tokens and the lookahead blocks (ample budget and KV, no caching);
- every request that finishes has exactly its output length, and every
  request that fits with its lookahead slots finishes;
- blocks are conserved: never more than the usable blocks in use, all free
  at the end;
- the mean accepted drafts per verification converge to sum_i prod_{j<=i} p_j;
- a request's acceptance draws do not depend on the other requests.
"""

import warnings

import attrs
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from servesim.scheduler.speculative import expected_accepted
from servesim.config.config import config_from_dict
from servesim.replay.driver import Replay
from servesim.results.records import STATUS_FINISHED
from helpers import (SETTINGS, ceil_div, engine_configs, expected_max_tokens, rejected_at_arrival,
                     workload_of, workloads)


def spec_block(k, rates):
    return {"method": "mtp", "num_speculative_tokens": k, "acceptance_rates": rates}


def simulate(engine, workload, pass_log=True):
    config = config_from_dict({"workload": {"synthetic": {"requests": 1}}, "engine": engine,
                               "output": {"pass_log": pass_log}})
    replay = Replay(config, workload)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return replay, replay.run()


@st.composite
def spec_engines(draw, **kw):
    engine = draw(engine_configs(**kw))
    k = draw(st.integers(1, 4), label="k")
    rates = draw(st.lists(st.sampled_from([0.0, 0.3, 0.8, 1.0]), min_size=k, max_size=k),
                 label="rates")
    engine["speculative"] = spec_block(k, rates)
    return engine


@given(st.data())
@SETTINGS
def test_zero_acceptance_schedules_like_a_plain_run_but_for_drafts(data):
    engine = data.draw(engine_configs(chunked=True))
    engine.update(enable_prefix_caching=False, num_gpu_blocks=4096, max_num_batched_tokens=8192,
                  long_prefill_token_threshold=0, watermark=0.0,
                  timing={"type": "fixed", "prefill_ms": 3.0, "decode_ms": 1.0})
    workload = data.draw(workloads(engine))
    k = data.draw(st.integers(1, 4), label="k")
    _, plain = simulate(engine, workload)
    _, spec = simulate({**engine, "speculative": spec_block(k, [0.0] * k)}, workload)
    assert len(spec.pass_log) == len(plain.pass_log)
    for p, s in zip(plain.pass_log, spec.pass_log):
        assert [(e["id"], e["tokens"], e["cached"], e["kind"]) for e in p["scheduled"]] == \
            [(e["id"], e["tokens"] - e["spec"], e["cached"], e["kind"]) for e in s["scheduled"]]
        for key in ("preempted", "finished", "start_ms", "end_ms"):
            assert p[key] == s[key], key
        assert s["free_blocks_after_schedule"] <= p["free_blocks_after_schedule"]
    assert np.array_equal(plain.records.finish_ms, spec.records.finish_ms, equal_nan=True)
    assert int(spec.records.spec_accepted.sum()) == 0


@given(st.data())
@SETTINGS
def test_requests_finish_with_their_output_length_and_blocks_are_conserved(data):
    engine = data.draw(spec_engines())
    workload = data.draw(workloads(engine))
    n = len(workload)
    offsets = np.arange(n + 1, dtype=np.int64) * 2
    k = engine["speculative"]["num_speculative_tokens"]
    if data.draw(st.booleans(), label="accepted lists"):
        values = np.array(data.draw(st.lists(st.integers(0, k), min_size=2 * n, max_size=2 * n),
                                    label="accepted"), dtype=np.int64)
        workload = attrs.evolve(workload, accepted_values=values, accepted_offsets=offsets)
    replay, result = simulate(engine, workload, pass_log=data.draw(st.booleans(), label="log"))
    rec = result.records
    want = expected_max_tokens(engine, workload)
    finished = rec.status == STATUS_FINISHED
    assert np.array_equal(rec.output_tokens[finished], want[finished])
    bs, usable = engine["block_size"], engine["num_gpu_blocks"] - 1
    # the most slots a request ever asks for: its tokens, two passes of drafts, lookahead
    fits = ceil_div(workload.input_length + want + 3 * k + 2, bs) <= usable
    fits &= ~rejected_at_arrival(engine, workload)
    assert finished[fits].all()
    assert (rec.spec_accepted <= rec.spec_drafted).all()
    for core in replay.workers:
        for rank in core.ranks:
            assert rank.pool.num_free_blocks == usable
    for p in result.pass_log or []:
        assert 0 <= p["free_blocks_after_schedule"] <= usable
        for e in p["scheduled"]:
            assert 0 <= e["spec"] <= k and e["spec"] < e["tokens"] or e["spec"] == 0


@pytest.mark.parametrize("rates", [[0.8], [0.7, 0.5, 0.9], [0.9, 0.9, 0.9, 0.9], [0.3, 1.0]])
def test_mean_accepted_drafts_converge_to_the_closed_form(rates):
    k = len(rates)
    n = 400
    workload = workload_of([0.0] * n, [32] * n, [200] * n,
                           [[10 * i + 1, 10 * i + 2] for i in range(n)])
    engine = {"num_gpu_blocks": 60000, "max_num_seqs": 64, "max_num_batched_tokens": 8192,
              "enable_prefix_caching": False,
              "timing": {"type": "fixed", "prefill_ms": 1.0, "decode_ms": 1.0},
              "speculative": spec_block(k, rates)}
    _, result = simulate(engine, workload, pass_log=False)
    verifications = int(result.stats.spec_positions[0, 0])
    mean = result.records.spec_accepted.sum() / verifications
    assert verifications > 15000
    assert mean == pytest.approx(expected_accepted(rates), abs=0.03)
    per_position = result.stats.spec_positions[1] / verifications
    assert per_position == pytest.approx(np.cumprod(rates), abs=0.03)


def test_a_requests_draws_do_not_depend_on_the_other_requests():
    # "x" alone, and "x" behind five other requests: the same verifications
    # (ample budget and KV: it always schedules 1 + k)
    engine = {"num_gpu_blocks": 4096, "max_num_seqs": 16, "max_num_batched_tokens": 8192,
              "timing": {"type": "fixed", "prefill_ms": 1.0, "decode_ms": 1.0},
              "speculative": spec_block(3, [0.6, 0.6, 0.6])}
    alone = workload_of([0.0], [40], [60], [[1, 2, 3]], ids=["x"])
    crowd = workload_of([0.0] * 6, [40] * 6, [60] * 6,
                        [[10 + i, 20 + i, 30 + i] for i in range(5)] + [[1, 2, 3]],
                        ids=[f"o{i}" for i in range(5)] + ["x"])
    _, a = simulate(engine, alone)
    _, c = simulate(engine, crowd)
    assert (a.records.spec_drafted[0], a.records.spec_accepted[0]) == \
        (c.records.spec_drafted[5], c.records.spec_accepted[5])
    _, again = simulate(engine, crowd)
    assert again.pass_log == c.pass_log  # deterministic
