"""Workload loaders: Mooncake JSONL, Azure CSV, synthetic (spec README §3-4, §7-8)."""

import gzip
import json
from pathlib import Path

import attrs
import numpy as np
import pytest

from servesim.errors import InputError
from servesim.config.config_types import LengthDistribution, SyntheticConfig, WorkloadConfig
from servesim.workload.synthetic import synthetic_workload
from servesim.workload.load import load_workload
from servesim.workload.workload import trace_format

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
MOONCAKE_GZ = TRACES / "mooncake_conversation_trace.jsonl.gz"


def row(ts=0, il=10, ol=5, h=None, **extra):
    """One Mooncake row as a dict (hash ids consistent with a 4-token block)."""
    d = {"timestamp": ts, "input_length": il, "output_length": ol,
         "hash_ids": list(range(-(-il // 4))) if h is None else h}
    d.update(extra)
    return d


def write_jsonl(path, rows, gz=False):
    """Write rows (dicts or raw strings) one per line."""
    text = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)
    if gz:
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def load(path, limit=None, speedup=1.0, fmt=None, tbs=4, concurrency=None):
    cfg = WorkloadConfig(trace=str(path), format=fmt, trace_block_size=tbs,
                         limit=limit, speedup=speedup, concurrency=concurrency)
    return load_workload(cfg, 16)


def error_of(path, **kw) -> str:
    with pytest.raises(InputError) as e:
        load(path, **kw)
    return str(e.value)


# ------------------------------------------------------------------ Mooncake

ROWS = [row(100, 10, 5, [7, 8, 9]), row(100, 4, 1, [7]), row(250, 13, 2, [1, 2, 3, 4])]


def check_rows(w, path):
    assert len(w) == 3
    assert w.arrival_ms.tolist() == [0.0, 0.0, 150.0]
    assert w.arrival_ms.dtype == np.float64
    assert w.input_length.tolist() == [10, 4, 13]
    assert w.output_length.tolist() == [5, 1, 2]
    assert w.hash_offsets.tolist() == [0, 3, 4, 8]
    assert w.hash_flat.tolist() == [7, 8, 9, 7, 1, 2, 3, 4]
    assert w.hash_flat.dtype == np.int64 and w.hash_offsets.dtype == np.int64
    assert w.request_ids == ["0", "1", "2"]
    assert w.priority.tolist() == [0, 0, 0]
    assert w.dp_rank.tolist() == [-1, -1, -1]
    assert w.trace_block_size == 4
    assert w.concurrency is None
    assert w.source == str(path)


def test_mooncake_plain(tmp_path):
    p = write_jsonl(tmp_path / "t.jsonl", ROWS)
    check_rows(load(p), p)


def test_mooncake_gzip_by_suffix_and_by_magic(tmp_path):
    p = write_jsonl(tmp_path / "t.jsonl.gz", ROWS, gz=True)
    check_rows(load(p), p)
    q = write_jsonl(tmp_path / "disguised.jsonl", ROWS, gz=True)
    check_rows(load(q), q)


def test_mooncake_optional_fields_and_trailing_blank_lines(tmp_path):
    rows = [row(0, request_id="a", priority=3), row(1, dp_rank=1), row(2, request_id="c")]
    p = write_jsonl(tmp_path / "t.jsonl", rows + ["", "   "])
    w = load(p)
    assert w.request_ids == ["a", "1", "c"]
    assert w.priority.tolist() == [3, 0, 0]
    assert w.dp_rank.tolist() == [-1, 1, -1]


def test_mooncake_limit_speedup_concurrency(tmp_path):
    p = write_jsonl(tmp_path / "t.jsonl", [row(1000), row(3000), row(5000), "not json"])
    w = load(p, limit=3, speedup=2.0, concurrency=4)  # the bad 4th line is never read
    assert w.arrival_ms.tolist() == [0.0, 1000.0, 2000.0]
    assert w.concurrency == 4
    assert len(load(p, limit=1)) == 1


@pytest.mark.skipif(not MOONCAKE_GZ.exists(), reason="shared traces not present")
def test_real_mooncake_trace():
    w = load(MOONCAKE_GZ, tbs=512)
    assert len(w) == 12031
    assert w.arrival_ms[0] == 0.0 and w.arrival_ms[-1] == 3_536_999.0
    assert np.all(np.diff(w.arrival_ms) >= 0)
    assert int(w.output_length.sum()) == 4_122_048
    assert np.array_equal(np.diff(w.hash_offsets), -(-w.input_length // 512))
    assert len(set(w.hash_flat.tolist())) == 182_790
    head = load(MOONCAKE_GZ, tbs=512, limit=100)
    assert len(head) == 100 and np.array_equal(head.hash_flat, w.hash_flat[: head.hash_offsets[-1]])


BAD_ROWS = [
    ('{"timestamp": 0, "input_length": ', "malformed JSON"),
    ("[1, 2]", "JSON object"),
    ('"text"', "JSON object"),
    (json.dumps({"timestamp": 5, "input_length": 4, "output_length": 1}), "missing field 'hash_ids'"),
    (json.dumps({"input_length": 4, "output_length": 1, "hash_ids": [0]}), "missing field 'timestamp'"),
    (json.dumps(row(5, il=8.0, h=[0, 1])), "input_length must be an integer"),
    (json.dumps(row(5, il="8", h=[0, 1])), "input_length must be an integer"),
    (json.dumps(row(5, ol=True)), "output_length must be an integer"),
    (json.dumps(row("5")), "timestamp must be a number"),
    ('{"timestamp": NaN, "input_length": 4, "output_length": 1, "hash_ids": [0]}', "finite"),
    ('{"timestamp": Infinity, "input_length": 4, "output_length": 1, "hash_ids": [0]}', "finite"),
    (json.dumps(row(-1)), "negative timestamp"),
    (json.dumps(row(5, il=0, h=[])), "input_length must be >= 1"),
    (json.dumps(row(5, ol=0)), "output_length must be >= 1"),
    (json.dumps(row(5, il=9, h=[1, 2])),
     "hash_ids has 2 ids but ceil(input_length 9 / trace_block_size 4) = 3"),
    (json.dumps(row(5, h="abc")), "hash_ids must be a list"),
    (json.dumps(row(5, il=8, h=[1, 2.5])), "hash_ids must be 64-bit integers"),
    (json.dumps(row(5, il=8, h=[1, "2"])), "hash_ids must be 64-bit integers"),
    (json.dumps(row(5, il=8, h=[1, 2**64])), "hash_ids must be 64-bit integers"),
    (json.dumps(row(5, il=8, h=[[1], [2]])), "hash_ids must be 64-bit integers"),
    (json.dumps(row(5, request_id=7)), "request_id must be a non-empty string"),
    (json.dumps(row(5, priority=1.5)), "priority must be an integer"),
    (json.dumps(row(5, dp_rank=-2)), "dp_rank must be an integer >= 0"),
]


@pytest.mark.parametrize("bad, what", BAD_ROWS)
def test_mooncake_bad_row_names_file_and_line(tmp_path, bad, what):
    p = write_jsonl(tmp_path / "bad.jsonl", [row(0), bad, row(10)])
    msg = error_of(p)
    assert "bad.jsonl:2:" in msg
    assert what in msg


def test_mooncake_decreasing_timestamp(tmp_path):
    p = write_jsonl(tmp_path / "dec.jsonl", [row(0), row(10), row(10), row(9)])
    msg = error_of(p)
    assert "dec.jsonl:4:" in msg and "earlier than the previous" in msg


def test_mooncake_duplicate_request_id(tmp_path):
    p = write_jsonl(tmp_path / "dup.jsonl", [row(0, request_id="x"), row(1), row(2, request_id="x")])
    msg = error_of(p)
    assert "dup.jsonl:3:" in msg and "duplicate request_id 'x'" in msg and "line 1" in msg
    q = write_jsonl(tmp_path / "dup2.jsonl", [row(0, request_id="1"), row(1)])  # clashes with default "1"
    assert "dup2.jsonl:2:" in error_of(q)


def test_mooncake_blank_line_inside(tmp_path):
    p = write_jsonl(tmp_path / "blank.jsonl", [row(0), "", row(1)])
    msg = error_of(p)
    assert "blank.jsonl:2:" in msg and "blank line" in msg


@pytest.mark.parametrize("content", [b"", b"\n\n"])
def test_mooncake_empty_trace(tmp_path, content):
    p = tmp_path / "empty.jsonl"
    p.write_bytes(content)
    assert "empty.jsonl" in error_of(p) and "empty trace" in error_of(p)


def test_empty_gzip_and_zero_limit(tmp_path):
    p = tmp_path / "empty.jsonl.gz"
    p.write_bytes(gzip.compress(b""))
    assert "empty trace" in error_of(p)
    q = write_jsonl(tmp_path / "t.jsonl", [row(0)])
    assert "workload.limit" in error_of(q, limit=0)


def test_truncated_gzip(tmp_path):
    full = write_jsonl(tmp_path / "full.jsonl.gz", [row(i, il=400) for i in range(2000)], gz=True)
    p = tmp_path / "cut.jsonl.gz"
    data = full.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    msg = error_of(p)
    assert "cut.jsonl.gz" in msg and "truncated" in msg


def test_corrupt_gzip(tmp_path):
    p = tmp_path / "bad.jsonl.gz"
    p.write_bytes(b"\x1f\x8b\x08\x00garbage-not-deflate" * 10)
    assert "bad.jsonl.gz" in error_of(p)


def test_not_utf8(tmp_path):
    p = tmp_path / "bin.jsonl"
    p.write_bytes(json.dumps(row(0)).encode() + b"\n\xff\xfe\xfa\n")
    assert "bin.jsonl" in error_of(p)


def test_format_detection(tmp_path):
    assert trace_format("a/b.jsonl", None) == "mooncake"
    assert trace_format("a/b.JSONL.GZ", None) == "mooncake"
    assert trace_format("a/b.csv", None) == "azure"
    assert trace_format("a/b.txt", "azure") == "azure"
    with pytest.raises(InputError, match="workload.format"):
        trace_format("a/b.txt", None)
    with pytest.raises(InputError, match="unknown format"):
        trace_format("a/b.jsonl", "parquet")
    p = write_jsonl(tmp_path / "t.txt", ROWS)
    assert "workload.format" in error_of(p)
    check_rows(load(p, fmt="mooncake"), p)


def test_missing_file_and_bad_settings(tmp_path):
    assert "not found" in error_of(tmp_path / "nope.jsonl")
    p = write_jsonl(tmp_path / "t.jsonl", ROWS)
    assert "workload.speedup" in error_of(p, speedup=0)
    assert "workload.trace_block_size" in error_of(p, tbs=0)
    with pytest.raises(InputError, match="give a trace"):
        load_workload(WorkloadConfig(), 16)


# --------------------------------------------------------------------- Azure

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def write_csv(path, lines, header=AZURE_HEADER):
    path.write_text(header + "".join(line + "\n" for line in lines))
    return path


def test_azure_seven_digit_fractions(tmp_path):
    p = write_csv(tmp_path / "a.csv", [
        "2023-11-16 18:17:03.9799600,4808,10",
        "2023-11-16 18:17:04.0319600,3180,8",
        "2023-11-16 18:17:04.0781490,1000,1",
        "2023-11-16 23:59:59.9999999,1,1",
        "2023-11-17 00:00:00.0000001,1024,3",
    ])
    w = load(p, tbs=512)
    day_end_ms = ((23 - 18) * 3600 + (59 - 17) * 60 + (59 - 3)) * 1000 + (999_999_900 - 979_960_000) / 1e6
    assert w.arrival_ms.tolist() == [0.0, 52.0, 98.189, day_end_ms, day_end_ms + 0.0002]
    assert w.input_length.tolist() == [4808, 3180, 1000, 1, 1024]
    assert w.output_length.tolist() == [10, 8, 1, 1, 3]
    assert np.diff(w.hash_offsets).tolist() == [10, 7, 2, 1, 2]
    assert w.hash_flat.tolist() == list(range(22))  # no sharing: all ids distinct
    assert w.request_ids == ["0", "1", "2", "3", "4"]
    assert w.dp_rank.tolist() == [-1] * 5 and w.priority.tolist() == [0] * 5


def test_azure_2024_offsets_limit_speedup(tmp_path):
    p = write_csv(tmp_path / "a24.csv", [
        "2024-05-10 00:00:00.009930+00:00,100,10",
        "2024-05-10 00:00:01+00:00,100,10",
        "2024-05-10 02:00:02.5+02:00,100,10",  # = 00:00:02.5 UTC
        "2024-05-10T00:00:03Z,100,10",
    ])
    assert load(p).arrival_ms.tolist() == [0.0, 990.07, 2490.07, 2990.07]
    assert load(p, limit=2, speedup=10.0).arrival_ms.tolist() == [0.0, 99.007]


@pytest.mark.skipif(not (TRACES / "azure_llm_2023_code.csv").exists(), reason="shared traces not present")
def test_real_azure_trace():
    w = load(TRACES / "azure_llm_2023_code.csv", tbs=16)
    assert len(w) == 8819 and w.arrival_ms[0] == 0.0
    assert 3_435_900 < w.arrival_ms[-1] < 3_436_000
    assert np.array_equal(w.hash_flat, np.arange(w.hash_offsets[-1]))  # all distinct


AZURE_BAD = [
    ("2023-11-16 18:17:05.0,100,0", "GeneratedTokens must be >= 1"),
    ("2023-11-16 18:17:05.0,0,5", "ContextTokens must be >= 1"),
    ("2023-11-16 18:17:05.0,abc,5", "ContextTokens must be an integer"),
    ("2023-11-16 18:17:05.0,10.5,5", "ContextTokens must be an integer"),
    ("2023-11-16 18:17:05.0,100", "expected 3 columns"),
    ("2023-11-16 18:17:05.0,100,5,7", "expected 3 columns"),
    ("16/11/2023 18:17:05,100,5", "bad TIMESTAMP"),
    ("2023-13-16 18:17:05.0,100,5", "bad TIMESTAMP"),
    ("2023-11-16 25:17:05.0,100,5", "bad TIMESTAMP"),
    ("2023-11-16 18:17:03.0,100,5", "earlier than the previous"),
    ("", "blank line"),
]


@pytest.mark.parametrize("bad, what", AZURE_BAD)
def test_azure_bad_row_names_file_and_line(tmp_path, bad, what):
    p = write_csv(tmp_path / "bad.csv", ["2023-11-16 18:17:04.0,100,5", bad, "2023-11-16 18:17:06.0,100,5"])
    msg = error_of(p)
    assert "bad.csv:3:" in msg  # the header is line 1
    assert what in msg


def test_azure_header_and_empty(tmp_path):
    p = write_csv(tmp_path / "h.csv", ["2023-11-16 18:17:04.0,100,5"], header="time,in,out\n")
    msg = error_of(p)
    assert "h.csv:1:" in msg and "TIMESTAMP,ContextTokens,GeneratedTokens" in msg
    q = write_csv(tmp_path / "e.csv", [])
    assert "e.csv" in error_of(q) and "empty trace" in error_of(q)
    r = write_csv(tmp_path / "t.csv", ["2023-11-16 18:17:04.0,100,5", "", ""])  # trailing blanks ok
    assert len(load(r)) == 1


# ----------------------------------------------------------------- synthetic


def synth(**kw):
    kw.setdefault("requests", 200)
    return SyntheticConfig(**kw)


def same(a, b):
    return all(np.array_equal(getattr(a, f), getattr(b, f)) for f in
               ("arrival_ms", "input_length", "output_length", "hash_flat", "hash_offsets"))


def test_synthetic_determinism():
    cfg = synth(input_tokens=LengthDistribution("lognormal", mean=5.0, sigma=0.5, min=1, max=2000),
                output_tokens=LengthDistribution("uniform", min=1, max=300), arrival="poisson", rate=5.0)
    a, b = synthetic_workload(cfg, 16), synthetic_workload(cfg, 16)
    assert same(a, b) and a.request_ids == b.request_ids == [str(i) for i in range(200)]
    c = synthetic_workload(attrs.evolve(cfg, seed=7), 16)
    assert not np.array_equal(a.input_length, c.input_length)
    assert not np.array_equal(a.arrival_ms, c.arrival_ms)
    assert a.priority.tolist() == [0] * 200 and a.dp_rank.tolist() == [-1] * 200
    assert a.trace_block_size == 512 and a.source is None  # 32 blocks of 16, no shared prefix


def test_synthetic_shared_prefix_ids():
    cfg = synth(requests=50, input_tokens=LengthDistribution("uniform", min=1, max=200),
                shared_prefix_tokens=64)
    w = synthetic_workload(cfg, 16)
    # one id per 64 tokens: the largest unit of up to 32 engine blocks that
    # divides the 64-token shared prefix; the prefix is its first k = 1 ids
    assert w.trace_block_size == 64
    k = 1
    fresh = []
    for i in range(len(w)):
        ids = w.hash_flat[w.hash_offsets[i]:w.hash_offsets[i + 1]].tolist()
        assert len(ids) == -(-int(w.input_length[i]) // 64)
        s = min(k, len(ids))
        assert ids[:s] == list(range(s))  # a short prompt takes only the first shared ids
        fresh += ids[s:]
    assert len(set(fresh)) == len(fresh) and min(fresh) >= k
    assert w.input_length.min() < 64  # the short-prompt case was exercised
    none = synthetic_workload(synth(requests=10, shared_prefix_tokens=0), 16)
    assert none.trace_block_size == 512  # 32 blocks of 16
    assert none.hash_flat.tolist() == list(range(10 * 2))  # 1,024-token prompts, all unique


def test_synthetic_arrivals():
    w = synthetic_workload(synth(requests=20000, arrival="poisson", rate=50.0), 16)
    assert w.arrival_ms[0] == 0.0 and np.all(np.diff(w.arrival_ms) >= 0)
    assert abs(np.diff(w.arrival_ms).mean() - 20.0) < 0.5
    c = synthetic_workload(synth(requests=100, arrival="constant", rate=4.0), 16)
    assert c.arrival_ms.tolist() == [i * 250.0 for i in range(100)]
    assert synthetic_workload(synth(arrival="burst"), 16).arrival_ms.tolist() == [0.0] * 200


@pytest.mark.parametrize("dist, lo, hi", [
    (LengthDistribution("constant", value=77), 77, 77),
    (LengthDistribution("uniform", min=3, max=9), 3, 9),
    (LengthDistribution("lognormal", mean=6.0, sigma=1.5, min=50, max=900), 50, 900),
    (LengthDistribution("lognormal", mean=1.0, sigma=0.1, min=1, max=0), 1, 10),
    (LengthDistribution("zipf", a=1.3, min=2, max=5000), 2, 5000),
])
def test_synthetic_lengths_within_bounds(dist, lo, hi):
    w = synthetic_workload(synth(requests=3000, input_tokens=dist, output_tokens=dist), 16)
    for x in (w.input_length, w.output_length):
        assert x.dtype == np.int64 and x.min() >= lo and x.max() <= hi
    if dist.distribution == "uniform":
        assert set(w.input_length.tolist()) == set(range(3, 10))


@pytest.mark.parametrize("kw, what", [
    ({"requests": 0}, "requests"),
    ({"arrival": "poisson"}, "rate"),
    ({"arrival": "weekly", "rate": 1.0}, "unknown arrival"),
    ({"input_tokens": LengthDistribution("zipf", a=1.5, min=1)}, "needs max"),
    ({"input_tokens": LengthDistribution("zipf", a=0.5, min=1, max=10)}, "a > 1"),
    ({"input_tokens": LengthDistribution("uniform", min=10, max=5)}, "below min"),
    ({"output_tokens": LengthDistribution("pareto")}, "unknown distribution"),
    ({"input_tokens": LengthDistribution("constant", value=0)}, "constant length"),
])
def test_synthetic_errors(kw, what):
    with pytest.raises(InputError, match=what):
        synthetic_workload(synth(**kw), 16)


def test_synthetic_through_load_workload():
    cfg = synth(requests=30, arrival="constant", rate=10.0, concurrency=3, shared_prefix_tokens=32)
    full = load_workload(WorkloadConfig(synthetic=cfg), 16)
    assert full.concurrency == 3
    head = load_workload(WorkloadConfig(synthetic=cfg, limit=5, speedup=2.0, concurrency=8), 16)
    assert len(head) == 5 and head.concurrency == 8
    assert head.arrival_ms.tolist() == [0.0, 50.0, 100.0, 150.0, 200.0]
    assert np.array_equal(head.input_length, full.input_length[:5])
    assert np.array_equal(head.hash_flat, full.hash_flat[: full.hash_offsets[5]])
    assert head.hash_offsets.tolist() == full.hash_offsets[:6].tolist()
