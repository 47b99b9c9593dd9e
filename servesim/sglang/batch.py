"""A launched batch (`ScheduleBatch`): its mode and rows, as the pass log has them."""

EXTEND, DECODE, MIXED = "extend", "decode", "mixed"


class Row:
    """One row of a batch: an extend row (`kind` new / retracted / chunk,
    `tokens` computed from `prefix`, `cached` the admission's hit, `partial`
    when it leaves the input unfinished) or a decode row (kind decode, one
    token). `epoch` is the request's at launch: a row of a request retracted
    since is dropped when the result is processed."""

    __slots__ = ("req", "epoch", "kind", "tokens", "prefix", "cached", "partial")

    def __init__(self, req, kind, tokens, prefix=0, cached=0, partial=False):
        self.req = req
        self.epoch = req.epoch
        self.kind = kind
        self.tokens = tokens
        self.prefix = prefix
        self.cached = cached
        self.partial = partial

    def to_dict(self) -> dict:
        if self.kind == "decode":
            return {"id": self.req.rid, "kind": "decode", "tokens": 1}
        return {"id": self.req.rid, "kind": self.kind, "tokens": self.tokens,
                "prefix": self.prefix, "cached": self.cached, "partial": self.partial}


class Batch:
    def __init__(self, mode: str, rows: list):
        self.mode = mode
        self.rows = rows
        self.start_ms = 0.0
        self.end_ms = 0.0
        self.index = -1
        self.record = None
        self._sampling = None

    @property
    def sampling(self) -> set:
        """The ids of the requests this batch samples a token for (every row
        but middle chunks), made once."""
        if self._sampling is None:
            self._sampling = {id(row.req) for row in self.rows if not row.partial}
        return self._sampling

    @property
    def is_extend(self) -> bool:
        return self.mode != DECODE

    @property
    def num_tokens(self) -> int:
        return sum(row.tokens for row in self.rows)

    @property
    def reqs(self):
        return [row.req for row in self.rows]
