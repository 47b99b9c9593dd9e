"""Forward-pass records (docs/fitting.md): read, validate, hold as arrays.

A records file is JSONL; each line is one pass of one engine, either an object

    {"version": 1, "worker_id": "w0", "counter_id": 17, "wall_time": 0.01834,
     "scheduled_requests": {"num_prefill_requests": 1, "sum_prefill_tokens": 2048,
                            "num_decode_requests": 31, "sum_decode_kv_tokens": 912345}}

or a list of such objects, one per attention-DP rank of a lockstep pass. For a
list, the four features are summed over the ranks, the wall time is the
slowest rank's (a lockstep pass lasts as long as its slowest rank), and the
pass's `worker_id` / `counter_id` are its first rank's.

Every bad line is an :class:`InputError` naming `file:line`: malformed JSON,
missing or non-numeric fields, negative features, NaN or infinite numbers, a
repeated `(worker_id, counter_id)`. `wall_time` may be negative: with async
scheduling the record before an eager pass can carry more of that pass's
launch than the pass's own time (docs/fitting.md), so a raw record is kept as
written (the `fit` command says how many; `--launch-stall` corrects them).
`worker_id` and `counter_id` are optional here (an empty `worker_id` counts as
none); `--launch-stall` and `--window` need them
(:meth:`ForwardPassRecords.require_ids`).
Unknown keys (`version`, `queued_requests`, ...) are ignored. Blank lines are
allowed only at the end of a file.
"""

import gzip
import json
import math

import attrs
import numpy as np

from servesim.errors import InputError

# The four features of a record, in the order of the fitted model (after the
# intercept; servesim.engine.fitted_formula.FITTED_FEATURES).
FEATURES = ("num_prefill_requests", "sum_prefill_tokens", "num_decode_requests",
            "sum_decode_kv_tokens")
# optional (0 when absent): draft tokens of speculative decoding, a sixth
# feature of the fit when any record has some (FITTED_SPEC_FEATURE)
DRAFT_FEATURE = "sum_draft_tokens"

# Pass kinds (docs/engine.md §8): a decode pass replays a CUDA graph; a
# piecewise pass has prompt tokens and fits the capture size; an eager pass
# exceeds it.
DECODE, PIECEWISE, EAGER = 0, 1, 2
KIND_NAMES = ("decode", "piecewise", "eager")

# `worker` code of a record whose worker_id is "": no worker, like a missing
# one (-1), but named as empty in messages.
EMPTY_WORKER_ID = -2

_NUMBER = (int, float)
_GZIP_MAGIC = b"\x1f\x8b"


