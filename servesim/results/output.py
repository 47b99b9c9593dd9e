"""Writing a run's report files (README.md, "Outputs"): `summary.json`,
`requests.jsonl`, `passes.jsonl`, `telemetry.jsonl`.

One folder holds one run (README "Errors and faults"). The folder is locked
for the write (`outdir.claim`; the CLI claims it before simulating). Every file
is written into a hidden staging folder inside it first
(`.servesim-staging-PID/`); only when all are written does the set replace the
previous run's: the old `summary.json` is taken away first, every output of
the previous run this one does not write is removed (a stale `report.html`
too), the new files are renamed into place and `summary.json`, the mark of a
complete set, comes last. Renames need no space, so a write that fails (a full
disk: ENOSPC) fails in the staging folder and leaves the previous outputs as
they were; an OSError is reported as an InputError naming the file. Files in
the folder that servesim did not write are left alone, and one in the way of an
output (the user's own `report.html`) is refused before anything is written
(outdir.py, its manifest). Output is
byte-identical for identical results: floats are written with Python's `repr`
(shortest round-trip form), keys in a fixed order.
"""

import json
import math
import numbers
import os
import shutil
import threading
from itertools import repeat
from json.encoder import encode_basestring_ascii
from pathlib import Path

import numpy as np

from servesim.results.metrics import itl_quantiles
from servesim.results.records import STATUS_FINISHED, STATUS_NAMES, SimulationResult

SUMMARY = "summary.json"
REQUESTS = "requests.jsonl"
PASSES = "passes.jsonl"
TELEMETRY = "telemetry.jsonl"
ITL_QUANTILES = "itl_quantiles.json"
REPORT_FILES = (SUMMARY, REQUESTS, PASSES, TELEMETRY, ITL_QUANTILES)
HTML_REPORT = "report.html"  # written by report.py from the files above
STAGING_PREFIX = ".servesim-staging-"
# what a run's write replaces or removes: servesim's own only (outdir.py's manifest)
RUN_OUTPUTS = (*REPORT_FILES, HTML_REPORT)

REQUEST_FIELDS = (
    "id", "arrival_ms", "first_scheduled_ms", "first_token_ms", "finish_ms",
    "ttft_ms", "tpot_ms", "e2e_ms", "input_length", "output_length",
    "output_tokens", "num_preemptions", "first_admission_cached_tokens",
    "cpu_tier_cached_tokens", "recomputed_tokens", "worker", "dp_rank",
    "status", "first_token_pass", "finish_pass",
)
# disaggregated mode only: after `dp_rank` (`worker` / `dp_rank` are then the
# decode worker's, null for a request never handed off)
DISAGGREGATED_FIELDS = ("prefill_worker", "prefill_dp_rank", "decode_worker",
                        "kv_transfer_ms", "transferred_tokens")
# session workloads only: after `id`
SESSION_FIELDS = ("session_id", "turn")

# speculative decoding only, at the end: real drafts scheduled, accepted, and
# their ratio (null with no draft)
SPEC_FIELDS = ("spec_drafted", "spec_accepted", "spec_acceptance_rate")
# `backend: sglang` only, last (docs/sglang.md, "Outputs")
SGLANG_FIELDS = ("num_retractions", "cached_tokens", "finish_reason")


def _floats(arr) -> list:
    """JSON texts of a float array: Python float repr, or null for NaN/inf
    ("never"). Each distinct value is formatted once: requests admitted or
    finished in one pass share its instants (a quarter of the values of a
    100,000-request run are distinct; `repr` was most of the time writing
    requests.jsonl took). Equal floats have equal reprs, except 0.0 and
    -0.0, which `np.unique` merges: an array with a negative zero is
    formatted value by value."""
    arr = np.asarray(arr, dtype=np.float64)
    if len(arr) < 64 or np.signbit(arr).any():
        return _float_texts(arr)
    distinct, inverse = np.unique(arr, return_inverse=True)
    return np.array(_float_texts(distinct), dtype=object)[inverse].tolist()


def _float_texts(arr) -> list:
    values = arr.tolist()
    if np.isfinite(arr).all():
        return list(map(repr, values))
    isfinite = math.isfinite
    return [repr(v) if isfinite(v) else "null" for v in values]


def _ints(arr) -> list:
    """JSON texts of an integer array, each distinct value formatted once
    (most columns hold a few: lengths, counts, workers)."""
    if len(arr) < 64:
        return list(map(str, arr.tolist()))
    distinct, inverse = np.unique(arr, return_inverse=True)
    return np.array(list(map(str, distinct.tolist())), dtype=object)[inverse].tolist()


