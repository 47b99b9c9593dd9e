"""SGLang 0.5.23's scheduler (`managers/scheduler.py`; docs/sglang.md): one
scheduling step (`get_next_batch_to_run`), prefill admission, decode with
retraction, the processing of a pass's result, and the two event loops
(`event_loop_normal`, `event_loop_overlap`) on the simulated clock.
"""

import math

import numpy as np

from servesim.jit import Entry, njit
from servesim.sglang.batch import DECODE, EXTEND, MIXED, Batch, Row
from servesim.sglang.check import check_scheduler
from servesim.sglang.config import RETRACT_DECODE_STEPS
from servesim.sglang.new_token_ratio import NewTokenRatioTracker
from servesim.sglang.prefill_adder import CONTINUE, NO_TOKEN, OTHER, PrefillAdder
from servesim.sglang.radix_cache import RadixCache, TokenPool
from servesim.sglang.req import (
    DONE,
    DROPPED_AT,
    MAX_NEW_TOKENS,
    NUM_OUTPUTS,
    REACHED_STOP,
    SEQ_LEN,
    SKIPPED,
    ReqTable,
    slots_of,
)
from servesim.sglang.retract import retract_decode
from servesim.sglang.schedule_policy import SchedulePolicy


class Scheduler:
    """One SGLang worker over `reqs` (in arrival order). `pass_cost(batch)`
    prices a pass in ms. `run()` replays them; `passes` is the pass log
    (dicts in the recordings' format) when `log` is set. With `check` (the
    debug mode) the invariants of servesim/sglang/check.py are checked after
    every scheduling step and every processed result."""

    def __init__(self, cfg, reqs, pass_cost, log: bool = True, check: bool = False):
        self.cfg = cfg
        self.page_size = cfg.page_size
        self.pool = TokenPool(cfg.max_total_tokens, cfg.page_size)
        self.tree = RadixCache(self.pool, cfg.page_size, disable=cfg.disable_radix_cache)
        self.policy = SchedulePolicy(cfg.schedule_policy, self.tree)
        self.ratio = NewTokenRatioTracker(cfg.schedule_conservativeness)
        self.overlap = not cfg.disable_overlap_schedule
        self.max_num_reqs = cfg.max_num_reqs
        self.pass_cost = pass_cost
        self.reqs = reqs
        self.table = ReqTable()  # the requests' scheduling state (struct of arrays)
        self._positions = np.zeros(64, dtype=np.int64)  # `last_tokens`' answers
        for req in reqs:
            self.table.adopt(req)
        self.log = log
        self.check = check
        self.passes = []
        self.waiting = []
        self.running = []  # (and `running_slots()`, their table rows)
        self.chunked_req = None
        self.last_batch = None
        self.inflight = None  # overlap: the launched batch whose result is not processed
        self.batch_is_full = False
        self.rows_used = 0
        self.retracted_now = []
        self.num_retractions = 0
        self.clock = 0.0
        self._next_arrival = 0
        self.iteration = 0
        self._ready_at = {}  # arrival index -> first iteration it may join (closed loop)
        # closed loop: (this scheduler, finished request, instant) -> None; it
        # hands the requests the finish releases to a worker's `add_request`
        self.release_on_finish = None
        self.worker_index = None  # several workers: each pass names its worker
        self.tokens_scheduled = 0
        self.num_passes = 0
        self.num_finished = 0
        self._finished_seen = 0  # num_finished when the running batch was last filtered
        self.busy_ms = 0.0
        self.usage_area = 0.0  # KV usage (SGLang's token usage) x pass time, summed
        self.usage_max = 0.0
        self.prefix_queries = 0  # tokens looked up at admissions, and the hits
        self.prefix_hits = 0

    def ceil_page(self, n: int) -> int:
        return -(-n // self.page_size) * self.page_size

    @property
    def running(self) -> list:
        """The running batch (`running_batch.reqs`); assigned, never changed in place."""
        return self._running

    @running.setter
    def running(self, reqs: list):
        self._running = reqs
        self._running_slots = None

    def running_slots(self):
        """The running requests' table rows, in order (made once per running batch)."""
        slots = self._running_slots
        if slots is None:
            slots = self._running_slots = slots_of(self._running)
        return slots

    # -- one scheduling step ----------------------------------------------------

    def get_next_batch_to_run(self):
        """Stash the chunked request, merge the last extend batch into the
        running batch, drop finished requests, then a prefill batch if one
        can be built (the running requests do not decode in it, unless mixed),
        else a decode pass of the running batch."""
        if self.chunked_req is not None:
            self.stash_chunked_request(self.chunked_req)
        last = self.last_batch
        if last is not None and last.is_extend:
            kept = [r for r in last.reqs if r is not self.chunked_req and not r.finished]
            if len(kept) < last.num_rows or (kept and not self.running):
                # (into an empty running batch the merged batch replaces it, latch unset)
                self.batch_is_full = False
            if kept:
                slots = self._running_slots
                self.running = self.running + kept
                if slots is not None:  # (the merged batch's rows: the kept ones' after them)
                    self._running_slots = np.concatenate((slots, slots_of(kept)))
        if self.num_finished != self._finished_seen:  # (else none of them finished)
            self._finished_seen = self.num_finished
            before = len(self.running)
            slots = self.running_slots()
            self.running = [r for r in self.running if not r.finished]
            if len(self.running) < before:
                self._running_slots = slots[self.table.cols[DONE, slots] == 0]  # (the same filter)
                self.batch_is_full = False
            else:
                self._running_slots = slots
        batch = self.get_new_batch_prefill()
        if batch is not None:
            return batch
        if self.running:
            return self.update_running_batch()
        return None

    def stash_chunked_request(self, req):
        """Insert what the chunked request has computed so far into the tree
        (`stash_chunked_request` -> `checkpoint_kv_cache`)."""
        self.checkpoint_kv_cache(req, req.computed)

    def get_num_allocatable_reqs(self) -> int:
        """Requests a prefill may admit: the free slots of the running batch,
        at most the free rows plus the rows already held (the chunked request's)."""
        held = 1 if self.chunked_req is not None and self.chunked_req.has_row else 0
        return min(self.max_num_reqs - len(self.running), self.max_num_reqs - self.rows_used + held)

    def get_new_batch_prefill(self):
        """`_get_new_batch_prefill_raw`: the early exits and the full latch,
        the waiting queue's order, the chunked request first, then waiting
        requests in order while the budgets last (docs/sglang.md, "Prefill admission")."""
        if not self.running:
            self.batch_is_full = False
        if (self.batch_is_full or not self.waiting) and self.chunked_req is None:
            return None
        allocatable = self.get_num_allocatable_reqs()
        if allocatable <= 0 and self.chunked_req is None:
            self.batch_is_full = True
            return None
        self.policy.calc_priority(self.waiting)
        cfg = self.cfg
        mixed = len(self.running) if cfg.enable_mixed_chunk and cfg.chunked_prefill else 0
        adder = PrefillAdder(cfg, self.tree, self.pool, self.running, self.ratio.value, mixed,
                             self.table.cols, self.running_slots())
        chunked = self.chunked_req
        if chunked is not None:
            self.chunked_req = adder.add_chunked_req(chunked, "chunk")
        for req in self.waiting:
            if adder.budget_state() == OTHER:
                break
            if len(adder.can_run) >= allocatable:
                self.batch_is_full = True
            if self.batch_is_full:
                break
            self.init_next_round_input(req)
            result = adder.add_one_req(req, "retracted" if req.retracted else "new")
            if result != CONTINUE:
                if result == NO_TOKEN:
                    self.batch_is_full = bool(adder.can_run) or bool(self.running)
                break
        if adder.new_chunked_req is not None:
            self.chunked_req = adder.new_chunked_req
        if not adder.can_run:
            return None
        # the admitted waiting requests are the head of the queue, in order
        del self.waiting[:len(adder.can_run) - (chunked is not None)]
        rows = [Row(req, kind, extend, req.computed if kind == "chunk" else req.prefix,
                    cached, partial) for req, extend, cached, kind, partial in adder.can_run]
        self.prepare_for_extend(rows)
        batch = Batch(EXTEND, rows)
        if mixed and self.running:
            self.mix_with_running(batch)
        return batch

    def init_next_round_input(self, req):
        """Match the request's fill (at most all but its last token) against
        the tree: `prefix` and the node it ends at (`Req.init_next_round_input`)."""
        hit, node = self.tree.match_prefix(req.fill_prefix(req.fill_len - 1))
        req.prefix = hit
        req.last_node = node

    def prepare_for_extend(self, rows):
        """Rows and KV for the extend (`alloc_for_extend`): a row per request
        that has none, and the pages from its prefix to prefix + tokens; the
        tree evicts first when free slots are short."""
        need = 0
        for row in rows:
            req = row.req
            if row.kind != "chunk":
                req.seq_len = req.tree_len = req.computed = req.prefix
                if req.first_cached < 0:
                    req.first_cached = req.cached_tokens = req.prefix
                self.prefix_queries += req.fill_len
                self.prefix_hits += req.prefix
            if req.retracted:
                req.recomputed_tokens += row.tokens
            need += self.ceil_page(req.computed + row.tokens) - self.ceil_page(req.computed)
        target = need + (len(rows) * self.page_size if self.page_size > 1 else 0)
        self.tree.evict_for(target)
        self.pool.alloc(need)
        for row in rows:
            req = row.req
            if not req.has_row:
                req.has_row = True
                self.rows_used += 1
            req.computed += row.tokens
            req.seq_len = req.computed

    def mix_with_running(self, batch):
        """Mixed chunk: the running requests decode in the prefill pass when
        their decode fits (no retraction); the running batch empties."""
        finishing = self._reqs_finishing_inflight(self.running)
        if finishing:
            decoding = [r for r in self.running if r not in finishing]
            slots = slots_of(decoding)
        else:
            decoding, slots = self.running, self.running_slots()
        if not decoding or not self.check_decode_mem(slots):
            return
        batch.decode_context = self.prepare_for_decode(slots)
        batch.decode = decoding
        batch.decode_slots = slots
        batch.mode = MIXED
        self.running = []

    # -- decode -----------------------------------------------------------------

    def _reqs_finishing_inflight(self, reqs) -> list:
        """Overlap: those of the running `reqs` in the in-flight batch whose
        in-flight token is their last by length (`_reqs_finishing_inflight`;
        the length test is `last_tokens`)."""
        if not self.overlap or self.inflight is None:
            return []
        slots = self.running_slots() if reqs is self.running else slots_of(reqs)
        positions = self._positions
        if len(positions) < len(slots):
            positions = self._positions = np.zeros(2 * len(slots), dtype=np.int64)
        n = _LAST_TOKENS(self.table.cols, slots, positions)
        return [reqs[k] for k in positions[:n] if self.inflight.samples(reqs[k])]

    def check_decode_mem(self, slots) -> bool:
        """A page for each request (table rows `slots`) whose committed KV
        ends on a page boundary; the tree evicts to cover a shortfall
        (`check_decode_mem`)."""
        need = int(_DECODE_NEED(self.table.cols, slots, self.page_size))
        self.tree.evict_for(need)
        return self.pool.free >= need

    def update_running_batch(self):
        """The decode pass: the running batch less the requests finishing in
        flight; when it does not fit, retract (`retract_decode`) and reset the
        ratio, else decay it; a slot (or page) per request."""
        initial = len(self.running)
        excluded = self._reqs_finishing_inflight(self.running)
        if excluded:
            self.running = [r for r in self.running if r not in excluded]
        batch = self.running
        if not batch:
            return None
        if not self.check_decode_mem(self.running_slots()):
            if excluded:
                return None
            batch, retracted, ratio = retract_decode(self, batch)
            for req in retracted:
                self.retracted_now.append(req)
                self.waiting.append(req)
            self.ratio.value = ratio
            self.running = batch
        else:
            self.ratio.decay()
        if len(batch) < initial:
            self.batch_is_full = False
        slots = self.running_slots()
        context = self.prepare_for_decode(slots)
        decode = Batch(DECODE, [], batch, slots)
        decode.decode_context = context
        return decode

    def prepare_for_decode(self, slots) -> int:
        """One slot per request (table rows `slots`), a new page when its KV
        ends on a page boundary (`prepare_for_decode`, `alloc_for_decode`).
        Returns the decode's context: the positions after it, summed."""
        cols = self.table.cols
        need = int(_DECODE_NEED(cols, slots, self.page_size))
        self.tree.evict_for(need)
        self.pool.alloc(need)
        return int(_ADVANCE_SEQ_LENS(cols, slots))

    # -- KV into the tree ----------------------------------------------------------

    def checkpoint_kv_cache(self, req, length: int):
        """Insert the first `length` tokens of the request's fill (whole pages)
        into the tree and lock that path instead of its old prefix; slots of
        tokens the tree already held are freed (`cache_unfinished_req`)."""
        if self.tree.disable:
            return
        key = req.fill_prefix(length - length % self.page_size)
        # (its locked path spells its first tree_len tokens; after the insert
        # the whole key is a path of the tree, ending at `end`)
        new_prefix, end = self.tree.insert(key, (req.last_node, req.tree_len))
        if new_prefix > req.tree_len:
            self.pool.release(new_prefix - req.tree_len)
        matched, node = self.tree.match_prefix(key, (end, len(key)))
        self.tree.dec_lock_ref(req.last_node)
        self.tree.inc_lock_ref(node)
        req.last_node = node
        req.tree_len = matched

    def release_kv_cache(self, req):
        """A finished request: its committed KV (prompt and all outputs but the
        last; all of them after an extra in-flight decode) goes into the tree (whole pages), the rest of its slots and its row
        are freed (`cache_finished_req`, `release_kv_cache`)."""
        own = self.ceil_page(req.seq_len) - req.tree_len
        if self.tree.disable:
            self.pool.release(own)
        else:
            # its committed KV: all but the last token, or (overlap, an EOS finish
            # decoded once more) every token: the extra pass's slot is committed
            kv_len = min(req.seq_len, req.fill_len)
            key = req.fill_prefix(kv_len - kv_len % self.page_size)
            new_prefix, _ = self.tree.insert(key, (req.last_node, req.tree_len))
            self.pool.release(own - (len(key) - new_prefix))
            self.tree.dec_lock_ref(req.last_node)
        self._free_row(req)

    def release_req(self, req, remaining: int):
        """Retraction of one request: free its own slots without caching them,
        unlock its prefix, free its row, then evict so that 20 decode steps
        of the `remaining` requests fit (`ScheduleBatch.release_req`)."""
        self.pool.release(self.ceil_page(req.seq_len) - req.tree_len)
        self.tree.dec_lock_ref(req.last_node)
        self._free_row(req)
        self.tree.evict_for(remaining * RETRACT_DECODE_STEPS)
        req.seq_len = req.computed = req.tree_len = req.prefix = 0
        req.last_node = None
        req.retracted = True
        req.num_retractions += 1
        if self.inflight is not None:
            self.table.cols[DROPPED_AT, req.slot] = self.inflight.index  # its in-flight token is dropped
        self.num_retractions += 1

    def _free_row(self, req):
        if req.has_row:
            req.has_row = False
            self.rows_used -= 1

    # -- results ----------------------------------------------------------------

    def process_batch_result(self, batch):
        """Each row not finished, not retracted since launch and not a middle
        chunk gets its token (`append_outputs`): a finished request is
        released, an extend that completed its input is inserted into the
        tree and locked (`process_batch_result_prefill` / `_decode`); after a
        retraction its prompt first, then its outputs. The extend rows come
        first, then the decoding requests."""
        end = batch.end_ms
        table = self.table
        rows = [row for row in batch.rows if not row.partial]
        if rows:
            status = table.append_outputs(slots_of([row.req for row in rows]), end, batch.index)
            for k, row in enumerate(rows):
                state = status[k]
                if state == SKIPPED:
                    continue
                req = row.req
                if req.first_token_pass < 0:
                    req.first_token_pass = batch.index
                    req.first_token_ms = end
                if state == REACHED_STOP and req.check_finished():
                    self._finish(batch, req)
                else:
                    if req.retracted and req.tree_len < req.prompt_len:
                        # a re-prefilled prompt + outputs is cached prompt first: the
                        # tree keeps a node boundary at the prompt's end, as after a
                        # first prefill (seen: 06, pass 220 evicts the 39 outputs alone)
                        self.checkpoint_kv_cache(req, req.prompt_len)
                    self.checkpoint_kv_cache(req, req.fill_len - 1)  # (its input: not the new token)
        if batch.decode:
            status = table.append_outputs(batch.decode_slots, end, batch.index)
            for k in (status[:len(batch.decode)] == REACHED_STOP).nonzero()[0]:
                req = batch.decode[k]
                if req.check_finished():
                    self._finish(batch, req)
        if batch.record is not None:
            batch.record["finished"].sort()

    def _finish(self, batch, req):
        """A request whose token just made it finish: released, recorded, and
        (closed loop) the next request released."""
        end = batch.end_ms
        req.finish_pass = batch.index
        req.finish_ms = end
        self.num_finished += 1
        if batch.record is not None:
            batch.record["finished"].append(req.rid)
        self.release_kv_cache(req)
        req.drop_prompt()  # (the tree holds its own copy of what it cached)
        if self.release_on_finish is not None:
            self.release_on_finish(self, req, end)

    # -- the loops ----------------------------------------------------------------

    def _take_arrivals(self):
        """The top of a loop iteration: requests that have arrived by the clock
        join the waiting queue, in arrival order; one released by a finish
        arrives after the decision taken at that instant (`add_request`)."""
        self.iteration += 1
        reqs = self.reqs
        while (self._next_arrival < len(reqs) and reqs[self._next_arrival].arrival_ms <= self.clock
               and self._ready_at.get(self._next_arrival, 0) <= self.iteration):
            self.waiting.append(reqs[self._next_arrival])
            self._next_arrival += 1

    def add_request(self, req, at_ms: float, ready_iteration: int = 0):
        """`req` arrives at `at_ms`; it joins no iteration before
        `ready_iteration` (a closed loop's release comes after the decision
        taken at its instant)."""
        req.arrival_ms = at_ms
        self.table.adopt(req)
        if ready_iteration:
            self._ready_at[len(self.reqs)] = ready_iteration
        self.reqs.append(req)

    @property
    def used_tokens(self) -> int:
        """KV slots neither free nor evictable (SGLang's token usage x size)."""
        return self.pool.size - self.pool.free - self.tree.evictable_size()

    @property
    def queued(self) -> list:
        """The waiting queue and the requests routed here that have not
        joined it yet (they join at the next iteration), as a router counts
        a worker's waiting requests."""
        return self.waiting + self.reqs[self._next_arrival:]

    @property
    def load(self) -> int:
        """Requests routed to this worker that have not finished."""
        return len(self.reqs) - self.num_finished

    def _fully_idle(self) -> bool:
        return (not self.running and not self.waiting and self.chunked_req is None
                and self.inflight is None)

    def on_idle(self):
        """`self_check_during_idle`: a fully idle engine resets the ratio."""
        if self._fully_idle():
            self.ratio.reset()

    def _launch(self, batch, start):
        batch.index = self.num_passes
        batch.start_ms = start
        batch.end_ms = start + self.pass_cost(batch)
        self.num_passes += 1
        self.tokens_scheduled += batch.num_tokens
        duration = batch.end_ms - batch.start_ms
        self.busy_ms += duration
        size = self.pool.size
        usage = (size - self.pool.free - self.tree.evictable_size()) / size
        self.usage_area += usage * duration
        self.usage_max = max(self.usage_max, usage)
        for row in batch.rows:  # (a decoding request was first scheduled by an extend)
            req = row.req
            if req.first_scheduled_pass < 0:
                req.first_scheduled_pass = batch.index
                req.first_scheduled_ms = self.clock
        if self.log:
            batch.record = {"pass": batch.index}
            if self.worker_index is not None:
                batch.record["worker"] = self.worker_index
            batch.record.update({
                "start_ms": batch.start_ms, "end_ms": batch.end_ms,
                "mode": batch.mode, "scheduled": batch.scheduled(),
                "retracted": sorted(r.rid for r in self.retracted_now), "finished": [],
                "evicted_tokens": self.tree.evicted_tokens,
                "free_tokens_after_schedule": self.pool.free,
                "evictable_tokens_after_schedule": self.tree.evictable_size(),
                "running_after_schedule": len(self.running),
                "waiting_after_schedule": len(self.waiting),
                "new_token_ratio": self.ratio.value,
            })
            self.passes.append(batch.record)
        self.retracted_now = []
        self.tree.evicted_tokens = 0

    def _wait(self, t: float):
        """Move the clock to `t`, yielding `t` first when it is later: the
        replay resumes this worker once every earlier event of every worker
        (and every arrival up to `t`) has happened."""
        if t > self.clock:
            yield t
        self.clock = max(self.clock, t)

    def _jump(self):
        """Nothing can run: wait for the next arrival, yielding `inf` while
        none is routed here yet. Returns False when the replay stops it."""
        if self._next_arrival >= len(self.reqs):
            yield math.inf
            if self._next_arrival >= len(self.reqs):
                return False
        yield from self._wait(self.reqs[self._next_arrival].arrival_ms)
        return True

    def _after_iteration(self, launched: bool):
        """End of a loop iteration: with nothing waiting, running (finished
        requests not yet filtered out count), chunked, in flight or in an
        extend batch not merged yet, or when nothing could run, the clock
        jumps to the next arrival."""
        idle = (not self.running and not self.waiting and self.chunked_req is None
                and self.inflight is None
                and (self.last_batch is None or not self.last_batch.is_extend))
        if idle or not launched:
            return (yield from self._jump())
        return True

    def events(self):
        """The event loop as a generator of the instants this worker waits
        for (`inf`: an arrival routed here)."""
        if self.overlap:
            return self.event_loop_overlap()
        return self.event_loop_normal()

    def run(self):
        """Replay `reqs` on this worker alone."""
        for t in self.events():
            if t == math.inf:
                return

    def event_loop_normal(self):
        """Schedule, run, process the result; pass k+1 is scheduled at end(k)."""
        while True:
            self._take_arrivals()
            batch = self.get_next_batch_to_run()
            if self.check:
                check_scheduler(self, "schedule")
            self.last_batch = batch
            if batch is not None:
                self._launch(batch, self.clock)
                yield from self._wait(batch.end_ms)
                self.process_batch_result(batch)
                if self.check:
                    check_scheduler(self, "result")
            else:
                self.on_idle()
            if not (yield from self._after_iteration(batch is not None)):
                return

    def event_loop_overlap(self):
        """Schedule and launch pass k, then process pass k-1's result (at its
        end): pass k is decided at end(k-2) and starts at end(k-1)."""
        gpu_free = 0.0
        while True:
            self._take_arrivals()
            batch = self.get_next_batch_to_run()
            if self.check:
                check_scheduler(self, "schedule")
            previous = self.inflight
            if batch is not None:
                self._launch(batch, max(self.clock, gpu_free))
                gpu_free = batch.end_ms
            self.inflight = batch
            if previous is not None:
                yield from self._wait(previous.end_ms)
                self.process_batch_result(previous)
                if self.check:
                    check_scheduler(self, "result")
            elif batch is None:
                self.on_idle()
            self.last_batch = batch
            if not (yield from self._after_iteration(batch is not None or previous is not None)):
                return


# -- the compiled rules of the decode pass --------------------------------------------


@njit
def last_tokens(cols, slots, positions) -> int:
    """The positions in `slots` (table rows) of the requests whose next
    token is their last by length (`num_outputs + 1 >= max_new_tokens`: the
    in-flight token of one in the in-flight batch finishes it;
    `_reqs_finishing_inflight`, managers/scheduler.py; docs/sglang.md,
    "Decode and retraction"), into `positions`, in order; returns how many."""
    n = 0
    for k in range(len(slots)):
        s = slots[k]
        if cols[NUM_OUTPUTS, s] + 1 >= cols[MAX_NEW_TOKENS, s]:
            positions[n] = k
            n += 1
    return n


@njit
def decode_need(cols, slots, page_size) -> int:
    """Slots a decode of the requests at table rows `slots` takes: a page for
    each whose KV ends on a page boundary, one slot each with page_size 1
    (`check_decode_mem`, `alloc_for_decode`; docs/sglang.md, "Decode and retraction")."""
    if page_size == 1:
        return len(slots)
    n = 0
    for s in slots:
        if cols[SEQ_LEN, s] % page_size == 0:
            n += 1
    return n * page_size


@njit
def advance_seq_lens(cols, slots) -> int:
    """A decode allocates one position per request (`seq_lens += 1`,
    `ScheduleBatch.prepare_for_decode`, managers/schedule_batch.py;
    docs/sglang.md, "Decode and retraction"); returns the positions after
    it, summed (the pass's decode context)."""
    total = 0
    for s in slots:
        cols[SEQ_LEN, s] += 1
        total += cols[SEQ_LEN, s]
    return total


_LAST_TOKENS = Entry(last_tokens)
_DECODE_NEED = Entry(decode_need)
_ADVANCE_SEQ_LENS = Entry(advance_seq_lens)
