"""The workers of a disaggregated deployment as one compiled loop over their
events (docs/engine.md §13): the one statement of which worker runs next.

A disaggregated pool's workers touch each other at any event (a prefill
finish hands a request to a decode worker, a decode decision's pull makes a
prefill rank wait and shares its link with the other decode workers), so
they run strictly in the order of their events' `(time, order, seq)` keys
(engine/events.py), with one sequence counter. Each worker's passes are its
own compiled loop (engine/pass_loop.py `run_passes`); `run_workers` keeps every
worker's next event key (`keys_*`: the key its engine core would put on the
event loop, `inf` time for none) and runs, from the first key, that worker's
events below the next of the others' keys and below the `horizon` (the next
event outside the workers: the event loop's next, an arrival, a telemetry
tick), then the next worker's, and so on, without going back to Python; so the
workers' events run, and draw their sequence numbers, in the order the event
loop would run them one by one, and the outputs are the same.

It hands back to the engine core of worker `ps[0].from_worker` what that worker's
loop returns for (finishes, take-outs, a full pass log, room): the core
reports it, and the next call first continues that worker (`ps[0].carry_on`), as
a core calls its own loop again. What the replay and the cores would do at
the workers' commonest events it does itself, the same way, and the worker
carries on:

- a decode decision's pulls, told to their prefill ranks' senders, an idle
  prefill worker woken when its next transfer lands (`_tell_senders`);
- in an open loop (`DisaggregatedLoop.take_arrivals`: a finish releases
  nothing, no sessions, not the debug mode), the arrivals too, as the event
  loop would run them (before arrival a, key `(arrival_ms[a], ARRIVAL, seq)`,
  every worker whose next event comes first runs up to it): each is routed
  to a prefill rank (engine/routing.py) and queued, or rejected (`arrive`);
  a prefill worker's finishes are routed to a decode rank and handed off
  (`_hand_off`); a decode worker's are marked finished.

On the whole Mooncake trace with 2 prefill + 2 decode workers that leaves 3
returns to Python, against 32,722 when the replay took each arrival, handoff,
pull and finish. It returns HORIZON when neither the first key nor the next
arrival is below the horizon (`ps[0].from_worker` -1: the workers' event then goes
on the event loop at the first of them), every ARRIVALS_PER_CALL arrivals
(progress, Ctrl-C), and IDLE when nothing is pending. The first event run in
a call may be at any key (`ps[0].force`: the workers' event was just popped
off the event loop), as a core's run may (`ws[0].force`).

Numba compiles `run_workers` once per type of its arguments, and a tuple's
length is part of its type: each pool's workers are handed over as the
addresses of their bundles and the first of them (servesim/bundles.py
`bundle_at`), so one compile serves any number of workers (as tuples, the
loop compiled once per power of two, its code growing with the count: 300
workers compiled a 512-worker loop for ~200 s).

What the aggregated loop shares with it (the next worker, the arrival step,
routing) is engine/worker_loop.py.

NOTE(refcounts): `run_workers` is an entry point compiled without reference
counts (servesim/jit.py).
"""

import numpy as np

from servesim.engine.kv_transfers import _next_land
from servesim.engine.pass_log_buffer import log_arguments
from servesim.engine.pass_loop import _wake_at, run_passes
from servesim.engine.worker import ARRIVALS_PER_CALL
from servesim.engine.worker_state import DEC_NONE, FINISHED, HORIZON, IDLE, TAKEN_OUT
from servesim.engine.events import DECIDE
from servesim.engine.kv_handoff import hand_off, wait_on
from servesim.bundles import addresses_of, bundle_at
from servesim.jit import Entry, njit, one_type, plain_python

from servesim.engine.worker_loop import (ARRIVE, POOL_DP, ROUTED, R_ARRIVAL_MS, R_ARRIVAL_REQ,
                                         R_FINISHED, R_HANDED, R_NEVER_FITS, R_PINNED, R_PREFILL_RANK,
                                         R_PREFILL_WORKER, R_RANK, R_REJECTED, R_STATUS, R_WORKER,
                                         _queue, _route, arrival_due, arrive, new_loop_state,
                                         next_key, next_worker, offer_key, run_reporting,
                                         worker_horizon)


