"""Prefill admission's budgets (`schedule_policy.PrefillAdder`,
`mem_cache/prefill_budget.PrefillBudget`; docs/sglang.md, "Prefill admission")."""

import math

from servesim.jit import Entry, njit
from servesim.sglang.config import CLIP_MAX_NEW_TOKENS
from servesim.sglang.req import IGNORE_EOS, MAX_NEW_TOKENS, NUM_OUTPUTS

CONTINUE, NO_TOKEN, OTHER = "continue", "no_token", "other"


class PrefillAdder:
    """The budgets of one prefill attempt and the requests it admits
    (`can_run`, in order: the chunked request first). `rem_total` and
    `rem_current` are live: locking a prefix lowers the evictable tokens.
    `cols` / `running_slots`: the worker's request table and the running
    requests' rows in it (servesim/sglang/req.py's `ReqTable`)."""

    def __init__(self, cfg, tree, pool, running, new_token_ratio, mixed: int, cols, running_slots):
        self.cfg = cfg
        self.tree = tree
        self.pool = pool
        self.page_size = cfg.page_size
        self.running = running
        self.new_token_ratio = new_token_ratio
        self.rem_input = cfg.max_prefill_tokens - mixed
        self.rem_chunk = cfg.chunked_prefill_size - mixed if cfg.chunked_prefill else None
        self.total_offset = mixed + float(_RUNNING_OFFSET(cols, running_slots, new_token_ratio,
                                                          CLIP_MAX_NEW_TOKENS))
        self.current_offset = mixed
        self.can_run = []  # (req, extend tokens, cached, kind, partial)
        self.new_chunked_req = None
        self.req_states = None

    def ceil_page(self, n: int) -> int:
        return -(-n // self.page_size) * self.page_size

    def _ratio(self, req) -> float:
        """The share of its remaining output reserved for `req` (1 with ignore_eos)."""
        return 1.0 if req.ignore_eos else self.new_token_ratio

    @property
    def rem_total(self) -> float:
        return self.pool.free + self.tree.evictable_size() - self.total_offset

    @property
    def rem_current(self) -> float:
        return self.pool.free + self.tree.evictable_size() - self.current_offset

    def budget_state(self) -> str:
        if self.rem_total <= 0 or self.rem_current <= 0:
            return NO_TOKEN
        if self.rem_input <= 0 or (self.rem_chunk is not None and self.rem_chunk <= 0):
            return OTHER
        return CONTINUE

    def _update_prefill_budget(self, extend: int, max_new_tokens: int):
        """`PrefillBudget.reserve`: the page-rounded extend and one page, plus
        the output reservation in the total."""
        extend = self.ceil_page(extend)
        self.total_offset += extend + self.page_size + max_new_tokens
        self.current_offset += extend + self.page_size
        self.rem_input -= extend
        if self.rem_chunk is not None:
            self.rem_chunk -= extend

    def add_chunked_req(self, req, kind_row):
        """The chunked request's next chunk: `min(left, rem_chunk,
        floor(rem_total))` (`rem_chunk` when the total is spent), admitted
        without any other check; its last chunk reserves `min(M, 4096)`.
        Returns the request while it stays chunked, else None."""
        left = req.fill_len - req.computed
        budget = min(self.rem_chunk, math.floor(self.rem_total))
        if budget <= 0:
            budget = self.rem_chunk
        truncated = left > budget
        extend = min(left, budget)
        self.can_run.append((req, extend, 0, "chunk", truncated))
        self._update_prefill_budget(extend, 0 if truncated else min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS))
        return req if truncated else None

    def add_one_req(self, req, kind):
        """Admit waiting `req` whose `prefix` is its radix hit: it fits only if
        `extend + reserved output + page_size < rem_total` with its prefix
        locked; cut to whole pages of `rem_chunk` when it does not fit the
        chunk budget (then it is the new chunked request). Returns the budget
        state after the reservation (NO_TOKEN / OTHER when it is not admitted)."""
        if req.ignore_eos and self.tree.disable:
            return self.add_one_req_ignore_eos(req, kind)
        m = min(max(req.max_new_tokens - req.num_outputs, 0), CLIP_MAX_NEW_TOKENS)
        prefix = req.prefix
        extend = req.fill_len - prefix
        self.tree.inc_lock_ref(req.last_node)
        if extend + m + self.page_size >= self.rem_total:
            self.tree.dec_lock_ref(req.last_node)
            return NO_TOKEN
        if self.rem_chunk is None:
            if self.can_run and self.ceil_page(extend) >= self.rem_input:
                self.tree.dec_lock_ref(req.last_node)
                return OTHER
            self._admit(req, extend, kind, False, m)
            return self.budget_state()
        if self.ceil_page(extend) > self.rem_chunk:
            cut = self.rem_chunk // self.page_size * self.page_size
            cut = (prefix + cut) // self.page_size * self.page_size - prefix
            if cut <= 0:
                self.tree.dec_lock_ref(req.last_node)
                return OTHER
            self._admit(req, cut, kind, True, 0)
            self.new_chunked_req = req
            return self.budget_state()
        self._admit(req, extend, kind, False, m)
        return self.budget_state()

    def _admit(self, req, extend, kind, partial, m):
        """Commit: the prefix stays locked (the lock taken for the check)."""
        self.can_run.append((req, extend, req.prefix, kind, partial))
        self._update_prefill_budget(extend, m)

    def add_one_req_ignore_eos(self, req, kind):
        """Radix cache off with ignore_eos (`add_one_req_ignore_eos`): the
        request must fit now, and a look-ahead over the running and admitted
        requests' remaining outputs (fewest left first) must never run the
        pool dry; admitted whole, or cut to exactly `rem_chunk` tokens."""
        extend = req.fill_len
        if self.ceil_page(extend) + self.page_size > min(self.rem_current, self.rem_total):
            return NO_TOKEN
        if self.req_states is None:
            self.req_states = []
            self._add_req_state(req)
            for r in self.running:
                self._add_req_state(r)
            for row in self.can_run:
                self._add_req_state(row[0])
            self.req_states.sort(key=lambda s: s[0])
        else:
            self._add_req_state(req, insert_sort=True)
        cur = self.rem_current - (self.ceil_page(extend) + self.page_size)
        freed = 0
        n = len(self.req_states)
        for i, (left, occupied) in enumerate(self.req_states):
            bs = n - i
            if cur + freed - left * bs <= bs:
                return NO_TOKEN
            freed += occupied
        if self.rem_chunk is None or extend <= self.rem_chunk:
            self._admit(req, extend, kind, False, min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS))
        else:
            if self.rem_chunk <= 0:
                return OTHER
            self._admit(req, self.rem_chunk, kind, True, 0)
            self.new_chunked_req = req
        return self.budget_state()

    def _add_req_state(self, r, insert_sort=False):
        left = r.max_new_tokens * self._ratio(r) - r.num_outputs
        if left <= 0:
            return
        state = (left, r.prompt_len + r.num_outputs)
        if not insert_sort:
            self.req_states.append(state)
            return
        i = 0
        while i < len(self.req_states) and left > self.req_states[i][0]:
            i += 1
        self.req_states.insert(i, state)


@njit
def get_running_request_total_token_offset(cols, slots, new_token_ratio, clip) -> float:
    """`PrefillAdder._get_running_request_total_token_offset`: the output the
    running requests (table rows `slots`) are still expected to produce,
    `min(M - generated, 4096) x ratio` each (ratio 1 with ignore_eos; the
    adder's `_ratio`), summed in order (docs/sglang.md, "Prefill admission")."""
    total = 0.0
    for s in slots:
        ratio = 1.0 if cols[IGNORE_EOS, s] != 0 else new_token_ratio
        total += min(cols[MAX_NEW_TOKENS, s] - cols[NUM_OUTPUTS, s], clip) * ratio
    return total


_RUNNING_OFFSET = Entry(get_running_request_total_token_offset)
