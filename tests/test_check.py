"""The debug mode's invariant check (servesim/scheduler/check.py,
`SERVESIM_CHECK=1`): it stays silent on real runs, changes no output, and
catches state corrupted between passes — inside the compiled runs of passes
(engine/pass_loop.py), for the CPU tier and disaggregated serving, and across
the schedulers of several workers or ranks — naming the pass, the request or
block and the invariant."""

import traceback

import numpy as np
import pytest

from servesim.engine import kv_handoff, worker
from servesim.errors import InvariantError
from servesim.kvcache import block_pool as bp
from servesim.replay.driver import Replay
from servesim.scheduler import check, request_queue
from servesim.scheduler.kv_cache_manager import _free
from servesim.scheduler.request import RequestStatus
from tests.helpers import LINEAR_10MS, after_every_event, make_config, make_workload


@pytest.fixture
def checking(monkeypatch):
    monkeypatch.setenv("SERVESIM_CHECK", "1")


def rows(n=6, prompt=40, output=6, gap=3.0):
    # two prefix families: hits, shared blocks, ref counts above 1
    return [{"id": f"r{i}", "t": gap * i, "P": prompt, "O": output,
             "hash_ids": [100 * (i % 2), 100 * (i % 2) + 1, 1000 + i]} for i in range(n)]


def config(pass_log=True, **engine):
    engine.setdefault("block_size", 16)
    engine.setdefault("num_gpu_blocks", 64)
    engine.setdefault("max_num_batched_tokens", 64)
    return make_config(output={"pass_log": pass_log}, **engine)


def replay(cfg, workload):
    return Replay(cfg, workload)


def corrupt_after_events(monkeypatch, corrupt):
    """Every replay made from now on runs `corrupt(core)` after each event
    of a worker's compiled pass loop (tests/helpers.py `after_every_event`)."""
    init = Replay.__init__

    def with_the_hook(self, *args, **kwargs):
        init(self, *args, **kwargs)
        after_every_event(self, corrupt)

    monkeypatch.setattr(Replay, "__init__", with_the_hook)


def corrupt_at_pass(monkeypatch, at, corrupt):
    """Run `corrupt(core)` when the outputs of rank 0's pass `at` have been
    processed (`ws[0].ended_pass`), before the worker's next event."""
    seen = {}

    def at_pass(core):
        ended = int(core.compiled.state["ended_pass"])
        if ended == at and seen.get(core.index) != at:
            corrupt(core)
        seen[core.index] = ended

    corrupt_after_events(monkeypatch, at_pass)


def held_block(scheduler):
    """A block the first running request holds."""
    t = scheduler.table
    i = int(scheduler.running[0])
    assert t.R["num_held_blocks"][i] > 0
    return int(t.tables[t.R["block_offset"][i]])


def test_check_is_off_without_the_variable(monkeypatch):
    monkeypatch.delenv("SERVESIM_CHECK", raising=False)
    r = replay(config(), make_workload(rows()))
    assert r.workers[0].ranks[0].scheduler.cfg[0]["invariant_check"] == 0


@pytest.mark.parametrize("engine", [
    {},
    {"async_scheduling": True},
    {"num_gpu_blocks": 9, "max_num_batched_tokens": 32},  # preemptions
    {"scheduling_policy": "priority", "num_gpu_blocks": 9},
])
@pytest.mark.parametrize("pass_log", [True, False])
def test_real_runs_pass_the_check_and_keep_their_outputs(monkeypatch, engine, pass_log):
    workload = make_workload(rows(8))
    monkeypatch.delenv("SERVESIM_CHECK", raising=False)
    plain = replay(config(pass_log, **engine), workload).run()
    monkeypatch.setenv("SERVESIM_CHECK", "1")
    checked_replay = replay(config(pass_log, **engine), workload)
    assert checked_replay.workers[0].ranks[0].scheduler.cfg[0]["invariant_check"] == 2
    checked = checked_replay.run()
    assert checked.pass_log == plain.pass_log
    for name in ("status", "output_tokens", "num_preemptions", "token_client_ms"):
        assert np.array_equal(getattr(checked.records, name), getattr(plain.records, name))


def test_a_wrong_ref_count_is_caught_at_the_next_pass(checking, monkeypatch):
    found = {}

    def corrupt(core):
        scheduler = core.ranks[0].scheduler
        found["block"] = b = held_block(scheduler)
        scheduler.pool.blocks[bp.REF, b] += 1

    corrupt_at_pass(monkeypatch, 2, corrupt)
    with pytest.raises(InvariantError) as info:
        replay(config(), make_workload(rows())).run()
    message = str(info.value)
    assert message.startswith("invariant violated after schedule() of pass 3: a block's ref "
                              "count equals the requests whose block table holds it")
    assert f"block {found['block']}" in message


