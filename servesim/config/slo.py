"""Service-level objectives: `--slo METRIC=VALUE` and the config's `slo:` block.

Two kinds of target, checked against one replay:

- a latency statistic, `<metric>_<stat>_ms` with metric one of ttft, tpot,
  itl, e2e and stat one of mean, p50, p90, p95, p99 (e.g. `ttft_p90_ms:
  2000`, `tpot_mean_ms: 50`): met when the run's figure in summary.json
  (docs: README "Metrics") is at most the target;
- a goodput floor, `goodput: FRACTION` with per-request targets `ttft_ms`,
  `tpot_ms`, `e2e_ms` (at least one): a request is good when it finished and
  meets every per-request target (DistServe's goodput); the floor is met
  when the good requests are at least FRACTION of all requests (rejected and
  unfinished requests are never good). A request with one output token has
  no TPOT and meets a TPOT target.

And one gate every run passes as well (`completed`): its rejected plus
unfinished requests are at most `allow_rejected` (default 0) of all its
requests. A percentile is taken over the finished requests only, so without
the gate a deployment that rejects a fifth of its load could meet a latency
target by shedding it.

Each target's `ratio` is how close the run is to it: observed / target for a
latency, floor / observed for goodput; <= 1 meets. The `margin` of a run is
1 - its largest ratio (the headroom to the tightest SLO).
"""

import math
import re

import attrs
import numpy as np

from servesim.errors import InputError

METRICS = ("ttft", "tpot", "itl", "e2e")
STATS = ("mean", "p50", "p90", "p95", "p99")
PER_REQUEST = ("ttft_ms", "tpot_ms", "e2e_ms")
GOODPUT = "goodput"
ALLOW_REJECTED = "allow_rejected"  # the gate's allowance, a fraction of the requests
COMPLETED = "completed"  # the gate's name among a run's violated SLOs
_PERCENTILE_RE = re.compile(r"^([a-z0-9]+)_([a-z0-9]+)_ms$")
EXAMPLES = "e.g. ttft_p90_ms=2000, tpot_mean_ms=50, or goodput=0.9 with ttft_ms=2000"


def _all_names() -> list:
    return [f"{m}_{s}_ms" for m in METRICS for s in STATS] + [GOODPUT, *PER_REQUEST, ALLOW_REJECTED]


def checked_names(slo: dict) -> list:
    """The names of an `slo:` dict that a run has a figure for (the
    percentiles and goodput, not the per-request targets or the allowance)."""
    return [n for n in slo if n not in PER_REQUEST and n != ALLOW_REJECTED]


@attrs.frozen
class SLOs:
    """The targets, in the order given: `percentiles` ((name, metric key of
    summary.json, stat, value) ...), `goodput` (the floor or None) and
    `per_request` ((name, value) ...), and `allow_rejected`, the fraction
    of the requests that may be rejected or unfinished (the gate)."""

    percentiles: tuple = ()
    goodput: float | None = None
    per_request: tuple = ()
    allow_rejected: float = 0.0

    @property
    def names(self) -> list:
        """The SLOs a run is checked against: each percentile, then goodput."""
        return [p[0] for p in self.percentiles] + ([GOODPUT] if self.goodput is not None else [])

    def targets(self) -> dict:
        """{name: target} of every SLO."""
        out = {name: value for name, _, _, value in self.percentiles}
        if self.goodput is not None:
            out[GOODPUT] = self.goodput
        return out

    def to_dict(self) -> dict:
        """The SLOs as an `slo:` block (percentiles, goodput, per-request
        targets, and `allow_rejected` when it is not 0)."""
        out = {name: value for name, _, _, value in self.percentiles}
        if self.goodput is not None:
            out[GOODPUT] = self.goodput
            out.update(dict(self.per_request))
        if self.allow_rejected:
            out[ALLOW_REJECTED] = self.allow_rejected
        return out

    def describe(self) -> str:
        """The SLOs in one line, the gate on rejected and unfinished requests included."""
        text = ", ".join(f"{k}={_num(v)}" for k, v in self.to_dict().items() if k != ALLOW_REJECTED)
        if self.allow_rejected:
            return (f"{text}; at most {_num(self.allow_rejected)} of the requests rejected or unfinished "
                    f"(--allow-rejected)")
        return f"{text}; no request rejected or unfinished (--allow-rejected FRACTION allows some)"


def _num(value) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _check_name(name: str, where: str) -> None:
    """An InputError for a name that is not an SLO: an unknown metric, a
    percentile not offered, or a per-request target not offered."""
    if name in _all_names():
        return
    m = _PERCENTILE_RE.match(name)
    if m and m.group(1) in METRICS:
        stat = m.group(2)
        offered = ", ".join(STATS)
        raise InputError(f"{where}{name}: the {m.group(1)} statistic {stat!r} is not offered; "
                         f"offered: {offered} (e.g. {m.group(1)}_p90_ms)")
    if name == "itl_ms":
        raise InputError(f"{where}{name}: ITL has no per-request value for goodput; per-request "
                         f"targets are {', '.join(PER_REQUEST)}; for ITL give a percentile, e.g. itl_p99_ms")
    from servesim.config.validation import did_you_mean

    hint = did_you_mean(name, _all_names())
    raise InputError(f"{where}{name}: unknown SLO metric{hint}; accepted: <metric>_<stat>_ms with "
                     f"metric {'/'.join(METRICS)} and stat {'/'.join(STATS)}, or {GOODPUT} "
                     f"with per-request {', '.join(PER_REQUEST)} ({EXAMPLES})")


