"""The real engine's launch commands for a resolved config (README
"Capacity planning", "servesim plan"): one `vllm serve` per worker, in vLLM
0.33's flag names (with `engine.backend: sglang`, one `python -m
sglang.launch_server` in SGLang's), and the router's settings.

Each worker gets its own GPUs (`CUDA_VISIBLE_DEVICES`, counted per node of
`GPUS_PER_NODE`) and port. A disaggregated deployment's workers take vLLM's
NIXL connector (`--kv-transfer-config '{"kv_connector":"NixlConnector",
"kv_role":"kv_both"}'`, as vLLM's disaggregated-serving examples start both
prefill and decode instances), each with its own NIXL side-channel port
(`VLLM_NIXL_SIDE_CHANNEL_PORT`); a proxy in front sends each request to a
prefill worker with `max_tokens = 1`, then to a decode worker (vLLM's
`toy_proxy_server.py` example, or NVIDIA Dynamo / llm-d's routers).
"""

import json
import shlex

GPUS_PER_NODE = 8
PORT = 8000
NIXL_PORT = 5600
ROUTER_NOTES = {
    "round_robin": "round robin over the workers (any HTTP load balancer)",
    "least_loaded": "the worker with the fewest requests in flight (e.g. vllm-router's least-loaded policy)",
    "least_prefill": "the worker with the fewest prompt tokens queued",
    "kv_router": "KV-cache-aware routing (NVIDIA Dynamo's KV router; its overlap weight as servesim's)",
    "weighted": "servesim's weighted rule (load and prefix overlap); Dynamo's KV router is the nearest",
}


# servesim's routers -> the SGLang router's (sgl-router `--policy`) that does the same
SGLANG_ROUTER_POLICIES = {"round_robin": "round_robin", "kv_router": "cache_aware"}


def _sglang_flags(engine: dict) -> list:
    """SGLang's server arguments of an `engine:` block with `backend: sglang`;
    a derived `max_total_tokens` is left to SGLang (`mem_fraction_static`
    derives it again), a given one caps the pool."""
    flags = ["--tp-size", engine.get("tensor_parallel_size", 1)]
    for key in ("max_running_requests", "chunked_prefill_size", "max_prefill_tokens", "max_total_tokens",
                "mem_fraction_static", "context_length", "page_size", "schedule_conservativeness"):
        if engine.get(key) is not None:
            flags += ["--" + key.replace("_", "-"), engine[key]]
    if engine.get("schedule_policy", "fcfs") != "fcfs":
        flags += ["--schedule-policy", engine["schedule_policy"]]
    for key in ("disable_radix_cache", "disable_overlap_schedule", "enable_mixed_chunk"):
        if engine.get(key):
            flags.append("--" + key.replace("_", "-"))
    for key in ("quantization", "dtype", "kv_cache_dtype"):
        if engine.get(key) not in (None, "auto"):
            flags += ["--" + key.replace("_", "-"), engine[key]]
    return [str(f) for f in flags]


def _engine_flags(engine: dict, pool: dict, dp: int) -> list:
    def get(key, default=None):
        return pool.get(key, engine.get(key, default))

    flags = ["--tensor-parallel-size", get("tensor_parallel_size", 1)]
    if int(get("pipeline_parallel_size", 1) or 1) > 1:
        flags += ["--pipeline-parallel-size", get("pipeline_parallel_size")]
    if dp > 1:
        flags += ["--data-parallel-size", dp]
    if get("enable_expert_parallel"):
        flags += ["--enable-expert-parallel"]
    flags += ["--max-num-seqs", get("max_num_seqs"), "--max-num-batched-tokens", get("max_num_batched_tokens"),
              "--gpu-memory-utilization", get("gpu_memory_utilization", 0.9),
              "--max-model-len", get("max_model_len"), "--block-size", get("block_size")]
    if get("quantization"):
        flags += ["--quantization", get("quantization")]
    if get("kv_cache_dtype", "auto") != "auto":
        flags += ["--kv-cache-dtype", get("kv_cache_dtype")]
    if get("dtype", "auto") != "auto":
        flags += ["--dtype", get("dtype")]
    if not get("enable_prefix_caching", True):
        flags += ["--no-enable-prefix-caching"]
    if get("async_scheduling"):
        flags += ["--async-scheduling"]
    if get("scheduling_policy", "fcfs") != "fcfs":
        flags += ["--scheduling-policy", get("scheduling_policy")]
    spec = get("speculative")
    if spec:
        flags += ["--speculative-config", json.dumps(spec, sort_keys=True, separators=(",", ":"))]
    return [str(f) for f in flags]


