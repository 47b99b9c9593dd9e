"""Sessions and agent graphs: requests whose arrival waits for other requests.

A :class:`SessionPlan` rides on a :class:`~servesim.workload.workload.Workload`
(its `sessions`; None for a workload of independent requests). Every request
belongs to one session and has a turn index in it; it may depend on earlier
requests. A request without dependencies (a root: a session's first turn, an
agent graph's root) arrives at its trace `timestamp`; any other request is
ready at the latest finish among its dependencies — the instant its last
token reaches the client — plus its `delay_ms` (think time, plus an agent's
tool wait). A chat session is the chain turn 0 → turn 1 → ...

Under `mooncake-delta` (and for synthetic sessions) a later turn's prompt is
the previous prompt, plus the previous output, plus its new tokens: the
engine blocks of a session's token stream past its first prompt get
identities of the session (`session_block_identities`), so a turn's output
blocks, cached when it finishes, are the prefix the next turn hits.

`SessionArrivals` is the driver's side: it schedules roots, and at each
request's end the requests it releases (closed loop: a session holds its slot
until all its requests are done, then the next session starts).
"""

import heapq
import math

import attrs
import numpy as np

from servesim.engine.events import ARRIVAL, RELEASED
from servesim.errors import InputError


@attrs.frozen(eq=False)
class SessionPlan:
    """Per request (workload order): `session` (index into `session_ids`),
    `turn` (0 for a session's first request; in an agent graph the depth: 1 +
    the largest turn among its dependencies), `delay_ms` (after the latest
    dependency's finish; 0 for roots), and its dependencies
    `dep_flat[dep_offsets[i]:dep_offsets[i+1]]` (request indices).
    `stream_start[i]` >= 0 for a request of an accumulating (delta) session:
    the length of its session's first prompt, the tokens whose identities
    come from the trace's hash ids; -1 otherwise. `dep_delay_ms` (per entry
    of `dep_flat`, None: all 0) delays each dependency's finish on its own
    (Dynamo's versioned agentic rows): a request is ready at the latest
    `finish + dep_delay_ms` among its dependencies, plus `delay_ms`.
    `truncated` (per session, None: none) marks the sessions `workload.limit`
    cut short: requests of theirs beyond the limit are not replayed."""

    session_ids: list
    session: np.ndarray  # int64
    turn: np.ndarray  # int64
    delay_ms: np.ndarray  # float64
    dep_offsets: np.ndarray  # int64, len n + 1
    dep_flat: np.ndarray  # int64
    stream_start: np.ndarray  # int64
    dep_delay_ms: np.ndarray | None = None  # float64, len(dep_flat)
    truncated: np.ndarray | None = None  # bool, per session

    def roots(self) -> np.ndarray:
        return np.flatnonzero(np.diff(self.dep_offsets) == 0)


def chain_plan(session_ids, session, turn, delay_ms, stream_start=None) -> SessionPlan:
    """The plan of chat sessions: each turn depends on the turn before it of
    its session (requests in workload order)."""
    n = len(session)
    last = {}
    deps = np.full(n, -1, dtype=np.int64)
    for i, s in enumerate(session.tolist()):
        if s in last:
            deps[i] = last[s]
        last[s] = i
    has = deps >= 0
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(has, out=offsets[1:])
    if stream_start is None:
        stream_start = np.full(n, -1, dtype=np.int64)
    return SessionPlan(session_ids=list(session_ids), session=np.asarray(session, dtype=np.int64),
                       turn=np.asarray(turn, dtype=np.int64),
                       delay_ms=np.asarray(delay_ms, dtype=np.float64),
                       dep_offsets=offsets, dep_flat=deps[has], stream_start=stream_start)


def scale_delays(plan: SessionPlan, speedup: float) -> SessionPlan:
    """`speedup` divides think times and tool waits, as it divides timestamps."""
    if speedup == 1:
        return plan
    edges = plan.dep_delay_ms
    return attrs.evolve(plan, delay_ms=plan.delay_ms / float(speedup),
                        dep_delay_ms=None if edges is None else edges / float(speedup))


