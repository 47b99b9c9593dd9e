"""Checks before simulating (servesim/config/preflight.py): sizes that would
not fit in memory are refused up front with the key and the estimate, and
`validate` refuses exactly what `run` refuses."""

import gzip
import json
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from servesim.cli.main import main
from servesim.errors import InputError
from servesim.config.preflight import PoolSize, check_memory, estimate_memory

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = ROOT / "examples" / "mooncake.yaml"
GiB = 1 << 30


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


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
    """validate and run refuse the same way: exit 2, one message, fast, nothing written."""
    messages = []
    for command in ("validate", "run"):
        start = time.perf_counter()
        result = invoke(command, *args, *(("-o", args[-1].parent / "out") if command == "run" else ()))
        assert time.perf_counter() - start < 10
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
    parts = estimate_memory(pools, requests=10, request_blocks=1000, output_tokens=100)
    # the tier never holds more blocks than there are identities: 1000 slots of
    # 48 bytes, 1000 identities of 4, 100 G1 blocks of 8, on each of 2 ranks
    assert parts["engine.kv_offloading.num_cpu_blocks"][0] == 2 * (1000 * 48 + 1000 * 4 + 100 * 8)
    with pytest.raises(InputError, match=r"^engine.kv_offloading.num_cpu_blocks: the run would need"):
        check_memory(parts, limit=110_000)
    check_memory(parts, limit=10 * GiB)


def test_the_cpu_tier_estimate_is_what_its_arrays_take():
    # TierArrays measured: what grows with the slots held, the identities and
    # the G1 blocks is the estimate's per-unit bytes exactly; the rest (two
    # sentinel slots, counters, the job arrays) is a fixed few kB
    import types

    from servesim.config.preflight import CPU_GPU_BLOCK_BYTES, CPU_IDENTITY_BYTES, CPU_SLOT_BYTES
    from servesim.kvcache.cpu_tier_kernels import TierArrays

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
