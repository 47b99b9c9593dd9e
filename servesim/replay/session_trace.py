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
  its dependencies plus both.

Every error names the file and line.
"""

import json
import math

import numpy as np

from servesim.errors import InputError
from servesim.replay import sessions as ss
from servesim.replay import workload as wl

SESSION_FORMATS = ("mooncake-delta", "agentic_mooncake")
SESSION_FIELDS = ("session_id", "delay", "delay_ms")


def load_session_trace(path, fmt: str, tbs: int, limit=None) -> wl.Workload:
    """A session workload from a Mooncake-style trace in format `fmt`
    (`mooncake`, `mooncake-delta` or `agentic_mooncake`). Arrivals of roots
    are their raw timestamps; other requests' are NaN (fixed during the run)."""
    wl._check_block_size(tbs)
    with wl._open_text(path) as f:
        try:
            rows = _read_rows(f, str(path), limit)
        except wl._READ_ERRORS as e:
            raise wl._corrupt(path, e) from None
    if not rows:
        raise InputError(f"{path}: empty trace: no requests" + wl._limit_note(limit))
    path = str(path)
    delta = fmt == "mooncake-delta"
    n = len(rows)
    input_length = np.zeros(n, dtype=np.int64)
    output_length = np.zeros(n, dtype=np.int64)
    hashes = []
    for i, obj in enumerate(rows):
        il, ol, h = _lengths(obj, path, i + 1, tbs, delta)
        input_length[i] = il
        output_length[i] = ol
        hashes.append(h)
    request_ids = [str(i) for i in range(n)]
    priority = np.zeros(n, dtype=np.int64)
    dp_rank = np.full(n, -1, dtype=np.int64)
    wl._apply_optional_fields(dict(enumerate(rows)), path, request_ids, priority, dp_rank)
    arrival = np.full(n, math.nan)
    if fmt == "agentic_mooncake":
        plan = _graph(rows, path, request_ids, arrival)
    else:
        plan = _chains(rows, path, request_ids, arrival)
    if delta:
        input_length, hashes, start = ss.accumulate_deltas(
            plan.session.tolist(), input_length, output_length, hashes, tbs, path,
            list(range(1, n + 1)))
        plan = ss.chain_plan(plan.session_ids, plan.session, plan.turn, plan.delay_ms, start)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum([len(h) for h in hashes], out=offsets[1:])
    flat = [x for h in hashes for x in h]
    return wl.Workload(
        request_ids=request_ids, arrival_ms=arrival, input_length=input_length,
        output_length=output_length, priority=priority, dp_rank=dp_rank,
        hash_flat=wl._hash_array(flat, offsets, path), hash_offsets=offsets,
        trace_block_size=tbs, source=path, sessions=plan)


def _read_rows(f, path: str, limit) -> list:
    """The JSON objects of the trace, one per line (trailing blank lines only)."""
    rows = []
    blank = 0
    for line in f:
        if limit is not None and len(rows) == limit:
            break
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
    return rows


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


def _graph(rows, path, request_ids, arrival) -> ss.SessionPlan:
    """An agent graph: `wait_for` edges between `request_id`s."""
    wait_for, names, delay = [], [], np.zeros(len(rows))
    for i, obj in enumerate(rows):
        at = f"{path}:{i + 1}:"
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
    return ss.graph_plan(path, list(range(1, len(rows) + 1)), request_ids, names, wait_for,
                         delay)
