"""Speculative decoding (`engine.speculative`, vLLM's `--speculative-config`;
docs/engine.md §12): the config, its checks, and how many
drafts a verification pass accepts.

A drafter (an MTP module, an EAGLE head, or ngram matching) proposes
`num_speculative_tokens` k tokens for every decoding request; the target model
verifies them in the next pass, accepts a prefix and samples one more token.
Acceptance is an input: per request, the trace field `accepted` (one entry per
pass that verified real drafts, cycled) replays measured acceptance;
otherwise draft position i is accepted with probability `acceptance_rates[i]`
given the drafts before it were, from a counter-based generator keyed by
(seed, request id, verification number, position) — deterministic, and
independent of the order in which requests are processed or stand in the
workload.
"""

import attrs
import numpy as np

from servesim.jit import njit, plain_python

METHODS = ("mtp", "eagle", "ngram")
MAX_SPECULATIVE_TOKENS = 8


@attrs.frozen
class SpeculativeConfig:
    """`engine.speculative`. `acceptance_rates` has k entries (default: all
    0.7); `seed` keys the acceptance draws of requests without `accepted`.
    Checked in servesim/config/speculative_config.py."""

    method: str = "mtp"
    num_speculative_tokens: int = 1
    acceptance_rates: tuple = ()
    seed: int = 42


DEFAULT_RATE = 0.7


@njit(inline="always")
def _mix(x):
    """splitmix64's finaliser: a well-mixed 64-bit value of x (its products
    wrap modulo 2**64)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


if plain_python():  # NumPy's scalars wrap too, but warn each time: not here
    _mix_wrapping = _mix

    def _mix(x):
        with np.errstate(over="ignore"):
            return _mix_wrapping(x)


@njit(inline="always")
def uniform(seed, request, draw, position):
    """A uniform number in [0, 1) for one draft position of one verification
    pass of one request: a pure function of its four keys."""
    x = _mix(np.uint64(seed) + np.uint64(0x9E3779B97F4A7C15))
    x = _mix(x ^ np.uint64(request))
    x = _mix(x ^ np.uint64(draw))
    x = _mix(x ^ np.uint64(position))
    return float(x >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@njit(inline="always")
def accepted_drafts(seed, rates, acc_offsets, acc_values, request, key, draw, num_drafts):
    """How many of `num_drafts` real drafts the request's `draw`-th
    verification pass accepts: its `accepted` list (cycled) when the trace
    gives one, else a draw keyed by the request's `key` from the per-position
    rates; at most `num_drafts`."""
    lo = acc_offsets[request]
    n = acc_offsets[request + 1] - lo
    if n > 0:
        return min(acc_values[lo + draw % n], num_drafts)
    a = 0
    while a < num_drafts and uniform(seed, key, draw, a) < rates[a]:
        a += 1
    return a


def expected_accepted(rates) -> float:
    """Mean accepted drafts per verification pass with k drafts:
    sum_i prod_{j<=i} p_j."""
    total, prod = 0.0, 1.0
    for p in rates:
        prod *= p
        total += prod
    return total


def spec_table_slack(spec: SpeculativeConfig, kv_cache) -> tuple:
    """`(extra tokens, hash lookahead)` of a request's block table: drafts
    and lookahead slots can reach past prompt + output (at most two passes of
    1 + k tokens in flight, plus k lookahead slots), and with prefix caching
    a block's hash covers one token of the next block."""
    k = spec.num_speculative_tokens
    return 3 * (k + 1) + k, int(kv_cache.enable_prefix_caching)
