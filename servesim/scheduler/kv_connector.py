"""The scheduler's KV-connector hooks (vLLM's `KVConnectorBase_V1` calls in
vllm/v1/core/sched/scheduler.py; docs/engine.md §9, §13): where the scheduler
asks a connector, for either source of loads that wait ahead of the queue.

- the CPU tier (kvcache/cpu_tier.py): `_connector_lookup`
  (`get_num_new_matched_tokens`), `_connector_prepare_load`
  (`update_state_after_alloc`), `_prepare_store` / `_connector_after_schedule`
  (`_get_reqs_to_store`), `_store_on_free`, `_connector_request_finished`
  (`request_finished`), `_note_new_blocks` (the G1 blocks a pass writes);
- the remote source of a disaggregated decode worker (engine/kv_handoff.py):
  `_remote_lookup`, `_remote_prepare_load`, `_remote_admitted`; and on the
  prefill worker `free_delayed` (vLLM's `_update_from_kv_xfer_finished`).

What a call decided goes to the `kv.KO` rows (output.py).

The connectors mirrored: `OffloadingConnectorScheduler`
(vllm/distributed/kv_transfer/kv_connector/v1/offloading_connector.py) and
`NixlConnectorScheduler` (vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py).
"""



from servesim.jit import njit
from servesim.kvcache import cpu_tier as ct
from servesim.scheduler.request import KVHandoff
from servesim.scheduler.kv_cache_manager import _free
from servesim.scheduler.output import KO_LOADS, KO_NEW_BLOCKS, KO_STORES, N_SCHED, O_REQ


@njit(inline="always")  # (called only where `kv` exists)
def _note_new_blocks(s, kv, i, first):
    """servesim's own: the blocks request i just took from the free queue for
    a pass (not for a load) noted in KO_NEW_BLOCKS (docs/engine.md §9).

    - They are its table's entries from `first` on.
    - The pass writes them, so it starts no earlier than the CPU tier's
      stores still reading them.
    - vLLM's offloading connector reads them from the pass's new block ids,
      after `allocate_slots`.
    """
    R, tables, KO, KC = s.R, s.tables, kv.KO, kv.KC
    n = KC[KO_NEW_BLOCKS]
    off = R[i].block_offset
    if n + R[i].num_held_blocks - first > KO.shape[1]:
        raise RuntimeError("KO_NEW_BLOCKS overflows")
    for k in range(off + first, off + R[i].num_held_blocks):
        KO[KO_NEW_BLOCKS, n] = tables[k]
        n += 1
    KC[KO_NEW_BLOCKS] = n