def head_plan(plan: SessionPlan, n: int) -> SessionPlan:
    """The plan of the first `n` requests (a chain's dependencies come before
    it, so they stay within the first `n`; sessions left empty are dropped,
    those with requests beyond `n` marked `truncated`)."""
    end = int(plan.dep_offsets[n])
    kept, session = np.unique(plan.session[:n], return_inverse=True)
    truncated = np.isin(kept, plan.session[n:])
    if plan.truncated is not None:
        truncated |= plan.truncated[kept]
    return SessionPlan(session_ids=[plan.session_ids[k] for k in kept.tolist()],
                       session=session.astype(np.int64), turn=plan.turn[:n].copy(),
                       delay_ms=plan.delay_ms[:n].copy(),
                       dep_offsets=plan.dep_offsets[:n + 1].copy(),
                       dep_flat=plan.dep_flat[:end].copy(),
                       stream_start=plan.stream_start[:n].copy(),
                       dep_delay_ms=None if plan.dep_delay_ms is None
                       else plan.dep_delay_ms[:end].copy(),
                       truncated=truncated if truncated.any() else None)


# ----------------------------------------------------------------- delta prompts


def accumulate_deltas(session, delta_length, output_length, delta_hashes, tbs, path=None,
                      lines=None):
    """Cumulative prompts of accumulating sessions: turn k's prompt is turn
    k-1's prompt + its output + `delta_length[k]` new tokens. Returns
    `(input_length, hash_lists, stream_start)`: a first turn keeps its own
    hash ids; a later turn gets its first turn's ids followed by fresh ones
    (what follows the first prompt is the session's own stream, identified by
    `session_block_identities`, so those ids only fill the count). A first
    turn of fewer than 1 token or a negative delta is an InputError naming
    its line."""
    n = len(session)
    prompt = np.zeros(n, dtype=np.int64)
    start = np.zeros(n, dtype=np.int64)
    hashes = []
    first_of = {}  # session -> (first prompt, its hash ids)
    last = {}  # session -> (prompt, output) of its latest turn
    fresh = max((max(h) for h in delta_hashes if h), default=0) + 1
    for i in range(n):
        s = session[i]
        d = int(delta_length[i])
        at = f"{path}:{lines[i]}:" if path is not None else f"request {i}:"
        if s not in first_of:
            if d < 1:  # vLLM's InputProcessor: "The decoder prompt cannot be empty"
                raise InputError(
                    f"{at} input_length {d}: a session's first turn is its whole prompt, at least "
                    f"1 token (vLLM refuses an empty prompt)")
            prompt[i] = d
            start[i] = d
            hashes.append(list(delta_hashes[i]))
            first_of[s] = (d, hashes[i])
        else:
            previous, out = last[s]
            first, first_ids = first_of[s]
            if d < 0:
                raise InputError(
                    f"{at} input_length {d} would shrink the session's prompt "
                    f"(mooncake-delta rows carry only the new tokens, an integer >= 0)")
            prompt[i] = previous + out + d
            start[i] = first
            need = -(-int(prompt[i]) // tbs) - len(first_ids)
            hashes.append(first_ids + list(range(fresh, fresh + need)))
            fresh += need
        last[s] = (int(prompt[i]), int(output_length[i]))
    return prompt, hashes, start


def session_block_identities(plan: SessionPlan, idents, ident_offsets, num_identities,
                             input_length, max_tokens, block_size, hash_lookahead=0):
    """Give the blocks of each accumulating session's token stream, past its
    first prompt's full blocks, identities of the session: block j of every
    turn of a session that holds only tokens of that turn's prompt and output
    is the same block (the next turn's prompt starts with exactly those
    tokens). Blocks the turn never fills keep their unique identities; with
    speculative decoding's `hash_lookahead` a block counts as full only once
    the token after it is known too (see `prefix.block_identities`).
    Returns `(idents, num_identities)`."""
    start = plan.stream_start
    rows = np.flatnonzero(start >= 0)
    if not len(rows):
        return idents, num_identities
    first = start[rows] // block_size
    full = (input_length[rows] + max_tokens[rows] - hash_lookahead) // block_size
    capacity = ident_offsets[rows + 1] - ident_offsets[rows]
    end = np.minimum(full, capacity)
    sessions = plan.session[rows]
    span = np.zeros(len(plan.session_ids), dtype=np.int64)
    np.maximum.at(span, sessions, np.maximum(end - first, 0))
    base = np.zeros(len(span), dtype=np.int64)
    np.cumsum(span[:-1], out=base[1:])
    total = num_identities + int(span.sum())
    if total >= 2**31 and idents.dtype != np.int64:
        idents = idents.astype(np.int64)
    for r, b, e, s in zip(rows.tolist(), first.tolist(), end.tolist(), sessions.tolist()):
        if e > b:
            o = int(ident_offsets[r])
            idents[o + b:o + e] = num_identities + base[s] + np.arange(e - b)
    return idents, total


# ------------------------------------------------------------------ agent graphs


def graph_plan(path, lines, request_ids, session_names, wait_for, delay_ms,
               edge_delays=None) -> SessionPlan:
    """The plan of an agent graph (`agentic_mooncake`): `wait_for[i]` names
    request i's dependencies by request id. Unknown ids, a dependency on the
    request itself or a cycle are input errors naming the line; so is a
    dependency in another session (a session is what a closed loop counts).
    A request's session is its `session_id`, else its first dependency's,
    else (a root) its own id. `edge_delays[i]` (optional) are the delays of
    request i's dependencies, in `wait_for` order."""
    index = {rid: i for i, rid in enumerate(request_ids)}
    n = len(request_ids)
    deps = []
    for i in range(n):
        row = []
        for rid in wait_for[i]:
            j = index.get(rid)
            if j is None:
                raise InputError(f"{path}:{lines[i]}: wait_for names unknown request_id {rid!r}")
            if j == i:
                raise InputError(f"{path}:{lines[i]}: request {rid!r} waits for itself")
            row.append(j)
        deps.append(row)
    order = _topological_order(deps, path, lines, request_ids)
    names = list(session_names)
    for i in order:  # dependencies first, so a dependency's session is known
        if names[i] is None:
            names[i] = names[deps[i][0]] if deps[i] else request_ids[i]
    session_index = {}
    session = np.empty(n, dtype=np.int64)
    for i in range(n):
        session[i] = session_index.setdefault(names[i], len(session_index))
    turn = np.zeros(n, dtype=np.int64)
    for i in order:
        for j in deps[i]:
            if session[j] != session[i]:
                raise InputError(
                    f"{path}:{lines[i]}: wait_for {request_ids[j]!r} is in session "
                    f"{names[j]!r}, not this request's {names[i]!r}; dependencies stay within a session")
            turn[i] = max(turn[i], turn[j] + 1)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum([len(d) for d in deps], out=offsets[1:])
    flat = np.array([j for d in deps for j in d], dtype=np.int64)
    edges = None
    if edge_delays is not None:
        edges = np.array([x for d in edge_delays for x in d], dtype=np.float64)
    return SessionPlan(session_ids=list(session_index), session=session, turn=turn,
                       delay_ms=np.asarray(delay_ms, dtype=np.float64), dep_offsets=offsets,
                       dep_flat=flat, stream_start=np.full(n, -1, dtype=np.int64),
                       dep_delay_ms=edges)


def _topological_order(deps, path, lines, request_ids):
    """Requests with every dependency before them (Kahn's algorithm, ties in
    file order); a cycle is an input error naming one of its lines."""
    n = len(deps)
    waiting = [len(d) for d in deps]
    children = [[] for _ in range(n)]
    for i, d in enumerate(deps):
        for j in d:
            children[j].append(i)
    ready = [i for i in range(n) if waiting[i] == 0]
    order = []
    k = 0
    while k < len(ready):
        i = ready[k]
        k += 1
        order.append(i)
        for c in children[i]:
            waiting[c] -= 1
            if waiting[c] == 0:
                ready.append(c)
    if len(order) < n:
        stuck = min(i for i in range(n) if waiting[i] > 0)
        raise InputError(f"{path}:{lines[stuck]}: wait_for forms a cycle through request "
                         f"{request_ids[stuck]!r}; an agent graph must be acyclic")
    return order


# ------------------------------------------------------------------ the driver side


class SessionArrivals:
    """Arrivals that depend on finishes. Open loop: roots arrive at their
    `arrival_ms`, one root event in the loop at a time, in arrival order
    (ties in workload order). Closed loop (`concurrency` N): the first N
    sessions (in the order of their first request) start at 0 and each
    session whose requests are all done starts the next at that instant; a
    started session's roots arrive at once. A request whose dependencies are
    done arrives at the latest of their finishes plus its delay; sent at a
    release instant (no delay, or a session started), it arrives after every
    decision at that instant (order RELEASED, engine/events.py).
    `arrival_ms` (the driver's array) gets every send time when it is
    fixed; `on_arrival(i)` is the driver's arrival handler. `frontend_ms`
    (None: none) delays each request's arrival at the engine after it is sent
    (`engine.frontend`); a delayed request arrives as an outside one (order
    ARRIVAL), and roots arrive in the order of their engine arrival.

    `horizon()` bounds the compiled runs of passes (engine/pass_loop.py): no
    arrival can come before the earliest arrival already scheduled, nor
    before the next event of any worker (where a finish could happen) plus
    the smallest delay a finish waits before it releases a request (0 in a
    closed loop: a session's end starts the next at once)."""

    def __init__(self, plan: SessionPlan, arrival_ms, concurrency, loop, on_arrival,
                 frontend_ms=None):
        self.plan = plan
        self.arrival_ms = arrival_ms
        self.frontend_ms = frontend_ms
        self.loop = loop
        self.on_arrival = on_arrival
        self.concurrency = concurrency
        n = len(plan.session)
        self.waiting = np.diff(plan.dep_offsets).astype(np.int64)
        self.ready_ms = np.full(n, -math.inf)
        order = np.argsort(plan.dep_flat, kind="stable")
        dependents = np.repeat(np.arange(n, dtype=np.int64), np.diff(plan.dep_offsets))
        self.child_flat = dependents[order]
        edges = plan.dep_delay_ms if plan.dep_delay_ms is not None else np.zeros(len(dependents))
        self.child_delay = edges[order]  # the delay of each (dependency, child) edge
        self.child_offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(plan.dep_flat, minlength=n), out=self.child_offsets[1:])
        self.pending = []  # heap: times of the arrival events in the loop
        waits = plan.delay_ms[dependents] + edges  # each edge's delay before its child arrives
        self.min_delay = 0.0 if concurrency is not None or not len(waits) else float(waits.min())
        self.left = np.bincount(plan.session, minlength=len(plan.session_ids)).astype(np.int64)
        roots = plan.roots()
        if concurrency is None:
            at = arrival_ms[roots] if frontend_ms is None else arrival_ms[roots] + frontend_ms[roots]
            self.roots = roots[np.argsort(at, kind="stable")]
        else:
            self.roots = roots  # workload order; grouped per session below
            first = np.full(len(plan.session_ids), n, dtype=np.int64)
            np.minimum.at(first, plan.session, np.arange(n, dtype=np.int64))
            self.session_order = np.argsort(first, kind="stable")
            self.session_roots = [[] for _ in plan.session_ids]
            for r in roots.tolist():
                self.session_roots[plan.session[r]].append(r)
            self.next_session = 0

    def start(self):
        if self.concurrency is None:
            if len(self.roots):
                self._schedule_root(0)
            return
        for _ in range(min(self.concurrency, len(self.plan.session_ids))):
            self._start_next_session()

    def horizon(self) -> float:
        t = self.loop.next_time() + self.min_delay
        return min(t, self.pending[0]) if self.pending else t

    def _schedule(self, t, handler, arg, order=ARRIVAL):
        heapq.heappush(self.pending, t)
        self.loop.schedule(t, order, handler, arg)

    def _engine_ms(self, i) -> float:
        """When request i, sent at `arrival_ms[i]`, reaches the engine."""
        t = float(self.arrival_ms[i])
        return t if self.frontend_ms is None else t + float(self.frontend_ms[i])

    def _send(self, i, t, order):
        """Request i is sent at `t`: its arrival at the engine, at `order`
        unless the frontend delays it past `t` (then ARRIVAL)."""
        self.arrival_ms[i] = t
        at = self._engine_ms(i)
        self._schedule(at, self._on_request, i, order if at == t else ARRIVAL)

    def _on_request(self, i):
        heapq.heappop(self.pending)
        self.on_arrival(i)

    def _schedule_root(self, k):
        i = int(self.roots[k])
        self._schedule(self._engine_ms(i), self._on_root, k)

    def _on_root(self, k):
        heapq.heappop(self.pending)
        if k + 1 < len(self.roots):
            self._schedule_root(k + 1)
        self.on_arrival(int(self.roots[k]))

    def _start_next_session(self):
        if self.next_session >= len(self.session_order):
            return
        s = int(self.session_order[self.next_session])
        self.next_session += 1
        now = self.loop.now
        for i in self.session_roots[s]:
            self._send(i, now, RELEASED)

    def done(self, i, finish_ms):
        """Request i is done (finished at `finish_ms`, the client's last
        token; or rejected / taken out now): release what waited for it."""
        plan = self.plan
        lo, hi = self.child_offsets[i], self.child_offsets[i + 1]
        for c, wait in zip(self.child_flat[lo:hi].tolist(), self.child_delay[lo:hi].tolist()):
            if finish_ms + wait > self.ready_ms[c]:
                self.ready_ms[c] = finish_ms + wait
            self.waiting[c] -= 1
            if self.waiting[c] == 0:
                t = float(self.ready_ms[c] + plan.delay_ms[c])
                # sent at the release instant: after every decision at it
                self._send(c, t, RELEASED if t == finish_ms else ARRIVAL)
        s = plan.session[i]
        self.left[s] -= 1
        if self.left[s] == 0 and self.concurrency is not None:
            self._start_next_session()
