"""The cheapest pass a run can schedule, priced before any clamp at 0.

A `fitted` model is a plane through the four forward-pass-record features
(docs/docs/fitting.md); fitted on records that never reach some corner of the
feature space, it can price such a corner below 0 ms, and the pricing kernel
would then run the pass in 0 ms without saying so. This module finds the
lowest price any pass of the run can get, so the config loader can refuse the
model before the run starts (`servesim/config/fitted_checks.py`).

**The run's shape.** One rank's pass schedules `p` prefill requests with `T`
prefill tokens and `d` decode requests holding `C` context tokens in all,
and, with speculative decoding of k drafts, `D` draft tokens, under the
scheduler's limits (docs/engine.md):

- `1 <= p + d <= M` with `M = min(max_num_seqs, max_num_batched_tokens)`
  (each scheduled request gets at least one token of the budget);
- `T = 0` when `p = 0`, else `p <= T <= max_num_batched_tokens - d - D` (a
  prefill request schedules at least one token, a decode request exactly
  one besides its drafts);
- `0 <= D <= k * (p + d)` (a decode request schedules at most k drafts, a
  padded admission k; `T` counts no draft, as in a forward-pass record, whose
  features are disjoint: docs/fitting.md);
- `d <= C <= d * L`: a decode request knows at least one token (under async
  scheduling the newest token can still be a placeholder) and at most
  `L = min(max_model_len, num_usable_blocks * block_size)` (a request
  never outgrows its model length, nor the pool without its null block).

Every pricing model is monotone in `T`, in `D` and in `C` for fixed `(p, d)`
(fixed and linear are affine, fitted is affine, polynomial is a rising
quadratic in `T` and a concave function of `C`), so the minimum over `C` is
at an end of its range and the minimum over `(T, D)` at a vertex of their
polygon (`(p, 0)`, `(B - d, 0)`, `(p, min(K, B - d - p))` and `(B - d - K, K)`
when `K < B - d - p`, with `B` the budget and `K = k (p + d)`; without drafts
the two ends of `T`); for a fixed choice of vertex the price is affine in
`(p, d)` (fitted, linear) and its minimum over the integer triangle is at one
of its corners `(0, 1)`, `(0, M)`, `(1, 0)`, `(M, 0)`, `(1, M - 1)`.
:func:`corner_passes` lists those corners with every vertex and both ends of
`C`; it is a superset of the extremes of every model here, and a handful of
calls of the pricing formula (Python, not the kernel: this runs once, at
config load).

The bounds come from the config alone, not the workload, so they can name a
corner a particular trace never reaches (say 256 decodes of `max_model_len`
each on a small pool); they are the passes this deployment *can* run, which
is what the model is being trusted with.
"""

import attrs

from servesim.engine.config import TimingConfig
from servesim.engine.fitted_formula import fitted_ms
from servesim.kvcache.config import KVCacheConfig
from servesim.scheduler.config import SchedulerConfig


@attrs.frozen
class PassShape:
    """One pass of one rank, by the features the pricing models read
    (`prefill_tokens` without drafts; `draft_tokens` all of them)."""

    num_prefill_requests: int
    prefill_tokens: int
    decode_requests: int
    decode_context: int
    draft_tokens: int = 0

    @property
    def tokens(self) -> int:
        """Scheduled tokens: the prefill tokens plus one per decode request,
        plus the drafts."""
        return self.prefill_tokens + self.decode_requests + self.draft_tokens

    @property
    def requests(self) -> int:
        return self.num_prefill_requests + self.decode_requests

    def describe(self) -> str:
        parts = []
        if self.num_prefill_requests:
            parts.append(f"{self.num_prefill_requests} prefill request(s) of "
                         f"{self.prefill_tokens} tokens in all")
        if self.decode_requests:
            parts.append(f"{self.decode_requests} decode request(s) holding "
                         f"{self.decode_context} context tokens in all")
        text = " and ".join(parts)
        if self.draft_tokens:
            text += f", with {self.draft_tokens} draft tokens"
        return text


