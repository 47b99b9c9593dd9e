"""A request as SGLang's scheduler sees it (`schedule_batch.Req`)."""

import numpy as np

FINISH_LENGTH = "length"
FINISH_EOS = "eos"


_STREAM_BASE = -(1 << 62)


def stream_token(stream: int, position):
    """The token at `position` of accumulating session `stream`'s token
    stream (what follows its first prompt: outputs, and later turns' new
    input): ids below every output id (-1 - index x 2^24 - k)."""
    return _STREAM_BASE + stream * (1 << 32) + position


class Req:
    """One request: its prompt tokens, its limit `max_new_tokens` and, when it
    stops by EOS, `eos_at` (the number of its output token that is EOS; 0:
    never). `fill` is prompt + generated tokens (`num_outputs` of them,
    `outputs`); `seq_len` the positions with
    KV slots allocated (SGLang's `seq_lens`, in flight included); `computed`
    the positions whose KV its launched extends compute (the chunked
    request's prefix; decodes do not advance it); `tree_len` / `last_node` the locked radix path its prefix uses
    (the tree's slots; the rest up to `ceil_page(seq_len)` are its own)."""

    __slots__ = ("index", "rid", "arrival_ms", "_prompt", "_make_prompt", "max_new_tokens", "eos_at", "ignore_eos",
                 "num_outputs", "stop_at", "prompt_len", "fill_len", "seq_len", "computed",
                 "tree_len", "last_node", "has_row",
                 "finished", "finish_reason", "num_retractions", "cached_tokens",
                 "first_cached", "first_scheduled_pass", "first_token_pass", "finish_pass",
                 "first_token_ms", "finish_ms", "token_ms", "prefix", "retracted",
                 "first_scheduled_ms", "recomputed_tokens", "worker", "stream", "session")

    def __init__(self, index, rid, arrival_ms, prompt, max_new_tokens, eos_at, ignore_eos,
                 prompt_len=None, stream=None):
        """`prompt`: the token ids, or a function that makes them (an int64
        array of `prompt_len` tokens) when they are first needed; such a
        prompt is let go when the request finishes (`drop_prompt`).
        `stream`: for a turn of an accumulating session, the id of its
        session's token stream (`stream_token`): its outputs are the
        stream's tokens at their positions, so the next turn, whose prompt
        holds them, finds them in the tree."""
        self.index = index
        self.rid = rid
        self.arrival_ms = arrival_ms
        if callable(prompt):
            self._prompt, self._make_prompt = None, prompt
            self.prompt_len = prompt_len
        else:
            self._prompt, self._make_prompt = np.asarray(prompt, dtype=np.int64), None
            self.prompt_len = len(self._prompt)
        self.max_new_tokens = max_new_tokens
        self.eos_at = eos_at
        self.ignore_eos = ignore_eos
        # the output count at which `check_finished` stops it (limits fixed at arrival)
        self.stop_at = min(max_new_tokens, eos_at) if eos_at and not ignore_eos else max_new_tokens
        self.num_outputs = 0  # generated tokens, as their results are processed
        self.fill_len = self.prompt_len  # prompt + generated tokens
        self.seq_len = 0
        self.computed = 0
        self.tree_len = 0
        self.last_node = None
        self.prefix = 0  # the hit of the current admission
        self.has_row = False
        self.finished = False
        self.finish_reason = None
        self.retracted = False  # re-admissions after a retraction are kind `retracted`
        self.num_retractions = 0
        self.cached_tokens = 0
        self.first_cached = -1
        self.first_scheduled_pass = -1
        self.first_scheduled_ms = float("nan")
        self.first_token_pass = -1
        self.finish_pass = -1
        self.first_token_ms = float("nan")
        self.finish_ms = float("nan")
        self.token_ms = []
        self.recomputed_tokens = 0  # extend tokens computed again after retractions
        self.worker = -1  # the worker it was routed to
        self.stream = stream
        self.session = -1  # its session's index in a session workload (session_affinity)

    @property
    def prompt(self):
        """The prompt's token ids (an int64 array), made when first needed."""
        if self._prompt is None:
            self._prompt = self._make_prompt()
        return self._prompt

    def drop_prompt(self):
        """Let go of a prompt that can be made again (its request finished)."""
        if self._make_prompt is not None:
            self._prompt = None

    @property
    def outputs(self):
        """The generated token ids: output token k is `-1 - (index x 2^24 + k)`,
        a request-specific id no prompt holds (prompt ids are >= 0); in an
        accumulating session, its stream's token at position prompt + k."""
        k = np.arange(self.num_outputs, dtype=np.int64)
        if self.stream is not None:
            return stream_token(self.stream, self.prompt_len + k)
        return -1 - (self.index * (1 << 24) + k)

    @property
    def fill(self):
        """Prompt and generated tokens, an int64 array."""
        if not self.num_outputs:
            return self.prompt
        return np.concatenate((self.prompt, self.outputs))

    def fill_prefix(self, n: int):
        """The first `n` tokens of the fill (a view of the prompt when they
        are all prompt tokens)."""
        if n <= self.prompt_len:
            return self.prompt[:n]
        return self.fill[:n]

    def append_output(self, end_ms: float) -> bool:
        """The next output token, sampled by a pass that ends at `end_ms`;
        True when it finishes the request (`check_finished`)."""
        self.num_outputs += 1
        self.fill_len += 1
        self.token_ms.append(end_ms)
        return self.num_outputs >= self.stop_at and self.check_finished()

    def check_finished(self):
        """`Req.update_finish_state`: length at max_new_tokens, else EOS at `eos_at`."""
        n = self.num_outputs
        if n >= self.max_new_tokens:
            self.finished, self.finish_reason = True, FINISH_LENGTH
        elif not self.ignore_eos and self.eos_at and n >= self.eos_at:
            self.finished, self.finish_reason = True, FINISH_EOS
        return self.finished
