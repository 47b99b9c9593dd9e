"""Pass times interpolated in tables (the `aic` timing, docs/deployment.md).

A table is one flat float64 array, the pricing kernel's `params`:
a header of HEADER slots — the node counts of the five axes, the
calibration factors of prefill-only, decode-only and mixed passes, the node
count of the mixed table's decode axis — then the five axes' nodes, then the
values, then the mixed decode axis:
- prefill[P, Q, K]: a pass of `P` prefill tokens in `Q` prefill requests
  whose computed context averages `K` tokens each. The database splits the
  tokens evenly, so its GEMMs see `Q * (P // Q)` tokens: that is the `P`
  coordinate, and the grid's steps stay on its nodes;
- decode[D, C]: a pass of `D` decode requests whose context averages `C`;
- mixed[M, E]: a pass of `M` tokens, `E` of them decode requests of
  context 1 and the rest one prompt without context (its GEMMs see `M`); its
  decode axis `E` is its own (the GEMM grid; the decode table's is denser),
  stored after the values.
- remainder[M, K]: what one more prompt of `M` tokens with context `K`
  adds to a mixed pass's prefill attention (see below).
A mixed pass costs mixed[P + D, E = D] plus what its attention adds over that base:
prefill[P, Q, K] - prefill[P, 1, 0] and decode[D, C] - decode[D, 1] (the
database prices a mixed step's GEMMs on all its tokens at once and its two
attentions apart, so the attention terms add). Unlike its prefill-only pass,
the database's mixed step keeps all `P` prompt tokens: it prices the prefill
attention as ceil(P / M) prompts of M = P // Q tokens, so when Q does not
divide P it holds ceil((P mod Q) / M) prompts more than Q, each adding
remainder[M, K]. Between nodes the kernel interpolates linearly along
each axis; beyond the last node it extrapolates the last interval's slope.
"""

import numpy as np

from servesim.jit import njit

N_P, N_Q, N_K, N_D, N_C, F_PREFILL, F_DECODE, F_MIXED, N_E = range(9)
# speculative decoding's slots (0 in a plain table, which ends with its mixed
# decode axis): SPEC_K drafts per request, SPEC_DRAFTER how they are drafted
# (DRAFT_LAYER: one decoder layer + the LM head per step, MTP and EAGLE;
# DRAFT_CPU: ngram, SPEC_CPU_MS per scheduled request), N_LAYERS the target's
# layers on a rank, N_H the LM head's nodes (appended: nodes, then values)
SPEC_K, SPEC_DRAFTER, SPEC_CPU_MS, N_LAYERS, N_H = range(9, 14)
DRAFT_LAYER, DRAFT_CPU = 1, 2
HEADER = 16


def pack(p_nodes, q_nodes, k_nodes, d_nodes, c_nodes, e_nodes, prefill, decode, mixed, remainder,
         factors=(1.0, 1.0, 1.0)) -> np.ndarray:
    """The flat table of the axes' nodes and value grids."""
    axes = [np.asarray(a, dtype=np.float64) for a in (p_nodes, q_nodes, k_nodes, d_nodes, c_nodes)]
    prefill = np.asarray(prefill, dtype=np.float64)
    decode = np.asarray(decode, dtype=np.float64)
    assert prefill.shape == (len(axes[0]), len(axes[1]), len(axes[2]))
    assert decode.shape == (len(axes[3]), len(axes[4]))
    mixed = np.asarray(mixed, dtype=np.float64)
    e_nodes = np.asarray(e_nodes, dtype=np.float64)
    assert mixed.shape == (len(axes[0]), len(e_nodes))
    remainder = np.asarray(remainder, dtype=np.float64)
    assert remainder.shape == (len(axes[0]), len(axes[2]))
    header = np.zeros(HEADER)
    header[:5] = [len(a) for a in axes]
    header[F_PREFILL:F_MIXED + 1] = factors
    header[N_E] = len(e_nodes)
    return np.concatenate([header, *axes, prefill.ravel(), decode.ravel(), mixed.ravel(),
                           remainder.ravel(), e_nodes])


