"""HTML reports: `servesim report DIR` and `servesim run --report`.

`write_report(dir)` writes `dir/report.html`, one self-contained page (inline
CSS, plots embedded as base64 PNG data URIs, no scripts, no external assets):

- for a run's output folder (summary.json): the summary tables; CDFs of TTFT,
  TPOT and E2E latency (requests.jsonl); arrivals, completions and output
  tokens per second over simulated time; with telemetry.jsonl, KV usage,
  running / waiting requests and preemptions over time; with several workers,
  each worker's requests and busy time (summary.json `workers`) and, with
  telemetry.jsonl, a panel per worker of its queues and KV usage over time;
- for a sweep's folder (sweep.csv): TTFT p90, TPOT p90, request rate and
  preemptions against each swept key, one line per combination of the other
  keys' values, and the sweep's table.

Every plot is an `<img data-plot="NAME">` so tools and tests can find it.
matplotlib is an optional extra (`servesim[report]`), imported here only; the
figures are drawn with the Agg canvas directly (no pyplot, no global backend).
"""

import base64
import csv
import io
import json
import math
import os
from pathlib import Path

import numpy as np

from servesim.errors import InputError
from servesim.results.html import COLORS, _esc, _fmt, _img, _ms, _page, _pct, _table
from servesim.results.outdir import check_replaceable, write_file

REPORT = "report.html"
MATPLOTLIB_HINT = "pip install 'servesim[report]'"

STYLE = {
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.titleweight": "bold",
    "axes.labelsize": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "grid.linewidth": 0.6,
    "legend.fontsize": 8,
    "legend.frameon": False,
    "lines.linewidth": 1.5,
}
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
DPI = 110

# (summary key, title) of the latency CDFs.
CDF_METRICS = (("ttft_ms", "TTFT"), ("itl_ms", "ITL"), ("tpot_ms", "TPOT"),
               ("e2e_ms", "E2E latency"))
# (sweep.csv column, axis label) of the sweep plots.
SWEEP_METRICS = (
    ("ttft_ms_p90", "TTFT p90 (ms)"),
    ("tpot_ms_p90", "TPOT p90 (ms)"),
    ("request_rate", "request rate (req/s)"),
    ("preemptions", "preemptions"),
)


# --------------------------------------------------------------------------- matplotlib


def require_matplotlib():
    """matplotlib's Figure and Agg canvas classes, or an InputError telling
    how to install the extra."""
    try:
        import matplotlib  # noqa: F401  (fails first when matplotlib is absent)
        from cycler import cycler
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise InputError(f"the HTML report needs matplotlib, which is not installed: {MATPLOTLIB_HINT}") from None
    return Figure, FigureCanvasAgg, cycler


class _Plots:
    """Makes figures in the report's style and turns them into PNG data URIs."""

    def __init__(self):
        self.Figure, self.Canvas, cycler = require_matplotlib()
        import matplotlib

        self.rc = {**STYLE, "axes.prop_cycle": cycler(color=COLORS)}
        self._matplotlib = matplotlib

    def figure(self, draw, width=10.0, height=3.0):
        """Call draw(fig) on a new figure in the report's style; return the
        PNG as a data URI."""
        with self._matplotlib.rc_context(self.rc):
            fig = self.Figure(figsize=(width, height), layout="constrained")
            self.Canvas(fig)
            draw(fig)
            buf = io.BytesIO()
            fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
        return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


# --------------------------------------------------------------------------- reading


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: cannot read it as JSON: {e}") from None


def _read_jsonl(path: Path) -> list:
    rows = []
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    rows.append(json.loads(line))
    except ValueError as e:
        raise InputError(f"{path}:{n}: malformed JSON line: {e}") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e}") from None
    return rows


def _column(rows: list, key: str) -> np.ndarray:
    """A float column of dict rows; null/missing is NaN."""
    return np.array([np.nan if r.get(key) is None else r[key] for r in rows], dtype=np.float64)


# --------------------------------------------------------------------------- formatting


def _nice_step(raw: float) -> float:
    """The smallest 1, 2 or 5 × 10^k >= raw."""
    if raw <= 0:
        return 1.0
    exp = math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * 10 ** exp >= raw:
            return m * 10 ** exp
    return 10 ** (exp + 1)


def _integer_axis(ax):
    """Counts: integer ticks from 0, and a visible range when all are 0."""
    from matplotlib.ticker import MaxNLocator

    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(bottom=0, top=max(1.0, ax.get_ylim()[1]))


