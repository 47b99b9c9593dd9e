"""vLLM's V1 scheduler for one rank (vllm/v1/core/sched/scheduler.py, and
async_scheduler.py for `async_scheduling`). It knows nothing about time: the
engine core calls `schedule()` at each decision and `update_from_output()` when
a pass's outputs are processed, with the instant they are released; released
tokens go to `tokens` (an object with `release(request, release_ms)`).

This is the reference implementation, over one Python object per request;
`servesim.scheduler.fast` implements the same rules as Numba kernels over
arrays, and tests hold the two to identical results.

One `schedule()` (vllm-engine.md §3):
1. the running loop serves `running` in list order, preempting on allocation
   failure (§6);
2. the waiting loop admits from `waiting`, strictly head of line, only if no
   request was preempted in this pass;
3. every scheduled request's `num_computed_tokens` advances by its tokens, and
   under async scheduling a request that will sample gets a placeholder.
"""

from servesim.kvcache.manager import KVCacheManager
from servesim.scheduler.config import SchedulerConfig
from servesim.scheduler.output import (KIND_NEW, KIND_RESUMED, KIND_RUNNING,
                                       ScheduledRequest, SchedulerOutput)
from servesim.scheduler.queue import make_queue
from servesim.scheduler.request import RequestStatus

NO_LIMIT = 1 << 62


