"""Tables of the database's pass times for the `aic` timing, built at start-up
from direct calls of aiconfigurator-core and cached on disk.

The axes (servesim/deployment/table_pricing.py) take their nodes from the
database's own measurement grid: prefill tokens and decode requests at the
GEMM token counts it measured (it measures both k and k+1 where its curves
step, so nodes there keep a step a step), contexts at powers of two and one
past them, where its attention data sits. The cache file is keyed by the
deployment, the engine limits that bound the axes and the package version,
under $XDG_CACHE_HOME/servesim (default ~/.cache/servesim).
"""

import hashlib
import json
import os

import numpy as np

from servesim.deployment import aic
from servesim.deployment import table_pricing

FORMAT = 5  # 5: mixed nodes with no room for their decodes keep their tokens
_REQUEST_NODES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256, 512, 1024)


def cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "servesim", "aic")


def _limits(engine) -> dict:
    """The engine limits that bound the axes; without `max_model_len`, the
    model's context length (vLLM's default for it, `derived_max_model_len`).
    With speculative decoding a decode request of k drafts is k + 1 decode
    queries (table_pricing.table_spec_pass_ms), so the decode axes reach
    `max_num_seqs * (k + 1)`, within the token budget. An SGLang engine's
    limits are its own (`_sglang_limits`)."""
    from servesim.deployment.specs import load_model_spec

    if engine.sglang is not None:
        return _sglang_limits(engine.sglang)
    s = engine.scheduler
    top = s.max_model_len or load_model_spec(engine.deployment.model).derived_max_model_len
    seqs = s.max_num_seqs
    spec = getattr(engine, "speculative", None)
    if spec is not None:
        seqs = max(seqs, min(seqs * (spec.num_speculative_tokens + 1), s.max_num_batched_tokens))
    return {"max_num_batched_tokens": s.max_num_batched_tokens, "max_num_seqs": seqs,
            "max_model_len": top}


def _sglang_limits(cfg) -> dict:
    """An SGLang worker's limits (servesim/sglang/prefill_adder.py): a pass's
    new tokens stay within `chunked_prefill_size` and `max_prefill_tokens`
    with chunked prefill (mixed chunks add the running decodes), and within
    one `context_length` prompt without it; its requests within the request
    slots (`max_num_reqs`)."""
    if cfg.chunked_prefill:
        budget = max(cfg.chunked_prefill_size, cfg.max_prefill_tokens)
    else:
        budget = max(cfg.max_prefill_tokens, cfg.context_length)
    return {"max_num_batched_tokens": budget, "max_num_seqs": cfg.max_num_reqs,
            "max_model_len": cfg.context_length}


def cache_key(dep, limits: dict, data_parallel_size: int, version: str) -> str:
    # the backend joins the key only when it is not vLLM's, so that vLLM's
    # cached tables keep their names
    backend = {} if dep.backend == "vllm" else {"backend": dep.backend}
    ident = {"format": FORMAT, "package": version, "dp": data_parallel_size, **backend,
             **{k: getattr(dep, k) for k in ("model", "gpu", "tensor_parallel_size",
                                              "pipeline_parallel_size", "enable_expert_parallel",
                                              "quantization", "kv_cache_dtype")},
             **limits}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:24]


def _context_nodes(top: int) -> list:
    nodes = [0, 1]
    p = 2
    while p < top:
        nodes += [p - 1, p] if p > 2 else [p]
        p *= 2
    nodes.append(top)
    return sorted(set(nodes))


def axes(grid: list, limits: dict) -> tuple:
    """The six axes' nodes for an engine's limits (the sixth: the mixed
    table's decode requests)."""
    budget = limits["max_num_batched_tokens"]
    seqs = limits["max_num_seqs"]
    top = limits["max_model_len"]
    grid = set(grid)
    p_nodes = sorted({m for m in grid if m <= budget} | {1, budget})
    q_nodes = sorted({q for q in _REQUEST_NODES if q <= min(seqs, budget)} | {min(seqs, budget)})
    k_nodes = [k for k in _context_nodes(top) if k == 0 or k == top or k >= 64 and (k & (k - 1)) == 0]
    # decode requests: the GEMM grid, and between its sparse points every 4
    # (to 64), 8 (to 256), 16 beyond: the database's decode attention is
    # measured at powers of two and is not linear in the batch between them
    dense = set(range(4, 65, 4)) | set(range(64, 257, 8)) | set(range(256, 1025, 16))
    d_nodes = sorted({m for m in grid | dense if m <= seqs} | {1, seqs})
    e_nodes = sorted({m for m in grid if m <= seqs} | {1, seqs})
    c_nodes = [c for c in _context_nodes(top) if c >= 1]
    return p_nodes, q_nodes, k_nodes, d_nodes, c_nodes, e_nodes