@njit
def _remote_lookup(s, i, num_hit):
    """`NixlConnectorScheduler.get_num_new_matched_tokens`: a decode rank's
    remote lookup for the handed-off head i past its G1 hit of `num_hit`
    blocks.

    - Its prompt's KV is held by the prefill rank.
    - Returns the rest of the prompt's blocks, partial last block included
      (`P - hit` tokens).
    """
    return max(0, -(-s.R[i].num_prompt_tokens // s.cfg[0].block_size) - num_hit)


@njit
def _remote_prepare_load(s, kv, i):
    """`NixlConnectorScheduler.update_state_after_alloc`: a decode rank's
    pull of request i's prompt past its G1 hit, which `_queue_load` admitted,
    goes out at this decision (KO_LOADS)."""
    KO, KC = kv.KO, kv.KC
    s.R[i].kv_handoff = KVHandoff.PULLING
    KO[KO_LOADS, KC[KO_LOADS]] = i
    KC[KO_LOADS] += 1


@njit
def _remote_admitted(s, kv, i):
    """`NixlConnectorScheduler.update_state_after_alloc`: a decode rank admits
    handed-off request i.

    - If it pulled nothing (no external tokens: a full prefix-cache hit)
      while the prefill rank still holds its blocks, a notice (no bytes,
      KO_LOADS) releases them, sent at this decision like a pull.
    """
    R = s.R
    if R[i].kv_handoff == KVHandoff.HELD:
        KO, KC = kv.KO, kv.KC
        KO[KO_LOADS, KC[KO_LOADS]] = i
        KC[KO_LOADS] += 1
    R[i].kv_handoff = 0


# -- the CPU tier's connector hooks (docs/engine.md §9; cpu_tier.py) -------


@njit
def _connector_lookup(s, kv, i, num_hit):
    """`OffloadingConnectorScheduler.get_num_new_matched_tokens`: for the
    waiting head i past its G1 hit of `num_hit` blocks, the blocks to load,
    or -1 when it must wait."""
    R = s.R
    off = R[i].block_offset
    return ct.get_num_new_matched_tokens(kv.tier, kv.slot_of,
                                         s.idents[off:off + R[i].block_capacity],
                                         R[i].num_tokens, kv.KS[0].block_size, num_hit)


@njit
def _connector_prepare_load(s, kv, i, first_block, num_blocks):
    """`OffloadingConnectorScheduler.update_state_after_alloc`: the CPU-tier
    load of a request `_queue_load` admitted (KO_LOADS)."""
    KO, KC = kv.KO, kv.KC
    off = s.R[i].block_offset
    end = off + s.R[i].block_capacity
    j = ct.update_state_after_alloc(kv.tier, kv.slot_of, kv.jobs, kv.job_times, kv.job_blocks,
                                    kv.KS, i, s.idents[off:end], s.tables[off:end], first_block,
                                    num_blocks)
    KO[KO_LOADS, KC[KO_LOADS]] = j
    KC[KO_LOADS] += 1


@njit
def _prepare_store(s, kv, i, first_block, stop_block):
    """`OffloadingConnectorScheduler._get_reqs_to_store`: the store job of
    request i's blocks `[first_block, stop_block)` not in the tier yet, over
    its table (`cpu_tier.prepare_store`: a job id, NO_JOB or EMPTY_JOB)."""
    off = s.R[i].block_offset
    end = off + s.R[i].block_capacity
    return ct.prepare_store(kv.tier, kv.slot_of, kv.free_slots, kv.jobs, kv.job_times,
                            kv.job_blocks, kv.KS, s.idents[off:end], s.tables[off:end],
                            first_block, stop_block)


@njit
def _store_on_free(s, kv, i):
    """servesim's own: the `simple_cpu` connector's store job of a finishing
    or preempted request's full computed blocks not yet in the tier; < 0 if
    nothing to store or no room (docs/engine.md §9)."""
    if kv.KS[0].fill:
        return ct.EMPTY_JOB
    R = s.R
    full = min(R[i].num_computed_tokens, R[i].num_tokens) // kv.KS[0].block_size
    return _prepare_store(s, kv, i, 0, full)


@njit
def _connector_after_schedule(s, out, feats, kv):
    """`OffloadingConnectorScheduler._get_reqs_to_store`: the CPU-tier
    bookkeeping of a decided pass (docs/engine.md §7, §9).

    - Under async scheduling its requests are now in flight.
    - With the `offloading` connector each scheduled request's blocks full
      after this pass (known tokens only) and not yet in the tier become one
      store job, going out at the pass end.
    - A job the tier has no room for is dropped and tried again next pass.
    """
    R, cfg = s.R, s.cfg
    KO, KC, KS = kv.KO, kv.KC, kv.KS
    bs = cfg[0].block_size
    for e in range(feats[N_SCHED]):
        i = out[O_REQ, e]
        if cfg[0].async_scheduling:
            R[i].num_passes_in_flight += 1
        if not KS[0].fill:
            continue
        full = min(R[i].num_computed_tokens, R[i].num_tokens) // bs
        if full > R[i].cpu_store_cursor:
            j = _prepare_store(s, kv, i, R[i].cpu_store_cursor, full)
            if j != ct.NO_JOB:
                R[i].cpu_store_cursor = full
                if j >= 0:
                    KO[KO_STORES, KC[KO_STORES]] = j
                    KC[KO_STORES] += 1


@njit
def _connector_request_finished(s, kv, i):
    """`OffloadingConnectorScheduler.request_finished`: the CPU-tier store
    that goes out with a finishing request's free, or < 0.

    - vLLM: the connector's `request_finished`, then its store jobs at the
      next step (offloading_connector.py).
    - `simple_cpu`: its full computed blocks not yet in the tier.
    - `offloading` under async scheduling: the blocks full within its
      computed tokens that its pass stores could not take (its last pass was
      decided while the token it computed was a placeholder), so it stores as
      many blocks as a sync engine, one pass later.
    - `offloading`, sync: nothing; its last pass already stored every block
      full at its end.
    """
    R, cfg = s.R, s.cfg
    if not kv.KS[0].fill:
        return _store_on_free(s, kv, i)
    if not cfg[0].async_scheduling:
        return ct.EMPTY_JOB
    full = min(R[i].num_computed_tokens, R[i].num_tokens) // cfg[0].block_size
    if full <= R[i].cpu_store_cursor:
        return ct.EMPTY_JOB
    j = _prepare_store(s, kv, i, R[i].cpu_store_cursor, full)
    if j >= 0:
        R[i].cpu_store_cursor = full
    return j


@njit
def free_delayed(s, i):
    """`Scheduler._update_from_kv_xfer_finished` (vllm/v1/core/sched/scheduler.py):
    a prefill rank's delayed free, for `finished_sending` (docs/engine.md §13).

    - The transfer of handed-off request i's KV is done: its held blocks are
      freed and it leaves `held`.
    """
    S, held = s.S, s.held
    _free(s, i)
    kept = 0
    for k in range(S[0].num_delayed_free_requests):
        if held[k] != i:
            held[kept] = held[k]
            kept += 1
    S[0].num_delayed_free_requests = kept
