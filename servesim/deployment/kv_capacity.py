"""KV capacity of a deployment, derived the way vLLM derives it.

vLLM's worker (`vllm/v1/worker/gpu_worker.py`, `determine_available_memory`)
profiles a dummy forward pass of `max_num_batched_tokens` tokens and gives the
KV cache what is left of `gpu_memory_utilization × total memory` after the
weights, the peak activation memory and the non-torch memory (CUDA context,
NCCL buffers, CUDA graphs); `vllm/v1/core/kv_cache_utils.py` then divides it by
the page size of one block (`block_size × bytes per token` of a layer, times
the layers). Nothing is profiled here: every term is an estimate from the
model's shapes and the GPU's spec, and `derive_capacity` says which.
"""

import functools

import attrs

from servesim.deployment.config import DeploymentConfig
from servesim.deployment.gpus import GPUS, GPUSpec
from servesim.deployment.specs import KV_BYTES, WEIGHT_BYTES, ModelSpec
from servesim.errors import InputError

GIB = 1 << 30
_EMBEDDING_BYTES = 2  # embeddings and lm_head stay 16-bit under fp8 weights


@attrs.frozen
class Capacity:
    hbm_bytes: int
    budget_bytes: int  # gpu_memory_utilization × HBM
    weights_bytes: int
    activation_bytes: int
    runtime_bytes: int  # non-torch memory: CUDA context, cuBLAS, CUDA graphs, NCCL
    kv_bytes_per_token: int  # per GPU
    block_size: int
    num_gpu_blocks: int

    def as_dict(self) -> dict:
        return attrs.asdict(self)

    def describe(self) -> str:
        g = lambda b: f"{b / GIB:.2f} GiB"  # noqa: E731
        return (f"KV capacity: {g(self.budget_bytes)} budget - {g(self.weights_bytes)} weights - "
                f"{g(self.activation_bytes)} activations - {g(self.runtime_bytes)} runtime = "
                f"{g(self.budget_bytes - self.weights_bytes - self.activation_bytes - self.runtime_bytes)}"
                f" / ({self.kv_bytes_per_token} B/token x {self.block_size}) = "
                f"{self.num_gpu_blocks} blocks")


def kv_bytes_per_token(model: ModelSpec, dep: DeploymentConfig) -> int:
    """KV bytes one token takes on one GPU: its pipeline stage's layers × the
    KV heads its TP rank holds (at least one: vLLM replicates KV heads when TP
    exceeds them) × head dim × 2 (K and V) × the KV dtype's bytes. An MLA
    model caches one compressed latent (kv_lora_rank + rope dims) per layer,
    replicated on every TP rank."""
    if model.sliding_window:
        raise InputError(
            f"engine.model: {model.name} uses sliding-window attention (window "
            f"{model.sliding_window}); servesim's KV cache has one full-attention group, so "
            "it cannot derive this model's capacity: give engine.num_gpu_blocks")
    dtype_bytes = KV_BYTES[dep.kv_cache_dtype]
    layers = -(-model.num_layers // dep.pipeline_parallel_size)
    if model.is_mla:
        return layers * (model.kv_lora_rank + model.qk_rope_head_dim) * dtype_bytes
    heads = max(1, model.num_kv_heads // dep.tensor_parallel_size)
    return layers * heads * model.head_dim * 2 * dtype_bytes


def weights_bytes(model: ModelSpec, dep: DeploymentConfig, data_parallel_size: int = 1) -> int:
    """Weight bytes on one GPU: linear layers at the quantization's bytes split
    over TP (routed experts over TP × DP with expert parallelism, as vLLM's EP
    spans the TP and DP ranks), embeddings 16-bit split over TP, all over PP."""
    p = model.parameters()
    wbytes = WEIGHT_BYTES[dep.quantization]
    tp = dep.tensor_parallel_size
    ep = tp * data_parallel_size if dep.enable_expert_parallel else tp
    total = (p["embedding"] * _EMBEDDING_BYTES / tp
             + (p["attention"] + p["dense_mlp"] + p["shared"]) * wbytes / tp
             + p["experts"] * wbytes / ep)
    return int(total / dep.pipeline_parallel_size)


def activation_bytes(model: ModelSpec, dep: DeploymentConfig, max_num_batched_tokens: int,
                     max_num_seqs: int) -> int:
    """Peak activation memory of vLLM's profiling pass: `max_num_batched_tokens`
    tokens through one layer, at 16-bit — residual and normed hidden states
    (4 × hidden), the QKV output and attention output of the TP rank, the
    gate/up output and its activation (3 × intermediate / TP, the routed
    experts' `experts_per_token` copies for MoE) — plus the sampler's fp32
    logits of `max_num_seqs` rows."""
    tp = dep.tensor_parallel_size
    q = model.num_heads * model.head_dim
    kv = model.num_kv_heads * model.head_dim
    inter = model.intermediate_size
    if model.num_experts:
        inter = max(model.intermediate_size if model.dense_layers else 0,
                    model.experts_per_token * model.moe_intermediate_size)
    per_token = 4 * model.hidden_size + 2 * (q + 2 * kv) / tp + 3 * inter / tp
    logits = max_num_seqs * model.vocab_size * 4
    return int(max_num_batched_tokens * per_token * 2 + logits)


def derive_capacity(model: ModelSpec, gpu: GPUSpec, dep: DeploymentConfig, block_size: int,
                    max_num_batched_tokens: int, max_num_seqs: int,
                    data_parallel_size: int = 1) -> Capacity:
    """`num_gpu_blocks` per rank, with the terms it came from; derived once per
    process for each deployment (the config and the summary both ask)."""
    return _derive_capacity(model, gpu, attrs.evolve(dep, derived_num_gpu_blocks=False), block_size,
                            max_num_batched_tokens, max_num_seqs, data_parallel_size)


@functools.lru_cache(maxsize=64)
def _derive_capacity(model, gpu, dep, block_size, max_num_batched_tokens, max_num_seqs,
                     data_parallel_size) -> Capacity:
    budget = int(dep.gpu_memory_utilization * gpu.hbm_bytes)
    weights = weights_bytes(model, dep, data_parallel_size)
    activations = activation_bytes(model, dep, max_num_batched_tokens, max_num_seqs)
    runtime = gpu.runtime_bytes + gpu.nccl_bytes(dep.tensor_parallel_size)
    per_token = kv_bytes_per_token(model, dep)
    available = budget - weights - activations - runtime
    blocks = available // (per_token * block_size) if available > 0 else 0
    if blocks < 2:
        raise InputError(
            f"engine: {model.name} on {dep.tensor_parallel_size}x{gpu.name} (PP "
            f"{dep.pipeline_parallel_size}) leaves no KV cache: {available / GIB:.2f} GiB after "
            f"{weights / GIB:.2f} GiB weights, {activations / GIB:.2f} GiB activations and "
            f"{runtime / GIB:.2f} GiB runtime memory of {budget / GIB:.2f} GiB "
            "(raise tensor_parallel_size or gpu_memory_utilization)")
    return Capacity(hbm_bytes=gpu.hbm_bytes, budget_bytes=budget, weights_bytes=weights,
                    activation_bytes=activations, runtime_bytes=runtime,
                    kv_bytes_per_token=per_token, block_size=block_size,
                    num_gpu_blocks=int(blocks))


def gpu_spec(name: str, where: str = "engine.gpu") -> GPUSpec:
    if name not in GPUS:
        raise InputError(f"{where}: unknown GPU {name!r}; supported: {', '.join(GPUS)}")
    return GPUS[name]