@njit
def _tell_senders(workers_a, wa0, keys_t, keys_o, keys_s, ps, w, n_a):
    """A decode decision's pulls (`w`: the decode worker's arrays), each
    told to its prefill rank's sender (`HandoffSender.scheduled`: the rank
    waits on it), an idle prefill worker woken when its next transfer lands
    (`EngineCore.transfer_pending`), in the pulls' order, as the decode
    worker's core does. False, with nothing done, when a prefill worker's
    transfer wakes might not hold them and one more (the cores grow them)."""
    for pw in range(n_a):
        a = bundle_at(workers_a, pw, wa0)
        if a.ws[0].num_wakes + w.ws[0].num_pulls + 1 >= len(a.xw_t):
            return False
    dp = wa0.feats.shape[1]  # links: the prefill ranks, worker by worker
    for e in range(w.ws[0].num_pulls):
        i = w.pulls[e]
        pw = w.link_of[i] // dp
        pr = w.link_of[i] % dp
        a = bundle_at(workers_a, pw, wa0)
        wait_on(a.side_pending_t[pr], a.side_state_t[pr], i)
        ws = a.ws
        if ws[0].num_in_flight == 0 and ws[0].decision == DEC_NONE:
            ws[0].seq = ps[0].seq
            if _wake_at(_next_land(a.side_pending_t, a.side_state_t, a.XF, dp), a.sched_t, dp, ws,
                        a.xw_t, a.xw_s):
                ps[0].seq = ws[0].seq
                offer_key(keys_t, keys_o, keys_s, pw, ws[0].wake_ms, DECIDE, ps[0].seq)
    w.ws[0].num_pulls = 0
    return True