# --------------------------------------------------------------------------- a run's report


def _workload_text(config: dict) -> str:
    w = config.get("workload", {}) if isinstance(config, dict) else {}
    if w.get("trace"):
        text = f"trace {os.path.basename(w['trace'])}"
    elif w.get("synthetic"):
        s = w["synthetic"]
        text = f"synthetic, {s.get('requests')} requests, {s.get('arrival')} arrivals"
    else:
        return ""
    e = config.get("engine", {})
    c = config.get("cluster", {})
    dp = c.get("data_parallel_size", 1)
    if c.get("mode") == "disaggregated":
        widths = [(c.get(pool) or {}).get("data_parallel_size", dp) for pool in ("prefill", "decode")]
        if widths[0] == widths[1]:
            ranks = (f"{c.get('prefill_workers')} prefill + {c.get('decode_workers')} decode worker(s)"
                     f" × {widths[0]} DP rank(s)")
        else:
            ranks = (f"{c.get('prefill_workers')} prefill worker(s) × {widths[0]} DP rank(s) + "
                     f"{c.get('decode_workers')} decode worker(s) × {widths[1]}")
    else:
        ranks = f"{c.get('workers', 1)} worker(s) × {dp} DP rank(s)"
    parts = [text, ranks,
             f"{e.get('num_gpu_blocks')} blocks of {e.get('block_size')} tokens",
             f"max_num_seqs {e.get('max_num_seqs')}", f"max_num_batched_tokens {e.get('max_num_batched_tokens')}",
             f"timing {e.get('timing', {}).get('type')}"]
    if e.get("async_scheduling"):
        parts.append("async scheduling")
    if e.get("speculative"):
        spec = e["speculative"]
        parts.append(f"speculative {spec.get('method')}, k = {spec.get('num_speculative_tokens')}")
    return " · ".join(_esc(p) for p in parts)


