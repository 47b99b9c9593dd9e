"""A pass's `SchedulerOutput` (vllm/v1/core/sched/output.py) as the scheduler's
kernels write it:

    out[ROW, e], for the pass's scheduled entries e
      O_REQ     request index          O_FLAGS  F_SAMPLES: the entry samples a token
      O_TOK     tokens scheduled       O_SPEC   of them, draft tokens
      O_CACHED  prefix-cache hits      O_PRE    preempted requests (N_PRE of them)
      O_KIND    a PassKind             O_UNFIN  unfinishable requests (N_UNFIN)
    feats[...]  the pass's counts and pricing features (N_SCHED ... PREFILL_SPEC)
    kv.KO[row, :kv.KC[row]]  the transfers a call decided (KO_LOADS ... KO_NEW_BLOCKS)
"""

import enum





O_REQ, O_TOK, O_CACHED, O_KIND, O_FLAGS, O_SPEC, O_PRE, O_UNFIN = range(8)
NUM_OUT_ROWS = 8  # O_SPEC: draft tokens scheduled (included in O_TOK)


class PassKind(enum.IntEnum):
    """How a scheduled entry entered the pass (`out[O_KIND, e]`)."""
    NEW = 0
    RESUMED = 1
    RUNNING = 2


KIND_NAMES = ("new", "resumed", "running")  # the pass log's `kind`, by `PassKind`
F_SAMPLES = 1  # flags of an entry
# feats
(N_SCHED, N_PRE, N_UNFIN, PREFILL_TOKENS, NUM_PREFILL, DECODE_REQS, DECODE_CTX,
 TOTAL_TOKENS, FREE_BLOCKS, SPEC_TOKENS, PREFILL_CTX, PREFILL_SPEC) = range(12)
# SPEC_TOKENS: draft tokens scheduled (included in TOTAL_TOKENS); PREFILL_SPEC:
# those of prefill requests (an admission's padding, included in PREFILL_TOKENS)
NUM_FEATS = 12
# `kv`, the optional last argument of `schedule` and `update_from_output`: the
# state of loads that wait ahead of the queue and of the CPU tier, a `KVArrays`
# (scheduler/scheduler_arrays.py) — `kv.wfk[:S[0].num_waiting_for_kv]`
# the requests waiting for their load (vLLM's WAITING_FOR_REMOTE_KVS) in the
# order their loads were queued; `kv.KO[row, :kv.KC[row]]` what a call decided:
(KO_LOADS, KO_LOAD_REQS, KO_PSTORES, KO_STORES, KO_FSTORES, KO_NEW_BLOCKS) = range(6)
NUM_KO_ROWS = 6
# KO_LOADS: CPU-tier load jobs queued (going out at the decision); KO_LOAD_REQS:
# the requests whose loads were queued, whatever the source; KO_PSTORES:
# `simple_cpu` preemption stores (at the decision); KO_STORES: `offloading`
# stores of the pass (at its end); KO_FSTORES: stores of finished requests (set
# by update_from_output); KO_NEW_BLOCKS: G1 blocks the pass took from the free
# queue (it writes them). With `kv` None none of this exists (compiled away).