@attrs.frozen(eq=False)
class ForwardPassRecords:
    """Passes in file order (files in the order given), as arrays.

    `worker[i]` indexes `worker_ids` (the distinct `worker_id` values in order
    of first appearance), -1 when the record has none, EMPTY_WORKER_ID (-2)
    when it is ""; `counter[i]` is its
    `counter_id`, -1 when it has none. Features are float64 (summed over DP
    ranks); `wall_ms` is the recorded wall time in ms. `file[i]` indexes
    `sources` and `line[i]` is the 1-based line, for messages.
    """

    worker: np.ndarray  # int64, -1 = no worker_id, -2 = worker_id ""
    counter: np.ndarray  # int64, -1 = no counter_id
    num_prefill_requests: np.ndarray  # float64
    sum_prefill_tokens: np.ndarray  # float64
    num_decode_requests: np.ndarray  # float64
    sum_decode_kv_tokens: np.ndarray  # float64
    sum_draft_tokens: np.ndarray  # float64, 0 without speculative decoding
    wall_ms: np.ndarray  # float64
    worker_ids: list
    sources: list
    file: np.ndarray  # int64
    line: np.ndarray  # int64

    def __len__(self) -> int:
        return len(self.wall_ms)

    @property
    def has_prefill(self) -> np.ndarray:
        """True for a pass with any prefill request (a `prefill` carrier, §3)."""
        return self.num_prefill_requests > 0

    @property
    def tokens(self) -> np.ndarray:
        """Scheduled tokens: prefill tokens plus one per decode request, plus
        draft tokens."""
        return self.sum_prefill_tokens + self.num_decode_requests + self.sum_draft_tokens

    def kinds(self, capture_size: int) -> np.ndarray:
        """Pass kind of each record (int8): EAGER if its tokens exceed
        `capture_size`, else PIECEWISE if it has prefill, else DECODE."""
        kind = np.where(self.has_prefill, PIECEWISE, DECODE).astype(np.int8)
        kind[self.tokens > capture_size] = EAGER
        return kind

    def features(self) -> np.ndarray:
        """The (n, 5) design matrix: a column of ones, then the four features;
        (n, 6) with the draft tokens when any record has some."""
        columns = [np.ones(len(self)), self.num_prefill_requests, self.sum_prefill_tokens,
                   self.num_decode_requests, self.sum_decode_kv_tokens]
        if self.has_drafts:
            columns.append(self.sum_draft_tokens)
        return np.column_stack(columns)

    @property
    def has_drafts(self) -> bool:
        return bool(self.sum_draft_tokens.any())

    def where(self, i: int) -> str:
        """`file:line` of record i."""
        return f"{self.sources[self.file[i]]}:{self.line[i]}"

    def require_ids(self, needed_by: str) -> None:
        """Raise InputError naming the first record without a worker_id or a
        counter_id; `needed_by` says which option needs them."""
        missing = np.flatnonzero((self.worker < 0) | (self.counter < 0))
        if len(missing):
            i = missing[0]
            field = "no worker_id" if self.worker[i] < 0 else "no counter_id"
            if self.worker[i] == EMPTY_WORKER_ID:
                field = 'an empty worker_id ("")'
            raise InputError(
                f"{self.where(i)}: record has {field}; {needed_by} needs worker_id and "
                "counter_id on every record (records follow each other by worker_id "
                "and consecutive counter_id)")

    def successors(self) -> tuple:
        """`(order, follows)`: `order` sorts the records by (worker, counter);
        `follows[j]` is True when record `order[j + 1]` is the pass right after
        record `order[j]` (same worker, counter + 1). Needs ids on every record."""
        order = np.lexsort((self.counter, self.worker))
        w, c = self.worker[order], self.counter[order]
        follows = (w[1:] == w[:-1]) & (c[1:] == c[:-1] + 1)
        return order, follows


def read_records(paths) -> ForwardPassRecords:
    """Read and validate one or more records files (plain or gzip JSONL).

    A `(worker_id, counter_id)` may appear once across all the files.
    Raises InputError on the first bad line, or if there is no record at all.
    """
    reader = _Reader()
    for path in paths:
        reader.read_file(str(path))
    return reader.result()


def parse_records(lines, source: str = "<records>") -> ForwardPassRecords:
    """Validate records given as JSONL text lines (messages name `source`)."""
    reader = _Reader()
    reader.read_lines(lines, source)
    return reader.result()