def _summary_html(s: dict) -> str:
    cards = [
        (f"{s['finished']:,} / {s['requests']:,}", "requests finished"),
        (f"{s['duration_ms'] / 1000:,.1f} s", "simulated duration"),
        (_fmt(s["request_rate"], " req/s"), "request rate"),
        (_fmt(s["output_tokens_per_s"], " tok/s"), "output tokens"),
        (_ms(s["ttft_ms"]["p90"]), "TTFT p90"),
        (_ms(s["tpot_ms"]["p90"]), "TPOT p90"),
        (f"{s['preemptions']:,}", "preemptions"),
        (_pct(s["prefix_cache_hit_rate"]), "prefix cache hit rate"),
        (_pct(s["kv_usage_mean"]), "KV usage, mean"),
    ]
    out = ['<div class="cards">']
    out += [f'<div class="card"><b>{_esc(v)}</b><span>{_esc(k)}</span></div>' for v, k in cards]
    out.append("</div>")
    stats = ("mean", "p50", "p90", "p95", "p99", "max")
    rows = [[name] + [_fmt(s[key][st]) for st in stats]
            for key, name in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2e_ms", "E2E"))]
    out.append(_table(["latency (ms)", *stats], rows))
    rows = [
        ["requests", f"{s['requests']:,} ({s['finished']:,} finished, {s['rejected']:,} rejected, "
                     f"{s['unfinished']:,} unfinished)"],
        ["token rates", f"{_fmt(s['input_tokens_per_s'])} input tok/s, {_fmt(s['output_tokens_per_s'])} output tok/s"],
        ["preemptions", f"{s['preemptions']:,} ({s['preempted_requests']:,} requests, "
                        f"{s['recomputed_tokens']:,} tokens recomputed)"],
        ["prefix cache", f"{_pct(s['prefix_cache_hit_rate'])} ({s['prefix_cache_hits']:,} of "
                         f"{s['prefix_cache_queries']:,} tokens)"],
        ["CPU tier hits", f"{s['cpu_tier_hit_tokens']:,} tokens"],
        ["KV usage", f"{_pct(s['kv_usage_mean'])} mean, {_pct(s['kv_usage_max'])} max"],
        *_speculative_rows(s),
        ["simulator", f"{s['passes']:,} passes in {s['wall_time_s']:.3f} s wall "
                      f"({_fmt(s['passes_per_s'])} passes/s)"],
    ]
    out.append(_table(["figure", "value"], [[_esc(a), _esc(b)] for a, b in rows]))
    return "\n".join(out)


def _worker_label(w: dict) -> str:
    """A worker's name: its index, led by its pool in disaggregated mode."""
    return f"{w['pool']} {w['worker']}" if "pool" in w else str(w["worker"])


def _workers_html(s: dict) -> str:
    duration = s["duration_ms"] or 0.0
    rows = []
    for w in s.get("workers", []):
        busy = w["busy_ms"] / duration if duration > 0 else None
        load = w.get("load")
        rows.append([_worker_label(w), _fmt(w["requests"]), _pct(w.get("request_share")),
                     _pct(w.get("prefix_cache_hit_rate")), _fmt(w["passes"]),
                     _fmt(w["busy_ms"] / 1000.0), _pct(busy), _pct(w["kv_usage_mean"])]
                    + ([] if load is None else [
                        f"{_fmt(load['running']['mean'])} / {_fmt(load['running']['p90'])}",
                        f"{_fmt(load['waiting']['mean'])} / {_fmt(load['waiting']['p90'])}",
                        _pct(load["kv_usage"]["p90"])]))
    load_columns = ["running mean / p90", "waiting mean / p90", "KV usage p90"]
    with_load = any("load" in w for w in s.get("workers", []))
    return _table(["worker", "requests", "share", "prefix hit rate", "passes", "busy (s)", "busy",
                   "KV usage mean"] + (load_columns if with_load else []), rows)


def _pools_html(s: dict) -> str:
    """A disaggregated run's two pools and its KV transfers (summary.json
    `pools`, `kv_transfer`)."""
    duration = s["duration_ms"] or 0.0
    rows = []
    for name, p in s["pools"].items():
        busy = p["busy_ms"] / (duration * p["workers"]) if duration > 0 and p["workers"] else None
        rows.append([_esc(name), _fmt(p["workers"]), _fmt(p["requests"]), _fmt(p["passes"]), _pct(busy),
                     _pct(p["kv_usage_mean"]), _fmt(p["preemptions"]), _pct(p["prefix_cache_hit_rate"])])
    out = [_table(["pool", "workers", "requests", "passes", "busy", "KV usage mean", "preemptions",
                   "prefix hit rate"], rows)]
    t = s["kv_transfer"]
    ms = t["kv_transfer_ms"]
    rows = [
        ["handoffs", f"{t['handoffs']:,} requests handed to a decode worker ({t['transfers']:,} with KV moved)"],
        ["moved", f"{t['transferred_tokens']:,} tokens, {t['transferred_bytes'] / 1e9:,.3f} GB"],
        ["wait for KV (ms)", " · ".join(f"{st} {_fmt(ms[st])}" for st in ("mean", "p50", "p90", "p99", "max"))],
    ]
    out.append(_table(["KV transfer", "value"], [[_esc(a), _esc(b)] for a, b in rows]))
    return "\n".join(out)


def _speculative_rows(s: dict) -> list:
    """A speculative run's figures (the ITL and TPOT plots then include the
    tokens a verification pass yields together: ITL 0 between them)."""
    spec = s.get("speculative")
    if not spec:
        return []
    positions = " / ".join(_pct(p) for p in spec["acceptance_rate_per_position"])
    return [["speculative decoding",
             f"{spec['method']} k = {spec['num_speculative_tokens']}: mean acceptance length "
             f"{spec['mean_acceptance_length']:.2f} tokens per pass, "
             f"{_pct(spec['acceptance_rate'])} of {spec['draft_tokens']:,} drafts accepted "
             f"(per position {positions})"]]


def _cdf_plot(plots: _Plots, requests: list, summary: dict, itl: dict | None) -> str:
    """TTFT, TPOT and E2E from requests.jsonl; ITL (token-weighted) from the
    quantiles in itl_quantiles.json."""
    finished = [r for r in requests if r.get("status") == "finished"]

    def draw(fig):
        axes = fig.subplots(1, len(CDF_METRICS))
        for ax, (key, title) in zip(axes, CDF_METRICS):
            if key == "itl_ms":
                points = [(v, q) for v, q in zip((itl or {}).get("itl_ms", []),
                                                  (itl or {}).get("quantiles", [])) if v is not None]
                values = np.array([v for v, _ in points], dtype=float)
                y = np.array([q for _, q in points], dtype=float)
            else:
                values = np.sort(_column(finished, key))
                values = values[np.isfinite(values)]
                y = np.arange(1, values.size + 1) / max(values.size, 1)
            ax.set_title(f"{title} CDF")
            ax.set_xlabel("ms")
            ax.set_ylim(0, 1.02)
            if values.size == 0:
                ax.text(0.5, 0.5, "no samples", ha="center", va="center", transform=ax.transAxes)
                continue
            if key == "itl_ms":
                ax.plot(values, y, color=COLORS[0])
            else:
                ax.step(values, y, where="post", color=COLORS[0])
            positive = values[values > 0]
            if positive.size and positive[-1] / positive[0] > 100:
                ax.set_xscale("log")
            for q, style in (("p50", ":"), ("p90", "--"), ("p99", "-.")):
                v = summary.get(key, {}).get(q)
                if v is not None and v > 0:
                    ax.axvline(v, color="#888", linestyle=style, linewidth=1, label=f"{q} {_fmt(v)} ms")
            ax.legend(loc="best")
        axes[0].set_ylabel("fraction of finished requests (ITL: of tokens)")

    return plots.figure(draw, height=3.0)


def _binned(times_s: np.ndarray, edges: np.ndarray, width: float) -> np.ndarray:
    counts, _ = np.histogram(times_s[np.isfinite(times_s)], bins=edges)
    return counts / width


def _token_rate(first_s, last_s, tokens, edges, width) -> np.ndarray:
    """Output tokens per second in each bin: each request's first token at its
    first-token time, the others spread evenly up to its last token."""
    cumulative = np.zeros(edges.size)
    for start in range(0, first_s.size, 4096):
        f, l, n = first_s[start:start + 4096, None], last_s[start:start + 4096, None], tokens[start:start + 4096, None]
        span = np.where(l > f, l - f, 1.0)
        share = np.where(l > f, np.clip((edges[None, :] - f) / span, 0.0, 1.0), (edges[None, :] >= l) * 1.0)
        cumulative += ((edges[None, :] >= f) + (n - 1) * share).sum(axis=0)
    return np.diff(cumulative) / width


def _throughput_plot(plots: _Plots, requests: list) -> tuple:
    arrival = _column(requests, "arrival_ms") / 1000.0
    finished = [r for r in requests if r.get("status") == "finished"]
    first = _column(finished, "first_token_ms") / 1000.0
    finish = _column(finished, "finish_ms") / 1000.0
    tokens = _column(finished, "output_tokens")
    end = float(np.nanmax(np.concatenate([arrival, finish, [1e-3]])))
    width = _nice_step(end / 60.0)
    edges = np.arange(0.0, end + width, width)
    if edges.size < 2:
        edges = np.array([0.0, width])
    mids = (edges[:-1] + edges[1:]) / 2

    def draw(fig):
        left, right = fig.subplots(1, 2)
        left.step(mids, _binned(arrival, edges, width), where="mid", label="arrivals")
        left.step(mids, _binned(finish, edges, width), where="mid", label="completions")
        left.set_title("requests per second")
        left.set_xlabel("simulated time (s)")
        left.set_ylabel("req/s")
        left.legend(loc="upper right")
        rate = _token_rate(first, finish, tokens, edges, width) if finished else np.zeros(mids.size)
        right.fill_between(mids, rate, step="mid", alpha=0.25, color=COLORS[2])
        right.step(mids, rate, where="mid", color=COLORS[2])
        right.set_title("output tokens per second")
        right.set_xlabel("simulated time (s)")
        right.set_ylabel("tok/s")
        for ax in (left, right):
            ax.set_xlim(0, edges[-1])
            ax.set_ylim(bottom=0)

    return plots.figure(draw, height=2.8), width


def _telemetry_plot(plots: _Plots, samples: list) -> str:
    series = {}
    for row in samples:
        series.setdefault((row.get("worker", 0), row.get("dp_rank", 0)), []).append(row)
    times = np.array(sorted({row["t_ms"] for row in samples}), dtype=np.float64)
    index = {t: i for i, t in enumerate(times.tolist())}

    def total(key):
        out = np.zeros(times.size)
        for row in samples:
            out[index[row["t_ms"]]] += row.get(key) or 0
        return out

    t_s = times / 1000.0

    def draw(fig):
        kv, queue, pre = fig.subplots(3, 1, sharex=True)
        if len(series) <= 8:
            for (w, r), rows in series.items():
                label = f"worker {w}" + (f" rank {r}" if any(k[1] for k in series) else "")
                kv.plot([x["t_ms"] / 1000.0 for x in rows], [100 * x["kv_usage"] for x in rows], label=label)
            if len(series) > 1:
                kv.legend(loc="upper left", ncols=min(4, len(series)))
        else:
            matrix = np.full((len(series), times.size), np.nan)
            for j, rows in enumerate(series.values()):
                for x in rows:
                    matrix[j, index[x["t_ms"]]] = 100 * x["kv_usage"]
            kv.fill_between(t_s, np.nanmin(matrix, 0), np.nanmax(matrix, 0), alpha=0.25, label="min–max")
            kv.plot(t_s, np.nanmean(matrix, 0), label=f"mean of {len(series)} ranks")
            kv.legend(loc="upper left")
        kv.set_ylabel("KV usage (%)")
        kv.set_ylim(0, 105)
        kv.set_title("KV cache usage, queues and preemptions over simulated time")
        queue.plot(t_s, total("running"), label="running")
        queue.plot(t_s, total("waiting"), label="waiting")
        queue.set_ylabel("requests")
        queue.set_ylim(bottom=0)
        queue.legend(loc="upper left")
        pre.step(t_s, total("preemptions"), where="pre", color=COLORS[1])
        pre.fill_between(t_s, total("preemptions"), step="pre", alpha=0.25, color=COLORS[1])
        pre.set_ylabel("preemptions\nper interval")
        _integer_axis(pre)
        pre.set_xlabel("simulated time (s)")
        pre.set_xlim(0, t_s[-1] if t_s.size else 1)

    return plots.figure(draw, height=6.0)


def _worker_load_plot(plots: _Plots, samples: list, labels: dict) -> str:
    """One panel per worker, all on the same scales so an imbalance shows:
    its running and waiting requests (its ranks summed) and its KV usage
    (their mean) at each telemetry sample (results/worker_load.py)."""
    from servesim.results.worker_load import worker_series

    series = worker_series(samples)
    keys = sorted(series, key=lambda k: (k[0] or "", k[1]))
    cols = min(4, len(keys))
    rows = -(-len(keys) // cols)
    top = max(max(float(v["running"].max()), float(v["waiting"].max())) for _, v in series.values())

    def draw(fig):
        axes = np.atleast_1d(fig.subplots(rows, cols, sharex=True, sharey=True, squeeze=False)).ravel()
        for n, (ax, key) in enumerate(zip(axes, keys)):
            times, values = series[key]
            t_s = times / 1000.0
            kv = ax.twinx()
            kv.fill_between(t_s, 100 * values["kv_usage"], step="pre", alpha=0.15, color=COLORS[2])
            kv.set_ylim(0, 105)
            kv.grid(False)
            if n % cols == cols - 1 or n == len(keys) - 1:
                kv.set_ylabel("KV usage (%)")
            else:
                kv.set_yticklabels([])
            ax.step(t_s, values["running"], where="pre", label="running", color=COLORS[0])
            ax.step(t_s, values["waiting"], where="pre", label="waiting", color=COLORS[1])
            ax.set_ylim(0, max(1.0, top) * 1.05)
            ax.set_title(f"worker {labels.get(key, key[1])}")
            if n % cols == 0:
                ax.set_ylabel("requests")
            if n >= len(keys) - cols:
                ax.set_xlabel("simulated time (s)")
        for ax in axes[len(keys):]:
            ax.set_visible(False)
        axes[0].legend(loc="upper left")

    return plots.figure(draw, height=2.2 * rows + 0.4)


def _workers_plot(plots: _Plots, summary: dict) -> str:
    workers = summary["workers"]
    ids = list(range(len(workers)))
    labels = [_worker_label(w) for w in workers]
    duration = summary["duration_ms"] or 0.0

    def draw(fig):
        left, right = fig.subplots(1, 2)
        left.bar(ids, [w["requests"] for w in workers], color=COLORS[0])
        left.set_title("requests per worker")
        right.bar(ids, [100 * w["busy_ms"] / duration if duration > 0 else 0 for w in workers], color=COLORS[3])
        right.set_title("busy time per worker (% of the run)")
        right.set_ylim(0, 105)
        for ax in (left, right):
            ax.set_xlabel("worker")
            ax.set_xticks(ids, labels)
            ax.grid(axis="x", visible=False)

    return plots.figure(draw, height=2.6)


def run_report(directory: Path, plots: _Plots) -> str:
    """The HTML page of a run's output folder."""
    summary = _read_json(directory / "summary.json")
    if not isinstance(summary, dict) or "ttft_ms" not in summary:
        raise InputError(f"{directory / 'summary.json'}: not a servesim summary")
    config = summary.get("config", {})
    body = ["<h2>Summary</h2>", _summary_html(summary)]

    requests_path = directory / "requests.jsonl"
    body.append("<h2>Latency</h2>")
    if requests_path.is_file():
        requests = _read_jsonl(requests_path)
        itl_path = directory / "itl_quantiles.json"
        itl = _read_json(itl_path) if itl_path.is_file() else None
        body.append(_img("latency-cdf", _cdf_plot(plots, requests, summary, itl),
                         "Cumulative distributions over finished requests (requests.jsonl; "
                         "ITL over their tokens, itl_quantiles.json); vertical lines: p50, p90, "
                         "p99."))
        body.append("<h2>Throughput</h2>")
        uri, width = _throughput_plot(plots, requests)
        body.append(_img("throughput", uri,
                         f"In bins of {width:g} s of simulated time. Output tokens: each request's "
                         "tokens spread evenly between its first and last token."))
        from servesim.results.session_report import sessions_section

        body.extend(sessions_section(plots, requests, summary))
    else:
        body.append("<p>No requests.jsonl in this folder (output.per_request: false): no latency "
                    "distributions or throughput over time.</p>")

    telemetry_path = directory / "telemetry.jsonl"
    samples = None
    if telemetry_path.is_file():
        samples = _read_jsonl(telemetry_path)
        if samples:
            interval = config.get("output", {}).get("telemetry_interval_ms")
            note = f" every {interval / 1000:g} s" if interval else ""
            body.append("<h2>Over time</h2>")
            body.append(_img("telemetry", _telemetry_plot(plots, samples),
                             f"telemetry.jsonl, sampled{note} of simulated time; running and waiting "
                             "summed over workers; preemptions in each interval."))
    else:
        body.append("<p>No telemetry.jsonl: run with <code>--telemetry-interval-ms MS</code> for KV usage, "
                    "queues and preemptions over time.</p>")

    if "pools" in summary and "kv_transfer" in summary:
        body.append("<h2>Prefill and decode pools</h2>")
        body.append(_pools_html(summary))
    body.append("<h2>Workers</h2>")
    if len(summary.get("workers", [])) > 1:
        body.append(_img("workers", _workers_plot(plots, summary), "Per-worker load (summary.json workers)."))
        if samples:
            labels = {(w.get("pool"), w["worker"]): _worker_label(w) for w in summary["workers"]}
            body.append(_img("worker-load", _worker_load_plot(plots, samples, labels),
                             "Each worker over simulated time (telemetry.jsonl): running and waiting "
                             "requests (lines, its ranks summed) and KV usage (shaded, right axis, "
                             "its ranks' mean); every panel on the same scales."))
    body.append(_workers_html(summary))
    body.append("<h2>Config</h2><details><summary>resolved config</summary><pre>"
                + _esc(json.dumps(config, indent=2)) + "</pre></details>")
    return _page(f"servesim report: {directory.resolve().name}", _workload_text(config), body)


# --------------------------------------------------------------------------- a sweep's report


def _number(text):
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _sweep_plot(plots: _Plots, key: str, keys: list, rows: list, metrics=None) -> str:
    """The main figures (or `metrics`) against `key`, one line per
    combination of the others."""
    metrics = metrics or SWEEP_METRICS
    values = list(dict.fromkeys(r[key] for r in rows))
    numeric = all(_number(v) is not None for v in values)
    if numeric:
        values.sort(key=float)
        xs = [float(v) for v in values]
    else:
        xs = list(range(len(values)))
    position = dict(zip(values, xs))
    others = [k for k in keys if k != key]
    groups = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in others), []).append(r)

    def label(combo):
        parts = [_spec_label(v) if k == SPEC_KEY else f"{k.rpartition('.')[2]}={v or '(default)'}"
                 for k, v in zip(others, combo)]
        return ", ".join(parts) or None

    ncols = 4 if max((len(label(c) or "") for c in groups), default=0) <= 40 else 2

    def draw(fig):
        axes = fig.subplots(1, len(metrics))
        for ax, (column, title) in zip(axes, metrics):
            for combo, members in groups.items():
                members = sorted(members, key=lambda r: position[r[key]])
                x = [position[r[key]] for r in members]
                y = [_number(r[column]) if r["status"] == "ok" else None for r in members]
                y = [np.nan if v is None else v for v in y]
                n = len(ax.lines)  # later lines get smaller markers: one that coincides stays visible
                ax.plot(x, y, marker=MARKERS[n % len(MARKERS)], markersize=max(3.0, 8.0 - 1.5 * n),
                        alpha=0.85, label=label(combo), zorder=2 + n)
            ax.set_title(title)
            ax.set_xlabel(key)
            if column == "preemptions":
                _integer_axis(ax)
            elif column in SPEEDUP_COLUMNS:
                ax.axhline(1.0, color="grey", linewidth=0.8, zorder=1)  # the plain run
            else:
                ax.set_ylim(bottom=0)
            if numeric:
                if min(xs) > 0 and max(xs) / min(xs) >= 8:
                    ax.set_xscale("log", base=2 if all(math.log2(v).is_integer() for v in xs) else 10)
                ax.set_xticks(xs, [str(v) for v in values], rotation=30 if len(values) > 5 else 0)
                ax.minorticks_off()
            else:
                names = [_spec_label(v) for v in values] if key == SPEC_KEY else values
                ax.set_xticks(xs, names, rotation=30 if len(values) > 3 or key == SPEC_KEY else 0,
                              ha="right" if key == SPEC_KEY else "center")
                ax.set_xlim(-0.5, len(xs) - 0.5)
        if len(groups) > 1:
            handles, labels = axes[0].get_legend_handles_labels()
            fig.legend(handles, labels, loc="outside lower center", ncols=min(ncols, len(groups)))

    legend_rows = math.ceil(len(groups) / ncols) if len(groups) > 1 else 0
    return (plots.figure(draw, width=12.0 if len(metrics) > 2 else 8.0, height=3.0 + 0.22 * legend_rows),
            _coinciding(groups, key, label, metrics))


