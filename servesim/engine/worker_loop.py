"""What both compiled loops over workers share (the aggregated one,
aggregated_loop.py, and the disaggregated one, disaggregated_loop.py): which
worker runs next, and the arrival step.

- `next_worker`, `worker_horizon`, `offer_key`, `arrival_due`: the workers'
  next event keys `(time, order, seq)` (engine/events.py) kept in `keys_*`, the
  first of them, and the horizon below which a worker runs on;
- `arrive`: an arrival routed (engine/routing.py, `_route`) and queued on its
  rank (`_queue`, the pass loop's `add_request`), or rejected if it can never fit;
- `pool_arrays`, `run_reporting`: the Python side of a pool handed to a loop,
  and the loop called until it hands back something the replay must see.

A loop's state `ps` is one record (`LOOP_DTYPE`); the replay's arrays
a loop fills when it takes the arrivals itself are a tuple (`R_*`).
"""

import numpy as np

from servesim.engine.pass_loop import _before, add_request, next_arrival
from servesim.engine.worker_state import HORIZON, IDLE
from servesim.engine import routing
from servesim.engine.events import ARRIVAL, DECIDE
from servesim.bundles import bundle_at
from servesim.jit import njit, records



# The state of a compiled loop over workers, `ps[0]` (one record, the
# aggregated loop's and the disaggregated one's, `new_loop_state`):
LOOP_DTYPE = np.dtype([
    ("seq", np.int64),  # the event loop's sequence counter, handed in and out
    # the worker the loop returned for (-1: none), the one the next call
    # carries on with (-1: none), the one run last
    ("from_worker", np.int64), ("carry_on", np.int64), ("last_worker", np.int64),
    ("force", np.int64),  # the first event runs whatever its key (popped off the event loop)
    # the arrivals the loop takes: as a worker's (engine/worker_state.py)
    ("arrival_next", np.int64), ("arrival_end", np.int64), ("arrival_seq", np.int64),
    ("arrival_limit", np.int64),
    ("num_done", np.int64),  # requests finished or rejected so far
    # the disaggregated loop's: how many prefill workers come first, and
    # whether it takes the arrivals, hands requests off and marks finishes
    # itself (an open loop, where a finish releases nothing)
    ("num_prefill", np.int64), ("open_loop", np.int64),
])


def new_loop_state():
    """A loop over workers' state record (`LOOP_DTYPE`): no worker to carry on with."""
    ps = records(1, LOOP_DTYPE)
    ps[0]["carry_on"] = -1
    return ps


ARRIVE = -1  # (`_arrival_due`: the next arrival runs now)
# the replay's arrays the loop reads and fills when it takes the arrivals
# (`DisaggregatedLoop.take_arrivals`), a tuple in this order
(R_ARRIVAL_MS, R_ARRIVAL_REQ, R_PINNED, R_NEVER_FITS, R_PREFILL_WORKER, R_PREFILL_RANK,
 R_WORKER, R_RANK, R_HANDED, R_STATUS, R_FINISHED, R_REJECTED) = range(12)


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


@njit
def next_worker(keys_t, keys_o, keys_s, st, arrival_ms, h_time, h_order, h_seq):
    """The worker whose event a loop over workers runs next (`st`: its
    state), and whether it was popped (the caller then runs it from that
    event: its `force`): the one the core said carries on, else the one
    with the first key, unless the next arrival (key `(arrival_ms[a],
    ARRIVAL, st[0].arrival_seq)`) or the horizon comes first (the first
    event of a call may be at any key: `st[0].force`). -1: none of them
    (`arrival_due`)."""
    k = st[0].carry_on
    if k >= 0:  # the core reported what k's loop returned for: k carries on
        st[0].carry_on = -1
        return k, False
    k = _first(keys_t, keys_o, keys_s, -1)
    a = st[0].arrival_next
    if k < 0 or ((a < st[0].arrival_end
                  and not _before(keys_t[k], keys_o[k], keys_s[k], arrival_ms[a], ARRIVAL,
                                  st[0].arrival_seq))
                 or not (st[0].force or _before(keys_t[k], keys_o[k], keys_s[k],
                                                h_time, h_order, h_seq))):
        return -1, False  # the arrival, or the outside event, comes first
    st[0].force = 0
    keys_t[k] = np.inf  # popped: the worker runs from its event
    return k, True


@njit
def arrival_due(keys_t, keys_o, keys_s, st, arrival_ms, h_time, h_order, h_seq):
    """No worker's event runs next (`next_worker`): ARRIVE when the next
    arrival does, else the state the loop returns: HORIZON (the horizon
    comes first, or the call took its ARRIVALS_PER_CALL arrivals: the event
    loop gets a turn) or IDLE (nothing is pending)."""
    st[0].from_worker = -1
    a = st[0].arrival_next
    arriving = a < st[0].arrival_end
    if arriving and (st[0].force or _before(arrival_ms[a], ARRIVAL, st[0].arrival_seq, h_time,
                                            h_order, h_seq)):
        if a >= st[0].arrival_limit:
            return HORIZON
        st[0].force = 0
        return ARRIVE
    if not arriving and _first(keys_t, keys_o, keys_s, -1) < 0:
        return IDLE
    return HORIZON


@njit
def worker_horizon(keys_t, keys_o, keys_s, k, st, arrival_ms, h_time, h_order, h_seq, others):
    """Worker k's horizon: the outside one, the next arrival's instant (key
    `(arrival_ms[a], ARRIVAL, 0)`: the events at it that end a pass run
    before it, the decisions after it) and, with `others`, the first of the
    other workers' events."""
    t, order, seq = h_time, h_order, h_seq
    a = st[0].arrival_next
    if a < st[0].arrival_end and _before(arrival_ms[a], ARRIVAL, 0, t, order, seq):
        t, order, seq = arrival_ms[a], ARRIVAL, 0
    if others:
        j = _first(keys_t, keys_o, keys_s, k)
        if j >= 0 and _before(keys_t[j], keys_o[j], keys_s[j], t, order, seq):
            t, order, seq = keys_t[j], keys_o[j], keys_s[j]
    return t, order, seq


