"""vLLM's `Scheduler` (vllm/v1/core/sched/scheduler.py, async_scheduler.py;
docs/engine.md §3-7) as Numba kernels over one rank's arrays, so that a pass
costs a few microseconds of Python whatever its batch size.

- `schedule`: the running loop (`_schedule_running`, preempting with
  `_preempt`), then the waiting loop (`_schedule_waiting`, `_admit`), then the
  loads that wait ahead of the queue (`_queue_load`, `_schedule_loaded`:
  vLLM's `_update_waiting_for_remote_kv`), then `_update_after_schedule`.
- `update_from_output`: tokens appended (`_append_token`), drafts verified
  (drafts.py), stops, finished requests freed.
- `take_out_all`: a livelocked rank's requests taken out as unfinished.

Every kernel takes the rank's arrays as one bundle, `s` (a `SchedulerArrays`,
scheduler_arrays.py), read under their names where used (`s.R[i].num_computed_tokens`,
`s.cfg[0]`, `s.S[0]`, `s.running`, `s.wq`); then what the call is about (the
pass's `out` and `feats`, output.py; a request index; a budget), and last the
optional `kv` (`KVArrays`): loads that wait ahead of the queue and the CPU
tier, compiled away when None. The KV cache manager's kernels are
kv_cache_manager.py, the connector's hooks kv_connector.py.

tests/test_engine_rules.py holds these kernels to hand-worked timelines rule
by rule, tests/test_golden.py to vLLM's recorded schedules.

NOTE(refcounts): `schedule` and `update_from_output` are entry points compiled
without reference counts (servesim/jit.py); `_schedule_waiting` and the debug
mode's `_check_after` / `_check_holders` allocate, so they count their own.
"""

import numpy as np

from servesim.jit import njit
from servesim.kvcache import block_pool as bp
from servesim.scheduler import check
from servesim.scheduler.request_queue import wq_add, wq_peek, wq_pop, wq_prepend, wq_remove
from servesim.scheduler.request import KVHandoff, KVLoad, RequestStatus
from servesim.scheduler.drafts import _padding_drafts, _verify_drafts, scheduled_drafts
from servesim.scheduler.kv_cache_manager import _allocate, _free, cache_blocks, fits_the_pool
from servesim.scheduler.kv_connector import (_connector_after_schedule, _connector_lookup,
                                             _connector_prepare_load, _connector_request_finished,
                                             _note_new_blocks, _remote_admitted, _remote_lookup,
                                             _remote_prepare_load, _store_on_free)
from servesim.scheduler.output import (DECODE_CTX, DECODE_REQS, FREE_BLOCKS, F_SAMPLES, KO_FSTORES,
                                       KO_LOAD_REQS, KO_PSTORES, NUM_KO_ROWS, NUM_PREFILL, N_PRE,
                                       N_SCHED, N_UNFIN, O_CACHED, O_FLAGS, O_KIND, O_PRE, O_REQ,
                                       O_SPEC, O_TOK, O_UNFIN, PREFILL_CTX, PREFILL_SPEC,
                                       PREFILL_TOKENS, PassKind, SPEC_TOKENS, TOTAL_TOKENS)
from servesim.scheduler.scheduler_arrays import KV_SOURCE_CPU, KV_SOURCE_REMOTE


# A rank that preempts this many times without sampling a single token is
# livelocked (e.g. two prefills of equal priority preempting each other: vLLM
# picks the victim with max(), the earliest of equals, which is the one that
# has run longer): its requests are taken out as unfinished (`take_out_all`).
LIVELOCK_PREEMPTIONS = 1000

@njit
def _victim_index(s, n, priority):
    """`Scheduler.schedule`: the running loop's preemption victim, its index
    among the first n of `running` (docs/engine.md §3).

    - FCFS: the last request in `running`.
    - Priority: the running request with the largest `(priority, arrival)`,
      the earliest of equals (vLLM's `max()`).
    """
    R, running = s.R, s.running
    if not priority:
        return n - 1
    best = 0
    for k in range(1, n):
        a, b = running[k], running[best]
        if (R[a].priority > R[b].priority
                or (R[a].priority == R[b].priority and R[a].arrival_time > R[b].arrival_time)):
            best = k
    return best