def test_a_request_in_two_queues_is_named(checking, monkeypatch):
    found = {}

    def corrupt(core):
        s = core.ranks[0].scheduler
        i = int(s.running[0])
        found["id"] = s.table.request_ids[i]
        request_queue.wq_add(s.table.R, s.S, s.wq, s.priority, i)

    corrupt_at_pass(monkeypatch, 1, corrupt)
    with pytest.raises(InvariantError) as info:  # (one running: admission does not run)
        replay(config(max_num_seqs=1), make_workload(rows())).run()
    message = str(info.value)
    assert "of pass 2: a request is in exactly one of running / waiting" in message
    assert f"request '{found['id']}'" in message


def test_a_free_count_off_by_one_breaks_conservation(checking, monkeypatch):
    corrupt_at_pass(monkeypatch, 0,
                    lambda core: core.ranks[0].pool.scalars.__setitem__(bp.NUM_FREE, 0))
    with pytest.raises(InvariantError, match="the pool's free count equals the free queue's"):
        replay(config(), make_workload(rows())).run()


def drop_first_running(core):
    """Free the first running request's blocks and drop it from `running`
    (ref counts still match; it is still RUNNING)."""
    s = core.ranks[0].scheduler
    t = s.table
    i = int(s.running[0])
    _free(s.arrays, i)
    n = s.S[0]["num_running"]
    s.running[:n - 1] = s.running[1:n].copy()
    s.S[0]["num_running"] = n - 1
    return t.request_ids[i]


def test_a_lost_request_is_caught(checking, monkeypatch):
    """The whole-table check of the only scheduler finds a lost request."""
    found = {}
    corrupt_at_pass(monkeypatch, 1, lambda core: found.setdefault("id", drop_first_running(core)))
    with pytest.raises(InvariantError) as info:
        replay(config(), make_workload(rows())).run()
    assert "a RUNNING request is in running" in str(info.value)
    assert f"request '{found['id']}'" in str(info.value)


@pytest.mark.parametrize("cluster", [{"workers": 2}, {"data_parallel_size": 2}])
def test_a_request_lost_across_schedulers_is_caught(checking, monkeypatch, cluster):
    """Several schedulers on one table check themselves alone; the replay's
    check across them (check.check_table) finds the lost request."""
    found = {}

    def corrupt(core):
        if core.index == 0 and "id" not in found:
            found["id"] = drop_first_running(core)

    corrupt_at_pass(monkeypatch, 1, corrupt)
    r = replay(make_config(cluster=cluster, block_size=16, num_gpu_blocks=64), make_workload(rows()))
    checks = [rank.scheduler.cfg[0]["invariant_check"] for core in r.workers for rank in core.ranks]
    assert checks == [1, 1]
    with pytest.raises(InvariantError) as info:
        r.run()
    assert "a RUNNING request is in running, a PREEMPTED one in waiting" in str(info.value)
    assert f"request '{found['id']}'" in str(info.value)


def across_reference(table):
    """The check across a table's schedulers as NumPy says it (the Python
    `check_table` the compiled one replaced): the first violation's
    `(code, request, found, expected)`, or None."""
    R = table.R
    n = len(R)
    members = []
    for s in table.checked_schedulers:
        head = 0 if s.priority else s.S[0]["waiting_head"]
        waiting = s.wq[(head + np.arange(s.S[0]["num_waiting"])) % len(s.wq)]
        wfk = s.kv_state[0][:s.S[0]["num_waiting_for_kv"]] if s.kv_state is not None else []
        others = np.concatenate([wfk, s.held[:s.S[0]["num_delayed_free_requests"]]]).astype(int)
        members.append((s.running[:s.S[0]["num_running"]], waiting, others))
    count = np.bincount(np.concatenate([q for m in members for q in m]), minlength=n)
    running, waiting, holding = (np.zeros(n, dtype=bool) for _ in range(3))
    for kind, flags in enumerate((running, waiting, holding)):
        flags[np.concatenate([m[kind] for m in members])] = True
    status, held = R["status"], R["num_held_blocks"]
    for code, bad, found, expected in (
            (check.DUPLICATE, count > 1, count, 1),
            (check.LOST, ((status == RequestStatus.RUNNING) & ~running)
             | ((status == RequestStatus.PREEMPTED) & ~waiting & ~holding), status, -1),
            (check.HOLDS_BLOCKS, (held != 0) & ~running & ~holding, held, 0)):
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            return code, i, int(found[i]), expected
    return None