def _passes(arr) -> list:
    """JSON texts of pass indices: -1 ("never") is null."""
    arr = np.asarray(arr)
    return [t if v >= 0 else "null" for t, v in zip(_ints(arr), arr.tolist())] if (arr < 0).any() else _ints(arr)


def _ids(ids) -> list:
    """JSON texts of request ids, as json.dumps would write them."""
    out = []
    for v in ids:
        if isinstance(v, str):
            out.append(encode_basestring_ascii(v))
        elif isinstance(v, numbers.Integral) and not isinstance(v, bool):
            out.append(str(int(v)))
        else:
            out.append(json.dumps(v))
    return out


def request_lines(result: SimulationResult, chunk: int = 8192):
    """One JSON text per request, fields in the order of REQUEST_FIELDS (with
    DISAGGREGATED_FIELDS after `dp_rank` in disaggregated mode, SESSION_FIELDS
    after `id` for a session workload), as lists of
    at most `chunk` lines (so a run of 100,000 requests never holds all its
    texts at once).

    ttft/e2e/tpot are null unless the request finished; tpot is also null
    with fewer than 2 output tokens. Each column is converted to JSON texts
    once per chunk, then rows are joined column-wise (no per-row dict or
    json.dumps).
    """
    r = result.records
    finished = r.status == STATUS_FINISHED
    nan = np.nan
    ntok = r.output_tokens
    with np.errstate(invalid="ignore", divide="ignore"):
        ttft = np.where(finished, r.first_token_ms - r.arrival_ms, nan)
        e2e = np.where(finished, r.finish_ms - r.arrival_ms, nan)
        tpot = np.where(
            finished & (ntok >= 2),
            (r.finish_ms - r.first_token_ms) / np.maximum(ntok - 1, 1),
            nan,
        )
    disaggregated = r.decode_worker is not None
    names = REQUEST_FIELDS
    if disaggregated:
        at = REQUEST_FIELDS.index("dp_rank") + 1
        names = REQUEST_FIELDS[:at] + DISAGGREGATED_FIELDS + REQUEST_FIELDS[at:]
    sessions = r.session is not None
    if sessions:
        names = names[:1] + SESSION_FIELDS + names[1:]
        session_texts = _ids(r.session_ids)

    spec = r.spec_drafted is not None
    if spec:
        names = names + SPEC_FIELDS
        with np.errstate(invalid="ignore", divide="ignore"):
            spec_rate = np.where(r.spec_drafted > 0, r.spec_accepted / r.spec_drafted, nan)
    sglang = r.finish_reason is not None
    if sglang:
        names = names + SGLANG_FIELDS
    for start in range(0, len(r.ids), chunk):
        s = slice(start, start + chunk)
        status = ['"%s"' % STATUS_NAMES[x] for x in r.status[s].tolist()]
        placement = (_ints(r.worker[s]), _ints(r.dp_rank[s]))
        if disaggregated:  # -1: no such worker
            placement = (_passes(r.worker[s]), _passes(r.dp_rank[s]),
                         _ints(r.prefill_worker[s]), _ints(r.prefill_dp_rank[s]),
                         _passes(r.decode_worker[s]), _floats(r.kv_transfer_ms[s]),
                         _passes(r.transferred_tokens[s]))
        by_session = ()
        if sessions:
            by_session = ([session_texts[k] for k in r.session[s].tolist()], _ints(r.turn[s]))
        columns = (
            _ids(r.ids[s]), *by_session, _floats(r.arrival_ms[s]), _floats(r.first_scheduled_ms[s]),
            _floats(r.first_token_ms[s]), _floats(r.finish_ms[s]), _floats(ttft[s]),
            _floats(tpot[s]), _floats(e2e[s]), _ints(r.input_length[s]),
            _ints(r.output_length[s]), _ints(ntok[s]), _ints(r.num_preemptions[s]),
            _ints(r.first_admission_cached_tokens[s]), _ints(r.cpu_tier_cached_tokens[s]),
            _ints(r.recomputed_tokens[s]), *placement, status,
            _passes(r.first_token_pass[s]), _passes(r.finish_pass[s]),
        )
        if spec:
            columns += (_ints(r.spec_drafted[s]), _ints(r.spec_accepted[s]),
                        _floats(spec_rate[s]))
        if sglang:
            columns += (_ints(r.num_retractions[s]), _ints(r.cached_tokens[s]),
                        ["null" if x is None else '"%s"' % x for x in r.finish_reason[s]])
        parts = []
        for i, (name, column) in enumerate(zip(names, columns)):
            parts.append(repeat(('{"%s": ' if i == 0 else ', "%s": ') % name))
            parts.append(column)
        parts.append(repeat("}"))
        yield list(map("".join, zip(*parts)))


