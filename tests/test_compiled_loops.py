"""The compiled pass loop's ways of running agree.

A worker without KV transfers runs its passes inside one compiled loop
(servesim/engine/pass_loop.py). With the pass log on it writes the log into its
buffer and, with several workers, stops at every event so that passes go into
the log in event order; with it off it runs up to the next outside event
(arrival, telemetry tick, a closed loop's release). Both must give the same
request records, run counters and telemetry, on random workloads and engine
configs, and a run is deterministic. The rules themselves are held to
hand-worked timelines in tests/test_engine_rules.py.
"""

import os
import sys
from unittest.mock import patch

import attrs
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from servesim.engine import worker
from servesim.engine.pass_log_buffer import PassLogBuffer
from servesim.engine.pass_loop import run_passes
from servesim.engine.core import EngineCore
from servesim.replay.driver import Replay
from servesim.replay.api import simulate
from servesim.results.records import STATUS_FINISHED, STATUS_REJECTED
from servesim.results.output import dict_lines
from helpers import build, engines, requests
from servesim.engine.config import RouterConfig

# kv_router whose KV events reach it 15 ms late (`build` takes a RouterConfig)
LAGGED_KV_ROUTER = RouterConfig(policy="kv_router", kv_event_lag_ms=15.0)

def same_records(a, b):
    for field in attrs.fields(type(a)):
        x, y = getattr(a, field.name), getattr(b, field.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype, field.name
            assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), field.name
        else:
            assert x == y, field.name


def same_results(a, b):
    """Same records, counters and telemetry (the pass log aside)."""
    same_records(a.records, b.records)
    assert attrs.asdict(a.stats) == attrs.asdict(b.stats)
    assert a.telemetry == b.telemetry


def with_pass_log(config, on):
    return attrs.evolve(config, output=attrs.evolve(config.output, pass_log=on))


@settings(max_examples=100, deadline=None)
@given(requests, engines)
def test_a_run_is_deterministic(spec, engine):
    config, workload = build(spec, engine)           # pass log on: in the compiled buffer
    a, b = simulate(config, workload), simulate(config, workload)
    same_results(a, b)
    assert list(a.pass_log) == list(b.pass_log)


@settings(max_examples=150, deadline=None)
@given(requests, engines, st.sampled_from([None, 7.0, 50.0]))
def test_runs_without_the_pass_log_give_the_logged_results(spec, engine, interval):
    config, workload = build(spec, engine, output={"pass_log": False,
                                                  "telemetry_interval_ms": interval})
    same_results(simulate(config, workload), simulate(with_pass_log(config, True), workload))


@settings(max_examples=60, deadline=None)
@given(requests, engines, st.integers(1, 4), st.sampled_from(["round_robin", "least_loaded", "least_prefill", "kv_router", LAGGED_KV_ROUTER, "weighted"]),
       st.sampled_from([None, 2, 5]))
def test_compiled_runs_across_workers_and_closed_loop(spec, engine, workers, router, concurrency):
    config, workload = build(spec, engine, output={"pass_log": False},
                             cluster={"workers": workers, "router": router})
    workload = attrs.evolve(workload, concurrency=concurrency)
    same_results(simulate(config, workload), simulate(with_pass_log(config, True), workload))


LAUNCHES = st.sampled_from([None, {"decode_ms": 2.0, "piecewise_ms": 5.0, "eager_ms": 9.0,
                                   "eager_queue_fraction": 0.4,
                                   "max_cudagraph_capture_size": 32}])


@settings(max_examples=80, deadline=None)
@given(requests, engines, st.integers(1, 3), st.integers(1, 2), LAUNCHES, st.booleans(),
       st.sampled_from([None, 3]), st.sampled_from([0.0, 0.3]))
