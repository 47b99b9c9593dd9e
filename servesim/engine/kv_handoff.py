"""Disaggregated prefill/decode serving: the KV handoff from a prefill worker
to a decode worker and its transfer over the link (vLLM's KV-transfer
connectors, e.g. NIXL: vllm/distributed/kv_transfer/kv_connector/v1/
nixl_connector.py; the scheduler side in vllm/v1/core/sched/scheduler.py),
as arrays and Numba kernels (docs/engine.md §13).

Rules:

- **Prefill worker.** A request runs there with `max_tokens = 1`: the pass
  that completes its prompt samples its first token, which goes to the client
  from the prefill worker. When that pass's outputs are processed the request
  finishes there and is handed off (replay/disaggregated.py `handoff`) to a
  decode worker — unless one token was all it asked for. Its blocks are *not* freed: the prefill worker
  holds them until the decode worker has read them (`request_finished`
  returns `delay_free_blocks`; vLLM frees them on the `finished_sending`
  notification).
- **Decode worker.** The handed-off request arrives in its waiting queue with
  the prompt and the first token (`num_tokens = P + 1`, vLLM's
  `do_remote_prefill`). At its admission, strictly head of line like any
  waiting request, its G1 prefix-cache hit is looked up and only the prompt
  tokens past the hit are pulled (`get_num_new_matched_tokens`: `P - hit`).
  The blocks for all its tokens are allocated first, with the admission
  checks (`reserve_full_isl`, `watermark`); if they do not fit, it waits, and
  the prefill worker keeps holding its blocks. The request then waits in
  `waiting_for_kv` (WAITING_FOR_REMOTE_KVS), ahead of the waiting queue and
  using no budget, until the transfer lands; it is admitted with its prompt
  counted as computed (`_update_waiting_for_remote_kv`), and its first pass
  computes the first token's KV and samples the second — a decode pass for
  pricing. The blocks allocated before the pull include the first token's
  slot: vLLM's decode worker recomputes the last prompt token, in a block the
  pull already allocated, so a pulled request never needs a new block to be
  admitted; allocating the first token's slot with the prompt's keeps that
  property (else pulled requests could hold every block while each waits for
  one more). A decode worker that already holds the whole prompt pulls
  nothing and admits the request at once; it only notifies the prefill
  worker, which frees the blocks `latency_ms` later (NIXL's notify-only read).
- **Link.** One link per prefill rank (one prefill GPU and its NIC): every
  byte a prefill GPU computes leaves over it, whichever decode worker reads
  it, so its bandwidth bounds that GPU's KV egress; a link per (prefill,
  decode) pair would let one prefill GPU send to M decode workers at M times
  its NIC's bandwidth. (A decode worker's ingress is not modelled as a
  bottleneck.) Transfers on a link are FIFO in the order the decode workers
  submit them; `n` tokens occupy it for `n · bytes_per_token / (bandwidth_gbps
  · 1e9)` s and land `latency_ms` after they leave it (the latency is
  pipelined, not serialised).
- **Time.** A transfer is submitted at the decode worker's decision that
  admits the request into `waiting_for_kv`. Its landing takes effect at each
  side's first decision at or after it (vLLM's connectors report finished
  transfers with a pass's outputs): the decode worker admits the request then,
  the prefill worker frees the blocks then. An idle worker with a transfer
  pending decides again when it lands (servesim/engine/pass_loop.py, where
  these polls and submissions run inside the pass loop).
- A request preempted on the prefill worker under async scheduling while its
  last pass was in flight has no blocks left when it is handed off: nothing is
  transferred and the decode worker computes the prompt itself.
- Blocks held for a transfer come back: a prefill worker's request that
  preempts itself while alone in `running` waits for them instead of being
  taken out as unfinishable (scheduler.py `_schedule_running`).

The arrays:

- `Transfers`: every handoff's transfer (request i's row: tokens, bytes, link,
  the instants `submit`, `start`, `finish`, `land`, `freed`, and `done`) and
  every prefill rank's link (`link_free`: when its wire is free). A link is
  FIFO: transfers are submitted at the decision instant, never earlier than
  one already queued, so a new one starts when the last one submitted leaves
  the wire (`submit_transfer`).
- `HandoffSender`: a prefill rank's side: the requests whose transfer was
  submitted and whose blocks it still holds; a decision frees those whose
  transfer landed (`poll_sender`).
- `HandoffReceiver`: a decode rank's side: the pulls it waits for; a decision
  marks those landed as done (`poll_receiver`) and puts the pulls it decided
  (or, for a request admitted with nothing to pull while the prefill rank
  still holds its blocks, a notice of no bytes) on the source rank's link
  (`kv_transfers._submit_pulls`, with `submit_transfer`).

The scheduler side — a prefill rank holding a finished request's blocks
(`do_remote_decode`, `num_delayed_free_requests`, `free_delayed`), a decode rank admitting a
handed-off request (`kv_handoff`) — is in servesim/scheduler/scheduler.py.

Times are in ms.
"""