class PrefixCacheStats:
    """vLLM's `PrefixCacheStats`, counted at admissions (vllm-engine.md §5):
    admissions of requests preempted before go to the `preempted_` pair."""

    __slots__ = ("queries", "hits", "preempted_queries", "preempted_hits")

    def __init__(self):
        self.queries = self.hits = self.preempted_queries = self.preempted_hits = 0

    def record(self, num_tokens, num_hits, preempted):
        if preempted:
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.queries += num_tokens
            self.hits += num_hits


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv_cache_manager: KVCacheManager, tokens):
        self.config = config
        self.tokens = tokens
        self.kv = kv_cache_manager
        self.block_size = kv_cache_manager.block_size
        self.num_gpu_blocks = kv_cache_manager.pool.num_gpu_blocks
        self.async_scheduling = config.async_scheduling
        self.priority = config.scheduling_policy == "priority"
        self.max_model_len = config.max_model_len or NO_LIMIT
        self.watermark_blocks = int(config.watermark * self.num_gpu_blocks)
        self.waiting = make_queue(config.scheduling_policy)
        self.running = []
        self.prefix_cache_stats = PrefixCacheStats()
        self.num_preemptions = 0
        self.unfinishable = []  # indices of requests taken out by _abort_unfinishable

    # -- requests in and out -------------------------------------------------

    def max_tokens_for(self, num_prompt_tokens, output_length) -> int:
        """Generation stops at `output_length` tokens or at `max_model_len`."""
        return min(output_length, self.max_model_len - num_prompt_tokens)

    def can_ever_fit(self, num_prompt_tokens) -> bool:
        """A prompt needing more blocks than usable, or reaching max_model_len,
        is rejected at arrival (vllm-engine.md §3)."""
        usable = self.num_gpu_blocks - 1
        return (-(-num_prompt_tokens // self.block_size) <= usable
                and num_prompt_tokens < self.max_model_len)

    def add_request(self, request):
        self.waiting.add(request)

    def has_requests(self) -> bool:
        return bool(self.running) or bool(len(self.waiting))

    # -- schedule ------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        threshold = self.config.long_prefill_token_threshold
        if len(self.running) + len(self.waiting) <= 1:
            threshold = 0
        budget = self._schedule_running(out, budget, threshold)
        if not out.preempted:
            self._schedule_waiting(out, budget, threshold)
        self._update_after_schedule(out)
        out.free_blocks_after_schedule = self.kv.pool.num_free_blocks
        return out

    def _schedule_running(self, out, budget, threshold) -> int:
        """The running loop (vllm-engine.md §3, steps 1-4). Returns the budget
        left."""
        running = self.running
        index = 0
        while index < len(running) and budget > 0:
            request = running[index]
            placeholders = request.num_output_placeholders
            computed = request.num_computed_tokens
            if (placeholders > 0 and computed + 2 - placeholders
                    >= request.num_prompt_tokens + request.max_tokens):
                index += 1  # the pass in flight already produces its last token
                continue
            num_new = request.num_tokens + placeholders - computed
            if 0 < threshold < num_new:
                num_new = threshold
            num_new = min(num_new, budget, self.max_model_len - 1 - computed)
            if num_new <= 0:
                index += 1
                continue
            scheduled, index, budget = self._allocate_or_preempt(
                out, request, num_new, index, budget)
            if scheduled:
                out.scheduled.append(ScheduledRequest(request, num_new, 0, KIND_RUNNING))
                budget -= num_new
                index += 1
            elif not self.priority:
                break
        return budget

    def _allocate_or_preempt(self, out, request, num_new, index, budget):
        """Allocate slots for `request`, preempting victims until it fits or it
        is the victim itself (vllm-engine.md §3 step 3, §6). Returns
        `(scheduled, index, budget)` with the running-list index and budget
        adjusted for victims taken out of this pass."""
        while not self.kv.allocate_slots(request, num_new):
            victim_index = self._victim_index()
            victim = self.running.pop(victim_index)
            if victim_index < index:
                index -= 1
            budget += self._unschedule(out, victim)
            self._preempt(victim)
            out.preempted.append(victim)
            if victim is request:
                if not self.running:
                    self._abort_unfinishable(request)
                return False, index, budget
        return True, index, budget

    def _victim_index(self) -> int:
        """FCFS: the last running request. Priority: the largest
        `(priority, arrival)`, the earliest in `running` among equals."""
        if not self.priority:
            return len(self.running) - 1
        best = 0
        for i, r in enumerate(self.running):
            if (r.priority, r.arrival_ms) > (self.running[best].priority,
                                             self.running[best].arrival_ms):
                best = i
        return best

    @staticmethod
    def _unschedule(out, victim) -> int:
        """Take a victim's entry out of this pass; its tokens go back to the
        budget (blocks it registered stay registered, as in vLLM)."""
        for i, entry in enumerate(out.scheduled):
            if entry.request is victim:
                del out.scheduled[i]
                return entry.num_tokens
        return 0

    def _preempt(self, request):
        """Recompute preemption (`_preempt_request`): free every block, back to
        the front of `waiting` (priority: back into the heap)."""
        self.kv.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_output_placeholders = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.prepend(request)

    def _schedule_waiting(self, out, budget, threshold):
        """Admission, strict head of line (vllm-engine.md §3, waiting loop)."""
        config = self.config
        while len(self.waiting) and budget > 0 and len(self.running) < config.max_num_seqs:
            request = self.waiting.peek()
            hit_blocks, hit = self.kv.get_computed_blocks(request)
            num_new = request.num_tokens - hit
            if 0 < threshold < num_new:
                num_new = threshold
            if not config.enable_chunked_prefill and num_new > budget:
                break
            num_new = min(num_new, budget)
            reserve = request.num_tokens if config.reserve_full_isl else 0
            extra = self.watermark_blocks if self.running else 0
            if not self.kv.allocate_slots(request, num_new, hit_blocks, hit, reserve, extra):
                break
            self.waiting.pop()
            self._admit(out, request, hit, num_new)
            budget -= num_new

    def _admit(self, out, request, hit, num_new):
        resumed = request.status == RequestStatus.PREEMPTED
        self.prefix_cache_stats.record(request.num_tokens, hit, resumed)
        if request.first_admission_cached_tokens < 0:
            request.first_admission_cached_tokens = hit
        request.status = RequestStatus.RUNNING
        request.num_computed_tokens = hit
        request.prefill_target = request.num_tokens
        self.running.append(request)
        out.scheduled.append(ScheduledRequest(
            request, num_new, hit, KIND_RESUMED if resumed else KIND_NEW))

    def _update_after_schedule(self, out):
        """Advance `num_computed_tokens`; mark what samples; sum the pricing
        features; under async scheduling add output placeholders."""
        for entry in out.scheduled:
            request = entry.request
            before = request.num_computed_tokens
            after = before + entry.num_tokens
            request.num_computed_tokens = after
            high = request.max_computed_tokens  # tokens below it were computed before
            if before < high:
                request.recomputed_tokens += min(after, high) - before
            if after > high:
                request.max_computed_tokens = after
            entry.samples = after >= request.num_tokens + request.num_output_placeholders
            if entry.samples and self.async_scheduling:
                request.num_output_placeholders += 1
            out.total_tokens += entry.num_tokens
            if before < request.prefill_target:
                entry.is_prefill = True
                out.prefill_tokens += entry.num_tokens
                out.num_prefill_requests += 1
            else:
                entry.context = request.num_tokens
                out.decode_requests += 1
                out.decode_context += request.num_tokens

    # -- outputs -------------------------------------------------------------

    def update_from_output(self, out: SchedulerOutput, release_ms: float, pass_index: int):
        """Process a pass's outputs (`update_from_output`): every entry that
        samples appends one token — also for a request preempted since, whose
        in-flight token still lands — released at `release_ms`; a request with
        `max_tokens` tokens or at `max_model_len` finishes and frees its
        blocks. Returns the indices of the requests that finished."""
        finished = []
        for entry in out.scheduled:
            if not entry.samples:
                continue
            request = entry.request
            if request.status >= RequestStatus.FINISHED:
                continue
            request.num_tokens += 1
            if request.num_output_placeholders:
                request.num_output_placeholders -= 1
            self.tokens.release(request, release_ms)
            if request.first_token_pass < 0:
                request.first_token_pass = pass_index
            request.finish_pass = pass_index
            if (request.num_tokens - request.num_prompt_tokens >= request.max_tokens
                    or request.num_tokens >= self.max_model_len):
                finished.append(request)
        if finished:
            self._finish(finished)
        return [r.index for r in finished]

    # -- what the engine reads of a pass --------------------------------------

    @staticmethod
    def mark_started(out: SchedulerOutput, start_ms: float):
        """The GPU start of the pass that first schedules a request."""
        for entry in out.scheduled:
            if entry.kind == KIND_NEW:
                entry.request.first_scheduled_ms = start_ms

    @staticmethod
    def log_entries(out: SchedulerOutput):
        """`(scheduled, preempted ids)` in the format of `passes.jsonl`."""
        scheduled = [{"id": e.request.request_id, "tokens": e.num_tokens,
                      "cached": e.cached, "kind": e.kind} for e in out.scheduled]
        return scheduled, sorted(r.request_id for r in out.preempted)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def _finish(self, finished):
        done = set(id(r) for r in finished)
        for request in finished:
            if request.status == RequestStatus.RUNNING:
                self.kv.free(request)
            else:  # preempted with its last token in flight
                self.waiting.remove(request)
            request.status = RequestStatus.FINISHED
        self.running = [r for r in self.running if id(r) not in done]

    def _abort_unfinishable(self, request):
        """A request that preempted itself while alone in `running` needs more
        blocks than the pool has, and its need only grows: it would preempt
        itself forever. Take it out as `unfinished` (vllm-engine.md §3)."""
        self.waiting.remove(request)
        request.status = RequestStatus.UNFINISHED
        self.unfinishable.append(request.index)