def test_compiled_pass_loop_across_ranks_launch_and_pass_log(spec, engine, dp, workers, launch,
                                                             pass_log, concurrency, detokenize):
    # the compiled loop runs attention-DP ranks in lockstep, launch timing
    # (async) and the pass log in its buffer; with the log off it runs further
    engine = dict(engine, detokenize_ms=detokenize)
    if launch is not None:
        engine.update(launch=launch, async_scheduling=True)
    config, workload = build(spec, engine, output={"pass_log": pass_log,
                                                  "telemetry_interval_ms": 20.0},
                             cluster={"workers": workers, "data_parallel_size": dp})
    workload = attrs.evolve(workload, concurrency=concurrency)
    a = simulate(config, workload)
    b = simulate(with_pass_log(config, not pass_log), workload)
    same_results(a, b)
    log = a.pass_log if pass_log else b.pass_log
    pieces, previous = [], None
    for chunk in log.chunks(chunk=3):  # a chunk stays intact while the next is made
        if previous is not None:
            pieces.append(bytes(previous))
        previous = chunk
    text = b"".join(pieces + ([bytes(previous)] if previous is not None else [])).decode("ascii")
    assert text == "".join(line + "\n" for line in dict_lines(list(log)))
    assert len(log) == len(list(log))


CPU_TIERS = st.sampled_from([None, {"num_cpu_blocks": 24, "bytes_per_token": 62500,
                                    "d2h_gbps": 0.5, "h2d_gbps": 0.5, "connector": "offloading"},
                             {"num_cpu_blocks": 8, "bytes_per_token": 62500,
                              "d2h_gbps": 5.0, "h2d_gbps": 0.05, "connector": "simple_cpu"}])


@settings(max_examples=120, deadline=None)
@given(requests, engines, st.booleans(), st.sampled_from([None, 7.0]), CPU_TIERS,
       st.sampled_from([1, 2, 4096]))
def test_arrivals_admitted_in_the_compiled_loop_are_the_event_loops(spec, engine, pass_log,
                                                                   interval, tier, per_call):
    # one worker of one rank, open loop: the compiled loop admits the
    # arrivals itself (pass_loop `_arrive`), returning to the event loop every
    # `per_call` arrivals; the same run with every arrival an event-loop event
    # (`Replay._on_open_arrival`) gives the same records, counters, telemetry
    # and pass log, rejections (prompts reaching max_model_len) included
    if tier is not None:
        engine = dict(engine, kv_offloading=tier)
    config, workload = build(spec, engine, output={"pass_log": pass_log,
                                                  "telemetry_interval_ms": interval})
    with patch.object(worker, "ARRIVALS_PER_CALL", per_call):
        a = simulate(config, workload)
    with patch.object(Replay, "_arrivals_in_loop", lambda self: False):
        b = simulate(config, workload)
    same_results(a, b)
    if pass_log:
        assert list(a.pass_log) == list(b.pass_log)


# (up to 2 ranks a worker: the pass loop compiled for 3-4 ranks is another ~30 s cold)
CLUSTERS = st.tuples(st.integers(1, 3), st.integers(1, 2)).filter(lambda c: c != (1, 1))
ROUTERS = st.sampled_from(["round_robin", "least_loaded", "least_prefill", "kv_router", LAGGED_KV_ROUTER, "weighted", "session_affinity"])


@settings(max_examples=120, deadline=None)
@given(requests, engines, CLUSTERS, ROUTERS, st.booleans(), st.sampled_from([None, 7.0]),
       st.sampled_from([1, 2, 4096]), st.lists(st.integers(-1, 2), max_size=30))
def test_arrivals_routed_in_the_cluster_loop_are_the_event_loops(spec, engine, cluster, router,
                                                                 pass_log, interval, per_call,
                                                                 pins):
    # several workers or ranks, open loop: the workers' compiled loop routes
    # and admits the arrivals itself (engine/aggregated_loop.py), returning to
    # the event loop every `per_call` arrivals; the same run with every
    # arrival an event-loop event routed by the replay's router gives the
    # same records (placements included), counters, telemetry and pass log,
    # with requests pinned to a rank and rejections (prompts reaching
    # max_model_len) among them
    from servesim.engine.aggregated_loop import AggregatedLoop

    workers, dp = cluster
    config, workload = build(spec, engine, output={"pass_log": pass_log,
                                                  "telemetry_interval_ms": interval},
                             cluster={"workers": workers, "data_parallel_size": dp,
                                      "router": router})
    pinned = np.array([(p if p < dp else -1) for p in pins][:len(workload)]
                      + [-1] * max(0, len(workload) - len(pins)), dtype=np.int64)
    workload = attrs.evolve(workload, dp_rank=pinned)
    taken = AggregatedLoop.take_arrivals
    calls = []

    def spy(cluster_loop, seq):
        calls.append(seq)
        return taken(cluster_loop, seq)

    with patch.object(worker, "ARRIVALS_PER_CALL", per_call), \
            patch.object(AggregatedLoop, "take_arrivals", spy):
        a = simulate(config, workload)
    assert len(calls) == 1
    with patch.object(Replay, "_cluster_takes_arrivals", lambda self: False):
        b = simulate(config, workload)
    same_results(a, b)
    if pass_log:
        assert list(a.pass_log) == list(b.pass_log)


