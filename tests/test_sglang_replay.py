"""An SGLang worker's replay (servesim/replay/sglang.py): telemetry samples
of its state, and what it refuses."""

import json
from pathlib import Path

import attrs
import pytest

from servesim.replay.api import resolve_config, simulate
from servesim.workload.load import load_workload

CASE = Path(__file__).parent / "golden" / "sglang-0.5.23" / "04-retraction-sync"


def _replay(**output):
    config = resolve_config(str(CASE / "config.yaml"))
    config = attrs.evolve(config, output=attrs.evolve(config.output, **output))
    return simulate(config, load_workload(config.workload, 16))


def test_telemetry_counters_add_up_to_the_run():
    """Ticks every 100 ms and a last partial sample at the end: the counters
    cover each interval, so they sum to the pass log's passes, tokens and
    the one retraction; KV usage is SGLang's token usage."""
    result = _replay(telemetry_interval_ms=100.0, pass_log=True)
    samples, passes = result.telemetry, result.pass_log
    assert [s["t_ms"] for s in samples[:-1]] == [100.0 * k for k in range(1, len(samples))]
    assert samples[-1]["t_ms"] == pytest.approx(passes[-1]["end_ms"])
    assert sum(s["passes"] for s in samples) == len(passes)
    assert sum(s["tokens_scheduled"] for s in samples) == sum(
        r["tokens"] for p in passes for r in p["scheduled"])
    assert sum(s["preemptions"] for s in samples) == 1
    assert all(0.0 <= s["kv_usage"] <= 1.0 and s["cpu_tier_blocks"] == 0 for s in samples)
    with open(CASE / "expected" / "requests.jsonl") as f:
        prompts = sum(json.loads(line)["input_length"] for line in f)
    assert sum(s["prefix_queries"] for s in samples) >= prompts  # a retraction asks again
    assert samples[-1]["running"] == samples[-1]["waiting"] == 0


@pytest.mark.parametrize("router, worker, start", [("round_robin", 0, 5.9),
                                                   ("least_loaded", 1, 5.0)])
def test_workers_are_routed_on_one_clock(router, worker, start):
    """Two workers, no overlap, passes of 1 + 0.1 ms a token: r0 (16 tokens,
    20 outputs) goes to worker 0 and decodes there (0-2.6 ms, then 1.1 ms
    passes), r1 (1 output) to worker 1, done at 2.6 ms. r2 arrives at 5 ms:
    round robin sends it to worker 0, which takes it at its next decision,
    5.9 ms; least_loaded to idle worker 1, at once. Each pass names its worker."""
    from servesim.config.config import config_from_dict
    from tests.helpers import workload_of

    config = config_from_dict({
        "workload": {"synthetic": {"requests": 1}, "trace_block_size": 16},
        "engine": {"backend": "sglang", "max_total_tokens": 1024, "chunked_prefill_size": 64,
                   "disable_overlap_schedule": True,
                   "timing": {"type": "linear", "base_ms": 1.0, "per_token_ms": 0.1}},
        "cluster": {"workers": 2, "router": router},
        "output": {"pass_log": True}}, source="test")
    result = simulate(config, workload_of([0.0, 0.0, 5.0], [16, 16, 16], [20, 1, 1],
                                          [[1], [2], [3]]))
    rec = result.records
    assert list(rec.worker) == [0, 1, worker]
    assert rec.first_scheduled_ms[2] == pytest.approx(start)
    log = result.pass_log
    assert [(p["worker"], p["pass"]) for p in log[:2]] == [(0, 0), (1, 0)]
    r2 = [p for p in log if any(r["id"] == "r2" for r in p["scheduled"])]
    assert len(r2) == 1 and r2[0]["worker"] == worker and r2[0]["start_ms"] == pytest.approx(start)
    assert [w.requests for w in result.stats.workers] == [2 - worker, 1 + worker]


def test_debug_mode_checks_every_pass_and_names_a_broken_invariant(monkeypatch):
    """SERVESIM_CHECK=1 (`--check`): the replay checks the SGLang invariants
    after every step and result, same outputs; a slot leaked from the pool is
    reported naming the pass and the invariant."""
    from servesim.errors import InvariantError
    from servesim.sglang.check import check_scheduler
    from servesim.sglang.scheduler import Scheduler

    plain = _replay(pass_log=True)
    monkeypatch.setenv("SERVESIM_CHECK", "1")
    checks = []
    original = check_scheduler

    def counting(s, where):
        checks.append(where)
        original(s, where)

    monkeypatch.setattr("servesim.sglang.scheduler.check_scheduler", counting)
    checked = _replay(pass_log=True)
    assert checked.pass_log == plain.pass_log
    assert checks.count("schedule") >= len(plain.pass_log) and checks.count("result") == len(
        plain.pass_log)
    from servesim.sglang.config import SGLangConfig
    from servesim.sglang.req import Req

    worker = Scheduler(SGLangConfig(max_total_tokens=64), [Req(0, "r0", 0.0, [1, 2, 3], 2, 0, True)],
                       lambda b: 1.0)
    worker.pool.free -= 1
    with pytest.raises(InvariantError, match=r"after schedule \(pass 0\): slots not conserved"):
        check_scheduler(worker, "schedule")