def with_speculative(table: np.ndarray, k: int, drafter: int, cpu_ms: float, layers: int,
                     head_nodes, head_ms) -> np.ndarray:
    """A plain table with speculative decoding's slots set and the LM head's
    times (`head_ms` at `head_nodes` logit rows) appended."""
    head_nodes = np.asarray(head_nodes, dtype=np.float64)
    head_ms = np.asarray(head_ms, dtype=np.float64)
    assert head_nodes.shape == head_ms.shape and int(table[N_H]) == 0
    out = np.concatenate([table, head_nodes, head_ms])
    out[SPEC_K], out[SPEC_DRAFTER], out[SPEC_CPU_MS] = k, drafter, cpu_ms
    out[N_LAYERS], out[N_H] = layers, len(head_nodes)
    return out


def with_factors(table: np.ndarray, factors) -> np.ndarray:
    out = table.copy()
    out[F_PREFILL:F_MIXED + 1] = factors
    return out


@njit
def _bracket(nodes, x):
    """(lower index, weight of the upper node) of `x` among sorted `nodes`."""
    n = nodes.shape[0]
    if n == 1:
        return 0, 0.0
    i = np.searchsorted(nodes, x, side="right") - 1
    if i < 0:
        i = 0
    if i > n - 2:
        i = n - 2
    lo = nodes[i]
    return i, (x - lo) / (nodes[i + 1] - lo)


