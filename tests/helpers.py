"""Small builders for engine-rule tests: a workload from a few dict rows, a
config from engine overrides, and a run that returns the per-request records
and the pass log.

Rows are `{id, t, P, O, hash_ids=None, priority=0}`: `t` the arrival (ms), `P`
the prompt length, `O` the output length. Without `hash_ids` a request gets
`ceil(P / trace_block_size)` ids of its own (no prefix shared with anyone).
"""

import inspect

import attrs
import numpy as np

from servesim.config.config import config_from_dict
from servesim.replay.driver import simulate
from servesim.results.records import STATUS_NAMES
from servesim.workload.workload import Workload

LINEAR_10MS = {"type": "linear", "base_ms": 10, "per_token_ms": 0}
_UNIQUE_BASE = 1_000_000  # default hash ids start here, far from hand-written ones

# The scheduler implementations `simulate` can run (its `path` argument), or
# [None] when it has no choice. Tests run on every one of them.
if "path" in inspect.signature(simulate).parameters:
    PATHS = ["reference", "fast"]
else:
    PATHS = [None]
current_path = None  # set per test by the `scheduler_path` fixture


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


def run_result(config, workload, path=None):
    """The whole SimulationResult (records, stats, pass log), pass log on, on
    scheduler `path` (default: the current test's, see PATHS)."""
    if not config.output.pass_log:
        config = attrs.evolve(config, output=attrs.evolve(config.output, pass_log=True))
    path = path or current_path
    if path is None:
        return simulate(config, workload)
    return simulate(config, workload, path=path)


def run(config, workload, path=None):
    """`(records, pass_log)` of one simulation."""
    result = run_result(config, workload, path)
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