import numpy as np

from servesim.jit import njit, records
from servesim.scheduler.kv_connector import free_delayed
from servesim.scheduler.request import KVHandoff, KVLoad, RequestStatus
from servesim.scheduler.scheduler_arrays import KV_SOURCE_NONE, KV_SOURCE_REMOTE

# Transfers.I fields (integers) and .F fields (instants)
X_TOKENS, X_NBYTES, X_LINK, X_DONE = range(4)
X_SUBMIT, X_START, X_FINISH, X_LAND, X_FREED = range(5)
# a sender's or receiver's state, `state[0]` (one record, `new_side_state`):
# how many transfers it waits on (`pending[:num_pending]`), how many frees
# its log holds (`log[:num_logged]`)
SIDE_DTYPE = np.dtype([("num_pending", np.int64), ("num_logged", np.int64)])


def new_side_state():
    return records(1, SIDE_DTYPE)


@njit
def wait_on(pending, state, i):
    """A sender or receiver waits on request i's transfer (its pending list
    `pending[:state[0].num_pending]`, in submission order)."""
    pending[state[0].num_pending] = i
    state[0].num_pending += 1


@njit
def hand_off(P, D, i, now):
    """The handoff (above): request i, finished on its prefill worker (row i
    of the prefill table `P`), joins a decode rank's waiting queue now (row
    i of the decode table `D`) with its prompt and first token; whether the
    prefill rank holds its blocks is fixed from here to its admission (they
    are freed only once a transfer it submits there lands). The caller
    queues it (`add_request`)."""
    prompt = P[i].num_prompt_tokens
    D[i].num_tokens = prompt + 1  # the prompt and the first token
    D[i].max_num_computed_tokens = prompt  # computed once, on the prefill worker
    held = (P[i].status == RequestStatus.FINISHED and P[i].do_remote_decode
            and P[i].num_held_blocks > 0)
    D[i].kv_handoff = KVHandoff.HELD if held else KVHandoff.NOTHING
    D[i].arrival_time = now


@njit
def submit_transfer(XI, XF, link_free, i, link, tokens, bytes_per_token, bytes_per_ms,
                    latency_ms, now):
    """The link rule (above): request i's transfer of `tokens`
    prompt tokens on `link`, decided now. With tokens it goes on the wire
    when the link is free, FIFO (`n` bytes take `n / bytes_per_ms`); a notice (no tokens) only carries the latency. It lands
    `latency_ms` after it leaves the wire."""
    nbytes = tokens * bytes_per_token
    XI[i, X_TOKENS] = tokens
    XI[i, X_NBYTES] = nbytes
    XI[i, X_LINK] = link
    XF[i, X_SUBMIT] = now
    if tokens:
        start = max(link_free[link], now)
        finish = start + nbytes / bytes_per_ms
        link_free[link] = finish
    else:
        start = finish = now
    XF[i, X_START] = start
    XF[i, X_FINISH] = finish
    XF[i, X_LAND] = finish + latency_ms


@njit
def poll_sender(s, pending, state, log, XF, now):
    """A prefill rank's poll: free the held blocks of every request whose
    transfer landed by `now`, in submission order (`free_delayed`), and
    log it; the others stay pending. `s`: the rank's `SchedulerArrays`."""
    kept = 0
    for k in range(state[0].num_pending):
        i = pending[k]
        if XF[i, X_LAND] <= now:
            free_delayed(s, i)
            XF[i, X_FREED] = now
            log[state[0].num_logged] = i
            state[0].num_logged += 1
        else:
            pending[kept] = i
            kept += 1
    state[0].num_pending = kept


