"""The workers of an aggregated deployment as one compiled loop that also
takes the open-loop arrivals and routes them (docs/engine.md §11): no return
to Python at each arrival. (Workers with a CPU tier route each arrival from
the replay: `CompiledCluster.fit`.)

Aggregated workers do not touch each other; what joins them is the router,
which reads every rank's state at each arrival. So, as the event loop would
run them one by one: before arrival a (its event key `(arrival_ms[a],
ARRIVAL, seq)`), every worker whose next event comes first runs — the first
key first — up to the arrival (engine/fast_run.py `run_passes`, horizon
`(arrival_ms[a], ARRIVAL, 0)`: events at that instant that end a pass run
before it, decisions after it); then the arrival is routed
(engine/routing.py `route`) and queued on its rank (fast_run `add_request`,
which wakes an idle engine). As `Replay._on_open_arrival` does, the next
arrival's event is scheduled (its sequence drawn) before the request is
routed. With a pass log, the passes of several workers go into it in event
order, so a worker then also stops at the next of the others' events.

A request that finishes is marked finished in `status` and counted
(`cs[C_DONE]`), and one rejected at arrival (it can never fit) marked
rejected, without leaving the loop: an open loop releases nothing at a
finish. The loop returns to Python (`CompiledCluster`) when a worker's loop
returns for something the core reports (requests taken out, a full pass
log, room for a CPU tier's jobs: `cs[C_FROM]` names the worker, and the next
call carries on with it, `cs[C_CONT]`), every ARRIVALS_PER_CALL arrivals
(progress, Ctrl-C), at the `h_*` horizon (the next event outside the
workers: a telemetry tick) — HORIZON — and when nothing is left: IDLE.
"""

import numpy as np

from servesim.engine.events import ARRIVAL, DECIDE
from servesim.engine.fast_run import (ARRIVALS_PER_CALL, HORIZON, IDLE, T_NEXT, T_NOW, W_FORCE,
                                      W_NEXT_ORDER, W_NEXT_SEQ, W_NFIN, W_SEQ, _before,
                                      add_request, log_arguments, next_arrival, padded,
                                      run_passes)
from servesim.engine.fast_workers import _first, offer_key, run_reporting
from servesim.engine import routing
from servesim.jit import Entry, njit, plain_python

# cs (int64 state of the cluster's loop): the event loop's sequence counter,
# the worker returned for and the one to carry on with, the first event
# popped off the event loop, the worker run last; the arrivals: the next
# one, the end, the next one's sequence, the one the call stops before;
# requests finished or rejected so far
(C_SEQ, C_FROM, C_CONT, C_FORCE, C_LAST, C_ANEXT, C_AEND, C_ASEQ, C_ALIMIT,
 C_DONE) = range(10)
NUM_CS = 10
# the workers' tuples are this long at least: one compile of the loop for every
# deployment of up to 8 workers (a tuple's length is part of its type)
WORKERS_PADDED = 8


@njit
def _arrive_routed(group, ws_t, wt_t, keys_t, keys_o, keys_s, cs, policy, rr, cfg_t, S_t, wq_t,
                   blocks_t, idmap_t, pscal_t, num_workers, dp, arrival_ms, pinned, worker_of,
                   rank_of, routed, status, scratch, rejected_code):
    """The next arrival, routed and queued (module docstring)."""
    w = group[0][0]
    R = w.R
    i = next_arrival(R, cs, arrival_ms, C_ANEXT, C_AEND, C_ASEQ, C_SEQ)
    now = arrival_ms[i]
    off = R[i].block_offset
    prompt = R[i].num_prompt_tokens
    c = cfg_t[0][0]
    j = routing.route(policy, rr, blocks_t, idmap_t, S_t, pscal_t, w.num_gpu_blocks,
                      num_workers, dp, pinned[i], w.idents[off:off + R[i].block_capacity],
                      scratch, prompt, c.block_size, c.enable_caching)
    k = j // dp
    worker_of[i] = k
    rank_of[i] = j % dp
    routed[j] += 1  # routed here, rejected or not
    ws = ws_t[k]
    ws[W_SEQ] = cs[C_SEQ]
    wt_t[k][T_NOW] = now  # its last event (the run ends at the last of any)
    if not add_request(R, cfg_t[j], S_t[j], wq_t[j], ws, wt_t[k], i, prompt, now):
        status[i] = rejected_code
        cs[C_DONE] += 1
    elif ws[W_SEQ] != cs[C_SEQ]:  # it woke the engine: a decision at this instant
        cs[C_SEQ] = ws[W_SEQ]
        offer_key(keys_t, keys_o, keys_s, k, now, DECIDE, cs[C_SEQ])