def test_which_compiled_loop_takes_the_arrivals():
    # open loop: one worker of one rank takes them in its own pass loop
    # (nothing to route); several workers or ranks in the cluster loop, which
    # routes them; a closed loop (a finish releases the next) leaves them to
    # the event loop. The 7th prompt reaches max_model_len: rejected either
    # way, and counted as routed to its worker. With a frontend whose
    # tokenize delay reorders them (r0's 200 tokens: 20 ms; the others' 40:
    # 4 ms, so r1-r3 reach the engine before r0) the compiled loops still
    # take them, in engine-time order
    from servesim.engine.aggregated_loop import AggregatedLoop
    from helpers import make_config, make_workload

    rows = [{"id": f"r{i}", "t": 5 * i, "P": 40, "O": 4, "hash_ids": [i, 100 + i, 200 + i]}
            for i in range(6)] + [{"id": "r6", "t": 30, "P": 300, "O": 4}]
    workload = make_workload(rows)
    worker_taken = EngineCore.take_arrivals
    cluster_taken = AggregatedLoop.take_arrivals
    calls = []

    def worker_spy(core, arrival_ms, arrival_req, *rest):
        calls.append(("worker", arrival_req.tolist()))
        return worker_taken(core, arrival_ms, arrival_req, *rest)

    def cluster_spy(cluster, seq):
        calls.append(("cluster", cluster.arrival_req.tolist()))
        return cluster_taken(cluster, seq)

    reordered = make_workload([{"id": "r0", "t": 0, "P": 200, "O": 4}] + rows[1:])
    tokenize = {"request_ms": 0, "tokenize_us_per_token": 100}
    with patch.object(EngineCore, "take_arrivals", worker_spy), \
            patch.object(AggregatedLoop, "take_arrivals", cluster_spy):
        for cluster, concurrency, taker in [(None, None, "worker"),
                                            ({"workers": 2}, None, "cluster"),
                                            ({"data_parallel_size": 2}, None, "cluster"),
                                            (None, 2, None), ({"workers": 2}, 2, None)]:
            for w, frontend, order in [(workload, None, [0, 1, 2, 3, 4, 5, 6]),
                                       (reordered, tokenize, [1, 2, 3, 0, 4, 5, 6])]:
                calls.clear()
                config = make_config(cluster=cluster, block_size=16, num_gpu_blocks=64,
                                     max_model_len=256, frontend=frontend)
                result = simulate(config, attrs.evolve(w, concurrency=concurrency))
                assert calls == ([(taker, order)] if taker else []), cluster
                assert result.records.status.tolist() == [STATUS_FINISHED] * 6 + [STATUS_REJECTED]
                assert sum(w.requests for w in result.stats.workers) == 7


def test_progress_reports_the_compiled_loops_clock_in_order():
    # the progress callback sees simulated time as far as the worker's loop
    # has run (arrivals admitted inside it move no event-loop clock), never
    # going back, ending at the run's end with every request done
    from servesim.replay import driver
    from helpers import make_config, make_workload

    rows = [{"id": f"r{i}", "t": 3 * i, "P": 40, "O": 6, "hash_ids": [i, 100 + i, 200 + i]}
            for i in range(40)]
    calls = []
    with patch.object(driver, "_PROGRESS_EVERY_S", 0.0), patch.object(worker, "ARRIVALS_PER_CALL", 3):
        replay = Replay(make_config(block_size=16, num_gpu_blocks=64), make_workload(rows),
                        lambda now, done: calls.append((now, done)))
        replay.run()
    times = [now for now, _ in calls]
    assert len(calls) > 10 and times == sorted(times)
    assert times[-1] == replay.loop.now and calls[-1][1] == 40
    assert max(t for t in times[:-1]) > 3 * 39  # the arrivals' loop ran past the last arrival


