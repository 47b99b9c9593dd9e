"""The report's section of a session workload: TTFT by turn index (from
requests.jsonl) and the prefix-cache hit rate by turn (summary.json)."""

import numpy as np

from servesim.results import html as report


def sessions_section(plots, requests: list, summary: dict) -> list:
    """HTML parts of the "Sessions" section ([] for a run without sessions)."""
    sessions = summary.get("sessions")
    if not isinstance(sessions, dict) or not requests or "turn" not in requests[0]:
        return []
    finished = [r for r in requests if r.get("status") == "finished" and r.get("ttft_ms") is not None]
    depth = max((r["turn"] for r in requests), default=-1) + 1
    by_turn = [[] for _ in range(depth)]
    for r in finished:
        by_turn[r["turn"]].append(r["ttft_ms"])
    turns = [k for k in range(depth) if by_turn[k]]
    hit = sessions.get("prefix_cache_hit_rate_by_turn", [])

    def draw(fig):
        left, right = fig.subplots(1, 2)
        for q, color, label in ((50, report.COLORS[0], "p50"), (90, report.COLORS[1], "p90")):
            left.plot(turns, [np.percentile(by_turn[k], q) for k in turns], marker="o",
                      color=color, label=label)
        left.plot(turns, [np.mean(by_turn[k]) for k in turns], marker="s", linestyle="--",
                  color=report.COLORS[2], label="mean")
        left.set_title("TTFT by turn index")
        left.set_xlabel("turn (0: a session's first request)")
        left.set_ylabel("ms")
        left.legend(loc="best")
        right.bar(list(range(len(hit))), [100 * h for h in hit], color=report.COLORS[3])
        right.set_title("prefix-cache hit rate by turn")
        right.set_xlabel("turn")
        right.set_ylabel("% of prompt tokens cached")
        right.set_ylim(0, 105)
        from matplotlib.ticker import MaxNLocator

        for ax in (left, right):
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))

    rows = [["sessions", str(sessions["sessions"])],
            ["completed sessions", str(sessions["completed_sessions"])],
            ["turns per session", f"{report._fmt(sessions['turns_mean'])} mean, "
                                  f"{sessions['turns_max']} max"],
            ["session duration", report._ms(sessions["duration_ms"]["mean"]) + " mean"],
            ["TTFT first / later turns",
             f"{report._ms(sessions['ttft_ms_first_turn']['mean'])} / "
             f"{report._ms(sessions['ttft_ms_later_turns']['mean'])} mean"]]
    return ["<h2>Sessions</h2>", report._table(["", ""], rows),
            report._img("sessions", plots.figure(draw, height=3.0),
                        "Finished requests by turn index (requests.jsonl); hit rate: cached prompt "
                        "tokens at first admission over prompt tokens (summary.json sessions).")]
