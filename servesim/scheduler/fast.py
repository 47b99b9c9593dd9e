"""The compiled scheduler: the rules of the reference
:class:`~servesim.scheduler.scheduler.Scheduler` (vllm/v1/core/sched/scheduler.py,
async_scheduler.py; docs/engine.md §3-7) as Numba kernels over the arrays of a
:class:`~servesim.scheduler.fast_table.RequestTable`, so that a pass costs a few
microseconds of Python whatever its batch size.

Speculative decoding (docs/engine.md §12) exists only here:
drafts in the running loop's ask, padding in the waiting loop, lookahead slots
in `_allocate`, verification and trimming in `update_from_output`.

It is the engine's fast path; the reference scheduler stays the readable
statement of the rules, and tests hold the two to identical pass logs and
request records (tests/test_fast_path.py). Each kernel below mirrors the
reference method of the same name; the block pool kernels are shared.

A pass's output is `out[ROW, e]` for its scheduled entries e (request, tokens,
cached, kind, flags) plus the preempted and unfinishable requests, and
`feats[...]` for its counts and pricing features.
"""

import numpy as np

from servesim.engine.speculative import accepted_drafts
from servesim.jit import njit
from servesim.kvcache import block_pool as bp
from servesim.scheduler import check
from servesim.scheduler.fast_queue import (WQ_HEAD, WQ_LEN, wq_add, wq_peek, wq_pop,
                                           wq_prepend, wq_remove)
from servesim.scheduler.fast_table import (ARRIVAL, COMPUTED, FINISH_PASS, FINISHED,
                                           FIRST_CACHED, FIRST_SCHEDULED, FIRST_TOKEN_PASS,
                                           MAX_COMPUTED, MAX_TOKENS, NUM_BLOCKS, NUM_CACHED,
                                           NUM_TOKENS, OFFSET, CAPACITY, PLACEHOLDERS,
                                           PREEMPTED, PREEMPTIONS, PREFILL_TARGET, PRIORITY,
                                           PROMPT, RECOMPUTED, RUNNING, SPEC, SPEC_ACCEPTED,
                                           SPEC_DRAFTED, SPEC_PASSES, STATUS, UNFINISHED)
from servesim.scheduler.output import KIND_NEW, KIND_RESUMED, KIND_RUNNING
from servesim.scheduler.scheduler import LIVELOCK_PREEMPTIONS

# cfg
(C_MAX_SEQS, C_BUDGET, C_MAX_MODEL_LEN, C_CHUNKED, C_THRESHOLD, C_PRIORITY, C_RESERVE,
 C_WATERMARK_BLOCKS, C_ASYNC, C_BLOCK_SIZE, C_CACHING, C_USABLE,
 C_SPEC_K, C_LOOKAHEAD, C_HASH_LOOKAHEAD, C_SEED, C_CHECK) = range(17)
NUM_CFG = 17
# speculative decoding (docs/engine.md §12): C_SPEC_K drafts
# per decode (0: off), C_LOOKAHEAD KV slots reserved beyond the scheduled
# tokens, C_HASH_LOOKAHEAD tokens of the next block in a block's hash, C_SEED
# keys acceptance draws; C_CHECK: the debug mode's invariant check after every
# pass (servesim/scheduler/check.py; 0 off, 1 this rank, 2 this rank and the
# whole table: the only scheduler on it)
# S (after the waiting queue's two slots)
(S_RUN_N, S_PREEMPTIONS, S_QUERIES, S_HITS, S_PQUERIES, S_PHITS, S_STALL,
 S_CHECKED_PASSES) = range(2, 10)
NUM_SCALARS = 10  # S_CHECKED_PASSES: passes decided with a batch, counted by the check
# out rows
O_REQ, O_TOK, O_CACHED, O_KIND, O_FLAGS, O_SPEC, O_PRE, O_UNFIN = range(8)
NUM_OUT_ROWS = 8  # O_SPEC: draft tokens scheduled (included in O_TOK)
K_NEW, K_RESUMED, K_RUNNING = 0, 1, 2
KIND_NAMES = (KIND_NEW, KIND_RESUMED, KIND_RUNNING)
F_SAMPLES = 1  # flags of an entry
# feats
(N_SCHED, N_PRE, N_UNFIN, PREFILL_TOKENS, NUM_PREFILL, DECODE_REQS, DECODE_CTX,
 TOTAL_TOKENS, FREE_BLOCKS, SPEC_TOKENS, PREFILL_CTX) = range(11)
NUM_FEATS = 11  # SPEC_TOKENS: draft tokens scheduled (included in TOTAL_TOKENS)


