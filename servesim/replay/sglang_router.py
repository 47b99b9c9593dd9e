"""The cache-aware routers over SGLang workers (docs/sglang.md, "Workers"):
`kv_router` (Dynamo's KV router), `least_prefill` and `weighted` as
servesim/engine/routing.py states them for vLLM ranks (their logit, book,
costs, scores, tie draws and softmax: the same kernels), with a worker's
prefix cache read from its radix tree. Blocks are the worker's pages: a prompt's full
pages have the block identities of servesim/workload/prefix.py at
`page_size`, and its cached pages are the leading ones the tree holds
(`RadixCache.cached_length`, which neither stamps nor splits the tree).
"""

import numpy as np

from servesim.engine import routing
from servesim.scheduler.request import RequestStatus
from servesim.workload.prefix import block_identities
from servesim.workload.sessions import session_block_identities

# what `routing.forget_finished` reads of a request: the vLLM table's fields
_BOOK_FIELDS = np.dtype([("status", np.int64), ("first_token_pass", np.int64),
                         ("block_offset", np.int64)])


def cached_blocks(worker, req, num_full: int) -> int:
    """The leading full pages of `req`'s prompt that `worker`'s tree holds."""
    page = worker.page_size
    return worker.tree.cached_length(req.prompt[:num_full * page]) // page


def pending_prefill_tokens(worker) -> int:
    """The prefill tokens queued on `worker`: every waiting request's fill
    (`Scheduler.queued`) and the chunked request's rest (vLLM's
    `pending_prefill_tokens`)."""
    chunked = worker.chunked_req
    rest = chunked.fill_len - chunked.computed if chunked is not None else 0
    return sum(r.fill_len for r in worker.queued) + rest


class SGLangLeastPrefill:
    """`least_prefill`: the first worker of least `routing.least_prefill_cost`."""

    def __init__(self, workers):
        self.workers = workers

    def __call__(self, req) -> int:
        best, best_cost = -1, 0
        for j, worker in enumerate(self.workers):
            num_full = req.prompt_len // worker.page_size
            cost = routing.least_prefill_cost(req.prompt_len, cached_blocks(worker, req, num_full),
                                              worker.page_size, pending_prefill_tokens(worker))
            if best < 0 or cost < best_cost:
                best, best_cost = j, cost
        return best


class SGLangWeighted:
    """`weighted`: the greatest `routing.weighted_score` (waiting requests
    for the queue depth, SGLang's token usage for the KV usage), ties drawn
    from the router's seeded generator."""

    def __init__(self, options, workers):
        self.workers = workers
        self.kvr = routing.RouterArrays(options, len(workers)).arrays

    def __call__(self, req) -> int:
        kvr = self.kvr
        waiting = [len(w.queued) for w in self.workers]
        lo, hi = min(waiting), max(waiting)
        best, top, ties = -1, 0.0, 0
        for j, worker in enumerate(self.workers):
            num_full = req.prompt_len // worker.page_size
            cached = num_full > 0 and not worker.tree.disable
            hit = cached_blocks(worker, req, num_full) if cached else 0
            score = routing.weighted_score(kvr.weights, cached, hit, num_full, waiting[j], lo, hi,
                                           worker.used_tokens / worker.pool.size)
            if best < 0 or score > top:
                best, top, ties = j, score, 1
            elif score == top:
                ties += 1
                if routing.uniform(kvr.ints) * ties < 1.0:
                    best = j
        return best


class SGLangKVRouter:
    """The `kv_router` choice for each arrival over `workers` (Schedulers),
    for the requests `reqs` of `workload` (workload order), with the knobs of
    `options` (a RouterConfig)."""

    def __init__(self, options, workers, reqs, workload, page_size: int):
        self.workers = workers
        self.reqs = reqs
        self.page = page_size
        n = len(workload)
        prompt = workload.input_length.astype(np.int64)
        num_blocks = np.maximum(prompt // page_size, 1)
        self.idents, self.offsets, num_identities = block_identities(
            workload.hash_flat, workload.hash_offsets, workload.trace_block_size, prompt,
            num_blocks, page_size)
        if workload.sessions is not None:  # an accumulating session's stream: its own blocks
            self.idents, num_identities = session_block_identities(
                workload.sessions, self.idents, self.offsets, num_identities, prompt,
                workload.output_length.astype(np.int64), page_size)
        self.kvr = routing.RouterArrays(options, len(workers), n, num_identities,
                                        book=True).arrays
        self.R = np.zeros(n, dtype=_BOOK_FIELDS)
        self.R["first_token_pass"] = -1
        self.R["block_offset"] = self.offsets[:-1]
        self.booked = []  # requests in some worker's book, not yet seen finished

    def _sync(self):
        """The book's view of each booked request: its first token, its finish."""
        R, keep = self.R, []
        for req in self.booked:
            R[req.index]["first_token_pass"] = req.first_token_pass
            if req.finished:
                R[req.index]["status"] = RequestStatus.FINISHED
            else:
                keep.append(req)
        self.booked = keep

    def __call__(self, req) -> int:
        """`routing.kv_router`'s choice for `req` (ties drawn, or sampled by
        softmax with a temperature); it enters the chosen worker's book
        unless it is rejected at arrival."""
        kvr = self.kvr
        self._sync()
        i = req.index
        size = req.prompt_len
        num_full = size // self.page
        mine = self.idents[self.offsets[i]:self.offsets[i] + num_full]
        temperature = kvr.weights[routing.KW_TEMPERATURE]
        best, ties, lo, hi = -1, 0, 0.0, 0.0
        for j, worker in enumerate(self.workers):
            routing.forget_finished(kvr, self.R, self.idents, j)
            hit = cached_blocks(worker, req, num_full)
            x = routing.kv_router_logit(kvr, j, mine, num_full, hit, size, self.page)
            kvr.logits[j] = x
            kvr.hits[j] = hit
            if best < 0 or x > hi:
                hi = x
            if best < 0 or x < lo:
                best, lo, ties = j, x, 1
            elif x == lo:
                ties += 1
                if temperature == 0.0 and routing.uniform(kvr.ints) * ties < 1.0:
                    best = j  # reservoir sampling: each tied worker alike
        if temperature > 0.0:
            best = routing.softmax_sample(kvr.logits, len(self.workers), lo, hi, temperature,
                                          routing.uniform(kvr.ints))
        if req.max_new_tokens >= 1:
            hit = int(kvr.hits[best])
            routing.kv_router_book(kvr, best, i, mine, num_full, size - hit * self.page)
            self.booked.append(req)
        return best


def cache_aware_router(options, workers, reqs, workload, page_size: int):
    """The choice of `options.policy` (`kv_router`, `least_prefill` or
    `weighted`) over `workers`."""
    if options.policy == "kv_router":
        return SGLangKVRouter(options, workers, reqs, workload, page_size)
    if options.policy == "least_prefill":
        return SGLangLeastPrefill(workers)
    return SGLangWeighted(options, workers)
