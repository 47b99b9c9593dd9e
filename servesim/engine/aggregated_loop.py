"""The workers of an aggregated deployment as one compiled loop that also
takes the open-loop arrivals and routes them (docs/engine.md §11): no return
to Python at each arrival. (Workers with a CPU tier route each arrival from
the replay: `AggregatedLoop.fit`.)

Aggregated workers do not touch each other; what joins them is the router,
which reads every rank's state at each arrival. So, as the event loop would
run them one by one: before arrival a (its event key `(arrival_ms[a],
ARRIVAL, seq)`), every worker whose next event comes first runs — the first
key first — up to the arrival (engine/pass_loop.py `run_passes`, horizon
`(arrival_ms[a], ARRIVAL, 0)`: events at that instant that end a pass run
before it, decisions after it); then the arrival is routed
(engine/routing.py `route`) and queued on its rank (pass_loop `add_request`,
which wakes an idle engine). As `Replay._on_open_arrival` does, the next
arrival's event is scheduled (its sequence drawn) before the request is
routed. With a pass log, the passes of several workers go into it in event
order, so a worker then also stops at the next of the others' events.

A request that finishes is marked finished in `status` and counted
(`cs[0].num_done`), and one rejected at arrival (it can never fit) marked
rejected, without leaving the loop: an open loop releases nothing at a
finish. The loop returns to Python (`AggregatedLoop`) when a worker's loop
returns for something the core reports (requests taken out, a full pass
log, room for a CPU tier's jobs: `cs[0].from_worker` names the worker, and the next
call carries on with it, `cs[0].carry_on`), every ARRIVALS_PER_CALL arrivals
(progress, Ctrl-C), at the `h_*` horizon (the next event outside the
workers: a telemetry tick) — HORIZON — and when nothing is left: IDLE.
"""

import numpy as np

from servesim.engine.pass_log_buffer import log_arguments
from servesim.engine.pass_loop import run_passes
from servesim.engine.worker import ARRIVALS_PER_CALL
from servesim.engine.worker_state import HORIZON, IDLE
from servesim.engine.worker_loop import (ARRIVE, ROUTED, arrival_due, arrive, new_loop_state,
                                         next_key, next_worker, offer_key, pool_arrays,
                                         run_reporting, worker_horizon)
from servesim.engine import routing
from servesim.bundles import addresses_of, bundle_at
from servesim.jit import Entry, njit, one_type, plain_python

# cs: the state of the cluster's loop, that of any loop over workers
# (engine/worker_loop.py `LOOP_DTYPE`)

@njit(_nrt=False)  # NOTE(refcounts): an entry point, compiled without counts (servesim/jit.py)
def run_cluster(workers, w0, keys_t, keys_o, keys_s, cs, pool, arrival_ms, arrival_req,
                pinned, never_fits, worker_of, rank_of, status, finished_code, rejected_code,
                h_time, h_order, h_seq, log_on, log):
    """Run the workers' events and the arrivals up to the horizon (module
    docstring). Worker k is `bundle_at(workers, k, w0)` (its `run_passes`
    bundle; servesim/bundles.py: the loop is compiled once for any number of
    workers), its next event's key `(keys_t[k], keys_o[k], keys_s[k])`
    (`inf` time: none pending); `pool` is its ranks' routing arrays
    (worker_loop `pool_arrays`: ranks numbered `worker * dp + rank`).
    The k-th arrival is request `arrival_req[k]` at `arrival_ms[k]`
    (worker_loop `arrive`); request i is pinned to
    rank `pinned[i]` (-1: none); where it went goes into `worker_of`,
    `rank_of` and the pool's count of requests per rank, and `status` gets
    `finished_code` or `rejected_code` when it is done."""
    while True:
        k, popped = next_worker(keys_t, keys_o, keys_s, cs, arrival_ms, h_time, h_order, h_seq)
        if k < 0:
            state = arrival_due(keys_t, keys_o, keys_s, cs, arrival_ms, h_time, h_order, h_seq)
            if state != ARRIVE:
                return state
            arrive(workers, w0, keys_t, keys_o, keys_s, cs, pool, arrival_ms, arrival_req,
                   pinned, never_fits, worker_of, rank_of, status, rejected_code)
            continue
        # a worker runs up to the next arrival (and the outside horizon); the
        # pass log takes the workers' passes in event order
        t, order, seq = worker_horizon(keys_t, keys_o, keys_s, k, cs, arrival_ms, h_time,
                                       h_order, h_seq, log_on)
        w = bundle_at(workers, k, w0)
        ws = w.ws
        if popped:
            ws[0].force = 1  # it runs from its event
        ws[0].seq = cs[0].seq
        # (never checking; workers without KV transfers, `fit`; no handoffs)
        state = run_passes(w, None, None, t, order, seq, log_on, log, None, None)
        cs[0].seq = ws[0].seq
        cs[0].last_worker = k
        finished = w.finished
        for e in range(ws[0].num_finished):
            status[finished[e]] = finished_code
        cs[0].num_done += ws[0].num_finished
        ws[0].num_finished = 0
        if state == HORIZON:
            offer_key(keys_t, keys_o, keys_s, k, ws[0].next_ms, ws[0].next_order,
                      ws[0].next_seq)
        elif state != IDLE:
            cs[0].from_worker = k
            return state


