"""`cluster.router: kv_router`, NVIDIA Dynamo's KV router (docs/engine.md §11,
servesim/engine/routing.py): hand-worked routing decisions.

Conventions as tests/test_cluster.py: block_size 16, trace_block_size 16 (one
hash id per engine block), linear timing of 10 ms per pass, `wXrY` rank Y of
worker X. A rank's logit is `w * prefill blocks + decode blocks` with
prefill blocks = (uncached prompt tokens of the rank's requests that have no
first token yet + this prompt - its cached prefix) / 16 and decode blocks =
the distinct full prompt blocks of the rank's unfinished requests, this
prompt's included; the least wins. The router's generator (MINSTD, seeded)
gives these first draws: seed 0 -> 0.2374, 0.7022; seed 2 -> 0.7118, 0.5761
(`draws`); a tie of two
ranks goes to the later one when the draw is below 1/2 (reservoir sampling:
the second tied rank replaces the first with probability 1/2).
"""

import math

import numpy as np
import pytest

from test_cluster import cluster_config, placement, sim, workload
from helpers import req
from servesim.engine import routing


def kv_router(weight=1.0, temperature=0.0, seed=0):
    return {"policy": "kv_router", "overlap_score_weight": weight,
            "router_temperature": temperature, "seed": seed}


def _busy_prefix_rows():
    # x1..x3 pinned to r0 decode for long; p (pinned to r0) leaves blocks
    # [1,2,3,4] in r0's prefix cache; q arrives later, unpinned.
    rows = [dict(id=f"x{k}", t=0, P=64, O=200, dp_rank=0) for k in (1, 2, 3)]
    rows.append(dict(id="p", t=0, P=64, O=1, hash_ids=[1, 2, 3, 4], dp_rank=0))
    rows.append(dict(id="q", t=20, P=64, O=1, hash_ids=[1, 2, 3, 9]))
    return rows


@pytest.mark.parametrize("weight, q_rank, q_cached", [(1.0, 1, 0), (5.0, 0, 48)])
def test_a_rank_with_the_prefix_but_a_long_decode_batch_loses_unless_the_weight_favours_it(
        weight, q_rank, q_cached):
    # 1 worker x 2 ranks. Pass [0,10] on r0: x1..x3 and p (256 tokens); every
    # first token at 10, p finishes there (its 4 full blocks stay cached).
    # t=20 q [1,2,3,9] P=64: its 4 full blocks; r0 holds [1,2,3] (48 tokens).
    #   r0: prefill (0 still counted + 64 - 48) / 16 = 1; decode blocks: x1..x3's
    #       12 (p's left with p) + q's 4 new = 16 -> w * 1 + 16.
    #   r1: prefill 64 / 16 = 4; decode blocks 0 + 4 -> w * 4 + 4.
    #   w = 1: 17 against 8 -> r1, the idle rank, with nothing cached.
    #   w = 5: 21 against 24 -> r0, the rank holding the prefix.
    cfg = cluster_config(1, 2, router=kv_router(weight), num_gpu_blocks=256)
    rec = sim(cfg, workload(_busy_prefix_rows())).records
    assert placement(rec)["q"] == (0, q_rank)
    assert req(rec, "q")["first_admission_cached_tokens"] == q_cached


def test_the_decode_batch_weighs_nothing_against_the_prefix_under_least_prefill():
    # the same trace under least_prefill (cost: 64 - 48 + 0 queued on r0 = 16
    # against 64 on r1): q goes to r0 however long r0's decode batch is.
    cfg = cluster_config(1, 2, router="least_prefill", num_gpu_blocks=256)
    rec = sim(cfg, workload(_busy_prefix_rows())).records
    assert placement(rec)["q"] == (0, 0)


@pytest.mark.parametrize("weight, seed, a_rank, b_rank", [(1.0, 2, 0, 1), (0.0, 2, 0, 0),
                                                          (0.0, 0, 1, 0)])