@njit
def _preempt(s, i, kv=None):
    """`Scheduler._preempt_request`: request i frees every block and goes back
    to the front of `waiting` (priority: back into the heap; docs/engine.md §6).

    - Its computed tokens, placeholders and drafts drop to 0; it keeps the
      tokens it generated.
    - With the `simple_cpu` connector its full computed blocks are stored
      first (docs/engine.md §9; KO_PSTORES).
    """
    R, S = s.R, s.S
    if kv is not None:
        if s.cfg[0].kv_source == KV_SOURCE_CPU:
            j = _store_on_free(s, kv, i)
            if j >= 0:
                KO, KC = kv.KO, kv.KC
                KO[KO_PSTORES, KC[KO_PSTORES]] = j
                KC[KO_PSTORES] += 1
    S[0].pending_prefill_tokens -= _prefill_left(R, i)  # it left running
    _free(s, i)
    R[i].status = RequestStatus.PREEMPTED
    R[i].num_computed_tokens = 0
    R[i].num_output_placeholders = 0
    R[i].num_spec_tokens = 0
    R[i].num_preemptions += 1
    S[0].num_preemptions += 1
    S[0].preemptions_since_token += 1
    wq_prepend(R, S, s.wq, s.cfg[0].priority_scheduling, i)


@njit
def _schedule_running(s, out, feats, budget, threshold, kv=None):
    """`Scheduler.schedule`: the running loop (docs/engine.md §3 steps 1-4, §6);
    returns the budget left.

    - With a CPU tier under async scheduling a victim that the pass in flight
      runs would free its blocks only after that pass: the preemption loop
      stops there and the request waits a pass (§7; priority goes on with the
      next request).
    """
    R, cfg, S, running = s.R, s.cfg, s.S, s.running
    priority = cfg[0].priority_scheduling
    index = 0
    no_hits = running[:0]  # (a view: no allocation, in every pass)
    while index < S[0].num_running and budget > 0:
        i = running[index]
        placeholders = R[i].num_output_placeholders
        computed = R[i].num_computed_tokens
        if (placeholders > 0 and computed + 2 - placeholders
                >= R[i].num_prompt_tokens + R[i].max_tokens):
            index += 1
            continue
        num_new = R[i].num_tokens + R[i].num_spec_tokens + placeholders - computed
        if 0 < threshold < num_new:
            num_new = threshold
        num_new = min(num_new, budget, cfg[0].max_model_len - 1 - computed)
        if num_new <= 0:
            index += 1
            continue
        scheduled = True
        while True:
            held = R[i].num_held_blocks
            if _allocate(s, i, num_new, no_hits, 0, 0, 0):
                if kv is not None:
                    _note_new_blocks(s, kv, i, held)
                break
            n_run = S[0].num_running
            v = _victim_index(s, n_run, priority)
            victim = running[v]
            if kv is not None:
                if R[victim].num_passes_in_flight > 0:  # only counted with a CPU tier, async
                    index += 1
                    scheduled = False
                    break
            for k in range(v, n_run - 1):
                running[k] = running[k + 1]
            S[0].num_running = n_run - 1
            if v < index:
                index -= 1
            for e in range(feats[N_SCHED]):  # the victim leaves this pass
                if out[O_REQ, e] == victim:
                    budget += out[O_TOK, e]
                    n = feats[N_SCHED]
                    for k in range(e, n - 1):
                        for row in range(O_PRE):
                            out[row, k] = out[row, k + 1]
                    feats[N_SCHED] = n - 1
                    break
            _preempt(s, victim, kv)
            out[O_PRE, feats[N_PRE]] = victim
            feats[N_PRE] += 1
            if victim == i:
                # alone and still too big: it never fits (blocks held for a
                # load, or on a prefill worker for a transfer, come back)
                if (S[0].num_running == 0 and S[0].num_delayed_free_requests == 0
                        and (kv is None or S[0].num_waiting_for_kv == 0)):
                    wq_remove(R, S, s.wq, priority, i)
                    R[i].status = RequestStatus.UNFINISHED
                    out[O_UNFIN, feats[N_UNFIN]] = i
                    feats[N_UNFIN] += 1
                scheduled = False
                break
        if scheduled:
            e = feats[N_SCHED]
            out[O_REQ, e] = i
            out[O_TOK, e] = num_new
            out[O_CACHED, e] = 0
            out[O_KIND, e] = PassKind.RUNNING
            out[O_SPEC, e] = scheduled_drafts(R, i, num_new)
            feats[N_SCHED] = e + 1
            budget -= num_new
            index += 1
        elif not priority:
            break
    return budget


@njit(inline="always")
def _admission_reserve(s, i):
    """servesim's own: what an admission's `allocate_slots` checks beyond its
    own slots (docs/engine.md §3-4); returns `(reserve_tokens, extra_blocks)`.

    - With `reserve_full_isl`: the whole prompt's blocks.
    - When requests are already running: the watermark's free blocks.
    """
    cfg = s.cfg
    reserve = s.R[i].num_tokens if cfg[0].reserve_full_isl else 0
    extra = cfg[0].watermark_blocks if s.S[0].num_running > 0 else 0
    return reserve, extra


@njit(inline="always")
def _admission_tokens(cfg, num_new, threshold, budget):
    """`Scheduler.schedule`: in the waiting loop, an admission's tokens this
    pass (docs/engine.md §3).

    - At most `long_prefill_token_threshold` (when set) and the budget.
    - Without chunked prefill a prompt that does not fit the budget whole
      stops the loop (-1).
    """
    if 0 < threshold < num_new:
        num_new = threshold
    if not cfg[0].enable_chunked_prefill and num_new > budget:
        return -1
    return min(num_new, budget)


