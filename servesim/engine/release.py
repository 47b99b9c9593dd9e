"""Output release and detokenization (docs/engine.md §8).

A token leaves the engine when its pass's outputs are released and reaches the
client `detokenize_ms` later, detokenized in order per request:
`client(i) = max(release(i), client(i-1)) + detokenize_ms`. Client times are
stored in one flat array (a slice per request), not per-token objects.
"""

import numpy as np

from servesim.jit import njit


@njit
def _compact(client_ms, offsets, produced, new_offsets):
    """Move each request's produced tokens left, in place (new_offsets[r] <=
    offsets[r] always)."""
    for r in range(len(produced)):
        src = offsets[r]
        dst = new_offsets[r]
        if src != dst:
            for k in range(produced[r]):
                client_ms[dst + k] = client_ms[src + k]


class TokenLog:
    def __init__(self, max_tokens_per_request, detokenize_ms: float):
        counts = np.asarray(max_tokens_per_request, dtype=np.int64)
        self.offsets = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(np.maximum(counts, 0), out=self.offsets[1:])
        self.client_ms = np.empty(int(self.offsets[-1]))  # only produced tokens are read
        self.detokenize_ms = detokenize_ms
        self.last_client = np.full(len(counts), -np.inf)

    def with_detokenize(self, detokenize_ms: float) -> "TokenLog":
        """The same log (arrays shared) detokenizing at `detokenize_ms`: the
        pools of a disaggregated run release into one log, each with its own
        `detokenize_ms`."""
        view = object.__new__(TokenLog)
        view.__dict__.update(self.__dict__)
        view.detokenize_ms = detokenize_ms
        return view

    def compact(self, produced):
        """`(offsets, client times)` of the tokens really produced (fewer than
        the cap when `max_model_len` or the end of the run cut a request
        short), packed in place: the log is consumed."""
        offsets = np.zeros(len(produced) + 1, dtype=np.int64)
        np.cumsum(produced, out=offsets[1:])
        if not np.array_equal(offsets, self.offsets):
            _compact(self.client_ms, self.offsets, np.asarray(produced, dtype=np.int64), offsets)
        return offsets, self.client_ms[:offsets[-1]]
