"""The kernels as plain Python (README "Debugging"): under NUMBA_DISABLE_JIT=1
the same scheduler, KV cache and pass loop run uncompiled, so a breakpoint
or a print inside them works, and they must give the same results: the
recordings and the hand-worked engine rules replay exactly on that path, and
runs that use the CPU tier, async scheduling, disaggregated pools and DP
ranks write byte-identical outputs both ways."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import invoke

ROOT = Path(__file__).resolve().parents[1]


def workload(seed):
    return f"""\
workload:
  synthetic:
    requests: 40
    input_tokens: {{distribution: uniform, min: 32, max: 256}}
    output_tokens: {{distribution: uniform, min: 4, max: 64}}
    shared_prefix_tokens: 32
    arrival: poisson
    rate: 50.0
    seed: {seed}
"""


# preemptions, CPU-tier reloads and prefix hits, async
CPU_TIER_ASYNC = workload(7) + """\
engine:
  block_size: 16
  num_gpu_blocks: 48
  async_scheduling: true
  max_num_seqs: 16
  max_num_batched_tokens: 128
  kv_offloading: {num_cpu_blocks: 256, bytes_per_token: 131072, d2h_gbps: 25, h2d_gbps: 25,
                  connector: offloading}
  timing: {type: fixed, prefill_ms: 10.0, decode_ms: 5.0}
"""

# two prefill workers routed by cached prefix, one decode worker of 2 DP ranks
DISAGGREGATED_DP = workload(8) + """\
engine:
  block_size: 16
  num_gpu_blocks: 96
  timing: {type: fixed, prefill_ms: 10.0, decode_ms: 5.0}
cluster:
  mode: disaggregated
  prefill_workers: 2
  decode_workers: 1
  router: kv_router
  decode: {data_parallel_size: 2}
  kv_transfer: {bytes_per_token: 131072, bandwidth_gbps: 50}
"""


def plain_env():
    env = dict(os.environ, NUMBA_DISABLE_JIT="1", PYTHONPATH=str(ROOT))
    env.pop("SERVESIM_CHECK", None)
    return env


def test_the_recordings_and_the_engine_rules_pass_as_plain_python():
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/test_golden.py", "tests/test_engine_rules.py"],
        cwd=ROOT, env=plain_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    summary = proc.stdout.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) > 100 and "failed" not in summary, summary


SGLANG_PRESSURE = workload(9) + """\
engine:
  backend: sglang
  max_total_tokens: 1024
  page_size: 4
  chunked_prefill_size: 64
  max_running_requests: 16
  schedule_conservativeness: 0.05
  timing: {type: fixed, prefill_ms: 10.0, decode_ms: 5.0}
"""


# evictions, splits and chunks under backend: sglang too (the recordings, run as
# plain Python below, hold retractions)
@pytest.mark.parametrize("config", [CPU_TIER_ASYNC, DISAGGREGATED_DP, SGLANG_PRESSURE],
                         ids=["cpu-tier-async", "disaggregated-dp", "sglang-pressure"])
def test_a_run_as_plain_python_writes_the_compiled_runs_outputs(tmp_path, config):
    path = tmp_path / "config.yaml"
    path.write_text(config)
    compiled = invoke("run", path, "-o", tmp_path / "compiled", "-q", "--pass-log")
    assert compiled.exit_code == 0, compiled.output
    plain = subprocess.run(
        [sys.executable, "-m", "servesim", "run", str(path), "-o", str(tmp_path / "plain"), "-q",
         "--pass-log"], env=plain_env(), capture_output=True, text=True, timeout=600)
    assert plain.returncode == 0, plain.stderr
    if config is SGLANG_PRESSURE:
        passes = (tmp_path / "compiled" / "passes.jsonl").read_text()
        assert re.search(r'"evicted_tokens": [1-9]', passes) and '"partial": true' in passes
    for name in ("requests.jsonl", "passes.jsonl", "itl_quantiles.json"):
        assert ((tmp_path / "plain" / name).read_bytes()
                == (tmp_path / "compiled" / name).read_bytes()), name


def test_the_sglang_recordings_rules_and_compiled_path_pass_as_plain_python():
    """The SGLang engine's kernels (servesim/sglang/: the request table's,
    the radix tree's) run uncompiled give the recordings and the timelines."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
         "tests/test_golden_sglang.py", "tests/test_sglang_rules.py", "tests/test_sglang_arrays.py"],
        check=False, cwd=ROOT, env=plain_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    summary = proc.stdout.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) > 30 and "failed" not in summary, summary
