"""The HTML pieces every report page is made of: number formats, tables,
figures, the page and its style (results/report.py, results/session_report.py,
capacity/report.py)."""

import html
import math

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
          "#7f7f7f", "#bcbd22")


def _fmt(value, unit="") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        text = f"{value:,}"
    elif abs(value) >= 100:
        text = f"{value:,.1f}"
    elif abs(value) >= 1:
        text = f"{value:.2f}"
    else:
        text = f"{value:.3g}"
    return text + unit


def _ms(value) -> str:
    """A latency in ms, or in s from 10 s up."""
    if value is not None and value >= 10_000:
        return _fmt(value / 1000.0, " s")
    return _fmt(value, " ms")


def _pct(value) -> str:
    return "–" if value is None else f"{value * 100:.1f}%"


def _esc(text) -> str:
    return html.escape(str(text), quote=True)


def _table(header: list, rows: list, classes=None) -> str:
    """An HTML table of already-escaped cell texts (or (attributes, text)
    pairs); `classes` per row."""

    def cell(c):
        return f"<td {c[0]}>{c[1]}</td>" if isinstance(c, tuple) else f"<td>{c}</td>"

    out = ["<table>", "<tr>" + "".join(f"<th>{h}</th>" for h in header) + "</tr>"]
    for i, row in enumerate(rows):
        cls = f' class="{classes[i]}"' if classes and classes[i] else ""
        out.append(f"<tr{cls}>" + "".join(map(cell, row)) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def _img(name: str, uri: str, caption: str) -> str:
    return (f'<figure><img data-plot="{_esc(name)}" alt="{_esc(caption)}" src="{uri}">'
            f"<figcaption>{_esc(caption)}</figcaption></figure>")


CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #222;
       max-width: 1140px; margin: 24px auto; padding: 0 20px; }
h1 { font-size: 22px; margin-bottom: 2px; } h2 { font-size: 17px; margin-top: 28px;
     border-bottom: 1px solid #ddd; padding-bottom: 4px; }
.sub { color: #666; margin-top: 0; }
table { border-collapse: collapse; margin: 8px 0; font-size: 13px; }
th, td { padding: 3px 10px; text-align: right; border-bottom: 1px solid #eee; white-space: nowrap; }
th { background: #f4f6f8; font-weight: 600; } td:first-child, th:first-child { text-align: left; }
tr.failed td { background: #fdecea; } td.err { text-align: left; white-space: normal; color: #a00; }
.cards { display: flex; flex-wrap: wrap; gap: 10px; margin: 10px 0; }
.card { background: #f4f6f8; border-radius: 6px; padding: 8px 14px; min-width: 120px; }
.card b { display: block; font-size: 18px; } .card span { color: #666; font-size: 12px; }
figure { margin: 12px 0; } figure img { max-width: 100%; }
figcaption { color: #666; font-size: 12px; }
.scroll { overflow-x: auto; } pre { background: #f4f6f8; padding: 10px; font-size: 12px; overflow-x: auto; }
"""


def _page(title: str, subtitle: str, body: list) -> str:
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_esc(title)}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>{_esc(title)}</h1>",
        f'<p class="sub">{subtitle}</p>',
        *body,
        "</body></html>",
        "",
    ])
