"""The per-session figures of a session workload's summary (README,
"Outputs"): sessions, turns, session durations, TTFT of first and later
turns, and the prefix-cache hit rate by turn index."""

import numpy as np

from servesim.results.stats import _round, latency_stats
from servesim.results.records import STATUS_FINISHED


def session_summary(rec) -> dict:
    """`sessions` of summary.json. A session's duration runs from its first
    arrival to its last token at the client, over sessions whose requests all
    finished and that `workload.limit` did not cut short (those are counted
    in `truncated_sessions`, present only when there are some). Hit rates are cached prompt tokens at first admission (G1 and
    CPU tier) over the prompt tokens of the requests admitted, per turn."""
    session, turn = rec.session, rec.turn
    num_sessions = len(rec.session_ids)
    finished = rec.status == STATUS_FINISHED
    turns = np.bincount(session, minlength=num_sessions)
    done = np.bincount(session, weights=finished, minlength=num_sessions) == turns
    cut = rec.session_truncated
    if cut is not None:
        done &= ~cut
    start = np.full(num_sessions, np.inf)
    np.minimum.at(start, session, np.where(np.isfinite(rec.arrival_ms), rec.arrival_ms, np.inf))
    end = np.full(num_sessions, -np.inf)
    np.maximum.at(end, session, np.where(finished, rec.finish_ms, -np.inf))
    ttft = rec.first_token_ms - rec.arrival_ms
    admitted = np.isfinite(rec.first_scheduled_ms)
    cached = np.where(admitted, rec.first_admission_cached_tokens, 0)
    prompt = np.where(admitted, rec.input_length, 0)
    depth = int(turn.max()) + 1 if len(turn) else 0
    by_turn_hits = np.bincount(turn, weights=cached, minlength=depth)
    by_turn_queries = np.bincount(turn, weights=prompt, minlength=depth)

    def rate(mask):
        q = float(prompt[mask].sum())
        return _round(float(cached[mask].sum()) / q) if q else 0.0

    means = []
    for k in range(depth):
        m = finished & (turn == k)
        means.append(_round(float(ttft[m].mean())) if m.any() else None)
    out = {
        "sessions": num_sessions,
        "completed_sessions": int(done.sum()),
        "turns_mean": _round(float(turns.mean())) if num_sessions else 0.0,
        "turns_max": int(turns.max()) if num_sessions else 0,
        "duration_ms": latency_stats((end - start)[done]),
        "ttft_ms_first_turn": latency_stats(ttft[finished & (turn == 0)]),
        "ttft_ms_later_turns": latency_stats(ttft[finished & (turn > 0)]),
        "ttft_ms_mean_by_turn": means,
        "prefix_cache_hit_rate_first_turn": rate(turn == 0),
        "prefix_cache_hit_rate_later_turns": rate(turn > 0),
        "prefix_cache_hit_rate_by_turn": [
            _round(h / q) if q else 0.0 for h, q in zip(by_turn_hits.tolist(), by_turn_queries.tolist())],
    }
    if cut is not None and cut.any():
        out = {key: out[key] for key in ("sessions", "completed_sessions")} | {
            "truncated_sessions": int(cut.sum())} | out
    return out


def with_sessions(summary: dict, rec) -> dict:
    """`summary` with `sessions` before `passes`."""
    out = {}
    for key, value in summary.items():
        if key == "passes":
            out["sessions"] = session_summary(rec)
        out[key] = value
    return out
