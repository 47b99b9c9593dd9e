"""`cluster.router: {policy: weighted, scorers: ...}`, the Kubernetes inference
gateways' weighted scorers (docs/engine.md §11, servesim/engine/routing.py
`weighted`): hand-worked routing decisions.

Conventions as tests/test_cluster.py (block_size 16, trace_block_size 16,
linear 10 ms passes, `wXrY` rank Y of worker X). A rank's score is
`prefix_cache * cached full prompt blocks / full prompt blocks + queue_depth *
(max waiting - waiting) / (max waiting - min waiting) (1 when all alike) +
kv_usage * (1 - used blocks / usable blocks)`; the greatest wins.
"""

import pytest

from test_cluster import cluster_config, placement, sim, workload
from helpers import req


def weighted(prefix_cache, queue_depth, kv_usage, seed=0):
    return {"policy": "weighted", "seed": seed, "scorers": {
        "prefix_cache": prefix_cache, "queue_depth": queue_depth, "kv_usage": kv_usage}}


def _busy_prefix_rows():
    # as test_kv_router.py: x1..x3 (pinned to r0) decode for long; p (pinned
    # to r0) leaves [1,2,3,4] in r0's prefix cache and finishes at 10.
    rows = [dict(id=f"x{k}", t=0, P=64, O=200, dp_rank=0) for k in (1, 2, 3)]
    rows.append(dict(id="p", t=0, P=64, O=1, hash_ids=[1, 2, 3, 4], dp_rank=0))
    rows.append(dict(id="q", t=20, P=64, O=1, hash_ids=[1, 2, 3, 9]))
    return rows


@pytest.mark.parametrize("scorers, q_rank", [((1, 1, 1), 0), ((1, 1, 4), 1)])
def test_kv_usage_outweighs_a_prefix_only_when_its_weight_says_so(scorers, q_rank):
    # 1 worker x 2 ranks, 60 usable blocks per rank. At t=20 x1..x3 hold 5 blocks
    # each (64 prompt tokens, then decode tokens 65-66 in a fifth); p's 4 blocks
    # are cached but free. Nothing waits anywhere.
    # q [1,2,3,9]: r0 prefix 3/4, queue 1, KV 1 - 15/60 = 0.75; r1 0, 1, 1.
    #   weights 1, 1, 1: r0 0.75 + 1 + 0.75 = 2.5 > r1 2 -> r0 (48 cached).
    #   weights 1, 1, 4: r0 0.75 + 1 + 3 = 4.75 < r1 5 -> r1.
    cfg = cluster_config(1, 2, router=weighted(*scorers), num_gpu_blocks=61)
    rec = sim(cfg, workload(_busy_prefix_rows())).records
    assert placement(rec)["q"] == (0, q_rank)
    assert req(rec, "q")["first_admission_cached_tokens"] == (48 if q_rank == 0 else 0)


@pytest.mark.parametrize("prefix_weight, q_rank", [(3, 0), (1, 1)])
def test_a_rank_with_the_prefix_and_a_queue_wins_only_when_the_prefix_weighs_more(
        prefix_weight, q_rank):
    # 1 worker x 2 ranks, max_num_seqs 2. t=0: x1 [1], x2, x3 (P=16 each) pinned
    # to r0: x1 and x2 run (x1's block [1] cached when scheduled), x3 waits.
    # t=5 q [1, 50] P=32: r0 prefix 1/2, waiting 1 (the most) -> queue 0;
    # r1 prefix 0, waiting 0 (the least) -> queue 1. KV weight 0.
    #   prefix weight 3: r0 1.5 > r1 1 -> r0;   weight 1: r0 0.5 < r1 1 -> r1.
    rows = [dict(id="x1", t=0, P=16, O=100, hash_ids=[1], dp_rank=0),
            dict(id="x2", t=0, P=16, O=100, dp_rank=0),
            dict(id="x3", t=0, P=16, O=100, dp_rank=0),
            dict(id="q", t=5, P=32, O=1, hash_ids=[1, 50])]
    cfg = cluster_config(1, 2, router=weighted(prefix_weight, 1, 0), num_gpu_blocks=256,
                         max_num_seqs=2)
    rec = sim(cfg, workload(rows)).records
    assert placement(rec)["q"] == (0, q_rank)


@pytest.mark.parametrize("seed, a_rank", [(0, 1), (2, 0)])
def test_equal_scores_are_drawn_from_the_seeded_generator(seed, a_rank):
    # two idle ranks score alike (3 each): the tie's draw (seed 0: 0.2374 < 1/2
    # -> the second rank; seed 2: 0.7118 -> the first; test_kv_router.py `draws`)
    cfg = cluster_config(1, 2, router=weighted(1, 1, 1, seed=seed), num_gpu_blocks=64)
    rec = sim(cfg, workload([dict(id="a", t=0, P=32, O=2)])).records
    assert placement(rec)["a"] == (0, a_rank)
