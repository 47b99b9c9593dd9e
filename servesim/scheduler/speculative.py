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
workload. `acceptance_profiles` gives acceptance a per-request
distribution: each request draws one named profile (with probability
proportional to its weight, keyed by the seed and the request id) and its
draws use that profile's rates (servesim/scheduler/acceptance_profiles.py).
"""

import attrs


METHODS = ("mtp", "eagle", "ngram")
MAX_SPECULATIVE_TOKENS = 8


@attrs.frozen
class SpeculativeConfig:
    """`engine.speculative`. `acceptance_rates` has k entries (default: all
    0.7); `seed` keys the acceptance draws of requests without `accepted`;
    `acceptance_profiles` (empty: none) holds `(name, weight, rates)` triples,
    one of which each such request draws. Checked in
    servesim/config/speculative_config.py."""

    method: str = "mtp"
    num_speculative_tokens: int = 1
    acceptance_rates: tuple = ()
    seed: int = 42
    acceptance_profiles: tuple = ()


DEFAULT_RATE = 0.7


def expected_accepted(rates) -> float:
    """Mean accepted drafts per verification pass with k drafts:
    sum_i prod_{j<=i} p_j."""
    total, prod = 0.0, 1.0
    for p in rates:
        prod *= p
        total += prod
    return total


def rates_for_length(length: float, k: int) -> tuple:
    """Per-position rates of one value p (each draft accepted with
    probability p given the drafts before it were) whose mean acceptance
    length `1 + sum_{i<=k} p^i` is `length` (1 <= length <= k + 1):
    bisection to 1e-12."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if 1 + expected_accepted([mid] * k) < length:
            lo = mid
        else:
            hi = mid
    return (round((lo + hi) / 2, 12),) * k


def spec_table_slack(spec: SpeculativeConfig, kv_cache) -> tuple:
    """`(extra tokens, hash lookahead)` of a request's block table: drafts
    and lookahead slots can reach past prompt + output (at most two passes of
    1 + k tokens in flight, plus k lookahead slots), and with prefix caching
    a block's hash covers one token of the next block."""
    k = spec.num_speculative_tokens
    return 3 * (k + 1) + k, int(kv_cache.enable_prefix_caching)