@njit(_nrt=True)  # NOTE(refcounts): it allocates (`hits`, `skipped`), reached uncounted
def _schedule_waiting(s, out, feats, budget, threshold, kv=None):
    """`Scheduler.schedule`: the waiting loop, admission strict head of line
    (docs/engine.md §3).

    - With `kv`, requests whose loads were queued come first
      (`_schedule_loaded`).
    - With a CPU tier a head with blocks in the tier past its G1 hit queues a
      load instead (`_queue_load`, §9).
    - A head that must wait for a store or another load to finish is skipped
      this pass (put back at the front, in order, after the loop).
    """
    R, cfg, S, wq = s.R, s.cfg, s.S, s.wq
    priority = cfg[0].priority_scheduling
    bs = cfg[0].block_size
    num_skipped = 0
    skipped = s.running[:0]  # (a view: no allocation, but with a CPU tier)
    if kv is not None:
        if S[0].num_waiting_for_kv > 0:
            budget = _schedule_loaded(s, out, feats, budget, threshold, kv)
        if cfg[0].kv_source == KV_SOURCE_CPU:  # (only the tier's lookups skip a request)
            skipped = np.empty(S[0].num_waiting, dtype=np.int64)
    while S[0].num_waiting > 0 and budget > 0 and S[0].num_running < cfg[0].max_num_seqs:
        i = wq_peek(S, wq, priority)
        num_tokens = R[i].num_tokens
        if not fits_the_pool(cfg, num_tokens):
            # preempted after outgrowing the pool: it can never be admitted again
            if feats[N_UNFIN] == out.shape[1]:
                break
            wq_pop(R, S, wq, priority)
            R[i].status = RequestStatus.UNFINISHED
            out[O_UNFIN, feats[N_UNFIN]] = i
            feats[N_UNFIN] += 1
            continue
        num_hit = 0
        hits = np.zeros(0, dtype=np.int64)
        if cfg[0].enable_caching:
            # `get_computed_blocks`: the leading blocks already cached, never
            # covering the last token (`min(cached run, (num_tokens - 1) // bs)`)
            max_blocks = (num_tokens - 1) // bs
            hits = np.empty(max_blocks, dtype=np.int64)
            off = R[i].block_offset
            num_hit = bp.find_cached_prefix(s.blocks, s.idmap,
                                            s.idents[off:off + R[i].block_capacity],
                                            max_blocks, hits)
        if kv is not None:
            if cfg[0].kv_source == KV_SOURCE_CPU:
                num_loaded = _connector_lookup(s, kv, i, num_hit)
                if num_loaded < 0:  # wait for a store or another load
                    skipped[num_skipped] = wq_pop(R, S, wq, priority)
                    num_skipped += 1
                    continue
                if num_loaded > 0:
                    if not _queue_load(s, hits[:num_hit], num_hit, num_loaded * bs, kv, i):
                        break
                    _connector_prepare_load(s, kv, i, num_hit, num_loaded)
                    continue
            elif cfg[0].kv_source == KV_SOURCE_REMOTE and R[i].kv_handoff == KVHandoff.HELD:
                if _remote_lookup(s, i, num_hit) > 0:
                    # blocks for the whole sequence, the first token's slot too
                    if not _queue_load(s, hits[:num_hit], num_hit, num_tokens - num_hit * bs,
                                       kv, i):
                        break
                    _remote_prepare_load(s, kv, i)
                    continue
        hit = num_hit * bs
        num_new = _admission_tokens(cfg, num_tokens - hit, threshold, budget)
        if num_new < 0:
            break
        drafts = 0
        if num_new == 1 and cfg[0].num_speculative_tokens > 0 and num_tokens - hit == 1:
            drafts = _padding_drafts(s, out, feats, hit)
            if drafts > budget - 1:
                break
            num_new += drafts
        reserve, extra = _admission_reserve(s, i)
        held = R[i].num_held_blocks
        if not _allocate(s, i, num_new, hits[:num_hit], num_hit, reserve, extra):
            break
        if kv is not None:
            _note_new_blocks(s, kv, i, held + num_hit)
        wq_pop(R, S, wq, priority)
        _admit(s, out, feats, i, hit, num_new, hit, drafts, kv)
        budget -= num_new
    for k in range(num_skipped - 1, -1, -1):
        wq_prepend(R, S, wq, priority, skipped[k])