@attrs.frozen
class RunShape:
    """The limits of :func:`corner_passes` (see the module docstring)."""

    max_requests: int  # M = min(max_num_seqs, max_num_batched_tokens)
    max_tokens: int  # max_num_batched_tokens
    max_context: int  # L, per decode request
    context_limited_by: str  # "max_model_len" or "num_gpu_blocks"
    drafts_per_request: int = 0  # k of speculative decoding, 0 without it

    @classmethod
    def of(cls, scheduler: SchedulerConfig, kv_cache: KVCacheConfig,
           num_speculative_tokens: int = 0) -> "RunShape":
        pool_tokens = kv_cache.num_usable_blocks * kv_cache.block_size
        model_len = scheduler.max_model_len
        if model_len is not None and model_len <= pool_tokens:
            context, by = model_len, "max_model_len"
        else:
            context, by = pool_tokens, "num_gpu_blocks"
        return cls(max_requests=min(scheduler.max_num_seqs, scheduler.max_num_batched_tokens),
                   max_tokens=scheduler.max_num_batched_tokens,
                   max_context=max(context, 1), context_limited_by=by,
                   drafts_per_request=num_speculative_tokens)

    def describe(self) -> str:
        text = (f"up to {self.max_requests} requests (max_num_seqs) and "
                f"{self.max_tokens} tokens (max_num_batched_tokens) a pass, decode "
                f"contexts of 1 to {self.max_context} tokens each ({self.context_limited_by})")
        if self.drafts_per_request:
            text += (f", up to {self.drafts_per_request} draft tokens per request "
                     "(num_speculative_tokens)")
        return text


def corner_passes(shape: RunShape) -> list:
    """The corner passes of `shape`, in a fixed order, without repeats."""
    m, b, ctx = shape.max_requests, shape.max_tokens, shape.max_context
    out = []
    for p in (0, 1, m):
        for d in (0, 1, m - p):
            if d < 0 or not 1 <= p + d <= m:
                continue
            for t, drafts in _token_vertices(p, d, b, shape.drafts_per_request * (p + d)):
                for c in ((d, d * ctx) if d else (0,)):
                    corner = PassShape(p, t, d, c, drafts)
                    if corner not in out:
                        out.append(corner)
    return out


def _token_vertices(p: int, d: int, budget: int, max_drafts: int) -> list:
    """The vertices `(T, D)` of `T + D <= budget - d`, `0 <= D <= max_drafts`,
    `p <= T` (`T = 0` when `p = 0`), in a fixed order."""
    room = budget - d
    if not p:
        return [(0, 0)] + ([(0, min(max_drafts, room))] if max_drafts else [])
    out = [(p, 0), (room, 0)]
    if max_drafts:
        out.append((p, min(max_drafts, room - p)))
        if max_drafts < room - p:
            out.append((room - max_drafts, max_drafts))
    return out


# Timing types whose price is never below 0 by construction: `fixed` and
# `linear` take only parameters >= 0 (the config refuses others) over counts
# >= 0, and `polynomial`'s prefill term is a quadratic with positive
# coefficients and its decode term is at least 1 ms. The config check skips
# them (tests/test_fitting_contract.py checks the claim on their corners).
NEVER_NEGATIVE = ("fixed", "linear", "polynomial")


def unclamped_price(timing: TimingConfig, kv_cache: KVCacheConfig, shape: PassShape) -> float:
    """The price (ms) the run's pricing kernel computes for `shape`, before
    the `fitted` model's clamp at 0 (the kernel's own Python code, not a copy).
    A `fitted` model needs no Numba here; other types import the kernel's
    module."""
    if timing.type == "fitted":
        params = [float(c) for c in timing.coefficients_ms]
        params += [0.0] * (6 - len(params))  # a five-feature model prices no draft
        return fitted_ms(params, float(shape.num_prefill_requests), float(shape.prefill_tokens),
                         float(shape.decode_requests), float(shape.decode_context),
                         float(shape.draft_tokens))
    from servesim.engine.pricing import PassPricer, price_pass

    pricer = PassPricer(timing, kv_cache.num_gpu_blocks, kv_cache.block_size)
    return _python(price_pass)(pricer.model, pricer.params, float(shape.prefill_tokens),
                               float(shape.num_prefill_requests), float(shape.decode_requests),
                               float(shape.decode_context), float(shape.tokens),
                               float(shape.requests), pricer.kv_capacity_tokens,
                               float(shape.draft_tokens))


def cheapest_pass(timing: TimingConfig, scheduler: SchedulerConfig,
                  kv_cache: KVCacheConfig, num_speculative_tokens: int = 0) -> tuple:
    """`(RunShape, PassShape, price ms)` of the lowest-priced corner pass
    (the first of equals in `corner_passes` order); `num_speculative_tokens`
    is k of `engine.speculative`, 0 without it."""
    shape = RunShape.of(scheduler, kv_cache, num_speculative_tokens)
    priced = [(unclamped_price(timing, kv_cache, c), c) for c in corner_passes(shape)]
    price, corner = min(priced, key=lambda pc: pc[0])
    return shape, corner, price


def _python(kernel):
    """A Numba kernel's Python function (no compilation for a few calls)."""
    return getattr(kernel, "py_func", kernel)
