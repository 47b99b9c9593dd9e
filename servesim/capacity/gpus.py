"""What a deployment costs: the GPUs a resolved config occupies."""


def gpus_of(config: dict) -> int:
    """GPUs of a resolved config dict (as summary.json records it): workers
    x data_parallel_size x tensor_parallel_size x pipeline_parallel_size,
    each key read where present and 1 otherwise; a disaggregated cluster
    sums its prefill and decode pools (a pool's own engine keys and
    data_parallel_size first)."""
    engine = config.get("engine") or {}
    cluster = config.get("cluster") or {}
    dp = int(cluster.get("data_parallel_size") or 1)

    def per_worker(pool: dict) -> int:
        size = int(pool.get("data_parallel_size") or dp)
        for key in ("tensor_parallel_size", "pipeline_parallel_size"):
            size *= int(pool.get(key, engine.get(key)) or 1)
        return size

    if cluster.get("mode") == "disaggregated":
        return sum(int(cluster.get(f"{pool}_workers") or 1) * per_worker(cluster.get(pool) or {})
                   for pool in ("prefill", "decode"))
    return int(cluster.get("workers") or 1) * per_worker({})