def test_the_loops_bundle_holds_the_workers_own_arrays():
    # the compiled loop reads a worker's arrays through one `WorkerArrays`
    # (engine/worker_state.py), built positionally in `FIELDS` order, and
    # the scheduler's kernels a rank's through its `SchedulerArrays`
    # (scheduler/scheduler_arrays.py): a field from each of their groups,
    # first to last, is that worker's or rank's own array (two attention-DP
    # ranks: the per-rank tuples hold each rank's)
    from numba import njit

    from helpers import make_config, make_workload

    @njit
    def fields(w):  # (the proxy has no Python attributes: read them compiled)
        return (w.R, w.stats, w.launch, w.num_gpu_blocks, w.outs, w.ws, w.queue, w.pulls)

    @njit
    def rank_fields(w, r):
        s = w.sched_t[r]
        return (s.R, s.idents, s.blocks, s.pscal, s.cfg, s.S, s.wq, s.held, s.client_ms,
                s.last_client, s.detokenize_ms)

    rows = [{"id": f"r{i}", "t": 3 * i, "P": 40, "O": 6, "hash_ids": [i, 100 + i, 200 + i]}
            for i in range(8)]
    replay = Replay(make_config(block_size=16, num_gpu_blocks=64,
                                cluster={"data_parallel_size": 2}), make_workload(rows))
    replay.run()
    compiled = replay.workers[0].compiled
    w, kv, tier = compiled.arguments()
    s = compiled.schedulers
    R, stats, launch, num_gpu_blocks, outs, ws, queue, pulls = fields(w)
    assert kv is None and tier is None
    assert np.shares_memory(R, s[0].table.R)
    assert np.shares_memory(stats, compiled.stats) and np.shares_memory(launch, compiled.launch)
    assert num_gpu_blocks == s[0].pool.num_gpu_blocks
    for mine, its in ((outs, compiled.outs), (ws, compiled.ws), (queue, compiled.queue),
                      (pulls, compiled.pulls)):
        assert np.shares_memory(mine, its)
    for r, rank in enumerate(s):
        (R, idents, blocks, pscal, cfg, S, wq, held, client_ms, last_client,
         detokenize_ms) = rank_fields(w, r)
        own = (rank.table.R, rank.table.idents, rank.pool.blocks, rank.pool.scalars, rank.cfg,
               rank.S, rank.wq, rank.held, rank.tokens.client_ms, rank.tokens.last_client)
        mine = (R, idents, blocks, pscal, cfg, S, wq, held, client_ms, last_client)
        assert all(np.shares_memory(a, b) for a, b in zip(mine, own))
        assert not np.shares_memory(blocks, s[1 - r].pool.blocks)
        assert detokenize_ms == rank.tokens.detokenize_ms


def test_a_ranks_kv_bundle_holds_its_tier_and_is_made_again_when_the_tier_grows():
    # a rank with a CPU tier hands the kernels its `kv` state as one
    # `KVArrays` (scheduler/scheduler_arrays.py): the waiting-for-KV list,
    # the call's outputs and the tier's own arrays; when the tier's job
    # arrays are replaced by larger ones (`TierArrays.ensure_room`), the
    # next call's bundle holds the new ones
    from numba import njit

    from helpers import make_config, make_workload

    @njit
    def fields(kv):
        return kv.wfk, kv.KO, kv.KC, kv.tier, kv.jobs, kv.job_times, kv.lanes, kv.KS

    rows = [{"id": f"r{i}", "t": 3 * i, "P": 40, "O": 6, "hash_ids": [i, 100 + i, 200 + i]}
            for i in range(8)]
    tier = {"num_cpu_blocks": 24, "bytes_per_token": 62500, "d2h_gbps": 0.5, "h2d_gbps": 0.5,
            "connector": "offloading"}
    replay = Replay(make_config(block_size=16, num_gpu_blocks=64, kv_offloading=tier),
                    make_workload(rows))
    replay.run()
    scheduler = replay.workers[0].compiled.schedulers[0]
    t = scheduler.connector.tier

    def own():
        return (*scheduler.kv_state, t.tier, t.jobs, t.job_times, t.lanes, t.KS)

    kv = scheduler._kv()
    assert scheduler._kv() is kv  # (nothing grew: the same bundle)
    assert all(np.shares_memory(a, b) for a, b in zip(fields(kv), own()))
    jobs = t.jobs
    t.KS[0]["num_jobs"] = len(jobs)  # the job arrays are full: the next call grows them
    grown = scheduler._kv()
    assert t.jobs is not jobs and len(t.jobs) > len(jobs)
    assert all(np.shares_memory(a, b) for a, b in zip(fields(grown), own()))


