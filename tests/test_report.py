"""`servesim report DIR` and `servesim run --report`: one self-contained HTML
page per run or sweep folder, with its plots embedded as PNG data URIs."""

import base64
import importlib.util
import json
import struct
import sys
from html.parser import HTMLParser

import pytest
from click.testing import CliRunner

from servesim.cli.main import main

needs_matplotlib = pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None,
    reason="plots need the optional extra servesim[report] (matplotlib), not installed",
)

TINY = """\
workload:
  synthetic:
    requests: 20
    input_tokens: 100
    output_tokens: 60
    arrival: constant
    rate: 50
engine:
  block_size: 16
  num_gpu_blocks: 48
  max_num_seqs: 8
  max_num_batched_tokens: 512
  timing: {type: fixed, prefill_ms: 10.0, decode_ms: 5.0}
cluster:
  workers: 2
output:
  telemetry_interval_ms: 50
"""
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


class _Page(HTMLParser):
    """The plots (<img data-plot>), table rows and external references of a page."""

    def __init__(self):
        super().__init__()
        self.plots, self.rows, self.external, self.tags = {}, [], [], set()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.add(tag)
        if tag == "img" and "data-plot" in attrs:
            self.plots[attrs["data-plot"]] = attrs["src"]
        if tag == "tr":
            self.rows.append(attrs.get("class"))
        for name in ("src", "href"):
            if attrs.get(name, "").startswith(("http:", "https:", "//")):
                self.external.append(attrs[name])


