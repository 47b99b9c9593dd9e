"""Several SGLang workers on one simulated clock, and the router that hands
them the arrivals (docs/sglang.md, "Workers").

Each worker's event loop is a generator of the instants it waits for
(`Scheduler.events`); the cluster resumes the worker with the earliest one,
after routing every arrival at or before it, so every worker and the router
see each other's state as of the instant they act. An arrival at instant t
joins a worker's decision taken at t.
"""

import math

ROUTERS = ("round_robin", "least_loaded")


class Cluster:
    """`workers` (Schedulers with empty `reqs`) fed by `arrivals` (requests in
    arrival order) through `policy`: `round_robin` (workers in turn) or
    `least_loaded` (fewest requests on the worker, then fewest used KV
    tokens, then the lowest index). `on_advance(t)` is called before the
    clock reaches each new instant (telemetry)."""

    def __init__(self, workers, policy: str, on_advance=None):
        self.workers = workers
        self.policy = policy
        self.on_advance = on_advance
        self.arrivals = []
        self._next = 0
        self._rr = 0
        self._next_t = [0.0] * len(workers)  # each worker's next instant (inf: asleep)
        self._events = [w.events() for w in workers]
        self._done = [False] * len(workers)
        self._now = 0.0

    def route(self, req) -> int:
        """The worker `req` goes to."""
        if self.policy == "round_robin" or len(self.workers) == 1:
            w = self._rr % len(self.workers)
            self._rr += 1
            return w
        return min(range(len(self.workers)), key=lambda j: (
            self.workers[j].load, self.workers[j].used_tokens, j))

    def add(self, req, at_ms: float, releasing=None):
        """`req` arrives at `at_ms`: routed now. Released by a finish on
        worker `releasing` (closed loop), it comes after the decision its
        worker takes at that instant, if that worker has one still to take."""
        j = self.route(req)
        worker = self.workers[j]
        req.worker = j
        if req.max_new_tokens < 1:
            return  # rejected at arrival: its prompt leaves no room for an output token
        ready = 0
        if releasing is not None:
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
        while True:
            ta = arrivals[self._next].arrival_ms if self._next < len(arrivals) else math.inf
            j = min(range(len(self.workers)), key=lambda k: (self._next_t[k], k))
            tw = self._next_t[j]
            if ta <= tw and ta < math.inf:
                self._advance(ta)
                req = arrivals[self._next]
                self._next += 1
                self.add(req, ta)
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
