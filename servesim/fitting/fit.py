"""Fit the `fitted` pass-time model (docs/fitting.md) and write its file.

Ordinary least squares with an intercept of the pass time (ms) on the four
record features, either per record or, with `--window W`, on window sums:
each worker's records are cut into windows of at least W consecutive passes
that end only where the *next* record is a decode pass (no prefill, at most
the capture size of tokens), at a counter gap, or at the worker's last
record. A decode pass launches in the shadow of the pass before it, so no
launch stall crosses such a cut and the window sums are exact.

Records (or windows) that cannot determine all five coefficients — fewer than
five, or a rank-deficient design — are an InputError naming the features
whose coefficients are not determined, not a least-norm guess.
"""

import os
import tempfile

import attrs
import numpy as np
from ruamel.yaml import YAML
from ruamel.yaml.representer import RoundTripRepresenter

from servesim.errors import InputError
from servesim.fitting.records import DECODE, ForwardPassRecords
from servesim.engine.fitted_formula import FITTED_FEATURES, FITTED_SPEC_FEATURE


@attrs.frozen
class Fit:
    """A least-squares fit: five coefficients (ms, in FITTED_FEATURES order),
    its r2 and mean absolute percentage error (a fraction) on the rows it was
    fitted on (records, or window sums), the number of rows, and the rank of
    the design matrix (always full: `fit_ols` refuses a design that cannot
    determine every coefficient)."""

    coefficients: tuple
    r2: float | None
    mape: float | None
    rows: int
    rank: int


def fit_ols(x: np.ndarray, y: np.ndarray, rows: str = "records") -> Fit:
    """OLS of `y` on the columns of `x` (the first is the intercept's: ones,
    or window lengths). Columns are scaled to unit max before the solve, so a
    feature in the millions (KV tokens) does not swamp one in the ones.
    InputError (:func:`require_determined`) when `x` cannot determine every
    coefficient; `rows` names what a row is in that message."""
    scale = np.abs(x).max(axis=0) if len(x) else np.ones(x.shape[1])
    scale[scale == 0] = 1.0
    require_determined(x / scale, x, rows)
    solution, _, rank, _ = np.linalg.lstsq(x / scale, y, rcond=None)
    coefficients = solution / scale
    predicted = x @ coefficients
    return Fit(coefficients=tuple(float(c) for c in coefficients),
               r2=r_squared(y, predicted), mape=mean_abs_pct_error(y, predicted),
               rows=len(y), rank=int(rank))


def require_determined(scaled: np.ndarray, x: np.ndarray, rows: str) -> None:
    """Raise InputError unless the design `x` (and `scaled`, its columns at
    unit max) determines all its coefficients: at least as many rows as
    coefficients, and full column rank. A coefficient is not determined when
    it can change along the design's null space without changing any
    prediction; the message names those features and why (0 in every row,
    the same value in every row, or moving only together with others).
    The rank uses `numpy.linalg.lstsq`'s default tolerance."""
    n, k = x.shape
    names = FITTED_FEATURES
    if n < k:
        raise InputError(
            f"{n} {rows} cannot determine the {k} coefficients of the model ({', '.join(names)}): "
            f"a fit needs at least {k} {rows} whose features vary independently")
    _, sv, vt = np.linalg.svd(scaled, full_matrices=False)
    tol = sv.max(initial=0.0) * max(n, k) * np.finfo(np.float64).eps
    null = vt[sv <= tol] if sv.max(initial=0.0) > 0 else np.eye(k)
    if not len(null):
        return
    free = np.flatnonzero(np.linalg.norm(null, axis=0) > 1e-6)
    reasons = []
    for j in free:
        column = x[:, j]
        if j > 0 and not column.any():
            reasons.append(f"{names[j]} (0 in every {rows[:-1]})")
        elif j > 0 and np.all(column == column[0]) and np.all(x[:, 0] == x[0, 0]):
            reasons.append(f"{names[j]} (the same, {column[0]:g}, in every {rows[:-1]}, "
                           "so it cannot be told from the intercept)")
        else:
            reasons.append(names[j])
    rank = k - len(null)
    raise InputError(
        f"the {rows} cannot determine the coefficient(s) of {', '.join(reasons)}: the "
        f"features have rank {rank} of {k} over {n} {rows} (these never vary independently "
        f"of each other and the rest); add {rows} where they do")


def fit_records(records: ForwardPassRecords, wall_ms: np.ndarray) -> Fit:
    """OLS of each record's time on its own features."""
    return fit_ols(records.features(), wall_ms)


