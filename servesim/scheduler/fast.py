"""The scheduler: the rules of vLLM's `Scheduler` (vllm/v1/core/sched/scheduler.py,
async_scheduler.py; docs/engine.md §3-7) as Numba kernels over the arrays of a
:class:`~servesim.scheduler.fast_table.RequestTable`, so that a pass costs a few
microseconds of Python whatever its batch size.

Every kernel takes the rank's arrays as one bundle, `s` (a `SchedulerArrays`,
servesim/scheduler/scheduler_arrays.py), and reads them under their names
where it uses them: the request table `s.R` (vLLM's field names,
`s.R[i].num_computed_tokens`), the block pool `s.blocks`, `s.idmap`,
`s.pscal`, the configuration `s.cfg[0]`, the state `s.S[0]`, `s.running`,
the waiting queue `s.wq`; then what the call is about (the pass's `out` and
`feats`, a request index, a budget), and last the optional `kv`.

Speculative decoding (docs/engine.md §12) exists only here:
drafts in the running loop's ask, padding in the waiting loop, lookahead slots
in `_allocate`, verification and trimming in `update_from_output`.

The CPU tier (docs/engine.md §9) and loads that wait ahead of the queue
(WAITING_FOR_REMOTE_KVS, whatever the KV's source) take the optional `kv`
argument of `schedule` and `update_from_output`; without it their code is
compiled away. The tier's own rules are kernels in
servesim/kvcache/cpu_tier_kernels.py; the hooks here sit where vLLM's
scheduler calls its connector (`_schedule_waiting`, `_queue_load`, `_schedule_loaded`,
`_finish_load`, `_connector_after_schedule`, `_store_on_free`,
`_connector_request_finished`, the stop rule of the preemption loop).

Disaggregated serving (docs/engine.md §13, servesim/engine/fast_disagg.py): a
prefill worker holds a finished `do_remote_decode` request's blocks (`num_delayed_free_requests`)
until `free_delayed`; a decode worker's handed-off requests (`kv_handoff`)
are admitted as loads from the prefill rank holding their prompt's KV
(`KV_SOURCE_REMOTE`: `_remote_lookup`, `_remote_prepare_load`,
`_remote_admitted`), over the load path the CPU tier uses.

It is the engine's only scheduler: tests/test_engine_rules.py holds it to
hand-worked timelines rule by rule, tests/test_golden.py to vLLM's recorded
schedules. Each kernel is named after the vLLM method it follows; the block
pool's kernels are servesim/kvcache/block_pool.py.

A pass's output is `out[ROW, e]` for its scheduled entries e (request, tokens,
cached, kind, flags) plus the preempted and unfinishable requests, and
`feats[...]` for its counts and pricing features.

Reference counts. `schedule`, `update_from_output` and `_allocate` are
compiled without Numba's reference counts (`_nrt=False`), and so is every
kernel they call that does not say otherwise (Numba hands the flag down to
callees that do not set it). The pass loop calls the first two once per rank
and pass; counting each of their array arguments in and out (~20 of them
before the bundle), and every view their callees take, was a fifth of a
4-worker run's compiled time (benchmarks/RESULTS.md, 2026-12-06). The pass loop itself
(engine/fast_run.py `run_passes`) and the loops over workers that call it
(engine/fast_workers.py, engine/fast_cluster.py) are compiled so too: the
loop handed each call a rank's `kv` bundle of 13 arrays, counted in and out
at every pass. Their callers hold every array they get, so nothing is freed
under them. Two rules keep this sound. A kernel
compiled without counts allocates nothing (Numba refuses to compile one
that does), so those they reach that allocate say `_nrt=True`:
`_schedule_waiting` (called only when something waits), the CPU tier's
`prepare_store`, and the debug mode's `_check_after` and `_check_holders`.
And a kernel they may reach hands back no array unless it says `_nrt=True`
(a counting caller would count it down once too often;
tests/test_fast_path.py watches every kernel's returns).
"""

import enum

import numpy as np

from servesim.scheduler.speculative import accepted_drafts
from servesim.jit import njit, records
from servesim.kvcache import block_pool as bp
from servesim.kvcache import cpu_tier_kernels as ct
from servesim.scheduler import check
from servesim.scheduler.fast_queue import wq_add, wq_peek, wq_pop, wq_prepend, wq_remove
from servesim.scheduler.fast_table import KVHandoff, KVLoad
from servesim.scheduler.scheduler_arrays import new_kv_arrays, new_scheduler_arrays
from servesim.scheduler.request import RequestStatus

# (Python-side reads: a NumPy scalar compared with an IntEnum member costs ~10 µs)
_FINISHED = int(RequestStatus.FINISHED)

# A rank that preempts this many times without sampling a single token is
# livelocked (e.g. two prefills of equal priority preempting each other: vLLM
# picks the victim with max(), the earliest of equals, which is the one that
# has run longer): its requests are taken out as unfinished (`take_out_all`).
LIVELOCK_PREEMPTIONS = 1000

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