def parse(path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    assert not page.external and "script" not in page.tags and "link" not in page.tags
    return page


def png_size(uri: str) -> tuple:
    """(width, height) of a PNG data URI, checking that it decodes as a PNG."""
    prefix = "data:image/png;base64,"
    assert uri.startswith(prefix)
    data = base64.b64decode(uri[len(prefix):], validate=True)
    assert data.startswith(PNG_SIGNATURE) and data[12:16] == b"IHDR" and len(data) > 2000
    return struct.unpack(">II", data[16:24])


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    return path


@needs_matplotlib
def test_run_report_embeds_every_plot_of_a_run_with_telemetry(config, tmp_path):
    out = tmp_path / "out"
    result = invoke("run", config, "-o", out, "--quiet", "--report")
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["preemptions"] > 0  # the telemetry plot has something to show
    page = parse(out / "report.html")
    assert set(page.plots) == {"latency-cdf", "throughput", "telemetry", "workers", "worker-load"}
    for uri in page.plots.values():
        width, height = png_size(uri)
        assert width > 500 and height > 200


@needs_matplotlib
def test_run_report_without_requests_or_telemetry_says_what_is_missing(config, tmp_path):
    out = tmp_path / "out"
    args = ("--set", "output.per_request=false", "--set", "output.telemetry_interval_ms=null",
            "--set", "cluster.workers=1")
    assert invoke("run", config, "-o", out, "--quiet", *args).exit_code == 0
    assert invoke("report", out).exit_code == 0
    text = (out / "report.html").read_text()
    assert parse(out / "report.html").plots == {}
    assert "No requests.jsonl" in text and "No telemetry.jsonl" in text


@needs_matplotlib
def test_sweep_report_plots_each_swept_key_and_lists_every_point(config, tmp_path):
    import servesim
    from servesim.sweep.sweep import PointResult, SweepResult, load_grid, point_dir_names, write_sweep_files

    # A sweep folder as `servesim sweep` writes it, from in-process runs (no
    # worker processes needed to test the page), with one failed point.
    grid_path = tmp_path / "grid.yaml"
    grid_path.write_text("engine.num_gpu_blocks: [48, 512]\nengine.async_scheduling: [false, true]\n")
    grid = load_grid(grid_path)
    out = tmp_path / "sweep"
    points = []
    for i, (values, name) in enumerate(zip(grid.points, point_dir_names(grid))):
        rel = f"points/{name}"
        if i == 3:
            points.append(PointResult(i, values, rel, "failed", "trace.jsonl:4: malformed JSON", None))
            continue
        overrides = [f"{k}={json.dumps(v)}" for k, v in values.items()]
        report = servesim.run(config, overrides=overrides)
        report.write(out / rel)
        points.append(PointResult(i, values, rel, "ok", None, report.summary))
    write_sweep_files(SweepResult(out_dir=out, grid=grid, points=points), str(config))

    result = invoke("report", out)
    assert result.exit_code == 0, result.output
    assert result.output == f"{out / 'report.html'}\n"
    page = parse(out / "report.html")
    assert set(page.plots) == {"sweep-engine.num_gpu_blocks", "sweep-engine.async_scheduling"}
    for uri in page.plots.values():
        width, height = png_size(uri)
        assert width > 1000 and height > 200
    assert page.rows[1:] == [None, None, None, "failed"]  # header, then one row per point
    assert "trace.jsonl:4: malformed JSON" in (out / "report.html").read_text()


def test_report_of_a_folder_without_outputs_exits_2(tmp_path):
    result = invoke("report", tmp_path)
    assert result.exit_code == 2
    assert "no summary.json" in result.stderr and "Traceback" not in result.output


def test_without_matplotlib_report_and_run_report_exit_2_with_the_install_hint(config, tmp_path, monkeypatch):
    out = tmp_path / "out"
    assert invoke("run", config, "-o", out, "--quiet").exit_code == 0
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")] + ["matplotlib"]:
        monkeypatch.setitem(sys.modules, name, None)  # `import matplotlib...` raises ImportError

    result = invoke("report", out)
    assert result.exit_code == 2
    assert "pip install 'servesim[report]'" in result.stderr and "Traceback" not in result.output
    assert not (out / "report.html").exists()

    result = invoke("run", config, "-o", tmp_path / "other", "--report")
    assert result.exit_code == 2
    assert "pip install 'servesim[report]'" in result.stderr
    assert not (tmp_path / "other").exists()  # refused before running, nothing written


@needs_matplotlib
def test_a_disaggregated_run_report_shows_both_pools_and_the_kv_transfers(tmp_path):
    config = tmp_path / "d.yaml"
    config.write_text(invoke("example", "disaggregated").stdout)
    out = tmp_path / "out"
    result = invoke("run", config, "-o", out, "-q", "--limit", "40", "--report")
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    html = (out / "report.html").read_text()
    assert "<h2>Prefill and decode pools</h2>" in html
    for pool, figures in summary["pools"].items():
        assert f"<td>{pool}</td><td>{figures['workers']}</td><td>{figures['requests']}</td>" in html
    t = summary["kv_transfer"]
    assert f"{t['handoffs']:,} requests handed to a decode worker" in html
    assert f"{t['transferred_tokens']:,} tokens" in html and "wait for KV (ms)" in html


@needs_matplotlib
def test_sweep_plot_names_lines_that_coincide(tmp_path):
    from servesim.results.report import _Plots, _sweep_plot

    def row(blocks, seqs, ttft):
        return {"engine.num_gpu_blocks": blocks, "engine.max_num_seqs": seqs, "status": "ok",
                "ttft_ms_p90": ttft, "tpot_ms_p90": "1.0", "request_rate": "2.0", "preemptions": "0"}

    keys = ["engine.num_gpu_blocks", "engine.max_num_seqs"]
    # max_num_seqs 8 and 16 give the same figures at every num_gpu_blocks; 32 differs
    rows = [row(b, s, "5.0" if s == "32" else str(b)) for b in ("64", "128") for s in ("8", "16", "32")]
    uri, same = _sweep_plot(_Plots(), "engine.num_gpu_blocks", keys, rows)
    png_size(uri)
    assert same == [["max_num_seqs=8", "max_num_seqs=16"]]
