"""Each worker's load over time, from the telemetry samples (README.md,
"Outputs": summary.json `workers[*].load`).

A worker's `waiting` and `running` are its ranks' summed, its `kv_usage`
their mean (as `kv_usage_mean`). A sample stands for the interval it
closes, from the previous sample (0 for the first) to its own time — the
convention of telemetry.jsonl's counters — so the weights cover the run
once. Figures per quantity: `mean` weighted by those intervals, `p90` the
smallest sampled value the quantity was at or below for at least 90% of
that time, `max` the largest sampled value; `series` at most SERIES_POINTS
points, consecutive samples merged by their weighted mean and stamped with
the last one's time.
"""

import math

import numpy as np

QUANTITIES = ("waiting", "running", "kv_usage")
SERIES_POINTS = 100
_DIGITS = {"waiting": 3, "running": 3, "kv_usage": 6}


def worker_series(samples: list) -> dict:
    """`{(pool, worker): (t_ms, {quantity: values})}` from telemetry samples
    (one per worker-rank per tick), arrays in time order."""
    keys = {}
    which = np.array([keys.setdefault((s.get("pool"), s.get("worker", 0)), len(keys))
                      for s in samples], dtype=np.int64)
    t_ms = np.array([s["t_ms"] for s in samples], dtype=np.float64)
    columns = {q: np.array([s[q] for s in samples], dtype=np.float64) for q in QUANTITIES}
    out = {}
    for key, k in keys.items():
        mine = which == k
        times, tick = np.unique(t_ms[mine], return_inverse=True)
        values = {q: np.bincount(tick, weights=columns[q][mine], minlength=times.size)
                  for q in QUANTITIES}
        values["kv_usage"] /= np.bincount(tick, minlength=times.size)
        out[key] = (times, values)
    return out


def sample_weights(times: np.ndarray) -> np.ndarray:
    """How long each sample stands for: the interval it closes, from the
    previous sample's time (0 before the first). If they all close
    nothing (a run that ended at 0), each weighs the same."""
    weights = np.diff(times, prepend=0.0)
    return weights if weights.sum() > 0 else np.ones_like(times)


def time_weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The smallest value `v` among `values` such that the values at or
    below `v` weigh at least `q` of the total."""
    order = np.argsort(values, kind="stable")
    cumulative = np.cumsum(weights[order])
    at = int(np.searchsorted(cumulative, q * cumulative[-1] - 1e-9 * cumulative[-1]))
    return float(values[order][min(at, values.size - 1)])


def downsample(times: np.ndarray, values: np.ndarray, weights: np.ndarray, points: int):
    """At most `points` points: runs of ceil(n / points) consecutive samples,
    each merged into its weighted mean, stamped with its last sample's time."""
    n = times.size
    size = max(1, math.ceil(n / points))
    starts = np.arange(0, n, size)
    w = np.add.reduceat(weights, starts)
    mean = np.add.reduceat(values * weights, starts) / np.where(w > 0, w, 1.0)
    ends = np.minimum(starts + size, n) - 1
    return times[ends], mean


def load_figures(times: np.ndarray, values: dict) -> dict:
    """A worker's `load` dict (keys in QUANTITIES order, then `series`)."""
    weights = sample_weights(times)
    out = {}
    series = {}
    for q in QUANTITIES:
        v = values[q]
        digits = _DIGITS[q]
        out[q] = {"mean": round(float((v * weights).sum() / weights.sum()), digits),
                  "p90": round(time_weighted_quantile(v, weights, 0.9), digits),
                  "max": round(float(v.max()), digits)}
        t, merged = downsample(times, v, weights, SERIES_POINTS)
        series["t_ms"] = [round(float(x), 6) for x in t]
        series[q] = [round(float(x), digits) for x in merged]
    out["series"] = {k: series[k] for k in ("t_ms", *QUANTITIES)}
    return out


def with_load(workers: list, samples: list | None) -> list:
    """Each worker's `load` after its other figures, when the run sampled
    telemetry (`samples` not None); unchanged otherwise."""
    if samples is None:
        return workers
    series = worker_series(samples)
    for w in workers:
        found = series.get((w.get("pool"), w["worker"]))
        if found is not None:
            w["load"] = load_figures(*found)
    return workers