# a sweep over engine.speculative (servesim/sweep/speculative.py): speedups
SPEEDUP_METRICS = (("tpot_speedup", "TPOT speedup over the plain run"),
                   ("throughput_speedup", "output throughput speedup"))
SPEEDUP_COLUMNS = tuple(c for c, _ in SPEEDUP_METRICS)
SPEC_KEY = "engine.speculative"


def is_spec_key(key: str) -> bool:
    """`engine.speculative` or one of its sub-keys (a grid's axis)."""
    return key == SPEC_KEY or key.startswith(SPEC_KEY + ".")


def _spec_label(cell: str) -> str:
    """A legend's name of an `engine.speculative` grid value (sweep.csv's
    JSON text; empty: the plain run): method, k and the acceptance given."""
    try:
        value = json.loads(cell) if cell else None
    except ValueError:
        value = cell
    if value is None:
        return "plain"
    if not isinstance(value, dict):
        return f"speculative={cell}"
    text = f"{value.get('method')} k={value.get('num_speculative_tokens')}"
    for key in ("acceptance_rates", "mean_acceptance_length", "acceptance_profiles"):
        if key in value:
            shown = value[key] if key != "acceptance_profiles" else "/".join(value[key])
            text += f", {key.replace('acceptance_', '')} {shown}"
    return text