def put(s, queue, *requests):
    """Append `requests` to rank scheduler `s`'s `queue` ("running",
    "waiting" from its head, "held" for a decode worker, "waiting_for_kv"),
    counts kept in its state."""
    S = s.S[0]
    for i in requests:
        if queue == "running":
            s.running[S["num_running"]] = i
            S["num_running"] += 1
        elif queue == "waiting":
            s.wq[(S["waiting_head"] + S["num_waiting"]) % len(s.wq)] = i
            S["num_waiting"] += 1
        elif queue == "held":
            s.held[S["num_delayed_free_requests"]] = i
            S["num_delayed_free_requests"] += 1
        else:
            s.kv_state[0][S["num_waiting_for_kv"]] = i
            S["num_waiting_for_kv"] += 1


RUNNING, WAITING, PREEMPTED, FINISHED = (int(RequestStatus.RUNNING), int(RequestStatus.WAITING),
                                         int(RequestStatus.PREEMPTED),
                                         int(RequestStatus.FINISHED))


@pytest.mark.parametrize("case", [
    # (each rank's queues, then request: (status, num_held_blocks)), None: the rule holds
    ([{"running": [0], "waiting": [2]}, {"running": [1]}], {0: (RUNNING, 2), 1: (RUNNING, 1)},
     None),
    ([{"running": [0]}, {"waiting": [0]}], {0: (RUNNING, 2)}, check.DUPLICATE),
    ([{"running": [1, 0]}, {"running": [0]}], {0: (RUNNING, 2), 1: (RUNNING, 1)},
     check.DUPLICATE),
    ([{"held": [3]}, {"waiting_for_kv": [3]}], {3: (FINISHED, 4)}, check.DUPLICATE),
    ([{"running": [0]}, {}], {0: (RUNNING, 1), 4: (RUNNING, 1)}, check.LOST),
    ([{}, {"waiting": [1]}], {1: (PREEMPTED, 0), 2: (PREEMPTED, 0)}, check.LOST),
    ([{}, {"waiting_for_kv": [2]}], {2: (PREEMPTED, 3)}, None),  # its load in flight
    ([{"held": [5]}, {}], {5: (FINISHED, 2)}, None),  # held for a decode worker
    ([{}, {"waiting": [3]}], {3: (WAITING, 2)}, check.HOLDS_BLOCKS),
    ([{}, {}], {1: (FINISHED, 1)}, check.HOLDS_BLOCKS),
    # the first rule broken over all requests, before the next rule
    ([{"running": [0]}, {"waiting": [5, 5]}], {0: (WAITING, 0), 3: (RUNNING, 0)},
     check.DUPLICATE),
    ([{"waiting": [4]}, {}], {1: (WAITING, 3), 4: (RUNNING, 0)}, check.LOST),
], ids=["holds", "running-and-waiting", "running-twice", "held-and-loading", "lost-running",
        "lost-preempted", "preempted-loading", "held-finished", "waiting-holds-blocks",
        "finished-holds-blocks", "duplicate-first", "lost-before-holds"])
@pytest.mark.parametrize("wrapped", [False, True])  # the waiting ring across its end
def test_the_check_across_schedulers_finds_what_the_rules_say(checking, case, wrapped):
    """`check.check_table` (compiled) over a table shared by two ranks
    with queues made by hand: silent when the rules hold, else the first
    request breaking the first rule (duplicates, then lost requests, then
    blocks held outside running), as the NumPy statement of the rules
    (`across_reference`) finds it; the second rank gets `kv` (a remote
    source, `waiting_for_kv`)."""
    from servesim.scheduler.scheduler_arrays import KV_SOURCE_REMOTE

    queues, requests, code = case
    r = replay(make_config(cluster={"workers": 2}, block_size=16, num_gpu_blocks=64),
               make_workload(rows()))
    ranks = [core.ranks[0].scheduler for core in r.workers]
    table = ranks[0].table
    assert table.checked_schedulers == ranks
    check.check_table(table, check.AFTER_OUTPUT, 0)  # (the rank's queues made again after:)
    ranks[1].attach_kv_source(KV_SOURCE_REMOTE)
    if wrapped:
        for s in ranks:
            s.S[0]["waiting_head"] = len(s.wq) - 1
    for s, queue in zip(ranks, queues):
        for name, members in queue.items():
            put(s, name, *members)
    for i, (status, held) in requests.items():
        table.R[i]["status"] = status
        table.R[i]["num_held_blocks"] = held
    expected = across_reference(table)
    assert (expected and expected[0]) == code
    if code is None:
        check.check_table(table, check.AFTER_OUTPUT, 7)
        return
    with pytest.raises(InvariantError) as info:
        check.check_table(table, check.AFTER_OUTPUT, 7)
    assert info.value.args == (code, check.AFTER_OUTPUT, 7, expected[1], -1, *expected[2:])


