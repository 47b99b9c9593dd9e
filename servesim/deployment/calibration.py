"""Correcting the database with measured passes (docs/deployment.md).

From forward-pass records (the `servesim fit` input, docs/fitting.md) of the
deployment a config describes, one factor per pass kind — prefill-only,
decode-only, mixed — that scales the database's pass times: the least-squares
factor through the origin, `sum(measured × predicted) / sum(predicted²)`, over
that kind's records. A kind with fewer than MIN_RECORDS records keeps 1.
`timing: {type: aic, calibration: FILE}` applies them.
"""

import numpy as np

from servesim.deployment.table_pricing import table_pass_ms

MIN_RECORDS = 5
KINDS = ("prefill", "decode", "mixed")


def record_kinds(records) -> np.ndarray:
    """0 prefill-only, 1 decode-only, 2 mixed, -1 empty, per record."""
    pre = records.sum_prefill_tokens > 0
    dec = records.num_decode_requests > 0
    return np.where(pre & dec, 2, np.where(pre, 0, np.where(dec, 1, -1)))


def predicted_ms(table, records) -> np.ndarray:
    out = np.zeros(len(records.wall_ms))
    for i in range(out.size):
        out[i] = table_pass_ms(table, int(records.sum_prefill_tokens[i]),
                               int(records.num_prefill_requests[i]), 0,
                               int(records.num_decode_requests[i]), int(records.sum_decode_kv_tokens[i]))
    return out


def fit_factors(table, records) -> dict:
    """{kind: {factor, records, mape_before, mape_after}}."""
    kinds = record_kinds(records)
    pred = predicted_ms(table, records)
    meas = records.wall_ms
    out = {}
    for k, name in enumerate(KINDS):
        sel = (kinds == k) & (pred > 0)
        n = int(sel.sum())
        factor = 1.0
        if n >= MIN_RECORDS:
            factor = float((meas[sel] * pred[sel]).sum() / (pred[sel] ** 2).sum())
        before = float(np.mean(np.abs(pred[sel] / meas[sel] - 1))) * 100 if n else None
        after = float(np.mean(np.abs(factor * pred[sel] / meas[sel] - 1))) * 100 if n else None
        out[name] = {"factor": factor, "records": n, "mape_before_pct": before, "mape_after_pct": after}
    return out


def calibration_document(fit: dict, deployment: dict, package: str) -> dict:
    return {"type": "aic_calibration",
            "factors": {name: fit[name]["factor"] for name in KINDS},
            "deployment": deployment, "package": package,
            "fit": fit}