@njit
def _admit(s, out, feats, i, hit, num_new, g1_hit, drafts, kv=None):
    """`Scheduler.schedule`: the waiting loop's admission, request i moved to
    `running` with its entry in the pass.

    - `hit` tokens cached, `g1_hit` of them from G1 and the rest loaded
      (counted as the CPU tier's hit tokens with a CPU tier).
    - Its admission is recorded in the prefix-cache stats
      (`PrefixCacheStats`: G1 hits only, preempted requests apart).
    - A handed-off request's first admission on a disaggregated decode worker
      has its prompt's KV and its first token: its prefill is the prompt
      only, so the pass computing the first token's KV is a decode
      (docs/engine.md §10), and its source learns of the admission
      (`_remote_admitted`).
    """
    R, cfg, S = s.R, s.cfg, s.S
    num_tokens = R[i].num_tokens
    resumed = R[i].status == RequestStatus.PREEMPTED
    if resumed:
        S[0].preempted_queries += num_tokens
        S[0].preempted_hits += g1_hit
    else:
        S[0].prefix_queries += num_tokens
        S[0].prefix_hits += g1_hit
    if R[i].num_cached_tokens < 0:
        R[i].num_cached_tokens = hit
    target = num_tokens
    if kv is not None:
        if cfg[0].kv_source == KV_SOURCE_CPU:
            if hit > g1_hit:
                R[i].num_cpu_cached_tokens += hit - g1_hit
                kv.KS[0].hit_tokens += hit - g1_hit
            R[i].cpu_store_cursor = 0
        elif cfg[0].kv_source == KV_SOURCE_REMOTE and R[i].kv_handoff:
            target = R[i].num_prompt_tokens  # its first admission: the prefill is the prompt only
            _remote_admitted(s, kv, i)
    R[i].status = RequestStatus.RUNNING
    R[i].num_computed_tokens = hit
    R[i].prefill_target_tokens = target
    s.running[S[0].num_running] = i
    S[0].num_running += 1
    S[0].pending_prefill_tokens += _prefill_left(R, i)
    e = feats[N_SCHED]
    out[O_REQ, e] = i
    out[O_TOK, e] = num_new
    out[O_CACHED, e] = hit
    out[O_KIND, e] = PassKind.RESUMED if resumed else PassKind.NEW
    out[O_SPEC, e] = drafts
    feats[N_SCHED] = e + 1


# -- loads that wait ahead of the queue (WAITING_FOR_REMOTE_KVS) ----------------
# Shared by every source of KV (the CPU tier; a disaggregated decode worker's
# prefill workers): `_queue_load` admits a head as a load, its source marks
# the load landed (R[i].kv_load = KVLoad.LANDED), `_schedule_loaded` admits it.


@njit
def _queue_load(s, hits, num_hit, num_tokens, kv, i):
    """`Scheduler.schedule`: in the waiting loop, with `load_kv_async`, the
    admission of the waiting head i whose KV past its G1 hit of `num_hit`
    blocks comes from elsewhere (docs/engine.md §9, §13).

    - With the admission checks of §3 step 4 (`reserve_full_isl`, watermark)
      it takes its G1 blocks for the hit and for `num_tokens` more tokens,
      registered in the prefix cache only once loaded (`delay_cache`).
    - It leaves the waiting queue and waits in `waiting_for_kv`, using no
      budget, with R[i].kv_load = KVLoad.IN_FLIGHT until its source sets
      KVLoad.LANDED.
    - Its source prepares the transfer (KO_LOAD_REQS lists it).
    - False, changing nothing, if it does not fit.
    """
    R, cfg, S = s.R, s.cfg, s.S
    reserve, extra = _admission_reserve(s, i)
    if not _allocate(s, i, num_tokens, hits, num_hit, reserve, extra, True):
        return False
    wq_pop(R, S, s.wq, cfg[0].priority_scheduling)
    wfk, KO, KC = kv.wfk, kv.KO, kv.KC
    wfk[S[0].num_waiting_for_kv] = i
    S[0].num_waiting_for_kv += 1
    R[i].kv_load = KVLoad.IN_FLIGHT
    R[i].num_g1_hit_tokens = num_hit * cfg[0].block_size
    KO[KO_LOAD_REQS, KC[KO_LOAD_REQS]] = i
    KC[KO_LOAD_REQS] += 1
    return True