class _Reader:
    """Accumulates validated records from one file after another."""

    def __init__(self):
        self.sources = []
        self.worker_ids = []
        self.worker_code = {}  # worker_id value -> index into worker_ids
        self.seen = {}  # (worker code, counter) -> (file index, line)
        self.columns = {name: [] for name in ("worker", "counter", *FEATURES, DRAFT_FEATURE,
                                              "wall_ms", "file", "line")}

    def read_file(self, path: str) -> None:
        try:
            with open(path, "rb") as f:
                gz = f.read(2) == _GZIP_MAGIC
            opener = gzip.open if gz else open
            with opener(path, "rt", encoding="utf-8-sig") as f:
                self.read_lines(f, path)
        except FileNotFoundError:
            raise InputError(f"{path}: records file not found") from None
        except UnicodeDecodeError as e:
            raise InputError(f"{path}: not UTF-8 text ({e.reason})") from None
        except (EOFError, gzip.BadGzipFile, OSError) as e:
            raise InputError(f"{path}: cannot read records file ({type(e).__name__}: {e})") from None

    def read_lines(self, lines, source: str) -> None:
        file_index = len(self.sources)
        self.sources.append(source)
        blank = 0
        count = 0
        for number, text in enumerate(lines, start=1):
            if not text.strip():
                blank = blank or number
                continue
            at = f"{source}:{number}"
            if blank:
                raise InputError(f"{source}:{blank}: blank line inside the records; "
                                 "only trailing blank lines are allowed")
            try:
                obj = json.loads(text)
            except ValueError as e:
                raise InputError(f"{at}: malformed JSON ({e}); each line must be one "
                                 "record object or a list of them (one per DP rank)") from None
            self._add(obj, at, file_index, number)
            count += 1
        if count == 0:
            raise InputError(f"{source}: no records (an empty file)")

    def _add(self, obj, at: str, file_index: int, number: int) -> None:
        if isinstance(obj, dict):
            ranks = [obj]
        elif isinstance(obj, list) and obj:
            ranks = obj
        else:
            raise InputError(f"{at}: a record must be a JSON object or a non-empty list of "
                             f"objects (one per DP rank), got {_show(obj)}")
        sums = [0.0] * len(FEATURES)
        drafts = 0.0
        wall_s = -math.inf
        for r, rank in enumerate(ranks):
            where = at if len(ranks) == 1 and isinstance(obj, dict) else f"{at}: rank {r}"
            if not isinstance(rank, dict):
                raise InputError(f"{where}: a record must be a JSON object, got {_show(rank)}")
            wall_s = max(wall_s, _number(rank, "wall_time", where, " (seconds)", signed=True))
            scheduled = rank.get("scheduled_requests")
            if not isinstance(scheduled, dict):
                what = "missing field" if scheduled is None else "not an object:"
                raise InputError(f"{where}: {what} 'scheduled_requests' (an object with "
                                 f"{', '.join(FEATURES)})")
            for k, name in enumerate(FEATURES):
                sums[k] += _number(scheduled, name, where, "", prefix="scheduled_requests.")
            if DRAFT_FEATURE in scheduled:
                drafts += _number(scheduled, DRAFT_FEATURE, where, "", prefix="scheduled_requests.")
        worker, counter = self._ids(ranks[0], at)
        if worker >= 0 and counter >= 0:
            first = self.seen.get((worker, counter))
            if first is not None:
                raise InputError(
                    f"{at}: repeated (worker_id {self.worker_ids[worker]!r}, counter_id "
                    f"{counter}), first at {self.sources[first[0]]}:{first[1]}; each pass "
                    "of a worker is recorded once")
            self.seen[(worker, counter)] = (file_index, number)
        c = self.columns
        c["worker"].append(worker)
        c["counter"].append(counter)
        for name, value in zip(FEATURES, sums):
            c[name].append(value)
        c[DRAFT_FEATURE].append(drafts)
        c["wall_ms"].append(wall_s * 1000.0)
        c["file"].append(file_index)
        c["line"].append(number)

    def _ids(self, rank: dict, at: str) -> tuple:
        """(worker code, counter) of a record; -1 for a missing one."""
        worker_id = rank.get("worker_id")
        counter_id = rank.get("counter_id")
        worker = -1
        if worker_id == "":
            worker = EMPTY_WORKER_ID
        elif worker_id is not None:
            if type(worker_id) not in (str, int):
                raise InputError(f"{at}: worker_id must be a string or an integer, "
                                 f"got {_show(worker_id)}")
            worker = self.worker_code.get(worker_id)
            if worker is None:
                worker = self.worker_code[worker_id] = len(self.worker_ids)
                self.worker_ids.append(worker_id)
        counter = -1
        if counter_id is not None:
            if type(counter_id) is not int or counter_id < 0:
                raise InputError(f"{at}: counter_id must be an integer >= 0, "
                                 f"got {_show(counter_id)}")
            counter = counter_id
        return worker, counter

    def result(self) -> ForwardPassRecords:
        if not self.columns["wall_ms"]:
            raise InputError("no records: give at least one records file with a pass")
        c = self.columns
        return ForwardPassRecords(
            worker=np.array(c["worker"], dtype=np.int64),
            counter=np.array(c["counter"], dtype=np.int64),
            **{name: np.array(c[name], dtype=np.float64) for name in (*FEATURES, DRAFT_FEATURE)},
            wall_ms=np.array(c["wall_ms"], dtype=np.float64),
            worker_ids=list(self.worker_ids),
            sources=list(self.sources),
            file=np.array(c["file"], dtype=np.int64),
            line=np.array(c["line"], dtype=np.int64),
        )


def _number(obj: dict, key: str, at: str, unit: str, prefix: str = "",
            signed: bool = False) -> float:
    """obj[key] checked: present, a number (not a bool), finite, and >= 0
    unless `signed`."""
    if key not in obj:
        return _fail(f"{at}: missing field '{prefix}{key}'{unit}")
    value = obj[key]
    if type(value) not in _NUMBER:
        return _fail(f"{at}: '{prefix}{key}' must be a number{unit}, got {_show(value)}")
    if not math.isfinite(value):
        return _fail(f"{at}: '{prefix}{key}' must be finite{unit}, got {value}")
    if value < 0 and not signed:
        return _fail(f"{at}: '{prefix}{key}' must be >= 0{unit}, got {value}")
    return float(value)


def _fail(message: str):
    raise InputError(message)


def _show(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."
