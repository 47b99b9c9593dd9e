"""One rank's scheduler as Python sees it: `RankScheduler` builds the rank's
arrays (its configuration record, state record, running list, waiting
queue, speculative-decoding arrays) over the shared request table and block
pool, attaches a CPU tier or a remote KV source, and answers the replay's
questions (`can_ever_fit`, `has_requests`, the queues for the debug mode).
The compiled pass loop (engine/pass_loop.py) runs the kernels over
`RankScheduler.arrays`; nothing here schedules a pass.
"""


import numpy as np

from servesim.jit import records
from servesim.scheduler import check
from servesim.scheduler.drafts import draw_states
from servesim.scheduler.kv_cache_manager import can_ever_fit
from servesim.scheduler.output import NUM_KO_ROWS
from servesim.scheduler.request import RequestStatus
from servesim.scheduler.scheduler_arrays import (CONFIG_DTYPE, KV_SOURCE_CPU, STATE_DTYPE,
                                                 new_kv_arrays, new_scheduler_arrays)


# (Python-side reads: a NumPy scalar compared with an IntEnum member costs ~10 µs)
_FINISHED = int(RequestStatus.FINISHED)


class _PrefixCacheStats:
    def __init__(self, S):
        self._S = S

    queries = property(lambda self: int(self._S[0]["prefix_queries"]))
    hits = property(lambda self: int(self._S[0]["prefix_hits"]))
    preempted_queries = property(lambda self: int(self._S[0]["preempted_queries"]))
    preempted_hits = property(lambda self: int(self._S[0]["preempted_hits"]))