@njit
def _schedule_loaded(s, out, feats, budget, threshold, kv):
    """`Scheduler.schedule`: the requests in WAITING_FOR_REMOTE_KVS, in the
    order their loads were queued (`_update_waiting_for_remote_kv`).

    - One whose load has not landed is skipped.
    - One whose load landed counts its blocks as computed (`_finish_load`)
      and is admitted as a waiting head would be; it keeps its place if it
      does not fit, its load finished.
    - Returns the budget left, or 0 when a loaded request does not fit
      (strict head of line).
    """
    R, cfg, S = s.R, s.cfg, s.S
    wfk = kv.wfk
    k = 0
    while k < S[0].num_waiting_for_kv and budget > 0 and S[0].num_running < cfg[0].max_num_seqs:
        i = wfk[k]
        if R[i].kv_load == KVLoad.IN_FLIGHT:
            k += 1
            continue
        if R[i].kv_load == KVLoad.LANDED:
            _finish_load(s, i)
        num_new = _admission_tokens(cfg, R[i].num_tokens - R[i].num_computed_tokens,
                                    threshold, budget)
        if num_new < 0:
            return 0
        reserve, extra = _admission_reserve(s, i)
        held = R[i].num_held_blocks
        if not _allocate(s, i, num_new, np.zeros(0, dtype=np.int64), 0, reserve, extra):
            return 0
        _note_new_blocks(s, kv, i, held)
        n = S[0].num_waiting_for_kv - 1
        for m in range(k, n):
            wfk[m] = wfk[m + 1]
        S[0].num_waiting_for_kv = n
        _admit(s, out, feats, i, R[i].num_computed_tokens, num_new, R[i].num_g1_hit_tokens, 0,
               kv)
        budget -= num_new
    return budget


@njit
def _finish_load(s, i):
    """`Scheduler._update_waiting_for_remote_kv`: a landed load.

    - The request's blocks count as computed, all but the last token (which
      is recomputed).
    - They are registered in the prefix cache.
    """
    R = s.R
    computed = min(R[i].num_held_blocks * s.cfg[0].block_size, R[i].num_tokens)
    if computed == R[i].num_tokens:
        computed -= 1
    cache_blocks(s, i, computed)
    R[i].num_computed_tokens = computed
    R[i].kv_load = KVLoad.NONE


# -- a disaggregated decode worker's remote KV (docs/engine.md §13; engine/kv_handoff.py) --
# The source of a handed-off request's KV is the prefill rank holding it
# (R[i].kv_handoff); the transfers decided here (pulls, notices) are listed
# in KO_LOADS as request indices, in decision order, for the rank's receiver
# (engine/kv_handoff.py), which marks a landed pull KVLoad.LANDED.


@njit
def _update_after_schedule(s, out, feats):
    """`Scheduler._update_after_schedule`: each entry of the decided pass
    advances its request's computed tokens (docs/engine.md §2, §10).

    - Tokens computed again below the request's high mark
      (`max_num_computed_tokens`, draft positions not counted) count as
      recomputed (§6).
    - An entry that leaves nothing to compute samples (F_SAMPLES); under
      async scheduling it adds 1 + drafts placeholders and k placeholder
      drafts (`AsyncScheduler._update_after_schedule`, §7, §12).
    - The pass's features for pricing add up here, and the prefill tokens
      leave the rank's pending prefill (§10, §11).
    """
    R, cfg, S = s.R, s.cfg, s.S
    for e in range(feats[N_SCHED]):
        i = out[O_REQ, e]
        n = out[O_TOK, e]
        drafts = out[O_SPEC, e]
        before = R[i].num_computed_tokens
        after = before + n
        R[i].num_computed_tokens = after
        high = R[i].max_num_computed_tokens
        real = after - drafts  # draft positions are not counted as computed
        if before < high:
            R[i].num_recomputed_tokens += max(0, min(real, high) - before)
        if real > high:
            R[i].max_num_computed_tokens = real
        flags = 0
        if after >= R[i].num_tokens + R[i].num_output_placeholders:
            flags |= F_SAMPLES
            if cfg[0].async_scheduling:
                R[i].num_output_placeholders += 1 + drafts
                # AsyncScheduler: k placeholder drafts
                R[i].num_spec_tokens = cfg[0].num_speculative_tokens
        feats[TOTAL_TOKENS] += n
        feats[SPEC_TOKENS] += drafts
        if before < R[i].prefill_target_tokens:
            S[0].pending_prefill_tokens -= min(after, R[i].prefill_target_tokens) - before
            feats[PREFILL_TOKENS] += n
            feats[PREFILL_SPEC] += drafts
            feats[NUM_PREFILL] += 1
            feats[PREFILL_CTX] += before
        else:
            feats[DECODE_REQS] += 1
            feats[DECODE_CTX] += R[i].num_tokens
        out[O_FLAGS, e] = flags