def _speedup_plots(plots: _Plots, keys: list, swept: list, rows: list) -> list:
    """HTML of the speedup against each swept key other than engine.speculative's,
    one line per speculative setting (the plain points are the line at 1)."""
    rows = [r for r in rows if _number(r.get("tpot_speedup")) is not None]
    body = []
    for key in [k for k in swept if not is_spec_key(k)]:
        if len(set(r[key] for r in rows)) < 2:
            continue
        uri, _ = _sweep_plot(plots, key, keys, rows, SPEEDUP_METRICS)
        body.append(_img(f"speedup-{key}", uri, f"Speculative decoding's speedup against {key}: one "
                         "line per speculative setting (and other keys) over the plain point of the "
                         "same other values; above 1 speculation pays."))
    return body


def _coinciding(groups: dict, key: str, label, metrics=None) -> list:
    """Labels of lines whose every figure equals another line's: their
    points sit on top of each other, which the caption says."""
    metrics = metrics or SWEEP_METRICS

    def series(members):
        members = sorted(members, key=lambda r: r[key])
        return tuple((r[key], *(r[column] if r["status"] == "ok" else None for column, _ in metrics))
                     for r in members)

    seen = {}
    for combo, members in groups.items():
        seen.setdefault(series(members), []).append(label(combo))
    return [same for same in seen.values() if len(same) > 1]


