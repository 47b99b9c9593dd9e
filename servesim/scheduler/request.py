"""A request's state in the scheduler, as vLLM's `Request` (vllm/v1/request.py):
a NumPy structured array of `REQUEST_DTYPE`, one record per request, indexed by
its position in the workload; all ranks share one table (a request lives on
one rank), and its status is a `RequestStatus`.

`R[i]` holds request i's state under vLLM's field names
(`num_computed_tokens`, `num_tokens`, `status`, ...) and its times; a kernel
reads `R[i].num_computed_tokens` (Numba's record access costs what column
indexing did), Python `R["num_computed_tokens"]`. `idents[offset:offset +
capacity]` are its block identities and `tables[offset:offset + capacity]` its
block table, where `offset = R[i].block_offset`, `capacity =
R[i].block_capacity` covers its prompt plus its output cap.
"""

import enum

import numpy as np


class RequestStatus(enum.IntEnum):
    """vLLM's `RequestStatus`; kernels compare against the members, which Numba
    treats as compile-time integers."""
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED = 3
    UNFINISHED = 5  # could never finish (outgrows the pool while alone), or taken
    # out of a livelocked rank


# one record per request; vLLM's field names (vllm/v1/request.py) where
# vLLM has the field
REQUEST_DTYPE = np.dtype([
    ("num_prompt_tokens", np.int64),  # prompt length
    ("max_tokens", np.int64),  # output cap (sampling_params.max_tokens)
    ("num_tokens", np.int64),  # prompt + output tokens known
    ("num_computed_tokens", np.int64),
    ("num_output_placeholders", np.int64),  # async: tokens in flight
    ("num_preemptions", np.int64),
    ("status", np.int64),  # RequestStatus
    ("prefill_target_tokens", np.int64),  # num_tokens at admission (prefill below it)
    ("max_num_computed_tokens", np.int64),  # highest real one (recompute accounting)
    ("num_recomputed_tokens", np.int64),  # tokens computed again after a preemption
    ("num_cached_tokens", np.int64),  # prefix hit at its first admission (-1: not yet)
    ("num_held_blocks", np.int64),  # blocks in its block table
    ("num_cached_blocks", np.int64),  # of those, in the prefix cache (num_cached_block)
    ("priority", np.int64),
    ("request_id_rank", np.int64),  # rank of its request id as a string (priority ties)
    ("first_token_pass", np.int64),  # pass that sampled its first token (-1: none)
    ("finish_pass", np.int64),  # pass that sampled its last token (-1: none)
    ("block_offset", np.int64),  # start of its slice of `idents` / `tables`
    ("block_capacity", np.int64),  # length of that slice
    ("num_spec_tokens", np.int64),  # len(spec_token_ids): drafts held
    ("num_drafts", np.int64),  # passes that verified real drafts (its draw index)
    ("num_draft_tokens", np.int64),  # real drafts scheduled
    ("num_accepted_tokens", np.int64),  # real drafts accepted
    ("kv_load", np.int64),  # KVLoad: a load waiting ahead of the queue (WAITING_FOR_REMOTE_KVS)
    ("num_g1_hit_tokens", np.int64),  # its G1 hit when the load was queued
    ("cpu_store_cursor", np.int64),  # blocks the offloading connector has considered
    ("num_passes_in_flight", np.int64),  # async: passes in flight that schedule it
    ("num_cpu_cached_tokens", np.int64),  # tokens it got from the CPU tier
    ("do_remote_decode", np.int64),  # P/D prefill side: handed off after its first token
    ("kv_handoff", np.int64),  # P/D decode side: KVHandoff until admitted (0: none)
    ("arrival_time", np.float64),  # ms
    ("first_scheduled_time", np.float64),  # ms (NaN: never scheduled)
])