@njit(_nrt=False)  # NOTE(refcounts): an entry point (servesim/jit.py)
def schedule(s, out, feats, kv=None, checking=None):
    """`Scheduler.schedule`: one pass decided for the rank `s` (a
    `SchedulerArrays`), filling `out` and `feats`.

    - With `kv`: the transfers it decided in `kv`'s KO rows (see above).
    - `checking` (None, or True in the debug mode) compiles the invariant
      check in only where it runs (`_check_after`).
    """
    cfg, S = s.cfg, s.S
    threshold = cfg[0].long_prefill_token_threshold
    waiting = S[0].num_waiting
    if kv is not None:
        waiting += S[0].num_waiting_for_kv
        KC = kv.KC
        for row in range(NUM_KO_ROWS):
            if row != KO_FSTORES:
                KC[row] = 0
    if S[0].num_running + waiting <= 1:
        threshold = 0
    budget = _schedule_running(s, out, feats, cfg[0].max_num_batched_tokens, threshold, kv)
    if feats[N_PRE] == 0 and waiting > 0:  # (nothing to admit: no call)
        _schedule_waiting(s, out, feats, budget, threshold, kv)
    _update_after_schedule(s, out, feats)
    if kv is not None:
        if cfg[0].kv_source == KV_SOURCE_CPU:
            _connector_after_schedule(s, out, feats, kv)
    feats[FREE_BLOCKS] = s.pscal[bp.NUM_FREE]
    if checking is not None:  # (compiled away when None)
        if cfg[0].invariant_check:
            _check_after(s, kv, out, feats, check.AFTER_SCHEDULE, -1)


@njit(_nrt=True)  # NOTE(refcounts): it allocates and hands back its array
def _check_holders(s, kv=None):
    """servesim's own: the requests that hold G1 blocks outside `running` and
    the waiting queue, for the debug mode's check (docs/engine.md §14).

    - Those in `waiting_for_kv`: a CPU-tier load or a remote pull in flight
      into blocks they took at admission (`_queue_load`;
      `kv.wfk[:S[0].num_waiting_for_kv]`).
    - On a disaggregated prefill worker, the finished requests whose blocks
      are held for the decode side (`held[:S[0].num_delayed_free_requests]`).
    - CPU-tier stores in flight hold none: they read G1 blocks without a
      reference (`storing`, cpu_tier.py), like vLLM's offloading connector.
    """
    S = s.S
    n_wfk = 0
    if kv is not None:
        n_wfk = S[0].num_waiting_for_kv
    n_held = S[0].num_delayed_free_requests
    others = np.zeros(n_wfk + n_held, dtype=np.int64)
    if kv is not None:
        others[:n_wfk] = kv.wfk[:n_wfk]
    others[n_wfk:] = s.held[:n_held]
    return others


@njit
def check_pass(s, others, out, feats, where, pass_index):
    """servesim's own: the debug mode's invariant check
    (servesim/scheduler/check.py, docs/engine.md §14) of this rank after a pass.

    - After `schedule()`: `feats` given, its entries checked too; the pass
      index is that of the pass decided, counted here.
    - After `update_from_output()` of pass `pass_index`: `feats` empty.
    - `others`: the requests holding blocks outside running and waiting
      (`_check_holders`).
    """
    S = s.S
    n_sched = -1
    total = 0
    capped = out[O_TOK, :0]
    if len(feats):
        n_sched = feats[N_SCHED]
        total = feats[TOTAL_TOKENS]
        pass_index = S[0].num_checked_passes
        if n_sched > 0:
            S[0].num_checked_passes += 1
        # the threshold caps an admission before its padding drafts
        capped = out[O_TOK, :n_sched].copy()
        for e in range(n_sched):
            if out[O_KIND, e] != PassKind.RUNNING:
                capped[e] -= out[O_SPEC, e]
    check.check_rank(s, others, out[O_REQ], out[O_TOK], capped, n_sched, total, where,
                     pass_index)


@njit(_nrt=True)  # NOTE(refcounts): it allocates, reached uncounted
def _check_after(s, kv, out, feats, where, pass_index):
    """servesim's own: `check_pass` with the holders `_check_holders` finds,
    the debug mode's check as `schedule` and `update_from_output` call it
    (docs/engine.md §14)."""
    check_pass(s, _check_holders(s, kv), out, feats, where, pass_index)


@njit(inline="always")
def _append_token(s, i, release_ms, pass_index, max_model_len):
    """`Scheduler._update_request_with_output`: append one sampled token; True
    when the request stops on it.

    - The stop is `check_stop`'s (vllm/v1/core/sched/utils.py): max_tokens,
      then max_model_len.
    - The token reaches the client after the later of its release and the
      request's previous output, plus the detokenization delay
      (docs/engine.md §8).
    """
    R, last_client = s.R, s.last_client
    R[i].num_tokens += 1
    if R[i].num_output_placeholders > 0:
        R[i].num_output_placeholders -= 1
    produced = R[i].num_tokens - R[i].num_prompt_tokens
    client = max(release_ms, last_client[i]) + s.detokenize_ms
    last_client[i] = client
    s.client_ms[s.token_offsets[i] + produced - 1] = client
    if R[i].first_token_pass < 0:
        R[i].first_token_pass = pass_index
    R[i].finish_pass = pass_index
    return produced >= R[i].max_tokens or R[i].num_tokens >= max_model_len