@njit
def table_pass_ms(t, prefill_tokens, num_prefill, prefill_context, decode_requests, decode_context):
    """Milliseconds of one pass priced from table `t`."""
    n_p, n_q, n_k, n_d, n_c = int(t[N_P]), int(t[N_Q]), int(t[N_K]), int(t[N_D]), int(t[N_C])
    o = HEADER
    p_nodes = t[o:o + n_p]
    o += n_p
    q_nodes = t[o:o + n_q]
    o += n_q
    k_nodes = t[o:o + n_k]
    o += n_k
    d_nodes = t[o:o + n_d]
    o += n_d
    c_nodes = t[o:o + n_c]
    o += n_c
    o_pre = o
    o_dec = o_pre + n_p * n_q * n_k
    n_e = int(t[N_E])
    o_mix = o_dec + n_d * n_c
    o_rem = o_mix + n_p * n_e
    e_nodes = t[o_rem + n_p * n_k:o_rem + n_p * n_k + n_e]
    has_pre = prefill_tokens > 0
    has_dec = decode_requests > 0
    if has_pre:
        q = max(num_prefill, 1)
        ip, wp = _bracket(p_nodes, float(q * (prefill_tokens // q)))
        iq, wq = _bracket(q_nodes, float(num_prefill))
        ik, wk = _bracket(k_nodes, prefill_context / max(num_prefill, 1))
        pre = _interp3(t, o_pre, n_q, n_k, ip, wp, iq, wq, ik, wk)
    if has_dec:
        idd, wd = _bracket(d_nodes, float(decode_requests))
        ic, wc = _bracket(c_nodes, decode_context / decode_requests)
        dec = _interp2(t, o_dec, n_c, idd, wd, ic, wc)
    if has_pre and has_dec:
        i0, w0 = _bracket(q_nodes, 1.0)
        j0, v0 = _bracket(k_nodes, 0.0)
        c1, u1 = _bracket(c_nodes, 1.0)
        im, wm = _bracket(p_nodes, float(prefill_tokens + decode_requests))
        ie, we = _bracket(e_nodes, float(decode_requests))
        base = _interp2(t, o_mix, n_e, im, wm, ie, we)
        extra_pre = pre - _interp3(t, o_pre, n_q, n_k, ip, wp, i0, w0, j0, v0)
        extra_dec = dec - _interp2(t, o_dec, n_c, idd, wd, c1, u1)
        m = prefill_tokens // q
        rest = prefill_tokens - q * m
        if rest > 0 and m > 0:
            im1, wm1 = _bracket(p_nodes, float(m))
            extra_pre += (rest + m - 1) // m * _interp2(t, o_rem, n_k, im1, wm1, ik, wk)
        return max(base + extra_pre + extra_dec, 0.0) * t[F_MIXED]
    if has_pre:
        return max(pre, 0.0) * t[F_PREFILL]
    if has_dec:
        return max(dec, 0.0) * t[F_DECODE]
    return 0.0


@njit
def _head_ms(t, rows):
    """The LM head's milliseconds over `rows` logit rows (linear between
    the appended nodes, the last slope beyond)."""
    n_p, n_q, n_k, n_d, n_c, n_e = (int(t[N_P]), int(t[N_Q]), int(t[N_K]), int(t[N_D]),
                                    int(t[N_C]), int(t[N_E]))
    o = (HEADER + n_p + n_q + n_k + n_d + n_c + n_p * n_q * n_k + n_d * n_c + n_p * n_e
         + n_p * n_k + n_e)
    n_h = int(t[N_H])
    i, w = _bracket(t[o:o + n_h], float(rows))
    o += n_h
    return max((1.0 - w) * t[o + i] + w * t[o + i + 1], 0.0) if n_h > 1 else t[o]


@njit
def table_spec_pass_ms(t, prefill_tokens, num_prefill, prefill_context, decode_requests,
                       decode_context, requests, draft_tokens, prefill_draft_tokens):
    """Milliseconds of one pass with speculative decoding (docs/deployment.md,
    "Speculative decoding"): the verification, then the drafter's steps.

    Verification: a decode request with d drafts is a query of d + 1 tokens
    over its context, priced as aiconfigurator-core prices MTP generation —
    d + 1 decode queries of that context (its decode batch scaled by
    nextn + 1), so the GEMMs see every scheduled token; prefill entries'
    padding drafts are already prefill tokens (counted once). Drafter
    (DRAFT_LAYER): its first step runs one layer over every token of the pass
    (the verification's per-layer share) and the LM head over the pass's
    requests; each of the k - 1 more steps one layer and the head over the
    requests, one query each of their context (a decode pass's per-layer
    share). DRAFT_CPU: a CPU lookup per scheduled request."""
    decode_drafts = draft_tokens - prefill_draft_tokens
    queries = decode_requests + decode_drafts
    context = decode_context
    if decode_requests > 0 and decode_drafts > 0:
        context = decode_context * queries // decode_requests
    verify = table_pass_ms(t, prefill_tokens, num_prefill, prefill_context, queries, context)
    if requests <= 0:
        return verify
    if int(t[SPEC_DRAFTER]) == DRAFT_CPU:
        return verify + t[SPEC_CPU_MS] * requests
    layers = t[N_LAYERS]
    head = _head_ms(t, requests)
    first = max(verify - _head_ms(t, queries + num_prefill), 0.0) / layers + head
    k = int(t[SPEC_K])
    if k <= 1:
        return verify + first
    known = decode_context + prefill_context + prefill_tokens
    step_pass = table_pass_ms(t, 0, 0, 0, requests, max(known, requests))
    step = max(step_pass - head, 0.0) / layers + head
    return verify + first + (k - 1) * step


@njit
def _interp2(t, o, n_b, ia, wa, ib, wb):
    """Bilinear interpolation in the grid at `t[o:]` with rows of `n_b`."""
    v = 0.0
    for a in range(2):
        fa = wa if a else 1.0 - wa
        for b in range(2):
            f = fa * (wb if b else 1.0 - wb)
            if f != 0.0:
                v += f * t[o + (ia + a) * n_b + ib + b]
    return v


@njit
def _interp3(t, o, n_b, n_c, ia, wa, ib, wb, ic, wc):
    """Trilinear interpolation in the grid at `t[o:]` of shape (-, n_b, n_c)."""
    v = 0.0
    for a in range(2):
        fa = wa if a else 1.0 - wa
        for b in range(2):
            fb = fa * (wb if b else 1.0 - wb)
            for c in range(2):
                f = fb * (wc if c else 1.0 - wc)
                if f != 0.0:
                    v += f * t[o + ((ia + a) * n_b + ib + b) * n_c + ic + c]
    return v