# No reference counts in here, whoever calls it (the waiting loop counts its
# own; module docstring): the running loop calls it for every running request at
# every pass (benchmarks/RESULTS.md, 2026-12-04).
@njit(_nrt=False)
def _allocate(s, i, num_new, hits, num_hit, reserve_tokens, extra_blocks, delay_cache=False):
    """`KVCacheManager.allocate_slots` (vllm/v1/core/kv_cache_manager.py) over the table.
    Slots cover `min(total + num_lookahead_tokens, max_model_len)` tokens
    (the lookahead is k under speculative decoding, else 0); blocks are
    registered when full within the known tokens, and only once the hash
    lookahead token exists — unless `delay_cache` (blocks a load will fill:
    registered by `_finish_load`, vLLM's `delay_cache_blocks`); registered at
    once, so a request admitted later in the same pass can hit them. The
    free-block check covers `max(those blocks, reserve_tokens' blocks) +
    extra_blocks` (the admission checks of `reserve_full_isl` and
    `watermark`), counting hit blocks nobody holds as used; when it does not
    fit it returns False, changing nothing. (A rank with `kv` then notes
    the blocks it took for the pass: `_note_new_blocks`.)"""
    R, cfg = s.R, s.cfg
    bs = cfg[0].block_size
    off = R[i].block_offset
    end = off + R[i].block_capacity
    total = R[i].num_computed_tokens + num_hit * bs + num_new
    needed = -(-min(total + cfg[0].num_lookahead_tokens, cfg[0].max_model_len) // bs)
    checked = max(needed, -(-reserve_tokens // bs)) + extra_blocks
    if num_hit > 0 or checked > R[i].num_held_blocks:
        held = bp.allocate_slots(s.blocks, s.idmap, s.pscal, s.tables[off:end],
                                 R[i].num_held_blocks, hits, num_hit, needed, checked)
        if held < 0:
            return False
        R[i].num_held_blocks = held
    # else: the blocks it holds cover the tokens and the check (most decodes)
    if num_hit > 0:
        R[i].num_cached_blocks = num_hit
    if not delay_cache:
        cache_blocks(s, i, total)
    return True


@njit(inline="always")  # (called only where `kv` exists)
def _note_new_blocks(s, kv, i, first):
    """The blocks request i just took from the free queue for a pass (not
    for a load), its table's entries from `first` on, noted in
    KO_NEW_BLOCKS: the pass writes them, so it starts no earlier than the
    CPU tier's stores still reading them (docs/engine.md §9): vLLM's
    offloading connector reads them from the pass's new block ids, after
    `allocate_slots`."""
    R, tables, KO, KC = s.R, s.tables, kv.KO, kv.KC
    n = KC[KO_NEW_BLOCKS]
    off = R[i].block_offset
    if n + R[i].num_held_blocks - first > KO.shape[1]:
        raise RuntimeError("KO_NEW_BLOCKS overflows")
    for k in range(off + first, off + R[i].num_held_blocks):
        KO[KO_NEW_BLOCKS, n] = tables[k]
        n += 1
    KC[KO_NEW_BLOCKS] = n


@njit(inline="always")  # runs for every sampled token: kept to a compare
def cache_blocks(s, i, num_tokens):
    """`KVCacheManager.cache_blocks` (vllm/v1/core/kv_cache_manager.py) over the table:
    register request i's held blocks full within `min(num_tokens, its known
    tokens)` not registered yet. Called by `_allocate` and, for a RUNNING
    request whose sampled token arrives, by `update_from_output` with the
    tokens whose pass has completed. Most calls fill no new block: inlined,
    they cost the one compare before the out-of-line registration."""
    R, cfg = s.R, s.cfg
    bs = cfg[0].block_size
    # a block may be full
    if cfg[0].enable_caching and num_tokens >= (R[i].num_cached_blocks + 1) * bs:
        # with a hash lookahead token, a block's hash exists once the next token does
        num_full = min(num_tokens, R[i].num_tokens - cfg[0].num_hash_lookahead_tokens) // bs
        if num_full > R[i].num_cached_blocks:
            _cache_full_blocks(s, i, num_full)


@njit
def _cache_full_blocks(s, i, num_full):
    R = s.R
    off = R[i].block_offset
    end = off + R[i].block_capacity
    bp.cache_full_blocks(s.blocks, s.idmap, s.tables[off:end], s.idents[off:end],
                         R[i].num_cached_blocks, num_full)
    R[i].num_cached_blocks = num_full


@njit
def _free(s, i):
    R = s.R
    off = R[i].block_offset
    bp.free_blocks(s.blocks, s.pscal, s.tables[off:off + R[i].block_capacity],
                   R[i].num_held_blocks)
    R[i].num_held_blocks = 0
    R[i].num_cached_blocks = 0


@njit
def _victim_index(s, n, priority):
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
    """`_preempt_request`: free every block, back to the front of `waiting`
    (priority: back into the heap). With the `simple_cpu` connector its full
    computed blocks are stored first (docs/engine.md §9; KO_PSTORES)."""
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
    """The running loop (docs/engine.md §3 steps 1-4, §6). With a CPU tier
    under async scheduling a victim that the pass in flight runs would free
    its blocks only after that pass: the preemption loop stops there and the
    request waits a pass (§7; priority goes on with the next request)."""
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
def fits_the_pool(cfg, num_tokens):
    """Whether `num_tokens` tokens' slots, with the lookahead slots of
    speculative decoding (`allocate_slots`' `num_lookahead_tokens`,
    vllm/v1/core/kv_cache_manager.py) and capped at max_model_len like every
    allocation, fit in the usable blocks (docs/engine.md §3): a request that
    does not can never be admitted (at arrival: `can_ever_fit`; on resume
    after outgrowing the pool: the waiting loop takes it out)."""
    slots = min(num_tokens + cfg[0].num_lookahead_tokens, cfg[0].max_model_len)
    return -(-slots // cfg[0].block_size) <= cfg[0].num_usable_blocks


@njit
def can_ever_fit(cfg, num_prompt_tokens):
    """A prompt reaching max_model_len, or whose prefill needs more blocks
    than usable, is rejected at arrival (docs/engine.md §3). The prefill
    that completes a prompt also reserves the lookahead slots of
    speculative decoding (`allocate_slots`' `num_lookahead_tokens`,
    vllm/v1/core/kv_cache_manager.py), capped at max_model_len like every
    allocation, so those count too: such a request could never be admitted
    and would hold the queue behind it forever."""
    return num_prompt_tokens < cfg[0].max_model_len and fits_the_pool(cfg, num_prompt_tokens)


@njit(inline="always")
def _admission_reserve(s, i):
    """What an admission's `allocate_slots` checks beyond its own slots
    (docs/engine.md §3-4): with `reserve_full_isl` the whole prompt's blocks,
    and, when requests are already running, the watermark's free blocks.
    Returns `(reserve_tokens, extra_blocks)`."""
    cfg = s.cfg
    reserve = s.R[i].num_tokens if cfg[0].reserve_full_isl else 0
    extra = cfg[0].watermark_blocks if s.S[0].num_running > 0 else 0
    return reserve, extra


@njit(inline="always")
def _admission_tokens(cfg, num_new, threshold, budget):
    """An admission's tokens this pass (docs/engine.md §3, waiting loop): at
    most `long_prefill_token_threshold` (when set) and the budget; without
    chunked prefill a prompt that does not fit the budget whole stops the
    loop (-1)."""
    if 0 < threshold < num_new:
        num_new = threshold
    if not cfg[0].enable_chunked_prefill and num_new > budget:
        return -1
    return min(num_new, budget)


@njit(_nrt=True)  # it allocates (`hits`, `skipped`): counted, whoever calls it
def _schedule_waiting(s, out, feats, budget, threshold, kv=None):
    """Admission, strict head of line (docs/engine.md §3, waiting loop).
    With `kv`, requests whose loads were queued come first
    (`_schedule_loaded`); with a CPU tier a head with blocks in the tier past
    its G1 hit queues a load instead (`_queue_load`, §9), and a head that
    must wait for a store or another load to finish is skipped this pass
    (put back at the front, in order, after the loop)."""
    R, cfg, S, wq = s.R, s.cfg, s.S, s.wq
    priority = cfg[0].priority_scheduling
    bs = cfg[0].block_size
    num_skipped = 0
    skipped = s.running[:0]  # (a view: no allocation, in every pass without `kv`)
    if kv is not None:
        if S[0].num_waiting_for_kv > 0:
            budget = _schedule_loaded(s, out, feats, budget, threshold, kv)
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
    """Move request i to `running` with `hit` tokens cached, `g1_hit` of
    them from G1 and the rest loaded (counted as the CPU tier's hit tokens
    with a CPU tier); its admission is recorded in the prefix-cache stats
    (`PrefixCacheStats`: G1 hits only, preempted requests apart) and it gets
    its entry in the pass. A handed-off request's first admission on a
    disaggregated decode worker has its prompt's KV and its first token: its
    prefill is the prompt only, so the pass computing the first token's KV is
    a decode (docs/engine.md §10), and its source learns of the admission
    (`_remote_admitted`)."""
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
                kv.KS[ct.K_HIT_TOKENS] += hit - g1_hit
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
    """Admission of the waiting head i whose KV past its G1 hit of `num_hit`
    blocks comes from elsewhere (vLLM's `load_kv_async`;
    vllm/v1/core/sched/scheduler.py): with the admission checks of §3 step 4
    (`reserve_full_isl`, watermark) it takes its G1 blocks for the hit and
    for `num_tokens` more tokens (registered in the prefix cache only once
    loaded: `delay_cache`), leaves the waiting queue and waits in
    `waiting_for_kv`, using no budget, with R[i].kv_load = KVLoad.IN_FLIGHT
    until its source sets KVLoad.LANDED. Its source prepares the transfer
    (KO_LOAD_REQS lists it). False, changing nothing, if it does not fit."""
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
    """Requests waiting for a load, in the order their loads were queued
    (vllm/v1/core/sched/scheduler.py, WAITING_FOR_REMOTE_KVS and
    `_update_waiting_for_remote_kv`): one whose load has not landed is
    skipped; one whose load landed counts its blocks as computed
    (`_finish_load`) and is admitted as a waiting head would be (it keeps
    its place if it does not fit, its load finished). Returns the budget
    left, or 0 when a loaded request does not fit (strict head of line)."""
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
    """A landed load (`_update_waiting_for_remote_kv`): the request's blocks
    count as computed, all but the last token (which is recomputed), and are
    registered in the prefix cache."""
    R = s.R
    computed = min(R[i].num_held_blocks * s.cfg[0].block_size, R[i].num_tokens)
    if computed == R[i].num_tokens:
        computed -= 1
    cache_blocks(s, i, computed)
    R[i].num_computed_tokens = computed
    R[i].kv_load = KVLoad.NONE


# -- a disaggregated decode worker's remote KV (docs/engine.md §13; engine/fast_disagg.py) --
# The source of a handed-off request's KV is the prefill rank holding it
# (R[i].kv_handoff); the transfers decided here (pulls, notices) are listed
# in KO_LOADS as request indices, in decision order, for the rank's receiver
# (engine/fast_disagg.py), which marks a landed pull KVLoad.LANDED.


@njit
def _remote_lookup(s, i, num_hit):
    """A decode rank's remote lookup (NIXL's `get_num_new_matched_tokens`,
    nixl_connector.py) for the handed-off head i past its G1 hit of
    `num_hit` blocks, its prompt's KV held by the prefill rank: the rest of
    the prompt's blocks, partial last block included (`P - hit` tokens)."""
    return max(0, -(-s.R[i].num_prompt_tokens // s.cfg[0].block_size) - num_hit)


@njit
def _remote_prepare_load(s, kv, i):
    """A decode rank's pull (NIXL's `update_state_after_alloc`):
    the pull of request i's prompt past its G1 hit, which `_queue_load`
    admitted, goes out at this decision (KO_LOADS)."""
    KO, KC = kv.KO, kv.KC
    s.R[i].kv_handoff = KVHandoff.PULLING
    KO[KO_LOADS, KC[KO_LOADS]] = i
    KC[KO_LOADS] += 1


@njit
def _remote_admitted(s, kv, i):
    """A decode rank admits a pulled request: handed-off request i is admitted; if it
    pulled nothing while the prefill rank still holds its blocks, a notice
    (no bytes, KO_LOADS) releases them, sent at this decision like a pull."""
    R = s.R
    if R[i].kv_handoff == KVHandoff.HELD:
        KO, KC = kv.KO, kv.KC
        KO[KO_LOADS, KC[KO_LOADS]] = i
        KC[KO_LOADS] += 1
    R[i].kv_handoff = 0


# -- the CPU tier's connector hooks (docs/engine.md §9; cpu_tier_kernels.py) -------


@njit
def _connector_lookup(s, kv, i, num_hit):
    """`get_num_new_matched_tokens` for the waiting head i past its G1 hit
    of `num_hit` blocks: blocks to load, or -1 when it must wait."""
    R = s.R
    off = R[i].block_offset
    return ct.get_num_new_matched_tokens(kv.tier, kv.slot_of,
                                         s.idents[off:off + R[i].block_capacity],
                                         R[i].num_tokens, kv.KS[ct.K_BLOCK_SIZE], num_hit)


@njit
def _connector_prepare_load(s, kv, i, first_block, num_blocks):
    """The CPU-tier load of a request `_queue_load` admitted (KO_LOADS)."""
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
    off = s.R[i].block_offset
    end = off + s.R[i].block_capacity
    return ct.prepare_store(kv.tier, kv.slot_of, kv.free_slots, kv.jobs, kv.job_times,
                            kv.job_blocks, kv.KS, s.idents[off:end], s.tables[off:end],
                            first_block, stop_block)


@njit
def _store_on_free(s, kv, i):
    """`simple_cpu`: the store job of a finishing or preempted request's
    full computed blocks not yet in the tier; < 0 if nothing to store or no
    room."""
    if kv.KS[ct.K_FILL]:
        return ct.EMPTY_JOB
    R = s.R
    full = min(R[i].num_computed_tokens, R[i].num_tokens) // kv.KS[ct.K_BLOCK_SIZE]
    return _prepare_store(s, kv, i, 0, full)


@njit
def _connector_after_schedule(s, out, feats, kv):
    """CPU-tier bookkeeping of a decided pass (docs/engine.md §7, §9): under
    async scheduling its requests are now in flight; with the `offloading`
    connector each scheduled request's blocks full after this pass (known
    tokens only) and not yet in the tier become one store job, going out at
    the pass end (OffloadingConnectorScheduler `_get_reqs_to_store`). A job
    the tier has no room for is dropped and tried again next pass."""
    R, cfg = s.R, s.cfg
    KO, KC, KS = kv.KO, kv.KC, kv.KS
    bs = cfg[0].block_size
    for e in range(feats[N_SCHED]):
        i = out[O_REQ, e]
        if cfg[0].async_scheduling:
            R[i].num_passes_in_flight += 1
        if not KS[ct.K_FILL]:
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
    """The CPU-tier store that goes out with a finishing request's free
    (the connector's `request_finished`, then its store jobs at the next
    step: offloading_connector.py), or < 0. `simple_cpu`: its full computed
    blocks not yet in the tier. `offloading` under async scheduling: the
    blocks full within its computed tokens that its pass stores could not
    take — its last pass was decided while the token it computed was a
    placeholder — so it stores as many blocks as a sync engine, one pass
    later. A sync engine's last pass already stored every block full at its
    end: nothing."""
    R, cfg = s.R, s.cfg
    if not kv.KS[ct.K_FILL]:
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


@njit(inline="always")
def scheduled_drafts(R, i, num_new):
    """`Scheduler.schedule`, running loop (vllm/v1/core/sched/scheduler.py):
    the drafts a request granted `num_new` tokens schedules are the tail of
    its ask beyond its known tokens and placeholders, `num_new + computed -
    num_tokens - placeholders` (so b granted tokens keep b - 1 drafts); its
    draft list (`spec_token_ids`) is cleared once it is scheduled."""
    drafts = max(0, num_new + R[i].num_computed_tokens - R[i].num_tokens
                 - R[i].num_output_placeholders)
    R[i].num_spec_tokens = 0
    return drafts


@njit
def _padding_drafts(s, out, feats, hit):
    """`Scheduler.schedule`, waiting loop (vllm/v1/core/sched/scheduler.py):
    an admission with one token to compute is padded with k never-accepted
    drafts when no request the running loop scheduled in this pass entered
    it as a prefill chunk (`prefill_scheduled`, from `is_prefill_chunk`: its
    computed tokens below its prefill target, docs/engine.md §10), a request
    of the running loop was scheduled (`scheduled_running_reqs`) or the
    admission has cached tokens, and `hit + 1 + k + 1 <= max_model_len`.
    Admissions earlier in the waiting loop count for neither. Returns the
    padding drafts (0: none)."""
    R, cfg = s.R, s.cfg
    k = cfg[0].num_speculative_tokens
    if hit + k + 2 > cfg[0].max_model_len:
        return 0
    running_scheduled = False
    for e in range(feats[N_SCHED]):
        if out[O_KIND, e] != PassKind.RUNNING:
            continue
        running_scheduled = True
        j = out[O_REQ, e]
        if R[j].num_computed_tokens < R[j].prefill_target_tokens:
            return 0  # a prefill chunk
    if not running_scheduled and hit == 0:
        return 0
    return k


@njit
def _update_after_schedule(s, out, feats):
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


@njit(_nrt=False)  # see "Reference counts" in the module docstring
def schedule(s, out, feats, kv=None):
    """One `Scheduler.schedule()` of the rank `s` (a `SchedulerArrays`);
    fills `out` and `feats` (and, with `kv`, the transfers it decided in
    `kv`'s KO rows, see above)."""
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
    if cfg[0].invariant_check:
        _check_after(s, kv, out, feats, check.AFTER_SCHEDULE, -1)


@njit(_nrt=True)  # it allocates and hands back its array (module docstring)
def _check_holders(s, kv=None):
    """The requests that hold G1 blocks outside `running` and the waiting
    queue, for the debug mode's check: those in `waiting_for_kv` (a CPU-tier
    load or a remote pull in flight into blocks they took at admission,
    `_queue_load`; `kv.wfk[:S[0].num_waiting_for_kv]`) and, on a disaggregated prefill
    worker, the finished requests whose blocks are held for the decode side
    (`held[:S[0].num_delayed_free_requests]`). CPU-tier stores in flight hold none: they read G1
    blocks without a reference (`storing`, cpu_tier_kernels.py), like vLLM's
    offloading connector."""
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
    """The debug mode's invariant check (servesim/scheduler/check.py) of this
    rank after a pass: after `schedule()` (`feats` given, its entries checked
    too; the pass index is that of the pass decided, counted here) or after
    `update_from_output()` of pass `pass_index` (`feats` empty). `others`:
    the requests holding blocks outside running and waiting
    (`_check_holders`)."""
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


@njit(_nrt=True)  # it allocates; called by kernels compiled without counts
def _check_after(s, kv, out, feats, where, pass_index):
    """`check_pass` with the holders `_check_holders` finds: the debug
    mode's check, as `schedule` and `update_from_output` call it."""
    check_pass(s, _check_holders(s, kv), out, feats, where, pass_index)


@njit(inline="always")
def _append_token(s, i, release_ms, pass_index, max_model_len):
    """Append one sampled token; True when the request stops on it (`check_stop`:
    max_tokens, then max_model_len)."""
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
def _append_verified(s, out, e, i, stale, release_ms, pass_index):
    """Speculative decoding (`_update_request_with_output`,
    vllm/v1/core/sched/scheduler.py; `check_stop` after each token): the 1 +
    accepted tokens of entry e, appended one at a time; at the stop the rest
    is trimmed (taken off
    `num_computed_tokens`, and off the placeholders under async). True when
    the request stops."""
    R, cfg = s.R, s.cfg
    drafts = out[O_SPEC, e]
    tokens = 1
    if drafts > 0:
        tokens = _verify_drafts(s, i, drafts, out[O_KIND, e] == PassKind.RUNNING, stale)
    for t in range(tokens):
        if _append_token(s, i, release_ms, pass_index, cfg[0].max_model_len):
            if not stale:
                trimmed = tokens - 1 - t
                R[i].num_computed_tokens -= trimmed
                if cfg[0].async_scheduling:
                    R[i].num_output_placeholders -= trimmed
            return True
    return False


@njit(inline="always")
def _verify_drafts(s, i, drafts, real, stale):
    """`Scheduler.update_from_output` / `_update_request_with_output`
    (vllm/v1/core/sched/scheduler.py) under speculative decoding: of
    `drafts` drafts, the accepted ones (none for padding; `real` drafts draw
    from the request's `accepted` list or the rates) stay computed, the
    rejected ones roll `num_computed_tokens` back (async: the placeholders
    too) and keep their blocks. A stale output (the request was preempted
    with it in flight) leaves `num_computed_tokens` and the placeholders
    alone but still counts in the acceptance statistics, as vLLM records
    them. Returns the tokens it yields."""
    R, cfg = s.R, s.cfg
    acc_offsets, acc_values, rates, pos_counts, keys = s.spec
    accepted = 0
    if real:
        draw = R[i].num_drafts
        accepted = accepted_drafts(cfg[0].spec_seed, rates, acc_offsets, acc_values, i, keys[i],
                                   draw, drafts)
        R[i].num_drafts = draw + 1
        R[i].num_draft_tokens += drafts
        R[i].num_accepted_tokens += accepted
        for pos in range(drafts):
            pos_counts[0, pos] += 1
            if pos < accepted:
                pos_counts[1, pos] += 1
    if not stale:
        rejected = drafts - accepted
        R[i].num_computed_tokens -= rejected
        if cfg[0].async_scheduling:
            R[i].num_output_placeholders -= rejected
        # accepted drafts are computed tokens: a recompute after preemption counts them
        R[i].max_num_computed_tokens = max(R[i].max_num_computed_tokens,
                                           R[i].num_computed_tokens - R[i].num_output_placeholders)
    return 1 + accepted


@njit(_nrt=False)  # see "Reference counts" in the module docstring
def update_from_output(s, out, n_sched, release_ms, pass_index, finished, kv=None):
    """`Scheduler.update_from_output`: append sampled tokens (released at
    `release_ms`, reaching the client after detokenization), register the
    blocks of requests that were RUNNING up to their completed tokens
    (`cache_blocks`), finish requests and free their blocks. Fills `finished`
    and returns how many.

    Under speculative decoding a pass yields 1 + accepted tokens per request
    (`_append_verified`); a sync engine's drafter then proposes k drafts for
    every request that sampled and did not finish.

    With a CPU tier (`kv`) under async scheduling the pass's requests are no
    longer in flight, and a finishing RUNNING request's store (if any,
    `_connector_request_finished`) is decided before its free (KO_FSTORES)."""
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
    if cfg[0].invariant_check:
        _check_after(s, kv, out, out[0, :0], check.AFTER_OUTPUT, pass_index)
    return num_finished


@njit
def free_delayed(s, i):
    """A prefill rank's delayed free: the transfer of handed-off request i's KV is
    done, its held blocks are freed (vLLM's `_update_from_kv_xfer_finished`
    for `finished_sending`; docs/engine.md §13) and it leaves `held`."""
    S, held = s.S, s.held
    _free(s, i)
    kept = 0
    for k in range(S[0].num_delayed_free_requests):
        if held[k] != i:
            held[kept] = held[k]
            kept += 1
    S[0].num_delayed_free_requests = kept


@njit
def mark_started(R, out, n_sched, start_ms):
    for e in range(n_sched):
        if out[O_KIND, e] == PassKind.NEW:
            R[out[O_REQ, e]].first_scheduled_time = start_ms


@njit
def add_request(s, i):
    """`Scheduler.add_request`: request i joins the waiting queue."""
    wq_add(s.R, s.S, s.wq, s.cfg[0].priority_scheduling, i)


@njit(inline="always")
def _prefill_left(R, i):
    """Running request i's prefill tokens still to compute: its part of
    `S[0].pending_prefill_tokens`."""
    return max(0, R[i].prefill_target_tokens - R[i].num_computed_tokens)


@njit(inline="always")
def _queued(S, kv, i):
    """Whether request i, not running, is in the waiting queue rather than
    waiting for its load (`waiting_for_kv`, `kv.wfk`)."""
    if kv is not None:
        wfk = kv.wfk
        for k in range(S[0].num_waiting_for_kv):
            if wfk[k] == i:
                return False
    return True


@njit(inline="always")
def pending_prefill_tokens(S):
    """The prefill tokens a rank has still to compute — its running
    requests' rest of prefill (`prefill_target_tokens - num_computed_tokens`,
    when positive) plus every waiting request's tokens; loads waiting ahead
    of the queue are not counted — for the routers (docs/engine.md §11). Kept
    in `S[0].pending_prefill_tokens` where requests join or leave the
    running list and the waiting queue (fast_queue.py), are scheduled
    (`_update_after_schedule`), have tokens appended or rolled back
    (`update_from_output`), so that a router reads it in O(1) at every
    arrival; the debug mode checks it against a scan of the queues
    (check.py `check_pending_prefill`)."""
    return S[0].pending_prefill_tokens


@njit
def take_out_all(s, kv, out, feats, taken):
    """Take every running and waiting request out as unfinished (a livelock:
    more than LIVELOCK_PREEMPTIONS preemptions since a token was sampled),
    then, in the debug mode, check the rank (`_check_after`; `kv`, `held`:
    the rank's, for the requests holding blocks outside the queues).
    Returns how many."""
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
    if cfg[0].invariant_check:
        _check_after(s, kv, out, feats[:0], check.AFTER_TAKE_OUT, S[0].num_checked_passes)
    return n


class FastOutput:
    """A pass decided by :class:`FastScheduler` (vllm/v1/core/sched/output.py's
    `SchedulerOutput`) over `out`/`feats`."""

    __slots__ = ("out", "feats")
    # no transfers decided (a pass decided with `kv` state: FastKVOutput)
    loads = preemption_stores = stores = new_blocks = load_requests = ()

    def __init__(self, out, feats):
        self.out = out
        self.feats = feats

    num_scheduled = property(lambda self: int(self.feats[N_SCHED]))
    num_preempted = property(lambda self: int(self.feats[N_PRE]))
    prefill_tokens = property(lambda self: int(self.feats[PREFILL_TOKENS]))
    num_prefill_requests = property(lambda self: int(self.feats[NUM_PREFILL]))
    decode_requests = property(lambda self: int(self.feats[DECODE_REQS]))
    decode_context = property(lambda self: int(self.feats[DECODE_CTX]))
    prefill_context = property(lambda self: int(self.feats[PREFILL_CTX]))
    total_tokens = property(lambda self: int(self.feats[TOTAL_TOKENS]))
    spec_tokens = property(lambda self: int(self.feats[SPEC_TOKENS]))
    prefill_spec_tokens = property(lambda self: int(self.feats[PREFILL_SPEC]))
    free_blocks_after_schedule = property(lambda self: int(self.feats[FREE_BLOCKS]))


class FastKVOutput(FastOutput):
    """A pass decided with `kv` state (`FastScheduler.schedule`): also the
    transfers it decided — CPU-tier job ids in `loads`,
    `preemption_stores` and `stores`
    (a remote source's: FastRemoteOutput),
    the G1 blocks the pass writes in `new_blocks`, and the requests whose
    loads were queued in `load_requests` (for a source other than the tier)."""

    __slots__ = ("loads", "preemption_stores", "stores", "new_blocks", "load_requests")

    def __init__(self, out, feats, KO, KC):
        self.out = out
        self.feats = feats
        n = KC.tolist()
        self.loads = KO[KO_LOADS, :n[KO_LOADS]].tolist() if n[KO_LOADS] else ()
        self.load_requests = (KO[KO_LOAD_REQS, :n[KO_LOAD_REQS]].tolist()
                              if n[KO_LOAD_REQS] else ())
        self.preemption_stores = (KO[KO_PSTORES, :n[KO_PSTORES]].tolist()
                                  if n[KO_PSTORES] else ())
        self.stores = KO[KO_STORES, :n[KO_STORES]].tolist() if n[KO_STORES] else ()
        self.new_blocks = (KO[KO_NEW_BLOCKS, :n[KO_NEW_BLOCKS]].tolist()
                           if n[KO_NEW_BLOCKS] else ())


class FastRemoteOutput(FastOutput):
    """A pass decided on a disaggregated decode worker (KV_SOURCE_REMOTE):
    also the transfers it decided, in `loads` — the request indices of its
    pulls and notices, in decision order, for the rank's receiver
    (engine/fast_disagg.py)."""

    __slots__ = ("loads",)

    def __init__(self, out, feats, KO, KC):
        super().__init__(out, feats)
        self.loads = KO[KO_LOADS, :KC[KO_LOADS]].tolist() if KC[KO_LOADS] else ()


class _PrefixCacheStats:
    def __init__(self, S):
        self._S = S

    queries = property(lambda self: int(self._S[0]["prefix_queries"]))
    hits = property(lambda self: int(self._S[0]["prefix_hits"]))
    preempted_queries = property(lambda self: int(self._S[0]["preempted_queries"]))
    preempted_hits = property(lambda self: int(self._S[0]["preempted_hits"]))


class FastScheduler:
    """One rank's scheduler: its arrays, which the compiled pass loop
    (engine/fast_run.py) runs the kernels over, and `schedule()` /
    `update_from_output()` one call at a time for tests and debugging;
    requests are indices into the shared table."""

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
        self.cfg[0]["num_usable_blocks"] = pool.num_gpu_blocks - 1
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
        # (accepted-list offsets, values, rates, per-position [drafted, accepted],
        # each request's key for its acceptance draws)
        self.spec = (table.accepted_offsets, table.accepted_values, rates,
                     np.zeros((2, max(k, 1)), dtype=np.int64), table.request_keys())
        self.S = records(1, STATE_DTYPE)
        self.running = np.zeros(config.max_num_seqs + 1, dtype=np.int64)
        self.wq = np.zeros(len(table.request_ids) + 1, dtype=np.int64)
        self._out_width = config.max_num_seqs + 1
        self.finished_buffer = np.zeros(len(table.request_ids) + 1, dtype=np.int64)
        self.prefix_cache_stats = _PrefixCacheStats(self.S)
        self.unfinishable = []
        self.stop_on_finish = False  # closed loop: a finish releases the next request
        self.connector = None  # the CPU tier (attach_connector)
        self.kv_state = None  # (wfk, KO, KC): loads waiting ahead of the queue
        self.finished_stores = []  # CPU-tier store jobs of finished requests (update_from_output)

        # num_delayed_free_requests's
        self.held = np.zeros(len(table.request_ids) + 1, dtype=np.int64)
        self.arrays = new_scheduler_arrays(
            table.R, table.idents, table.tables, pool.blocks, pool.idmap, pool.scalars,
            self.cfg, self.S, self.running, self.wq, self.spec, self.held, tokens.client_ms,
            tokens.offsets, tokens.last_client, float(tokens.detokenize_ms))
        if check.enabled():
            # the debug mode; the whole table is checked while this is the only
            # scheduler on it (other ranks' requests are in their own queues)
            table.checked_schedulers.append(self)
            mode = 2 if len(table.checked_schedulers) == 1 else 1
            for peer in table.checked_schedulers:
                peer.cfg[0]["invariant_check"] = mode

    def new_connector(self, offloading_config):
        """This rank's CPU tier (docs/engine.md §9) as arrays, attached."""
        from servesim.scheduler.fast_connector import FastCPUConnector

        connector = FastCPUConnector(offloading_config, self.pool, self.table)
        self.attach_connector(connector)
        return connector

    def attach_connector(self, connector):
        """Use `connector` (a `FastCPUConnector`) as this rank's CPU tier."""
        self.connector = connector
        self.attach_kv_source(KV_SOURCE_CPU, connector.tier)

    def attach_kv_source(self, source, tier=None):
        """Admit loads that wait ahead of the queue from `source`
        (KV_SOURCE_CPU with its `tier`; KV_SOURCE_REMOTE: the kernels get an
        empty tier, which its code paths never touch): creates
        `waiting_for_kv` and the per-call outputs `KO`/`KC`."""
        from servesim.kvcache.cpu_tier_kernels import TierArrays

        self.cfg[0]["kv_source"] = source
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
            self._kv_arrays = new_kv_arrays(*self.kv_state, *t.arrays(), t.lanes, t.storing,
                                            t.KF)
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


    def queue_members(self):
        """`(running, waiting, others)`: the request indices of each, others
        being those holding blocks outside the two (loads in flight, blocks
        held for a decode worker: `_check_holders`), for the debug mode's
        check across schedulers (servesim/scheduler/check.py)."""
        head = 0 if self.priority else self.S[0]["waiting_head"]
        waiting = self.wq[(head + np.arange(self.S[0]["num_waiting"])) % len(self.wq)]
        return self.running[:self.S[0]["num_running"]].copy(), waiting, self._check_holders()

    def _check_holders(self):
        # (`waiting_for_kv` is kv_state[0]; the tier's arrays are not touched)
        return _check_holders(self.arrays, self._kv() if self.kv_state is not None else None)

    num_running = property(lambda self: int(self.S[0]["num_running"]))
    num_waiting = property(lambda self: int(self.S[0]["num_waiting"]
                                            + self.S[0]["num_waiting_for_kv"]))
    num_preemptions = property(lambda self: int(self.S[0]["num_preemptions"]))

    # -- passes --------------------------------------------------------------

    def schedule(self) -> FastOutput:
        out = np.empty((NUM_OUT_ROWS, self._out_width), dtype=np.int64)
        feats = np.zeros(NUM_FEATS, dtype=np.int64)
        if self.S[0]["preemptions_since_token"] > LIVELOCK_PREEMPTIONS:
            n = take_out_all(self.arrays, self._kv() if self.kv_state is not None else None, out,
                             feats, self.finished_buffer)
            self.unfinishable.extend(self.finished_buffer[:n].tolist())
            if self.kv_state is not None:
                KC = self.kv_state[2]
                fstores = KC[KO_FSTORES]
                KC[:] = 0
                KC[KO_FSTORES] = fstores
                return self._kv_output(out, feats)
            return FastOutput(out, feats)
        if self.kv_state is None:
            schedule(self.arrays, out, feats, None)
            result = FastOutput(out, feats)
        else:
            schedule(self.arrays, out, feats, self._kv())
            result = self._kv_output(out, feats)
        self.note_unfinishable(result)
        return result

    def _kv_output(self, out, feats):
        KO, KC = self.kv_state[1], self.kv_state[2]
        if self.cfg[0]["kv_source"] == KV_SOURCE_CPU:
            return FastKVOutput(out, feats, KO, KC)
        return FastRemoteOutput(out, feats, KO, KC)

    def note_unfinishable(self, out: FastOutput):
        n = out.feats[N_UNFIN]
        if n:
            self.unfinishable.extend(int(i) for i in out.out[O_UNFIN, :n])

    def mark_started(self, out: FastOutput, start_ms: float):
        mark_started(self.table.R, out.out, out.feats[N_SCHED], start_ms)

    def update_from_output(self, out: FastOutput, release_ms: float, pass_index: int):
        n = update_from_output(self.arrays, out.out, out.feats[N_SCHED], release_ms, pass_index,
                               self.finished_buffer,
                               self._kv() if self.kv_state is not None else None)
        if self.connector is not None:  # only the CPU tier acts on outputs
            KO, KC = self.kv_state[1], self.kv_state[2]
            if KC[KO_FSTORES]:
                self.finished_stores.extend(KO[KO_FSTORES, :KC[KO_FSTORES]].tolist())
                KC[KO_FSTORES] = 0
        return self.finished_buffer[:n].tolist() if n else []
