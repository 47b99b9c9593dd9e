"""Disaggregated prefill/decode serving: the KV handoff from a prefill worker
to a decode worker and its transfer over the link (vLLM's KV-transfer
connectors, e.g. NIXL: vllm/distributed/kv_transfer/kv_connector/v1/
nixl_connector.py; the scheduler side in vllm/v1/core/sched/scheduler.py).

Rules:

- **Prefill worker.** A request runs there with `max_tokens = 1`: the pass
  that completes its prompt samples its first token, which goes to the client
  from the prefill worker. When that pass's outputs are processed the request
  finishes there and is handed off (`handoff`) to a decode worker — unless one
  token was all it asked for. Its blocks are *not* freed: the prefill worker
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
  pending decides again when it lands (`EngineCore._wake_at_next_transfer`).
- A request preempted on the prefill worker under async scheduling while its
  last pass was in flight has no blocks left when it is handed off: nothing is
  transferred and the decode worker computes the prompt itself.
- Blocks held for a transfer come back: a prefill worker's request that
  preempts itself while alone in `running` waits for them instead of being
  taken out as unfinishable (`Scheduler._allocate_or_preempt`).

Times are in ms.
"""

from servesim.engine.config import KVTransferConfig
from servesim.kvcache.cpu_tier import TransferLane


class KVTransfer:
    """One handoff's move of prompt KV (or, with `tokens == 0`, the notice
    that nothing needs moving): the decode-side request, its handoff, the
    tokens and bytes moved, and once submitted its instants — `submit_ms`,
    `start_ms` and `finish_ms` on the link's wire, `land_ms` when the KV is
    usable on the decode worker. `done` is set when the decode worker polls
    it landed; `freed_ms` is when the prefill worker freed the source blocks."""

    __slots__ = ("request", "handoff", "tokens", "nbytes", "submit_ms", "start_ms",
                 "finish_ms", "land_ms", "done", "freed_ms")

    def __init__(self, request, handoff, tokens: int, nbytes: int):
        self.request = request
        self.handoff = handoff
        self.tokens = tokens
        self.nbytes = nbytes
        self.submit_ms = self.start_ms = self.finish_ms = self.land_ms = float("nan")
        self.done = False
        self.freed_ms = float("nan")

    @property
    def wait_ms(self) -> float:
        """How long the decode worker waited for the KV (0 when nothing moved)."""
        return self.land_ms - self.submit_ms if self.tokens else 0.0

    def __repr__(self):
        return (f"KVTransfer({self.request.request_id!r}, tokens={self.tokens}, "
                f"submit={self.submit_ms}, start={self.start_ms}, land={self.land_ms})")


class KVLink:
    """One prefill rank's outgoing link: a FIFO wire (the CPU tier's
    `TransferLane`) plus a pipelined latency."""

    def __init__(self, config: KVTransferConfig):
        self.config = config
        self.lane = TransferLane(config.bandwidth_gbps)
        self.latency_ms = config.latency_ms
        self.bytes_per_token = config.bytes_per_token

    def submit(self, job: KVTransfer, now: float):
        job.submit_ms = now
        if job.tokens:
            self.lane.retire(now)
            self.lane.submit(job, now)
        else:  # a notice: nothing on the wire
            job.start_ms = job.finish_ms = now
        job.land_ms = job.finish_ms + self.latency_ms


class Handoff:
    """A request handed from a prefill rank to a decode rank at `handoff_ms`:
    the prefill-side request (`source`, holding its blocks until the
    transfer lands), the prefill rank's `sender`, and — once the decode
    worker admits the request — its `transfer`."""

    __slots__ = ("source", "sender", "handoff_ms", "transfer")

    def __init__(self, source, sender, handoff_ms: float):
        self.source = source
        self.sender = sender
        self.handoff_ms = handoff_ms
        self.transfer = None