def launch_commands(config: dict) -> dict:
    """{"workers": [{pool, worker, gpus, command}], "router": {...}} of a
    resolved config dict (as summary.json records it)."""
    engine = config.get("engine") or {}
    cluster = config.get("cluster") or {}
    model = engine.get("model") or "MODEL"
    dp = int(cluster.get("data_parallel_size") or 1)
    disaggregated = cluster.get("mode") == "disaggregated"
    sglang = engine.get("backend") == "sglang"
    if disaggregated:
        pools = [("prefill", int(cluster.get("prefill_workers") or 1), cluster.get("prefill") or {}),
                 ("decode", int(cluster.get("decode_workers") or 1), cluster.get("decode") or {})]
    else:
        pools = [("worker", int(cluster.get("workers") or 1), {})]
    workers, next_gpu, port = [], 0, PORT
    for name, count, pool in pools:
        width = int(pool.get("data_parallel_size") or dp)
        size = width
        for key in ("tensor_parallel_size", "pipeline_parallel_size"):
            size *= int(pool.get(key, engine.get(key)) or 1)
        for i in range(count):
            if next_gpu % GPUS_PER_NODE + size > GPUS_PER_NODE:  # a worker does not straddle nodes
                next_gpu += GPUS_PER_NODE - next_gpu % GPUS_PER_NODE
            node, first = divmod(next_gpu, GPUS_PER_NODE)
            devices = ",".join(str(first + k) for k in range(size)) if size <= GPUS_PER_NODE else "all"
            env = [f"CUDA_VISIBLE_DEVICES={devices}"]
            if sglang:
                command = " ".join([*env, "python", "-m", "sglang.launch_server", "--model-path",
                                    shlex.quote(model), *map(shlex.quote, _sglang_flags(engine)),
                                    "--port", str(port)])
                workers.append({"pool": name, "worker": i, "node": node, "gpus": size, "port": port,
                                "gpu_type": engine.get("gpu"), "command": command})
                next_gpu += size
                port += 1
                continue
            flags = _engine_flags(engine, pool, width)
            if disaggregated:
                env.append(f"VLLM_NIXL_SIDE_CHANNEL_PORT={NIXL_PORT + len(workers)}")
                flags += ["--kv-transfer-config", json.dumps({"kv_connector": "NixlConnector",
                                                              "kv_role": "kv_both"}, separators=(",", ":"))]
            command = " ".join([*env, "vllm", "serve", shlex.quote(model), *map(shlex.quote, flags),
                                "--port", str(port)])
            workers.append({"pool": name, "worker": i, "node": node, "gpus": size, "port": port,
                            "gpu_type": pool.get("gpu", engine.get("gpu")), "command": command})
            next_gpu += size
            port += 1
    router = cluster.get("router")
    policy = router if isinstance(router, str) else (router or {}).get("policy", "round_robin")
    doc = {"policy": policy, "settings": router, "note": ROUTER_NOTES.get(policy, policy)}
    if sglang and len(workers) > 1:
        urls = " ".join(f"http://localhost:{w['port']}" for w in workers)
        if policy in SGLANG_ROUTER_POLICIES:
            doc["command"] = (f"python -m sglang_router.launch_router --worker-urls {urls} "
                              f"--policy {SGLANG_ROUTER_POLICIES[policy]} --port 8080")
        else:
            doc["note"] += "; the SGLang router (sgl-router) has no policy that does the same"
    if disaggregated:
        prefill = [f"localhost:{w['port']}" for w in workers if w["pool"] == "prefill"]
        decode = [f"localhost:{w['port']}" for w in workers if w["pool"] == "decode"]
        doc["proxy"] = ("python toy_proxy_server.py --port 8080 --prefiller-hosts "
                        + " ".join(h.split(":")[0] for h in prefill) + " --prefiller-ports "
                        + " ".join(h.split(":")[1] for h in prefill) + " --decoder-hosts "
                        + " ".join(h.split(":")[0] for h in decode) + " --decoder-ports "
                        + " ".join(h.split(":")[1] for h in decode))
        doc["note"] += ("; the proxy sends each request to a prefill worker (max_tokens 1), then with "
                        "its KV handle to a decode worker")
    return {"workers": workers, "router": doc}


def launch_script(config: dict) -> str:
    """launch.sh: the commands, one worker a line (hosts per node noted)."""
    doc = launch_commands(config)
    engine = "SGLang" if (config.get("engine") or {}).get("backend") == "sglang" else "vLLM"
    lines = ["#!/bin/sh", f"# written by servesim plan: one {engine} worker a line; run each on its node", ""]
    for w in doc["workers"]:
        lines.append(f"# {w['pool']} {w['worker']}: node {w['node']}, {w['gpus']} x {w['gpu_type']}")
        lines.append(w["command"] + " &")
    lines += ["", f"# router: {doc['router']['note']}"]
    for key in ("proxy", "command"):
        if key in doc["router"]:
            lines.append(doc["router"][key] + (" &" if key == "command" else ""))
    lines.append("wait")
    return "\n".join(lines) + "\n"
