"""Reading traces of sessions and agent graphs (README, "Workloads").

- `mooncake` rows with `session_id`: the turns of a session in file order; a
  first turn has a `timestamp` and no delay; a later turn waits `delay` (or
  `delay_ms`) after the previous turn's last token — without one, the gap
  between its `timestamp` and the previous turn's, else 0. Each row carries
  its whole prompt's `hash_ids`. Rows without `session_id` are one-turn
  sessions.
- `mooncake-delta`: the same rows, but a later turn's `input_length` and
  `hash_ids` are only its new tokens; its prompt is the previous prompt plus
  the previous output plus those.
- `agentic_mooncake`: rows with a unique `request_id`, `wait_for` (ids of
  requests it waits for; none: a root, which has a `timestamp`), `delay` /
  `delay_ms` and `tool_wait_ms`; a request is ready at the latest finish of
  its dependencies plus both. The versioned form NVIDIA Dynamo writes is read
  too: a first line `{"schema": "dynamo.agentic_mooncake", "version": 2,
  "block_size": ...}`, then rows with `not_before_ms` (a root's arrival) and
  `dependencies: [{request_id, trigger: completion, delay_ms, relation}]`, each
  dependency with its own delay.

Every error names the file and line.
"""

import itertools
import json
import math

import attrs
import numpy as np

from servesim.errors import InputError
from servesim.workload import sessions as ss
from servesim.workload import workload as wl

SESSION_FIELDS = ("session_id", "delay", "delay_ms")


def load_session_trace(path, fmt: str, tbs: int, limit=None) -> wl.Workload:
    """A session workload from a Mooncake-style trace in format `fmt`
    (`mooncake`, `mooncake-delta` or `agentic_mooncake`). Arrivals of roots
    are their raw timestamps; other requests' are NaN (fixed during the run)."""
    wl._check_block_size(tbs)
    with wl._open_text(path) as f:
        try:
            rows, beyond = _read_rows(f, str(path), limit)
        except wl._READ_ERRORS as e:
            raise wl._corrupt(path, e) from None
    path = str(path)
    base = 1  # line of rows[0]
    if fmt == "agentic_mooncake" and rows and rows[0].get("schema") is not None:
        _check_header(rows.pop(0), path, tbs)
        rows = [_v2_row(obj, path, k + 2) for k, obj in enumerate(rows)]
        base = 2
    if not rows:
        raise InputError(f"{path}: empty trace: no requests" + wl._limit_note(limit))
    delta = fmt == "mooncake-delta"
    n = len(rows)
    input_length = np.zeros(n, dtype=np.int64)
    output_length = np.zeros(n, dtype=np.int64)
    hashes = []
    for i, obj in enumerate(rows):
        il, ol, h = _lengths(obj, path, i + base, tbs, delta)
        input_length[i] = il
        output_length[i] = ol
        hashes.append(h)
    request_ids = [str(i) for i in range(n)]
    priority = np.zeros(n, dtype=np.int64)
    dp_rank = np.full(n, -1, dtype=np.int64)
    if base == 1:
        wl._apply_optional_fields(dict(enumerate(rows)), path, request_ids, priority, dp_rank)
    else:
        _v2_fields(rows, path, request_ids, priority)
    # speculative decoding's per-pass acceptance, as the plain reader takes it
    accepted = wl._accepted_lists(dict(enumerate(rows)), path, n, base)
    arrival = np.full(n, math.nan)
    if fmt == "agentic_mooncake":
        plan = _graph(rows, path, request_ids, arrival, base)
    else:
        plan = _chains(rows, path, request_ids, arrival)
    if delta:
        input_length, hashes, start = ss.accumulate_deltas(
            plan.session.tolist(), input_length, output_length, hashes, tbs, path,
            list(range(1, n + 1)))
        plan = ss.chain_plan(plan.session_ids, plan.session, plan.turn, plan.delay_ms, start)
    if beyond is not None:
        plan = _mark_truncated(plan, rows, request_ids, fmt, *beyond)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum([len(h) for h in hashes], out=offsets[1:])
    flat = [x for h in hashes for x in h]
    return wl.Workload(
        request_ids=request_ids, arrival_ms=arrival, input_length=input_length,
        output_length=output_length, priority=priority, dp_rank=dp_rank,
        hash_flat=wl._hash_array(flat, offsets, path), hash_offsets=offsets,
        trace_block_size=tbs, source=path, sessions=plan, first_line=base, **accepted)