@njit
def _hand_off(a, workers_b, wb0, keys_t, keys_o, keys_s, ps, pool_b, rp):
    """Prefill worker `a`'s finishes (`DisaggregatedReplay.on_prefill_done`),
    in order: a request that asked for more than its first token is routed
    to a decode rank and handed off there (kv_handoff `hand_off`, queued);
    the others are done."""
    P = a.R
    D = wb0.R
    now = a.ws[0].now_ms
    dp_a = a.feats.shape[1]  # links: the prefill ranks, worker by worker
    dp = pool_b[POOL_DP]
    for e in range(a.ws[0].num_finished):
        i = a.finished[e]
        if not P[i].do_remote_decode:
            rp[R_STATUS][i] = rp[R_FINISHED]
            ps[0].num_done += 1
            continue
        prompt = P[i].num_prompt_tokens
        j = _route(pool_b, D, i, prompt + 1, rp[R_PINNED][i], now)
        rp[R_WORKER][i] = j // dp
        rp[R_RANK][i] = j % dp
        hand_off(P, D, i, now)
        a.link_of[i] = rp[R_PREFILL_WORKER][i] * dp_a + rp[R_PREFILL_RANK][i]
        rp[R_HANDED][i] = True
        _queue(pool_b, bundle_at(workers_b, j // dp, wb0), keys_t, keys_o, keys_s, ps,
               ps[0].num_prefill + j // dp, j, D, i, prompt + 1, now)
    a.ws[0].num_finished = 0


@njit
def _run_worker(w, popped, ps, t, order, seq, log_on, log, checking):
    """Worker `w`'s events up to the horizon `(t, order, seq)` (`run_passes`),
    from its event if it was `popped`, the event loop's sequence counter
    handed in and back; the state it returned."""
    ws = w.ws
    if popped:
        ws[0].force = 1  # it runs from its event
    ws[0].seq = ps[0].seq
    # (a pool's worker: its `kv` bundles are remote KV's, never a CPU tier's)
    state = run_passes(w, w.kv_t, None, t, order, seq, log_on, log, checking, True)
    ps[0].seq = ws[0].seq
    return state


@njit(_nrt=False)  # NOTE(refcounts): an entry point, compiled without counts (servesim/jit.py)
def run_workers(workers_a, wa0, workers_b, wb0, keys_t, keys_o, keys_s, ps, pool_a, pool_b, rp,
                h_time, h_order, h_seq, log_on, log, checking):
    """Run the workers' events up to the horizon (module docstring). Worker k
    is the prefill worker `bundle_at(workers_a, k, wa0)` for k below
    `ps[0].num_prefill`, else the decode worker `bundle_at(workers_b, k -
    ps[0].num_prefill, wb0)` (its `run_passes` bundle, servesim/bundles.py:
    the loop is compiled once for any number of workers; `checking`: the
    debug mode, None or True). A decode decision's pulls are taken here as
    its core would take them (`_tell_senders`), and the worker carries on.
    With `ps[0].open_loop` so are the arrivals (`arrive`, the pools' routing
    arrays `pool_a`, `pool_b`, the replay's arrays `rp`), a prefill worker's
    finishes (`_hand_off`) and a decode worker's (`rp[R_STATUS][i]` set
    finished); `ps[0].num_done` counts the requests finished or rejected."""
    n_a = ps[0].num_prefill
    arrival_ms = rp[R_ARRIVAL_MS]
    while True:
        k, popped = next_worker(keys_t, keys_o, keys_s, ps, arrival_ms, h_time, h_order, h_seq)
        if k < 0:
            state = arrival_due(keys_t, keys_o, keys_s, ps, arrival_ms, h_time, h_order, h_seq)
            if state != ARRIVE:
                return state
            arrive(workers_a, wa0, keys_t, keys_o, keys_s, ps, pool_a, arrival_ms,
                   rp[R_ARRIVAL_REQ], rp[R_PINNED], rp[R_NEVER_FITS], rp[R_PREFILL_WORKER],
                   rp[R_PREFILL_RANK],
                   rp[R_STATUS], rp[R_REJECTED])
            continue
        # k's horizon: the first of the others' events, the next arrival, or
        # the outside event
        t, order, seq = worker_horizon(keys_t, keys_o, keys_s, k, ps, arrival_ms, h_time,
                                       h_order, h_seq, True)
        # (the pools' bundles may differ in type: each is read in its branch)
        if k < n_a:
            a = bundle_at(workers_a, k, wa0)
            state = _run_worker(a, popped, ps, t, order, seq, log_on, log, checking)
            ws, finished = a.ws, a.finished
        else:
            b = bundle_at(workers_b, k - n_a, wb0)
            state = _run_worker(b, popped, ps, t, order, seq, log_on, log, checking)
            ws, finished = b.ws, b.finished
        ps[0].last_worker = k
        if state == FINISHED and ps[0].open_loop and ws[0].num_taken_out == 0:
            if k < n_a:
                _hand_off(bundle_at(workers_a, k, wa0), workers_b, wb0, keys_t, keys_o, keys_s,
                          ps, pool_b, rp)
            else:
                for e in range(ws[0].num_finished):
                    rp[R_STATUS][finished[e]] = rp[R_FINISHED]
                ps[0].num_done += ws[0].num_finished
                ws[0].num_finished = 0
            ps[0].carry_on = k
            continue
        if k >= n_a and ws[0].num_taken_out == 0:
            if (state == TAKEN_OUT and ws[0].num_finished == 0
                    and _tell_senders(workers_a, wa0, keys_t, keys_o, keys_s, ps,
                                      bundle_at(workers_b, k - n_a, wb0), n_a)):
                ps[0].carry_on = k
                continue
        if state == HORIZON:
            # its next event, unless one pushed meanwhile comes first
            offer_key(keys_t, keys_o, keys_s, k, ws[0].next_ms, ws[0].next_order,
                      ws[0].next_seq)
        if ws[0].num_finished or (state != HORIZON and state != IDLE):
            ps[0].from_worker = k
            return state


class DisaggregatedLoop:
    """The engine cores of a disaggregated deployment (`cores`: the prefill
    pool's, then the decode pool's, `num_prefill` of them first) run by
    `run_workers`, with one event of theirs on the event loop: the first of
    their next events. `observer.horizon_key()` is the key of the next event
    outside them; `observer.on_progress(core)` follows each call."""

    def __init__(self, cores, num_prefill, loop, observer, pass_log):
        self.cores = cores
        self.num_prefill = num_prefill
        self.loop = loop
        self.observer = observer
        self.pass_log = pass_log
        n = len(cores)
        self.keys_t = np.full(n, np.inf)
        self.keys_o = np.zeros(n, dtype=np.int64)
        self.keys_s = np.zeros(n, dtype=np.int64)
        self.ps = new_loop_state()
        self.ps[0]["num_prefill"] = num_prefill
        self._groups = None
        self._args = None
        self._entry = Entry(run_workers)
        self._running = False
        self._pools = None  # the pools' routing arrays and the replay's (`attach`)
        self._key = None  # the workers' live event on the event loop, and its token
        self._token = 0
        for slot, core in enumerate(cores):
            core.runner, core.slot = self, slot

    @staticmethod
    def fit(cores, num_prefill) -> bool:
        """Whether each pool's workers pass arguments of one type
        (`run_workers` reads each pool's bundles by address, as one type)."""
        if plain_python():
            return True  # no types to agree on
        return (one_type([core.compiled.arguments() for core in cores[:num_prefill]])
                and one_type([core.compiled.arguments() for core in cores[num_prefill:]]))

    def attach(self, pool_a, pool_b, replay_arrays, ranks):
        """The pools' `pool_arrays`, the replay's arrays (in `R_*` order) and
        each pool's ranks (the routers' `RankArrays.ranks`, whose counts of
        requests `settle` keeps), before the run."""
        self._pools = (pool_a, pool_b, replay_arrays)
        self._ranks = ranks

    def take_arrivals(self, seq):
        """An open loop: every request arrives, the k-th request
        `arrival_req[k]` at `arrival_ms[k]` (`R_ARRIVAL_MS`, `R_ARRIVAL_REQ`;
        the first one's event has sequence `seq`), and is
        routed, handed off and finished inside the loop (`run_workers`);
        `arrivals` counts those that arrived, `done` those finished or
        rejected."""
        st = self.ps[0]
        st["open_loop"] = 1
        st["arrival_next"] = 0
        st["arrival_end"] = len(self._pools[2][R_ARRIVAL_MS])
        st["arrival_seq"] = seq
        self._push_next()

    arrivals = property(lambda self: int(self.ps[0]["arrival_next"]))
    done = property(lambda self: int(self.ps[0]["num_done"]))

    def settle(self, span, replay):
        """After a call (the requests `span` arrived in it): each rank's count
        of the requests routed to it, prefill and decode, as the routers keep
        it one by one; the loop routed, queued, rejected, handed off and
        finished each request itself."""
        for ranks, routed in zip(self._ranks, (self._pools[0][ROUTED], self._pools[1][ROUTED])):
            for j, rank in enumerate(ranks):
                rank.num_requests = int(routed[j])

    def push(self, slot, t, order, seq):
        """Worker `slot`'s next event is at `(t, order, seq)`, unless the one
        it has pending comes first (`EngineCore._push_resume`)."""
        if not offer_key(self.keys_t, self.keys_o, self.keys_s, slot, float(t), int(order),
                         int(seq)):
            return
        key = (t, order, seq)
        if self._running or (self._key is not None and self._key < key):
            return  # the workers' loop reads it, or their event comes first
        self._schedule(key)

    def _schedule(self, key):
        """The workers' event on the event loop at `key` (a new token makes
        an earlier one stale)."""
        self._key = key
        self._token += 1
        self.loop.push(*key, self._resume, self._token)

    def _push_next(self):
        """The workers' event at the first of their next events and the next
        arrival the loop takes, if any (`next_key`)."""
        key = next_key(self.keys_t, self.keys_o, self.keys_s, self.ps,
                       self._pools[2][R_ARRIVAL_MS])
        if key is not None:
            self._schedule(key)

    def _arguments(self):
        """Each pool's workers' bundles for `run_workers`, as their addresses
        and the first of them (servesim/bundles.py `bundle_at`), made again
        when a worker's bundle was (`WorkerLoop.regrow`); `_args` holds them."""
        args = [core.compiled.arguments() for core in self.cores]
        if self._groups is None or any(a is not b for a, b in zip(args, self._args)):
            self._args = args
            p = self.num_prefill
            a = [args_k[0] for args_k in args[:p]]
            b = [args_k[0] for args_k in args[p:]]
            self._groups = (addresses_of(a), a[0], addresses_of(b), b[0])
        return self._groups

    def _resume(self, token):
        """The workers' event, popped off the event loop: run their events up
        to the horizon, each core reporting what its worker's loop returns for."""
        if token != self._token:
            return  # replaced by an earlier event
        self._key = None
        self._running = True
        ps = self.ps
        st = ps[0]
        st["force"] = 1

        checking = True if self.cores[0].ranks[0].scheduler.cfg[0]["invariant_check"] else None

        def call():
            st["arrival_limit"] = min(st["arrival_end"], st["arrival_next"] + ARRIVALS_PER_CALL)
            h = self.observer.horizon_key()
            return self._entry(*self._arguments(), self.keys_t, self.keys_o, self.keys_s, ps,
                               *self._pools, float(h[0]), int(h[1]), int(h[2]),
                               *log_arguments(self.pass_log), checking)

        state = run_reporting(self.loop, self.cores, ps, call)
        self._running = False
        if state == HORIZON:
            self._push_next()
        self.observer.on_progress(self.cores[int(st["last_worker"])])
