"""Output release and detokenization (vllm-engine.md §8).

A token leaves the engine when its pass's outputs are released and reaches the
client `detokenize_ms` later, detokenized in order per request:
`client(i) = max(release(i), client(i-1)) + detokenize_ms`. Client times are
stored in one flat array (a slice per request), not per-token objects.
"""

import numpy as np


class TokenLog:
    def __init__(self, max_tokens_per_request, detokenize_ms: float):
        counts = np.asarray(max_tokens_per_request, dtype=np.int64)
        self.offsets = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(np.maximum(counts, 0), out=self.offsets[1:])
        self.client_ms = np.full(int(self.offsets[-1]), np.nan)
        self.detokenize_ms = detokenize_ms
        self.last_client = np.full(len(counts), -np.inf)

    def release(self, request, release_ms: float):
        """Record the request's newest token (its `num_output_tokens`-th)."""
        i = request.index
        client = max(release_ms, self.last_client[i]) + self.detokenize_ms
        self.last_client[i] = client
        self.client_ms[self.offsets[i] + request.num_output_tokens - 1] = client
        return client

    def first_token_ms(self, i: int) -> float:
        start, stop = self.offsets[i], self.offsets[i + 1]
        return float(self.client_ms[start]) if stop > start else float("nan")
