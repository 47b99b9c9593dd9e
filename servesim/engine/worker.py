"""A worker's Python face for its compiled pass loop (pass_loop.py `run_passes`):
`WorkerLoop` owns the worker's arrays (worker_state.py: the batch queue's two
slots of every rank's output, the pending decision, the event-loop sequence
counter, the ranks' arrays as tuples, one entry per attention-DP rank,
`padded`), builds the bundle the loop takes, calls it, and grows what it
says is full.
"""

import numpy as np

# (compiled in: Numba's cache of this file does not see pricing.py's kernels
# change; edit this line with them. Table layout 4.)
from servesim.jit import Entry
from servesim.scheduler import output
from servesim.engine.worker_state import new_worker_arrays

from servesim.engine.kv_handoff import new_side_state
from servesim.engine.kv_transfers import _next_land
from servesim.engine.pass_log_buffer import log_arguments
from servesim.engine.pass_loop import _wake_at, run_passes
from servesim.engine.worker_state import (DEC_NONE, PASS_DTYPE, new_worker_state)
from servesim.scheduler.scheduler_arrays import KV_SOURCE_CPU
from servesim.jit import records


def padded(entries, least=4) -> tuple:
    """`entries` as a tuple of length `least` doubled until it holds them
    (a power of two by default), the padding repeating the first entry.

    Numba compiles a kernel once per type of its arguments, and a tuple's
    length is part of its type: the ranks' arrays (`WorkerLoop`) go to the
    pass loop padded, so 1 to 4 attention-DP ranks share one compile of it
    and of the loops over workers (a tuple of 2 compiled again for 3 or 4
    ranks: ~30 s of the test suite's compile; benchmarks/RESULTS.md,
    2026-12-07 "the suite"). The loop reads the real count elsewhere
    (`feats.shape[1]`) and never reads the padding."""
    n = least
    while n < len(entries):
        n *= 2
    return tuple(entries) + (entries[0],) * (n - len(entries))


# a worker admitting its own arrivals returns to the event loop after this many
# (progress, Ctrl-C and the debug mode's checks get a turn)
ARRIVALS_PER_CALL = 4096


