"""The workers of a disaggregated deployment as one compiled loop over their
events (docs/engine.md §13): the one statement of which worker runs next.

A disaggregated pool's workers touch each other at any event (a prefill
finish hands a request to a decode worker, a decode decision's pull makes a
prefill rank wait and shares its link with the other decode workers), so
they run strictly in the order of their events' `(time, order, seq)` keys
(engine/events.py), with one sequence counter. Each worker's passes are its
own compiled loop (engine/fast_run.py `run_passes`); `run_workers` keeps every
worker's next event key (`keys_*`: the key its engine core would put on the
event loop, `inf` time for none) and runs, from the first key, that worker's
events below the next of the others' keys and below the `horizon` (the next
event outside the workers: the event loop's next, an arrival, a telemetry
tick), then the next worker's, and so on, without going back to Python; so the
workers' events run, and draw their sequence numbers, in the order the event
loop would run them one by one, and the outputs are the same.

It hands back to the engine core of worker `ps[P_FROM]` what that worker's
loop returns for (a prefill worker's finishes: the handoffs; take-outs, a
full pass log, room): the core reports it, and the next call first continues
that worker (`ps[P_CONT]`), as a core calls its own loop again. Two returns
of a decode worker it takes itself, as the core would, and the worker
carries on: a decision's pulls, told to their prefill ranks' senders
(`_tell_senders`), and in an open loop its finishes, which release nothing
(`CompiledWorkers.finish_in_loop`); on the whole Mooncake trace with 2
prefill + 2 decode workers that leaves ~10,500 returns to Python of ~32,700. It returns
HORIZON when the first key is not below the horizon (`ps[P_FROM]` -1: the
workers' event then goes on the event loop at that key) and IDLE when no
worker has an event pending. The first worker run in a call may run its first
event at any key (`ps[P_FORCE]`: the workers' event was just popped off the
event loop), as a core's run may (`ws[W_FORCE]`).

Numba compiles `run_workers` once per type of its arguments, and a tuple's
length is part of its type: a pool's group of workers, and the state arrays,
are handed over padded to a power of two (`fast_run.padded`; the padding is
never read, the loop reads how many workers there are from `ps[P_NUM_A]` and
`keys_t`). A deployment of 1 or 2 workers per pool compiles
one loop, not four (each ~12 s on a cold cache), 3 or 4 the next.
"""

import numpy as np

from servesim.engine import fast_run
from servesim.engine.events import DECIDE
from servesim.engine.fast_disagg import P_COUNT
from servesim.engine.fast_run import (DEC_NONE, FINISHED, HORIZON, IDLE, T_NEXT, T_XWAKE,
                                      TAKEN_OUT, W_COUNT, W_DECIDE, W_FORCE, W_NEXT_ORDER,
                                      W_NEXT_SEQ, W_NFIN, W_NOUT, W_NPULL, W_NXW, W_SEQ,
                                      _before, _next_land, _wake_at, padded, run_passes)
from servesim.jit import Entry, njit, plain_python

# ps (int64 state of the workers' loop); P_NUM_A: how many prefill workers;
# P_FINISH: whether a decode worker's finishes are marked in the loop (an open
# loop: they release nothing), P_DONE how many so far
P_SEQ, P_FROM, P_CONT, P_FORCE, P_LAST, P_NUM_A, P_FINISH, P_DONE = range(8)
NUM_PS = 8


@njit
def _first(keys_t, keys_o, keys_s, skip):
    """The worker (not `skip`) with the first pending key (-1: none)."""
    best = -1
    for k in range(len(keys_t)):
        if k == skip or keys_t[k] == np.inf:
            continue
        if best < 0 or _before(keys_t[k], keys_o[k], keys_s[k],
                               keys_t[best], keys_o[best], keys_s[best]):
            best = k
    return best


@njit
def offer_key(keys_t, keys_o, keys_s, slot, t, order, seq):
    """Worker `slot`'s next event is at `(t, order, seq)` unless the one it
    has pending comes first (`EngineCore._push_resume`); whether it is (its
    own key offered again is)."""
    if keys_t[slot] != np.inf and _before(keys_t[slot], keys_o[slot], keys_s[slot], t, order,
                                          seq):
        return False
    keys_t[slot], keys_o[slot], keys_s[slot] = t, order, seq
    return True


