"""Property-based tests of session workloads (README, "Sessions and agent
graphs"): random `mooncake-delta` sessions on 1-3 workers, each router, sync
and async, open and closed loop, checked for:

- arrivals: a first turn arrives at its timestamp (closed loop: at 0 or when
  a session ends); a later turn at its predecessor's last token plus its delay;
- closed loop: at most N sessions have started and not ended;
- prompts: a later turn's prompt is the previous prompt + output + delta;
- reuse: on one worker with a cache that never evicts, a later turn's prefix
  hit is exactly the previous turn's cached tokens in full blocks: its prompt
  and all but its last output; under async scheduling with two or more
  outputs, one token fewer (the last pass was decided before the output of the
  pass in flight was known, and a block is cached only once its tokens are
  known: `_allocate` in servesim/scheduler/kv_cache_manager.py);
- the compiled runs of passes (no pass log) and the logged runs give
  identical results.
"""

import json
import os
import tempfile

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim.config.config import config_from_dict
from servesim.config.config_types import WorkloadConfig
from servesim.replay.api import simulate
from servesim.workload.load import load_workload

EXAMPLES = int(os.environ.get("SESSION_EXAMPLES", "40"))
BLOCK = 16


@st.composite
def session_rows(draw):
    rows = []
    num = draw(st.integers(1, 5))
    for s in range(num):
        turns = draw(st.integers(1, 4))
        t0 = draw(st.integers(0, 200))
        for k in range(turns):
            length = draw(st.integers(0 if k else 1, 100))
            row = {"session_id": f"s{s}", "input_length": length,
                   "output_length": draw(st.integers(1, 40)),
                   "hash_ids": [1000 * s + 10 * k + j for j in range(-(-length // BLOCK))]}
            if k == 0:
                row["timestamp"] = t0
            else:
                row["delay"] = draw(st.integers(0, 60))
            rows.append(row)
    interleave = draw(st.permutations(range(len(rows))))
    # keep each session's turns in order while interleaving sessions
    order, seen = [], {}
    for i in interleave:
        sid = rows[i]["session_id"]
        seen.setdefault(sid, [j for j, r in enumerate(rows) if r["session_id"] == sid])
        order.append(seen[sid].pop(0))
    return [rows[i] for i in order]


def build(rows, workers, router, async_scheduling, concurrency, num_blocks=4096,
          pass_log=False):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t.jsonl")
        with open(path, "w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows))
        workload = load_workload(WorkloadConfig(trace=path, format="mooncake-delta",
                                                trace_block_size=BLOCK,
                                                concurrency=concurrency), BLOCK)
    config = config_from_dict({
        "workload": {"synthetic": {"requests": 1}},
        "engine": {"block_size": BLOCK, "num_gpu_blocks": num_blocks, "max_num_seqs": 8,
                   "max_num_batched_tokens": 64, "async_scheduling": async_scheduling,
                   "timing": {"type": "linear", "base_ms": 3, "per_token_ms": 0.1}},
        "cluster": {"workers": workers, "router": router},
        "output": {"pass_log": pass_log}})
    return config, workload


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(rows=session_rows(), workers=st.integers(1, 3),
       router=st.sampled_from(["round_robin", "least_loaded", "least_prefill", "kv_router", {"policy": "kv_router", "kv_event_lag_ms": 15.0}, "weighted", "session_affinity"]),
       async_scheduling=st.booleans(), concurrency=st.sampled_from([None, 1, 2]))
def test_session_arrivals_prompts_and_paths(rows, workers, router, async_scheduling, concurrency):
    config, w = build(rows, workers, router, async_scheduling, concurrency)
    logged, _ = build(rows, workers, router, async_scheduling, concurrency, pass_log=True)
    ref = simulate(logged, w).records
    fast = simulate(config, w).records
    for name in ("arrival_ms", "first_token_ms", "finish_ms", "first_admission_cached_tokens",
                 "worker", "status"):
        np.testing.assert_array_equal(getattr(ref, name), getattr(fast, name))
    r = ref
    assert (r.status == 0).all()
    plan = w.sessions
    previous = {}
    for i, row in enumerate(rows):
        s = plan.session[i]
        if s in previous:
            j = previous[s]
            assert r.arrival_ms[i] == r.finish_ms[j] + row["delay"]
            assert r.input_length[i] == r.input_length[j] + r.output_length[j] + row["input_length"]
        elif concurrency is None:
            assert r.arrival_ms[i] == row["timestamp"] - min(x["timestamp"] for x in rows
                                                            if "timestamp" in x)
        previous[s] = i
    if concurrency is not None:
        first = {s: min(np.flatnonzero(plan.session == s)) for s in set(plan.session.tolist())}
        start = {s: r.arrival_ms[i] for s, i in first.items()}
        end = {s: r.finish_ms[plan.session == s].max() for s in start}
        for t in set(start.values()):
            live = sum(1 for s in start if start[s] <= t < end[s])
            assert live <= concurrency


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(rows=session_rows(), async_scheduling=st.booleans())
def test_a_later_turn_hits_everything_its_predecessor_computed(rows, async_scheduling):
    config, w = build(rows, 1, "round_robin", async_scheduling, None, num_blocks=100_000)
    r = simulate(config, w).records
    previous = {}
    for i in range(len(rows)):
        s = w.sessions.session[i]
        if s in previous:
            j = previous[s]
            # every token but the last sampled one was computed; under async
            # scheduling too, since the finishing output registers the blocks
            # its completed passes filled (`cache_blocks` from
            # `update_from_output`, docs/engine.md §7)
            known = r.input_length[j] + r.output_tokens[j] - 1
            assert r.first_admission_cached_tokens[i] == known // BLOCK * BLOCK
        previous[s] = i
