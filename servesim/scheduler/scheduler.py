"""vLLM's V1 scheduler for one rank (vllm/v1/core/sched/scheduler.py, and
async_scheduler.py for `async_scheduling`). It knows nothing about time: the
engine core calls `schedule()` at each decision and `update_from_output()` when
a pass's outputs are processed, with the instant they are released; released
tokens go to `tokens` (an object with `release(request, release_ms)`).

This is the reference implementation, over one Python object per request;
`servesim.scheduler.fast` implements the same rules as Numba kernels over
arrays, and tests hold the two to identical results.

One `schedule()` (docs/engine.md §3):
1. the running loop serves `running` in list order, preempting on allocation
   failure (§6);
2. the waiting loop admits from `waiting`, strictly head of line, only if no
   request was preempted in this pass;
3. every scheduled request's `num_computed_tokens` advances by its tokens, and
   under async scheduling a request that will sample gets a placeholder.

With a CPU tier (`attach_connector`, docs/engine.md §9; vLLM's KV connector
hooks in the same file) admission also looks past the G1 hit into the tier:
a request with blocks there has its G1 blocks allocated, queues a load and
waits ahead of the waiting queue (WAITING_FOR_REMOTE_KVS) until the load is
done; under async scheduling a request in the pass in flight is not preempted
(§7); and the connector's store jobs are decided with each pass.

Disaggregated serving (servesim/engine/disagg.py, after vLLM's NIXL connector,
vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py) uses the same
remote-KV admission path on a decode worker (`attach_remote_kv`): a handed-off
request at the head of `waiting` has the blocks past its G1 hit allocated,
pulls the rest of its prompt's KV and waits in `waiting_for_kv` (vLLM's
WAITING_FOR_REMOTE_KVS) until the transfer lands. On a prefill worker a
finished `remote_decode` request keeps its blocks (`delayed_free`, vLLM's
`request_finished` returning `delay_free_blocks`) until `free_delayed` is
called when its transfer completes.
"""

from servesim.kvcache.cpu_tier import CPUOffloadConnector
from servesim.kvcache.manager import KVCacheManager
from servesim.scheduler.config import SchedulerConfig
from servesim.scheduler.output import (KIND_NEW, KIND_RESUMED, KIND_RUNNING,
                                       ScheduledRequest, SchedulerOutput)
from servesim.scheduler.queue import make_queue
from servesim.scheduler.request import RequestStatus

NO_LIMIT = 1 << 62
# A rank that preempts this many times without sampling a single token is
# livelocked (e.g. two prefills of equal priority preempting each other: vLLM
# picks the victim with max(), the earliest of equals, which is the one that
# has run longer): its requests are taken out as unfinished.
LIVELOCK_PREEMPTIONS = 1000


