"""Score a fitted model on forward-pass records (docs/fitting.md).

Per pass kind (decode, piecewise, eager; `ForwardPassRecords.kinds`): the
number of records, mean recorded and predicted ms, mean signed and absolute
percentage error of the prediction against the record; and the total
predicted against the total recorded time. Percentage errors skip records of
0 ms or less (a raw record can be negative: the record before an eager pass
carries its launch; after `--launch-stall` none is, `servesim.cli.fitting._load` refuses
that); `pct_records` counts the rest.
"""

import numpy as np

from servesim.fitting.records import KIND_NAMES, ForwardPassRecords


def predict(coefficients, records: ForwardPassRecords) -> np.ndarray:
    """Predicted ms per record: the `fitted` formula of
    `servesim.engine.pricing.price_pass`, vectorised, with the same operations
    in the same order (so the same floats), clamped at 0."""
    c = [float(v) for v in coefficients]
    t = (c[0] + c[1] * records.num_prefill_requests + c[2] * records.sum_prefill_tokens
         + c[3] * records.num_decode_requests + c[4] * records.sum_decode_kv_tokens)
    if len(c) > 5:
        t = t + np.where(records.sum_draft_tokens != 0, c[5] * records.sum_draft_tokens, 0.0)
    return np.maximum(t, 0.0)


def evaluate_records(records: ForwardPassRecords, wall_ms: np.ndarray, coefficients,
             capture_size: int) -> dict:
    """The report: {"kinds": {kind: {...}}, "total": {...}} (plain JSON data).

    For each kind: records, mean_recorded_ms, mean_predicted_ms,
    mean_error_pct (signed, (predicted - recorded) / recorded), mean_abs_error_pct,
    pct_records (records with recorded > 0); means are None for an empty kind.
    Total: records, recorded_ms, predicted_ms, error_pct (None if recorded is 0).
    """
    predicted = predict(coefficients, records)
    kind = records.kinds(capture_size)
    kinds = {}
    for k, name in enumerate(KIND_NAMES):
        mask = kind == k
        kinds[name] = _kind_stats(wall_ms[mask], predicted[mask])
    recorded_total = float(wall_ms.sum())
    predicted_total = float(predicted.sum())
    total = {
        "records": len(records),
        "recorded_ms": recorded_total,
        "predicted_ms": predicted_total,
        "error_pct": (100.0 * (predicted_total - recorded_total) / recorded_total
                      if recorded_total != 0 else None),
    }
    return {"capture_size": capture_size, "kinds": kinds, "total": total}


def _kind_stats(recorded: np.ndarray, predicted: np.ndarray) -> dict:
    n = len(recorded)
    positive = recorded > 0
    error = (predicted[positive] - recorded[positive]) / recorded[positive]
    return {
        "records": n,
        "mean_recorded_ms": float(recorded.mean()) if n else None,
        "mean_predicted_ms": float(predicted.mean()) if n else None,
        "mean_error_pct": 100.0 * float(error.mean()) if len(error) else None,
        "mean_abs_error_pct": 100.0 * float(np.abs(error).mean()) if len(error) else None,
        "pct_records": int(positive.sum()),
    }


def format_table(report: dict) -> str:
    """The human table printed by `servesim evaluate`."""
    lines = [f"{'kind':<10} {'records':>8} {'recorded ms':>12} {'predicted ms':>13} "
             f"{'error':>8} {'|error|':>8}"]
    for name, s in report["kinds"].items():
        lines.append(f"{name:<10} {s['records']:>8} {_num(s['mean_recorded_ms']):>12} "
                     f"{_num(s['mean_predicted_ms']):>13} {_pct(s['mean_error_pct']):>8} "
                     f"{_pct(s['mean_abs_error_pct'], sign=''):>8}")
    t = report["total"]
    lines.append(f"{'total':<10} {t['records']:>8} {_num(t['recorded_ms']):>12} "
                 f"{_num(t['predicted_ms']):>13} {_pct(t['error_pct']):>8}")
    skipped = sum(s["records"] - s["pct_records"] for s in report["kinds"].values())
    notes = [f"(means per record in ms; total in ms; passes over "
             f"{report['capture_size']} tokens are eager)"]
    if skipped:
        notes.append(f"({skipped} record(s) of 0 ms or less left out of the % errors)")
    return "\n".join(lines + notes)


def _num(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def _pct(value, sign="+") -> str:
    return "-" if value is None else f"{value:{sign}.2f}%"