def _read_rows(f, path: str, limit) -> tuple:
    """`(rows, beyond)`: the JSON objects of the trace, one per line
    (trailing blank lines only), and when `limit` stopped the reading before
    the end, what the rows after it say of sessions (`_beyond_the_limit`),
    else None."""
    rows = []
    blank = 0
    for line in f:
        if limit is not None and len(rows) == limit:
            return rows, _beyond_the_limit(line, f)
        if not line.strip():
            blank = blank or len(rows) + 1
            continue
        if blank:
            raise wl._blank_error(path, blank)
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise InputError(f"{path}:{len(rows) + 1}: malformed JSON ({e}); "
                             "each line must be one JSON object") from None
        if not isinstance(obj, dict):
            raise InputError(f"{path}:{len(rows) + 1}: a row must be a JSON object, "
                             f"got {type(obj).__name__}")
        rows.append(obj)
    return rows, None


def _beyond_the_limit(first, f) -> tuple:
    """`(session ids, request ids waited for)` of the rows after the limit,
    from `first` (the first such line) on: all that tells whether a session
    replayed goes on past the limit. The rows are not replayed, so they are
    not checked either (a line that does not parse says nothing)."""
    sessions, waited = set(), set()
    for line in itertools.chain((first,), f):
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if not isinstance(obj, dict):
            continue
        sid = obj.get("session_id")
        if type(sid) in (str, int):
            sessions.add(str(sid))
        deps = obj.get("wait_for")
        if type(deps) is list:
            waited.update(d for d in deps if type(d) is str)
        deps = obj.get("dependencies")
        if type(deps) is list:
            waited.update(d.get("request_id") for d in deps if isinstance(d, dict))
    return sessions, waited


def _mark_truncated(plan, rows, request_ids, fmt, later_sessions, waited) -> ss.SessionPlan:
    """`plan` with the sessions that go on past the limit marked `truncated`:
    a later row carries their session_id or (an agent graph) waits for one of
    their requests. A row without a session_id is a session of its own in a
    chat trace: nothing continues it."""
    cut = np.zeros(len(plan.session_ids), dtype=bool)
    if fmt == "agentic_mooncake":
        for k, name in enumerate(plan.session_ids):
            cut[k] = name in later_sessions
        for i, rid in enumerate(request_ids):
            if rid in waited:
                cut[plan.session[i]] = True
    else:
        for i, obj in enumerate(rows):
            sid = obj.get("session_id")
            if sid is not None and str(sid) in later_sessions:
                cut[plan.session[i]] = True
    return attrs.evolve(plan, truncated=cut) if cut.any() else plan