class PrefixCacheStats:
    """vLLM's `PrefixCacheStats`, counted at admissions (docs/engine.md §5):
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
        self.unfinishable = []  # indices of requests taken out as unfinished
        self.preemptions_since_token = 0
        self.connector = None  # the CPU tier's connector (attach_connector)
        self.waiting_for_kv = []  # requests with a CPU-tier load queued, in queueing order
        self.finished_stores = []  # CPU-tier store jobs of finished requests, for the engine
        self.remote_kv = None  # decode worker: where handed-off requests pull KV from
        self.delayed_free = {}  # prefill worker: index -> finished request holding its blocks

    def new_connector(self, offloading_config):
        """This rank's CPU tier (docs/engine.md §9), attached."""
        connector = CPUOffloadConnector(offloading_config, self.block_size)
        self.attach_connector(connector)
        return connector

    def attach_connector(self, connector):
        """Use `connector` (a `servesim.kvcache.cpu_tier.CPUOffloadConnector`)
        as this rank's CPU tier (docs/engine.md §9)."""
        self.connector = connector

    def attach_remote_kv(self, receiver):
        """Disaggregated decode worker: `receiver` (a
        `servesim.engine.disagg.DecodeReceiver`) prepares the KV pulls of
        handed-off requests (`request.kv_handoff`)."""
        self.remote_kv = receiver

    # -- requests in and out -------------------------------------------------

    def can_ever_fit(self, num_prompt_tokens) -> bool:
        """A prompt needing more blocks than usable, or reaching max_model_len,
        is rejected at arrival (docs/engine.md §3)."""
        usable = self.num_gpu_blocks - 1
        return (-(-num_prompt_tokens // self.block_size) <= usable
                and num_prompt_tokens < self.max_model_len)

    def add_request(self, request):
        self.waiting.add(request)

    def has_requests(self) -> bool:
        """Anything to run or wait for — including, on a prefill worker,
        finished requests whose blocks wait for their transfer to be freed."""
        return (bool(self.running) or bool(len(self.waiting)) or bool(self.waiting_for_kv)
                or bool(self.delayed_free))

    # -- schedule ------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        if self.preemptions_since_token > LIVELOCK_PREEMPTIONS:
            self._take_out_livelocked()
            return out
        budget = self.config.max_num_batched_tokens
        threshold = self.config.long_prefill_token_threshold
        if len(self.running) + self.num_waiting <= 1:
            threshold = 0
        budget = self._schedule_running(out, budget, threshold)
        if not out.preempted:
            self._schedule_waiting(out, budget, threshold)
        self._update_after_schedule(out)
        if self.connector is not None:
            self._connector_after_schedule(out)
        out.free_blocks_after_schedule = self.kv.pool.num_free_blocks
        return out

    def _schedule_running(self, out, budget, threshold) -> int:
        """The running loop (docs/engine.md §3, steps 1-4). Returns the budget
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
        is the victim itself (docs/engine.md §3 step 3, §6). With a CPU tier
        under async scheduling a victim that the pass in flight runs would
        free its blocks only after that pass: the loop stops there and
        `request` waits a pass (§7). Returns `(scheduled, index, budget)` with
        the running-list index and budget adjusted for victims taken out of
        this pass."""
        while not self._allocate(out, request, num_new):
            victim_index = self._victim_index()
            victim = self.running[victim_index]
            if victim.num_in_flight:  # only counted with a CPU tier, async
                return False, index + 1, budget  # (priority goes on with the next)
            del self.running[victim_index]
            if victim_index < index:
                index -= 1
            budget += self._unschedule(out, victim)
            self._preempt(victim, out)
            out.preempted.append(victim)
            if victim is request:
                # alone, nothing will free blocks: it can never finish (blocks
                # held for a load or, on a prefill worker, for a transfer come back)
                if not self.running and not self.waiting_for_kv and not self.delayed_free:
                    self._abort_unfinishable(request)
                return False, index, budget
        return True, index, budget

    def _allocate(self, out, request, num_new, reserve=0, extra=0) -> bool:
        """`allocate_slots` for a request scheduled in this pass (no hit);
        with a CPU tier, the blocks it takes from the free queue are noted in
        `out.new_blocks` (the pass writes them)."""
        held = request.num_blocks
        if not self.kv.allocate_slots(request, num_new, reserve_tokens=reserve,
                                      extra_blocks=extra):
            return False
        if self.connector is not None and request.num_blocks > held:
            out.new_blocks.extend(request.block_table[held:request.num_blocks].tolist())
        return True

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

    def _preempt(self, request, out):
        """Recompute preemption (`_preempt_request`): free every block, back to
        the front of `waiting` (priority: back into the heap). With the
        `simple_cpu` connector its full blocks are stored first (§9)."""
        job = self._store_on_free(request)
        if job is not None:
            out.preemption_stores.append(job)
        self.kv.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_output_placeholders = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.preemptions_since_token += 1
        self.waiting.prepend(request)

    def _schedule_waiting(self, out, budget, threshold):
        """Admission, strict head of line (docs/engine.md §3, waiting loop).
        With a CPU tier, requests waiting for a load come first, and a head
        with blocks in the tier queues a load instead (§9); a head that must
        wait for a store or another load to finish is skipped this pass."""
        config = self.config
        if self.waiting_for_kv:
            budget = self._schedule_loaded(out, budget, threshold)
        skipped = []
        while len(self.waiting) and budget > 0 and len(self.running) < config.max_num_seqs:
            request = self.waiting.peek()
            if -(-request.num_tokens // self.block_size) > self.num_gpu_blocks - 1:
                # preempted after outgrowing the pool: it can never be admitted
                # again, and would block the queue behind it for ever
                self._take_out(self.waiting.pop())
                continue
            hit_blocks, hit = self.kv.get_computed_blocks(request)
            if request.kv_handoff is not None:  # handed off by a prefill worker
                num_remote = self.remote_kv.lookup(request, len(hit_blocks))
                if num_remote:
                    # blocks for the whole sequence, the first token's slot too
                    if not self._queue_load(out, request, hit_blocks, hit, num_remote,
                                            self.remote_kv, request.num_tokens - hit):
                        break
                    continue
            elif self.connector is not None:
                num_loaded, wait = self.connector.lookup(request, len(hit_blocks))
                if wait:
                    skipped.append(self.waiting.pop())
                    continue
                if num_loaded:
                    if not self._queue_load(out, request, hit_blocks, hit, num_loaded):
                        break
                    continue
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
            if self.connector is not None:  # blocks past the hit came from the free queue
                table = request.block_table
                out.new_blocks.extend(table[len(hit_blocks):request.num_blocks].tolist())
            self._admit(out, request, hit, num_new)
            budget -= num_new
        for request in reversed(skipped):
            self.waiting.prepend(request)

    def _queue_load(self, out, request, hit_blocks, hit, num_loaded, connector=None,
                    num_tokens=None) -> bool:
        """Admission of a head whose blocks past its G1 hit are in the CPU tier
        — or, on a disaggregated decode worker, on the prefill worker that
        handed it off (`connector` is then the `remote_kv` receiver) — (vLLM's
        `load_kv_async`): with the admission checks of §3 step 4, it takes its
        G1 blocks for the hit and for `num_tokens` more tokens (the loaded
        blocks by default; registered in the prefix cache only once loaded),
        queues the load and waits ahead of the waiting queue, using no budget.
        False if it does not fit."""
        config = self.config
        reserve = request.num_tokens if config.reserve_full_isl else 0
        extra = self.watermark_blocks if self.running else 0
        if num_tokens is None:
            num_tokens = num_loaded * self.block_size
        if not self.kv.allocate_slots(request, num_tokens, hit_blocks, hit,
                                      reserve, extra, delay_cache=True):
            return False
        self.waiting.pop()
        connector = connector or self.connector
        request.kv_load = connector.prepare_load(request, len(hit_blocks), num_loaded)
        request.kv_load_g1_hit = hit
        out.loads.append(request.kv_load)
        self.waiting_for_kv.append(request)
        return True

    def _schedule_loaded(self, out, budget, threshold) -> int:
        """Requests waiting for a CPU-tier load, in the order their loads were
        queued (vllm/v1/core/sched/scheduler.py, WAITING_FOR_REMOTE_KVS and
        `_update_waiting_for_remote_kv`): one whose load is not done yet is
        skipped; one whose load is done counts its blocks as computed (the
        last token excepted), registers them in the prefix cache and is
        admitted as a waiting head would be. Returns the budget left, or 0
        when a loaded request does not fit (strict head of line)."""
        config = self.config
        waiting = self.waiting_for_kv
        i = 0
        while i < len(waiting) and budget > 0 and len(self.running) < config.max_num_seqs:
            request = waiting[i]
            if request.kv_load is not None:
                if not request.kv_load.done:
                    i += 1
                    continue
                self._finish_load(request)
            num_new = request.num_tokens - request.num_computed_tokens
            if 0 < threshold < num_new:
                num_new = threshold
            if not config.enable_chunked_prefill and num_new > budget:
                return 0
            num_new = min(num_new, budget)
            reserve = request.num_tokens if config.reserve_full_isl else 0
            extra = self.watermark_blocks if self.running else 0
            if not self._allocate(out, request, num_new, reserve, extra):
                return 0
            del waiting[i]
            self._admit(out, request, request.num_computed_tokens, num_new,
                        request.kv_load_g1_hit)
            budget -= num_new
        return budget

    def _finish_load(self, request):
        """A done load: the request's blocks count as computed, all but the
        last token (`_update_waiting_for_remote_kv`), and are registered in the
        prefix cache."""
        computed = min(request.num_blocks * self.block_size, request.num_tokens)
        if computed == request.num_tokens:
            computed -= 1
        self.kv.cache_blocks(request, computed)
        request.num_computed_tokens = computed
        request.kv_load = None

    def _admit(self, out, request, hit, num_new, g1_hit=None):
        """Move a request to `running` with `hit` tokens cached, `g1_hit` of
        them from G1 (all by default) and the rest loaded from the CPU tier
        (or pulled from a prefill worker). A handed-off request's first
        admission on a decode worker has prompt KV and its first token: its
        prefill is the prompt only, so the pass computing the first token's KV
        is a decode (docs/engine.md §10); the receiver learns of the admission
        (`admitted`: a handoff that pulled nothing releases the prefill
        worker's blocks)."""
        resumed = request.status == RequestStatus.PREEMPTED
        if g1_hit is None:
            g1_hit = hit
        self.prefix_cache_stats.record(request.num_tokens, g1_hit, resumed)
        if request.first_admission_cached_tokens < 0:
            request.first_admission_cached_tokens = hit
        handed_off = request.kv_handoff is not None
        if handed_off:
            self.remote_kv.admitted(request, out)
        elif hit > g1_hit:
            request.cpu_tier_cached_tokens += hit - g1_hit
            self.connector.hit_tokens += hit - g1_hit
        request.cpu_store_cursor = 0
        request.status = RequestStatus.RUNNING
        request.num_computed_tokens = hit
        request.prefill_target = request.num_prompt_tokens if handed_off else request.num_tokens
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
                out.prefill_tokens += entry.num_tokens
                out.num_prefill_requests += 1
                out.prefill_context += before
            else:
                out.decode_requests += 1
                out.decode_context += request.num_tokens

    def _connector_after_schedule(self, out):
        """CPU-tier bookkeeping of a decided pass (docs/engine.md §7, §9): under
        async scheduling its requests are now in flight; with the `offloading`
        connector each scheduled request's blocks full after this pass (known
        tokens only) and not yet in the tier become one store job, going out
        at the pass end (OffloadingConnectorScheduler `_get_reqs_to_store`). A
        job the tier has no room for is dropped and tried again next pass."""
        connector = self.connector
        for entry in out.scheduled:
            request = entry.request
            if self.async_scheduling:
                request.num_in_flight += 1
            if not connector.stores_as_blocks_fill:
                continue
            full = min(request.num_computed_tokens, request.num_tokens) // self.block_size
            if full > request.cpu_store_cursor:
                job = connector.prepare_store(request, request.cpu_store_cursor, full)
                if job is not None:
                    request.cpu_store_cursor = full
                    if job.num_blocks:
                        out.stores.append(job)

    def _store_on_free(self, request):
        """`simple_cpu`: the store job of a finishing or preempted request's
        full computed blocks not yet in the tier (None if nothing to store or
        no room)."""
        connector = self.connector
        if connector is None or connector.stores_as_blocks_fill:
            return None
        full = min(request.num_computed_tokens, request.num_tokens) // self.block_size
        job = connector.prepare_store(request, 0, full)
        return job if job is not None and job.num_blocks else None

    def _connector_request_finished(self, request):
        """The CPU-tier store that goes out with a finishing request's free
        (the connector's `request_finished`, then its store jobs at the next
        step: offloading_connector.py), or None. `simple_cpu`: its full
        computed blocks not yet in the tier. `offloading` under async
        scheduling: the blocks full within its computed tokens that its pass
        stores could not take — its last pass was decided while the token it
        computed was a placeholder — so it stores as many blocks as a sync
        engine, one pass later. A sync engine's last pass
        already stored every block full at its end: nothing."""
        connector = self.connector
        if connector is None or not connector.stores_as_blocks_fill:
            return self._store_on_free(request)
        if not self.async_scheduling:
            return None
        full = min(request.num_computed_tokens, request.num_tokens) // self.block_size
        if full <= request.cpu_store_cursor:
            return None
        job = connector.prepare_store(request, request.cpu_store_cursor, full)
        if job is None or not job.num_blocks:
            return None
        request.cpu_store_cursor = full
        return job

    # -- outputs -------------------------------------------------------------

    def update_from_output(self, out: SchedulerOutput, release_ms: float, pass_index: int):
        """Process a pass's outputs (`update_from_output`): every entry that
        samples appends one token — also for a request preempted since, whose
        in-flight token still lands — released at `release_ms`; a request that
        was RUNNING then registers its blocks full within the tokens whose
        pass has completed (`KVCacheManager.cache_blocks`); a request with
        `max_tokens` tokens or at `max_model_len` finishes and frees its
        blocks. Returns the indices of the requests that finished."""
        finished = []
        if self.connector is not None and self.async_scheduling:
            for entry in out.scheduled:
                entry.request.num_in_flight -= 1
        for entry in out.scheduled:
            if not entry.samples:
                continue
            request = entry.request
            if request.status >= RequestStatus.FINISHED:
                continue
            was_running = request.status == RequestStatus.RUNNING
            request.num_tokens += 1
            self.preemptions_since_token = 0
            if request.num_output_placeholders:
                request.num_output_placeholders -= 1
            if was_running:
                self.kv.cache_blocks(request, request.num_computed_tokens
                                     - request.num_output_placeholders)
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

    def pending_prefill_tokens(self) -> int:
        """Prefill work queued on this rank, in tokens: what running requests
        still have to prefill, plus every waiting request's tokens (the load
        the `kv_aware` router weighs against a prefix hit)."""
        running = sum(max(0, r.prefill_target - r.num_computed_tokens) for r in self.running)
        return running + sum(r.num_tokens for r in self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting) + len(self.waiting_for_kv)

    def _finish(self, finished):
        """Finished requests free their blocks — except a `remote_decode`
        request on a prefill worker, whose blocks are held for the decode
        worker to read until `free_delayed` (nixl_connector.py
        `request_finished`: `delay_free_blocks`)."""
        done = set(id(r) for r in finished)
        for request in finished:
            if request.status == RequestStatus.RUNNING:
                job = self._connector_request_finished(request)
                if job is not None:
                    self.finished_stores.append(job)
                if request.remote_decode:
                    self.delayed_free[request.index] = request
                else:
                    self.kv.free(request)
            else:  # preempted with its last token in flight
                self.waiting.remove(request)
            request.status = RequestStatus.FINISHED
        self.running = [r for r in self.running if id(r) not in done]

    def free_delayed(self, request):
        """The transfer of a handed-off request's KV is done: free its blocks
        (vLLM's `_update_from_kv_xfer_finished` for `finished_sending`)."""
        del self.delayed_free[request.index]
        self.kv.free(request)

    def _abort_unfinishable(self, request):
        """A request that preempted itself while alone in `running` needs more
        blocks than the pool has, and its need only grows: it would preempt
        itself forever. Take it out as `unfinished` (docs/engine.md §3)."""
        self.waiting.remove(request)
        self._take_out(request)

    def _take_out(self, request):
        request.status = RequestStatus.UNFINISHED
        self.unfinishable.append(request.index)

    def _take_out_livelocked(self):
        """Take every request of the rank out as unfinished: it preempted
        LIVELOCK_PREEMPTIONS times without sampling a token."""
        for request in self.running:
            self.kv.free(request)
            self._take_out(request)
        self.running = []
        while len(self.waiting):
            self._take_out(self.waiting.pop())
        self.preemptions_since_token = 0