def _tokens_for(m: int, q: int, steps: set) -> int:
    """Prefill tokens in `q` even requests whose GEMM token count
    `q * (tokens // q)` is nearest `m` on the same side of the database's
    step at `m` (above it when `m` is a just-past-measured point)."""
    if m in steps:
        return q * -(-m // q)
    return max(q, q * (m // q))


def _memoized(direct):
    """`direct` called once per distinct pass (nodes whose requests split
    their tokens alike, e.g. many prefill nodes of 256 requests, share one)."""
    memo = {}

    def call(*features):
        if features not in memo:
            memo[features] = direct(*features)
        return memo[features]

    return call


# The decode context at which the mixed and remainder tables price their
# decode requests of context 1. The database adds a step's decode attention
# apart from the rest of it, so a decode term swapped for another cancels
# exactly (to rounding: tests/test_deployment.py rebuilds the fixture), and
# in 0.12.0 a query below ~4 tokens of decode context costs ~20x one above.
_PROBE_CONTEXT = 64


def build_table(direct, grid: list, limits: dict) -> np.ndarray:
    """Direct calls at every node (a prefill node with more requests than
    tokens copies its neighbour with as many requests as tokens); a mixed
    node's decode requests of context 1 are priced at `_PROBE_CONTEXT`
    less the decode-only difference between the two contexts. A mixed node of
    `p` tokens and `d >= p` decodes (no room for a prompt token) is priced
    as `p` tokens all the same, one of them a prompt's and `p - 1` decodes:
    a pass near it has about `p` tokens, and the database's GEMMs step with
    the token count (0.12.0, Llama-3.1-70B fp8 h100 TP 4: 21.9 ms at 256
    tokens, 33.7 at 257, whatever the decodes), so a node priced at `d + 1`
    tokens put a pass below the step above it."""
    call = _memoized(direct)
    p_nodes, q_nodes, k_nodes, d_nodes, c_nodes, e_nodes = axes(grid, limits)
    steps = {m for m in grid if m - 1 in set(grid)}
    prefill = np.zeros((len(p_nodes), len(q_nodes), len(k_nodes)))
    for i, p in enumerate(p_nodes):
        for j, q in enumerate(q_nodes):
            for k, ctx in enumerate(k_nodes):
                if q > p:
                    prefill[i, j, k] = prefill[i, j - 1, k]
                else:
                    prefill[i, j, k] = call(_tokens_for(p, q, steps), q, ctx * q, 0, 0)
    decode = np.zeros((len(d_nodes), len(c_nodes)))
    for i, d in enumerate(d_nodes):
        for j, c in enumerate(c_nodes):
            decode[i, j] = call(0, 0, 0, d, c * d)
    c = _PROBE_CONTEXT
    mixed = np.zeros((len(p_nodes), len(e_nodes)))
    for i, p in enumerate(p_nodes):
        for j, d in enumerate(e_nodes):
            d = min(d, p - 1)
            mixed[i, j] = call(p - d, 1, 0, d, c * d) - call(0, 0, 0, d, c * d) + call(0, 0, 0, d, d)
    # one more prompt of m tokens with context k in a mixed pass: 2m + 1
    # prompt tokens in two prompts (the database prices three) against 2m
    # (two), one decode each (its attention cancels); the one GEMM token
    # more is left in
    remainder = np.zeros((len(p_nodes), len(k_nodes)))
    for i, m in enumerate(p_nodes):
        if i > 0 and p_nodes[i - 1] >= limits["max_num_batched_tokens"] // 2:
            remainder[i] = remainder[i - 1]  # a pass of Q >= 2 prompts has m <= budget / 2
            continue
        for k, ctx in enumerate(k_nodes):
            remainder[i, k] = call(2 * m + 1, 2, 2 * ctx, 1, c) - call(2 * m, 2, 2 * ctx, 1, c)
    return table_pricing.pack(p_nodes, q_nodes, k_nodes, d_nodes, c_nodes, e_nodes,
                              prefill, decode, mixed, remainder)


def load_or_build(engine, data_parallel_size: int = 1) -> np.ndarray:
    """The deployment's table without calibration factors: from the disk
    cache, else built (then cached)."""
    dep = engine.deployment
    version = aic.package_version()
    if version is None:
        aic.require()
    limits = _limits(engine)
    path = os.path.join(cache_dir(), cache_key(dep, limits, data_parallel_size, version) + ".npy")
    if os.path.isfile(path):
        try:
            return np.load(path)
        except (OSError, ValueError):
            pass  # a damaged cache file is rebuilt
    direct = aic.DirectModel(dep, data_parallel_size)
    grid = aic.deployment_grid(dep)
    table = build_table(direct, grid, limits)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp.npy"
    np.save(tmp, table)
    os.replace(tmp, path)
    return table


# ngram's drafter: vLLM's NgramProposer matches the request's last n tokens
# in its own history on the CPU (a Numba-compiled KMP search over at most
# `max_model_len` tokens, after the sampler, before the next pass is
# scheduled: ngram runs without async scheduling). A documented constant per
# scheduled request, docs/deployment.md "Speculative decoding".
NGRAM_MS_PER_REQUEST = 0.01


def head_nodes(grid: list, limits: dict) -> list:
    """Logit-row counts at which the LM head is priced: the GEMM grid up to
    the token budget."""
    budget = limits["max_num_batched_tokens"]
    return sorted({m for m in grid if m <= budget} | {1, budget})


def load_or_build_head(engine, data_parallel_size: int = 1) -> tuple:
    """(nodes, milliseconds) of the LM head for a speculative deployment,
    from the disk cache or the database (then cached)."""
    dep = engine.deployment
    version = aic.package_version()
    if version is None:
        aic.require()
    limits = _limits(engine)
    path = os.path.join(cache_dir(), cache_key(dep, limits, data_parallel_size, version)
                        + "-head.npy")
    if os.path.isfile(path):
        try:
            saved = np.load(path)
            return saved[0], saved[1]
        except (OSError, ValueError, IndexError):
            pass  # a damaged cache file is rebuilt
    aic.check_supported(dep)
    nodes = head_nodes(aic.deployment_grid(dep), limits)
    saved = np.array([nodes, aic.head_times(dep, nodes, data_parallel_size)], dtype=np.float64)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp.npy"
    np.save(tmp, saved)
    os.replace(tmp, path)
    return saved[0], saved[1]


def with_drafts(table: np.ndarray, engine, data_parallel_size: int = 1) -> np.ndarray:
    """The table with speculative decoding's slots: k, the drafter, the
    target's layers on a rank and (MTP, EAGLE) the LM head's times."""
    from servesim.deployment.specs import load_model_spec

    spec = engine.speculative
    dep = engine.deployment
    layers = max(1, load_model_spec(dep.model).num_layers // dep.pipeline_parallel_size)
    if spec.method == "ngram":
        return table_pricing.with_speculative(table, spec.num_speculative_tokens,
                                              table_pricing.DRAFT_CPU, NGRAM_MS_PER_REQUEST,
                                              layers, [1.0], [0.0])
    nodes, head = load_or_build_head(engine, data_parallel_size)
    return table_pricing.with_speculative(table, spec.num_speculative_tokens,
                                          table_pricing.DRAFT_LAYER, 0.0, layers, nodes, head)


_MEMO: dict = {}


def pricing_table(engine, data_parallel_size: int = 1) -> np.ndarray:
    """The kernel's params for an engine with `timing: {type: aic}`."""
    spec = getattr(engine, "speculative", None)
    key = (engine.deployment, tuple(_limits(engine).values()), data_parallel_size,
           None if spec is None else (spec.method, spec.num_speculative_tokens))
    if key not in _MEMO:
        table = load_or_build(engine, data_parallel_size)
        _MEMO[key] = table if spec is None else with_drafts(table, engine, data_parallel_size)
    factors = engine.timing.calibration_factors or (1.0, 1.0, 1.0)
    return table_pricing.with_factors(_MEMO[key], factors)
