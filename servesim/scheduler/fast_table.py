"""Request state as a structure of arrays, for the compiled scheduler
(`servesim.scheduler.fast`): one column per request, indexed by its position in
the workload; all ranks share one table (a request lives on one rank).

`R[i, FIELD]` holds the integer state of request i (the fields of vLLM's
`Request`, vllm/v1/request.py), `F[i, FIELD]` its times; rows
are requests so one request's state shares a cache line or two.
`idents[offset:offset + capacity]` are its block identities and
`tables[offset:offset + capacity]` its block table, where `offset =
R[i, OFFSET]` and the capacity covers its prompt plus its output cap.
"""

import numpy as np

from servesim.scheduler.request import RequestStatus

(PROMPT, MAX_TOKENS, NUM_TOKENS, COMPUTED, PLACEHOLDERS, PREEMPTIONS, STATUS,
 PREFILL_TARGET, MAX_COMPUTED, RECOMPUTED, FIRST_CACHED, NUM_BLOCKS, NUM_CACHED,
 PRIORITY, ID_RANK, FIRST_TOKEN_PASS, FINISH_PASS, OFFSET, CAPACITY,
 SPEC, SPEC_PASSES, SPEC_DRAFTED, SPEC_ACCEPTED,
 KV_LOAD, KV_G1_HIT, CPU_CURSOR, IN_FLIGHT, CPU_CACHED, REMOTE_DECODE, KV_HANDOFF) = range(30)
NUM_INT_FIELDS = 30
# speculative decoding (servesim/scheduler/speculative.py): SPEC drafts held
# (vLLM's `len(spec_token_ids)`), SPEC_PASSES passes that verified real drafts,
# SPEC_DRAFTED / SPEC_ACCEPTED real drafts scheduled / accepted
# loads that wait ahead of the queue (WAITING_FOR_REMOTE_KVS, docs/engine.md §9):
# KV_LOAD is KV_NONE, KV_IN_FLIGHT from the admission that queues the load until
# its source (the CPU tier, or a remote worker) sets KV_LANDED; KV_G1_HIT the G1
# hit (tokens) when it was queued. CPU tier: CPU_CURSOR the blocks the
# `offloading` connector has considered for storing since the admission,
# IN_FLIGHT the passes in flight that schedule it (async scheduling),
# CPU_CACHED the tokens it got from the tier
KV_NONE, KV_IN_FLIGHT, KV_LANDED = range(3)
# disaggregated serving (servesim/engine/fast_disagg.py, docs/engine.md §13): on a
# prefill worker REMOTE_DECODE marks a request handed off after its first token
# (its blocks are then held, not freed, when it finishes); on a decode worker
# KV_HANDOFF is a handed-off request's state until its admission: HANDOFF_HELD
# (the prefill worker holds its prompt's KV), HANDOFF_PULLING (its pull is
# queued), HANDOFF_NOTHING (nothing held: computed here), 0 once admitted
# (vLLM's `do_remote_prefill` done)
HANDOFF_HELD, HANDOFF_NOTHING, HANDOFF_PULLING = 1, 2, 3
ARRIVAL, FIRST_SCHEDULED = range(2)
NUM_FLOAT_FIELDS = 2

WAITING = int(RequestStatus.WAITING)
RUNNING = int(RequestStatus.RUNNING)
PREEMPTED = int(RequestStatus.PREEMPTED)
FINISHED = int(RequestStatus.FINISHED)
UNFINISHED = int(RequestStatus.UNFINISHED)


class RequestTable:
    def __init__(self, request_ids, prompt, max_tokens, priority, idents, ident_offsets,
                 accepted_offsets=None, accepted_values=None):
        n = len(request_ids)
        R = np.zeros((n, NUM_INT_FIELDS), dtype=np.int64)
        R[:, PROMPT] = prompt
        R[:, MAX_TOKENS] = max_tokens
        R[:, NUM_TOKENS] = prompt
        R[:, STATUS] = WAITING
        R[:, PREFILL_TARGET] = prompt
        R[:, FIRST_CACHED] = -1
        R[:, PRIORITY] = priority
        # vLLM's priority queue breaks ties on the request id, as a string
        order = sorted(range(n), key=request_ids.__getitem__)
        R[order, ID_RANK] = np.arange(n)
        R[:, FIRST_TOKEN_PASS] = -1
        R[:, FINISH_PASS] = -1
        R[:, OFFSET] = ident_offsets[:-1]
        R[:, CAPACITY] = np.diff(ident_offsets)
        self.R = R
        self.F = np.full((n, NUM_FLOAT_FIELDS), np.nan)
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

    def request_keys(self):
        """A key per request from its id (CRC-32), for draws that must not
        depend on where the request stands in the workload."""
        import zlib

        return np.array([zlib.crc32(str(rid).encode()) for rid in self.request_ids],
                        dtype=np.int64)

    def results(self):
        """Per-request result arrays (the driver's record columns)."""
        R = self.R
        return {
            "output_tokens": R[:, NUM_TOKENS] - R[:, PROMPT],
            "num_preemptions": R[:, PREEMPTIONS].copy(),
            "first_admission_cached_tokens": np.maximum(R[:, FIRST_CACHED], 0),
            "cpu_tier_cached_tokens": R[:, CPU_CACHED].copy(),
            "recomputed_tokens": R[:, RECOMPUTED].copy(),
            "first_scheduled_ms": self.F[:, FIRST_SCHEDULED].copy(),
            "first_token_pass": R[:, FIRST_TOKEN_PASS].copy(),
            "finish_pass": R[:, FINISH_PASS].copy(),
        }

    def spec_results(self):
        """Per-request speculative-decoding counters: real drafts scheduled
        and accepted (padding drafts are not counted)."""
        return {"spec_drafted": self.R[:, SPEC_DRAFTED].copy(),
                "spec_accepted": self.R[:, SPEC_ACCEPTED].copy()}