def _lengths(obj, path, line, tbs, delta):
    """`input_length`, `output_length`, `hash_ids` of a row. Under
    `mooncake-delta` a later turn's input_length may be 0 (nothing new) and a
    negative one is reported by `accumulate_deltas` as a shrinking prompt."""
    at = f"{path}:{line}:"
    for key in ("input_length", "output_length", "hash_ids"):
        if key not in obj:
            raise InputError(f"{at} missing field '{key}'")
    il, ol, h = obj["input_length"], obj["output_length"], obj["hash_ids"]
    low = -(2**62) if delta else 1
    if type(il) is not int or il < low:
        raise InputError(f"{at} input_length must be an integer >= 1, got {il!r}")
    if type(ol) is not int or ol < 1:
        raise InputError(f"{at} output_length must be an integer >= 1, got {ol!r}")
    if type(h) is not list:
        raise InputError(f"{at} hash_ids must be a list of integers, got {type(h).__name__}")
    want = -(-max(il, 0) // tbs)
    if len(h) != want:
        raise InputError(f"{at} hash_ids has {len(h)} ids but ceil(input_length {il} / "
                         f"trace_block_size {tbs}) = {want}; each id covers trace_block_size tokens")
    return il, ol, h


def _number(obj, key, at, default=None):
    """An optional time field: a finite number >= 0 (ms)."""
    v = obj.get(key, default)
    if v is None:
        return None
    if type(v) not in (int, float) or not math.isfinite(v):
        raise InputError(f"{at} {key} must be a finite number (ms), got {v!r}")
    if v < 0:
        raise InputError(f"{at} negative {key} {v!r}; a delay is ms >= 0")
    return float(v)


def _delay(obj, at):
    """`delay` or its alias `delay_ms` (None when neither is given)."""
    a, b = _number(obj, "delay", at), _number(obj, "delay_ms", at)
    if a is not None and b is not None and a != b:
        raise InputError(f"{at} delay {a!r} and delay_ms {b!r} disagree; give one")
    return a if a is not None else b


def _timestamp(obj, at, what):
    if "timestamp" not in obj:
        raise InputError(f"{at} {what} needs a timestamp (ms)")
    return _number(obj, "timestamp", at)


def _session_name(obj, at):
    sid = obj.get("session_id")
    if sid is None:
        return None
    if type(sid) not in (str, int) or isinstance(sid, bool) or sid == "":
        raise InputError(f"{at} session_id must be a non-empty string or an integer, got {sid!r}")
    return str(sid)


def _chains(rows, path, request_ids, arrival) -> ss.SessionPlan:
    """Chat sessions: turns in file order, each after the one before."""
    names = []
    session = np.zeros(len(rows), dtype=np.int64)
    turn = np.zeros(len(rows), dtype=np.int64)
    delay = np.zeros(len(rows))
    index = {}  # session key -> (index, turns so far, last timestamp)
    for i, obj in enumerate(rows):
        at = f"{path}:{i + 1}:"
        sid = _session_name(obj, at)
        key = ("s", sid) if sid is not None else ("r", i)
        d = _delay(obj, at)
        if key not in index:
            if d:
                raise InputError(f"{at} delay {d!r} on the first turn of session "
                                 f"{sid!r}; a first turn arrives at its timestamp")
            ts = _timestamp(obj, at, "the first turn of a session")
            arrival[i] = ts
            index[key] = [len(names), 1, ts]
            names.append(sid if sid is not None else request_ids[i])
            session[i] = index[key][0]
            continue
        entry = index[key]
        ts = _number(obj, "timestamp", at)
        if d is None:
            d = 0.0
            if ts is not None and entry[2] is not None:
                d = ts - entry[2]
                if d < 0:
                    raise InputError(f"{at} timestamp {ts!r} is before the previous turn's "
                                     f"{entry[2]!r} of session {sid!r}; give a delay instead")
        session[i], turn[i], delay[i] = entry[0], entry[1], d
        entry[1] += 1
        if ts is not None:
            entry[2] = ts
    return ss.chain_plan(names, session, turn, delay)


def _graph(rows, path, request_ids, arrival, base=1) -> ss.SessionPlan:
    """An agent graph: `wait_for` edges between `request_id`s (rows of the
    versioned form carry their per-dependency delays in `_edge_delays`)."""
    wait_for, names, delay = [], [], np.zeros(len(rows))
    edges = [obj.get("_edge_delays") for obj in rows] if base == 2 else None
    for i, obj in enumerate(rows):
        at = f"{path}:{i + base}:"
        if "request_id" not in obj:
            raise InputError(f"{at} missing field 'request_id' (agentic_mooncake rows are "
                             "named so that wait_for can refer to them)")
        deps = obj.get("wait_for") or []
        if type(deps) is not list or not all(type(x) is str for x in deps):
            raise InputError(f"{at} wait_for must be a list of request_id strings, got {deps!r}")
        d = (_delay(obj, at) or 0.0)
        tool = _number(obj, "tool_wait_ms", at, 0.0)
        if not deps:
            if d or tool:
                raise InputError(f"{at} a root request (no wait_for) arrives at its "
                                 "timestamp: it takes no delay or tool_wait_ms")
            arrival[i] = _timestamp(obj, at, "a root request (no wait_for)")
        wait_for.append(deps)
        names.append(_session_name(obj, at))
        delay[i] = d + tool
    return ss.graph_plan(path, list(range(base, len(rows) + base)), request_ids, names, wait_for,
                         delay, edges)


# -------------------------------------------- Dynamo's versioned agentic rows


def _check_header(header, path, tbs):
    at = f"{path}:1:"
    if header.get("schema") != "dynamo.agentic_mooncake" or header.get("version") != 2:
        raise InputError(f"{at} unknown header {header.get('schema')!r} version "
                         f"{header.get('version')!r}; expected dynamo.agentic_mooncake version 2")
    if header.get("block_size") != tbs:
        raise InputError(f"{at} the header's block_size {header.get('block_size')!r} is not "
                         f"workload.trace_block_size ({tbs}); set trace_block_size to it")


def _v2_row(obj, path, line):
    """A versioned row in the shape of the plain one: `timestamp` from
    `not_before_ms` on a root, `wait_for` and the per-dependency delays from
    `dependencies` (only `trigger: completion`)."""
    at = f"{path}:{line}:"
    deps = obj.get("dependencies") or []
    if type(deps) is not list or not all(isinstance(d, dict) for d in deps):
        raise InputError(f"{at} dependencies must be a list of mappings, got {deps!r}")
    row = {k: v for k, v in obj.items() if k not in ("dependencies", "not_before_ms")}
    start = _number(obj, "not_before_ms", at, 0.0)
    if not deps:
        row["timestamp"] = start
    elif start:
        raise InputError(f"{at} not_before_ms {start!r} on a request with dependencies is not "
                         "supported; it arrives after them")
    waits = []
    for d in deps:
        if d.get("trigger") != "completion":
            raise InputError(f"{at} dependency trigger {d.get('trigger')!r} is not supported "
                             "(only completion: after the dependency's last token)")
        if d.get("relation") not in ("sequence", "spawn", "join"):
            raise InputError(f"{at} dependency relation {d.get('relation')!r} is not supported "
                             "(sequence, spawn, join)")
        if type(d.get("request_id")) is not str:
            raise InputError(f"{at} a dependency needs a request_id string, got {d!r}")
        waits.append(_number(d, "delay_ms", at, 0.0))
    if deps:
        row["wait_for"] = [d["request_id"] for d in deps]
    row["_edge_delays"] = waits
    return row


def _v2_fields(rows, path, request_ids, priority):
    """`request_id` (unique) and `priority` of versioned rows (line = row + 2)."""
    seen = {}
    for i, obj in enumerate(rows):
        at = f"{path}:{i + 2}:"
        rid = obj.get("request_id")
        if type(rid) is not str or not rid:
            raise InputError(f"{at} request_id must be a non-empty string, got {rid!r}")
        if rid in seen:
            raise InputError(f"{at} duplicate request_id {rid!r} (first on line {seen[rid]}); "
                             "request ids must be unique")
        seen[rid] = i + 2
        request_ids[i] = rid
        p = obj.get("priority", 0)
        if type(p) is not int:
            raise InputError(f"{at} priority must be an integer, got {p!r}")
        priority[i] = p
