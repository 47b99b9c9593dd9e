"""KV capacity of an SGLang deployment, derived the way SGLang 0.5.23 derives
`max_total_tokens` (docs/sglang.md, "Deployments").

SGLang sizes its token pool from `mem_fraction_static`, the share of the
GPU's memory given to the weights and the KV pool together. The runner
measures the free memory before it loads the weights (`pre`,
`measure_pre_model_load_memory`, sglang/srt/distributed/bootstrap.py); after
loading them, the KV budget is what is free less `pre × (1 -
mem_fraction_static)` (`_profile_available_bytes`,
sglang/srt/mem_cache/kv_cache_configurator.py), divided by the bytes one
token takes on the rank (`DefaultPoolConfigurator._compute_cell_size`,
sglang/srt/model_executor/pool_configurator.py) and floored to a whole page
(`calculate_pool_sizes`, same file); a `max_total_tokens` the user gives caps
it (`_apply_token_constraints`). Without `mem_fraction_static` SGLang
derives it from the GPU's memory, its TP size, the chunk size and its CUDA
graphs (`handle_gpu_memory_settings`, `reserve_for_graph_mb`,
sglang/srt/arg_groups/memory_hook.py). Nothing is measured here: the free
memory before the weights is the GPU spec's memory less the runtime and NCCL
memory the vLLM derivation uses (servesim/deployment/gpus.py), and the
weights and per-token KV are kv_capacity.py's.
"""

import math

import attrs

from servesim.deployment.config import DeploymentConfig
from servesim.deployment.gpus import GPUSpec
from servesim.deployment.kv_capacity import GIB, kv_bytes_per_token, weights_bytes
from servesim.deployment.specs import ModelSpec
from servesim.errors import InputError

MIB = 1 << 20


@attrs.frozen
class SGLangCapacity:
    hbm_bytes: int
    mem_fraction_static: float
    pre_load_bytes: int  # free before the weights: HBM - runtime - NCCL
    weights_bytes: int
    slack_bytes: int  # pre_load_bytes x (1 - mem_fraction_static)
    kv_bytes_per_token: int  # per GPU (SGLang's cell size)
    page_size: int
    max_total_tokens: int  # derived, before a given max_total_tokens caps it

    def as_dict(self) -> dict:
        return attrs.asdict(self)

    def describe(self) -> str:
        g = lambda b: f"{b / GIB:.2f} GiB"  # noqa: E731
        rest = self.pre_load_bytes - self.weights_bytes - self.slack_bytes
        return (f"KV capacity: {g(self.pre_load_bytes)} free before the weights - "
                f"{g(self.weights_bytes)} weights - {g(self.slack_bytes)} outside "
                f"mem_fraction_static {self.mem_fraction_static:g} = {g(rest)} / "
                f"{self.kv_bytes_per_token} B/token = {self.max_total_tokens} tokens")


def gpu_mem_mib(gpu: GPUSpec) -> float:
    """The GPU's memory in MiB, as SGLang reads it (`get_device_memory_capacity`:
    nvidia-smi's memory.total); here the GPU spec's memory, which the database
    assumes (an H200 reports 143771 MiB, its spec says 144384)."""
    return gpu.hbm_bytes / MIB


def default_chunked_prefill_size(gpu: GPUSpec) -> int:
    """`chunked_prefill_size` by the GPU's memory (`handle_gpu_memory_settings`):
    2048 below 20 GiB, 4096 below 60, 8192 below 160 (H100, H200), else 16384
    (B200 and larger)."""
    mem = gpu_mem_mib(gpu)
    if mem < 20 * 1024:
        return 2048
    if mem < 60 * 1024:
        return 4096
    if mem < 160 * 1024:
        return 8192
    return 16384


def decode_graph_max_bs(gpu: GPUSpec, tp: int, max_running_requests: int | None) -> int:
    """The largest decode batch SGLang captures a CUDA graph for
    (`handle_gpu_memory_settings`), by the GPU's memory and TP size, capped by
    a `max_running_requests` the user gives."""
    mem = gpu_mem_mib(gpu)
    if mem < 20 * 1024:
        bs = 8
    elif mem < 35 * 1024:
        bs = 48 if tp < 4 else 160
    elif mem < 60 * 1024:
        bs = 32 if tp < 4 else 160
    elif mem < 160 * 1024:
        bs = 256 if tp < 4 else 512
    else:
        bs = 512
    if max_running_requests is not None:
        bs = min(bs, max_running_requests)
    return bs


