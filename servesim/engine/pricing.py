"""Pass pricing (docs/engine.md §10): the GPU time of a pass from what it
schedules, as one Numba kernel.

Features of a pass: `prefill_tokens` (tokens scheduled for prefill requests,
cache hits excluded), `num_prefill_requests`, `decode_requests`,
`decode_context` (sum of decode requests' known tokens), `tokens` (all
scheduled tokens, draft tokens included), `requests` (scheduled requests),
`draft_tokens` (speculative decoding's draft tokens, 0 without it; the
`fitted` model's optional sixth feature `sum_draft_tokens` prices them),
`prefill_context` (computed tokens of the prefill requests before the pass;
the `aic` tables use it), `prefill_draft_tokens` (the draft tokens of prefill
requests, an admission's padding: counted in both `prefill_tokens` and
`draft_tokens`). How each model prices drafts: docs/engine.md §12.
"""

import numpy as np

from servesim.engine import fitted_formula
from servesim.engine.config import TimingConfig
from servesim.deployment.table_pricing import SPEC_K, table_pass_ms, table_spec_pass_ms
from servesim.jit import njit
from servesim.scheduler import output

fitted_ms = njit(fitted_formula.fitted_ms)

FIXED, LINEAR, POLYNOMIAL, FITTED, TABLE = 0, 1, 2, 3, 4
# Numba's disk cache of this module's kernels is keyed by this file alone and
# holds table_pass_ms compiled in: edit this line with every change of
# table_pricing.py (its table layout is 4: six axes, the remainder table,
# speculative decoding's slots and LM head).
_TYPES = {"fixed": FIXED, "linear": LINEAR, "polynomial": POLYNOMIAL, "fitted": FITTED, "aic": TABLE}


@njit
def price_pass(model, params, prefill_tokens, num_prefill_requests, decode_requests,
               decode_context, tokens, requests, kv_capacity_tokens, draft_tokens=0,
               prefill_context=0, prefill_draft_tokens=0):
    """Milliseconds of GPU time for one pass of one rank."""
    if model == TABLE:
        return _table_ms(params, prefill_tokens, num_prefill_requests, decode_requests,
                         decode_context, requests, draft_tokens, prefill_context,
                         prefill_draft_tokens)
    return _formula_ms(model, params, prefill_tokens, num_prefill_requests, decode_requests,
                       decode_context, tokens, requests, kv_capacity_tokens, draft_tokens,
                       prefill_draft_tokens)


@njit
def _table_ms(params, prefill_tokens, num_prefill_requests, decode_requests, decode_context,
              requests, draft_tokens, prefill_context, prefill_draft_tokens):
    """`aic`: the pass priced from the deployment's tables (deployment/table_pricing.py)."""
    if params[SPEC_K] != 0.0:
        return table_spec_pass_ms(params, prefill_tokens, num_prefill_requests,
                                  prefill_context, decode_requests, decode_context, requests,
                                  draft_tokens, prefill_draft_tokens)
    return table_pass_ms(params, prefill_tokens, num_prefill_requests, prefill_context,
                         decode_requests, decode_context)


