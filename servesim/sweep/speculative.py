"""Speculative decoding as a sweep axis (README.md, "Speculative decoding"):
with a grid key `engine.speculative` (a value of null is the plain run) or
one of its sub-keys, sweep.csv gains each point's mean acceptance length and,
for a speculative point, its speedup over the plain point of the same other
values: TPOT (plain mean TPOT over its mean TPOT) and output throughput (its
output tokens/s over the plain point's)."""

from servesim.results.report import is_spec_key

COLUMNS = ("mean_acceptance_length", "tpot_speedup", "throughput_speedup")


def has_axis(keys) -> bool:
    return any(is_spec_key(k) for k in keys)


def _number(summary, key, sub=None):
    value = (summary or {}).get(key)
    if sub is not None:
        value = value.get(sub) if isinstance(value, dict) else None
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def cells(points, keys) -> list:
    """Per point (PointResult, grid order) the COLUMNS' values (None: none)."""
    others = [k for k in keys if not is_spec_key(k)]

    def other_values(p):
        return tuple(repr(p.values.get(k)) for k in others)

    plain = {}
    for p in points:
        if p.summary is not None and "speculative" not in p.summary:
            plain.setdefault(other_values(p), p.summary)
    out = []
    for p in points:
        s = p.summary
        spec = (s or {}).get("speculative")
        row = dict.fromkeys(COLUMNS)
        if isinstance(spec, dict):
            row["mean_acceptance_length"] = spec.get("mean_acceptance_length")
            base = plain.get(other_values(p))
            tpot, base_tpot = _number(s, "tpot_ms", "mean"), _number(base, "tpot_ms", "mean")
            if tpot and base_tpot:
                row["tpot_speedup"] = round(base_tpot / tpot, 4)
            rate, base_rate = _number(s, "output_tokens_per_s"), _number(base, "output_tokens_per_s")
            if rate and base_rate:
                row["throughput_speedup"] = round(rate / base_rate, 4)
        out.append(row)
    return out
