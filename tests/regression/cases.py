"""The regression cases of the one-scheduler refactor (issue 14): every
bundled example and a spread of feature combinations, small enough to run in
CI. `freeze.py` records the sha256 of each output file as produced by the code
before the refactor; tests/test_regression.py holds the code to them."""

import copy

from ruamel.yaml import YAML

from servesim.config.examples import EXAMPLES, example_text

ROWS = 250  # trace rows per case (--limit)
# summary keys that measure the host, not the simulation
HOST_KEYS = ("wall_time_s", "passes_per_s")


def _example(name):
    return YAML(typ="safe").load(example_text(name))


def _with(base, **engine):
    cfg = copy.deepcopy(base)
    for key, value in engine.items():
        path = key.split("__")
        node = cfg
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return cfg


def cases():
    """name -> (config dict, extra CLI args)."""
    out = {}
    for name in EXAMPLES:
        if name == "deployment":
            continue  # needs aiconfigurator-core
        cfg = _example(name)
        if "synthetic" in cfg["workload"]:
            syn = cfg["workload"]["synthetic"]
            if "sessions" in syn:
                syn["sessions"]["count"] = 60
            else:
                syn["requests"] = 200
        out[name] = cfg
    moon = _example("mooncake")
    cpu = _example("cpu-tier")
    dis = _example("disaggregated")
    out["async"] = _with(moon, engine__async_scheduling=True)
    out["priority"] = _with(moon, engine__scheduling_policy="priority",
                            engine__num_gpu_blocks=1024)
    out["small-pool"] = _with(moon, engine__num_gpu_blocks=600,
                              engine__long_prefill_token_threshold=2048)
    out["no-chunking"] = _with(moon, engine__enable_chunked_prefill=False,
                               engine__num_gpu_blocks=900)
    out["cpu-simple"] = _with(cpu, engine__kv_offloading__connector="simple_cpu")
    out["cpu-async"] = _with(cpu, engine__async_scheduling=True)
    out["cpu-simple-async"] = _with(cpu, engine__async_scheduling=True,
                                    engine__kv_offloading__connector="simple_cpu",
                                    engine__num_gpu_blocks=800)
    out["dp2"] = _with(moon, cluster__data_parallel_size=2, engine__num_gpu_blocks=1500)
    out["dp2-async"] = _with(moon, cluster__data_parallel_size=2,
                             engine__async_scheduling=True, engine__num_gpu_blocks=1500)
    out["4w-kv"] = _with(moon, cluster__workers=4, cluster__router="least_prefill",
                         engine__num_gpu_blocks=2000)
    out["disagg-2p2d"] = _with(dis, cluster__prefill_workers=2, cluster__decode_workers=2,
                               engine__num_gpu_blocks=3000)
    out["disagg-async"] = _with(dis, engine__async_scheduling=True)
    out["disagg-dp"] = _with(dis, cluster__data_parallel_size=2, engine__num_gpu_blocks=1200)
    out["launch-sync-detok"] = _with(moon, engine__detokenize_ms=0.3)
    out["spec-sync"] = _with(_example("speculative"), engine__async_scheduling=False)
    out["spec-small-pool"] = _with(_example("speculative"), engine__num_gpu_blocks=700)
    return out
