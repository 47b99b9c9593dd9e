"""A request's scheduler state (vllm/v1/request.py)."""

import enum

import numpy as np


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED = 3
    UNFINISHED = 5  # could never finish (outgrows the pool while alone)


class Request:
    """State of one request inside one rank's scheduler.

    `num_computed_tokens` advances when a pass is *scheduled*;
    `num_output_placeholders` counts tokens sampled by passes in flight (async
    scheduling only). `block_table[:num_blocks]` are the G1 blocks it holds;
    the first `num_cached_blocks` of them are registered in the prefix cache.
    `idents` are the identities of its blocks (prompt, then output positions).
    `prefill_target` is its token count at its last admission: it is a prefill
    request in a pass while `num_computed_tokens` is below it (docs/engine.md
    §10). With a CPU tier, `kv_load` is the load it waits for
    (WAITING_FOR_REMOTE_KVS), `cpu_store_cursor` the blocks the `offloading`
    connector has considered for storing since its admission, and
    `num_in_flight` the passes in flight that schedule it (async scheduling).

    Disaggregated serving (servesim/engine/disagg.py): on a prefill worker
    `remote_decode` marks a request handed to a decode worker once it has its
    first token (its blocks are then held until the KV transfer completes);
    on a decode worker `kv_handoff` is the handoff whose prompt KV it pulls
    (vLLM's `do_remote_prefill`), None once it is admitted.
    """

    __slots__ = (
        "index", "request_id", "arrival_ms", "priority", "num_prompt_tokens",
        "max_tokens", "num_tokens", "num_computed_tokens", "num_output_placeholders",
        "num_preemptions", "status", "idents", "block_table", "num_blocks",
        "num_cached_blocks", "prefill_target", "sort_key",
        # CPU tier (docs/engine.md §7, §9)
        "kv_load", "kv_load_g1_hit", "cpu_store_cursor", "num_in_flight",
        # disaggregated prefill/decode (engine/disagg.py)
        "remote_decode", "kv_handoff",
        # results
        "first_admission_cached_tokens", "first_scheduled_ms", "recomputed_tokens",
        "max_computed_tokens",
        "cpu_tier_cached_tokens", "first_token_pass", "finish_pass",
    )

    def __init__(self, index, request_id, arrival_ms, num_prompt_tokens, max_tokens,
                 idents, priority=0):
        self.index = index
        self.request_id = request_id
        self.arrival_ms = arrival_ms
        self.priority = priority
        self.num_prompt_tokens = num_prompt_tokens
        self.max_tokens = max_tokens
        self.num_tokens = num_prompt_tokens
        self.num_computed_tokens = 0
        self.num_output_placeholders = 0
        self.num_preemptions = 0
        self.status = RequestStatus.WAITING
        self.idents = idents
        self.block_table = np.zeros(len(idents), dtype=np.int32)
        self.num_blocks = 0
        self.num_cached_blocks = 0
        self.prefill_target = num_prompt_tokens
        # vLLM's priority queue orders by (priority, arrival_time, request_id)
        self.sort_key = (priority, arrival_ms, request_id)
        self.kv_load = None  # the CPU-tier load it waits for, if any
        self.kv_load_g1_hit = 0  # its G1 hit (tokens) when that load was queued
        self.cpu_store_cursor = 0  # blocks before it were considered for storing
        self.num_in_flight = 0  # passes in flight that schedule it (async, CPU tier)
        self.remote_decode = False  # prefill worker: hand off after the first token
        self.kv_handoff = None  # decode worker: the handoff to pull the prompt's KV from
        self.first_admission_cached_tokens = -1
        self.first_scheduled_ms = float("nan")
        self.recomputed_tokens = 0
        self.max_computed_tokens = 0
        self.cpu_tier_cached_tokens = 0
        self.first_token_pass = -1
        self.finish_pass = -1

    @property
    def num_output_tokens(self) -> int:
        return self.num_tokens - self.num_prompt_tokens

    def __lt__(self, other):  # for the priority heap
        return self.sort_key < other.sort_key

    def __repr__(self):
        return (f"Request({self.request_id!r}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens}, status={self.status.name})")