@pytest.mark.parametrize("engine", [{}, {"async_scheduling": True}])
def test_the_compiled_runs_of_passes_check_every_pass(checking, monkeypatch, engine):
    """Passes between arrivals run inside the compiled pass loop
    (engine/pass_loop.py `run_passes`); a block leaked at an arrival while a pass is in
    flight is caught by the check inside that loop."""
    original = Replay._on_arrival
    found = {}

    def on_arrival(self, i):
        s = self.workers[0].ranks[0].scheduler
        if i == 3:
            compiled = self.workers[0].compiled
            assert compiled.state["num_in_flight"]  # a pass in flight: its end runs in the loop
            b = held_block(s)
            found["block"] = b
            s.pool.blocks[bp.REF, b] += 1
        original(self, i)

    monkeypatch.setattr(Replay, "_on_arrival", on_arrival)
    # the arrivals go through the event loop (`_on_arrival`, where the leak
    # is made), not into the compiled loop, which would admit them itself
    monkeypatch.setattr(Replay, "_arrivals_in_loop", lambda self: False)
    with pytest.raises(InvariantError) as info:
        replay(config(pass_log=False, **engine), make_workload(rows(gap=7.0))).run()
    assert "ref count equals the requests" in str(info.value)
    assert f"block {found['block']}" in str(info.value)
    frames = [(f.filename, f.name) for f in traceback.extract_tb(info.value.__cause__.__traceback__)]
    assert (worker.__file__, "run") in frames  # raised inside `run_passes` (`WorkerLoop.run`)


def cpu_tier_case():
    """tests/test_cpu_tier.py's first case: b waits from 40 to 80 ms for a
    load of 4 blocks into G1 blocks it holds (`waiting_for_kv`)."""
    tier = dict(num_cpu_blocks=16, bytes_per_token=62_500, d2h_gbps=1,  # 1 MB a block
                h2d_gbps=0.1, connector="offloading")
    cfg = make_config(num_gpu_blocks=9, kv_offloading=tier)
    wl = make_workload([dict(id="a", t=0, P=64, O=1, hash_ids=[1, 2, 3, 4]),
                        dict(id="c", t=20, P=128, O=1),
                        dict(id="b", t=40, P=80, O=1, hash_ids=[1, 2, 3, 4, 5])])
    return cfg, wl


# -- the compiled scheduler's other holders of blocks (CPU tier, disaggregated) -------


def test_a_load_in_flight_on_the_compiled_scheduler_holds_its_blocks(checking, monkeypatch):
    """The CPU tier on the compiled scheduler: b's load (40 to 80 ms) goes
    into G1 blocks it took at admission, listed in `waiting_for_kv`; the
    check after the decision that queued it counts them as held (a real run
    passes), and a ref count made off on one of them while the load is in
    flight is caught at the next decision."""
    cfg, wl = cpu_tier_case()
    seen = []
    r = after_every_event(replay(cfg, wl),
                          lambda core: seen.append(len(core.ranks[0].scheduler.waiting_for_kv)))
    result = r.run()
    assert result.stats.cpu_tier_loads == 1 and max(seen) == 1
    found = {}

    def corrupting(core):
        s = core.ranks[0].scheduler
        if s.waiting_for_kv and "block" not in found:
            i = s.waiting_for_kv[0]
            t = s.table
            assert t.R["num_held_blocks"][i] > 0
            found["block"] = b = int(t.tables[t.R["block_offset"][i]])
            s.pool.blocks[bp.REF, b] += 1

    with pytest.raises(InvariantError) as info:
        after_every_event(replay(cfg, wl), corrupting).run()
    assert "ref count equals the requests whose block table holds it" in str(info.value)
    assert f"block {found['block']}; found 2, expected 1" in str(info.value)