def dict_lines(rows) -> list:
    """One JSON text per dict, keys in the order given (passes, telemetry)."""
    dumps = json.JSONEncoder(allow_nan=False).encode
    return [dumps(row) for row in rows]


def _write_text(path: Path, chunks) -> None:
    """Write chunks of lines: each a list of texts (each line then ends in a
    newline) or bytes already holding whole lines, newlines included, which
    may be overwritten once the chunk after next is asked for
    (`PassLog.chunks`). Those are written by a second thread while
    the next is made: a file's fresh pages can cost as much as its formatting."""
    with open(path, "wb") as f, _Writer(f) as writer:
        for lines in chunks:
            if isinstance(lines, list):
                if lines:
                    writer.write(("\n".join(lines) + "\n").encode("utf-8"))
            else:
                writer.write(lines)


class _Writer:
    """Writes to `file` on a thread of its own, one write at a time, in order:
    `write` returns once the previous write is done and this one has begun.
    A write's error is raised by the next `write` or on leaving."""

    def __init__(self, file):
        self.file = file
        self.thread = None
        self.error = None

    def _write(self, data):
        try:
            self.file.write(data)
        except BaseException as exc:  # raised on the caller's thread
            self.error = exc

    def wait(self):
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    def write(self, data):
        self.wait()
        self.thread = threading.Thread(target=self._write, args=(data,), daemon=True)
        self.thread.start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.wait()


def write_outputs(
    out_dir,
    summary: dict,
    result: SimulationResult,
    per_request: bool,
    pass_log: bool,
    telemetry: bool,
) -> Path:
    """Write the report files of one run into `out_dir` (created if needed).

    `passes.jsonl` / `telemetry.jsonl` are written when asked for and the
    result carries them; with `requests.jsonl` goes `itl_quantiles.json`, the
    inter-token latency distribution (requests.jsonl has no per-token times).
    Returns the output directory.
    """
    from servesim.results.outdir import claim, output_error, record_written

    contents = {}
    if per_request:
        contents[REQUESTS] = lambda: request_lines(result)
        contents[ITL_QUANTILES] = lambda: [[json.dumps(result.itl_quantiles
                                                       or itl_quantiles(result.records))]]
    if pass_log and result.pass_log is not None:
        log = result.pass_log  # a list of dicts, or a compiled run's log (replay/pass_log.py)
        contents[PASSES] = (log.chunks if hasattr(log, "chunks")
                            else lambda: [dict_lines(log)])
    if telemetry and result.telemetry is not None:
        contents[TELEMETRY] = lambda: [dict_lines(result.telemetry)]
    contents[SUMMARY] = lambda: [[json.dumps(summary, indent=2, allow_nan=False)]]

    with claim(out_dir, replaces=RUN_OUTPUTS) as out:
        for stale in out.glob(STAGING_PREFIX + "*"):  # of a run that was killed (we hold the lock)
            shutil.rmtree(stale, ignore_errors=True)
        staging = out / f"{STAGING_PREFIX}{os.getpid()}"
        name = None
        try:
            staging.mkdir()
            for name, make_lines in contents.items():
                _write_text(staging / name, make_lines())
        except BaseException as exc:
            shutil.rmtree(staging, ignore_errors=True)
            if isinstance(exc, OSError):
                raise output_error(out / (name or ""), exc, "write the run's outputs "
                                   "(the previous outputs are kept)") from None
            raise
        try:
            _replace_outputs(out, staging, contents)
            record_written(out, contents)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return out


def _replace_outputs(out: Path, staging: Path, contents) -> None:
    """Put the staged set in place of the previous run's outputs;
    summary.json goes first and comes back last."""
    (out / SUMMARY).unlink(missing_ok=True)
    for name in (*REPORT_FILES, HTML_REPORT):
        if name not in contents:
            (out / name).unlink(missing_ok=True)
    for name in contents:
        if name != SUMMARY:
            os.replace(staging / name, out / name)
    os.replace(staging / SUMMARY, out / SUMMARY)