def fit_windows(records: ForwardPassRecords, wall_ms: np.ndarray, window: int,
                capture_size: int) -> Fit:
    """OLS on the feature and time sums of the windows of `window_bounds`."""
    order, starts = window_bounds(records, window, capture_size)
    x, y = window_sums(records.features(), wall_ms, order, starts)
    return fit_ols(x, y, "windows")


def window_bounds(records: ForwardPassRecords, window: int, capture_size: int) -> tuple:
    """`(order, starts)`: `order` sorts the records by (worker, counter); the
    windows are `order[starts[j]:starts[j + 1]]` (the last runs to the end).

    A window ends after at least `window` records where the next record is a
    decode pass, and always at a counter gap or a worker's last record (those
    windows may be shorter). Needs worker_id and counter_id on every record."""
    if type(window) is not int or window < 1:
        raise InputError(f"--window: must be an integer >= 1, got {window!r}")
    records.require_ids("--window")
    order, follows = records.successors()
    next_is_decode = records.kinds(capture_size)[order[1:]] == DECODE
    starts = [0]
    length = 1
    for j in range(len(order) - 1):
        if not follows[j] or (length >= window and next_is_decode[j]):
            starts.append(j + 1)
            length = 1
        else:
            length += 1
    return order, np.array(starts, dtype=np.int64)


def window_sums(x: np.ndarray, y: np.ndarray, order: np.ndarray, starts: np.ndarray) -> tuple:
    """Column sums of `x` and sums of `y` over each window `order[starts[j]:starts[j+1]]`."""
    return np.add.reduceat(x[order], starts, axis=0), np.add.reduceat(y[order], starts)


def r_squared(y: np.ndarray, predicted: np.ndarray) -> float | None:
    """1 - SS_res / SS_tot; None when y is constant (undefined)."""
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    if ss_tot == 0.0:
        return None
    return 1.0 - float(np.sum((y - predicted) ** 2)) / ss_tot


def mean_abs_pct_error(y: np.ndarray, predicted: np.ndarray) -> float | None:
    """Mean of |predicted - y| / y over the rows with y > 0, as a fraction;
    None when there is no such row."""
    positive = y > 0
    if not positive.any():
        return None
    return float(np.mean(np.abs(predicted[positive] - y[positive]) / y[positive]))


def model_features(num_coefficients: int) -> list:
    """The feature names of a model with that many coefficients: the five of
    FITTED_FEATURES, or six with the draft tokens of speculative decoding."""
    if num_coefficients == len(FITTED_FEATURES):
        return list(FITTED_FEATURES)
    if num_coefficients == len(FITTED_FEATURES) + 1:
        return [*FITTED_FEATURES, FITTED_SPEC_FEATURE]
    raise ValueError(f"a fitted model has {len(FITTED_FEATURES)} or {len(FITTED_FEATURES) + 1} "
                     f"coefficients, got {num_coefficients}")


def write_model(path, coefficients, records: int, r2, mape, metadata: dict) -> None:
    """Write the model file of docs/fitting.md (loads with
    `servesim.config.config.read_fitted_model`). `metadata` is
    `{source: [file names], launch_stall: <stall file contents> | None,
    window: W | None}`. Written to a temporary file and renamed, so a failure
    never leaves a half-written model."""
    coefficients = [float(c) for c in coefficients]
    features = model_features(len(coefficients))
    doc = {
        "type": "fitted",
        "features": features,
        "coefficients_ms": coefficients,
        "records": int(records),
        "r2": _rounded(r2),
        "mape": _rounded(mape),
        "metadata": metadata,
    }
    yaml = YAML(typ="rt")
    yaml.default_flow_style = None  # lists and leaf mappings inline, as in the spec
    yaml.width = 4096  # never wrap a list
    yaml.Representer = _Representer
    path = str(path)
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=".", suffix=".tmp", dir=directory)
    except OSError as e:
        raise InputError(f"{path}: cannot write the model file: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            yaml.dump(doc, f)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would make the model private
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise InputError(f"{path}: cannot write the model file: {e.strerror or e}") from None
        raise


class _Representer(RoundTripRepresenter):
    """Round-trip YAML that writes None as an explicit `null`."""


_Representer.add_representer(
    type(None), lambda rep, _: rep.represent_scalar("tag:yaml.org,2002:null", "null"))


def _rounded(value):
    """r2 and mape to 6 significant digits (None stays None)."""
    return None if value is None else float(f"{value:.6g}")