@njit(_nrt=False)
def run_cluster(group, ws_t, wt_t, keys_t, keys_o, keys_s, cs, policy, rr, cfg_t, S_t, wq_t,
                blocks_t, idmap_t, pscal_t, num_workers, dp, arrival_ms, pinned, worker_of,
                rank_of, routed, status, scratch, finished_code, rejected_code, h_time, h_order,
                h_seq, log_on, lhead, ltime, lsched, lpre, lfin, lcount):
    """Run the workers' events and the arrivals up to the horizon (module
    docstring). Worker k is `group[k]` (its `run_passes` arguments but the
    horizon and the pass log), `ws_t[k]`, `wt_t[k]` its state arrays, its
    next event's key `(keys_t[k], keys_o[k], keys_s[k])` (`inf` time: none
    pending); the ranks' tuples (`*_t`, engine/routing.py `RankArrays`) are
    indexed by `worker * dp + rank`. Request i arrives at `arrival_ms[i]`,
    pinned to rank `pinned[i]` (-1: none); where it went goes into
    `worker_of`, `rank_of` and `routed` (requests per rank), and `status`
    gets `finished_code` or `rejected_code` when it is done."""
    while True:
        a = cs[C_ANEXT]
        arriving = a < cs[C_AEND]
        # a worker runs up to the next arrival (and the outside horizon)
        t, order, seq = h_time, h_order, h_seq
        if arriving and _before(arrival_ms[a], ARRIVAL, 0, t, order, seq):
            t, order, seq = arrival_ms[a], ARRIVAL, 0
        k = cs[C_CONT]
        if k >= 0:  # the core reported what k's loop returned for: k carries on
            cs[C_CONT] = -1
        else:
            k = _first(keys_t, keys_o, keys_s, -1)
            if k >= 0 and ((arriving and not _before(keys_t[k], keys_o[k], keys_s[k],
                                                     arrival_ms[a], ARRIVAL, cs[C_ASEQ]))
                           or not (cs[C_FORCE] or _before(keys_t[k], keys_o[k], keys_s[k],
                                                          h_time, h_order, h_seq))):
                k = -1  # the arrival, or the outside event, comes first
            if k >= 0:
                cs[C_FORCE] = 0
                keys_t[k] = np.inf  # popped: the worker runs from its event
                ws_t[k][W_FORCE] = 1
        if k >= 0:
            if log_on:  # the pass log takes the workers' passes in event order
                j = _first(keys_t, keys_o, keys_s, k)
                if j >= 0 and _before(keys_t[j], keys_o[j], keys_s[j], t, order, seq):
                    t, order, seq = keys_t[j], keys_o[j], keys_s[j]
            ws = ws_t[k]
            ws[W_SEQ] = cs[C_SEQ]
            state = run_passes(*(group[k] + (t, order, seq, log_on, lhead, ltime, lsched, lpre,
                                             lfin, lcount)))
            cs[C_SEQ] = ws[W_SEQ]
            cs[C_LAST] = k
            finished = group[k][0].finished
            for e in range(ws[W_NFIN]):
                status[finished[e]] = finished_code
            cs[C_DONE] += ws[W_NFIN]
            ws[W_NFIN] = 0
            if state == HORIZON:
                offer_key(keys_t, keys_o, keys_s, k, wt_t[k][T_NEXT], ws[W_NEXT_ORDER],
                          ws[W_NEXT_SEQ])
            elif state != IDLE:
                cs[C_FROM] = k
                return state
            continue
        cs[C_FROM] = -1
        if arriving and (cs[C_FORCE] or _before(arrival_ms[a], ARRIVAL, cs[C_ASEQ], h_time,
                                                h_order, h_seq)):
            if a >= cs[C_ALIMIT]:
                return HORIZON  # the event loop gets a turn
            cs[C_FORCE] = 0
            _arrive_routed(group, ws_t, wt_t, keys_t, keys_o, keys_s, cs, policy, rr, cfg_t,
                           S_t, wq_t, blocks_t, idmap_t, pscal_t, num_workers, dp, arrival_ms,
                           pinned, worker_of, rank_of, routed, status, scratch, rejected_code)
            continue
        if not arriving and _first(keys_t, keys_o, keys_s, -1) < 0:
            return IDLE
        return HORIZON


