"""Checks before simulating (servesim/config/preflight.py): sizes that would
not fit in memory are refused up front with the key and the estimate, and
`validate` refuses exactly what `run` refuses."""

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from servesim.errors import InputError
from servesim.config.preflight import PoolSize, check_memory, estimate_memory

from helpers import invoke, never_called

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = ROOT / "examples" / "mooncake.yaml"
GiB = 1 << 30


def trace_with(tmp_path, row_changes):
    """The first 20 rows of the bundled trace, with {row: {field: value}} changed."""
    src = ROOT / "servesim" / "data" / "mooncake_conversation_1000.jsonl.gz"
    with gzip.open(src, "rt") as f:
        rows = [json.loads(next(f)) for _ in range(20)]
    for i, change in row_changes.items():
        rows[i].update(change)
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def refused_by_both(*args):
    """validate and run refuse the same way: exit 2, one message, before any
    simulation (servesim.replay.api `make_replay` is never called), nothing written."""
    messages = []
    for command in ("validate", "run"):
        with pytest.MonkeyPatch.context() as patch:
            started = never_called(patch, "make_replay")
            result = invoke(command, *args, *(("-o", args[-1].parent / "out") if command == "run" else ()))
        assert not started
        assert result.exit_code == 2, result.output
        assert "Traceback" not in result.output
        messages.append(result.stderr)
    assert messages[0] == messages[1]
    return messages[0]


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(MOONCAKE.read_text().replace("../servesim/data/", str(ROOT / "servesim" / "data") + "/"))
    return path


def test_num_gpu_blocks_that_cannot_fit_is_refused_with_the_key_and_estimate(tmp_path, config):
    message = refused_by_both("--set", "engine.num_gpu_blocks=1000000000000", config)
    assert message.startswith("error: engine.num_gpu_blocks: the run would need ~4.8e+04 GB of memory")
    assert "1000000000000 blocks" in message and not (tmp_path / "out").exists()


def test_a_pool_size_of_disaggregated_mode_is_named_by_its_pool(tmp_path):
    config = tmp_path / "d.yaml"
    config.write_text(invoke("example", "disaggregated").stdout)
    message = refused_by_both("--set", "cluster.decode.num_gpu_blocks=1000000000000", config)
    assert message.startswith("error: cluster.decode.num_gpu_blocks: the run would need")


def test_a_trace_output_length_that_cannot_fit_names_the_file_and_request(tmp_path, config):
    trace = trace_with(tmp_path, {3: {"output_length": 10**12}})
    message = refused_by_both("--set", f"workload.trace={trace}", config)
    assert message.startswith(f"error: {trace}: request '3': output_length 1000000000000: the run would need")
    assert "output tokens" in message


def test_an_azure_context_length_that_cannot_fit_names_the_file_and_request(tmp_path, config):
    trace = tmp_path / "azure.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                     "2023-11-16 18:15:46.6805900,374,44\n"
                     "2023-11-16 18:15:50.9951690,10000000000000,19\n")
    message = refused_by_both("--set", f"workload.trace={trace}", "--set", "workload.format=azure", config)
    assert message.startswith(f"error: {trace}: request '1': input_length 10000000000000: the run would need")


def test_synthetic_sizes_are_refused_before_generating(tmp_path):
    config = tmp_path / "s.yaml"
    config.write_text(invoke("example", "synthetic").stdout)
    message = refused_by_both("--set", "workload.synthetic.requests=10000000000", config)
    assert message.startswith("error: workload.synthetic.requests x input_tokens: the run would need")
    message = refused_by_both("--set", "workload.synthetic.output_tokens={distribution: constant, value: "
                              "1000000000000}", config)
    assert message.startswith("error: workload.synthetic.requests x output_tokens: the run would need")


def test_max_model_len_that_cannot_fit_is_refused(tmp_path, config):
    message = refused_by_both("--set", "engine.max_model_len=1000000000000000", config)
    assert message.startswith("error: engine.max_model_len: the run would need")


def test_a_telemetry_interval_too_small_for_the_span_is_refused(tmp_path, config):
    result = invoke("run", config, "-o", tmp_path / "out", "--telemetry-interval-ms", "0.00001")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: output.telemetry_interval_ms: the run would need")
    assert "use a larger interval" in result.stderr and not (tmp_path / "out").exists()


def test_a_telemetry_interval_giving_millions_of_samples_is_warned_by_validate(config):
    result = invoke("validate", config, "--set", "output.telemetry_interval_ms=0.2")
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith("warning: output.telemetry_interval_ms: 0.2 ms over at least ")
    assert "telemetry.jsonl will be large" in result.stderr