@njit
def _formula_ms(model, params, prefill_tokens, num_prefill_requests, decode_requests,
                decode_context, tokens, requests, kv_capacity_tokens, draft_tokens,
                prefill_draft_tokens):
    """`fixed`, `linear`, `polynomial` and `fitted`: a formula of the features."""
    if model == FIXED:
        # no price per token: refused with speculative decoding at config load
        # (servesim/config/speculative_config.py check_drafts_priced)
        t = 0.0
        if prefill_tokens > 0:
            t += params[0]
        if decode_requests > 0:
            t += params[1]
        return t
    if model == LINEAR:
        # `tokens` holds every draft once, padding included: a draft costs
        # per_token_ms like a decode's token
        return (params[0] + params[1] * tokens + params[2] * requests
                + params[3] * decode_context)
    if model == POLYNOMIAL:
        # NVIDIA Dynamo's fallback vLLM pass-time polynomials. Its decode term
        # prices the batch by KV occupancy, not by token, so a decode's drafts
        # (query tokens beyond its one) join the prefill quadratic, the
        # polynomial's price of query tokens, without its per-pass constant
        # when the pass has no prompt token; prefill entries' padding drafts
        # are already in `prefill_tokens` (counted once). docs/engine.md §12.
        t = 0.0
        decode_drafts = draft_tokens - prefill_draft_tokens
        if prefill_tokens > 0:
            x = float(prefill_tokens + decode_drafts)
            t += 4.209989e-07 * x * x + 1.518344e-02 * x + 16.50142
        elif decode_drafts > 0:
            x = float(decode_drafts)
            t += 4.209989e-07 * x * x + 1.518344e-02 * x
        if decode_requests > 0:
            u = min(1.0, decode_context / kv_capacity_tokens)
            t += max(1.0, -25.74 * u * u + 54.01 * u + 5.74)
        return t
    # FITTED: intercept + the four forward-pass-record features (+ draft
    # tokens, 0 for a five-feature model), clamped at 0 (a run whose passes
    # could price below 0 is refused at config load: servesim/engine/price_floor.py).
    # A record's features are disjoint (tokens = sum_prefill_tokens +
    # num_decode_requests + sum_draft_tokens, servesim/fitting/records.py): a
    # model with a draft coefficient prices padding drafts as draft tokens only.
    if params[5] != 0.0:
        prefill_tokens = prefill_tokens - prefill_draft_tokens
    t = fitted_ms(params, num_prefill_requests, prefill_tokens, decode_requests, decode_context,
                  draft_tokens)
    return max(t, 0.0)


@njit
def price_features(model, params, feats, kv_capacity_tokens, table):
    """`price_pass` over a compiled scheduler's feature array. `table`: the
    `aic` tables (`params`), or None for a formula, so that a kernel calling
    it compiles only the kind of pricing its run uses (Numba prunes the
    other branch on the argument's type)."""
    if table is not None:
        return _table_ms(table, feats[output.PREFILL_TOKENS], feats[output.NUM_PREFILL],
                         feats[output.DECODE_REQS], feats[output.DECODE_CTX], feats[output.N_SCHED],
                         feats[output.SPEC_TOKENS], feats[output.PREFILL_CTX],
                         feats[output.PREFILL_SPEC])
    return _formula_ms(model, params, feats[output.PREFILL_TOKENS], feats[output.NUM_PREFILL],
                       feats[output.DECODE_REQS], feats[output.DECODE_CTX],
                       feats[output.TOTAL_TOKENS], feats[output.N_SCHED], kv_capacity_tokens,
                       feats[output.SPEC_TOKENS], feats[output.PREFILL_SPEC])


class PassPricer:
    """A timing config turned into the kernel's model code and parameters.
    `kv_capacity_tokens`, the polynomial's KV-occupancy denominator, is every
    block's tokens, vLLM's null block included (docs/engine.md §10: Dynamo's
    formula divides by its whole pool, which has none); the blocks a request
    may use are `KVCacheConfig.num_usable_blocks`."""

    def __init__(self, timing: TimingConfig, num_gpu_blocks: int, block_size: int, engine=None,
                 data_parallel_size: int = 1):
        self.model = _TYPES[timing.type]
        self.kv_capacity_tokens = float(num_gpu_blocks * block_size)
        if self.model == TABLE:
            # the deployment's tables (servesim/deployment/aic_tables.py, cached)
            from servesim.deployment.aic_tables import pricing_table

            self.params = pricing_table(engine, data_parallel_size)
            self.table = self.params
            return
        self.table = None  # (`price_features`: a formula, no table kernel compiled)
        if self.model == FIXED:
            params = [timing.prefill_ms, timing.decode_ms]
        elif self.model == LINEAR:
            params = [timing.base_ms, timing.per_token_ms, timing.per_request_ms,
                      timing.per_context_token_ms]
        elif self.model == FITTED:
            params = list(timing.coefficients_ms)
        else:
            params = []
        self.params = np.array(params + [0.0] * (6 - len(params)), dtype=np.float64)

    @classmethod
    def of_engine(cls, engine, data_parallel_size: int = 1) -> "PassPricer":
        """The pricer of an engine config: a vLLM engine's KV blocks, or an
        SGLang engine's pool of `max_total_tokens` one-token slots."""
        if engine.sglang is not None:
            return cls(engine.timing, engine.sglang.max_total_tokens, 1, engine)
        return cls(engine.timing, engine.kv_cache.num_gpu_blocks, engine.kv_cache.block_size, engine,
                   data_parallel_size)
