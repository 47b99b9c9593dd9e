"""Workloads: what requests arrive, when, with which prompt identities.

A :class:`Workload` is a structure of arrays, one entry per request in arrival
order (ties keep file order). Loaders for Mooncake JSONL, Azure CSV and
synthetic workloads build it (README.md, "Config").
"""

import datetime as _dt
import gzip
import json
import math
import re
import zlib
from pathlib import Path

import attrs
import numpy as np

from servesim.errors import InputError




@attrs.frozen(eq=False)
class Workload:
    """Requests in arrival order.

    `arrival_ms` is already shifted so the first request arrives at 0 and
    divided by `speedup`. `hash_flat[hash_offsets[i]:hash_offsets[i+1]]` are
    request i's hash ids, one per `trace_block_size` prompt tokens (the last
    block may be partial); two requests share a prefix of k trace blocks iff
    their first k hash ids are equal. `priority` defaults to 0, `dp_rank` to -1
    (not pinned). `concurrency` is the closed-loop bound (None: open loop).
    `source` and `first_line` name the file and the line of request 0 for
    messages (rows follow one a line; synthetic workloads have source None).
    `sessions` (a `servesim.workload.sessions.SessionPlan`, None for independent
    requests): requests in file order whose arrivals wait for others'
    finishes; their `arrival_ms` is NaN except for roots.
    """

    request_ids: list
    arrival_ms: np.ndarray  # float64
    input_length: np.ndarray  # int64
    output_length: np.ndarray  # int64
    priority: np.ndarray  # int64
    dp_rank: np.ndarray  # int64, -1 = any rank
    hash_flat: np.ndarray  # int64
    hash_offsets: np.ndarray  # int64, len n + 1
    trace_block_size: int
    concurrency: int | None = None
    source: str | None = None
    sessions: object = None

    # speculative decoding: request i's trace `accepted` list is
    # accepted_values[accepted_offsets[i]:accepted_offsets[i+1]] (None: no row has one)
    accepted_values: np.ndarray | None = None  # int64
    accepted_offsets: np.ndarray | None = None  # int64, len n + 1
    first_line: int = 1  # the line of request 0 in `source` (2 after a header line)
    # a Mooncake row's optional `max_new_tokens` (SGLang's sampling limit; None:
    # no row has one, each request's limit is its output_length). Only
    # `backend: sglang` reads it: a limit above output_length stops the
    # request by EOS at output_length (docs/sglang.md, "Requests")
    max_new_tokens: np.ndarray | None = None  # int64

    def __len__(self) -> int:
        return len(self.request_ids)


# --------------------------------------------------------------------------
# The Mooncake JSONL and Azure CSV readers' rows and checks (their entry
# points, and the dispatch to every source, are servesim.workload.load).
# --------------------------------------------------------------------------

FORMATS = ("mooncake", "azure", "mooncake-delta", "agentic_mooncake")
_GZIP_MAGIC = b"\x1f\x8b"
_INF = float("inf")
_NUMBER = (int, float)
_MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
_AZURE_HEADER = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]
_AZURE_TS = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?"
    r"(?:(Z)|([+-])(\d{2}):?(\d{2}))?$"
)
# What a corrupt or truncated gzip stream (or undecodable text) raises.
_READ_ERRORS = (EOFError, gzip.BadGzipFile, zlib.error, OSError, UnicodeDecodeError)


def trace_format(path, fmt: str | None) -> str:
    """The trace format: `fmt` if given, else from the file name."""
    if fmt is not None:
        if fmt not in FORMATS:
            raise InputError(f"workload.format: unknown format {fmt!r}; accepted: {', '.join(FORMATS)}")
        return fmt
    name = Path(path).name.lower()
    if name.endswith((".jsonl", ".jsonl.gz")):
        return "mooncake"
    if name.endswith((".csv", ".csv.gz")):
        return "azure"
    raise InputError(
        f"workload.trace: cannot tell the format of {path} from its name "
        "(.jsonl/.jsonl.gz: mooncake, .csv: azure); set workload.format: mooncake | azure"
    )






def _head(w: Workload, n: int) -> Workload:
    """The first `n` requests of `w`."""
    if n >= len(w):
        return w
    end = int(w.hash_offsets[n])
    sessions = w.sessions
    if sessions is not None:
        from servesim.workload.sessions import head_plan

        sessions = head_plan(sessions, n)
    return attrs.evolve(
        w,
        sessions=sessions,
        request_ids=w.request_ids[:n],
        arrival_ms=w.arrival_ms[:n].copy(),
        input_length=w.input_length[:n].copy(),
        output_length=w.output_length[:n].copy(),
        priority=w.priority[:n].copy(),
        dp_rank=w.dp_rank[:n].copy(),
        hash_flat=w.hash_flat[:end].copy(),
        hash_offsets=w.hash_offsets[: n + 1].copy(),
        **_head_accepted(w, n),
        max_new_tokens=None if w.max_new_tokens is None else w.max_new_tokens[:n].copy(),
    )