def test_num_cpu_blocks_counts_the_blocks_the_tier_can_hold():
    pools = [PoolSize("engine", 2, 100, 10**15, 16)]
    parts = estimate_memory(pools, requests=10, request_blocks=10000, output_tokens=100)
    # the tier never holds more blocks than there are identities: 10000 slots of
    # 48 bytes, 10000 identities of 4, 100 G1 blocks of 8, on each of 2 ranks
    assert parts["engine.kv_offloading.num_cpu_blocks"][0] == 2 * (10000 * 48 + 10000 * 4 + 100 * 8)
    with pytest.raises(InputError, match=r"^engine.kv_offloading.num_cpu_blocks: the run would need"):
        check_memory(parts, limit=1_100_000)
    check_memory(parts, limit=10 * GiB)


def test_a_kv_event_lag_counts_the_routers_view_and_event_ring_of_each_rank():
    # 3 ranks of 2000 blocks: a view byte for each of 10000 identities and a
    # ring of max(4 * 2000, 4096) = 8000 events of 16 bytes, on each rank;
    # without a lag, none
    lagged = estimate_memory([PoolSize("engine", 3, 2000, 0, 16, kv_events=True)], 10, 10000, 100)
    assert lagged["cluster.router.kv_event_lag_ms"][0] == 3 * (10000 * 1 + 8000 * 16)
    plain = estimate_memory([PoolSize("engine", 3, 2000, 0, 16)], 10, 10000, 100)
    assert "cluster.router.kv_event_lag_ms" not in plain


def test_the_kv_event_queue_is_what_the_estimate_counts():
    from servesim.kvcache.block_pool import event_queue

    ev, ev_t, view = event_queue(10000, 2000, 5.0)
    assert view.nbytes == 10000 * 1 and ev.nbytes + ev_t.nbytes - 6 * 8 == 8000 * 16
    assert event_queue(10000, 2000, 0.0) is None  # off: no queue, no room


def test_the_cpu_tier_estimate_is_what_its_arrays_take():
    # TierArrays measured: what grows with the slots held, the identities and
    # the G1 blocks is the estimate's per-unit bytes exactly; the rest (two
    # sentinel slots, counters, the job arrays) is a fixed few kB
    import types

    from servesim.config.preflight import CPU_GPU_BLOCK_BYTES, CPU_IDENTITY_BYTES, CPU_SLOT_BYTES
    from servesim.kvcache.cpu_tier import TierArrays

    def measured(capacity, identities, gpu_blocks):
        config = types.SimpleNamespace(num_cpu_blocks=capacity, bytes_per_token=1,
                                       connector="offloading", d2h_gbps=1.0, h2d_gbps=1.0)
        t = TierArrays(config, 16, identities, gpu_blocks)
        arrays = [v for v in vars(t).values() if isinstance(v, np.ndarray)]
        return sum(a.nbytes for a in arrays)

    base = measured(100, 1000, 50)
    assert measured(200, 1000, 50) - base == 100 * CPU_SLOT_BYTES
    assert measured(10**9, 1000, 50) - base == 900 * CPU_SLOT_BYTES  # held <= identities
    assert measured(100, 3000, 50) - base == 2000 * CPU_IDENTITY_BYTES
    assert measured(100, 1000, 550) - base == 500 * CPU_GPU_BLOCK_BYTES
    estimate = 100 * CPU_SLOT_BYTES + 1000 * CPU_IDENTITY_BYTES + 50 * CPU_GPU_BLOCK_BYTES
    assert 0 <= base - estimate < 16_384


def test_a_valid_run_is_not_refused(config):
    assert invoke("validate", config).exit_code == 0


def test_validate_refuses_a_dp_rank_beyond_data_parallel_size_as_run_does(tmp_path, config):
    trace = trace_with(tmp_path, {4: {"dp_rank": 2}})
    message = refused_by_both("--set", f"workload.trace={trace}", "--set", "cluster.data_parallel_size=2", config)
    assert message == (f"error: {trace}: request '4': dp_rank 2 is out of range "
                       f"(cluster.data_parallel_size is 2)\n")


# ----------------------------------------------- sizes known before generating or compiling


def test_synthetic_sessions_are_sized_before_generating(tmp_path):
    """1,000 sessions of 1,000 turns hold ~10^9 prompt tokens (prompts grow
    turn by turn): refused in both commands at once, naming the sessions,
    before a single turn is generated (it was a bare MemoryError, and 10^6
    turns an OOM kill)."""
    config = tmp_path / "s.yaml"
    config.write_text("workload:\n  synthetic:\n    sessions: {count: 1000, turns: 1000, "
                      "new_input_tokens: 100, output_tokens: 50}\n")
    message = refused_by_both(config)
    assert message.startswith("error: workload.synthetic.sessions (1000 sessions x 1000 turns): "
                              "the run would need ~")
    message = refused_by_both("--set", "workload.synthetic.sessions.turns=1000000", config)
    assert message.startswith("error: workload.synthetic.sessions (1000 sessions x 1000000 turns)")


