"""Speculative decoding's kernels (docs/engine.md §12): how many drafts a
request gets, the padding drafts of an admission, and how many a
verification pass accepts.

- `scheduled_drafts`: the drafts the running loop asks room for;
- `_padding_drafts`: a prefill's padding drafts (vLLM schedules them and rejects them);
- `accepted_drafts`: a trace's `accepted` list, cycled, or a draw per position
  from a counter-based generator keyed by (seed, request, verification, position)
  (`uniform`; the part keyed by seed and request made once, `draw_states`);
- `_verify_drafts`: the accepted prefix kept, the rest rolled back;
- `position_counts`: the per-position acceptance counts of a rank's passes.

The config is speculative.py's `SpeculativeConfig`.
"""


import numpy as np

from servesim.jit import njit, plain_python

from servesim.scheduler.output import N_SCHED, O_KIND, O_REQ, PassKind


@njit(inline="always")
def _mix(x):
    """servesim's own: splitmix64's finaliser, a well-mixed 64-bit value of x
    for the acceptance draws (docs/engine.md §12).

    - Its products wrap modulo 2**64.
    """
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


if plain_python():  # NumPy's scalars wrap too, but warn each time: not here
    _mix_wrapping = _mix

    def _mix(x):
        with np.errstate(over="ignore"):
            return _mix_wrapping(x)


@njit(inline="always")
def uniform_from(state, draw, position):
    """servesim's own: a uniform number in [0, 1) for one draft position of
    one verification pass of one request (docs/engine.md §12).

    - A pure function of the request's state (its seed and key finalised,
      `draw_states`), the draw number and the position.
    """
    x = _mix(state ^ np.uint64(draw))
    x = _mix(x ^ np.uint64(position))
    return float(x >> np.uint64(11)) * (1.0 / 9007199254740992.0)


def draw_states(seed, keys):
    """Each request's generator state from its key, the seed and the request
    finalised (acceptance_profiles.py's `request_states`): `accepted_drafts`
    reads it (`uniform_from`)."""
    from servesim.scheduler.acceptance_profiles import request_states

    return request_states(seed, keys)


@njit(inline="always")
def accepted_drafts(rates, acc_offsets, acc_values, request, state, draw, num_drafts):
    """servesim's own: how many of `num_drafts` real drafts the request's
    `draw`-th verification pass accepts (docs/engine.md §12).

    - Its `accepted` list (cycled) when the trace gives one.
    - Else draft position a is accepted when its draw `uniform_from(state,
      draw, a)` (`state`: the request's, `draw_states`) is below `rates[a]`
      and every draft before it was.
    - At most `num_drafts`.
    """
    lo = acc_offsets[request]
    n = acc_offsets[request + 1] - lo
    if n > 0:
        return min(acc_values[lo + draw % n], num_drafts)
    # every position drawn (the draws are independent), the accepted prefix
    # counted without a branch on each: which position rejects is random
    a = 0
    alive = True
    for pos in range(num_drafts):
        alive = alive & (uniform_from(state, draw, pos) < rates[pos])
        a += alive
    return a


def position_counts(verified):
    """Per draft position, the verification passes that drafted it and
    those that accepted it (`[2, max(k, 1)]`, summary.json's
    `acceptance_rate_per_position` over the first row's first entry, every
    verification pass), from the rank's histogram `verified[drafts,
    accepted]` of the verification passes of real drafts (`_verify_drafts`:
    one count a pass, not one per position)."""
    k = verified.shape[0] - 1
    counts = np.zeros((2, max(k, 1)), dtype=np.int64)
    for pos in range(k):
        counts[0, pos] = verified[pos + 1:, :].sum()
        counts[1, pos] = verified[:, pos + 1:].sum()
    return counts


@njit(inline="always")
def scheduled_drafts(R, i, num_new):
    """`Scheduler.schedule` (vllm/v1/core/sched/scheduler.py): in the running
    loop, the drafts a request granted `num_new` tokens schedules.

    - They are the tail of its ask beyond its known tokens and placeholders,
      `num_new + computed - num_tokens - placeholders` (so b granted tokens
      keep b - 1 drafts).
    - Its draft list (`spec_token_ids`) is cleared once it is scheduled.
    """
    drafts = max(0, num_new + R[i].num_computed_tokens - R[i].num_tokens
                 - R[i].num_output_placeholders)
    R[i].num_spec_tokens = 0
    return drafts


@njit
def _padding_drafts(s, out, feats, hit):
    """`Scheduler.schedule` (vllm/v1/core/sched/scheduler.py): in the waiting
    loop, the k never-accepted drafts that pad an admission with one token to
    compute (0: none).

    - Only when no request the running loop scheduled in this pass entered
      it as a prefill chunk (`prefill_scheduled`, from `is_prefill_chunk`:
      its computed tokens below its prefill target, docs/engine.md §10);
    - and a request of the running loop was scheduled
      (`scheduled_running_reqs`) or the admission has cached tokens;
    - and `hit + 1 + k + 1 <= max_model_len`.
    - Admissions earlier in the waiting loop count for neither.
    """
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


@njit(inline="always")
def _verify_drafts(s, i, drafts, real, stale):
    """`Scheduler.update_from_output` (vllm/v1/core/sched/scheduler.py): under
    speculative decoding, with `_update_request_with_output`, the drafts of
    one entry verified; returns the tokens it yields.

    - Of `drafts` drafts the accepted ones stay computed: none for padding;
      `real` drafts draw from the request's `accepted` list or the rates.
    - The rejected ones roll `num_computed_tokens` back (async: the
      placeholders too) and keep their blocks.
    - A stale output (the request was preempted with it in flight) leaves
      `num_computed_tokens` and the placeholders alone but still counts in
      the acceptance statistics, as vLLM records them.
    """
    R, cfg = s.R, s.cfg
    acc_offsets, acc_values, rates, verified, states = s.spec
    accepted = 0
    if real:
        draw = R[i].num_drafts
        accepted = accepted_drafts(rates, acc_offsets, acc_values, i, states[i], draw, drafts)
        R[i].num_drafts = draw + 1
        R[i].num_draft_tokens += drafts
        R[i].num_accepted_tokens += accepted
        verified[drafts, accepted] += 1  # the per-position counts: `position_counts`
    if not stale:
        rejected = drafts - accepted
        R[i].num_computed_tokens -= rejected
        if cfg[0].async_scheduling:
            R[i].num_output_placeholders -= rejected
        # accepted drafts are computed tokens: a recompute after preemption counts them
        R[i].max_num_computed_tokens = max(R[i].max_num_computed_tokens,
                                           R[i].num_computed_tokens - R[i].num_output_placeholders)
    return 1 + accepted