def prefill_graph_sizes(max_bs: int) -> list:
    """The token counts of the prefill CUDA graphs (breakable, on by default on
    CUDA): `generate_prefill_cuda_graph_batch_sizes`,
    sglang/srt/arg_groups/cuda_graph_hook.py."""
    sizes = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32))
             + list(range(576, 1025, 64)) + list(range(1280, 4097, 256))
             + list(range(4608, max_bs + 1, 512)))
    return [s for s in sizes if s <= max_bs]


def reserved_mib(model: ModelSpec, gpu: GPUSpec, tp: int, chunked_prefill_size: int,
                 max_prefill_tokens: int, max_running_requests: int | None,
                 max_total_tokens: int | None) -> float:
    """The memory SGLang keeps outside `mem_fraction_static`, in MiB
    (`handle_gpu_memory_settings` and `reserve_for_graph_mb`): 512 + 1.5 per
    token of the larger of the chunk (`max_prefill_tokens` without chunked
    prefill) and 2048, + TP/8 GiB, + 2 per decode-graph batch size, + 8 per
    prefill graph (up to the chunk, none without chunked prefill; 1.5 GiB
    for an MLA model), at least 10 GiB on a GPU of more than 60 GiB."""
    tokens = chunked_prefill_size if chunked_prefill_size > 0 else max_prefill_tokens
    reserved = 512 + max(tokens, 2048) * 1.5 + tp / 8 * 1024
    reserved += decode_graph_max_bs(gpu, tp, max_running_requests) * 2
    if model.is_mla:
        reserved += 1.5 * 1024
    else:
        max_bs = chunked_prefill_size  # -1 (chunked prefill off): no prefill graph
        if max_total_tokens is not None:
            max_bs = min(max_bs, max_total_tokens)
        reserved += len(prefill_graph_sizes(max_bs)) * 8
    if gpu_mem_mib(gpu) > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return reserved


def default_mem_fraction_static(model: ModelSpec, gpu: GPUSpec, tp: int, chunked_prefill_size: int,
                                max_prefill_tokens: int, max_running_requests: int | None,
                                max_total_tokens: int | None) -> float:
    """`mem_fraction_static` when not given: `round((M - reserved) / M, 3)` of
    the GPU's memory M in MiB (`handle_gpu_memory_settings`)."""
    mem = gpu_mem_mib(gpu)
    reserved = reserved_mib(model, gpu, tp, chunked_prefill_size, max_prefill_tokens,
                            max_running_requests, max_total_tokens)
    return round((mem - reserved) / mem, 3)


def derive_max_total_tokens(model: ModelSpec, gpu: GPUSpec, dep: DeploymentConfig,
                            page_size: int) -> SGLangCapacity:
    """The token pool of one rank, with the terms it came from: the free
    memory before the weights, less the weights and `pre × (1 -
    mem_fraction_static)`, over the KV bytes of a token, floored to a page.
    SGLang's refusal when the weights leave nothing (`_profile_available_bytes`)
    names the smallest `mem_fraction_static` that would leave some."""
    pre = gpu.hbm_bytes - gpu.runtime_bytes - gpu.nccl_bytes(dep.tensor_parallel_size)
    weights = weights_bytes(model, dep)
    slack = pre * (1 - dep.mem_fraction_static)
    rest = int(pre - weights - slack)
    if rest <= 0:
        minimum = math.ceil((1 - (pre - weights) / pre) * 1000) / 1000
        raise InputError(
            f"engine.mem_fraction_static: {model.name} on {dep.tensor_parallel_size}x{gpu.name} "
            f"leaves no KV cache: the weights take {weights / GIB:.2f} GiB of the "
            f"{pre * dep.mem_fraction_static / GIB:.2f} GiB that mem_fraction_static "
            f"{dep.mem_fraction_static:g} gives the weights and KV pool (SGLang refuses to start: "
            f"raise mem_fraction_static above {minimum:.3f}, or tensor_parallel_size)")
    per_token = kv_bytes_per_token(model, dep)
    tokens = rest // per_token // page_size * page_size
    return SGLangCapacity(hbm_bytes=gpu.hbm_bytes, mem_fraction_static=dep.mem_fraction_static,
                          pre_load_bytes=pre, weights_bytes=weights, slack_bytes=int(slack),
                          kv_bytes_per_token=per_token, page_size=page_size,
                          max_total_tokens=int(tokens))


def default_max_running_requests(max_total_tokens: int, context_length: int) -> int:
    """`max_running_requests` when not given (`resolve_max_num_reqs`,
    sglang/srt/mem_cache/kv_cache_configurator.py): 512 per context length
    the pool holds, within 2048 and 4096 (SGLangConfig.max_num_reqs then
    takes the pool's half, as SGLang does)."""
    return max(min(int(max_total_tokens / context_length * 512), 4096), 2048)
