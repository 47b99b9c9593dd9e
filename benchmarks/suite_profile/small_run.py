"""Measurement only (benchmarks/RESULTS.md, 2026-12-08): the setup (`make_replay`) and
the run of a small disaggregated replay — 2 prefill + 2 decode workers, DP 2, 4
requests — N times in one process after two warm-up runs, and their medians. What
each property-test example and each capacity probe pays besides its passes.

    python benchmarks/suite_profile/small_run.py N [SERVESIM_CHECK value, default 1]

(from the repository's root: it builds its workload with tests/helpers.py)."""

import os
import statistics
import sys
import time
import warnings

os.environ["SERVESIM_CHECK"] = sys.argv[2] if len(sys.argv) > 2 else "1"  # (before the imports)
sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
from helpers import workload_of  # noqa: E402
from servesim.config.config import config_from_dict  # noqa: E402
from servesim.replay.api import make_replay  # noqa: E402

data = {"workload": {"synthetic": {"requests": 1}},
        "engine": {"block_size": 16, "enable_prefix_caching": True, "max_num_seqs": 4,
                   "max_num_batched_tokens": 64, "timing": {"type": "linear", "base_ms": 3, "per_token_ms": 0.05}},
        "cluster": {"mode": "disaggregated", "prefill_workers": 2, "decode_workers": 2, "data_parallel_size": 2,
                    "router": "kv_router", "prefill": {"num_gpu_blocks": 16}, "decode": {"num_gpu_blocks": 16},
                    "kv_transfer": {"bytes_per_token": 62500, "bandwidth_gbps": 0.5, "latency_ms": 0.5}}}
wl = workload_of([0, 5, 10, 20], [40, 64, 20, 90], [4, 8, 3, 6], [[1, 2, 3], [1, 2, 3, 4], [7, 8], [1, 2, 9, 10, 11, 12]])
cfg = config_from_dict(data, source="bench")
N = int(sys.argv[1])


def once():
    """One replay's setup and run, in seconds."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter(); r = make_replay(cfg, wl); t1 = time.perf_counter(); r.run(); t2 = time.perf_counter()
    return t1 - t0, t2 - t1


once()
once()
setups, runs = zip(*[once() for _ in range(N)])
print(f"setup median {statistics.median(setups)*1e3:.2f} ms, run median {statistics.median(runs)*1e3:.2f} ms")