def _head_accepted(w: Workload, n: int) -> dict:
    if w.accepted_offsets is None:
        return {}
    return {"accepted_values": w.accepted_values[:int(w.accepted_offsets[n])].copy(),
            "accepted_offsets": w.accepted_offsets[: n + 1].copy()}


def _check_speedup(speedup) -> None:
    if type(speedup) not in _NUMBER or not (0 < speedup < _INF):
        raise InputError(f"workload.speedup: must be a number > 0, got {speedup!r}")


def _check_limit(limit) -> None:
    if limit is not None and (type(limit) is not int or limit < 1):
        raise InputError(f"workload.limit: must be an integer >= 1 or null, got {limit!r}")


def _check_block_size(tbs) -> None:
    if type(tbs) is not int or tbs < 1:
        raise InputError(f"workload.trace_block_size: must be an integer >= 1, got {tbs!r}")


def _open_text(path):
    """Open a trace as UTF-8 text, decompressing gzip (by suffix or magic bytes)."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            magic = f.read(2)
        if magic == _GZIP_MAGIC or p.name.lower().endswith(".gz"):
            return gzip.open(p, "rt", encoding="utf-8-sig")
        return open(p, encoding="utf-8-sig")
    except FileNotFoundError:
        raise InputError(f"workload.trace: file not found: {path}") from None
    except OSError as e:
        raise InputError(f"workload.trace: cannot read {path}: {e.strerror or e}") from None


def _corrupt(path, e: Exception) -> InputError:
    """The error for a truncated/corrupt gzip stream or undecodable bytes."""
    if isinstance(e, UnicodeDecodeError):
        return InputError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start} of a line)")
    what = "truncated" if isinstance(e, EOFError) else "corrupt"
    return InputError(f"{path}: {what} or unreadable file ({type(e).__name__}: {e}); "
                      "a trace must be plain text or a complete gzip file")


def _limit_note(limit) -> str:
    return f" (workload.limit={limit})" if limit is not None else ""


def _blank_error(path: str, blank: int) -> InputError:
    return InputError(f"{path}:{blank}: blank line inside the trace; only trailing blank lines are allowed")


# ------------------------------------------------------------ Mooncake rows


def _read_mooncake_rows(f, path: str, tbs: int, limit):
    """Parse JSONL rows with a fast path per row; returns plain lists.

    Row k (0-based) is on line k + 1: blank lines are skipped only at the end
    of the file (a blank line followed by a row is an error).
    """
    loads = json.loads
    ts_l, il_l, ol_l, nh_l, flat = [], [], [], [], []
    extend = flat.extend
    extras = {}  # row -> the row object, for rows with optional fields
    prev = 0.0
    n = 0
    blank = 0
    stop = -1 if limit is None else limit
    for line in f:
        if n == stop:
            break
        try:
            obj = loads(line)
        except ValueError as e:
            if line.strip():
                raise InputError(f"{path}:{n + 1}: malformed JSON ({e}); "
                                 "each line must be one JSON object") from None
            blank = blank or n + 1
            continue
        if blank:
            raise _blank_error(path, blank)
        try:
            ts = obj["timestamp"]
            il = obj["input_length"]
            ol = obj["output_length"]
            h = obj["hash_ids"]
        except (KeyError, TypeError):
            if _session_row(obj):
                raise _HasSessions from None
            raise InputError(_mooncake_row_error(obj, path, n + 1, prev, tbs)) from None
        if not (type(ts) in _NUMBER and prev <= ts < _INF and type(il) is int and type(ol) is int
                and il >= 1 and ol >= 1 and type(h) is list and len(h) == (il + tbs - 1) // tbs):
            if _session_row(obj):
                raise _HasSessions
            raise InputError(_mooncake_row_error(obj, path, n + 1, prev, tbs))
        if len(obj) > 4:
            if _session_row(obj):
                raise _HasSessions
            extras[n] = obj
        prev = ts
        ts_l.append(ts)
        il_l.append(il)
        ol_l.append(ol)
        nh_l.append(len(h))
        extend(h)
        n += 1
    return ts_l, il_l, ol_l, nh_l, flat, extras


class _HasSessions(Exception):
    """A Mooncake row carries session fields: the trace is read as sessions."""


def _session_row(obj) -> bool:
    return isinstance(obj, dict) and ("session_id" in obj or "delay" in obj or "delay_ms" in obj)


def _mooncake_row_error(obj, path: str, line: int, prev: float, tbs: int) -> str:
    """The message for a row that failed the fast path."""
    at = f"{path}:{line}:"
    if not isinstance(obj, dict):
        return f"{at} a row must be a JSON object, got {type(obj).__name__}"
    for key in _MOONCAKE_FIELDS:
        if key not in obj:
            return f"{at} missing field '{key}'; each row needs {', '.join(_MOONCAKE_FIELDS)}"
    ts = obj["timestamp"]
    if type(ts) not in _NUMBER:
        return f"{at} timestamp must be a number (ms), got {ts!r}"
    if not math.isfinite(ts):
        return f"{at} timestamp must be a finite number (ms), got {ts!r}"
    if ts < 0:
        return f"{at} negative timestamp {ts!r}; timestamps are ms >= 0"
    if ts < prev:
        return (f"{at} timestamp {ts!r} is earlier than the previous row's {prev!r}; "
                "rows must be sorted by timestamp (non-decreasing)")
    for key in ("input_length", "output_length"):
        v = obj[key]
        if type(v) is not int:
            return f"{at} {key} must be an integer, got {v!r}"
        if v < 1:
            return f"{at} {key} must be >= 1, got {v}"
    h = obj["hash_ids"]
    if type(h) is not list:
        return f"{at} hash_ids must be a list of integers, got {type(h).__name__}"
    want = -(-obj["input_length"] // tbs)
    return (f"{at} hash_ids has {len(h)} ids but ceil(input_length {obj['input_length']} / "
            f"trace_block_size {tbs}) = {want}; each id covers trace_block_size tokens")


def _mooncake_workload(rows, path: str, tbs: int) -> Workload:
    """Turn the parsed lists into a Workload, checking hash ids and optional fields."""
    ts_l, il_l, ol_l, nh_l, flat, extras = rows
    n = len(ts_l)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.array(nh_l, dtype=np.int64), out=offsets[1:])
    hash_flat = _hash_array(flat, offsets, path)
    request_ids = [str(i) for i in range(n)]
    priority = np.zeros(n, dtype=np.int64)
    dp_rank = np.full(n, -1, dtype=np.int64)
    accepted = {}
    if extras:
        _apply_optional_fields(extras, path, request_ids, priority, dp_rank)
        accepted = _accepted_lists(extras, path, n)
        accepted.update(_max_new_tokens(extras, path, ol_l))
    return Workload(
        request_ids=request_ids,
        arrival_ms=np.array(ts_l, dtype=np.float64),
        input_length=np.array(il_l, dtype=np.int64),
        output_length=np.array(ol_l, dtype=np.int64),
        priority=priority,
        dp_rank=dp_rank,
        hash_flat=hash_flat,
        hash_offsets=offsets,
        trace_block_size=tbs,
        source=path,
        **accepted,
    )


def _accepted_lists(extras: dict, path: str, n: int, base: int = 1) -> dict:
    """The `accepted` lists of speculative decoding (lists of integers >= 0;
    their upper bound, num_speculative_tokens, is checked against the config
    in servesim/config/speculative_config.py). `extras` maps a row index to
    its fields; row 0 is on line `base`."""
    counts = np.zeros(n, dtype=np.int64)
    values = []
    for row in sorted(extras):
        a = extras[row].get("accepted")
        if a is None:
            continue
        if type(a) is not list or not a or any(type(v) is not int or v < 0 for v in a):
            raise InputError(f"{path}:{row + base}: accepted must be a non-empty list of integers "
                             f">= 0 (drafts accepted per verification pass), got {a!r}")
        counts[row] = len(a)
        values.extend(a)
    if not values:
        return {}
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return {"accepted_values": np.array(values, dtype=np.int64), "accepted_offsets": offsets}


def _max_new_tokens(extras: dict, path: str, output_lengths: list) -> dict:
    """The rows' optional `max_new_tokens` (an integer >= output_length);
    absent rows take their output_length. {} when no row has one."""
    if not any("max_new_tokens" in obj for obj in extras.values()):
        return {}
    limits = np.array(output_lengths, dtype=np.int64)
    for row in sorted(extras):
        m = extras[row].get("max_new_tokens")
        if m is None:
            continue
        if type(m) is not int or m < output_lengths[row]:
            raise InputError(f"{path}:{row + 1}: max_new_tokens must be an integer >= "
                             f"output_length ({output_lengths[row]}), got {m!r}")
        limits[row] = m
    return {"max_new_tokens": limits}


def _hash_array(flat: list, offsets: np.ndarray, path: str) -> np.ndarray:
    """All hash ids as int64; a non-integer or out-of-range id names its line."""
    try:
        arr = np.array(flat)
    except (ValueError, TypeError):  # e.g. a nested list
        arr = None
    if arr is not None and arr.dtype.kind == "i" and arr.ndim == 1:
        return arr.astype(np.int64, copy=False)
    for k, v in enumerate(flat):
        if type(v) is not int or not -(2**63) <= v < 2**63:
            row = int(np.searchsorted(offsets, k, side="right")) - 1
            raise InputError(f"{path}:{row + 1}: hash_ids must be 64-bit integers, got {v!r}")
    return np.array(flat, dtype=np.int64)  # only bools mixed with ints get here


def _apply_optional_fields(extras: dict, path: str, request_ids: list, priority, dp_rank) -> None:
    """Fill request_id / priority / dp_rank from rows that carry them."""
    for row, obj in extras.items():
        at = f"{path}:{row + 1}:"
        rid = obj.get("request_id")
        if rid is not None:
            if type(rid) is not str or not rid:
                raise InputError(f"{at} request_id must be a non-empty string, got {rid!r}")
            request_ids[row] = rid
        p = obj.get("priority", 0)
        if type(p) is not int:
            raise InputError(f"{at} priority must be an integer, got {p!r}")
        priority[row] = p
        if "dp_rank" in obj:
            d = obj["dp_rank"]
            if type(d) is not int or d < 0:
                raise InputError(f"{at} dp_rank must be an integer >= 0, got {d!r}")
            dp_rank[row] = d
    if len(set(request_ids)) != len(request_ids):
        seen = {}
        for row, rid in enumerate(request_ids):
            if rid in seen:
                raise InputError(f"{path}:{row + 1}: duplicate request_id {rid!r} "
                                 f"(first on line {seen[rid] + 1}); request ids must be unique")
            seen[rid] = row


# --------------------------------------------------------------- Azure rows


def _read_azure_rows(f, path: str, limit):
    """Parse the CSV header and rows; returns (ns since row 1, context, generated)."""
    header = f.readline()
    if [c.strip() for c in header.split(",")] != _AZURE_HEADER:
        raise InputError(f"{path}:1: bad header {header.strip()!r}; expected {','.join(_AZURE_HEADER)}")
    rel, ctx, gen = [], [], []
    ns0 = prev = None
    blank = 0
    stop = -1 if limit is None else limit
    n = 0
    for line in f:
        if n == stop:
            break
        line_no = n + 2
        if not line.strip():
            blank = blank or line_no
            continue
        if blank:
            raise _blank_error(path, blank)
        parts = line.split(",")
        if len(parts) != 3:
            raise InputError(f"{path}:{line_no}: expected 3 columns "
                             f"({','.join(_AZURE_HEADER)}), got {len(parts)}")
        ns = _azure_ns(parts[0].strip(), path, line_no)
        if prev is None:
            ns0 = prev = ns
        elif ns < prev:
            raise InputError(f"{path}:{line_no}: TIMESTAMP {parts[0].strip()} is earlier than the "
                             "previous row's; rows must be sorted by time (non-decreasing)")
        prev = ns
        rel.append(ns - ns0)
        ctx.append(_azure_int(parts[1], "ContextTokens", path, line_no))
        gen.append(_azure_int(parts[2], "GeneratedTokens", path, line_no))
        n += 1
    return rel, ctx, gen


def _azure_int(text: str, column: str, path: str, line_no: int) -> int:
    """A token count column: an integer >= 1."""
    s = text.strip()
    if not s.isdigit() or not s.isascii():
        raise InputError(f"{path}:{line_no}: {column} must be an integer >= 1, got {s!r}")
    v = int(s)
    if v < 1:
        raise InputError(f"{path}:{line_no}: {column} must be >= 1, got {v}")
    return v


def _azure_ns(s: str, path: str, line_no: int) -> int:
    """Nanoseconds since 0001-01-01 UTC of `2023-11-16 18:17:03.9799600` or
    `2024-05-10 00:00:00.009930+00:00` (exact integer arithmetic; any number
    of fractional digits, truncated to ns)."""
    m = _AZURE_TS.match(s)
    if m is None:
        raise InputError(f"{path}:{line_no}: bad TIMESTAMP {s!r}; expected e.g. "
                         "'2023-11-16 18:17:03.9799600' or '2024-05-10 00:00:00.009930+00:00'")
    y, mo, d, hh, mi, ss, frac, _z, sign, oh, om = m.groups()
    try:
        days = _dt.date(int(y), int(mo), int(d)).toordinal()
    except ValueError as e:
        raise InputError(f"{path}:{line_no}: bad TIMESTAMP {s!r} ({e})") from None
    hh, mi, ss = int(hh), int(mi), int(ss)
    if hh > 23 or mi > 59 or ss > 59:
        raise InputError(f"{path}:{line_no}: bad TIMESTAMP {s!r} (time of day out of range)")
    secs = days * 86400 + hh * 3600 + mi * 60 + ss
    if sign:
        off = int(oh) * 3600 + int(om) * 60
        secs -= off if sign == "+" else -off
    frac_ns = int((frac or "0")[:9].ljust(9, "0"))
    return secs * 1_000_000_000 + frac_ns