def test_the_session_estimate_is_what_generation_gives():
    """`session_sizes` in closed form against the generated workload: the
    requests and output tokens exactly, the blocks at least those of the
    prompts and outputs, within one block a turn."""
    from servesim.config.config_types import LengthDistribution, SessionsConfig, SyntheticConfig
    from servesim.config.preflight import session_sizes
    from servesim.workload.synthetic import synthetic_sessions

    sc = SessionsConfig(count=3, turns=7, new_input_tokens=LengthDistribution(value=100),
                        output_tokens=LengthDistribution(value=30))
    w = synthetic_sessions(SyntheticConfig(sessions=sc), 16)
    requests, blocks, tokens, ids = session_sizes(sc, 16)
    assert (requests, tokens) == (len(w), int(w.output_length.sum()))
    exact = int((-(-(w.input_length + w.output_length) // 16)).sum())
    assert exact - requests <= blocks <= exact
    assert len(w.hash_flat) - requests <= ids <= len(w.hash_flat)


def test_more_dp_ranks_than_the_compiled_pass_loop_takes_are_refused(tmp_path):
    """This crashed inside Numba (a tuple of 1,000 entries or more) after
    announcing a compile; now both commands refuse it before anything."""
    config = tmp_path / "c.yaml"
    config.write_text("workload: {synthetic: {requests: 4}}\n")
    message = refused_by_both("--set", "cluster.data_parallel_size=600", config)
    assert message.startswith("error: cluster.data_parallel_size: 600 is more than the 512 DP "
                              "ranks per worker")


def test_a_pool_of_hundreds_of_workers_runs_on_the_loop_compiled_for_two(tmp_path):
    """The loops over workers take them by address (servesim/bundles.py
    `bundle_at`): 600 workers (more than the 512 a tuple could take, refused
    before) run, with every request routed, on the kernels two workers use."""
    config = tmp_path / "c.yaml"
    config.write_text("workload: {synthetic: {requests: 8, rate: 100.0,\n"
                      "  input_tokens: {distribution: constant, value: 64},\n"
                      "  output_tokens: {distribution: constant, value: 8}}}\n"
                      "engine: {block_size: 16, num_gpu_blocks: 64}\n"
                      "cluster: {workers: 600, router: least_loaded}\n")
    result = invoke("run", str(config), "-q", "-o", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["finished"] == 8
    # least_loaded: the first idle rank of least load, in (worker, rank)
    # order: eight arrivals in 80 ms, each finding the ones before it busy
    shares = [w["requests"] for w in summary["workers"]]
    assert len(shares) == 600 and shares[:8] == [1] * 8 and sum(shares) == 8


def test_every_rank_has_a_fixed_cost():
    from servesim.config.preflight import RANK_BYTES

    parts = estimate_memory([PoolSize("engine", 100000, 1, 0, 16)], 1, 1, 1)
    assert parts["cluster.workers"] == (100000 * RANK_BYTES, "100000 rank(s)")
    with pytest.raises(InputError, match=r"^cluster.workers: .*for 100000 rank\(s\)"):
        check_memory(parts, limit=GiB)


def test_the_memory_limit_is_the_cgroup_s_when_lower(tmp_path, monkeypatch):
    from servesim.config import preflight

    machine = preflight.memory_limit()
    limit = tmp_path / "memory.max"
    monkeypatch.setattr(preflight, "CGROUP_MEMORY_MAX", str(limit))
    limit.write_text("max\n")
    assert preflight.memory_limit() == machine
    limit.write_text(f"{GiB}\n")
    assert preflight.memory_limit() == (GiB, f"this process's cgroup allows ({limit})")
    with pytest.raises(InputError, match=r"more than this process's cgroup allows .*\(1.07 GB\)$"):
        check_memory({"engine.num_gpu_blocks": (2 * GiB, "2 rank(s) x 10 blocks")})


def test_the_memory_limit_honours_the_process_address_space_rlimit(tmp_path):
    """`ulimit -v 3 GB`: a run estimated at ~5 GB is refused against it."""
    import resource
    import subprocess
    import sys

    config = tmp_path / "c.yaml"
    config.write_text("workload: {synthetic: {requests: 4}}\n")

    def limited():
        resource.setrlimit(resource.RLIMIT_AS, (3 * GiB, 3 * GiB))

    result = subprocess.run([sys.executable, "-m", "servesim", "validate", str(config),
                             "--set", "engine.num_gpu_blocks=100000000"],
                            preexec_fn=limited, capture_output=True, text=True)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: engine.num_gpu_blocks: the run would need ~4.8 GB")
    assert result.stderr.rstrip().endswith("more than this process may take (ulimit -v) (3.22 GB)")
