"""The run's figures: `summary.json` (README.md, "Outputs", "Metrics").

Latency metrics are taken over finished requests only; rejected and
unfinished requests count in `requests`/`rejected`/`unfinished` and nowhere
else. Every value returned is JSON-native (int, float, None, str, list, dict),
floats rounded to 6 decimals so the file is stable across runs and machines.
"""

import math

import numpy as np

from servesim.jit import njit

from servesim.results.records import (
    STATUS_FINISHED,
    STATUS_REJECTED,
    STATUS_UNFINISHED,
    SimulationResult,
)
from servesim.results.worker_load import with_load

from servesim.results.stats import (_percentile_ranks, _quantile_ranks, _rate, _round,
                                    _sorted_stats, latency_stats, quantiles_of_sorted)


def tpot_samples(records, finished: np.ndarray) -> np.ndarray:
    """One sample per finished request with >= 2 output tokens:
    (last token - first token) / (output_tokens - 1), client times."""
    mask = finished & (records.output_tokens >= 2)
    span = records.finish_ms[mask] - records.first_token_ms[mask]
    return span / (records.output_tokens[mask] - 1).astype(np.float64)


def itl_samples(records, finished: np.ndarray) -> np.ndarray:
    """Every gap between consecutive token client times of each finished
    request (token-weighted), in request order, from one compiled pass over
    the tokens (no full-size temporaries: a run can have millions)."""
    times = np.asarray(records.token_client_ms, dtype=np.float64)
    offsets = np.asarray(records.token_offsets, dtype=np.int64)
    counts = np.diff(offsets)
    out = np.empty(int(np.maximum(counts[finished] - 1, 0).sum()), dtype=np.float64)
    _fill_gaps(times, offsets, finished, out)
    return out


@njit
def _fill_gaps(times, offsets, finished, out):
    n = 0
    for r in range(len(finished)):
        if finished[r]:
            for j in range(offsets[r] + 1, offsets[r + 1]):
                out[n] = times[j] - times[j - 1]
                n += 1


ITL_QUANTILE_STEPS = 200
# the distinct values counted before the order statistics fall back to a
# partition: a share of the samples, and a table of at most 2 MB
_MAX_DISTINCT_SHARE = 16
_MAX_DISTINCT = 1 << 17


@njit
def _distinct_counts(bits, table, shift, found, counts):
    """The distinct values of float64 samples (`bits`: their int64 view) into
    `found` and how many times each occurs into `counts`, by open addressing
    on the bits in `table` (2^(64 - shift) slots, all -1: empty; at least
    twice as many as `found` has entries); returns how many are distinct, or
    -1 once more than `len(found)` are. A run's ITL gaps are differences of
    pass instants, so ~1,400 values among 12.7 M gaps of 100,000 synthetic
    requests: counting them is one pass, against ~9 for a partition at the
    ~400 ranks the figures read."""
    size = len(table)
    max_distinct = len(found)
    used = 0
    for k in range(len(bits)):
        b = bits[k]
        slot = np.int64((np.uint64(b) * np.uint64(0x9E3779B97F4A7C15)) >> shift)
        j = table[slot]
        while j >= 0 and found[j] != b:
            slot = (slot + 1) & (size - 1)
            j = table[slot]
        if j >= 0:
            counts[j] += 1
        elif used == max_distinct:
            return -1
        else:
            found[used] = b
            counts[used] = 1
            table[slot] = used
            used += 1
    return used


