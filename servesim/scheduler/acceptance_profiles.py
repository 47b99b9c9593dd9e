"""Per-request acceptance (`engine.speculative.acceptance_profiles`,
README.md "Speculative decoding"): each request without a trace `accepted`
list draws one named profile, with probability proportional to the
profiles' weights, from a counter-based draw keyed by the seed and the
request id (`uniform`, the acceptance draws' generator, at a draw number no
verification pass reaches), so its profile does not depend on the other requests. Its
acceptance is then drawn per position from the profile's rates exactly as
`accepted_drafts` draws it from `acceptance_rates` — here ahead of the run,
as the `accepted` list of its verification passes (at most one per output
token), so the compiled scheduler is the one that replays trace lists.
"""

import numpy as np

PROFILE_DRAW = np.uint64(0xFFFFFFFFFFFF)  # the draw number of the profile choice
SLACK = 64  # list entries beyond a request's max_tokens


def _mix(x):
    """drafts.py's `_mix` over a uint64 array."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def request_states(seed, keys):
    """The acceptance generator's state after its first two keys, the seed
    and each request's key (uint64), as drafts.py `uniform_from` takes it
    (docs/engine.md §12)."""
    with np.errstate(over="ignore"):
        x = _mix(np.full(np.shape(keys), np.uint64(seed) + np.uint64(0x9E3779B97F4A7C15),
                         dtype=np.uint64))
        return _mix(x ^ np.asarray(keys).astype(np.uint64))


def uniform(seed, keys, draws, position):
    """drafts.py's `uniform_from` of `request_states` over arrays of keys and
    draw numbers."""
    x = request_states(seed, keys)
    with np.errstate(over="ignore"):
        x = _mix(x ^ np.asarray(draws).astype(np.uint64))
        x = _mix(x ^ np.uint64(position))
    return (x >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)


def request_keys(request_ids) -> np.ndarray:
    """RequestTable.request_keys: CRC-32 of each id."""
    import zlib

    return np.array([zlib.crc32(str(rid).encode()) for rid in request_ids], dtype=np.int64)


def assign(seed, weights, keys) -> np.ndarray:
    """Each request's profile index (by its key)."""
    weights = np.asarray(weights, dtype=np.float64)
    edges = np.cumsum(weights) / weights.sum()
    u = uniform(seed, keys, np.full(len(keys), PROFILE_DRAW, dtype=np.uint64), 0)
    return np.minimum(np.searchsorted(edges, u, side="right"), len(weights) - 1)


def with_profile_lists(workload, spec, max_tokens):
    """The workload with an `accepted` list drawn for every request that has
    none: one entry per verification pass it can have (its `max_tokens`, and
    SLACK more for the stale verifications of preempted passes; a list is
    cycled beyond), from its profile's rates."""
    import attrs

    n = len(workload.request_ids)
    if workload.accepted_offsets is not None:
        have = np.diff(workload.accepted_offsets) > 0
    else:
        have = np.zeros(n, dtype=bool)
    keys = request_keys(workload.request_ids)
    profile = assign(spec.seed, [w for _, w, _ in spec.acceptance_profiles], keys)
    rates = np.array([r for _, _, r in spec.acceptance_profiles], dtype=np.float64)
    counts = np.where(have, np.diff(workload.accepted_offsets) if have.any() else 0,
                      np.asarray(max_tokens, dtype=np.int64) + SLACK)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    owner = np.repeat(np.arange(n), counts)
    draw = np.arange(offsets[-1], dtype=np.int64) - offsets[owner]
    values = np.zeros(offsets[-1], dtype=np.int64)
    alive = np.ones(offsets[-1], dtype=bool)
    for a in range(spec.num_speculative_tokens):
        alive &= uniform(spec.seed, keys[owner], draw, a) < rates[profile[owner], a]
        values += alive
    if have.any():  # the trace's own lists stay as they are
        old = workload.accepted_offsets
        for i in np.flatnonzero(have):
            values[offsets[i]:offsets[i + 1]] = workload.accepted_values[old[i]:old[i + 1]]
    return attrs.evolve(workload, accepted_offsets=offsets, accepted_values=values)


def profile_summary(spec, request_ids, drafted, accepted) -> dict:
    """summary.json's `speculative.profiles`: per profile, its requests and
    their observed acceptance rate (accepted / drafted real drafts; a request
    with a trace `accepted` list counts under the profile it drew all the
    same)."""
    profile = assign(spec.seed, [w for _, w, _ in spec.acceptance_profiles],
                     request_keys(request_ids))
    drafted = np.asarray(drafted)
    accepted = np.asarray(accepted)
    out = {}
    for j, (name, _, rates) in enumerate(spec.acceptance_profiles):
        mine = profile == j
        d, a = int(drafted[mine].sum()), int(accepted[mine].sum())
        out[name] = {"requests": int(mine.sum()), "acceptance_rates": list(rates),
                     "draft_tokens": d, "accepted_tokens": a,
                     "acceptance_rate": round(a / d, 6) if d else 0.0}
    return out