class AggregatedLoop:
    """The engine cores of an aggregated deployment (`cores`) and the
    open-loop arrivals, run by `run_cluster`, with one event of theirs on the
    event loop: the first of the workers' next events and the next arrival.
    `observer.horizon_key()` is the key of the next event outside them,
    `observer.on_progress(core)` follows each call, and `observer.on_done`
    gets the requests taken out as unfinishable (the core's `report`)."""

    def __init__(self, cores, loop, observer, pass_log, ranks: routing.RankArrays, policy,
                 arrival_ms, arrival_req, pinned, worker_of, rank_of, status, finished_code,
                 rejected_code):
        self.cores = cores
        self.loop = loop
        self.observer = observer
        self.pass_log = pass_log
        self.ranks = ranks
        self.pool = pool_arrays(ranks, policy, cores[0].ranks[0].scheduler.table)
        self.arrival_ms = arrival_ms
        self.arrival_req = arrival_req
        self.pinned = pinned
        self.worker_of = worker_of
        self.rank_of = rank_of
        self.status = status
        self.codes = (int(finished_code), int(rejected_code))
        n = len(cores)
        self.keys_t = np.full(n, np.inf)
        self.keys_o = np.zeros(n, dtype=np.int64)
        self.keys_s = np.zeros(n, dtype=np.int64)
        self.cs = new_loop_state()
        self.never_fits = np.zeros(len(arrival_ms), dtype=bool)  # (one pool: its own check)
        self._group = None
        self._args = None
        self._entry = Entry(run_cluster)
        self._running = False
        self._token = 0
        for slot, core in enumerate(cores):
            core.runner, core.slot = self, slot

    @staticmethod
    def fit(cores) -> bool:
        """Whether the workers pass arguments of one type (`run_cluster`
        reads their bundles by address as one type) and have no KV transfers (a CPU
        tier's workers route each arrival from the replay: the loop would
        be compiled once more for their type, ~10 s cold, for a saving of
        a few µs an arrival)."""
        if any(core.compiled.arguments()[1] is not None for core in cores):
            return False
        if plain_python():
            return True
        return one_type([core.compiled.arguments() for core in cores])

    arrivals = property(lambda self: int(self.cs[0]["arrival_next"]))  # routed (or rejected) so far
    done = property(lambda self: int(self.cs[0]["num_done"]))  # finished or rejected so far

    def settle(self, span, replay):
        """Nothing is left to the replay for the requests `span` that
        arrived: the loop routed, queued or rejected each (`worker_of`,
        `rank_of`, `status`) and counts each rank's requests (`_resume`)."""

    def take_arrivals(self, seq):
        """Every request arrives, the k-th request `arrival_req[k]` at
        `arrival_ms[k]`; the first one's event has sequence `seq`."""
        st = self.cs[0]
        st["arrival_next"] = 0
        st["arrival_end"] = len(self.arrival_ms)
        st["arrival_seq"] = seq
        self._push_next()

    def push(self, slot, t, order, seq):
        """Worker `slot`'s next event is at `(t, order, seq)`, unless the one
        it has pending comes first (`EngineCore._push_resume`)."""
        if offer_key(self.keys_t, self.keys_o, self.keys_s, slot, float(t), int(order),
                     int(seq)) and not self._running:
            self._push_next()

    def _push_next(self):
        """The cluster's event on the event loop at its next key (`next_key`;
        a new token makes an earlier one stale)."""
        key = next_key(self.keys_t, self.keys_o, self.keys_s, self.cs, self.arrival_ms)
        if key is None:
            return
        self._token += 1
        self.loop.push(*key, self._resume, self._token)

    def _arguments(self):
        """The workers' bundles for `run_cluster`, as their addresses and the
        first of them (servesim/bundles.py `bundle_at`), made again when a
        worker's bundle was (`WorkerLoop.regrow`); `_args` holds them."""
        args = [core.compiled.arguments() for core in self.cores]
        if self._group is None or any(a is not b for a, b in zip(args, self._args)):
            self._args = args
            bundles = [args_k[0] for args_k in args]
            self._group = (addresses_of(bundles), bundles[0])
        return self._group

    def _resume(self, token):
        """The cluster's event, popped off the event loop: run the workers and
        the arrivals up to the horizon, each core reporting what its
        worker's loop returns for."""
        if token != self._token:
            return  # replaced by another
        self._running = True
        cs = self.cs
        st = cs[0]
        st["force"] = 1

        def call():
            st["arrival_limit"] = min(st["arrival_end"], st["arrival_next"] + ARRIVALS_PER_CALL)
            h = self.observer.horizon_key()
            return self._entry(*self._arguments(), self.keys_t,
                               self.keys_o, self.keys_s, cs, self.pool, self.arrival_ms,
                               self.arrival_req,
                               self.pinned, self.never_fits, self.worker_of, self.rank_of,
                               self.status, *self.codes, float(h[0]), int(h[1]),
                               int(h[2]), *log_arguments(self.pass_log))

        state = run_reporting(self.loop, self.cores, cs, call)
        self._running = False
        routed = self.pool[ROUTED]
        for j, rank in enumerate(self.ranks.ranks):
            rank.num_requests = int(routed[j])
        if state == HORIZON:
            self._push_next()
        self.observer.on_progress(self.cores[int(cs[0]["last_worker"])])
