"""Ready configs printed by `servesim example [NAME]` (README.md, "A quick tour").

Trace-based examples replay the bundled first 1,000 rows of Mooncake's
conversation trace (`servesim/data/README.md`), named by its absolute path in
the installed package so that the printed config runs from any directory.
"""

import json
from pathlib import Path

from servesim.errors import InputError

BUNDLED_TRACE = "mooncake_conversation_1000.jsonl.gz"

# the deployment examples' load (vLLM's and SGLang's, side by side)
_DEPLOYMENT_WORKLOAD = """\
workload:
  synthetic:
    requests: 500
    input_tokens: {distribution: uniform, min: 512, max: 4096}
    output_tokens: {distribution: uniform, min: 64, max: 512}
    arrival: poisson
    rate: 4.0                 # requests/s
    seed: 42
"""

_MOONCAKE_WORKLOAD = """\
workload:
  trace: {trace}
  format: mooncake
  trace_block_size: 512       # tokens per hash_id
"""

EXAMPLES = {
    "deployment": """\
# Qwen3-32B on two H200s with tensor parallelism 2 (docs/deployment.md): vLLM's
# KV capacity derived from the model and the GPU, pass times from NVIDIA's
# aiconfigurator-core database (pip install 'servesim[aic]').
""" + _DEPLOYMENT_WORKLOAD + """\
engine:
  model: Qwen/Qwen3-32B       # `servesim models`; or a folder holding config.json
  gpu: h200_sxm               # `servesim gpus`
  tensor_parallel_size: 2
  pipeline_parallel_size: 1
  quantization: null          # null (16-bit weights) | fp8
  kv_cache_dtype: auto        # auto | fp8
  gpu_memory_utilization: 0.9 # num_gpu_blocks is derived (give it to override)
  block_size: 16
  max_num_seqs: 256
  max_num_batched_tokens: 8192
  timing: {type: aic}         # optionally {type: aic, calibration: calibration.yaml}
""",
    "mooncake": """\
# The first 1,000 requests of Mooncake's conversation trace (FAST'25, Apache-2.0)
# on one vLLM worker: the spec's benchmark setup (64-token blocks, 16384 blocks,
# Dynamo's polynomial pass-time model).
""" + _MOONCAKE_WORKLOAD + """\
engine:
  block_size: 64
  num_gpu_blocks: 16384       # KV blocks per rank, incl. vLLM's null block 0
  enable_prefix_caching: true
  max_num_seqs: 256
  max_num_batched_tokens: 8192
  timing:
    type: polynomial          # fixed | linear | polynomial | fitted
cluster:
  workers: 1
output:
  per_request: true           # requests.jsonl
  pass_log: false             # passes.jsonl
  telemetry_interval_ms: 1000 # telemetry.jsonl, one sample per simulated second
""",
    "synthetic": """\
# 500 synthetic chat requests sharing a 512-token system prompt, arriving as a
# Poisson process at 8 requests/s; a linear pass-time model.
workload:
  synthetic:
    requests: 500
    input_tokens: {distribution: lognormal, mean: 7.5, sigma: 0.6, min: 1024, max: 16384}
    output_tokens: {distribution: uniform, min: 32, max: 512}
    arrival: poisson          # burst | poisson | constant
    rate: 8.0                 # requests/s
    shared_prefix_tokens: 512 # a multiple of engine.block_size
    seed: 42
engine:
  block_size: 16
  num_gpu_blocks: 8192
  max_num_seqs: 256
  max_num_batched_tokens: 8192
  timing: {type: linear, base_ms: 5.0, per_token_ms: 0.012, per_context_token_ms: 0.00002}
""",
    "cpu-tier": """\
# The Mooncake example with a small GPU cache backed by a CPU tier
# (vLLM's OffloadingConnector): prefixes evicted from the GPU are loaded back.
""" + _MOONCAKE_WORKLOAD + """\
engine:
  block_size: 64
  num_gpu_blocks: 2048
  timing: {type: polynomial}
  kv_offloading:
    num_cpu_blocks: 16384
    bytes_per_token: 131072   # Llama-3-8B in bf16: 2 (K, V) x 32 layers x 8 heads x 128 x 2 B
    d2h_gbps: 25              # device-to-host GB/s
    h2d_gbps: 25              # host-to-device GB/s
    connector: offloading     # offloading (stores as blocks fill) | simple_cpu
""",
    "launch": """\
# The Mooncake example with async scheduling, CPU launch costs by pass kind and
# output detokenization (docs/engine.md §7-8).
""" + _MOONCAKE_WORKLOAD + """\
engine:
  block_size: 64
  num_gpu_blocks: 16384
  async_scheduling: true      # launch requires it
  launch:
    decode_ms: 6.52           # CUDA-graph replay
    piecewise_ms: 73.72       # passes with prompt tokens
    eager_ms: 180.81          # passes over the capture size
    eager_queue_fraction: 0.382
    max_cudagraph_capture_size: 4096
  detokenize_ms: 0.2          # per output, after the engine releases it
  timing: {type: polynomial}
""",
    "sessions": """\
# 2,000 synthetic chat sessions of 4 turns: each turn adds 512 new tokens to the
# conversation so far (previous prompt + answer), waits a think time after the
# previous answer's last token, and hits the earlier turns' cached blocks; four
# workers keep a session's turns on one worker.
workload:
  synthetic:
    sessions:
      count: 2000
      turns: 4
      new_input_tokens: {distribution: uniform, min: 256, max: 768}
      output_tokens: {distribution: uniform, min: 64, max: 256}
      think_time: {distribution: uniform, min: 1000, max: 10000}  # ms, or a number
      sessions_per_second: 4.0  # Poisson starts; or workload.concurrency: N sessions
      shared_prefix_ratio: 0.25 # of a first prompt's blocks, shared within a group
      prefix_groups: 8
    seed: 42
engine:
  block_size: 16
  num_gpu_blocks: 16384
  max_num_seqs: 256
  max_num_batched_tokens: 8192
  timing: {type: polynomial}
cluster:
  workers: 4
  router: session_affinity    # a session's turns go to its first turn's worker
""",
    "speculative": """\
# The Mooncake example with speculative decoding (vLLM's --speculative-config):
# one MTP module proposes 3 draft tokens per decode under async scheduling; each
# draft is accepted with its position's rate given the earlier ones were (a trace
# row's `accepted` list would replay measured acceptance instead).
""" + _MOONCAKE_WORKLOAD + """\
engine:
  block_size: 64
  num_gpu_blocks: 16384
  async_scheduling: true
  speculative:
    method: mtp               # mtp | eagle | ngram (ngram: async_scheduling false)
    num_speculative_tokens: 3
    acceptance_rates: [0.8, 0.6, 0.5]  # P(draft i accepted | drafts before it were)
    seed: 42
  timing: {type: polynomial}  # drafts priced as query tokens (docs/engine.md §12)
""",
    "disaggregated": """\
# The Mooncake example on disaggregated prefill and decode workers (vLLM with a
# KV-transfer connector such as NIXL, as NVIDIA Dynamo and llm-d deploy it): the
# prefill worker computes each prompt and its first token, the prompt's KV moves
# over the link to a decode worker, which generates the rest.
""" + _MOONCAKE_WORKLOAD + """\
engine:                       # both pools; cluster.prefill / cluster.decode override it
  block_size: 64
  num_gpu_blocks: 16384
  timing: {type: polynomial}
cluster:
  mode: disaggregated         # aggregated (default) | disaggregated
  prefill_workers: 1
  decode_workers: 1
  router: least_loaded        # picks the prefill worker at arrival, the decode worker at handoff
  prefill:                    # any engine key, for the prefill workers only
    max_num_seqs: 64
  decode:                     # any engine key, for the decode workers only
    max_num_seqs: 512
  kv_transfer:                # one link per prefill GPU, FIFO
    bytes_per_token: 131072   # Llama-3-8B in bf16: 2 (K, V) x 32 layers x 8 heads x 128 x 2 B
    bandwidth_gbps: 50        # GB/s (a 400 Gb/s NIC)
    latency_ms: 0.05
""",
    "sglang": """\
# The first 1,000 requests of Mooncake's conversation trace on one SGLang 0.5.23
# worker (docs/sglang.md): SGLang's server arguments, its radix cache in 64-token
# pages, a pool as large as the mooncake example's, Dynamo's polynomial pass times.
""" + _MOONCAKE_WORKLOAD + """\
engine:
  backend: sglang
  max_total_tokens: 1048576   # KV pool in tokens, a multiple of page_size
  page_size: 64
  chunked_prefill_size: 8192  # -1: chunked prefill off
  max_prefill_tokens: 16384
  max_running_requests: 256
  schedule_policy: lpm        # fcfs | lpm
  schedule_conservativeness: 1.0
  disable_radix_cache: false
  disable_overlap_schedule: false
  enable_mixed_chunk: false
  context_length: 131072
  ignore_eos: true
  timing:
    type: polynomial          # fixed | linear | polynomial | fitted
""",
    "sglang-deployment": """\
# Qwen3-32B on two H200s with tensor parallelism 2 on one SGLang 0.5.23 worker
# (docs/sglang.md, "Deployments"): max_total_tokens derived as SGLang derives it,
# pass times from the database's SGLang data (pip install 'servesim[aic]').
""" + _DEPLOYMENT_WORKLOAD + """\
engine:
  backend: sglang
  model: Qwen/Qwen3-32B       # `servesim models`; or a folder holding config.json
  gpu: h200_sxm               # `servesim gpus`
  tensor_parallel_size: 2
  quantization: null          # null (16-bit weights) | fp8
  kv_cache_dtype: auto        # auto | bf16 | bfloat16 | fp8_e4m3
  mem_fraction_static: null   # null: SGLang's default for the GPU (0.903 here)
  page_size: 1
  max_running_requests: 256
  timing: {type: aic}         # optionally {type: aic, calibration: calibration.yaml}
""",
}


# the examples timed by `aic`, whose pass times need aiconfigurator-core
AIC_EXAMPLES = ("deployment", "sglang-deployment")


def bundled_trace_path() -> str:
    """Absolute path of the bundled Mooncake trace in the installed package."""
    return str(Path(__file__).resolve().parents[1] / "data" / BUNDLED_TRACE)


def example_summaries() -> list:
    """`(name, what it is)` of every example, for `servesim example --help`:
    the first sentence of the example's leading comment."""
    out = []
    for name, text in EXAMPLES.items():
        comment = " ".join(line[2:] for line in text.splitlines() if line.startswith("# "))
        out.append((name, comment.split(". ")[0].split(": ")[0].rstrip(".")))
    return out


def example_text(name: str) -> str:
    """The YAML of example `name`, with the bundled trace's absolute path."""
    if name not in EXAMPLES:
        raise InputError(f"unknown example {name!r}; the examples are: {', '.join(EXAMPLES)}")
    return EXAMPLES[name].replace("{trace}", json.dumps(bundled_trace_path()))