class PrefillSender:
    """A prefill rank's side of the handoffs: its link, and the freeing of
    each handed-off request's blocks once its transfer has landed. `poll`,
    `next_completion_ms` and `submit` are what the engine core asks of a
    rank's transfers (as of the CPU tier's connector); `freed` logs
    `(request index, instant)` of every free, for tests."""

    def __init__(self, scheduler, config: KVTransferConfig, wake):
        self.scheduler = scheduler
        self.link = KVLink(config)
        self._wake = wake  # the engine core's: a transfer is pending
        self._pending = []  # transfers submitted whose source blocks are held
        self.freed = []

    def holds(self, request) -> bool:
        """Whether `request`'s blocks are still held for a decode worker."""
        return self.scheduler.delayed_free.get(request.index) is request

    def scheduled(self, job: KVTransfer):
        """A decode worker submitted `job` on this rank's link."""
        self._pending.append(job)
        self._wake()

    def poll(self, now: float):
        """Free the blocks of every handed-off request whose transfer landed
        by `now`."""
        if not self._pending:
            return
        left = []
        for job in self._pending:
            if job.land_ms <= now:
                self.scheduler.free_delayed(job.handoff.source)
                job.freed_ms = now
                self.freed.append((job.handoff.source.index, now))
            else:
                left.append(job)
        self._pending = left

    def next_completion_ms(self):
        return min((job.land_ms for job in self._pending), default=None)

    def submit(self, job, now):  # a prefill worker queues no loads
        raise AssertionError("a prefill worker submits no transfers")


class DecodeReceiver:
    """A decode rank's side of the handoffs, attached to its scheduler
    (`Scheduler.attach_remote_kv`): what to pull at admission (`lookup`,
    `prepare_load`), the notice when nothing is pulled (`admitted`), and over
    time the transfers it waits for (`submit`, `poll`, `next_completion_ms`)."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self._loads = []  # transfers submitted and not landed yet

    def lookup(self, request, first_block: int) -> int:
        """Blocks to pull past a G1 hit of `first_block` blocks: the rest of
        the prompt's blocks, partial last block included (`P - hit` tokens),
        or 0 when the prefill worker no longer holds them."""
        handoff = request.kv_handoff
        if not handoff.sender.holds(handoff.source):
            return 0
        return max(0, -(-request.num_prompt_tokens // self.block_size) - first_block)

    def prepare_load(self, request, first_block: int, num_blocks: int) -> KVTransfer:
        """The pull of the prompt tokens from block `first_block` on."""
        handoff = request.kv_handoff
        tokens = request.num_prompt_tokens - first_block * self.block_size
        link = handoff.sender.link
        handoff.transfer = KVTransfer(request, handoff, tokens, tokens * link.bytes_per_token)
        return handoff.transfer

    def admitted(self, request, out):
        """A handed-off request is admitted: if it pulled nothing while the
        prefill worker still holds its blocks, a notice (no bytes) releases
        them, sent at this decision like a load."""
        handoff = request.kv_handoff
        request.kv_handoff = None
        if handoff.transfer is None and handoff.sender.holds(handoff.source):
            handoff.transfer = KVTransfer(request, handoff, 0, 0)
            out.loads.append(handoff.transfer)

    def submit(self, job: KVTransfer, now: float):
        """Put a transfer decided now on its prefill rank's link."""
        sender = job.handoff.sender
        sender.link.submit(job, now)
        if job.tokens:
            self._loads.append(job)
        sender.scheduled(job)

    def poll(self, now: float):
        """Transfers landed by `now` are done: their requests can be admitted."""
        if not self._loads:
            return
        left = []
        for job in self._loads:
            if job.land_ms <= now:
                job.done = True
            else:
                left.append(job)
        self._loads = left

    def next_completion_ms(self):
        return min((job.land_ms for job in self._loads), default=None)


def connect(prefill_cores, decode_cores, config: KVTransferConfig):
    """Give every prefill rank a sender (with its link) and every decode rank
    a receiver attached to its scheduler."""
    for core in prefill_cores:
        for rank in core.ranks:
            core.attach_transfers(rank, PrefillSender(rank.scheduler, config,
                                                      core.transfer_pending))
    for core in decode_cores:
        for rank in core.ranks:
            receiver = DecodeReceiver(rank.pool.block_size)
            rank.scheduler.attach_remote_kv(receiver)
            core.attach_transfers(rank, receiver)


def handoff(source_core, source_rank: int, source, decode_core, decode_rank: int,
            request, now: float) -> Handoff:
    """Hand `source` (the prefill-side request, just finished with its first
    token) to `decode_rank` of `decode_core` as `request` (the decode-side
    request, with `num_tokens = P + 1`): it joins that rank's waiting queue
    now."""
    sender = source_core.ranks[source_rank].transfers
    h = Handoff(source, sender, now)
    request.kv_handoff = h
    decode_core.add_request(decode_rank, request, request.num_tokens)
    return h
