"""Latency statistics as every summary states them: the mean and the
percentiles (nearest rank: the value at rank ceil(q·n), as numpy's
`inverted_cdf`), quantiles of sorted samples, and the rounding that keeps
summary.json stable across runs and machines (6 decimals)."""

import math

import numpy as np





PERCENTILES = (50, 90, 95, 99)
STAT_KEYS = ("mean", "p50", "p90", "p95", "p99", "max")
ROUND_DIGITS = 6


def _round(x) -> float | None:
    """A JSON-native float rounded to ROUND_DIGITS, or None if not finite."""
    x = float(x)
    if not math.isfinite(x):
        return None
    return round(x, ROUND_DIGITS)


def _rate(count, duration_ms: float) -> float:
    """`count` per second over `duration_ms`; 0.0 for an empty run."""
    if duration_ms <= 0:
        return 0.0
    return _round(float(count) / (duration_ms / 1000.0))


def percentiles_of_sorted(ordered: np.ndarray, qs=PERCENTILES) -> list:
    """numpy.percentile's default ("linear") on an already sorted array.

    Rank v = q/100 * (n-1) between order statistics a = x[floor(v)] and
    b = x[floor(v)+1], interpolated as numpy's `_lerp` does (a + (b-a)*g, or
    b - (b-a)*(1-g) when g >= 0.5) so the values equal np.percentile's.
    Only those order statistics are read: an array partitioned at them
    (`_read_ranks`) does as well as a sorted one.
    """
    out = []
    for rank, lo, hi in _percentile_ranks(ordered.size, qs):
        g = rank - lo
        a = float(ordered[lo])
        d = float(ordered[hi]) - a
        out.append(float(ordered[hi]) - d * (1 - g) if g >= 0.5 else a + d * g)
    return out


def _percentile_ranks(n, qs=PERCENTILES) -> list:
    """For each percentile q of n samples: its rank v = q/100 * (n-1) and the
    order statistics it lies between, floor(v) and floor(v)+1 (at most n-1)."""
    ranks = []
    for q in qs:
        rank = q / 100 * (n - 1)
        lo = int(math.floor(rank))
        ranks.append((rank, lo, min(lo + 1, n - 1)))
    return ranks


def latency_stats(samples: np.ndarray) -> dict:
    """{mean, p50, p90, p95, p99, max} of `samples` (ms); all None if empty.

    Percentiles are numpy.percentile's default (linear interpolation between
    order statistics).
    """
    samples = np.asarray(samples, dtype=np.float64)
    if samples.size == 0:
        return {key: None for key in STAT_KEYS}
    mean = samples.mean()
    samples.sort()  # in place: callers hand over arrays they no longer need
    return _sorted_stats(mean, samples)


def _sorted_stats(mean, ordered: np.ndarray) -> dict:
    """latency_stats' dict from the samples' mean and the sorted samples."""
    values = (mean, *percentiles_of_sorted(ordered), ordered[-1])
    return {key: _round(v) for key, v in zip(STAT_KEYS, values)}


def quantiles_of_sorted(ordered: np.ndarray, q: np.ndarray) -> np.ndarray:
    """np.quantile(ordered, q) (method "linear") of an already sorted,
    non-empty array, with numpy's own arithmetic (numpy/lib/
    _function_base_impl.py: `_quantile`, `_get_indexes`, `_lerp`), so the
    values are bit-identical: virtual index (n-1)*q, neighbours floor and
    floor+1 (both the last sample from index n-1 on), weight = index - floor,
    interpolated as a + (b-a)*g, or b - (b-a)*(1-g) when g >= 0.5.
    np.quantile itself would copy the samples and partition them again around
    every index (seconds on millions of ITL samples)."""
    virtual, lower, upper = _quantile_ranks(ordered.size, q)
    gamma = virtual - lower
    a = ordered[lower]
    b = ordered[upper]
    diff = b - a
    out = a + diff * gamma
    np.subtract(b, diff * (1 - gamma), out=out, where=gamma >= 0.5)
    return out


def _quantile_ranks(n, q):
    """numpy's (`_get_indexes`) for quantiles q of n samples: the virtual
    indices (n-1)*q and the order statistics each lies between, floor and
    floor+1, both -1 (the last) from n-1 on."""
    virtual = (n - 1) * q
    lower = np.floor(virtual)
    upper = lower + 1
    last = virtual >= n - 1
    lower[last] = -1
    upper[last] = -1
    return virtual, lower.astype(np.intp), upper.astype(np.intp)
