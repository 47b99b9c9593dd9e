"""`--launch-stall` (docs/fitting.md): move each pass's launch back to its own record.

With async scheduling on a one-GPU vLLM worker, pass k+1 is launched before the
engine processes pass k's output, and the record of pass k ends when that
output is processed: the part of pass k+1's launch that pass k did not hide
lands in the record of pass k. The stall file says how much, by the kind of
the carrying record and of the next pass:

    {"max_cudagraph_capture_size": 4096,
     "stall_ms": {"decode":  {"piecewise": 50.0, "eager": 180.0},
                  "prefill": {"piecewise": 10.0, "eager": 190.0}}}

The carrier is `prefill` if its record has any prefill request, else
`decode`; the next pass is `eager` if its tokens exceed the capture size, else
`piecewise` if it has prefill, else `decode` (which launches in the shadow of
the pass before it: nothing is carried for it).
"""

import json
import math

import numpy as np

from servesim.errors import InputError
from servesim.fitting.records import DECODE, EAGER, PIECEWISE, ForwardPassRecords

CAPTURE_KEY = "max_cudagraph_capture_size"
STALL_KEY = "stall_ms"
CARRIERS = ("decode", "prefill")
NEXT_KINDS = ("piecewise", "eager")


def load_launch_stall(path) -> dict:
    """Read and validate a stall file; returns its contents (a dict equal to
    the JSON document). Every problem is an InputError naming the file and key:
    keys other than exactly `max_cudagraph_capture_size` and `stall_ms`; a
    missing or unknown carrier (decode, prefill) or next kind (piecewise,
    eager); a stall that is not a finite number >= 0; a capture size that is
    not a positive integer."""
    path = str(path)
    data = _read_json(path)
    if not isinstance(data, dict):
        raise InputError(f"{path}: a stall file must be a JSON object with keys "
                         f"{CAPTURE_KEY}, {STALL_KEY}; got {_show(data)}")
    _exact_keys(path, "", data, (CAPTURE_KEY, STALL_KEY), "key")
    capture = data[CAPTURE_KEY]
    if type(capture) is not int or capture < 1:
        raise InputError(f"{path}: {CAPTURE_KEY}: must be a positive integer (tokens), "
                         f"got {_show(capture)}")
    stall = data[STALL_KEY]
    if not isinstance(stall, dict):
        raise InputError(f"{path}: {STALL_KEY}: must be an object with carriers "
                         f"{', '.join(CARRIERS)}; got {_show(stall)}")
    _exact_keys(path, STALL_KEY, stall, CARRIERS, "carrier")
    for carrier in CARRIERS:
        key = f"{STALL_KEY}.{carrier}"
        entries = stall[carrier]
        if not isinstance(entries, dict):
            raise InputError(f"{path}: {key}: must be an object with next-pass kinds "
                             f"{', '.join(NEXT_KINDS)}; got {_show(entries)}")
        _exact_keys(path, key, entries, NEXT_KINDS, "next-pass kind")
        for kind in NEXT_KINDS:
            value = entries[kind]
            if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
                raise InputError(f"{path}: {key}.{kind}: must be a finite number >= 0 (ms), "
                                 f"got {_show(value)}")
    return data


def stall_table(stall: dict) -> np.ndarray:
    """`table[carrier, next_kind]` in ms: carrier 0 decode / 1 prefill, next
    kind DECODE (always 0), PIECEWISE, EAGER."""
    table = np.zeros((2, 3), dtype=np.float64)
    for c, carrier in enumerate(CARRIERS):
        table[c, PIECEWISE] = stall[STALL_KEY][carrier]["piecewise"]
        table[c, EAGER] = stall[STALL_KEY][carrier]["eager"]
    assert table[:, DECODE].sum() == 0.0
    return table


def charge_own_launch(records: ForwardPassRecords, stall: dict) -> np.ndarray:
    """The wall times (ms) with each launch charged to its own pass:
    `wall'[i] = wall[i] - carried[i] + carried[i-1]`, where i-1 is the pass
    right before i on its worker (consecutive counter_id), if recorded.
    Needs worker_id and counter_id on every record (InputError otherwise).
    `records.wall_ms` is not modified; the sum over a worker's unbroken run
    of passes is unchanged. An all-zero stall table returns the wall times."""
    records.require_ids("--launch-stall")
    order, follows = records.successors()
    carried = _carried(records, stall, order, follows)
    wall = records.wall_ms - carried
    wall[order[1:][follows]] += carried[order[:-1][follows]]
    return wall


def require_nonnegative(records: ForwardPassRecords, wall_ms: np.ndarray, stall_path) -> None:
    """Raise InputError naming the first record (file order) whose time is
    below 0 ms after `charge_own_launch`: the stall file says its pass gave
    back more launch than the record holds, so the stall values do not fit
    these records (a pass's own time is never negative)."""
    negative = np.flatnonzero(wall_ms < 0)
    if not len(negative):
        return
    i = negative[0]
    more = f" ({len(negative) - 1} more record(s) too)" if len(negative) > 1 else ""
    raise InputError(
        f"{records.where(i)}: {wall_ms[i]:.6g} ms after --launch-stall {stall_path} "
        f"(recorded {records.wall_ms[i]:.6g} ms){more}: a pass's own time cannot be "
        "negative; the stall values are larger than what these records carry")


def _carried(records, stall, order, follows) -> np.ndarray:
    table = stall_table(stall)
    carrier = records.has_prefill.astype(np.int64)
    kind = records.kinds(stall[CAPTURE_KEY])
    carried = np.zeros(len(records), dtype=np.float64)
    this, after = order[:-1][follows], order[1:][follows]
    carried[this] = table[carrier[this], kind[after]]
    return carried


# ------------------------------------------------------------------ helpers


def _read_json(path: str):
    from servesim.config.yaml_input import read_text

    text = read_text(path, "launch stall file")
    try:
        return json.loads(text, object_pairs_hook=lambda pairs: _no_duplicates(path, pairs))
    except json.JSONDecodeError as e:
        raise InputError(f"{path}:{e.lineno}: malformed JSON: {e.msg} (column {e.colno})") from None


def _no_duplicates(path: str, pairs) -> dict:
    out = {}
    for key, value in pairs:
        if key in out:
            raise InputError(f"{path}: key {key!r} is given twice")
        out[key] = value
    return out


def _exact_keys(path: str, at: str, data: dict, keys: tuple, what: str) -> None:
    """Raise unless `data` has exactly `keys` (a missing one first)."""
    prefix = f"{at}." if at else ""
    accepted = ", ".join(keys)
    for key in keys:
        if key not in data:
            raise InputError(f"{path}: {prefix}{key}: missing {what} (needs exactly {accepted})")
    for key in data:
        if key not in keys:
            note = ""
            if what == "next-pass kind" and key == "decode":
                note = "; a decode pass launches in the shadow of the pass before it, " \
                       "so nothing is carried for it"
            raise InputError(f"{path}: {prefix}{key}: unknown {what} (accepted: {accepted}){note}")


def _show(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."
