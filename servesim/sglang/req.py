"""A request as SGLang's scheduler sees it (`schedule_batch.Req`), and the
worker's table of their scheduling state (`ReqTable`: a struct of arrays, one
row per request, that the compiled rules read and write; docs/sglang.md,
"The compiled path")."""

import numpy as np

from servesim.jit import Entry, njit

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
                 "stop_at", "prompt_len", "computed",
                 "tree_len", "last_node", "has_row",
                 "finished", "finish_reason", "num_retractions", "cached_tokens",
                 "first_cached", "first_scheduled_pass", "first_token_pass", "finish_pass",
                 "first_token_ms", "finish_ms", "prefix", "retracted",
                 "first_scheduled_ms", "recomputed_tokens", "worker", "stream", "session",
                 "table", "slot")

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
        # `num_outputs` (generated tokens, as their results are processed),
        # `fill_len` (prompt + generated tokens), `seq_len` and the token times
        # are the worker's `ReqTable` row `slot` once a worker has it (`adopt`)
        self.table = None
        self.slot = -1
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
        self.recomputed_tokens = 0  # extend tokens computed again after retractions
        self.worker = -1  # the worker it was routed to
        self.stream = stream
        self.session = -1  # its session's index in a session workload (session_affinity)

    # -- the state in the worker's table -------------------------------------------

    @property
    def num_outputs(self) -> int:
        t = self.table
        return int(t.cols[NUM_OUTPUTS, self.slot]) if t is not None else 0

    @property
    def fill_len(self) -> int:
        t = self.table
        return int(t.cols[FILL_LEN, self.slot]) if t is not None else self.prompt_len

    @property
    def seq_len(self) -> int:
        t = self.table
        return int(t.cols[SEQ_LEN, self.slot]) if t is not None else 0

    @seq_len.setter
    def seq_len(self, value: int):
        self.table.cols[SEQ_LEN, self.slot] = value

    @property
    def token_ms(self):
        """The end instants of the passes that sampled its output tokens, in order."""
        t = self.table
        return t.token_times(self.slot) if t is not None else np.zeros(0)

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

    def check_finished(self):
        """`Req.update_finish_state`, once its output count reached `stop_at`
        (`append_outputs`): length at max_new_tokens, else EOS at `eos_at`."""
        n = self.num_outputs
        if n >= self.max_new_tokens:
            self.finished, self.finish_reason = True, FINISH_LENGTH
        elif not self.ignore_eos and self.eos_at and n >= self.eos_at:
            self.finished, self.finish_reason = True, FINISH_EOS
        if self.finished:
            self.table.cols[DONE, self.slot] = 1
        return self.finished


# the columns of `ReqTable.cols`
NUM_OUTPUTS, FILL_LEN, SEQ_LEN, STOP_AT, MAX_NEW_TOKENS, IGNORE_EOS, DONE, DROPPED_AT = range(8)
NUM_COLUMNS = 8

# `append_outputs`' verdict per row
SKIPPED, APPENDED, REACHED_STOP = 0, 1, 2


