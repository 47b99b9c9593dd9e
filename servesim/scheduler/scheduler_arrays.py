"""A rank's scheduler arrays as named bundles (servesim/bundles.py):
`SchedulerArrays`, the first argument of every kernel of the scheduler
(servesim/scheduler/scheduler.py), read as `s.R`, `s.cfg`, ... where used, and
`KVArrays`, its optional last argument `kv`.

Fields:
- the request table every rank shares (scheduler/request.py): `R`, the
  requests' block identities `idents` and block tables `tables`;
- the rank's block pool (kvcache/block_pool.py): `blocks`, `idmap`, `pscal`;
- the rank's scheduler: its configuration `cfg` (one `CONFIG_DTYPE`
  record), its state `S` (one `STATE_DTYPE` record), `running`, the waiting
  queue `wq`, speculative decoding's arrays `spec`, and `held`, the
  finished requests whose blocks it holds for a decode worker
  (`S[0].num_delayed_free_requests` of them);
- the token log its outputs are released into (engine/release.py's
  `TokenLog`, every rank of a worker sharing it): `client_ms`,
  `token_offsets`, `last_client`, `detokenize_ms`.

The state of loads that wait ahead of the queue and of the CPU tier is not a
field: the kernels take it as an argument, `kv`, None on a rank without it,
so that its code is compiled away there. It is a `KVArrays`:
- `wfk`: the requests waiting for their load (vLLM's WAITING_FOR_REMOTE_KVS),
  `S[0].num_waiting_for_kv` of them, in the order their loads were queued;
- `KO`, `KC`: what a call decided, `KO[row, :KC[row]]` for each of fast.py's
  KO rows (loads, stores, new blocks, ...);
- the CPU tier's arrays (kvcache/cpu_tier.py `TierArrays`): `tier`,
  `slot_of`, `free_slots`, the transfer jobs `jobs`, `job_times`,
  `job_blocks`, its scalars `KS` (one `TIER_DTYPE` record), the transfer
  lanes `lanes`, the stores reading G1 blocks `storing`; a disaggregated decode rank has an
  empty tier, which its code never touches.
The tier's job arrays grow (`TierArrays.ensure_room`): the bundle is made
again then (`RankScheduler._kv`).
"""

import numpy as np
from numba.experimental import structref

from servesim.bundles import BundleType, declare
from servesim.jit import njit

# the kernels' configuration: one record, `cfg[0]`
CONFIG_DTYPE = np.dtype([
    ("max_num_seqs", np.int64),
    ("max_num_batched_tokens", np.int64),
    ("max_model_len", np.int64),
    ("enable_chunked_prefill", np.int64),
    ("long_prefill_token_threshold", np.int64),
    ("priority_scheduling", np.int64),
    ("reserve_full_isl", np.int64),
    ("watermark_blocks", np.int64),
    ("async_scheduling", np.int64),
    ("block_size", np.int64),
    ("enable_caching", np.int64),
    ("num_usable_blocks", np.int64),
    ("num_speculative_tokens", np.int64),
    ("num_lookahead_tokens", np.int64),
    ("num_hash_lookahead_tokens", np.int64),
    ("spec_seed", np.int64),
    ("kv_source", np.int64),
    ("invariant_check", np.int64),
])
KV_SOURCE_NONE, KV_SOURCE_CPU, KV_SOURCE_REMOTE = range(3)
# one rank's scalar state: one record, `S[0]` (the waiting queue's head and length first)
STATE_DTYPE = np.dtype([
    ("waiting_head", np.int64),
    ("num_waiting", np.int64),
    ("num_running", np.int64),
    ("num_preemptions", np.int64),
    ("prefix_queries", np.int64),
    ("prefix_hits", np.int64),
    ("preempted_queries", np.int64),
    ("preempted_hits", np.int64),
    ("preemptions_since_token", np.int64),
    ("num_waiting_for_kv", np.int64),
    ("num_delayed_free_requests", np.int64),
    ("num_checked_passes", np.int64),
    ("pending_prefill_tokens", np.int64),  # `pending_prefill_tokens`, kept as it changes
])


FIELDS = ("R", "idents", "tables", "blocks", "idmap", "pscal", "cfg", "S", "running", "wq",
          "spec", "held", "client_ms", "token_offsets", "last_client", "detokenize_ms", "events")


class SchedulerArraysType(BundleType):
    pass


class SchedulerArrays(structref.StructRefProxy):
    """A rank's scheduler arrays, in the order of `FIELDS` (make with
    `new_scheduler_arrays`)."""


@njit
def _new_scheduler_arrays(*fields):
    return SchedulerArrays(*fields)


new_scheduler_arrays = declare(SchedulerArraysType, SchedulerArrays, FIELDS,
                               _new_scheduler_arrays)


KV_FIELDS = ("wfk", "KO", "KC", "tier", "slot_of", "free_slots", "jobs", "job_times",
             "job_blocks", "KS", "lanes", "storing")


class KVArraysType(BundleType):
    pass


class KVArrays(structref.StructRefProxy):
    """A rank's `kv` state, in the order of `KV_FIELDS` (make with
    `new_kv_arrays`)."""


@njit
def _new_kv_arrays(*fields):
    return KVArrays(*fields)


new_kv_arrays = declare(KVArraysType, KVArrays, KV_FIELDS, _new_kv_arrays)