def place_order_statistics(samples: np.ndarray, ranks: np.ndarray) -> None:
    """In place: `samples[r]` becomes the r-th smallest sample for every r in
    `ranks` (the others are left in any order), which is what the figures read
    of a sorted array (`_read_ranks`). Few distinct values (the usual ITL
    gaps) are counted (`_distinct_counts`) and each rank's value read off
    their cumulative counts; many, and it is `np.partition`."""
    n = samples.size
    limit = min(n // _MAX_DISTINCT_SHARE, _MAX_DISTINCT)
    used = -1
    if limit >= 1:  # (NaNs, never in gaps, would sort last either way)
        bits = max(int(2 * limit - 1).bit_length(), 2)
        table = np.full(1 << bits, -1, dtype=np.int64)  # slot -> index into values
        values = np.empty(limit, dtype=np.int64)
        counts = np.empty(limit, dtype=np.int64)
        used = _distinct_counts(samples.view(np.int64), table, np.uint64(64 - bits), values, counts)
    if used < 0:
        samples.partition(ranks)
        return
    values, counts = values[:used].view(np.float64), counts[:used]
    order = np.argsort(values, kind="stable")
    ends = np.cumsum(counts[order])  # rank r is the value whose range of ranks holds it
    samples[ranks] = values[order][np.searchsorted(ends, ranks, side="right")]


def _read_ranks(n, q) -> np.ndarray:
    """The ranks of the order statistics `quantiles_of_sorted(·, q)` and
    `_sorted_stats` read of n samples (each q's two neighbours, each
    percentile's, the maximum): with the samples partitioned at these ranks
    (np.partition), both return what they would on the sorted samples."""
    _, lower, upper = _quantile_ranks(n, q)
    ranks = [n - 1, *(r for _, lo, hi in _percentile_ranks(n) for r in (lo, hi))]
    return np.unique(np.concatenate([lower % n, upper % n, np.array(ranks, dtype=np.intp)]))


def itl_figures(records) -> tuple:
    """`(itl_ms, itl_quantiles)`: summary.json's ITL block (latency_stats of
    every gap of the finished requests) and itl_quantiles.json's dict, from
    one extraction of the gaps (a run can have hundreds of millions) and the
    ~400 order statistics the two read put in place
    (`place_order_statistics`: the gaps' distinct values counted, or a
    partition; 12.7 M gaps of 100,000 synthetic requests, ~1,400 distinct:
    ~0.04 s against ~0.5 s for the partition and ~1 s for a sort)."""
    finished = np.asarray(records.status) == STATUS_FINISHED
    samples = itl_samples(records, finished)
    q = np.linspace(0.0, 1.0, ITL_QUANTILE_STEPS + 1)
    if samples.size == 0:
        return latency_stats(samples), {"samples": 0, "quantiles": q.tolist(),
                                        "itl_ms": [None] * q.size}
    mean = samples.mean()  # in request order, as latency_stats takes it
    place_order_statistics(samples, _read_ranks(samples.size, q))  # what the two figures read, in place
    quantiles = {"samples": int(samples.size), "quantiles": [round(float(x), 6) for x in q],
                 "itl_ms": [_round(v) for v in quantiles_of_sorted(samples, q)]}
    return _sorted_stats(mean, samples), quantiles


def itl_quantiles(records) -> dict:
    """The ITL distribution of finished requests as exact quantiles (numpy's
    linear interpolation) at 0, 0.5%, ..., 100%: enough to draw its CDF
    without writing every token's time."""
    return itl_figures(records)[1]


def _worker_dict(w) -> dict:
    """One entry of `workers` (keys as in the spec's example; in
    disaggregated mode led by the worker's `pool`, its index being within
    the pool)."""
    pool = {} if w.pool is None else {"pool": w.pool}
    return {
        **pool,
        "worker": int(w.worker),
        "requests": int(w.requests),
        "passes": int(w.passes),
        "busy_ms": _round(w.busy_ms),
        "kv_usage_mean": _round(w.kv_usage_mean),
    }


def _with_routing(workers: list, rec) -> list:
    """Each worker's routing figures after its own (README.md, "Outputs"):
    `request_share`, its requests over its pool's, and
    `prefix_cache_hit_rate`, the prompt tokens cached at first admission over
    the prompt tokens of the requests admitted there (None on a decode
    worker, which computes no prompt, and where nothing was admitted)."""
    admitted = np.isfinite(np.asarray(rec.first_scheduled_ms))
    cached = np.where(admitted, rec.first_admission_cached_tokens, 0)
    prompt = np.where(admitted, rec.input_length, 0)
    totals = {}
    for w in workers:
        totals[w.get("pool")] = totals.get(w.get("pool"), 0) + w["requests"]
    for w in workers:
        pool = w.get("pool")
        total = totals[pool]
        w["request_share"] = _round(w["requests"] / total) if total else 0.0
        where = rec.prefill_worker if pool == "prefill" else rec.worker
        on = np.asarray(where) == w["worker"]
        queries = float(prompt[on].sum())
        w["prefix_cache_hit_rate"] = (_round(float(cached[on].sum()) / queries)
                                      if queries and pool != "decode" else None)
    return workers


def summarize(result: SimulationResult, config_dict: dict, wall_time_s: float) -> dict:
    """The summary.json dict of a run, keys in the spec's order.

    `config_dict` is the resolved config (stored as is under `config`);
    `wall_time_s` is the simulator's own run time (for `passes_per_s`).
    Also sets `result.itl_quantiles` (itl_quantiles.json's dict), computed
    with the summary's ITL figures from the same sorted gaps.
    """
    rec = result.records
    stats = result.stats
    status = np.asarray(rec.status)
    finished = status == STATUS_FINISHED
    n_finished = int(finished.sum())

    arrival = rec.arrival_ms[finished]
    first = rec.first_token_ms[finished]
    finish = rec.finish_ms[finished]
    duration_ms = float(finish.max()) if n_finished else 0.0
    if not math.isfinite(duration_ms):
        duration_ms = 0.0

    queries = int(stats.prefix_cache_queries)
    hits = int(stats.prefix_cache_hits)
    passes = int(stats.passes)
    wall_time_s = float(wall_time_s)
    itl_ms, result.itl_quantiles = itl_figures(rec)

    summary = {
        "requests": int(status.size),
        "finished": n_finished,
        "rejected": int((status == STATUS_REJECTED).sum()),
        "unfinished": int((status == STATUS_UNFINISHED).sum()),
        "duration_ms": _round(duration_ms),
        "request_rate": _rate(n_finished, duration_ms),
        "input_tokens_per_s": _rate(int(rec.input_length[finished].sum()), duration_ms),
        "output_tokens_per_s": _rate(int(rec.output_tokens[finished].sum()), duration_ms),
        "ttft_ms": latency_stats(first - arrival),
        "tpot_ms": latency_stats(tpot_samples(rec, finished)),
        "itl_ms": itl_ms,
        "e2e_ms": latency_stats(finish - arrival),
        "preemptions": int(stats.preemptions),
        "preempted_requests": int((np.asarray(rec.num_preemptions) > 0).sum()),
        "recomputed_tokens": int(np.asarray(rec.recomputed_tokens).sum()),
        "prefix_cache_queries": queries,
        "prefix_cache_hits": hits,
        "prefix_cache_hit_rate": _round(hits / queries) if queries else 0.0,
        "cpu_tier_hit_tokens": int(stats.cpu_tier_hit_tokens),
        "kv_usage_mean": _round(stats.kv_usage_mean),
        "kv_usage_max": _round(stats.kv_usage_max),
        "passes": passes,
        "wall_time_s": _round(wall_time_s),
        "passes_per_s": _round(passes / wall_time_s) if wall_time_s > 0 else 0.0,
        "workers": with_load(_with_routing([_worker_dict(w) for w in stats.workers], rec),
                             result.telemetry),
        "config": config_dict,
    }
    if stats.spec_positions is not None:
        summary = _with_speculative(summary, stats, rec, config_dict)
    if stats.cpu_tier:
        summary = _with_cpu_tier(summary, stats)
    if stats.pools is not None:
        summary = _with_pools(summary, stats, rec)
    if rec.session is not None:
        from servesim.results.session_metrics import with_sessions

        summary = with_sessions(summary, rec)
    return summary


def _pool_dict(p) -> dict:
    """One pool's figures; its DP width right after `workers` when the
    config sets the pool's own."""
    queries = int(p.prefix_cache_queries)
    width = {} if p.data_parallel_size is None else {"data_parallel_size": int(p.data_parallel_size)}
    return {
        "workers": int(p.workers),
        **width,
        "requests": int(p.requests),
        "passes": int(p.passes),
        "busy_ms": _round(p.busy_ms),
        "kv_usage_mean": _round(p.kv_usage_mean),
        "preemptions": int(p.preemptions),
        "prefix_cache_hit_rate": _round(p.prefix_cache_hits / queries) if queries else 0.0,
    }


def _with_pools(summary: dict, stats, rec) -> dict:
    """A disaggregated run also reports, right after `workers`, each pool's
    figures (`pools`) and the KV handoffs (`kv_transfer`: requests handed
    off, prompt tokens and bytes moved, and `kv_transfer_ms` — how long a
    decode worker waited for a handed-off request's KV — over the handed-off
    requests). The top-level prefix-cache figures are the prefill pool's."""
    handed = np.asarray(rec.decode_worker) >= 0
    transferred = np.asarray(rec.transferred_tokens)[handed]
    out = {}
    for key, value in summary.items():
        out[key] = value
        if key == "workers":
            out["pools"] = {name: _pool_dict(p) for name, p in stats.pools.items()}
            out["kv_transfer"] = {
                "handoffs": int(handed.sum()),
                "transfers": int((transferred > 0).sum()),
                "transferred_tokens": int(transferred.sum()),
                "transferred_bytes": int(stats.kv_transfer_bytes),
                "kv_transfer_ms": latency_stats(np.asarray(rec.kv_transfer_ms)[handed]),
            }
    return out


def _with_cpu_tier(summary: dict, stats) -> dict:
    """A run with a CPU tier also reports its transfers, right after
    `cpu_tier_hit_tokens`: load and store jobs, bytes moved each way, and the
    most blocks one rank's tier held. Runs without one keep the spec's keys."""
    out = {}
    for key, value in summary.items():
        out[key] = value
        if key == "cpu_tier_hit_tokens":
            out["cpu_tier_loads"] = int(stats.cpu_tier_loads)
            out["cpu_tier_stores"] = int(stats.cpu_tier_stores)
            out["cpu_tier_bytes_loaded"] = int(stats.cpu_tier_bytes_loaded)
            out["cpu_tier_bytes_stored"] = int(stats.cpu_tier_bytes_stored)
            out["cpu_tier_blocks_max"] = int(stats.cpu_tier_blocks_max)
    return out


def _with_speculative(summary: dict, stats, rec, config_dict: dict) -> dict:
    """A speculative run also reports, right after `recomputed_tokens`, its
    drafts (`speculative`): real drafts scheduled and accepted, the
    acceptance rate, the mean acceptance length (tokens a verification pass
    yields per request, 1 + accepted drafts per pass, vLLM's figure) and the
    acceptance rate per draft position (accepted at position i / verification
    passes). Plain runs keep the spec's keys."""
    counts = np.asarray(stats.spec_positions)
    verifications = int(counts[0, 0])
    drafted = int(np.asarray(rec.spec_drafted).sum())
    accepted = int(np.asarray(rec.spec_accepted).sum())
    spec = config_dict["engine"]["speculative"]
    block = {
        "method": spec["method"],
        "num_speculative_tokens": spec["num_speculative_tokens"],
        "verification_passes": verifications,
        "draft_tokens": drafted,
        "accepted_tokens": accepted,
        "acceptance_rate": _round(accepted / drafted) if drafted else 0.0,
        "mean_acceptance_length": _round(1 + accepted / verifications) if verifications else 1.0,
        "acceptance_rate_per_position": [_round(int(a) / verifications) if verifications else 0.0
                                         for a in counts[1]],
    }
    if stats.spec_profiles is not None:
        block["profiles"] = stats.spec_profiles
    out = {}
    for key, value in summary.items():
        out[key] = value
        if key == "recomputed_tokens":
            out["speculative"] = block
    return out


def with_baseline(summary: dict, plain: SimulationResult) -> dict:
    """`--baseline`: the same workload's TPOT without speculative decoding
    (`plain`, finished requests), and the speculative run's speedup over it
    (plain mean TPOT / speculative mean TPOT), in the `speculative` block."""
    finished = np.asarray(plain.records.status) == STATUS_FINISHED
    tpot = latency_stats(tpot_samples(plain.records, finished))
    ours = summary["tpot_ms"]["mean"]
    summary["speculative"]["baseline_tpot_ms"] = tpot
    summary["speculative"]["tpot_speedup"] = (_round(tpot["mean"] / ours)
                                              if ours and tpot["mean"] else None)
    return summary
