"""A rank's scheduler arrays as named bundles (servesim/bundles.py):
`SchedulerArrays`, the first argument of every kernel of the scheduler
(servesim/scheduler/fast.py), read as `s.R`, `s.cfg`, ... where used, and
`KVArrays`, its optional last argument `kv`.

Fields:
- the request table every rank shares (scheduler/fast_table.py): `R`, the
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
- the CPU tier's arrays (kvcache/cpu_tier_kernels.py `TierArrays`): `tier`,
  `slot_of`, `free_slots`, the transfer jobs `jobs`, `job_times`,
  `job_blocks`, its scalars `KS`, the transfer lanes `lanes`, the stores
  reading G1 blocks `storing`, and `KF`; a disaggregated decode rank has an
  empty tier, which its code never touches.
The tier's job arrays grow (`TierArrays.ensure_room`): the bundle is made
again then (`FastScheduler._kv`).
"""

from numba.experimental import structref

from servesim.bundles import BundleType, declare
from servesim.jit import njit

FIELDS = ("R", "idents", "tables", "blocks", "idmap", "pscal", "cfg", "S", "running", "wq",
          "spec", "held", "client_ms", "token_offsets", "last_client", "detokenize_ms")


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
             "job_blocks", "KS", "lanes", "storing", "KF")


class KVArraysType(BundleType):
    pass


class KVArrays(structref.StructRefProxy):
    """A rank's `kv` state, in the order of `KV_FIELDS` (make with
    `new_kv_arrays`)."""


@njit
def _new_kv_arrays(*fields):
    return KVArrays(*fields)


new_kv_arrays = declare(KVArraysType, KVArrays, KV_FIELDS, _new_kv_arrays)