class WorkerLoop:
    """A worker's state for `run_passes`: the batch queue (two slots of every
    rank's output), the pending decision, the event-loop sequence counter, and
    the ranks' arrays as tuples (one entry per attention-DP rank, `padded`)."""

    def __init__(self, ranks, worker_index, pool_code, async_scheduling, launch_params,
                 stats):
        schedulers = [rank.scheduler for rank in ranks]
        s0 = schedulers[0]
        self.ranks = ranks
        self.schedulers = schedulers
        width = s0._out_width
        d = len(ranks)
        self.outs = np.zeros((2, d, output.NUM_OUT_ROWS, width), dtype=np.int64)
        self.feats = np.zeros((2, d, output.NUM_FEATS), dtype=np.int64)
        self.pidx = np.full((2, d), -1, dtype=np.int64)
        self.queue = records(2, PASS_DTYPE)
        self.ws = new_worker_state(worker_index, pool_code, async_scheduling, s0.stop_on_finish)
        self.state = self.ws[0]  # (a view of the record: the loop's writes show)
        self.xw_t = np.zeros(8, dtype=np.float64)  # transfer wakes pending
        self.xw_s = np.zeros(8, dtype=np.int64)
        n = len(s0.table.request_ids) + 1
        self.finished = np.zeros(n, dtype=np.int64)
        self.taken = np.zeros(n, dtype=np.int64)
        self.pulls = np.zeros(n, dtype=np.int64)
        # disaggregated mode: each rank's sender or receiver arrays and the
        # transfers (`attach_side`); stand-ins of the same types otherwise
        none = np.zeros(1, dtype=np.int64)
        self._side = [(none, new_side_state(), none)] * d
        self._xfer = (np.zeros((1, 4), dtype=np.int64), np.zeros((1, 5), dtype=np.float64),
                      np.zeros(1, dtype=np.float64), none, np.zeros(3, dtype=np.float64))
        self._side_args = self._side_tuple()
        self._args = None  # (made at the first call)
        # run_passes compiled for the arguments' types (jit.Entry): a worker
        # calls it at every outside event with the same arguments (the worker's
        # arrays as one bundle, the `kv` bundles, the horizon and the pass log),
        # whose types stay those of the first call until `_args` is rebuilt
        self._entry = Entry(run_passes)
        self.launch = launch_params
        self.stats = stats
        self.width = width
        table = s0.table
        pricer = ranks[0].pricer
        # arrival_ms, arrival_req, status (`take_arrivals`)
        self._shared = (table.R, np.zeros(0, dtype=np.float64), np.zeros(0, dtype=np.int64),
                        np.zeros(0, dtype=np.int8))
        self._ranks = (padded([s.arrays for s in schedulers]),
                       stats, pricer.model, pricer.params, pricer.kv_capacity_tokens, pricer.table,
                       s0.pool.num_gpu_blocks, launch_params)

    idle = property(lambda self: (self.state["num_in_flight"] == 0
                                  and self.state["decision"] == DEC_NONE))

    def _side_tuple(self):
        return (padded([x[0] for x in self._side]), padded([x[1] for x in self._side]),
                padded([x[2] for x in self._side])) + self._xfer

    def attach_side(self, rank_index, pending, state, log, transfers):
        """Disaggregated mode: rank `rank_index`'s sender or receiver arrays
        (engine/kv_handoff.py) and the handoffs' `Transfers`."""
        self._side[rank_index] = (pending, state, log if log is not None else pending)
        # finishes go out at once: a handoff, or a decode's release
        self.state["stop_on_finish"] = 1
        self._xfer = (transfers.I, transfers.F, transfers.link_free, transfers.link_of,
                      np.array([transfers.bytes_per_token, transfers.bytes_per_ms,
                                transfers.latency_ms], dtype=np.float64))
        self._side_args = self._side_tuple()
        self._args = None

    def transfer_pending(self, seq):
        """A transfer this idle worker's ranks wait for was submitted
        elsewhere: the wake at their next landing (`_wake_at`), with sequence
        `seq + 1`. Returns whether a wake was added."""
        self._grow_wakes()
        self.state["seq"] = seq
        side = self._side_args
        d = len(self.ranks)
        t = _next_land(side[0], side[1], side[4], d)
        return bool(_wake_at(t, self._ranks[0], d, self.ws, self.xw_t, self.xw_s))

    def take_arrivals(self, arrival_ms, arrival_req, status, rejected_code, seq):
        """The loop admits every request itself (`_arrive`), the k-th
        request `arrival_req[k]` at `arrival_ms[k]`, and marks one that can
        never fit `status[i] = rejected_code`; the first one's event has
        sequence `seq`."""
        self.state["arrival_next"] = 0
        self.state["arrival_end"] = len(arrival_ms)
        self.state["arrival_seq"] = seq
        self.state["rejected_code"] = rejected_code
        self.state["num_rejected"] = 0
        self._shared = (self._shared[0], arrival_ms, arrival_req, status)
        self._args = None

    arrivals = property(lambda self: int(self.state["arrival_next"]))  # admitted (or rejected) so far
    rejected = property(lambda self: int(self.state["num_rejected"]))  # of those, rejected

    def run(self, horizon, seq, log):
        """`run_passes` up to the `horizon` key, the event loop's sequence
        counter at `seq` (`ws[0].force` set: the first event was popped off the
        event loop); returns the state (the counter is then `ws[0].seq`)."""
        self.state["seq"] = seq
        st = self.state
        st["arrival_limit"] = min(st["arrival_end"], st["arrival_next"] + ARRIVALS_PER_CALL)
        checking = True if self.schedulers[0].cfg[0]["invariant_check"] else None
        handoffs = True if self.state["pool"] >= 0 else None  # (a disaggregated pool's worker)
        return self._entry(*self.arguments(), float(horizon[0]), int(horizon[1]),
                           int(horizon[2]), *log_arguments(log), checking, handoffs)

    def arguments(self):
        """`run_passes`' arguments but the horizon and the pass log (made
        again after `regrow`)."""
        if self._args is None:
            self._args = self._make_args()
            self._entry.reset()
        return self._args

    def regrow(self):
        """After ROOM: the arrays that may not hold the next event are grown
        when the arguments are made again (`_make_args`)."""
        self._args = None

    def _make_args(self):
        """The loop's arguments but the horizon and the pass log: the worker's
        arrays (engine/worker_state.py), each rank's `kv` bundle
        (`RankScheduler._kv`, which grows the CPU tier's job arrays so that
        one call's jobs fit; only this worker calls it during a run), and
        the same bundles again when they are a CPU tier's (else None:
        `run_passes`' `tier_t`); the transfer wakes' arrays are grown when
        they may run short."""
        kv = (padded([s._kv() for s in self.schedulers])
              if self.schedulers[0].kv_state is not None else None)
        self._grow_wakes()
        w = new_worker_arrays(*self._shared, *self._ranks, *self._side_args, self.outs,
                              self.feats, self.pidx, self.queue, self.ws, self.xw_t,
                              self.xw_s, self.finished, self.taken, self.pulls, kv)
        tier = kv if self.schedulers[0].cfg[0]["kv_source"] == KV_SOURCE_CPU else None
        return w, kv, tier

    def _grow_wakes(self):
        if self.state["num_wakes"] + 1 >= len(self.xw_t):
            self.xw_t = np.concatenate([self.xw_t, np.zeros_like(self.xw_t)])
            self.xw_s = np.concatenate([self.xw_s, np.zeros_like(self.xw_s)])
            self._args = None