class ReqTable:
    """One worker's requests as a struct of arrays (docs/sglang.md, "The
    compiled path"): `cols[column, slot]` (int64) holds what the compiled
    rules read and write each pass — generated tokens, fill length,
    allocated positions (`seq_len`), the output limits, whether it finished,
    the pass its in-flight token was dropped from (retracted while that pass
    ran; -1) — and `token_slot` / `token_ms` the log of sampled tokens (the
    request's slot, the pass's end), `num_tokens` long, in processing order.
    Slots are given in the order the worker is handed its requests."""

    def __init__(self, capacity: int = 64):
        self.cols = np.zeros((NUM_COLUMNS, capacity), dtype=np.int64)
        self.reqs = []  # by slot
        self.num_tokens = 0
        self.token_slot = np.zeros(1024, dtype=np.int64)
        self.token_ms = np.zeros(1024, dtype=np.float64)
        self.status = np.zeros(64, dtype=np.int64)  # `append_outputs`' verdicts, by position

    def adopt(self, req: Req):
        """Give `req` the next slot, with its current state (a request
        another table held moves, token times aside: it had none there)."""
        slot = len(self.reqs)
        if slot == self.cols.shape[1]:
            cols = np.zeros((NUM_COLUMNS, 2 * slot), dtype=np.int64)
            cols[:, :slot] = self.cols
            self.cols = cols
        c = self.cols
        c[NUM_OUTPUTS, slot] = req.num_outputs
        c[FILL_LEN, slot] = req.fill_len
        c[SEQ_LEN, slot] = req.seq_len
        c[STOP_AT, slot] = req.stop_at
        c[MAX_NEW_TOKENS, slot] = req.max_new_tokens
        c[IGNORE_EOS, slot] = bool(req.ignore_eos)
        c[DONE, slot] = bool(req.finished)
        c[DROPPED_AT, slot] = -1
        self.reqs.append(req)
        req.table, req.slot = self, slot

    def append_outputs(self, slots, end_ms: float, batch_index: int):
        """`append_outputs` over `slots` for pass `batch_index` ending at
        `end_ms`; its verdicts are `status[:len(slots)]`."""
        n = len(slots)
        need = self.num_tokens + n
        if need > len(self.token_ms):
            size, used = max(need, 2 * len(self.token_ms)), self.num_tokens
            token_slot, token_ms = np.empty(size, dtype=np.int64), np.empty(size)
            token_slot[:used], token_ms[:used] = self.token_slot[:used], self.token_ms[:used]
            self.token_slot, self.token_ms = token_slot, token_ms
        if n > len(self.status):
            self.status = np.zeros(max(n, 2 * len(self.status)), dtype=np.int64)
        self.num_tokens = _APPEND_OUTPUTS(self.cols, slots, end_ms, batch_index, self.token_slot,
                                          self.token_ms, self.num_tokens, self.status)
        return self.status

    def token_times(self, slot: int):
        n = self.num_tokens
        return self.token_ms[:n][self.token_slot[:n] == slot]

    def tokens_by_slot(self):
        """The token log grouped by slot, each slot's in order: `(slot of
        each, end instant of each)`."""
        n = self.num_tokens
        order = np.argsort(self.token_slot[:n], kind="stable")
        return self.token_slot[:n][order], self.token_ms[:n][order]


def slots_of(reqs):
    """The slots of `reqs` (their table's rows), an int64 array."""
    return np.fromiter((r.slot for r in reqs), dtype=np.int64, count=len(reqs))


@njit
def append_outputs(cols, slots, end_ms, batch_index, token_slot, token_ms, num_tokens, status):
    """`Req.output_ids.append` / `check_finished`'s trigger for the rows a pass
    sampled (`process_batch_result_prefill` / `_decode`; docs/sglang.md,
    "Results"): a row whose request finished, or whose token was dropped (it
    was retracted while pass `batch_index` ran), gets nothing (SKIPPED); any
    other gets its next output token, sampled at `end_ms` (logged), and is
    REACHED_STOP when its output count reaches `stop_at` (it finishes:
    `Req.check_finished` says why), else APPENDED. Returns the log's length."""
    for i in range(len(slots)):
        s = slots[i]
        if cols[DONE, s] != 0 or cols[DROPPED_AT, s] == batch_index:
            status[i] = SKIPPED
            continue
        cols[NUM_OUTPUTS, s] += 1
        cols[FILL_LEN, s] += 1
        token_slot[num_tokens] = s
        token_ms[num_tokens] = end_ms
        num_tokens += 1
        status[i] = REACHED_STOP if cols[NUM_OUTPUTS, s] >= cols[STOP_AT, s] else APPENDED
    return num_tokens


_APPEND_OUTPUTS = Entry(append_outputs)
