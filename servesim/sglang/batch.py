"""A launched batch (`ScheduleBatch`): its mode and rows, as the pass log has them."""

EXTEND, DECODE, MIXED = "extend", "decode", "mixed"


class Row:
    """One extend row of a batch (`kind` new / retracted / chunk, `tokens`
    computed from `prefix`, `cached` the admission's hit, `partial` when it
    leaves the input unfinished)."""

    __slots__ = ("req", "kind", "tokens", "prefix", "cached", "partial")

    def __init__(self, req, kind, tokens, prefix=0, cached=0, partial=False):
        self.req = req
        self.kind = kind
        self.tokens = tokens
        self.prefix = prefix
        self.cached = cached
        self.partial = partial

    def to_dict(self) -> dict:
        return {"id": self.req.rid, "kind": self.kind, "tokens": self.tokens,
                "prefix": self.prefix, "cached": self.cached, "partial": self.partial}


class Batch:
    """`rows`: the extend rows; `decode`: the requests that decode one token
    each (after the extend rows in a mixed pass), `decode_slots` their
    table rows (servesim/sglang/req.py's `ReqTable`), `decode_context` their
    positions after the decode, summed. (A request retracted while this
    batch is in flight has its token dropped: the table's `DROPPED_AT`.)"""

    def __init__(self, mode: str, rows: list, decode=(), decode_slots=None):
        self.mode = mode
        self.rows = rows
        self.decode = list(decode)
        self.decode_slots = decode_slots
        self.decode_context = 0
        self.start_ms = 0.0
        self.end_ms = 0.0
        self.index = -1
        self.record = None

    def samples(self, req) -> bool:
        """Whether this batch samples a token for `req` (every row but middle
        chunks)."""
        return req in self.decode or any(row.req is req and not row.partial for row in self.rows)

    @property
    def is_extend(self) -> bool:
        return self.mode != DECODE

    @property
    def num_rows(self) -> int:
        return len(self.rows) + len(self.decode)

    @property
    def num_tokens(self) -> int:
        return sum(row.tokens for row in self.rows) + len(self.decode)

    @property
    def reqs(self):
        return [row.req for row in self.rows] + self.decode

    def scheduled(self) -> list:
        """The pass log's `scheduled` rows."""
        return [row.to_dict() for row in self.rows] + [
            {"id": r.rid, "kind": "decode", "tokens": 1} for r in self.decode]
