"""The pass log of compiled runs (`passes.jsonl`, spec README §6), read from the
`PassLogBuffer` the compiled pass loop fills (servesim/engine/fast_run.py).

`CompiledPassLog` is a sequence of the same dicts the pass-by-pass driver
builds (`replay/driver.py`, `_pass_record`), made only when asked for, and
writes its JSON lines straight from the buffer's columns: the same text
`json.JSONEncoder` gives those dicts (floats in `repr`, keys in the record's
order), without holding a dict per pass.
"""

from collections.abc import Sequence

from servesim.engine import fast_run as fr
from servesim.replay.output import _ids
from servesim.scheduler.fast import KIND_NAMES

_POOLS = {0: "prefill", 1: "decode"}


class CompiledPassLog(Sequence):
    def __init__(self, buffer: fr.PassLogBuffer, request_ids, speculative: bool):
        self.buffer = buffer
        self.ids = request_ids
        self.speculative = speculative

    def __len__(self):
        return len(self.buffer)

    def _slices(self, row):
        b = self.buffer
        h = b.head
        start = h[row - 1] if row > 0 else (0,) * fr.NUM_LHEAD
        return (slice(int(start[fr.L_SCHED_END]), int(h[row, fr.L_SCHED_END])),
                slice(int(start[fr.L_PRE_END]), int(h[row, fr.L_PRE_END])),
                slice(int(start[fr.L_FIN_END]), int(h[row, fr.L_FIN_END])))

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
        record = {"pass": int(h[fr.L_PASS])}
        if h[fr.L_POOL] >= 0:
            record["pool"] = _POOLS[int(h[fr.L_POOL])]
        start, end, decided, launch_end = b.time[row].tolist()
        record.update({
            "worker": int(h[fr.L_WORKER]),
            "dp_rank": int(h[fr.L_RANK]),
            "start_ms": start,
            "end_ms": end,
            "decided_ms": decided,
            "launch_end_ms": launch_end,
            "scheduled": scheduled,
            "preempted": sorted(ids[i] for i in b.pre[pre].tolist()),
            "finished": sorted(ids[i] for i in b.fin[fin].tolist()),
            "free_blocks_after_schedule": int(h[fr.L_FREE]),
        })
        return record

    def __eq__(self, other):
        return isinstance(other, Sequence) and list(self) == list(other)

    def lines(self, chunk: int = 8192):
        """The JSON text of every line, as lists of at most `chunk` lines."""
        b = self.buffer
        ids = self.ids
        texts = _ids(ids)
        order = sorted(range(len(ids)), key=ids.__getitem__)
        rank = [0] * len(ids)  # a request's place in id order (the lists are sorted by id)
        for k, i in enumerate(order):
            rank[i] = k
        kinds = ['"%s"' % name for name in KIND_NAMES]
        if self.speculative:
            entry_fmt = '{"id": %s, "tokens": %d, "cached": %d, "kind": %s, "spec": %d}'
        else:
            entry_fmt = '{"id": %s, "tokens": %d, "cached": %d, "kind": %s}'
        n = len(self)
        for first in range(0, n, chunk):
            last = min(n, first + chunk)
            head = b.head[first:last].tolist()
            times = b.time[first:last].tolist()
            s0 = int(b.head[first - 1, fr.L_SCHED_END]) if first else 0
            p0 = int(b.head[first - 1, fr.L_PRE_END]) if first else 0
            f0 = int(b.head[first - 1, fr.L_FIN_END]) if first else 0
            s1 = int(b.head[last - 1, fr.L_SCHED_END])
            p1 = int(b.head[last - 1, fr.L_PRE_END])
            f1 = int(b.head[last - 1, fr.L_FIN_END])
            if self.speculative:
                entries = [entry_fmt % (texts[r], t, c, kinds[k], s)
                           for r, t, c, k, s in b.sched[s0:s1].tolist()]
            else:
                entries = [entry_fmt % (texts[r], t, c, kinds[k])
                           for r, t, c, k, _ in b.sched[s0:s1].tolist()]
            pre = b.pre[p0:p1].tolist()
            fin = b.fin[f0:f1].tolist()
            out = []
            s = p = f = 0
            for h, (start, end, decided, launch_end) in zip(head, times):
                s_end, p_end, f_end = h[fr.L_SCHED_END] - s0, h[fr.L_PRE_END] - p0, h[fr.L_FIN_END] - f0
                pool = ('"pool": "%s", ' % _POOLS[h[fr.L_POOL]]) if h[fr.L_POOL] >= 0 else ""
                out.append(
                    '{"pass": %d, %s"worker": %d, "dp_rank": %d, "start_ms": %r, "end_ms": %r, '
                    '"decided_ms": %r, "launch_end_ms": %r, "scheduled": [%s], "preempted": [%s], '
                    '"finished": [%s], "free_blocks_after_schedule": %d}' % (
                        h[fr.L_PASS], pool, h[fr.L_WORKER], h[fr.L_RANK], start, end, decided,
                        launch_end, ", ".join(entries[s:s_end]),
                        _sorted_texts(pre[p:p_end], rank, texts),
                        _sorted_texts(fin[f:f_end], rank, texts), h[fr.L_FREE]))
                s, p, f = s_end, p_end, f_end
            yield out


def _sorted_texts(requests, rank, texts):
    if not requests:
        return ""
    if len(requests) > 1:
        requests = sorted(requests, key=rank.__getitem__)
    return ", ".join(texts[i] for i in requests)