@njit
def _allocate(R, idents, tables, blocks, idmap, pscal, cfg, i, num_new, hits, num_hit,
              reserve_tokens, extra_blocks):
    """`KVCacheManager.allocate_slots` (kvcache/manager.py) over the table.
    Slots cover `min(total + num_lookahead_tokens, max_model_len)` tokens
    (the lookahead is k under speculative decoding, else 0); blocks are
    registered when full within the known tokens, and only once the hash
    lookahead token exists."""
    bs = cfg[C_BLOCK_SIZE]
    off = R[i, OFFSET]
    end = off + R[i, CAPACITY]
    total = R[i, COMPUTED] + num_hit * bs + num_new
    needed = -(-min(total + cfg[C_LOOKAHEAD], cfg[C_MAX_MODEL_LEN]) // bs)
    checked = max(needed, -(-reserve_tokens // bs)) + extra_blocks
    if num_hit > 0 or checked > R[i, NUM_BLOCKS]:
        held = bp.allocate_slots(blocks, idmap, pscal, tables[off:end], R[i, NUM_BLOCKS],
                                 hits, num_hit, needed, checked)
        if held < 0:
            return False
        R[i, NUM_BLOCKS] = held
    # else: the blocks it holds cover the tokens and the check (most decodes)
    if num_hit > 0:
        R[i, NUM_CACHED] = num_hit
    cache_blocks(R, idents, tables, blocks, idmap, cfg, i, total)
    return True


@njit(inline="always")  # runs for every sampled token: kept to a compare
def cache_blocks(R, idents, tables, blocks, idmap, cfg, i, num_tokens):
    """`KVCacheManager.cache_blocks` (kvcache/manager.py) over the table:
    register request i's held blocks full within `min(num_tokens, its known
    tokens)` not registered yet. Called by `_allocate` and, for a RUNNING
    request whose sampled token arrives, by `update_from_output` with the
    tokens whose pass has completed. Most calls fill no new block: inlined,
    they cost the one compare before the out-of-line registration."""
    bs = cfg[C_BLOCK_SIZE]
    if cfg[C_CACHING] and num_tokens >= (R[i, NUM_CACHED] + 1) * bs:  # a block may be full
        # with a hash lookahead token, a block's hash exists once the next token does
        num_full = min(num_tokens, R[i, NUM_TOKENS] - cfg[C_HASH_LOOKAHEAD]) // bs
        if num_full > R[i, NUM_CACHED]:
            _cache_full_blocks(R, idents, tables, blocks, idmap, i, num_full)


@njit
def _cache_full_blocks(R, idents, tables, blocks, idmap, i, num_full):
    off = R[i, OFFSET]
    end = off + R[i, CAPACITY]
    bp.cache_full_blocks(blocks, idmap, tables[off:end], idents[off:end],
                         R[i, NUM_CACHED], num_full)
    R[i, NUM_CACHED] = num_full


@njit
def _free(R, tables, blocks, pscal, i):
    off = R[i, OFFSET]
    bp.free_blocks(blocks, pscal, tables[off:off + R[i, CAPACITY]], R[i, NUM_BLOCKS])
    R[i, NUM_BLOCKS] = 0
    R[i, NUM_CACHED] = 0


@njit
def _victim_index(R, F, running, n, priority):
    if not priority:
        return n - 1
    best = 0
    for k in range(1, n):
        a, b = running[k], running[best]
        if (R[a, PRIORITY] > R[b, PRIORITY]
                or (R[a, PRIORITY] == R[b, PRIORITY] and F[a, ARRIVAL] > F[b, ARRIVAL])):
            best = k
    return best


@njit
def _preempt(R, F, tables, blocks, pscal, S, wq, priority, i):
    _free(R, tables, blocks, pscal, i)
    R[i, STATUS] = PREEMPTED
    R[i, COMPUTED] = 0
    R[i, PLACEHOLDERS] = 0
    R[i, SPEC] = 0
    R[i, PREEMPTIONS] += 1
    S[S_PREEMPTIONS] += 1
    S[S_STALL] += 1
    wq_prepend(R, F, S, wq, priority, i)


@njit
def _schedule_running(R, F, idents, tables, blocks, idmap, pscal, cfg, S, running, wq,
                      out, feats, budget, threshold):
    """The running loop (docs/engine.md §3 steps 1-4, §6)."""
    priority = cfg[C_PRIORITY]
    index = 0
    no_hits = np.zeros(0, dtype=np.int64)
    while index < S[S_RUN_N] and budget > 0:
        i = running[index]
        placeholders = R[i, PLACEHOLDERS]
        computed = R[i, COMPUTED]
        if (placeholders > 0 and computed + 2 - placeholders
                >= R[i, PROMPT] + R[i, MAX_TOKENS]):
            index += 1
            continue
        num_new = R[i, NUM_TOKENS] + R[i, SPEC] + placeholders - computed
        if 0 < threshold < num_new:
            num_new = threshold
        num_new = min(num_new, budget, cfg[C_MAX_MODEL_LEN] - 1 - computed)
        if num_new <= 0:
            index += 1
            continue
        scheduled = True
        while not _allocate(R, idents, tables, blocks, idmap, pscal, cfg, i, num_new,
                            no_hits, 0, 0, 0):
            n_run = S[S_RUN_N]
            v = _victim_index(R, F, running, n_run, priority)
            victim = running[v]
            for k in range(v, n_run - 1):
                running[k] = running[k + 1]
            S[S_RUN_N] = n_run - 1
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
            _preempt(R, F, tables, blocks, pscal, S, wq, priority, victim)
            out[O_PRE, feats[N_PRE]] = victim
            feats[N_PRE] += 1
            if victim == i:
                if S[S_RUN_N] == 0:  # alone and still too big: it never fits
                    wq_remove(R, F, S, wq, priority, i)
                    R[i, STATUS] = UNFINISHED
                    out[O_UNFIN, feats[N_UNFIN]] = i
                    feats[N_UNFIN] += 1
                scheduled = False
                break
        if scheduled:
            e = feats[N_SCHED]
            out[O_REQ, e] = i
            out[O_TOK, e] = num_new
            out[O_CACHED, e] = 0
            out[O_KIND, e] = K_RUNNING
            out[O_SPEC, e] = scheduled_drafts(R, i, num_new)
            feats[N_SCHED] = e + 1
            budget -= num_new
            index += 1
        elif not priority:
            break
    return budget


@njit
def _schedule_waiting(R, F, idents, tables, blocks, idmap, pscal, cfg, S, running, wq,
                      out, feats, budget, threshold):
    """Admission, strict head of line (docs/engine.md §3, waiting loop)."""
    priority = cfg[C_PRIORITY]
    bs = cfg[C_BLOCK_SIZE]
    while S[WQ_LEN] > 0 and budget > 0 and S[S_RUN_N] < cfg[C_MAX_SEQS]:
        i = wq_peek(S, wq, priority)
        num_tokens = R[i, NUM_TOKENS]
        # its resume reserves the lookahead slots too (as `can_ever_fit` at arrival)
        if -(-min(num_tokens + cfg[C_LOOKAHEAD], cfg[C_MAX_MODEL_LEN]) // bs) > cfg[C_USABLE]:
            # preempted after outgrowing the pool: it can never be admitted again
            if feats[N_UNFIN] == out.shape[1]:
                break
            wq_pop(R, F, S, wq, priority)
            R[i, STATUS] = UNFINISHED
            out[O_UNFIN, feats[N_UNFIN]] = i
            feats[N_UNFIN] += 1
            continue
        num_hit = 0
        hits = np.zeros(0, dtype=np.int64)
        if cfg[C_CACHING]:
            max_blocks = (num_tokens - 1) // bs
            hits = np.empty(max_blocks, dtype=np.int64)
            off = R[i, OFFSET]
            num_hit = bp.find_cached_prefix(blocks, idmap, idents[off:off + R[i, CAPACITY]],
                                            max_blocks, hits)
        hit = num_hit * bs
        num_new = num_tokens - hit
        if 0 < threshold < num_new:
            num_new = threshold
        if not cfg[C_CHUNKED] and num_new > budget:
            break
        num_new = min(num_new, budget)
        drafts = 0
        if num_new == 1 and cfg[C_SPEC_K] > 0 and num_tokens - hit == 1:
            drafts = _padding_drafts(R, cfg, out, feats, hit)
            if drafts > budget - 1:
                break
            num_new += drafts
        reserve = num_tokens if cfg[C_RESERVE] else 0
        extra = cfg[C_WATERMARK_BLOCKS] if S[S_RUN_N] > 0 else 0
        if not _allocate(R, idents, tables, blocks, idmap, pscal, cfg, i, num_new,
                         hits[:num_hit], num_hit, reserve, extra):
            break
        wq_pop(R, F, S, wq, priority)
        resumed = R[i, STATUS] == PREEMPTED
        if resumed:
            S[S_PQUERIES] += num_tokens
            S[S_PHITS] += hit
        else:
            S[S_QUERIES] += num_tokens
            S[S_HITS] += hit
        if R[i, FIRST_CACHED] < 0:
            R[i, FIRST_CACHED] = hit
        R[i, STATUS] = RUNNING
        R[i, COMPUTED] = hit
        R[i, PREFILL_TARGET] = num_tokens
        running[S[S_RUN_N]] = i
        S[S_RUN_N] += 1
        e = feats[N_SCHED]
        out[O_REQ, e] = i
        out[O_TOK, e] = num_new
        out[O_CACHED, e] = hit
        out[O_KIND, e] = K_RESUMED if resumed else K_NEW
        out[O_SPEC, e] = drafts
        feats[N_SCHED] = e + 1
        budget -= num_new


@njit(inline="always")
def scheduled_drafts(R, i, num_new):
    """`Scheduler.schedule`, running loop (vllm/v1/core/sched/scheduler.py):
    the drafts a request granted `num_new` tokens schedules are the tail of
    its ask beyond its known tokens and placeholders, `num_new + computed -
    num_tokens - placeholders` (so b granted tokens keep b - 1 drafts); its
    draft list (`spec_token_ids`) is cleared once it is scheduled."""
    drafts = max(0, num_new + R[i, COMPUTED] - R[i, NUM_TOKENS] - R[i, PLACEHOLDERS])
    R[i, SPEC] = 0
    return drafts


@njit
def _padding_drafts(R, cfg, out, feats, hit):
    """`Scheduler.schedule`, waiting loop (vllm/v1/core/sched/scheduler.py):
    an admission with one token to compute is padded with k never-accepted
    drafts when no request scheduled
    in this pass is a prefill chunk, a request was already scheduled in this
    pass or the admission has cached tokens, and `hit + 1 + k + 1 <=
    max_model_len`. Returns the padding drafts (0: none)."""
    k = cfg[C_SPEC_K]
    if hit + k + 2 > cfg[C_MAX_MODEL_LEN]:
        return 0
    if feats[N_SCHED] == 0 and hit == 0:
        return 0
    for e in range(feats[N_SCHED]):
        j = out[O_REQ, e]
        if R[j, COMPUTED] + out[O_TOK, e] < R[j, NUM_TOKENS] + R[j, PLACEHOLDERS]:
            return 0  # a prefill chunk
    return k


@njit
def _update_after_schedule(R, cfg, out, feats):
    for e in range(feats[N_SCHED]):
        i = out[O_REQ, e]
        n = out[O_TOK, e]
        drafts = out[O_SPEC, e]
        before = R[i, COMPUTED]
        after = before + n
        R[i, COMPUTED] = after
        high = R[i, MAX_COMPUTED]
        real = after - drafts  # draft positions are not counted as computed
        if before < high:
            R[i, RECOMPUTED] += max(0, min(real, high) - before)
        if real > high:
            R[i, MAX_COMPUTED] = real
        flags = 0
        if after >= R[i, NUM_TOKENS] + R[i, PLACEHOLDERS]:
            flags |= F_SAMPLES
            if cfg[C_ASYNC]:
                R[i, PLACEHOLDERS] += 1 + drafts
                R[i, SPEC] = cfg[C_SPEC_K]  # AsyncScheduler: k placeholder drafts
        feats[TOTAL_TOKENS] += n
        feats[SPEC_TOKENS] += drafts
        if before < R[i, PREFILL_TARGET]:
            feats[PREFILL_TOKENS] += n
            feats[NUM_PREFILL] += 1
            feats[PREFILL_CTX] += before
        else:
            feats[DECODE_REQS] += 1
            feats[DECODE_CTX] += R[i, NUM_TOKENS]
        out[O_FLAGS, e] = flags


@njit
def schedule(R, F, idents, tables, blocks, idmap, pscal, cfg, S, running, wq, out, feats):
    """One `Scheduler.schedule()`; fills `out` and `feats`."""
    threshold = cfg[C_THRESHOLD]
    if S[S_RUN_N] + S[WQ_LEN] <= 1:
        threshold = 0
    budget = _schedule_running(R, F, idents, tables, blocks, idmap, pscal, cfg, S, running,
                               wq, out, feats, cfg[C_BUDGET], threshold)
    if feats[N_PRE] == 0:
        _schedule_waiting(R, F, idents, tables, blocks, idmap, pscal, cfg, S, running, wq,
                          out, feats, budget, threshold)
    _update_after_schedule(R, cfg, out, feats)
    feats[FREE_BLOCKS] = pscal[bp.NUM_FREE]
    if cfg[C_CHECK]:
        check_pass(R, F, idents, tables, blocks, idmap, pscal, cfg, S, running, wq, out, feats,
                   check.AFTER_SCHEDULE, -1)


@njit
def check_pass(R, F, idents, tables, blocks, idmap, pscal, cfg, S, running, wq, out, feats,
               where, pass_index):
    """The debug mode's invariant check (servesim/scheduler/check.py) of this
    rank after a pass: after `schedule()` (`feats` given, its entries checked
    too; the pass index is that of the pass decided, counted here) or after
    `update_from_output()` of pass `pass_index` (`feats` empty)."""
    n_sched = -1
    total = 0
    capped = out[O_TOK, :0]
    if len(feats):
        n_sched = feats[N_SCHED]
        total = feats[TOTAL_TOKENS]
        pass_index = S[S_CHECKED_PASSES]
        if n_sched > 0:
            S[S_CHECKED_PASSES] += 1
        # the threshold caps an admission before its padding drafts
        capped = out[O_TOK, :n_sched].copy()
        for e in range(n_sched):
            if out[O_KIND, e] != K_RUNNING:
                capped[e] -= out[O_SPEC, e]
    priority = cfg[C_PRIORITY]
    check.check_rank(R, F, idents, tables, blocks, idmap, pscal, running, S[S_RUN_N], wq,
                     0 if priority else S[WQ_HEAD], S[WQ_LEN], priority, running[:0], 0,
                     out[O_REQ], out[O_TOK], capped, n_sched, total, cfg[C_MAX_SEQS],
                     cfg[C_BUDGET], cfg[C_THRESHOLD], cfg[C_BLOCK_SIZE], cfg[C_SPEC_K],
                     cfg[C_MAX_MODEL_LEN], cfg[C_CHECK] == 2, where, pass_index)


@njit(inline="always")
def _append_token(R, i, release_ms, pass_index, detokenize_ms, client_ms, token_offsets,
                  last_client, max_model_len):
    """Append one sampled token; True when the request stops on it (`check_stop`:
    max_tokens, then max_model_len)."""
    R[i, NUM_TOKENS] += 1
    if R[i, PLACEHOLDERS] > 0:
        R[i, PLACEHOLDERS] -= 1
    produced = R[i, NUM_TOKENS] - R[i, PROMPT]
    client = max(release_ms, last_client[i]) + detokenize_ms
    last_client[i] = client
    client_ms[token_offsets[i] + produced - 1] = client
    if R[i, FIRST_TOKEN_PASS] < 0:
        R[i, FIRST_TOKEN_PASS] = pass_index
    R[i, FINISH_PASS] = pass_index
    return produced >= R[i, MAX_TOKENS] or R[i, NUM_TOKENS] >= max_model_len


@njit(inline="always")
def _append_verified(R, cfg, spec, out, e, i, stale, release_ms, pass_index, detokenize_ms,
                     client_ms, token_offsets, last_client):
    """Speculative decoding (`_update_request_with_output`,
    vllm/v1/core/sched/scheduler.py; `check_stop` after each token): the 1 +
    accepted tokens of entry e, appended one at a time; at the stop the rest
    is trimmed (taken off
    `num_computed_tokens`, and off the placeholders under async). True when
    the request stops."""
    drafts = out[O_SPEC, e]
    tokens = 1
    if drafts > 0:
        tokens = _verify_drafts(R, cfg, spec, i, drafts, out[O_KIND, e] == K_RUNNING, stale)
    for t in range(tokens):
        if _append_token(R, i, release_ms, pass_index, detokenize_ms, client_ms,
                         token_offsets, last_client, cfg[C_MAX_MODEL_LEN]):
            if not stale:
                trimmed = tokens - 1 - t
                R[i, COMPUTED] -= trimmed
                if cfg[C_ASYNC]:
                    R[i, PLACEHOLDERS] -= trimmed
            return True
    return False


@njit(inline="always")
def _verify_drafts(R, cfg, spec, i, drafts, real, stale):
    """`Scheduler.update_from_output` / `_update_request_with_output`
    (vllm/v1/core/sched/scheduler.py) under speculative decoding: of
    `drafts` drafts, the accepted ones (none for padding; `real` drafts draw
    from the request's `accepted` list or the rates) stay computed, the
    rejected ones roll `num_computed_tokens` back (async: the placeholders
    too) and keep their blocks. A stale output (the request was preempted
    with it in flight) leaves `num_computed_tokens` and the placeholders
    alone but still counts in the acceptance statistics, as vLLM records
    them. Returns the tokens it yields."""
    acc_offsets, acc_values, rates, pos_counts, keys = spec
    accepted = 0
    if real:
        draw = R[i, SPEC_PASSES]
        accepted = accepted_drafts(cfg[C_SEED], rates, acc_offsets, acc_values, i, keys[i],
                                   draw, drafts)
        R[i, SPEC_PASSES] = draw + 1
        R[i, SPEC_DRAFTED] += drafts
        R[i, SPEC_ACCEPTED] += accepted
        for pos in range(drafts):
            pos_counts[0, pos] += 1
            if pos < accepted:
                pos_counts[1, pos] += 1
    if not stale:
        rejected = drafts - accepted
        R[i, COMPUTED] -= rejected
        if cfg[C_ASYNC]:
            R[i, PLACEHOLDERS] -= rejected
        # accepted drafts are computed tokens: a recompute after preemption counts them
        R[i, MAX_COMPUTED] = max(R[i, MAX_COMPUTED], R[i, COMPUTED] - R[i, PLACEHOLDERS])
    return 1 + accepted


@njit
def update_from_output(R, F, idents, tables, blocks, idmap, pscal, cfg, spec, S, running, wq,
                       out, n_sched, release_ms, pass_index, detokenize_ms, client_ms,
                       token_offsets, last_client, finished):
    """`Scheduler.update_from_output`: append sampled tokens (released at
    `release_ms`, reaching the client after detokenization), register the
    blocks of requests that were RUNNING up to their completed tokens
    (`cache_blocks`), finish requests and free their blocks. Fills `finished`
    and returns how many.

    Under speculative decoding a pass yields 1 + accepted tokens per request
    (`_append_verified`); a sync engine's drafter then proposes k drafts for
    every request that sampled and did not finish."""
    num_finished = 0
    max_model_len = cfg[C_MAX_MODEL_LEN]
    k = cfg[C_SPEC_K]
    for e in range(n_sched):
        if not out[O_FLAGS, e] & F_SAMPLES:
            continue
        i = out[O_REQ, e]
        if R[i, STATUS] >= FINISHED:
            continue
        S[S_STALL] = 0
        was_running = R[i, STATUS] == RUNNING
        if k == 0:
            stopped = _append_token(R, i, release_ms, pass_index, detokenize_ms, client_ms,
                                    token_offsets, last_client, max_model_len)
        else:
            stopped = _append_verified(R, cfg, spec, out, e, i, not was_running, release_ms,
                                       pass_index, detokenize_ms, client_ms, token_offsets,
                                       last_client)
        if was_running:
            # cache_blocks(request, num_computed_tokens - num_in_flight_tokens)
            cache_blocks(R, idents, tables, blocks, idmap, cfg, i, R[i, COMPUTED] - R[i, PLACEHOLDERS])
        if stopped:
            finished[num_finished] = i
            num_finished += 1
        elif k and was_running and not cfg[C_ASYNC]:
            R[i, SPEC] = k  # EngineCore.post_step: update_draft_token_ids
    if num_finished:
        for j in range(num_finished):
            i = finished[j]
            if R[i, STATUS] == RUNNING:
                _free(R, tables, blocks, pscal, i)
            else:  # preempted with its last token in flight
                wq_remove(R, F, S, wq, cfg[C_PRIORITY], i)
            R[i, STATUS] = FINISHED
        kept = 0
        for j in range(S[S_RUN_N]):
            i = running[j]
            if R[i, STATUS] != FINISHED:
                running[kept] = i
                kept += 1
        S[S_RUN_N] = kept
    if cfg[C_CHECK]:
        check_pass(R, F, idents, tables, blocks, idmap, pscal, cfg, S, running, wq, out,
                   out[0, :0], check.AFTER_OUTPUT, pass_index)
    return num_finished


@njit
def mark_started(F, out, n_sched, start_ms):
    for e in range(n_sched):
        if out[O_KIND, e] == K_NEW:
            F[out[O_REQ, e], FIRST_SCHEDULED] = start_ms


@njit
def add_request(R, F, S, wq, priority, i):
    wq_add(R, F, S, wq, priority, i)


@njit
def pending_prefill_tokens(R, S, running, wq, priority):
    """`Scheduler.pending_prefill_tokens` over the table."""
    total = 0
    for k in range(S[S_RUN_N]):
        i = running[k]
        if R[i, PREFILL_TARGET] > R[i, COMPUTED]:
            total += R[i, PREFILL_TARGET] - R[i, COMPUTED]
    head = 0 if priority else S[0]
    for k in range(S[WQ_LEN]):
        total += R[wq[(head + k) % len(wq)], NUM_TOKENS]
    return total


@njit
def take_out_all(R, F, tables, blocks, pscal, S, running, wq, priority, taken):
    """Take every running and waiting request out as unfinished (a livelock:
    see `Scheduler._take_out_livelocked`). Returns how many."""
    n = 0
    for k in range(S[S_RUN_N]):
        i = running[k]
        _free(R, tables, blocks, pscal, i)
        R[i, STATUS] = UNFINISHED
        taken[n] = i
        n += 1
    S[S_RUN_N] = 0
    while S[WQ_LEN] > 0:
        i = wq_pop(R, F, S, wq, priority)
        R[i, STATUS] = UNFINISHED
        taken[n] = i
        n += 1
    S[S_STALL] = 0
    return n


class FastOutput:
    """A pass decided by :class:`FastScheduler`: the protocol of
    :class:`~servesim.scheduler.output.SchedulerOutput` over `out`/`feats`."""

    __slots__ = ("out", "feats")

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
    free_blocks_after_schedule = property(lambda self: int(self.feats[FREE_BLOCKS]))


class _PrefixCacheStats:
    def __init__(self, S):
        self._S = S

    queries = property(lambda self: int(self._S[S_QUERIES]))
    hits = property(lambda self: int(self._S[S_HITS]))
    preempted_queries = property(lambda self: int(self._S[S_PQUERIES]))
    preempted_hits = property(lambda self: int(self._S[S_PHITS]))


class FastScheduler:
    """One rank's compiled scheduler, with the reference scheduler's interface
    toward the engine core; requests are indices into the shared table."""

    def __init__(self, config, pool, table, tokens, speculative=None):
        self.config = config
        self.pool = pool
        self.table = table
        self.tokens = tokens
        self.block_size = pool.block_size
        self.num_gpu_blocks = pool.num_gpu_blocks
        self.max_model_len = config.max_model_len or (1 << 62)
        self.priority = config.scheduling_policy == "priority"
        self.cfg = np.zeros(NUM_CFG, dtype=np.int64)
        self.cfg[C_USABLE] = pool.num_gpu_blocks - 1
        self.cfg[C_MAX_SEQS] = config.max_num_seqs
        self.cfg[C_BUDGET] = config.max_num_batched_tokens
        self.cfg[C_MAX_MODEL_LEN] = self.max_model_len
        self.cfg[C_CHUNKED] = config.enable_chunked_prefill
        self.cfg[C_THRESHOLD] = config.long_prefill_token_threshold
        self.cfg[C_PRIORITY] = self.priority
        self.cfg[C_RESERVE] = config.reserve_full_isl
        self.cfg[C_WATERMARK_BLOCKS] = int(config.watermark * pool.num_gpu_blocks)
        self.cfg[C_ASYNC] = config.async_scheduling
        self.cfg[C_BLOCK_SIZE] = pool.block_size
        self.cfg[C_CACHING] = pool.enable_caching
        self.speculative = speculative
        k = 0 if speculative is None else speculative.num_speculative_tokens
        rates = np.zeros(max(k, 1), dtype=np.float64)
        if k:
            self.cfg[C_SPEC_K] = k
            self.cfg[C_LOOKAHEAD] = k  # num_lookahead_tokens for mtp / eagle / ngram
            self.cfg[C_HASH_LOOKAHEAD] = int(pool.enable_caching)
            self.cfg[C_SEED] = speculative.seed
            rates[:] = speculative.acceptance_rates
        # (accepted-list offsets, values, rates, per-position [drafted, accepted],
        # each request's key for its acceptance draws)
        self.spec = (table.accepted_offsets, table.accepted_values, rates,
                     np.zeros((2, max(k, 1)), dtype=np.int64), table.request_keys())
        self.S = np.zeros(NUM_SCALARS, dtype=np.int64)
        self.running = np.zeros(config.max_num_seqs + 1, dtype=np.int64)
        self.wq = np.zeros(len(table.request_ids) + 1, dtype=np.int64)
        self._out_width = config.max_num_seqs + 1
        self.finished_buffer = np.zeros(len(table.request_ids) + 1, dtype=np.int64)
        self.prefix_cache_stats = _PrefixCacheStats(self.S)
        self.unfinishable = []
        self.stop_on_finish = False  # closed loop: a finish releases the next request
        if check.enabled():
            # the debug mode; the whole table is checked while this is the only
            # scheduler on it (other ranks' requests are in their own queues)
            table.checked_schedulers.append(self)
            mode = 2 if len(table.checked_schedulers) == 1 else 1
            for peer in table.checked_schedulers:
                peer.cfg[C_CHECK] = mode

    # -- requests in ---------------------------------------------------------

    def can_ever_fit(self, num_prompt_tokens) -> bool:
        """A prompt reaching max_model_len, or whose prefill needs more blocks
        than usable, is rejected at arrival (docs/engine.md §3). The prefill
        that completes a prompt also reserves the lookahead slots of
        speculative decoding (`allocate_slots`' `num_lookahead_tokens`,
        vllm/v1/core/kv_cache_manager.py), capped at max_model_len like every
        allocation, so those count too: such a request could never be admitted
        and would hold the queue behind it forever."""
        slots = min(num_prompt_tokens + int(self.cfg[C_LOOKAHEAD]), self.max_model_len)
        return (-(-slots // self.block_size) <= self.num_gpu_blocks - 1
                and num_prompt_tokens < self.max_model_len)

    def add_request(self, i):
        add_request(self.table.R, self.table.F, self.S, self.wq, self.priority, i)

    def has_requests(self) -> bool:
        return bool(self.S[S_RUN_N] or self.S[WQ_LEN])

    def pending_prefill_tokens(self) -> int:
        return int(pending_prefill_tokens(self.table.R, self.S, self.running, self.wq,
                                          self.priority))

    def queue_members(self):
        """`(running, waiting)`: the request indices of each (for the debug
        mode's check across schedulers, servesim/scheduler/check.py)."""
        head = 0 if self.priority else self.S[WQ_HEAD]
        waiting = self.wq[(head + np.arange(self.S[WQ_LEN])) % len(self.wq)]
        return self.running[:self.S[S_RUN_N]].copy(), waiting

    num_running = property(lambda self: int(self.S[S_RUN_N]))
    num_waiting = property(lambda self: int(self.S[WQ_LEN]))
    num_preemptions = property(lambda self: int(self.S[S_PREEMPTIONS]))

    # -- passes --------------------------------------------------------------

    def schedule(self) -> FastOutput:
        t = self.table
        p = self.pool
        out = np.empty((NUM_OUT_ROWS, self._out_width), dtype=np.int64)
        feats = np.zeros(NUM_FEATS, dtype=np.int64)
        if self.S[S_STALL] > LIVELOCK_PREEMPTIONS:
            n = take_out_all(t.R, t.F, t.tables, p.blocks, p.scalars, self.S, self.running,
                             self.wq, self.priority, self.finished_buffer)
            self.unfinishable.extend(self.finished_buffer[:n].tolist())
            if self.cfg[C_CHECK]:
                check_pass(t.R, t.F, t.idents, t.tables, p.blocks, p.idmap, p.scalars, self.cfg,
                           self.S, self.running, self.wq, out, feats[:0], check.AFTER_TAKE_OUT,
                           int(self.S[S_CHECKED_PASSES]))
            return FastOutput(out, feats)
        schedule(t.R, t.F, t.idents, t.tables, p.blocks, p.idmap, p.scalars, self.cfg,
                 self.S, self.running, self.wq, out, feats)
        result = FastOutput(out, feats)
        self.note_unfinishable(result)
        return result

    def note_unfinishable(self, out: FastOutput):
        n = out.feats[N_UNFIN]
        if n:
            self.unfinishable.extend(int(i) for i in out.out[O_UNFIN, :n])

    def mark_started(self, out: FastOutput, start_ms: float):
        mark_started(self.table.F, out.out, out.feats[N_SCHED], start_ms)

    def update_from_output(self, out: FastOutput, release_ms: float, pass_index: int):
        t = self.table
        tok = self.tokens
        p = self.pool
        n = update_from_output(t.R, t.F, t.idents, t.tables, p.blocks, p.idmap, p.scalars,
                               self.cfg, self.spec, self.S, self.running, self.wq, out.out,
                               out.feats[N_SCHED], release_ms, pass_index,
                               tok.detokenize_ms, tok.client_ms, tok.offsets,
                               tok.last_client, self.finished_buffer)
        return self.finished_buffer[:n].tolist() if n else []

    def log_entries(self, out: FastOutput):
        ids = self.table.request_ids
        o = out.out
        scheduled = [{"id": ids[o[O_REQ, e]], "tokens": int(o[O_TOK, e]),
                      "cached": int(o[O_CACHED, e]), "kind": KIND_NAMES[o[O_KIND, e]]}
                     for e in range(out.num_scheduled)]
        if self.speculative is not None:
            for e, entry in enumerate(scheduled):
                entry["spec"] = int(o[O_SPEC, e])
        return scheduled, sorted(ids[i] for i in o[O_PRE, :out.num_preempted])