class CompiledCluster:
    """The engine cores of an aggregated deployment (`cores`) and the
    open-loop arrivals, run by `run_cluster`, with one event of theirs on the
    event loop: the first of the workers' next events and the next arrival.
    `observer.horizon_key()` is the key of the next event outside them,
    `observer.on_progress(core)` follows each call, and `observer.on_done`
    gets the requests taken out as unfinishable (the core's `report`)."""

    def __init__(self, cores, loop, observer, pass_log, ranks: routing.RankArrays, policy,
                 arrival_ms, pinned, worker_of, rank_of, status, finished_code, rejected_code):
        self.cores = cores
        self.loop = loop
        self.observer = observer
        self.pass_log = pass_log
        self.ranks = ranks
        self.policy = int(policy)
        self.arrival_ms = arrival_ms
        self.pinned = pinned
        self.worker_of = worker_of
        self.rank_of = rank_of
        self.status = status
        self.codes = (int(finished_code), int(rejected_code))
        n = len(cores)
        self.keys_t = np.full(n, np.inf)
        self.keys_o = np.zeros(n, dtype=np.int64)
        self.keys_s = np.zeros(n, dtype=np.int64)
        self.cs = np.zeros(NUM_CS, dtype=np.int64)
        self.cs[C_CONT] = -1
        self.routed = np.zeros(len(ranks.ranks), dtype=np.int64)
        prompts = cores[0].ranks[0].scheduler.table.R["num_prompt_tokens"]
        longest = int(prompts.max()) if len(prompts) else 1
        self.scratch = np.zeros(max(1, (longest - 1) // ranks.block_size), dtype=np.int64)
        self.ws_t = padded([core.compiled.ws for core in cores], WORKERS_PADDED)
        self.wt_t = padded([core.compiled.wt for core in cores], WORKERS_PADDED)
        self._group = None
        self._args = None
        self._entry = Entry(run_cluster)
        self._running = False
        self._token = 0
        for slot, core in enumerate(cores):
            core.runner, core.slot = self, slot

    @staticmethod
    def fit(cores) -> bool:
        """Whether the workers pass arguments of one type (a tuple
        `run_cluster` indexes at run time) and have no KV transfers (a CPU
        tier's workers route each arrival from the replay: the loop would
        be compiled once more for their type, ~10 s cold, for a saving of
        a few µs an arrival)."""
        from numba import typeof

        if any(core.compiled.arguments()[1] is not None for core in cores):
            return False
        if plain_python():
            return True
        return len({typeof(core.compiled.arguments()) for core in cores}) == 1

    arrivals = property(lambda self: int(self.cs[C_ANEXT]))  # routed (or rejected) so far
    done = property(lambda self: int(self.cs[C_DONE]))  # finished or rejected so far

    def take_arrivals(self, seq):
        """Requests 0 to `len(arrival_ms)` - 1 arrive, in that order, request
        i at `arrival_ms[i]`; the first one's event has sequence `seq`."""
        cs = self.cs
        cs[C_ANEXT] = 0
        cs[C_AEND] = len(self.arrival_ms)
        cs[C_ASEQ] = seq
        self._push_next()

    def push(self, slot, t, order, seq):
        """Worker `slot`'s next event is at `(t, order, seq)`, unless the one
        it has pending comes first (`EngineCore._push_resume`)."""
        if offer_key(self.keys_t, self.keys_o, self.keys_s, slot, float(t), int(order),
                     int(seq)) and not self._running:
            self._push_next()

    def _next_key(self):
        """The first of the workers' next events and the next arrival (None:
        nothing pending)."""
        keys = [(float(self.keys_t[k]), int(self.keys_o[k]), int(self.keys_s[k]))
                for k in range(len(self.cores)) if self.keys_t[k] != np.inf]
        a = int(self.cs[C_ANEXT])
        if a < self.cs[C_AEND]:
            keys.append((float(self.arrival_ms[a]), ARRIVAL, int(self.cs[C_ASEQ])))
        return min(keys) if keys else None

    def _push_next(self):
        """The cluster's event on the event loop at its next key (a new token
        makes an earlier one stale)."""
        key = self._next_key()
        if key is None:
            return
        self._token += 1
        self.loop.push(*key, self._resume, self._token)

    def _arguments(self):
        """The workers' `run_passes` arguments, made again when a worker's
        were (`CompiledWorker.regrow`)."""
        args = [core.compiled.arguments() for core in self.cores]
        if self._group is None or any(a is not b for a, b in zip(args, self._args)):
            self._args = args
            self._group = padded(args, WORKERS_PADDED)
        return self._group

    def _resume(self, token):
        """The cluster's event, popped off the event loop: run the workers and
        the arrivals up to the horizon, each core reporting what its
        worker's loop returns for."""
        if token != self._token:
            return  # replaced by another
        self._running = True
        cs = self.cs
        r = self.ranks
        cs[C_FORCE] = 1

        def call():
            cs[C_ALIMIT] = min(cs[C_AEND], cs[C_ANEXT] + ARRIVALS_PER_CALL)
            h = self.observer.horizon_key()
            return self._entry(self._arguments(), self.ws_t, self.wt_t, self.keys_t,
                               self.keys_o, self.keys_s, cs, self.policy, r.rr, r.cfg_t, r.S_t,
                               r.wq_t, r.blocks_t, r.idmap_t, r.pscal_t, r.num_workers, r.dp,
                               self.arrival_ms, self.pinned, self.worker_of, self.rank_of,
                               self.routed, self.status, self.scratch, *self.codes,
                               float(h[0]), int(h[1]), int(h[2]), *log_arguments(self.pass_log))

        state = run_reporting(self.loop, self.cores, cs, C_SEQ, C_FROM, C_CONT, call)
        self._running = False
        for j, rank in enumerate(r.ranks):
            rank.num_requests = int(self.routed[j])
        if state == HORIZON:
            self._push_next()
        self.observer.on_progress(self.cores[int(cs[C_LAST])])