@njit
def poll_receiver(R, pending, state, XI, XF, now):
    """A decode rank's poll: pulls landed by `now` are done, their requests
    `KVLoad.LANDED` (the compiled scheduler then admits them)."""
    kept = 0
    for k in range(state[0].num_pending):
        i = pending[k]
        if XF[i, X_LAND] <= now:
            XI[i, X_DONE] = 1
            R[i].kv_load = KVLoad.LANDED
        else:
            pending[kept] = i
            kept += 1
    state[0].num_pending = kept


@njit
def next_land(pending, count, XF):
    """The earliest landing among the pending transfers (inf: none)."""
    t = np.inf
    for k in range(count):
        t = min(t, XF[pending[k], X_LAND])
    return t


class Transfers:
    """Every handoff's transfer and every prefill rank's link, as arrays
    (request i's row; -1 tokens: no transfer)."""

    def __init__(self, n: int, num_links: int, config):
        self.I = np.zeros((n, 4), dtype=np.int64)
        self.I[:, X_TOKENS] = -1
        self.F = np.full((n, 5), np.nan)
        self.link_free = np.zeros(num_links, dtype=np.float64)
        self.bytes_per_token = config.bytes_per_token
        self.bytes_per_ms = config.bandwidth_gbps * 1e6  # GB/s = 1e6 B/ms
        self.latency_ms = config.latency_ms
        self.senders = []  # by link: the prefill ranks' HandoffSender
        self.link_of = np.full(n, -1, dtype=np.int64)  # handed-off request -> its link

    def has(self, i) -> bool:
        return self.I[i, X_TOKENS] >= 0

    def tokens(self, i) -> int:
        return int(self.I[i, X_TOKENS])

class HandoffSender:
    """A prefill rank's side of the handoffs:
    the requests whose transfer was submitted and whose blocks it holds
    (arrays the compiled pass loop polls); `freed` is `(request index,
    instant)` of every free, in order, for tests."""

    def __init__(self, scheduler, transfers: Transfers, link: int, wake):
        self.scheduler = scheduler
        self.transfers = transfers
        self.link = link
        self._wake = wake  # the engine core's: a transfer is pending
        n = len(transfers.I)
        self._pending = np.zeros(n + 1, dtype=np.int64)
        self._log = np.zeros(n + 1, dtype=np.int64)
        self._state = new_side_state()

    def holds(self, i) -> bool:
        return self.scheduler.holds(i)

    def scheduled(self, i: int):
        """A decode worker submitted request i's transfer on this rank's link."""
        wait_on(self._pending, self._state, i)
        self._wake()


    @property
    def freed(self) -> list:
        F = self.transfers.F
        return [(int(i), float(F[i, X_FREED])) for i in self._log[:self._state[0]["num_logged"]]]


class HandoffReceiver:
    """A decode rank's side of the handoffs:
    the pulls it waits for (arrays the compiled pass loop polls and appends
    to). What to pull at admission is decided in the compiled waiting loop
    (`kv_handoff`), and submitted by the pass loop at that decision."""

    def __init__(self, scheduler, transfers: Transfers):
        self.scheduler = scheduler
        self.transfers = transfers
        n = len(transfers.I)
        self._pending = np.zeros(n + 1, dtype=np.int64)
        self._state = new_side_state()



def connect(prefill_cores, decode_cores, transfers: Transfers):
    """Give every prefill rank a sender (its link: the rank's index over the
    prefill pool) and every decode rank a receiver. A prefill rank gets `kv`
    arrays too, with no source of loads (KV_SOURCE_NONE: its connector code
    does nothing), so that both pools' ranks have one type and the scheduler
    and the pass loop compile once for the deployment, not once per pool."""
    for core in prefill_cores:
        for rank in core.ranks:
            rank.scheduler.attach_kv_source(KV_SOURCE_NONE)
            sender = HandoffSender(rank.scheduler, transfers, len(transfers.senders),
                                 core.transfer_pending)
            transfers.senders.append(sender)
            core.attach_transfers(rank, sender)
    for core in decode_cores:
        for rank in core.ranks:
            rank.scheduler.attach_kv_source(KV_SOURCE_REMOTE)
            core.attach_transfers(rank, HandoffReceiver(rank.scheduler, transfers))
