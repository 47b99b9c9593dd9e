"""Several SGLang workers on one simulated clock, and the router that hands
them the arrivals (docs/sglang.md, "Workers").

Each worker's event loop is a generator of the instants it waits for
(`Scheduler.events`); the cluster resumes the worker with the earliest one,
after routing every arrival at or before it, so every worker and the router
see each other's state as of the instant they act. An arrival at instant t
joins a worker's decision taken at t.
"""

import heapq
import math

ROUTERS = ("round_robin", "least_loaded", "session_affinity", "kv_router", "least_prefill",
           "weighted")


class Cluster:
    """`workers` (Schedulers with empty `reqs`) fed by `arrivals` (requests in
    arrival order) through `policy`: `round_robin` (workers in turn),
    `least_loaded` (fewest requests on the worker, then fewest used KV
    tokens, then the lowest index) or `session_affinity` (a session's first
    request round robin, its later ones to the same worker; requests outside
    sessions round robin); another policy's choice is `choose(req)`
    (`kv_router`, `least_prefill`, `weighted`: servesim/replay/sglang_router.py). `on_advance(t)` is called before the
    clock reaches each new instant (telemetry). `call_at(t, fn, arg)` runs
    `fn(arg)` at instant t, before the worker events of t (an arrival that
    depends on a finish: sessions); `on_rejected(req, t)` is told of each
    request rejected at arrival."""

    def __init__(self, workers, policy: str, on_advance=None, choose=None):
        self.workers = workers
        self.choose = choose
        self.policy = policy
        self.on_advance = on_advance
        self.arrivals = []
        self._next = 0
        self._rr = 0
        self._session_worker = {}  # session_affinity: session -> worker
        self._next_t = [0.0] * len(workers)  # each worker's next instant (inf: asleep)
        self._events = [w.events() for w in workers]
        self._done = [False] * len(workers)
        self._now = 0.0
        self._calls = []  # heap of (instant, sequence, fn, arg)
        self._seq = 0
        self.on_rejected = None

    def route(self, req) -> int:
        """The worker `req` goes to."""
        if self.choose is not None:
            return self.choose(req)
        if self.policy == "session_affinity" and req.session in self._session_worker:
            return self._session_worker[req.session]
        if self.policy != "least_loaded" or len(self.workers) == 1:
            w = self._rr % len(self.workers)
            self._rr += 1
            if self.policy == "session_affinity" and req.session >= 0:
                self._session_worker[req.session] = w
            return w
        return min(range(len(self.workers)), key=lambda j: (
            self.workers[j].load, self.workers[j].used_tokens, j))

    @property
    def now(self) -> float:
        return self._now

    def call_at(self, t: float, fn, arg):
        self._seq += 1
        heapq.heappush(self._calls, (t, self._seq, fn, arg))

    def add(self, req, at_ms: float, releasing=None, released: bool = False):
        """`req` arrives at `at_ms`: routed now. Released by a finish on
        worker `releasing` (closed loop, sessions; or `released` at this
        instant by something else), it comes after the decision its worker
        takes at that instant, if that worker has one still to take."""
        j = self.route(req)
        worker = self.workers[j]
        req.worker = j
        if req.max_new_tokens < 1:
            # rejected at arrival: its prompt leaves no room for an output token
            if self.on_rejected is not None:
                self.on_rejected(req, at_ms)
            return
        ready = 0
        if releasing is not None or released:
            ready = worker.iteration + (2 if self._next_t[j] <= at_ms or worker is releasing else 1)
        worker.add_request(req, at_ms, ready)
        if self._next_t[j] == math.inf and not self._done[j]:
            self._next_t[j] = max(worker.clock, at_ms)  # wake it

    def _advance(self, t: float):
        if t > self._now:
            if self.on_advance is not None:
                self.on_advance(t)
            self._now = t

    def run(self):
        """Every event in time order; arrivals before the worker events of
        their instant."""
        arrivals = self.arrivals
        calls = self._calls
        while True:
            ta = arrivals[self._next].arrival_ms if self._next < len(arrivals) else math.inf
            tc = calls[0][0] if calls else math.inf
            j = min(range(len(self.workers)), key=lambda k: (self._next_t[k], k))
            tw = self._next_t[j]
            if ta <= tw and ta <= tc and ta < math.inf:
                self._advance(ta)
                req = arrivals[self._next]
                self._next += 1
                self.add(req, ta)
                continue
            if tc <= tw and tc < math.inf:
                self._advance(tc)
                _, _, fn, arg = heapq.heappop(calls)
                fn(arg)
                continue
            if tw == math.inf:
                return
            self._advance(tw)
            try:
                self._next_t[j] = next(self._events[j])
            except StopIteration:
                self._next_t[j] = math.inf
                self._done[j] = True

    @property
    def clock(self) -> float:
        return max([self._now] + [w.clock for w in self.workers])
