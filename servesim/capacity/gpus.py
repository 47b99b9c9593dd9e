"""What a deployment costs: the GPUs a resolved config occupies."""


def gpu_counts(config: dict) -> dict:
    """{gpu type: GPUs} of a resolved config dict (a config without a named
    GPU counts under None)."""
    engine = config.get("engine") or {}
    cluster = config.get("cluster") or {}
    dp = int(cluster.get("data_parallel_size") or 1)

    def per_worker(pool: dict) -> int:
        size = int(pool.get("data_parallel_size") or dp)
        for key in ("tensor_parallel_size", "pipeline_parallel_size"):
            size *= int(pool.get(key, engine.get(key)) or 1)
        return size

    counts = {}
    if cluster.get("mode") == "disaggregated":
        for name in ("prefill", "decode"):
            pool = cluster.get(name) or {}
            gpu = pool.get("gpu", engine.get("gpu"))
            counts[gpu] = counts.get(gpu, 0) + int(cluster.get(f"{name}_workers") or 1) * per_worker(pool)
    else:
        counts[engine.get("gpu")] = int(cluster.get("workers") or 1) * per_worker({})
    return counts


def gpus_of(config: dict) -> int:
    """GPUs of a resolved config dict (as summary.json records it): workers
    x data_parallel_size x tensor_parallel_size x pipeline_parallel_size,
    each key read where present and 1 otherwise; a disaggregated cluster
    sums its prefill and decode pools (a pool's own engine keys and
    data_parallel_size first)."""
    return sum(gpu_counts(config).values())