SWEEP_TABLE = (
    ("requests", "requests"), ("finished", "finished"), ("rejected", "rejected"),
    ("ttft_ms_p50", "TTFT p50"), ("ttft_ms_p90", "TTFT p90"), ("ttft_ms_p99", "TTFT p99"),
    ("tpot_ms_p90", "TPOT p90"), ("itl_ms_p90", "ITL p90"), ("e2e_ms_p90", "E2E p90"),
    ("request_rate", "req/s"), ("output_tokens_per_s", "out tok/s"), ("preemptions", "preemptions"),
    ("prefix_cache_hit_rate", "prefix hit"), ("kv_usage_mean", "KV mean"), ("wall_time_s", "wall s"),
)
PERCENT_COLUMNS = ("prefix_cache_hit_rate", "kv_usage_mean")
COUNT_COLUMNS = ("requests", "finished", "rejected", "preemptions")


def sweep_report(directory: Path, plots: _Plots) -> str:
    """The HTML page of a sweep's folder (sweep.csv, sweep.json)."""
    path = directory / "sweep.csv"
    try:
        with open(path, encoding="utf-8", newline="") as f:
            reader = csv.DictReader(f)
            columns = reader.fieldnames or []
            rows = list(reader)
    except (OSError, csv.Error, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read: {e}") from None
    if "point" not in columns or "status" not in columns:
        raise InputError(f"{path}: not a servesim sweep table (no point and status columns)")
    keys = columns[columns.index("point") + 1:columns.index("status")]
    meta = {}
    if (directory / "sweep.json").is_file():
        meta = _read_json(directory / "sweep.json")

    failed = sum(r["status"] != "ok" for r in rows)
    body = []
    swept = [k for k in keys if len(set(r[k] for r in rows)) > 1]
    if swept:
        body.append("<h2>Main figures against each swept key</h2>")
    for key in swept:
        uri, same = _sweep_plot(plots, key, keys, rows)
        note = "".join(f" Lines that coincide: {' = '.join(labels)}." for labels in same)
        body.append(_img(f"sweep-{key}", uri,
                         f"{key}: one line per combination of the other keys; failed points are gaps.{note}"))
    if "tpot_speedup" in columns:
        speedups = _speedup_plots(plots, keys, swept, rows)
        if speedups:
            body.append("<h2>Speculative decoding: speedup against load</h2>")
            body += speedups

    body.append("<h2>Points</h2>")
    header = ["point", *[_esc(k) for k in keys], "status", *[_esc(t) for _, t in SWEEP_TABLE], "folder"]
    cells, classes = [], []
    for r in rows:
        cells_row = [_esc(r["point"]), *[_esc(r[k]) for k in keys], _esc(r["status"])]
        if r["status"] == "ok":
            for column, _ in SWEEP_TABLE:
                v = _number(r.get(column))
                if column in PERCENT_COLUMNS:
                    cells_row.append(_pct(v))
                else:
                    cells_row.append(_fmt(int(v) if column in COUNT_COLUMNS and v is not None else v))
        else:
            span = len(SWEEP_TABLE)
            cells_row.append((f'class="err" colspan="{span}"', _esc(r.get("error", ""))))
        folder = r.get("dir", "")
        cells_row.append(f'<a href="{_esc(folder)}/summary.json">{_esc(folder)}</a>' if folder else "")
        cells.append(cells_row)
        classes.append("failed" if r["status"] != "ok" else "")
    table = _table(header, cells, classes)
    body.append(f'<div class="scroll">{table}</div>')
    config = meta.get("config", "")
    subtitle = _esc(f"{len(rows)} points, {len(rows) - failed} ok, {failed} failed"
                    + (f" · config {os.path.basename(config)}" if config else "")
                    + (f" · grid {os.path.basename(meta['grid'])}" if meta.get("grid") else ""))
    return _page(f"servesim sweep: {directory.resolve().name}", subtitle, body)


# --------------------------------------------------------------------------- entry point


def write_report(directory) -> Path:
    """Write `directory/report.html` for a run's or a sweep's output folder
    (outdir.write_file: atomically, and never over a report.html servesim
    did not write); return its path."""
    d = Path(directory)
    if (d / "sweep.csv").is_file():
        kind = sweep_report
    elif (d / "summary.json").is_file():
        kind = run_report
    else:
        raise InputError(f"{d}: not a run's output folder (no summary.json) nor a sweep's (no sweep.csv)")
    check_replaceable(d, [REPORT])  # before the plots: the user's own report.html is kept
    return write_file(d / REPORT, kind(d, _Plots()))