@njit(inline="always")
def _append_tokens(s, i, n, release_ms, pass_index, max_model_len):
    """`Scheduler._update_request_with_output`: up to n sampled tokens of
    request i appended at once, up to the token it stops on.

    - `check_stop` after each (max_tokens, then max_model_len), worked out
      before the loop from the room `min(max_tokens - produced,
      max_model_len - num_tokens)`: the tokens' release times are the only
      per-token work.
    - Returns `(tokens appended, whether it stops)`.
    """
    R, last_client = s.R, s.last_client
    num_tokens = R[i].num_tokens
    produced = num_tokens - R[i].num_prompt_tokens
    stop_at = max(1, min(R[i].max_tokens - produced, max_model_len - num_tokens))
    appended = min(n, stop_at)
    R[i].num_tokens = num_tokens + appended
    if R[i].num_output_placeholders > 0:
        R[i].num_output_placeholders = max(0, R[i].num_output_placeholders - appended)
    client_ms, detokenize_ms = s.client_ms, s.detokenize_ms
    at = s.token_offsets[i] + produced
    client = last_client[i]
    for t in range(appended):
        client = max(release_ms, client) + detokenize_ms
        client_ms[at + t] = client
    last_client[i] = client
    if R[i].first_token_pass < 0:
        R[i].first_token_pass = pass_index
    R[i].finish_pass = pass_index
    return appended, stop_at <= n


@njit(inline="always")
def _append_verified(s, out, e, i, stale, release_ms, pass_index):
    """`Scheduler._update_request_with_output`: under speculative decoding,
    the 1 + accepted tokens of entry e appended (`_append_tokens`); True when
    the request stops.

    - `check_stop` after each token (worked out from the request's room
      before the tokens are written).
    - At the stop the rest is trimmed: taken off `num_computed_tokens`, and
      off the placeholders under async.
    """
    R, cfg = s.R, s.cfg
    drafts = out[O_SPEC, e]
    tokens = 1
    if drafts > 0:
        tokens = _verify_drafts(s, i, drafts, out[O_KIND, e] == PassKind.RUNNING, stale)
    appended, stopped = _append_tokens(s, i, tokens, release_ms, pass_index,
                                       cfg[0].max_model_len)
    if stopped and not stale:
        trimmed = tokens - appended
        R[i].num_computed_tokens -= trimmed
        if cfg[0].async_scheduling:
            R[i].num_output_placeholders -= trimmed
    return stopped


@njit(_nrt=False)  # NOTE(refcounts): an entry point (servesim/jit.py)
def update_from_output(s, out, n_sched, release_ms, pass_index, finished, kv=None,
                       checking=None):
    """`Scheduler.update_from_output`: a pass's outputs processed; fills
    `finished` and returns how many (docs/engine.md §6).

    - Sampled tokens are appended, released at `release_ms` and reaching the
      client after detokenization.
    - The blocks of requests that were RUNNING are registered up to their
      completed tokens (`cache_blocks`).
    - Finished requests are freed (on a prefill worker, held for the decode
      side instead).
    - Under speculative decoding a pass yields 1 + accepted tokens per
      request (`_append_verified`); a sync engine's drafter then proposes k
      drafts for every request that sampled and did not finish.
    - With a CPU tier (`kv`) under async scheduling the pass's requests are
      no longer in flight, and a finishing RUNNING request's store (if any,
      `_connector_request_finished`) is decided before its free (KO_FSTORES).
    """
    R, cfg, S = s.R, s.cfg, s.S
    num_finished = 0
    cpu = False
    if kv is not None:
        cpu = cfg[0].kv_source == KV_SOURCE_CPU
        if cpu and cfg[0].async_scheduling:
            for e in range(n_sched):
                R[out[O_REQ, e]].num_passes_in_flight -= 1
    max_model_len = cfg[0].max_model_len
    k = cfg[0].num_speculative_tokens
    for e in range(n_sched):
        if not out[O_FLAGS, e] & F_SAMPLES:
            continue
        i = out[O_REQ, e]
        if R[i].status >= RequestStatus.FINISHED:
            continue
        S[0].preemptions_since_token = 0
        was_running = R[i].status == RequestStatus.RUNNING
        if k == 0:
            stopped = _append_token(s, i, release_ms, pass_index, max_model_len)
            if not was_running and _queued(S, kv, i):  # preempted with this token in flight
                S[0].pending_prefill_tokens += 1
        else:
            before = _prefill_left(R, i) if was_running else R[i].num_tokens
            stopped = _append_verified(s, out, e, i, not was_running, release_ms, pass_index)
            if was_running:  # rejected drafts and the stop's trim roll computed tokens back
                S[0].pending_prefill_tokens += _prefill_left(R, i) - before
            elif _queued(S, kv, i):
                S[0].pending_prefill_tokens += R[i].num_tokens - before
        if was_running:
            # cache_blocks(request, num_computed_tokens - num_in_flight_tokens)
            cache_blocks(s, i, R[i].num_computed_tokens - R[i].num_output_placeholders)
        if stopped:
            finished[num_finished] = i
            num_finished += 1
        elif k and was_running and not cfg[0].async_scheduling:
            R[i].num_spec_tokens = k  # EngineCore.post_step: update_draft_token_ids
    if num_finished:
        for j in range(num_finished):
            i = finished[j]
            if R[i].status == RequestStatus.RUNNING:
                S[0].pending_prefill_tokens -= _prefill_left(R, i)  # it leaves running
                if kv is not None:
                    if cpu:
                        job = _connector_request_finished(s, kv, i)
                        if job >= 0:
                            KO, KC = kv.KO, kv.KC
                            KO[KO_FSTORES, KC[KO_FSTORES]] = job
                            KC[KO_FSTORES] += 1
                if R[i].do_remote_decode:  # held for the decode worker (`_finish`)
                    s.held[S[0].num_delayed_free_requests] = i
                    S[0].num_delayed_free_requests += 1
                else:
                    _free(s, i)
            else:  # preempted with its last token in flight
                wq_remove(R, S, s.wq, cfg[0].priority_scheduling, i)
            R[i].status = RequestStatus.FINISHED
        kept = 0
        running = s.running
        for j in range(S[0].num_running):
            i = running[j]
            if R[i].status != RequestStatus.FINISHED:
                running[kept] = i
                kept += 1
        S[0].num_running = kept
    if checking is not None:
        if cfg[0].invariant_check:
            _check_after(s, kv, out, out[0, :0], check.AFTER_OUTPUT, pass_index)
    return num_finished


