"""The pass log as the compiled pass loop writes it (docs/engine.md "Pass log"):
`PassLogBuffer` holds a head row per pass and rank (`L_*` columns), its
scheduled entries (`E_*`), and its preempted and finished requests, growing
when the loop says it is full (LOG_FULL); `_log_pass` writes one pass,
`_log_room` says whether the next fits. replay/pass_log.py reads it into lines.
"""

import numpy as np

# (compiled in: Numba's cache of this file does not see pricing.py's kernels
# change; edit this line with them. Table layout 4.)
from servesim.jit import njit
from servesim.scheduler import output
from servesim.engine.worker_state import new_pass_log_arrays



# pass log buffer: head columns, time columns, scheduled-entry columns
(L_PASS, L_POOL, L_WORKER, L_RANK, L_FREE, L_SCHED_END, L_PRE_END, L_FIN_END) = range(8)
NUM_LHEAD = 8
E_REQ, E_TOK, E_CACHED, E_KIND, E_SPEC = range(5)
NUM_LENTRY = 5
N_ROWS, N_SCHED_E, N_PRE_E, N_FIN_E = range(4)


@njit
def _log_room(log, ranks, width):
    """Whether the pass log buffer (`log`, a `PassLogArrays`) holds one more
    pass of `ranks` ranks of up to `width` entries each."""
    count = log.count
    return (count[N_ROWS] + ranks <= log.head.shape[0]
            and count[N_SCHED_E] + ranks * width <= log.sched.shape[0]
            and count[N_PRE_E] + ranks * width <= log.pre.shape[0]
            and count[N_FIN_E] + ranks * width <= log.fin.shape[0])


@njit
def _log_pass(log, ws, queue, slot, r, index, out, feats, finished, n_fin):
    """One line of `passes.jsonl`: rank r's part of the pass in `slot`,
    into the pass log buffer `log` (a `PassLogArrays`)."""
    lhead, ltime, lsched = log.head, log.time, log.sched
    lpre, lfin, lcount = log.pre, log.fin, log.count
    row = lcount[N_ROWS]
    lhead[row, L_PASS] = index
    lhead[row, L_POOL] = ws[0].pool
    lhead[row, L_WORKER] = ws[0].worker
    lhead[row, L_RANK] = r
    lhead[row, L_FREE] = feats[output.FREE_BLOCKS]
    ltime[row, 0] = queue[slot].start_ms
    ltime[row, 1] = queue[slot].end_ms
    ltime[row, 2] = queue[slot].decided_ms
    ltime[row, 3] = queue[slot].launch_end_ms
    k = lcount[N_SCHED_E]
    for e in range(feats[output.N_SCHED]):
        lsched[k, E_REQ] = out[output.O_REQ, e]
        lsched[k, E_TOK] = out[output.O_TOK, e]
        lsched[k, E_CACHED] = out[output.O_CACHED, e]
        lsched[k, E_KIND] = out[output.O_KIND, e]
        lsched[k, E_SPEC] = out[output.O_SPEC, e]
        k += 1
    lcount[N_SCHED_E] = k
    k = lcount[N_PRE_E]
    for e in range(feats[output.N_PRE]):
        lpre[k] = out[output.O_PRE, e]
        k += 1
    lcount[N_PRE_E] = k
    k = lcount[N_FIN_E]
    for e in range(n_fin):
        lfin[k] = finished[e]
        k += 1
    lcount[N_FIN_E] = k
    lhead[row, L_SCHED_END] = lcount[N_SCHED_E]
    lhead[row, L_PRE_END] = lcount[N_PRE_E]
    lhead[row, L_FIN_END] = lcount[N_FIN_E]
    lcount[N_ROWS] = row + 1


class PassLogBuffer:
    """The pass log of compiled workers, one line per rank and pass in the
    order their outputs were processed: head and time columns per line, and
    flat arrays of scheduled entries (request, tokens, cached, kind, drafts),
    preempted and finished requests, each line holding the end of its slice.
    `grow()` doubles what is full. `for_workload` reserves what a workload
    is expected to need up front: zeroed arrays are mapped lazily, so a page
    costs only once it is written, where each doubling writes it again."""

    def __init__(self, rows=4096, entries=None, finished=None):
        self.head = np.zeros((rows, NUM_LHEAD), dtype=np.int64)
        self.time = np.zeros((rows, 4), dtype=np.float64)
        self.sched = np.zeros((entries or rows * 8, NUM_LENTRY), dtype=np.int32)
        self.pre = np.zeros(rows, dtype=np.int32)
        self.fin = np.zeros(finished or rows, dtype=np.int32)
        self.count = np.zeros(4, dtype=np.int64)
        self._arrays = None  # (`arrays`)

    @classmethod
    def for_workload(cls, input_length, output_length):
        """A buffer for requests of these lengths: a scheduled entry for each
        output token and prompt chunk (taken as 512 tokens; preemptions and
        disaggregated hand-offs add a few, and `grow` the rest), a finished
        entry for each request."""
        n = len(input_length)
        entries = int(output_length.sum()) + int(input_length.sum()) // 512 + 2 * n
        return cls(entries=entries + 4096, finished=n + 1)

    def grow(self, ranks, width):
        def bigger(a, used, need):
            if used + need <= a.shape[0]:
                return a
            size = max(2 * a.shape[0], used + need)
            b = np.zeros((size,) + a.shape[1:], dtype=a.dtype)
            b[:used] = a[:used]
            return b

        c = self.count
        self.head = bigger(self.head, c[N_ROWS], ranks)
        self.time = bigger(self.time, c[N_ROWS], ranks)
        self.sched = bigger(self.sched, c[N_SCHED_E], ranks * width)
        self.pre = bigger(self.pre, c[N_PRE_E], ranks * width)
        self.fin = bigger(self.fin, c[N_FIN_E], ranks * width)
        self._arrays = None

    def arrays(self):
        """The buffer's arrays as the pass loops take them (a
        `PassLogArrays`, engine/worker_state.py), made again after `grow`."""
        if self._arrays is None:
            self._arrays = new_pass_log_arrays(self.head, self.time, self.sched, self.pre,
                                               self.fin, self.count)
        return self._arrays

    def __len__(self):
        return int(self.count[N_ROWS])


_NO_LOG = PassLogBuffer(1)


def log_arguments(log):
    """The pass loops' last arguments: whether they log passes, and the
    `PassLogBuffer`'s arrays (stand-ins without a pass log, `log` None)."""
    buf = log if log is not None else _NO_LOG
    return (log is not None, buf.arrays())