def run_reporting(loop, cores, state, SEQ, FROM, CONT, call):
    """Call a compiled loop over workers (`call()`, its int64 state array
    `state`) until it returns for none of them, and return what it last
    returned. The event loop's sequence counter goes in (`state[SEQ]`) and
    comes back out; when the loop returns for worker `state[FROM]`, that
    worker's core reports it (`EngineCore.report`), and when the core says
    so the next call carries on with that worker (`state[CONT]`)."""
    while True:
        state[SEQ] = loop.seq
        result = call()
        loop.seq = int(state[SEQ])
        k = int(state[FROM])
        if k < 0:
            return result
        if cores[k].report(result):
            state[CONT] = k


@njit
def _tell_senders(group_a, ws_t, wt_t, keys_t, keys_o, keys_s, ps, w, n_a):
    """A decode decision's pulls (`w`: the decode worker's arrays), each
    told to its prefill rank's sender (`ArraySender.scheduled`: the rank
    waits on it), an idle prefill worker woken when its next transfer lands
    (`EngineCore.transfer_pending`), in the pulls' order, as the decode
    worker's core does. False, with nothing done, when a prefill worker's
    transfer wakes might not hold them and one more (the cores grow them)."""
    for pw in range(n_a):
        if ws_t[pw][W_NXW] + w.ws[W_NPULL] + 1 >= len(group_a[pw][0].xw_t):
            return False
    dp = group_a[0][0].feats.shape[1]  # links: the prefill ranks, worker by worker
    for e in range(w.ws[W_NPULL]):
        i = w.pulls[e]
        pw = w.link_of[i] // dp
        pr = w.link_of[i] % dp
        a = group_a[pw][0]
        state = a.side_state_t[pr]
        a.side_pending_t[pr][state[P_COUNT]] = i
        state[P_COUNT] += 1
        ws = ws_t[pw]
        if ws[W_COUNT] == 0 and ws[W_DECIDE] == DEC_NONE:
            ws[W_SEQ] = ps[P_SEQ]
            if _wake_at(_next_land(a.side_pending_t, a.side_state_t, a.XF, dp), a.S_t, dp, ws,
                        wt_t[pw], a.xw_t, a.xw_s):
                ps[P_SEQ] = ws[W_SEQ]
                offer_key(keys_t, keys_o, keys_s, pw, wt_t[pw][T_XWAKE], DECIDE, ps[P_SEQ])
    w.ws[W_NPULL] = 0
    return True


@njit(_nrt=False)
def run_workers(group_a, group_b, ws_t, wt_t, keys_t, keys_o, keys_s, ps, status, finished_code,
                h_time, h_order, h_seq, log_on, lhead, ltime, lsched, lpre, lfin, lcount):
    """Run the workers' events up to the horizon (module docstring). Worker k
    is `group_a[k]` (a prefill worker's `run_passes` arguments but the
    horizon and the pass log) for k below `ps[P_NUM_A]`, else
    `group_b[k - ps[P_NUM_A]]`; `ws_t[k]`, `wt_t[k]` are its state arrays
    (each tuple `padded`: its entries past the workers are never read).
    Two of a decode worker's returns are taken here, as its core would take
    them, and the worker carries on: a decision's pulls (`_tell_senders`)
    and, with `ps[P_FINISH]`, its finishes (`status[i]` set to
    `finished_code`, counted in `ps[P_DONE]`)."""
    n_a = ps[P_NUM_A]
    while True:
        k = ps[P_CONT]
        if k >= 0:  # the core reported what k's loop returned for: k carries on
            ps[P_CONT] = -1
        else:
            k = _first(keys_t, keys_o, keys_s, -1)
            if k < 0:
                ps[P_FROM] = -1
                return IDLE
            if not (ps[P_FORCE] or _before(keys_t[k], keys_o[k], keys_s[k], h_time, h_order,
                                           h_seq)):
                ps[P_FROM] = -1
                return HORIZON
            ps[P_FORCE] = 0
            keys_t[k] = np.inf  # popped: the worker runs from its event
            ws_t[k][W_FORCE] = 1
        # k's horizon: the first of the others' events, or the outside one
        t, order, seq = h_time, h_order, h_seq
        j = _first(keys_t, keys_o, keys_s, k)
        if j >= 0 and _before(keys_t[j], keys_o[j], keys_s[j], t, order, seq):
            t, order, seq = keys_t[j], keys_o[j], keys_s[j]
        ws = ws_t[k]
        ws[W_SEQ] = ps[P_SEQ]
        tail = (t, order, seq, log_on, lhead, ltime, lsched, lpre, lfin, lcount)
        if k < n_a:
            state = run_passes(*(group_a[k] + tail))
        else:
            state = run_passes(*(group_b[k - n_a] + tail))
        ps[P_SEQ] = ws[W_SEQ]
        ps[P_LAST] = k
        if k >= n_a and ws[W_NOUT] == 0:
            w = group_b[k - n_a][0]
            if state == FINISHED and ps[P_FINISH]:
                for e in range(ws[W_NFIN]):
                    status[w.finished[e]] = finished_code
                ps[P_DONE] += ws[W_NFIN]
                ws[W_NFIN] = 0
                ps[P_CONT] = k
                continue
            if (state == TAKEN_OUT and ws[W_NFIN] == 0
                    and _tell_senders(group_a, ws_t, wt_t, keys_t, keys_o, keys_s, ps, w, n_a)):
                ps[P_CONT] = k
                continue
        if state == HORIZON:
            # its next event, unless one pushed meanwhile comes first
            offer_key(keys_t, keys_o, keys_s, k, wt_t[k][T_NEXT], ws[W_NEXT_ORDER],
                      ws[W_NEXT_SEQ])
        if ws[W_NFIN] or (state != HORIZON and state != IDLE):
            ps[P_FROM] = k
            return state


