"""The pass log of compiled runs (`passes.jsonl`, README.md, "Outputs"), read from the
`PassLogBuffer` the compiled pass loop fills (servesim/engine/pass_loop.py).

`PassLog` is a sequence of one dict per line (pass, pool in
disaggregated mode, worker, dp_rank, start/end/decided/launch-end instants,
scheduled, preempted, finished, free blocks after schedule), made only when
asked for, and writes its JSON lines straight from the buffer's columns: the
same text `json.JSONEncoder` gives those dicts (floats in `repr`, keys in the
record's order), without holding a dict per pass.
"""

from collections.abc import Sequence

import numpy as np

from servesim.engine import pass_log_buffer as lb
from servesim.jit import njit
from servesim.results.output import _ids
from servesim.scheduler.output import KIND_NAMES, PassKind

assert (PassKind.NEW, PassKind.RESUMED, PassKind.RUNNING) == (0, 1, 2)
assert KIND_NAMES == ("new", "resumed", "running")

_POOLS = {0: "prefill", 1: "decode"}


class PassLog(Sequence):
    def __init__(self, buffer: lb.PassLogBuffer, request_ids, speculative: bool):
        self.buffer = buffer
        self.ids = request_ids
        self.speculative = speculative

    def __len__(self):
        return len(self.buffer)

    def _slices(self, row):
        b = self.buffer
        h = b.head
        start = h[row - 1] if row > 0 else (0,) * lb.NUM_LHEAD
        return (slice(int(start[lb.L_SCHED_END]), int(h[row, lb.L_SCHED_END])),
                slice(int(start[lb.L_PRE_END]), int(h[row, lb.L_PRE_END])),
                slice(int(start[lb.L_FIN_END]), int(h[row, lb.L_FIN_END])))

    def __getitem__(self, row):
        if isinstance(row, slice):
            return [self[k] for k in range(*row.indices(len(self)))]
        if row < 0:
            row += len(self)
        if not 0 <= row < len(self):
            raise IndexError(row)
        b = self.buffer
        h = b.head[row]
        ids = self.ids
        sched, pre, fin = self._slices(row)
        scheduled = []
        for req, tokens, cached, kind, spec in b.sched[sched].tolist():
            entry = {"id": ids[req], "tokens": tokens, "cached": cached,
                     "kind": KIND_NAMES[kind]}
            if self.speculative:
                entry["spec"] = spec
            scheduled.append(entry)
        record = {"pass": int(h[lb.L_PASS])}
        if h[lb.L_POOL] >= 0:
            record["pool"] = _POOLS[int(h[lb.L_POOL])]
        start, end, decided, launch_end = b.time[row].tolist()
        record.update({
            "worker": int(h[lb.L_WORKER]),
            "dp_rank": int(h[lb.L_RANK]),
            "start_ms": start,
            "end_ms": end,
            "decided_ms": decided,
            "launch_end_ms": launch_end,
            "scheduled": scheduled,
            "preempted": sorted(ids[i] for i in b.pre[pre].tolist()),
            "finished": sorted(ids[i] for i in b.fin[fin].tolist()),
            "free_blocks_after_schedule": int(h[lb.L_FREE]),
        })
        return record

    def __eq__(self, other):
        return isinstance(other, Sequence) and list(self) == list(other)

    def chunks(self, chunk: int = 256):
        """The JSON lines of the log, each ending in a newline, as bytes of at
        most `chunk` lines each (`_lines`, compiled), each valid until the one
        after next is asked for (two buffers take turns, so one chunk can be
        written while the next is formatted: `output._write_text`). Only the
        times are formatted here, each distinct value once (a pass's start is
        mostly its decision and the previous pass's end): `repr`, the text
        `json.JSONEncoder` gives a float."""
        b = self.buffer
        ids = self.ids
        texts = [t.encode("ascii") for t in _ids(ids)]
        order = sorted(range(len(ids)), key=ids.__getitem__)
        rank = np.zeros(len(ids), dtype=np.int64)  # place in id order: the lists are sorted by id
        rank[np.array(order, dtype=np.int64)] = np.arange(len(ids), dtype=np.int64)
        id_offsets = np.zeros(len(texts) + 1, dtype=np.int64)
        np.cumsum([len(t) for t in texts], out=id_offsets[1:])
        id_bytes = np.frombuffer(b"".join(texts), dtype=np.uint8) if texts else np.zeros(0, np.uint8)
        longest = int(np.diff(id_offsets).max()) if texts else 0
        # a scheduled entry's text up to its token count, per request
        before, after = b'{"id": ', b', "tokens": '
        entry_offsets = id_offsets + len(before + after) * np.arange(len(texts) + 1, dtype=np.int64)
        entry_bytes = np.frombuffer(b"".join(before + t + after for t in texts),
                                    dtype=np.uint8) if texts else id_bytes
        n = len(self)
        buffers = [np.zeros(0, dtype=np.uint8)] * 2  # reused: their pages are faulted in once
        for first in range(0, n, chunk):
            last = min(n, first + chunk)
            ends = b.head[first - 1] if first else np.zeros(lb.NUM_LHEAD, dtype=np.int64)
            s0, p0, f0 = int(ends[lb.L_SCHED_END]), int(ends[lb.L_PRE_END]), int(ends[lb.L_FIN_END])
            h = b.head[last - 1]
            # by bit pattern, so -0.0 keeps its own text
            values, which = np.unique(b.time[first:last].ravel().view(np.int64),
                                      return_inverse=True)
            time_texts = list(map(repr, values.view(np.float64).tolist()))
            time_offsets = np.zeros(len(time_texts) + 1, dtype=np.int64)
            np.cumsum([len(t) for t in time_texts], out=time_offsets[1:])
            time_bytes = np.frombuffer("".join(time_texts).encode("ascii"), dtype=np.uint8)
            longest_time = int(np.diff(time_offsets).max())
            size = ((int(h[lb.L_SCHED_END]) - s0) * (longest + 96)
                    + (int(h[lb.L_PRE_END]) - p0 + int(h[lb.L_FIN_END]) - f0) * (longest + 2)
                    + (last - first) * (384 + 4 * longest_time))  # keys, pool, int64s, times
            out = buffers[(first // chunk) % 2]
            if out.shape[0] < size:
                out = buffers[(first // chunk) % 2] = np.empty(max(size, 2 * out.shape[0]),
                                                               dtype=np.uint8)
            at = _lines(b.head, time_bytes, time_offsets, which, b.sched, b.pre, b.fin,
                        first, last, s0, p0, f0, id_bytes, id_offsets, entry_bytes, entry_offsets,
                        rank, self.speculative, out)
            yield out[:at]


@njit
def _put(out, at, text):
    for c in text:
        out[at] = c
        at += 1
    return at


@njit
def _put_int(out, at, v):
    if 0 <= v < 10:
        out[at] = 48 + v
        return at + 1
    if v < 0:
        out[at] = 45  # "-"
        at += 1
        v = -v
    digits = 1
    x = v
    while x >= 10:
        x //= 10
        digits += 1
    for k in range(digits - 1, -1, -1):
        out[at + k] = 48 + v % 10
        v //= 10
    return at + digits


@njit
def _put_text(out, at, text_bytes, text_offsets, i):
    """Text i of a table of texts (`text_bytes[text_offsets[i]:text_offsets[i + 1]]`)."""
    for k in range(text_offsets[i], text_offsets[i + 1]):
        out[at] = text_bytes[k]
        at += 1
    return at


@njit
def _put_sorted_ids(out, at, requests, rank, id_bytes, id_offsets):
    """`requests` as JSON texts sorted by id (their `rank` in id order)."""
    n = len(requests)
    order = requests.copy()
    for a in range(1, n):  # insertion sort: a pass's lists are short
        x = order[a]
        k = a - 1
        while k >= 0 and rank[order[k]] > rank[x]:
            order[k + 1] = order[k]
            k -= 1
        order[k + 1] = x
    for k in range(n):
        if k:
            at = _put(out, at, b", ")
        at = _put_text(out, at, id_bytes, id_offsets, order[k])
    return at


@njit
def _lines(head, time_bytes, time_offsets, which, sched, pre, fin, first, last, s0, p0, f0,
           id_bytes, id_offsets, entry_bytes, entry_offsets, rank, speculative, out):
    """The text of lines `first:last`, one after another in `out`, each ending
    in a newline; returns its length. The four times of line `first + k` are
    texts `which[4 k:4 k + 4]` of `time_bytes` (sliced by `time_offsets`);
    `entry_bytes` (sliced as `id_bytes` is): each request's scheduled entry
    up to its token count."""
    pools = (b'"pool": "prefill", ', b'"pool": "decode", ')  # _POOLS, in pool order
    t = 0
    kinds = (b', "kind": "new"', b', "kind": "resumed"', b', "kind": "running"')  # KIND_NAMES
    # most entries: a running request's, nothing cached (one copy, not four)
    decoding = b', "cached": 0, "kind": "running"}'
    at = 0
    s, p, f = s0, p0, f0
    for row in range(first, last):
        at = _put(out, at, b'{"pass": ')
        at = _put_int(out, at, head[row, lb.L_PASS])
        at = _put(out, at, b", ")
        if head[row, lb.L_POOL] >= 0:
            at = _put(out, at, pools[head[row, lb.L_POOL]])
        at = _put(out, at, b'"worker": ')
        at = _put_int(out, at, head[row, lb.L_WORKER])
        at = _put(out, at, b', "dp_rank": ')
        at = _put_int(out, at, head[row, lb.L_RANK])
        at = _put(out, at, b', "start_ms": ')
        at = _put_text(out, at, time_bytes, time_offsets, which[t])
        t += 1
        at = _put(out, at, b', "end_ms": ')
        at = _put_text(out, at, time_bytes, time_offsets, which[t])
        t += 1
        at = _put(out, at, b', "decided_ms": ')
        at = _put_text(out, at, time_bytes, time_offsets, which[t])
        t += 1
        at = _put(out, at, b', "launch_end_ms": ')
        at = _put_text(out, at, time_bytes, time_offsets, which[t])
        t += 1
        at = _put(out, at, b', "scheduled": [')
        for e in range(s, head[row, lb.L_SCHED_END]):
            if e > s:
                at = _put(out, at, b", ")
            at = _put_text(out, at, entry_bytes, entry_offsets, sched[e, lb.E_REQ])
            at = _put_int(out, at, sched[e, lb.E_TOK])
            if (sched[e, lb.E_CACHED] == 0 and sched[e, lb.E_KIND] == PassKind.RUNNING
                    and not speculative):
                at = _put(out, at, decoding)
                continue
            at = _put(out, at, b', "cached": ')
            at = _put_int(out, at, sched[e, lb.E_CACHED])
            at = _put(out, at, kinds[sched[e, lb.E_KIND]])
            if speculative:
                at = _put(out, at, b', "spec": ')
                at = _put_int(out, at, sched[e, lb.E_SPEC])
            at = _put(out, at, b"}")
        s = head[row, lb.L_SCHED_END]
        at = _put(out, at, b'], "preempted": [')
        at = _put_sorted_ids(out, at, pre[p:head[row, lb.L_PRE_END]], rank, id_bytes, id_offsets)
        p = head[row, lb.L_PRE_END]
        at = _put(out, at, b'], "finished": [')
        at = _put_sorted_ids(out, at, fin[f:head[row, lb.L_FIN_END]], rank, id_bytes, id_offsets)
        f = head[row, lb.L_FIN_END]
        at = _put(out, at, b'], "free_blocks_after_schedule": ')
        at = _put_int(out, at, head[row, lb.L_FREE])
        at = _put(out, at, b"}\n")
    return at