def test_a_search_grid_compares_the_two_backends(tmp_path):
    """`servesim search` over points that swap the whole engine block ranks
    an SGLang and a vLLM worker of the same pool (1,024 x 16 tokens) side by side."""
    import csv

    from tests.helpers import invoke

    (tmp_path / "c.yaml").write_text(
        "workload:\n  synthetic: {requests: 20, input_tokens: 64, output_tokens: 4, "
        "arrival: constant, rate: 10}\n"
        "engine: {backend: sglang, max_total_tokens: 16384, page_size: 16,\n"
        "         timing: {type: linear, base_ms: 3.0, per_token_ms: 0.02}}\n")
    (tmp_path / "g.yaml").write_text(
        "points:\n  - {engine.schedule_policy: lpm}\n"
        "  - {engine: {block_size: 16, num_gpu_blocks: 1024,\n"
        "              timing: {type: linear, base_ms: 3.0, per_token_ms: 0.02}}}\n")
    result = invoke("search", tmp_path / "c.yaml", "--slo", "ttft_p90_ms=100", "--grid",
                    tmp_path / "g.yaml", "--rate", "10", "-o", tmp_path / "out")
    assert result.exit_code == 0, result.output
    with open(tmp_path / "out" / "search.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 and all(r["meets"] in ("True", "true", "1") for r in rows), rows


def _routed(router):
    """Two workers, 16-token pages, no overlap, 10 ms passes: r0 (ids 1, 2:
    32 tokens, 1 output) at 0, done at 10 with its 32 prompt tokens in its
    worker's tree; r1 (ids 1, 2, 3: 48 tokens) and r2 (id 9: 16 tokens) at 20."""
    from servesim.config.config import config_from_dict
    from tests.helpers import workload_of

    config = config_from_dict({
        "workload": {"synthetic": {"requests": 1}, "trace_block_size": 16},
        "engine": {"backend": "sglang", "max_total_tokens": 1024, "page_size": 16,
                   "disable_overlap_schedule": True,
                   "timing": {"type": "linear", "base_ms": 10.0, "per_token_ms": 0.0}},
        "cluster": {"workers": 2, "router": router}}, source="test")
    return simulate(config, workload_of([0.0, 20.0, 20.0], [32, 48, 16], [1, 1, 1],
                                        [[1, 2], [1, 2, 3], [9]])).records


def test_least_prefill_weighs_cached_pages_against_queued_prefill():
    """r0: both workers cost 32, the first wins (0). r1: 48 - 32 cached = 16
    on worker 0, 48 on 1: worker 0. r2: on worker 0, 16 + the 48 tokens of r1
    queued there (routed, not yet taken into its waiting queue) = 64, 16 on
    worker 1: worker 1."""
    rec = _routed("least_prefill")
    assert rec.worker.tolist() == [0, 0, 1]
    assert rec.cached_tokens.tolist() == [0, 32, 0]


def test_weighted_scores_cached_pages_queue_and_usage():
    """Weights 1, 1, 1. r0: both score 0 + 1 (all wait alike) + 1 (empty
    pools): a seeded draw picks w. r1: 2/3 of its pages cached on w: 2.67
    against 2. r2: w has r1 queued (queue score 0), the other none: 1 against 2."""
    rec = _routed("weighted")
    w = int(rec.worker[0])
    assert rec.worker.tolist() == [w, w, 1 - w]
    assert rec.cached_tokens.tolist() == [0, 32, 0]


def test_kv_router_sees_each_workers_radix_tree_and_its_book():
    """Two workers, 16-token pages, 10 ms passes. r0 (ids 1, 2: 32 tokens, 1
    output) at 0: both logits (32/16 prefill + 2 blocks) tie, a seeded draw
    picks w; r0 is done at 10, its 32 prompt tokens in w's tree. r1 (ids
    1, 2, 3) at 20: on w 2 of its 3 pages are cached, logit (48 - 32)/16 + 3
    = 4 against 48/16 + 3 = 6 elsewhere: it goes to w and hits 32. r2 (id 9)
    at 20, just after: w's book holds r1's 16 uncached tokens and 3 pages,
    logit (16 + 16)/16 + 4 = 6 against 16/16 + 1 = 2: the other worker.
    Round robin sends r1 away from r0's cache."""
    rec = _routed("kv_router")
    w = int(rec.worker[0])
    assert rec.worker.tolist() == [w, w, 1 - w]
    assert rec.cached_tokens.tolist() == [0, 32, 0]
    assert _routed("kv_router").worker.tolist() == rec.worker.tolist()  # seeded: the same draw
    rec = _routed("round_robin")
    assert rec.worker.tolist() == [0, 1, 0] and rec.cached_tokens.tolist() == [0, 0, 0]