class CompiledWorkers:
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
        self.ps = np.zeros(NUM_PS, dtype=np.int64)
        self.ps[P_CONT] = -1
        self.ps[P_NUM_A] = num_prefill
        # as long as the two groups padded: 4 for 1-2 workers per pool
        self._num_slots = (len(padded(cores[:num_prefill]))
                           + len(padded(cores[num_prefill:])))
        self.ws_t = padded([core.compiled.ws for core in cores], self._num_slots)
        self._groups = None
        self._args = None
        self._entry = Entry(run_workers)
        self._running = False
        self._status = np.zeros(1, dtype=np.int8)  # (`finish_in_loop`)
        self._finished_code = 0
        self._key = None  # the workers' live event on the event loop, and its token
        self._token = 0
        for slot, core in enumerate(cores):
            core.runner, core.slot = self, slot

    @staticmethod
    def fit(cores, num_prefill) -> bool:
        """Whether each pool's workers pass arguments of one type (a tuple
        `run_workers` indexes at run time)."""
        from numba import typeof

        if plain_python():
            return True  # no types to agree on
        types = [typeof(core.compiled.arguments()) for core in cores]
        return (len(set(types[:num_prefill])) <= 1 and len(set(types[num_prefill:])) <= 1)

    def finish_in_loop(self, status, finished_code):
        """An open loop: a decode worker's finishes release nothing, so the
        loop marks them (`status[i] = finished_code`) and goes on; `done`
        counts them."""
        self._status = status
        self._finished_code = int(finished_code)
        self.ps[P_FINISH] = 1

    done = property(lambda self: int(self.ps[P_DONE]))  # finishes marked in the loop

    def push(self, slot, t, order, seq):
        """Worker `slot`'s next event is at `(t, order, seq)`, unless the one
        it has pending comes first (`EngineCore._push_resume`)."""
        if not offer_key(self.keys_t, self.keys_o, self.keys_s, slot, float(t), int(order),
                         int(seq)):
            return
        key = (t, order, seq)
        if self._running or (self._key is not None and self._key < key):
            return  # the workers' loop reads it, or their event comes first
        self._key = key
        self._token += 1
        self.loop.push(t, order, seq, self._resume, self._token)

    def _arguments(self):
        """`run_workers`' groups and state arrays, made again when a worker's
        arguments were (`CompiledWorker.regrow`)."""
        args = [core.compiled.arguments() for core in self.cores]
        if self._groups is None or any(a is not b for a, b in zip(args, self._args)):
            self._args = args
            p = self.num_prefill
            self._groups = (padded(args[:p]), padded(args[p:]), self.ws_t,
                            padded([core.compiled.wt for core in self.cores],
                                   self._num_slots))
        return self._groups

    def _resume(self, token):
        """The workers' event, popped off the event loop: run their events up
        to the horizon, each core reporting what its worker's loop returns for."""
        if token != self._token:
            return  # replaced by an earlier event
        self._key = None
        self._running = True
        ps = self.ps
        ps[P_FORCE] = 1

        def call():
            h = self.observer.horizon_key()
            return self._entry(*self._arguments(), self.keys_t, self.keys_o, self.keys_s, ps,
                               self._status, self._finished_code, float(h[0]), int(h[1]),
                               int(h[2]),
                               *fast_run.log_arguments(self.pass_log))

        state = run_reporting(self.loop, self.cores, ps, P_SEQ, P_FROM, P_CONT, call)
        self._running = False
        if state == HORIZON:
            k = int(np.lexsort((self.keys_s, self.keys_o, self.keys_t))[0])
            self.push(k, float(self.keys_t[k]), int(self.keys_o[k]), int(self.keys_s[k]))
        self.observer.on_progress(self.cores[int(ps[P_LAST])])