def _check_value(name: str, value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError(f"{where}{name}: the target must be a number, got {value!r}")
    if name == ALLOW_REJECTED:
        if not 0 <= value <= 1:
            raise InputError(f"{where}{name}: must be a fraction of the requests in [0, 1], got {value!r}")
        return float(value)
    if value <= 0:
        what = "a fraction in (0, 1]" if name == GOODPUT else "a number > 0 (milliseconds)"
        raise InputError(f"{where}{name}: the target must be {what}, got {value!r}")
    if name == GOODPUT and value > 1:
        raise InputError(f"{where}{name}: the target must be a fraction in (0, 1], got {value!r}")
    return float(value)


def build_slos(items, where_of=lambda name: "") -> SLOs:
    """SLOs from (name, value) pairs; `where_of(name)` prefixes messages
    (e.g. "config.yaml:12: slo."). Raises InputError on a bad name or value,
    or per-request targets without a goodput floor (and the reverse)."""
    seen = {}
    for name, value in items:
        _check_name(name, where_of(name))
        seen[name] = _check_value(name, value, where_of(name))
    allow_rejected = seen.pop(ALLOW_REJECTED, 0.0)
    if not seen:
        raise InputError(f"no SLO given; give at least one with --slo METRIC=VALUE or a slo: block ({EXAMPLES})")
    per_request = tuple((n, v) for n, v in seen.items() if n in PER_REQUEST)
    goodput = seen.get(GOODPUT)
    if per_request and goodput is None:
        name = per_request[0][0]
        raise InputError(f"{where_of(name)}{name}: a per-request target counts towards goodput; "
                         f"add {GOODPUT}=FRACTION (e.g. {GOODPUT}=0.9), or give a percentile such as "
                         f"{name[:-3]}_p90_ms")
    if goodput is not None and not per_request:
        raise InputError(f"{where_of(GOODPUT)}{GOODPUT}: needs at least one per-request target "
                         f"({', '.join(PER_REQUEST)}), e.g. ttft_ms=2000")
    percentiles = []
    for name, value in seen.items():
        m = _PERCENTILE_RE.match(name)
        if m and name not in PER_REQUEST:
            percentiles.append((name, f"{m.group(1)}_ms", m.group(2), value))
    return SLOs(percentiles=tuple(percentiles), goodput=goodput, per_request=per_request,
                allow_rejected=allow_rejected)


def parse_slo_option(text: str) -> tuple:
    """One `--slo METRIC=VALUE` as (name, number)."""
    name, sep, raw = str(text).partition("=")
    name = name.strip()
    if not sep or not name:
        raise InputError(f"--slo {text!r}: expected METRIC=VALUE ({EXAMPLES})")
    try:
        value = float(raw)
    except ValueError:
        _check_name(name, "--slo ")
        raise InputError(f"--slo {name}: the target must be a number, got {raw.strip()!r}") from None
    return name, value


def config_slo_block(config_path, overrides=()) -> tuple:
    """The config file's `slo:` block, after the `--set slo.NAME=VALUE`
    overrides among `overrides`, as ((name, value) ...) and a where_of(name)
    giving "FILE:LINE: slo." (or "--set slo.") for messages; () when absent."""
    from servesim.config.yaml_input import OVERRIDE, apply_override, read_yaml

    source = str(config_path)
    data, where = read_yaml(source, "config file")
    for text in overrides:
        if str(text).partition("=")[0].strip().split(".")[0] == "slo" and isinstance(data, dict):
            apply_override(data, where, text)
    block = data.get("slo") if isinstance(data, dict) else None

    def where_of(name):
        line = where.get(f"slo.{name}", where.get("slo"))
        if line == OVERRIDE:
            return f"{OVERRIDE} slo."
        return f"{source}:{line}: slo." if isinstance(line, int) else f"{source}: slo."

    if block is None:
        return (), where_of
    if not isinstance(block, dict):
        raise InputError(f"{where_of('')[:-5]}slo: must be a mapping of SLO metrics to targets ({EXAMPLES})")
    return tuple(block.items()), where_of


def load_slos(config_path, options=(), overrides=(), allow_rejected=None) -> SLOs:
    """The SLOs of a run: the config's `slo:` block (with its `--set slo.*`
    overrides), with each `--slo` option added or replacing the same metric,
    and `--allow-rejected` (when given) replacing the block's allowance."""
    items, where_of = config_slo_block(config_path, overrides)
    merged = dict(items)
    from_cli = set()
    for text in options:
        name, value = parse_slo_option(text)
        if name in from_cli:
            raise InputError(f"--slo {name}: given twice")
        from_cli.add(name)
        merged[name] = value
    if allow_rejected is not None:
        if not isinstance(allow_rejected, (int, float)) or not 0 <= allow_rejected <= 1:
            raise InputError(f"--allow-rejected: must be a fraction of the requests in [0, 1], "
                             f"got {allow_rejected!r}")
        merged[ALLOW_REJECTED] = allow_rejected
    return build_slos(merged.items(), lambda n: "--slo " if n in from_cli else where_of(n))


def slos_from_dict(data: dict) -> SLOs:
    """SLOs from the dict `SLOs.to_dict` made (e.g. in a worker process)."""
    return build_slos(data.items())


# --------------------------------------------------------------------------- evaluation


def good_requests(records, per_request) -> np.ndarray:
    """Per request: finished and meeting every per-request target."""
    from servesim.results.records import STATUS_FINISHED

    good = np.asarray(records.status) == STATUS_FINISHED
    arrival = np.asarray(records.arrival_ms, dtype=np.float64)
    first = np.asarray(records.first_token_ms, dtype=np.float64)
    finish = np.asarray(records.finish_ms, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        for name, target in per_request:
            if name == "ttft_ms":
                ok = first - arrival <= target
            elif name == "e2e_ms":
                ok = finish - arrival <= target
            else:  # tpot_ms: one sample per request with >= 2 tokens
                tokens = np.asarray(records.output_tokens)
                tpot = (finish - first) / np.maximum(tokens - 1, 1)
                ok = (tokens < 2) | (tpot <= target)
            good &= ok
    return good


def goodput_fraction(records, per_request) -> float:
    n = len(records.status)
    return round(float(good_requests(records, per_request).sum()) / n, 6) if n else 0.0


def evaluate(slos: SLOs, summary: dict, records=None) -> dict:
    """Check one run against the SLOs: {"meets", "metrics" (observed value
    per SLO, None when the run has none), "ratios", "violated" (names, in
    SLO order), "margin"}. Goodput needs the run's per-request `records`."""
    metrics, ratios = {}, {}
    for name, key, stat, target in slos.percentiles:
        value = (summary.get(key) or {}).get(stat)
        metrics[name] = value
        ratios[name] = None if value is None else round(value / target, 6)
    if slos.goodput is not None:
        if records is None:
            raise ValueError("goodput needs the run's per-request records")
        value = goodput_fraction(records, slos.per_request)
        metrics[GOODPUT] = value
        ratios[GOODPUT] = None if value <= 0 else round(slos.goodput / value, 6)
    targets = slos.targets()
    violated = [n for n in slos.names if metrics[n] is None or not _meets(n, metrics[n], targets[n])]
    if not completed(slos, summary):
        violated.append(COMPLETED)
    finite = [r for r in ratios.values() if r is not None]
    margin = None if len(finite) < len(ratios) else round(1.0 - max(finite), 6)
    return {"meets": not violated, "metrics": metrics, "ratios": ratios,
            "violated": violated, "margin": margin}


def completed(slos: SLOs, summary: dict) -> bool:
    """The gate: the run's rejected plus unfinished requests are at most
    `slos.allow_rejected` of its requests (summary.json's counts)."""
    lost = summary["rejected"] + summary["unfinished"]
    return lost <= slos.allow_rejected * summary["requests"]


def miss_text(name: str, row: dict, slo: dict) -> str:
    """How a run (a probe or search row: its metrics and request counts)
    stands against one SLO of the `slo:` dict, e.g. "ttft_p90_ms is 2310
    (target 2000)" or "12 of 150 requests rejected and 4 unfinished (allowed 0)"."""
    if name == COMPLETED:
        allowed = slo.get(ALLOW_REJECTED, 0)
        return (f"{row['rejected']} of {row['requests']} requests rejected and {row['unfinished']} "
                f"unfinished (allowed: {_num(allowed)} of the requests, --allow-rejected)")
    value = row["metrics"][name]
    shown = "none (no finished request)" if value is None else f"{value:g}"
    return f"{name} is {shown} (target {slo[name]:g})"


def _meets(name: str, value: float, target: float) -> bool:
    return value >= target if name == GOODPUT else value <= target


def binding(evaluation: dict) -> str | None:
    """The SLO a failing run misses by the most (its largest ratio; one with
    no value at all first)."""
    violated = evaluation["violated"]
    if not violated:
        return None
    ratios = evaluation["ratios"]
    return max(violated, key=lambda n: math.inf if ratios.get(n) is None else ratios[n])


def check_config_slos(config_path, overrides=()) -> SLOs | None:
    """The config's `slo:` block (with its `--set slo.*` overrides) checked
    (InputError naming its line), or None when there is none."""
    items, where_of = config_slo_block(config_path, overrides)
    return build_slos(items, where_of) if items else None