class RankScheduler:
    """One rank's scheduler (vLLM's `Scheduler` object): its arrays, which the
    compiled pass loop (engine/pass_loop.py) runs the kernels over; requests
    are indices into the shared table."""

    def __init__(self, config, pool, table, tokens, speculative=None):
        self.config = config
        self.pool = pool
        self.table = table
        self.tokens = tokens
        self.block_size = pool.block_size
        self.num_gpu_blocks = pool.num_gpu_blocks
        self.max_model_len = config.max_model_len or (1 << 62)
        self.priority = config.scheduling_policy == "priority"
        self.cfg = records(1, CONFIG_DTYPE)
        self.cfg[0]["num_usable_blocks"] = pool.config.num_usable_blocks
        self.cfg[0]["max_num_seqs"] = config.max_num_seqs
        self.cfg[0]["max_num_batched_tokens"] = config.max_num_batched_tokens
        self.cfg[0]["max_model_len"] = self.max_model_len
        self.cfg[0]["enable_chunked_prefill"] = config.enable_chunked_prefill
        self.cfg[0]["long_prefill_token_threshold"] = config.long_prefill_token_threshold
        self.cfg[0]["priority_scheduling"] = self.priority
        self.cfg[0]["reserve_full_isl"] = config.reserve_full_isl
        self.cfg[0]["watermark_blocks"] = int(config.watermark * pool.num_gpu_blocks)
        self.cfg[0]["async_scheduling"] = config.async_scheduling
        self.cfg[0]["block_size"] = pool.block_size
        self.cfg[0]["enable_caching"] = pool.enable_caching
        self.speculative = speculative
        k = 0 if speculative is None else speculative.num_speculative_tokens
        rates = np.zeros(max(k, 1), dtype=np.float64)
        if k:
            self.cfg[0]["num_speculative_tokens"] = k
            self.cfg[0]["num_lookahead_tokens"] = k  # num_lookahead_tokens for mtp / eagle / ngram
            self.cfg[0]["num_hash_lookahead_tokens"] = int(pool.enable_caching)
            self.cfg[0]["spec_seed"] = speculative.seed
            rates[:] = speculative.acceptance_rates
        # (accepted-list offsets, values, rates, the verification passes by
        # [drafts, accepted] (drafts.py `position_counts`), each request's state
        # for its acceptance draws, drafts.py `draw_states`)
        states = (draw_states(speculative.seed, table.request_keys()) if k
                  else np.zeros(0, dtype=np.uint64))
        self.spec = (table.accepted_offsets, table.accepted_values, rates,
                     np.zeros((k + 1, k + 1), dtype=np.int64), states)
        self.S = records(1, STATE_DTYPE)
        self.running = np.zeros(config.max_num_seqs + 1, dtype=np.int64)
        self.wq = np.zeros(len(table.request_ids) + 1, dtype=np.int64)
        self._out_width = config.max_num_seqs + 1
        self.prefix_cache_stats = _PrefixCacheStats(self.S)
        self.stop_on_finish = False  # closed loop: a finish releases the next request
        self.connector = None  # the CPU tier (attach_connector)
        self.kv_state = None  # (wfk, KO, KC): loads waiting ahead of the queue

        # num_delayed_free_requests's
        self.held = np.zeros(len(table.request_ids) + 1, dtype=np.int64)
        self._queues = None  # the debug mode's view of the queues (`queues`)
        self.arrays = new_scheduler_arrays(
            table.R, table.idents, table.tables, pool.blocks, pool.idmap, pool.scalars,
            self.cfg, self.S, self.running, self.wq, self.spec, self.held, tokens.client_ms,
            tokens.offsets, tokens.last_client, float(tokens.detokenize_ms), pool.events)
        if check.enabled():
            # the debug mode; the whole table is checked while this is the only
            # scheduler on it (other ranks' requests are in their own queues)
            table.checked_schedulers.append(self)
            mode = 2 if len(table.checked_schedulers) == 1 else 1
            for peer in table.checked_schedulers:
                peer.cfg[0]["invariant_check"] = mode

    def new_connector(self, offloading_config):
        """This rank's CPU tier (docs/engine.md §9) as arrays, attached."""
        from servesim.kvcache.cpu_tier_connector import CPUTierConnector

        connector = CPUTierConnector(offloading_config, self.pool, self.table)
        self.attach_connector(connector)
        return connector

    def attach_connector(self, connector):
        """Use `connector` (a `CPUTierConnector`) as this rank's CPU tier."""
        self.connector = connector
        self.attach_kv_source(KV_SOURCE_CPU, connector.tier)

    def attach_kv_source(self, source, tier=None):
        """Admit loads that wait ahead of the queue from `source`
        (KV_SOURCE_CPU with its `tier`; KV_SOURCE_REMOTE: the kernels get an
        empty tier, which its code paths never touch): creates
        `waiting_for_kv` and the per-call outputs `KO`/`KC`."""
        from servesim.kvcache.cpu_tier import TierArrays

        self.cfg[0]["kv_source"] = source
        self._queues = None  # (`waiting_for_kv` is new)
        self._tier = tier if tier is not None else TierArrays.empty()
        n = len(self.table.request_ids) + 1
        width = max(n, self.num_gpu_blocks) + self._out_width
        self.kv_state = (np.zeros(n, dtype=np.int64),
                         np.zeros((NUM_KO_ROWS, width), dtype=np.int64),
                         np.zeros(NUM_KO_ROWS, dtype=np.int64))
        self._kv_arrays = None

    def _kv(self):
        """The `kv` bundle of the kernels (a `KVArrays`), with room for the jobs of one call:
        a store per scheduled request and a preemption store per victim (each
        at most max_num_seqs + 1), a load per waiting request that can hold
        a G1 block; their blocks are G1 blocks read or written, at most the
        pool each for loads, preemption stores and stores."""
        t = self._tier
        grown = False
        if self.cfg[0]["kv_source"] == KV_SOURCE_CPU:
            jobs = 2 * self._out_width + min(int(self.S[0]["num_waiting"]), self.num_gpu_blocks)
            grown = t.ensure_room(jobs, 3 * self.num_gpu_blocks)
        if grown or self._kv_arrays is None:
            self._kv_arrays = new_kv_arrays(*self.kv_state, *t.arrays(), t.lanes, t.storing)
        return self._kv_arrays

    @property
    def waiting_for_kv(self) -> list:
        """Requests waiting for their load, in the order they were queued."""
        if self.kv_state is None:
            return []
        return self.kv_state[0][:self.S[0]["num_waiting_for_kv"]].tolist()

    # -- requests in ---------------------------------------------------------

    def can_ever_fit(self, num_prompt_tokens) -> bool:
        """Whether a prompt of this length is admitted at arrival (`can_ever_fit`)."""
        return bool(can_ever_fit(self.cfg, num_prompt_tokens))

    def has_requests(self) -> bool:
        """Anything to run or wait for — including loads waiting ahead of the
        queue and, on a disaggregated prefill worker, finished requests whose
        blocks wait for their transfer."""
        return bool(self.S[0]["num_running"] or self.S[0]["num_waiting"]
                    or self.S[0]["num_waiting_for_kv"] or self.S[0]["num_delayed_free_requests"])

    def holds(self, i) -> bool:
        """Disaggregated prefill worker: whether request i's blocks are held
        for a decode worker."""
        row = self.table.R[i]  # (one record: a field's column would be a new view)
        return bool(row["status"] == _FINISHED and row["do_remote_decode"]
                    and row["num_held_blocks"])


    def queues(self):
        """This rank's queues for the debug mode's check across schedulers
        (servesim/scheduler/check.py `check_table`), as a `RankQueues`
        bundle of its state and configuration records, `running`, the
        waiting queue, `held` and `waiting_for_kv` (empty without `kv`): the
        requests holding blocks outside running and waiting are those of the
        last two (loads in flight, blocks held for a decode worker), as
        `_check_holders` finds them. Made once (again after
        `attach_kv_source`): the kernels change these arrays in place."""
        if self._queues is None:
            wfk = self.kv_state[0] if self.kv_state is not None else np.zeros(0, dtype=np.int64)
            self._queues = check.new_rank_queues(self.S, self.cfg, self.running, self.wq,
                                                 self.held, wfk)
        return self._queues

    num_running = property(lambda self: int(self.S[0]["num_running"]))
    num_waiting = property(lambda self: int(self.S[0]["num_waiting"]
                                            + self.S[0]["num_waiting_for_kv"]))
    num_preemptions = property(lambda self: int(self.S[0]["num_preemptions"]))
