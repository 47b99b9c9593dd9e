"""Synthetic forward-pass records with a known ground truth (fitting.md §3).

A test helper (also used by benchmarks/fitting_accuracy.py). Each worker runs
a sequence of passes:

- decode passes (no prefill, 8-128 decode requests, at most the capture size
  of tokens) whose own time is `4 + 0.25·decode_requests + 2e-6·decode_kv_tokens` ms;
- prefill passes (one prefill request, no decode) whose own time is
  `20 + 0.02·prefill_tokens` ms: piecewise (2,048-4,096 tokens) or eager
  (12,000-32,000 tokens, over the 4,096 capture size).

So the true `fitted` coefficients are TRUE_COEFFICIENTS = [4, 16, 0.02, 0.25, 2e-6]
(a prefill pass's 20 ms = intercept 4 + 16 per prefill request). Own times get
2% Gaussian noise (seeded).

The record of pass k carries `STALL_MS[carrier(k)][kind(k+1)]` of pass k+1's
launch (nothing for a decode pass k+1, nothing across a counter gap), so
`wall[k] = own[k] + carried[k] - carried[k-1]`: the spec's
`charge_own_launch` recovers `own` exactly. With the default eager sizes no
record goes below 0 ms (a pass is longer than the launch its predecessor
carries for it); `SHORT_EAGER_TOKENS` makes some raw records negative.

Workloads A and B differ in their pass mix: B has more prefills, longer
prefill runs (more prefill -> prefill carries) and more eager prefills.
"""

import json
from dataclasses import dataclass

import numpy as np

from servesim.fitting.records import DECODE, EAGER, PIECEWISE, parse_records

CAPTURE_SIZE = 4096
STALL_MS = {"decode": {"piecewise": 50.0, "eager": 180.0},
            "prefill": {"piecewise": 10.0, "eager": 190.0}}
STALL = {"max_cudagraph_capture_size": CAPTURE_SIZE, "stall_ms": STALL_MS}
TRUE_COEFFICIENTS = (4.0, 16.0, 0.02, 0.25, 2e-6)
NOISE = 0.02


@dataclass(frozen=True)
class Mix:
    """How a worker's pass sequence is drawn."""

    prefill_after_decode: float  # P(a decode pass is followed by a prefill run)
    prefill_after_prefill: float  # P(a prefill pass is followed by another prefill)
    eager_share: float  # P(a prefill pass is eager)
    gap: float  # P(the engine idles after a pass: a counter gap)


MIXES = {
    "A": Mix(prefill_after_decode=0.10, prefill_after_prefill=0.25, eager_share=0.3, gap=0.01),
    "B": Mix(prefill_after_decode=0.20, prefill_after_prefill=0.50, eager_share=0.6, gap=0.01),
}
SEEDS = {"A": 1, "B": 2}


@dataclass(frozen=True)
class SynthRecords:
    """Records in file order and their ground truth."""

    name: str
    lines: list  # JSONL text lines, one record each
    own_ms: np.ndarray  # each record's own time (its launch charged to itself)
    carried_ms: np.ndarray  # what each record carries of its successor's launch
    kind: np.ndarray  # DECODE / PIECEWISE / EAGER at CAPTURE_SIZE

    def records(self):
        return parse_records(self.lines, f"workload-{self.name}.jsonl")

    def write(self, path):
        path.write_text("".join(line + "\n" for line in self.lines))
        return path


EAGER_TOKENS = (12000, 32000)
# Eager prefills from just over the capture size: their own time (102-180 ms)
# can be less than the 180 ms a decode record before them carries, so their
# raw records go below 0 ms, as an engine's can (fitting.md §3).
SHORT_EAGER_TOKENS = (CAPTURE_SIZE + 1, 8000)


def synth_workload(name: str, passes_per_worker: int = 6000, workers: int = 2,
                   seed: int | None = None, eager_tokens: tuple = EAGER_TOKENS) -> SynthRecords:
    """Workload `name` ("A" or "B") of `workers` x `passes_per_worker` records,
    interleaved across workers by when each record ends. Eager prefills have
    `eager_tokens` (lowest, highest) prompt tokens."""
    mix = MIXES[name]
    rng = np.random.default_rng(SEEDS[name] if seed is None else seed)
    rows = []  # (end time, worker, counter, features, own, carried, kind)
    for w in range(workers):
        rows += _worker_rows(rng, mix, w, passes_per_worker, eager_tokens)
    rows.sort(key=lambda r: (r[0], r[1]))
    lines, own, carried, kind = [], [], [], []
    for _, w, counter, feats, own_ms, carried_ms, k in rows:
        record_ms = own_ms + carried_ms[0] - carried_ms[1]
        lines.append(json.dumps({
            "version": 1, "worker_id": f"w{w}", "counter_id": counter,
            "wall_time": record_ms / 1000.0,
            "scheduled_requests": dict(zip(("num_prefill_requests", "sum_prefill_tokens",
                                            "num_decode_requests", "sum_decode_kv_tokens"),
                                           feats))}))
        own.append(own_ms)
        carried.append(carried_ms[0])
        kind.append(k)
    return SynthRecords(name, lines, np.array(own), np.array(carried),
                        np.array(kind, dtype=np.int8))


def true_own_ms(feats) -> float:
    """The noise-free own time of a pass from its four features."""
    npr, pt, dr, kv = feats
    if npr:
        return 20.0 + 0.02 * pt
    return 4.0 + 0.25 * dr + 2e-6 * kv


def _worker_rows(rng, mix: Mix, w: int, n: int, eager_tokens: tuple) -> list:
    kinds, feats, gap_after = [], [], []
    kind = DECODE
    for _ in range(n):
        if kind == DECODE:
            dr = int(rng.integers(8, 129))
            kv = int(dr * rng.integers(300, 6001))
            feats.append((0, 0, dr, kv))
        else:
            low, high = (2048, 4096) if kind == PIECEWISE else eager_tokens
            pt = int(rng.integers(low, high + 1))
            feats.append((1, pt, 0, 0))
        kinds.append(kind)
        gap_after.append(rng.random() < mix.gap)
        p_prefill = mix.prefill_after_decode if kind == DECODE else mix.prefill_after_prefill
        if rng.random() < p_prefill:
            kind = EAGER if rng.random() < mix.eager_share else PIECEWISE
        else:
            kind = DECODE
    own = [true_own_ms(f) * (1.0 + NOISE * rng.standard_normal()) for f in feats]
    # carried[k]: what record k carries of pass k+1's launch (0 before a gap or the end).
    carried = [0.0] * n
    for k in range(n - 1):
        if not gap_after[k] and kinds[k + 1] != DECODE:
            carrier = "prefill" if kinds[k] != DECODE else "decode"
            nxt = "eager" if kinds[k + 1] == EAGER else "piecewise"
            carried[k] = STALL_MS[carrier][nxt]
    rows, counter, clock = [], 0, 0.0
    for k in range(n):
        before = carried[k - 1] if k else 0.0
        clock += own[k] + carried[k] - before
        rows.append((clock, w, counter, feats[k], own[k], (carried[k], before), kinds[k]))
        counter += 1
        if gap_after[k]:
            gap = int(rng.integers(2, 20))
            counter += gap
            clock += 5.0 * gap
    return rows