def test_prompt_tokens_count_until_the_first_token_and_a_block_once_per_rank(weight, seed,
                                                                             a_rank, b_rank):
    # 1 worker x 2 ranks; a and b, the same 4 blocks, arrive at t=0, nothing cached.
    # a: both ranks w * 4 + 4: a tie; the first draw picks a's rank: seed 2
    #    (0.7118 >= 1/2) keeps r0; seed 0 (0.2374 < 1/2) takes r1.
    # b: a's rank counts a's 64 prompt tokens (no first token yet) and a's blocks,
    #    which are b's: w * (64 + 64) / 16 + (4 + 0 new) = 8w + 4; the other
    #    rank w * 4 + 4.
    #    w = 1: 12 against 8 -> the rank a is not on.
    #    w = 0: 4 against 4 (b's blocks are a's: counted once) -> a tie, the
    #    second draw: seed 2 0.5761, seed 0 0.7022, both >= 1/2: r0 stays.
    cfg = cluster_config(1, 2, router=kv_router(weight, seed=seed), num_gpu_blocks=256)
    rows = [dict(id="a", t=0, P=64, O=5, hash_ids=[1, 2, 3, 4]),
            dict(id="b", t=0, P=64, O=5, hash_ids=[1, 2, 3, 4])]
    rec = sim(cfg, workload(rows)).records
    assert placement(rec) == {"a": (0, a_rank), "b": (0, b_rank)}


def draws(seed, n):
    """The router's first n draws for `seed`, computed here from the
    generator's definition (MINSTD: x <- 48271 x mod 2^31 - 1, u = (x - 1) /
    (2^31 - 2)) and the seed's spread (`routing.first_state`)."""
    m = 2 ** 31 - 1
    x = (seed * 2654435761 + 0x9E3779B9) % (m - 1) + 1
    assert x == routing.first_state(seed)
    out = []
    for _ in range(n):
        x = x * 48271 % m
        out.append((x - 1) / (m - 1))
    return out


def test_the_generator_draws_as_stated():
    ints = np.array([routing.first_state(2), 0], dtype=np.int64)
    got = [routing.uniform(ints) for _ in range(3)]
    assert got == draws(2, 3)
    assert math.isclose(draws(0, 1)[0], 0.2374, abs_tol=1e-4)
    assert np.allclose(draws(2, 2), [0.7118, 0.5761], atol=1e-4)
    assert math.isclose(draws(0, 2)[1], 0.7022, abs_tol=1e-4)


@pytest.mark.parametrize("u, chosen", [(0.70, 0), (0.74, 2), (0.99, 2)])
def test_softmax_sampling_follows_dynamos_normalised_logits(u, chosen):
    # logits 3 and 7 (rank 1 not a candidate: inf), temperature 1: rank 0 with
    # probability e^0 / (e^0 + e^-1) = 0.7311, rank 2 with 0.2689; the first
    # rank whose cumulative probability reaches the draw.
    logits = np.array([3.0, np.inf, 7.0])
    assert routing.softmax_sample(logits, 3, 3.0, 7.0, 1.0, u) == chosen


def test_softmax_sampling_with_equal_logits_is_uniform_and_temperature_flattens_it():
    equal = np.array([5.0, 5.0, 5.0, 5.0])
    assert [routing.softmax_sample(equal, 4, 5.0, 5.0, 0.5, u) for u in (0.2, 0.3, 0.6, 0.9)] \
        == [0, 1, 2, 3]
    # temperature 10: rank 0 with 1 / (1 + e^-0.1) = 0.525
    two = np.array([0.0, 1.0])
    assert routing.softmax_sample(two, 2, 0.0, 1.0, 10.0, 0.52) == 0
    assert routing.softmax_sample(two, 2, 0.0, 1.0, 10.0, 0.53) == 1


def test_a_positive_temperature_samples_reproducibly_from_the_seed():
    # 2 workers, 40 requests of distinct prompts: at temperature 0 the
    # least-loaded rank wins (alternating once loads differ); at temperature
    # 2 the draws sometimes pick the costlier rank. Same seed, same placement.
    rows = [dict(id=f"r{k}", t=k, P=64, O=50) for k in range(40)]

    def run(temperature, seed):
        cfg = cluster_config(2, 1, router=kv_router(temperature=temperature, seed=seed),
                             num_gpu_blocks=512, pass_log=False)
        return [w for w in sim(cfg, workload(rows)).records.worker]

    hot = run(2.0, 7)
    assert hot == run(2.0, 7)
    cold = run(0.0, 7)
    assert cold != hot
    # at temperature 0 the shares stay within one request of each other
    assert abs(cold.count(0) - cold.count(1)) <= 1


