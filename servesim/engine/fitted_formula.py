"""The `fitted` pricing formula (docs/docs/fitting.md) as plain Python, with no Numba.

`servesim/engine/pricing.py` compiles it into the pricing kernel; the config
check of `servesim/engine/price_floor.py` calls it as it is, so loading a
config never imports Numba.
"""

# The features of a fitted model, in its coefficients' order (docs/fitting.md).
FITTED_FEATURES = (
    "intercept",
    "num_prefill_requests",
    "sum_prefill_tokens",
    "num_decode_requests",
    "sum_decode_kv_tokens",
)
# a model fitted on records of speculative decoding has a sixth feature
FITTED_SPEC_FEATURE = "sum_draft_tokens"


def fitted_ms(params, num_prefill_requests, prefill_tokens, decode_requests, decode_context,
              draft_tokens=0):
    """A `fitted` model's price before the clamp at 0: the intercept plus
    each forward-pass-record feature times its coefficient (the sixth,
    `sum_draft_tokens`, only when there are draft tokens: a five-feature
    model has none)."""
    t = (params[0] + params[1] * num_prefill_requests + params[2] * prefill_tokens
         + params[3] * decode_requests + params[4] * decode_context)
    if draft_tokens:
        t += params[5] * draft_tokens
    return t