# loads that wait ahead of the queue (WAITING_FOR_REMOTE_KVS, docs/engine.md §9):
# kv_load is KVLoad.NONE, KVLoad.IN_FLIGHT from the admission that queues the load until
# its source (the CPU tier, or a remote worker) sets KVLoad.LANDED; num_g1_hit_tokens the G1
# hit (tokens) when it was queued. CPU tier: cpu_store_cursor the blocks the
# `offloading` connector has considered for storing since the admission,
# num_passes_in_flight the passes in flight that schedule it (async scheduling),
# num_cpu_cached_tokens the tokens it got from the tier
# disaggregated serving (servesim/engine/kv_handoff.py, docs/engine.md §13): on a
# prefill worker do_remote_decode marks a request handed off after its first token
# (its blocks are then held, not freed, when it finishes); on a decode worker
# kv_handoff is a handed-off request's state until its admission: KVHandoff.HELD
# (the prefill worker holds its prompt's KV), KVHandoff.PULLING (its pull is
# queued), KVHandoff.NOTHING (nothing held: computed here), 0 once admitted
# (vLLM's `do_remote_prefill` done)
class KVLoad(enum.IntEnum):
    """A request's `kv_load`: no load, queued until its source lands it, landed."""
    NONE = 0
    IN_FLIGHT = 1
    LANDED = 2


class KVHandoff(enum.IntEnum):
    """A handed-off request's `kv_handoff` on a decode worker until its admission (0 then)."""
    HELD = 1
    NOTHING = 2
    PULLING = 3


class RequestTable:
    def __init__(self, request_ids, prompt, max_tokens, priority, idents, ident_offsets,
                 accepted_offsets=None, accepted_values=None):
        n = len(request_ids)
        from servesim.jit import records

        R = records(n, REQUEST_DTYPE)
        R["num_prompt_tokens"] = prompt
        R["max_tokens"] = max_tokens
        R["num_tokens"] = prompt
        R["status"] = RequestStatus.WAITING
        R["prefill_target_tokens"] = prompt
        R["num_cached_tokens"] = -1
        R["priority"] = priority
        # vLLM's priority queue breaks ties on the request id, as a string
        order = sorted(range(n), key=request_ids.__getitem__)
        R["request_id_rank"][order] = np.arange(n)
        R["first_token_pass"] = -1
        R["finish_pass"] = -1
        R["block_offset"] = ident_offsets[:-1]
        R["block_capacity"] = np.diff(ident_offsets)
        self.R = R
        self.R["arrival_time"] = np.nan
        self.R["first_scheduled_time"] = np.nan
        self.idents = idents
        self.tables = np.zeros(len(idents), dtype=np.int32)  # block ids
        self.request_ids = request_ids
        # speculative decoding: each request's trace `accepted` list (empty: none)
        if accepted_offsets is None:
            accepted_offsets = np.zeros(n + 1, dtype=np.int64)
            accepted_values = np.zeros(0, dtype=np.int64)
        self.accepted_offsets = accepted_offsets
        self.accepted_values = accepted_values
        self.checked_schedulers = []  # the debug mode's schedulers on this table (check.py)
        self.check_across = None  # their check across them, compiled (check.py `check_table`)
        self._request_keys = None  # (`request_keys`)

    def request_keys(self):
        """A key per request from its id (CRC-32), for draws that must not
        depend on where the request stands in the workload (made once: the
        schedulers on this table share it, and only read it)."""
        if self._request_keys is None:
            import zlib

            self._request_keys = np.array(
                [zlib.crc32(str(rid).encode()) for rid in self.request_ids], dtype=np.int64)
        return self._request_keys

    def results(self):
        """Per-request result arrays (the driver's record columns)."""
        R = self.R
        return {
            "output_tokens": R["num_tokens"] - R["num_prompt_tokens"],
            "num_preemptions": R["num_preemptions"].copy(),
            "first_admission_cached_tokens": np.maximum(R["num_cached_tokens"], 0),
            "cpu_tier_cached_tokens": R["num_cpu_cached_tokens"].copy(),
            "recomputed_tokens": R["num_recomputed_tokens"].copy(),
            "first_scheduled_ms": self.R["first_scheduled_time"].copy(),
            "first_token_pass": R["first_token_pass"].copy(),
            "finish_pass": R["finish_pass"].copy(),
        }

    def spec_results(self):
        """Per-request speculative-decoding counters: real drafts scheduled
        and accepted (padding drafts are not counted)."""
        return {"spec_drafted": self.R["num_draft_tokens"].copy(),
                "spec_accepted": self.R["num_accepted_tokens"].copy()}