@pytest.mark.parametrize("cluster", [
    None, {"workers": 2, "router": "kv_router"},
    {"mode": "disaggregated", "prefill_workers": 1, "decode_workers": 2,
     "kv_transfer": {"bytes_per_token": 62500, "bandwidth_gbps": 1.0}}],
    ids=["one worker", "two workers", "disaggregated"])
def test_a_pass_log_buffer_that_fills_up_grows_and_the_loop_logs_on(cluster):
    # a pass loop whose pass log buffer may not hold the next pass returns
    # LOG_FULL; the core grows the buffer (`PassLogBuffer.grow`) and the
    # loop goes on writing into the new arrays (`PassLogBuffer.arrays`, its
    # bundle made again): from a buffer of one line, the log and the results
    # are those of a buffer large enough from the start (the one worker, the
    # loop over aggregated workers, the loop over disaggregated workers)
    from helpers import make_config, make_workload

    rows = [{"id": f"r{i}", "t": 25 * i, "P": 40 + 4 * (i % 3), "O": 6,
             "hash_ids": [i % 2, 100 + i, 200 + i]} for i in range(12)]
    config = make_config(block_size=16, num_gpu_blocks=64, cluster=cluster)
    workload = make_workload(rows)
    grow = PassLogBuffer.grow
    grows = []

    def counted(buffer, ranks, width):  # a loop still on the old arrays would ask forever
        grows.append(len(buffer))
        assert len(grows) < 20, "the loop kept asking for room after the buffer grew"
        grow(buffer, ranks, width)

    tiny = classmethod(lambda cls, input_length, output_length: cls(rows=1, entries=1,
                                                                      finished=1))
    with patch.object(PassLogBuffer, "grow", counted):
        roomy = simulate(config, workload)
        grows.clear()
        with patch.object(PassLogBuffer, "for_workload", tiny):
            grown = simulate(config, workload)
    assert len(grows) > 1 and len(grown.pass_log.buffer.head) > 1  # it grew, more than once
    assert len(grown.pass_log) == len(roomy.pass_log) > 20
    assert list(grown.pass_log) == list(roomy.pass_log)
    same_results(roomy, grown)


def kernel_modules_reached_from(entries):
    """The modules of every kernel the given kernels may call: the Numba
    dispatchers their code names, directly or as a module's attribute
    (`bp.free`), followed transitively."""
    import types

    from numba.core.registry import CPUDispatcher

    def code_names(code):
        names = set(code.co_names)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                names |= code_names(const)
        return names

    seen, todo = set(), list(entries)
    while todo:
        kernel = todo.pop()
        if kernel in seen:
            continue
        seen.add(kernel)
        names = code_names(kernel.py_func.__code__)
        for name in names:
            value = kernel.py_func.__globals__.get(name)
            if isinstance(value, types.ModuleType):
                todo.extend(v for a in names if isinstance(v := getattr(value, a, None), CPUDispatcher))
            elif isinstance(value, CPUDispatcher):
                todo.append(value)
    return sorted({sys.modules[k.py_func.__module__] for k in seen}, key=lambda m: m.__name__)


