"""What test modules share (they import it as `from helpers import ...`;
tests/conftest.py puts tests/ on sys.path). First, small builders for
engine-rule tests: a workload from a few dict rows, a config from engine
overrides, and a run that returns the per-request records and the pass log;
then the CLI's tiny run, the capacity tests' closed-form config, and the
Hypothesis strategies of the compiled-path and whole-run property tests.

Rows are `{id, t, P, O, hash_ids=None, priority=0}`: `t` the arrival (ms), `P`
the prompt length, `O` the output length. Without `hash_ids` a request gets
`ceil(P / trace_block_size)` ids of its own (no prefix shared with anyone).
"""


import signal

import attrs
import numpy as np
from click.testing import CliRunner
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from servesim.cli.main import main
from servesim.config.config import config_from_dict
from servesim.replay.api import simulate
from servesim.results.records import STATUS_NAMES
from servesim.workload.workload import Workload

LINEAR_10MS = {"type": "linear", "base_ms": 10, "per_token_ms": 0}
_UNIQUE_BASE = 1_000_000  # default hash ids start here, far from hand-written ones

def make_workload(rows, trace_block_size=16) -> Workload:
    """A Workload in the given row order (rows must be in arrival order)."""
    hash_ids = []
    next_unique = _UNIQUE_BASE
    for row in rows:
        ids = row.get("hash_ids")
        if ids is None:
            n = -(-int(row["P"]) // trace_block_size)
            ids = list(range(next_unique, next_unique + n))
            next_unique += n
        hash_ids.append([int(h) for h in ids])
    return workload_of([float(r["t"]) for r in rows], [int(r["P"]) for r in rows],
                       [int(r["O"]) for r in rows], hash_ids,
                       priority=[int(r.get("priority", 0)) for r in rows],
                       ids=[str(r["id"]) for r in rows], trace_block_size=trace_block_size)


def workload_of(arrivals, prompts, outputs, hash_ids, *, priority=None, dp_rank=None,
                trace_block_size=16, concurrency=None, ids=None) -> Workload:
    """A Workload from per-request lists (`hash_ids`: one list of ids each);
    ids default to r0, r1, ..., priorities to 0, ranks to unpinned."""
    n = len(prompts)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum([len(h) for h in hash_ids], out=offsets[1:])
    return Workload(
        request_ids=list(ids) if ids is not None else [f"r{i}" for i in range(n)],
        arrival_ms=np.array(arrivals, dtype=np.float64),
        input_length=np.array(prompts, dtype=np.int64),
        output_length=np.array(outputs, dtype=np.int64),
        priority=np.array(priority if priority is not None else [0] * n, dtype=np.int64),
        dp_rank=np.array(dp_rank if dp_rank is not None else [-1] * n, dtype=np.int64),
        hash_flat=np.array([h for ids_ in hash_ids for h in ids_], dtype=np.int64),
        hash_offsets=offsets,
        trace_block_size=trace_block_size,
        concurrency=concurrency,
    )


def family_prefix_ids(num_ids, shared, family, unique):
    """A prompt's hash ids: its first `shared` trace blocks those of prefix
    family `family`, the others fresh ids from `unique`. Returns `(ids, next
    fresh id)`."""
    fresh = num_ids - shared
    return ([100 * family + j for j in range(shared)] + list(range(unique, unique + fresh)),
            unique + fresh)


def make_config(timing=None, cluster=None, output=None, **engine):
    """A Config with the given engine keys (YAML layout), linear timing of 10 ms
    per pass unless `timing` is given, and the pass log on unless `output`
    says otherwise. `max_num_seqs` defaults to 16 (not vLLM's 256) so that
    small token budgets are valid. The workload block is a placeholder: tests
    hand `run` a Workload built by `make_workload`."""
    engine = dict(engine)
    engine.setdefault("max_num_seqs", 16)
    engine["timing"] = dict(LINEAR_10MS if timing is None else timing)
    data = {
        "workload": {"synthetic": {"requests": 1}, "trace_block_size": 16},
        "engine": engine,
        "output": {"pass_log": True} if output is None else output,
    }
    if cluster is not None:
        data["cluster"] = cluster
    return config_from_dict(data, source="test")


def run_result(config, workload):
    """The whole SimulationResult (records, stats, pass log), pass log on."""
    if not config.output.pass_log:
        config = attrs.evolve(config, output=attrs.evolve(config.output, pass_log=True))
    return simulate(config, workload)


def run(config, workload):
    """`(records, pass_log)` of one simulation."""
    result = run_result(config, workload)
    return result.records, result.pass_log


# -- reading results ---------------------------------------------------------


def sched(p):
    """A logged pass's scheduled entries as `(id, tokens, cached, kind)`."""
    return [(e["id"], e["tokens"], e["cached"], e["kind"]) for e in p["scheduled"]]


def times(log):
    """`(start_ms, end_ms)` of every logged pass."""
    return [(p["start_ms"], p["end_ms"]) for p in log]


def tokens(log):
    """Per pass, `{id: tokens}`."""
    return [{e["id"]: e["tokens"] for e in p["scheduled"]} for p in log]


def free_blocks(log):
    return [p["free_blocks_after_schedule"] for p in log]


def req(records, request_id):
    """One request's results as a dict (NaN times become None)."""
    i = records.ids.index(request_id)

    def ms(x):
        x = float(x)
        return None if x != x else x

    return {
        "status": STATUS_NAMES[int(records.status[i])],
        "first_token_ms": ms(records.first_token_ms[i]),
        "finish_ms": ms(records.finish_ms[i]),
        "first_token_pass": int(records.first_token_pass[i]),
        "finish_pass": int(records.finish_pass[i]),
        "output_tokens": int(records.output_tokens[i]),
        "num_preemptions": int(records.num_preemptions[i]),
        "first_admission_cached_tokens": int(records.first_admission_cached_tokens[i]),
        "recomputed_tokens": int(records.recomputed_tokens[i]),
    }


# --------------------------------------------------------------------------- the CLI
# A tiny synthetic run (tests/conftest.py's `tiny_config` writes it) and the
# command line in process.

TINY = """\
workload:
  synthetic:
    requests: 6
    input_tokens: 64
    output_tokens: 4
    arrival: burst
engine:
  block_size: 16
  num_gpu_blocks: 256
  timing:
    type: fixed
    prefill_ms: 10.0
    decode_ms: 5.0
"""


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def never_called(monkeypatch, name):
    """Replace `servesim.replay.api`'s function `name` (`run`: the replay's
    entry point, which the CLI imports when it runs; `make_replay`: the
    simulation) by one that records its call and fails: a refusal that must
    come before it leaves the returned list empty."""
    from servesim.replay import api

    calls = []

    def refused(*args, **kwargs):
        calls.append(args)
        raise AssertionError(f"servesim.replay.api.{name} was called")

    monkeypatch.setattr(api, name, refused)
    return calls


# --------------------------------------------------------------------------- capacity

T, N = 10.0, 100
# One request per 10 ms pass: at a constant rate r, request i's TTFT is
# 10 + i * max(0, 10 - 1000/r), so TTFT p99 (rank 0.99 * 99) <= 15 ms exactly
# while 1000/r >= T * (1 - 0.5 / (0.99 * (N - 1))).
ONE_PER_PASS = f"""\
workload:
  synthetic:
    requests: {N}
    input_tokens: 16
    output_tokens: 1
    arrival: constant
    rate: 10
engine:
  max_num_seqs: 1
  max_num_batched_tokens: 16
  timing: {{type: fixed, prefill_ms: {T}, decode_ms: {T}}}
"""
TRUE_RATE = 1000 / (T * (1 - 0.5 / (0.99 * (N - 1))))


def write(tmp_path, text, name="c.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# ------------------------------------------------------- random whole simulations
# Random requests and engines, built into a config and a workload.

requests = st.lists(
    st.tuples(st.integers(0, 400),            # arrival ms
              st.integers(1, 300),            # prompt tokens
              st.integers(1, 60),             # output tokens
              st.integers(0, 3),              # shared-prefix group
              st.integers(0, 2)),             # priority
    min_size=1, max_size=14)

engines = st.fixed_dictionaries({
    "block_size": st.sampled_from([4, 16]),
    "num_gpu_blocks": st.integers(12, 96),
    "max_num_seqs": st.integers(1, 8),
    "max_num_batched_tokens": st.sampled_from([16, 48, 128, 512]),
    "enable_prefix_caching": st.booleans(),
    "enable_chunked_prefill": st.booleans(),
    "long_prefill_token_threshold": st.sampled_from([0, 0, 24]),
    "scheduling_policy": st.sampled_from(["fcfs", "priority"]),
    "reserve_full_isl": st.booleans(),
    "watermark": st.sampled_from([0.0, 0.0, 0.1]),
    "async_scheduling": st.booleans(),
    "max_model_len": st.sampled_from([None, 200, 512]),
})


def build(spec, engine, **extra):
    engine = dict(engine)
    if not engine["enable_chunked_prefill"]:
        # vLLM: without chunked prefill the budget must hold a whole prompt
        engine["max_model_len"] = engine["max_model_len"] or 512
        engine["max_num_batched_tokens"] = max(engine["max_num_batched_tokens"],
                                               engine["max_model_len"])
    engine["max_num_batched_tokens"] = max(engine["max_num_batched_tokens"], engine["max_num_seqs"])
    config = make_config(timing={"type": "linear", "base_ms": 3, "per_token_ms": 0.05}, **engine)
    rows = []
    for i, (t, P, O, group, priority) in enumerate(sorted(spec)):
        shared = [1000 * group + k for k in range(3)]   # 48 shared tokens per group
        own = [10_000 + 100 * i + k for k in range(20)]
        ids = (shared + own)[:-(-P // 16)]
        rows.append({"id": f"r{i}", "t": t, "P": P, "O": O, "hash_ids": ids,
                     "priority": priority})
    workload = make_workload(rows)
    if extra:
        config = attrs.evolve(config, **{k: attrs.evolve(getattr(config, k), **v)
                                         for k, v in extra.items()})
    return config, workload


# --------------------------------------------------------------------------- whole-run properties
# Random engines and workloads for property tests of whole simulations.

TRACE_BLOCK_SIZE = 16

SETTINGS = settings(max_examples=100, deadline=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def ceil_div(a, b):
    return -(-a // b)


@st.composite
def engine_configs(draw, chunked=None):
    """Engine keys for config_from_dict: vLLM's cross-checks hold
    (max_num_batched_tokens >= max_num_seqs, and >= max_model_len when
    chunked prefill is off)."""
    max_num_seqs = draw(st.integers(1, 8), label="max_num_seqs")
    budget = draw(st.integers(max(8, max_num_seqs), 256), label="max_num_batched_tokens")
    if chunked is None:
        chunked = draw(st.booleans(), label="enable_chunked_prefill")
    if chunked:
        max_model_len = draw(st.none() | st.integers(2, 300) | st.integers(150, 300),
                             label="max_model_len")
        threshold = draw(st.sampled_from([0, 0, 16, 48]), label="long_prefill_token_threshold")
    else:
        # a prompt is scheduled whole: without a max_model_len <= budget a
        # long prompt would wait for ever (config validation requires it when
        # max_model_len is given)
        max_model_len = draw(st.integers(2, budget) | st.integers(max(2, budget // 2), budget),
                             label="max_model_len")
        threshold = 0
    return {
        "block_size": draw(st.sampled_from([16, 4]), label="block_size"),
        # small pools are where preemption happens
        "num_gpu_blocks": draw(st.integers(8, 20) | st.integers(8, 64), label="num_gpu_blocks"),
        "enable_prefix_caching": draw(st.booleans(), label="enable_prefix_caching"),
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": budget,
        "max_model_len": max_model_len,
        "enable_chunked_prefill": chunked,
        "long_prefill_token_threshold": threshold,
        "scheduling_policy": draw(st.sampled_from(["fcfs", "priority"]), label="policy"),
        "reserve_full_isl": draw(st.booleans(), label="reserve_full_isl"),
        "watermark": draw(st.sampled_from([0.0, 0.1]), label="watermark"),
        "async_scheduling": draw(st.booleans(), label="async_scheduling"),
        "timing": {"type": "linear",
                   "base_ms": draw(st.sampled_from([0.0, 1.0, 2.5]), label="base_ms"),
                   "per_token_ms": draw(st.sampled_from([0.0, 0.02]), label="per_token_ms")},
    }


@st.composite
def workloads(draw, engine, fit=False):
    """1-12 requests; prompts of 1-200 tokens, outputs of 1-40. Each request
    belongs to one of two prefix families and takes its family's first
    `shared` trace-block hash ids (so prefixes are often shared, in part or in
    whole), the rest are unique. With `fit`, every request fits the pool
    alone and stays below max_model_len."""
    n = draw(st.integers(1, 12) | st.integers(8, 12), label="num_requests")
    arrivals = sorted(draw(st.lists(st.integers(0, 60), min_size=n, max_size=n), label="arrivals"))
    bs, usable = engine["block_size"], engine["num_gpu_blocks"] - 1
    max_model_len = engine["max_model_len"]
    max_prompt = 200
    if fit:
        max_prompt = min(max_prompt, usable * bs)
        if max_model_len is not None:
            max_prompt = min(max_prompt, max_model_len - 1)
    input_length, output_length, hash_ids = [], [], []
    unique = 1000
    for _ in range(n):
        prompt = draw(st.integers(1, min(max_prompt, 64)) | st.integers(1, max_prompt),
                      label="input_length")
        max_output = 40
        if fit:  # the most tokens ever computed, P + O - 1, fit the pool
            max_output = max(1, min(max_output, usable * bs - prompt + 1))
        output = draw(st.integers(1, max_output), label="output_length")
        num_ids = ceil_div(prompt, TRACE_BLOCK_SIZE)
        shared = draw(st.integers(0, num_ids), label="shared_trace_blocks")
        family = draw(st.integers(0, 1), label="prefix_family")
        ids, unique = family_prefix_ids(num_ids, shared, family, unique)
        input_length.append(prompt)
        output_length.append(output)
        hash_ids.append(ids)
    priority = draw(st.lists(st.integers(-1, 2), min_size=n, max_size=n), label="priority")
    return workload_of(arrivals, input_length, output_length, hash_ids, priority=priority,
                       trace_block_size=TRACE_BLOCK_SIZE)


def expected_max_tokens(engine, workload):
    """`max_tokens = min(output_length, max_model_len - P)`."""
    out = workload.output_length.copy()
    if engine["max_model_len"] is not None:
        out = np.minimum(out, engine["max_model_len"] - workload.input_length)
    return out


def rejected_at_arrival(engine, workload):
    """`ceil(P / block_size) > num_gpu_blocks - 1` or `P >= max_model_len`."""
    prompt = workload.input_length
    rejected = ceil_div(prompt, engine["block_size"]) > engine["num_gpu_blocks"] - 1
    if engine["max_model_len"] is not None:
        rejected |= prompt >= engine["max_model_len"]
    return rejected


def after_every_event(replay, hook):
    """Stop every worker's compiled pass loop after each of its events (a
    decision, or a pass's outputs) and call `hook(core)` then, the replay's
    own checks first. The horizon only bounds how many events a run takes,
    so the run's results are unchanged."""
    horizon, on_progress = replay.horizon_key, replay.on_progress

    def checked(core=None):
        on_progress(core)
        if core is not None:
            hook(core)

    replay.horizon_key = lambda: min(horizon(), (-np.inf, 0, 0))
    replay.on_progress = checked
    return replay


def answers_ctrl_c():
    """A subprocess's `preexec_fn` for the Ctrl-C tests: SIGINT back to its
    default action. A shell runs a background job with SIGINT ignored, and
    Python started with it ignored never raises KeyboardInterrupt, so a suite
    launched with `&` would otherwise fail these tests for no fault of ours."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def without_aic(monkeypatch):
    """This process as if aiconfigurator-core were not installed."""
    import importlib.util as util

    from servesim.deployment import specs

    find_spec = util.find_spec
    monkeypatch.setattr(specs, "_database_dir", lambda: None)
    monkeypatch.setattr(util, "find_spec",
                        lambda name, *a: None if name == "aiconfigurator_core" else find_spec(name, *a))