def disaggregated_case():
    """a (P=64) finishes its prefill at 10 ms and is handed off; the prefill
    worker holds its 4 blocks until the pull lands at 14.5 ms (as in
    tests/test_disaggregated.py), while it decides b's prefill at 10 ms."""
    from servesim.config.config import config_from_dict

    data = {"workload": {"synthetic": {"requests": 1}, "trace_block_size": 16},
            "engine": {"max_num_seqs": 16, "num_gpu_blocks": 64,
                       "timing": dict(LINEAR_10MS)},
            "cluster": {"mode": "disaggregated", "prefill_workers": 1, "decode_workers": 1,
                        "kv_transfer": {"bytes_per_token": 62500, "bandwidth_gbps": 1,
                                        "latency_ms": 0.5}},
            "output": {"pass_log": True}}
    wl = make_workload([dict(id="a", t=0, P=64, O=3), dict(id="b", t=5, P=64, O=3)])
    return config_from_dict(data, source="test"), wl


def test_blocks_held_for_the_decode_side_on_the_compiled_scheduler(checking, monkeypatch):
    """A disaggregated prefill worker on the compiled scheduler lists the
    finished requests whose blocks it holds for the decode side (`held`,
    S_HELD): the check counts them (a real run passes), and a ref count off
    on a held block is caught at the worker's next decision."""
    from servesim.replay.api import make_replay

    cfg, wl = disaggregated_case()
    make_replay(cfg, wl).run()
    found = {}

    def corrupting(core):
        s = core.ranks[0].scheduler
        prefill = isinstance(core.ranks[0].transfers, kv_handoff.HandoffSender)
        if prefill and s.S[0]["num_delayed_free_requests"] and "block" not in found:
            i = int(s.held[0])
            t = s.table
            found["block"] = b = int(t.tables[t.R["block_offset"][i]])
            s.pool.blocks[bp.REF, b] += 1

    with pytest.raises(InvariantError) as info:
        after_every_event(make_replay(cfg, wl), corrupting).run()
    assert "after schedule() of pass 1: a block's ref count equals" in str(info.value)
    assert f"block {found['block']}; found 2, expected 1" in str(info.value)


# -- the kept count of pending prefill tokens (least_prefill routing's load) -------


def test_a_pending_prefill_count_off_is_caught_at_the_next_pass(checking, monkeypatch):
    """The rank's kept count of pending prefill tokens (fast.py
    `pending_prefill_tokens`) is checked against a scan of its queues after
    every pass."""
    def corrupt(core):
        core.ranks[0].scheduler.S[0]["pending_prefill_tokens"] += 1

    corrupt_at_pass(monkeypatch, 1, corrupt)
    with pytest.raises(InvariantError) as info:
        replay(config(), make_workload(rows())).run()
    message = str(info.value)
    assert message.startswith("invariant violated after schedule() of pass 2: the rank's "
                              "pending prefill tokens (kept count)")


def test_least_prefill_routing_checks_the_kept_count_at_every_arrival(checking):
    """`least_prefill` reads each candidate rank's kept count; the debug mode
    compares it with the scan at the arrival, before any pass runs."""
    r = replay(make_config(cluster={"workers": 2, "router": "least_prefill"}, block_size=16,
                           num_gpu_blocks=64), make_workload(rows()))
    r.workers[1].ranks[0].scheduler.S[0]["pending_prefill_tokens"] = 7
    with pytest.raises(InvariantError) as info:
        r.run()
    message = str(info.value)
    assert message.startswith("invariant violated at an arrival (routing) after the rank's 0 "
                              "passes: the rank's pending prefill tokens (kept count)")
    assert "found 7, expected 0" in message


@pytest.mark.parametrize("engine", [
    {"num_gpu_blocks": 9, "max_num_batched_tokens": 32},  # preemptions
    {"async_scheduling": True, "num_gpu_blocks": 9, "max_num_batched_tokens": 32},
    {"scheduling_policy": "priority", "num_gpu_blocks": 12},
])
def test_least_prefill_runs_keep_the_count_exact(monkeypatch, engine):
    """Real least_prefill runs over two workers, with preemptions (sync, async:
    tokens of preempted requests still in flight) and the priority queue,
    pass the check at every pass and arrival and route as without it."""
    engine = {"block_size": 16, **engine}
    cfg = make_config(cluster={"workers": 2, "router": "least_prefill"}, **engine)
    workload = make_workload(rows(12, output=30, gap=1.0))
    monkeypatch.delenv("SERVESIM_CHECK", raising=False)
    plain = replay(cfg, workload).run()
    monkeypatch.setenv("SERVESIM_CHECK", "1")
    checked = replay(cfg, workload).run()
    assert np.array_equal(checked.records.worker, plain.records.worker)
    assert plain.stats.preemptions > 0 or engine.get("scheduling_policy")
    for name in ("status", "output_tokens", "num_preemptions", "token_client_ms"):
        assert np.array_equal(getattr(checked.records, name), getattr(plain.records, name))
