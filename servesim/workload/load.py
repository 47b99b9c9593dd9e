"""Where a run's requests come from: `load_workload` reads `workload:` and
hands it to its source — a trace file (workload.py's Mooncake and Azure
readers, session_trace.py's session traces), a synthetic load (synthetic.py)
or synthetic sessions (sessions.py) — then applies the replay's shaping
(`limit`, `speedup`).
"""

import attrs
import numpy as np

from servesim.config.preflight import check_trace_ids
from servesim.errors import InputError
from servesim.workload.workload import (_READ_ERRORS, Workload, _check_block_size, _check_limit,
                                        _check_speedup, _corrupt, _HasSessions, _head,
                                        _limit_note, _mooncake_workload, _open_text,
                                        _read_azure_rows, _read_mooncake_rows, trace_format)


def load_workload(cfg, block_size: int) -> Workload:
    """Build the workload of a `WorkloadConfig` (README.md, "Config").

    A trace (Mooncake JSONL or Azure CSV) or a synthetic workload; `limit`
    keeps the first N rows, arrivals are shifted so the first is at 0 and
    divided by `speedup`; `concurrency` (workload's, else synthetic's) is
    carried in `Workload.concurrency`. Raises InputError on bad input.
    """
    _check_speedup(cfg.speedup)
    _check_limit(cfg.limit)
    if cfg.trace is not None and cfg.synthetic is not None:
        raise InputError("workload: give either trace or synthetic, not both")
    if cfg.trace is not None:
        w = _load_trace(cfg)
    elif cfg.synthetic is not None:
        from servesim.workload.synthetic import synthetic_workload

        w = synthetic_workload(cfg.synthetic, block_size)
        if cfg.limit is not None:
            w = _head(w, cfg.limit)
    else:
        raise InputError("workload: give a trace (a file) or a synthetic block")
    concurrency = cfg.concurrency
    if concurrency is None and cfg.synthetic is not None:
        concurrency = cfg.synthetic.concurrency
    if concurrency is not None and (type(concurrency) is not int or concurrency < 1):
        raise InputError(f"workload.concurrency: must be an integer >= 1 or null, got {concurrency!r}")
    if w.sessions is not None:
        from servesim.workload.sessions import scale_delays

        first = float(np.nanmin(w.arrival_ms))
        w = attrs.evolve(w, sessions=scale_delays(w.sessions, cfg.speedup))
    else:
        first = w.arrival_ms[0]
    arrival = (w.arrival_ms - first) / float(cfg.speedup)
    return attrs.evolve(w, arrival_ms=arrival, concurrency=concurrency)


def _load_trace(cfg) -> Workload:
    """Load `cfg.trace` in its format, applying `limit` while reading."""
    fmt = trace_format(cfg.trace, cfg.format)
    if fmt in ("mooncake-delta", "agentic_mooncake"):
        from servesim.workload.session_trace import load_session_trace

        return load_session_trace(cfg.trace, fmt, cfg.trace_block_size, cfg.limit)
    loader = load_mooncake if fmt == "mooncake" else load_azure
    return loader(cfg.trace, cfg.trace_block_size, cfg.limit)


def load_mooncake(path, trace_block_size: int = 512, limit: int | None = None) -> Workload:
    """Read a Mooncake JSONL trace (plain or gzip) into a Workload.

    Arrivals are the raw `timestamp`s (ms), not shifted; only the first
    `limit` rows are parsed. Every row is validated (errors name file:line).
    """
    _check_block_size(trace_block_size)
    with _open_text(path) as f:
        try:
            rows = _read_mooncake_rows(f, str(path), trace_block_size, limit)
        except _READ_ERRORS as e:
            raise _corrupt(path, e) from None
        except _HasSessions:
            rows = None
    if rows is None:  # rows with session fields: turns wait for each other
        from servesim.workload.session_trace import load_session_trace

        return load_session_trace(path, "mooncake", trace_block_size, limit)
    if not rows[0]:
        raise InputError(f"{path}: empty trace: no requests" + _limit_note(limit))
    return _mooncake_workload(rows, str(path), trace_block_size)


def load_azure(path, trace_block_size: int = 512, limit: int | None = None) -> Workload:
    """Read an Azure LLM inference CSV (2023 or 2024 timestamps) into a Workload.

    Arrival = ms since the first row. No prefix sharing: each request gets
    ceil(ContextTokens / trace_block_size) hash ids unique in the workload.
    """
    _check_block_size(trace_block_size)
    with _open_text(path) as f:
        try:
            rel_ns, ctx, gen = _read_azure_rows(f, str(path), limit)
        except _READ_ERRORS as e:
            raise _corrupt(path, e) from None
    n = len(ctx)
    if n == 0:
        raise InputError(f"{path}: empty trace: no requests" + _limit_note(limit))
    input_length = np.array(ctx, dtype=np.int64)
    nblocks = -(-input_length // trace_block_size)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(nblocks, out=offsets[1:])
    check_trace_ids(str(path), input_length, int(offsets[-1]))  # before allocating them
    return Workload(
        request_ids=[str(i) for i in range(n)],
        arrival_ms=np.array(rel_ns, dtype=np.int64) / 1e6,
        input_length=input_length,
        output_length=np.array(gen, dtype=np.int64),
        priority=np.zeros(n, dtype=np.int64),
        dp_rank=np.full(n, -1, dtype=np.int64),
        hash_flat=np.arange(offsets[-1], dtype=np.int64),
        hash_offsets=offsets,
        trace_block_size=trace_block_size,
        source=str(path),
    )