def next_key(keys_t, keys_o, keys_s, st, arrival_ms):
    """The first of the workers' next events and the next arrival a loop
    over workers takes (`st`: its state), or None: nothing pending."""
    keys = [(float(keys_t[k]), int(keys_o[k]), int(keys_s[k]))
            for k in range(len(keys_t)) if keys_t[k] != np.inf]
    a = int(st[0]["arrival_next"])
    if a < st[0]["arrival_end"]:
        keys.append((float(arrival_ms[a]), ARRIVAL, int(st[0]["arrival_seq"])))
    return min(keys) if keys else None


def pool_arrays(ranks: routing.RankArrays, policy, table, extra_tokens=0):
    """A pool's arrays for a loop's routing (`_route`) and queueing
    (`_queue`): its ranks' (`ranks`), the policy, a count of requests routed
    to each rank, the request table's block identities, the cached-prefix
    scratch for a prompt of the table's with `extra_tokens` more, and
    the router's knobs and state (`RankArrays.router`, None for a rule that keeps none)."""
    prompts = table.R["num_prompt_tokens"]
    longest = (int(prompts.max()) if len(prompts) else 1) + extra_tokens
    scratch = np.zeros(max(1, longest // ranks.block_size), dtype=np.int64)
    return (int(policy), ranks.rr, ranks.rank_set, np.zeros(len(ranks.ranks), dtype=np.int64),
            ranks.num_gpu_blocks, ranks.num_workers, ranks.dp, ranks.block_size,
            ranks.enable_caching, table.idents, scratch, ranks.router)


ROUTED, POOL_DP = 3, 6  # (fields of `pool_arrays`)


def run_reporting(loop, cores, ps, call):
    """Call a compiled loop over workers (`call()`, its state record `ps[0]`,
    `LOOP_DTYPE`) until it returns for none of them, and return what it last
    returned. The event loop's sequence counter goes in (`seq`) and comes
    back out; when the loop returns for worker `from_worker`, that worker's
    core reports it (`EngineCore.report`), and when the core says so the
    next call carries on with that worker (`carry_on`)."""
    st = ps[0]
    while True:
        st["seq"] = loop.seq
        result = call()
        loop.seq = int(st["seq"])
        k = int(st["from_worker"])
        if k < 0:
            return result
        if cores[k].report(result):
            st["carry_on"] = k


@njit
def _route(pool, R, i, num_prompt_tokens, pinned, now, admit=True):
    """The rank `j` of `pool` (`pool_arrays`) that request i
    (row i of `R`), with `num_prompt_tokens`, goes to at `now`
    (engine/routing.py `route`; `admit` False: rejected wherever it goes),
    counted as routed there."""
    (policy, rr, rank_set, routed, num_gpu_blocks, num_workers, dp, block_size, enable_caching,
     idents, scratch, kvr) = pool
    off = R[i].block_offset
    j = routing.route(policy, rr, rank_set, num_gpu_blocks, num_workers, dp, pinned,
                      idents[off:off + R[i].block_capacity], scratch, num_prompt_tokens,
                      block_size, enable_caching, kvr, i, admit, now)
    routed[j] += 1  # routed here, rejected or not
    return j


@njit
def _queue(pool, w, keys_t, keys_o, keys_s, ps, slot, j, R, i, num_prompt_tokens, now):
    """Request i arrives at rank `j` of `pool` (worker `w`, the loop's worker
    `slot`) now (pass_loop `add_request`, as the worker's core queues it);
    False if it can never fit there. A worker it wakes decides at this
    instant."""
    ws = w.ws
    ws[0].seq = ps[0].seq
    if not add_request(routing.rank_at(pool[2], j), ws, i, num_prompt_tokens, now):
        return False
    if ws[0].seq != ps[0].seq:  # it woke the engine: a decision at this instant
        ps[0].seq = ws[0].seq
        offer_key(keys_t, keys_o, keys_s, slot, now, DECIDE, ps[0].seq)
    return True


@njit
def arrive(workers, w0, keys_t, keys_o, keys_s, st, pool, arrival_ms, arrival_req, pinned,
           never_fits, worker_of, rank_of, status, rejected_code):
    """The next arrival a loop over workers takes (`st`: its state), as the
    replay's `_on_arrival` would take it: routed to a rank of `pool` (the
    workers at `workers`, `bundle_at` them, `w0` the first; where it went
    into `worker_of`, `rank_of`), and queued there unless it can never fit
    there, or `never_fits[i]` (a disaggregated prefill pool's request whose
    prompt and first token can never fit the decode pool): rejected
    (`status[i] = rejected_code`)."""
    R = w0.R
    i = next_arrival(R, st, arrival_ms, arrival_req)
    now = R[i].arrival_time
    dp = pool[POOL_DP]
    j = _route(pool, R, i, R[i].num_prompt_tokens, pinned[i], now, not never_fits[i])
    k = j // dp
    worker_of[i] = k
    rank_of[i] = j % dp
    w = bundle_at(workers, k, w0)
    w.ws[0].now_ms = now  # its last event (the run ends at the last of any)
    if never_fits[i] or not _queue(pool, w, keys_t, keys_o, keys_s, st, k, j, R, i,
                                   R[i].num_prompt_tokens, now):
        status[i] = rejected_code
        st[0].num_done += 1