def test_kernels_compiled_without_reference_counts_hand_back_no_arrays(tmp_path):
    # The pass loop and the loops over workers that call it, `schedule`,
    # `update_from_output` and `_allocate` run without Numba's reference
    # counts, and so does every kernel they call that does not set `_nrt`
    # itself (servesim/jit.py, "Reference counts"). Such a kernel
    # may hand back no array: a caller that counts would count the returned
    # array down once more than it was counted up, and free it under its
    # owner. Which kernel returns what is seen on the kernels as plain Python
    # (what a cached compiled run leaves in its dispatchers depends on the
    # cache): runs with a CPU tier (async), disaggregated DP ranks,
    # speculative decoding and two aggregated workers routed in the compiled
    # loop, in the debug mode (whose holders list is an array handed back, so
    # the watch is seen to work), record every kernel of the scheduler's, KV
    # module the entry points reach (`kernel_modules_reached_from`) that returns
    # an array or a bundle (other functions of those modules are Python, which
    # counts for itself); one inlined into its caller counts as the caller does
    import json
    import subprocess
    import sys

    from numba.core.registry import CPUDispatcher

    from servesim.engine import aggregated_loop, disaggregated_loop
    from servesim.scheduler import kv_cache_manager, scheduler
    from test_plain_python import CPU_TIER_ASYNC, DISAGGREGATED_DP, ROOT, plain_env, workload

    entries = (scheduler.schedule, scheduler.update_from_output, kv_cache_manager._allocate,
               run_passes, disaggregated_loop.run_workers, aggregated_loop.run_cluster)
    for kernel in entries:
        assert kernel.targetoptions["_nrt"] is False, kernel
    modules = kernel_modules_reached_from(entries)
    assert {"servesim.scheduler.scheduler", "servesim.kvcache.block_pool",
            "servesim.kvcache.cpu_tier", "servesim.engine.routing"} <= {m.__name__ for m in modules}
    kernels = {(m.__name__, name): k for m in modules for name, k in vars(m).items()
               if isinstance(k, CPUDispatcher) and k.py_func.__module__ == m.__name__}
    counted = {key for key, k in kernels.items() if k.targetoptions.get("_nrt") is True
               or k.targetoptions.get("inline") == "always"}  # (inlined: counts as its caller)
    speculative_config = CPU_TIER_ASYNC.split("engine:")[0] + """\
engine:
  block_size: 16
  num_gpu_blocks: 48
  async_scheduling: true
  speculative: {method: mtp, num_speculative_tokens: 2, acceptance_rates: [0.7, 0.5]}
  timing: {type: linear, base_ms: 5.0, per_token_ms: 0.1}
"""
    paths = []
    two_workers = workload(9) + """\
engine: {block_size: 16, num_gpu_blocks: 48, timing: {type: fixed, prefill_ms: 10.0, decode_ms: 5.0}}
cluster: {workers: 2, router: kv_router}
"""
    for k, text in enumerate([CPU_TIER_ASYNC, DISAGGREGATED_DP, speculative_config,
                              two_workers]):
        paths.append(tmp_path / f"config{k}.yaml")
        paths[-1].write_text(text)
    script = """
import importlib, json, sys
import numpy as np
from servesim.replay.api import run
names = %r
files = {importlib.import_module(n).__file__: n for n in names}
seen = set()

from servesim.bundles import PlainBundle

def holds_an_array(value):  # (a bundle is a pointer counted as an array is)
    return isinstance(value, (np.ndarray, PlainBundle)) or (
        isinstance(value, tuple) and any(holds_an_array(v) for v in value))

def watch(frame, event, value):
    if event == "return" and frame.f_code.co_filename in files and holds_an_array(value):
        seen.add((files[frame.f_code.co_filename], frame.f_code.co_qualname))

sys.setprofile(watch)
for path in sys.argv[1:]:
    run(path)
sys.setprofile(None)
print(json.dumps(sorted(seen)))
""" % [m.__name__ for m in modules]
    env = dict(plain_env(), SERVESIM_CHECK="1")
    proc = subprocess.run([sys.executable, "-c", script, *map(str, paths)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    returned = {tuple(x) for x in json.loads(proc.stdout.splitlines()[-1])} & kernels.keys()
    assert ("servesim.scheduler.scheduler", "_check_holders") in returned
    assert returned <= counted, returned - counted


def test_compiled_runs_free_every_allocation_they_make(tmp_path):
    # Numba's call from Python takes a reference on each bundle it hands a
    # kernel; the entry points compiled without reference counts never give
    # it back, so `Entry` does (servesim/jit.py). Runs in one process of a
    # single worker, two aggregated workers routed in the compiled loop, a
    # CPU tier and disaggregated DP ranks, each run again three times: the
    # runtime's allocation and free counts (NUMBA_NRT_STATS) come out level
    # after each repeat, where every bundle a run made, and the arrays it
    # holds, outlived it before (~70 allocations a tiny run)
    import json
    import subprocess
    import sys

    from test_plain_python import CPU_TIER_ASYNC, DISAGGREGATED_DP, ROOT, workload

    single = workload(6) + """\
engine: {block_size: 16, num_gpu_blocks: 48, timing: {type: fixed, prefill_ms: 10.0, decode_ms: 5.0}}
"""
    two_workers = single + "cluster: {workers: 2, router: kv_router}\n"
    paths = []
    for k, text in enumerate([single, two_workers, CPU_TIER_ASYNC, DISAGGREGATED_DP]):
        paths.append(tmp_path / f"config{k}.yaml")
        paths[-1].write_text(text)
    script = """
import gc, json, sys
from numba.core.runtime import rtsys
from servesim.replay.api import run
out = []
for path in sys.argv[1:]:
    run(path)  # (compiles or loads what it runs, and warms the caches up)
    gc.collect()
    before = rtsys.get_allocation_stats()
    for _ in range(3):
        run(path)
        gc.collect()
    after = rtsys.get_allocation_stats()
    out.append([after.mi_alloc - before.mi_alloc, after.mi_free - before.mi_free])
print(json.dumps(out))
"""
    env = dict(os.environ, NUMBA_NRT_STATS="1")
    env.pop("NUMBA_DISABLE_JIT", None)
    proc = subprocess.run([sys.executable, "-c", script, *map(str, paths)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = json.loads(proc.stdout.splitlines()[-1])
    assert all(made > 0 for made, _ in counts), counts  # (the counts are on)
    assert [made for made, _ in counts] == [freed for _, freed in counts], counts


def test_a_disaggregated_open_loop_stays_in_the_loop_over_workers():
    # An open loop of 1 prefill + 2 decode workers: the arrivals (routed to
    # the prefill pool), the handoffs (routed to the decode pool), a decode
    # decision's pulls and the finishes are all taken by the compiled loop
    # over the workers (engine/disaggregated_loop.py `run_workers`): no core reports
    # a finish or a pull, and the event loop runs only the loop's own events.
    # r3 asks for its first token only (done on the prefill worker) and r7's
    # prompt fits the prefill pool but not, with its first token, the decode
    # pool (rejected at arrival). The results are those of the replay
    # handling each arrival, handoff and finish itself (as a closed loop must)
    from servesim.replay.disaggregated import DisaggregatedReplay
    from helpers import make_config, make_workload

    rows = [{"id": f"r{i}", "t": 4 * i, "P": 48 + 8 * (i % 5), "O": 3 + i % 7,
             "hash_ids": [i % 3] + [100 * i + j for j in range(1, 6)]} for i in range(30)]
    rows[3]["O"] = 1
    rows[7].update(P=256, hash_ids=list(range(500, 516)))
    config = make_config(cluster={"mode": "disaggregated", "prefill_workers": 1,
                                  "decode_workers": 2, "router": "kv_router",
                                  "decode": {"num_gpu_blocks": 16},
                                  "kv_transfer": {"bytes_per_token": 131072,
                                                  "bandwidth_gbps": 50}},
                         output={"telemetry_interval_ms": 7.0}, block_size=16,
                         num_gpu_blocks=64, max_model_len=512)
    reported = []
    report = EngineCore.report
    arrivals = DisaggregatedReplay._on_arrival

    def spy(core, state):
        c = core.compiled
        reported.append((core.pool, int(c.state["num_finished"]), int(c.state["num_pulls"])))
        return report(core, state)

    def arrival_spy(replay, i):
        reported.append(("arrival", i, 0))
        return arrivals(replay, i)

    with patch.object(EngineCore, "report", spy), \
            patch.object(DisaggregatedReplay, "_on_arrival", arrival_spy):
        in_loop = simulate(config, make_workload(rows))
    assert reported == []
    status = in_loop.records.status.tolist()
    assert status == [STATUS_FINISHED] * 7 + [STATUS_REJECTED] + [STATUS_FINISHED] * 22
    assert (in_loop.records.transferred_tokens > 0).sum() > 20  # pulled, not held already

    with patch.object(EngineCore, "report", spy), \
            patch.object(DisaggregatedReplay, "_on_arrival", arrival_spy), \
            patch.object(DisaggregatedReplay, "_loop_takes_arrivals", lambda self: False):
        by_replay = simulate(config, make_workload(rows))
    assert sum(1 for r in reported if r[0] == "arrival") == 30
    assert sum(nfin for pool, nfin, _ in reported if pool == "prefill") == 29
    same_results(in_loop, by_replay)