@njit
def mark_started(R, out, n_sched, start_ms):
    """servesim's own: the requests a pass admits for the first time (NEW
    entries) take its GPU start as their `first_scheduled_time`
    (docs/engine.md §7, §8)."""
    for e in range(n_sched):
        if out[O_KIND, e] == PassKind.NEW:
            R[out[O_REQ, e]].first_scheduled_time = start_ms


@njit
def add_request(s, i):
    """`Scheduler.add_request`: request i joins the waiting queue."""
    wq_add(s.R, s.S, s.wq, s.cfg[0].priority_scheduling, i)


@njit(inline="always")
def _prefill_left(R, i):
    """servesim's own: running request i's prefill tokens still to compute,
    its part of `S[0].pending_prefill_tokens` (docs/engine.md §11)."""
    return max(0, R[i].prefill_target_tokens - R[i].num_computed_tokens)


@njit(inline="always")
def _queued(S, kv, i):
    """servesim's own: whether request i, not running, is in the waiting
    queue rather than waiting for its load (`waiting_for_kv`, `kv.wfk`), for
    the pending prefill count (docs/engine.md §11)."""
    if kv is not None:
        wfk = kv.wfk
        for k in range(S[0].num_waiting_for_kv):
            if wfk[k] == i:
                return False
    return True


@njit(inline="always")
def pending_prefill_tokens(S):
    """servesim's own: the prefill tokens a rank has still to compute, for
    the routers (docs/engine.md §11).

    - Its running requests' rest of prefill (`prefill_target_tokens -
      num_computed_tokens`, when positive) plus every waiting request's
      tokens; loads waiting ahead of the queue are not counted.
    - Kept in `S[0].pending_prefill_tokens` where requests join or leave the
      running list and the waiting queue (request_queue.py), are scheduled
      (`_update_after_schedule`), have tokens appended or rolled back
      (`update_from_output`), so that a router reads it in O(1) at every
      arrival.
    - The debug mode checks it against a scan of the queues (check.py
      `check_pending_prefill`).
    """
    return S[0].pending_prefill_tokens


@njit
def take_out_all(s, kv, out, feats, taken, checking=None):
    """servesim's own: take every running and waiting request out as
    unfinished, a livelocked rank's (docs/engine.md §3); returns how many.

    - A livelock: more than LIVELOCK_PREEMPTIONS preemptions since a token
      was sampled.
    - Then, in the debug mode, check the rank (`_check_after`; `kv`, `held`:
      the rank's, for the requests holding blocks outside the queues).
    """
    R, cfg, S, running = s.R, s.cfg, s.S, s.running
    priority = cfg[0].priority_scheduling
    n = 0
    for k in range(S[0].num_running):
        i = running[k]
        S[0].pending_prefill_tokens -= _prefill_left(R, i)
        _free(s, i)
        R[i].status = RequestStatus.UNFINISHED
        taken[n] = i
        n += 1
    S[0].num_running = 0
    while S[0].num_waiting > 0:
        i = wq_pop(R, S, s.wq, priority)
        R[i].status = RequestStatus.UNFINISHED
        taken[n] = i
        n += 1
    S[0].preemptions_since_token = 0
    if checking is not None:
        if cfg[0].invariant_check:
            _check_after(s, kv, out, feats[:0], check.AFTER_TAKE_OUT, S[0].num_checked_passes)
    return n