# ------------------------------------------------------------ KV event lag


def _lag_rows(q_at):
    # x (pinned to r0) decodes for long; its 4 full prompt blocks [1,2,3,4]
    # are cached on r0 when its prefill is scheduled at t=0 (stored events
    # at 0); q [1,2,3,9] arrives at `q_at`, unpinned.
    return [dict(id="x", t=0, P=64, O=100, hash_ids=[1, 2, 3, 4], dp_rank=0),
            dict(id="q", t=q_at, P=64, O=1, hash_ids=[1, 2, 3, 9])]


@pytest.mark.parametrize("lag, q_at, q_rank, q_cached", [
    (0, 12, 0, 48),   # no lag: r0's prefix is seen at once
    (20, 12, 1, 0),   # r0's blocks, stored at 0, reach the router at 20: not yet
    (20, 25, 0, 48),  # after the lag they have
])
def test_a_prefix_cached_on_a_rank_is_seen_by_the_router_only_after_the_kv_event_lag(
        lag, q_at, q_rank, q_cached):
    # 1 worker x 2 ranks, weight 1. x's first token at 10: its prefill tokens
    # leave r0's book, its 4 blocks stay (it runs on).
    # q: r0's decode blocks 4 + 1 new ([9]) = 5; r1's 0 + 4 = 4.
    #   prefix seen (3 blocks): r0 (64 - 48) / 16 + 5 = 6 against r1 64 / 16 + 4 = 8 -> r0.
    #   not seen:               r0 64 / 16 + 5 = 9 against 8 -> r1.
    router = dict(kv_router(), kv_event_lag_ms=lag)
    cfg = cluster_config(1, 2, router=router, num_gpu_blocks=256)
    rec = sim(cfg, workload(_lag_rows(q_at))).records
    assert placement(rec)["q"] == (0, q_rank)
    assert req(rec, "q")["first_admission_cached_tokens"] == q_cached


def _queue(capacity=4, lag=20.0):
    from servesim.kvcache import block_pool as bp

    ev = np.zeros(bp.EV_HEADER + capacity, dtype=np.int64)
    ev[bp.EV_ON] = 1
    ev_t = np.zeros(bp.EV_T0 + capacity)
    ev_t[bp.EV_LAG] = lag
    return ev, ev_t, np.zeros(16, dtype=np.uint8)


def test_a_removed_identity_stays_in_the_routers_view_until_the_lag_has_passed():
    # identity 5 stored at 0 and removed at 30, identity 6 stored at 30; lag 20.
    from servesim.kvcache import block_pool as bp

    events = _queue()
    bp._queue_event(events, 5, bp.STORED)
    bp.stamp_events(events, 0.0)
    bp._queue_event(events, 5, bp.REMOVED)
    bp._queue_event(events, 6, bp.STORED)
    bp.stamp_events(events, 30.0)  # takes what happened by 10: 5 stored
    view = events[2]
    assert (view[5], view[6]) == (1, 0)
    bp.see_events(events, 49.0 - 20.0)  # a router asking at 49: the cache at 29
    assert (view[5], view[6]) == (1, 0)
    bp.see_events(events, 50.0 - 20.0)  # at 50: the cache at 30, both events in
    assert (view[5], view[6]) == (0, 1)
    assert events[0][bp.EV_COUNT] == 0 and events[0][bp.EV_EARLY] == 0


def test_a_full_event_ring_lets_its_oldest_event_through_early_and_counts_it():
    from servesim.kvcache import block_pool as bp

    events = _queue(capacity=2)
    for ident in (1, 2, 3):  # the third finds the ring full: 1's event goes first
        bp._queue_event(events, ident, bp.STORED)
    ev, _, view = events
    assert (view[1], view[2], view[3]) == (1, 0, 0)
    assert (ev[bp.EV_COUNT], ev[bp.EV_EARLY]) == (2, 1)
