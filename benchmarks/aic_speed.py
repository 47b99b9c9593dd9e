"""Start-up and replay speed of `timing: {type: aic}` (docs/deployment.md).

- start-up: building the deployment's tables from the package (cold: empty
  cache directory) and loading them from the cache (cached), each in a fresh
  process, median of --repeat runs; then one cold build split into the
  package's engine construction, its first call (it loads its data then),
  reading the GEMM grid and the table's direct calls (counted), wall and CPU;
- replay: `servesim example deployment` (500 requests) with `aic` and with
  `polynomial` timing at the same capacity, wall time of the run (median).

    PYTHONPATH=$PWD python benchmarks/aic_speed.py [--repeat 3]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

STARTUP = """
import time, logging
logging.disable(logging.WARNING)
from servesim.replay.api import resolve_config
from servesim.config.examples import example_text
from ruamel.yaml import YAML
cfg = resolve_config(YAML(typ="safe").load(example_text("deployment")))
from servesim.deployment.aic_tables import pricing_table  # imports Numba, as any run does
t = time.perf_counter()
pricing_table(cfg.engine)
print(time.perf_counter() - t)
"""

REPLAY = """
import json, logging, sys
logging.disable(logging.WARNING)
from ruamel.yaml import YAML
from servesim.replay.api import run
from servesim.config.examples import example_text
data = YAML(typ="safe").load(example_text("deployment"))
data["engine"]["timing"] = {"type": sys.argv[1]}
data["engine"]["num_gpu_blocks"] = 46773
run(data)  # warm: Numba cache and table cache
r = run(data)
print(json.dumps([r.summary["wall_time_s"], r.summary["passes"]]))
"""

PARTS = """
import json, time, logging
logging.disable(logging.WARNING)
from servesim.replay.api import resolve_config
from servesim.config.examples import example_text
from ruamel.yaml import YAML
cfg = resolve_config(YAML(typ="safe").load(example_text("deployment")))
from servesim.deployment import aic, aic_tables
out, calls = {}, [0]
def part(name, f, *a):
    w, c = time.perf_counter(), time.process_time()
    v = f(*a)
    out[name] = [time.perf_counter() - w, time.process_time() - c]
    return v
dep = cfg.engine.deployment
direct = part("engine", aic.DirectModel, dep)
part("first call", direct, 1, 1, 0, 0, 0)
grid = part("gemm grid", lambda: aic.measured_token_grid(dep.gpu, aic.backend_version(dep.gpu)))
def counted(*f):
    calls[0] += 1
    return direct(*f)
part("calls", aic_tables.build_table, counted, grid, aic_tables._limits(cfg.engine))
out["n"] = calls[0]
print(json.dumps(out))
"""


KERNEL = """
import json, time, numpy as np, logging
logging.disable(logging.WARNING)
from ruamel.yaml import YAML
from servesim.replay.api import resolve_config
from servesim.config.examples import example_text
from servesim.deployment.aic_tables import pricing_table
from servesim.engine.pricing import POLYNOMIAL, TABLE, price_pass
from numba import njit
cfg = resolve_config(YAML(typ="safe").load(example_text("deployment")))
table = pricing_table(cfg.engine)
rng = np.random.default_rng(0)
n = 1_000_000
f = np.stack([rng.integers(0, 8192, n), rng.integers(1, 8, n), rng.integers(0, 4096, n),
              rng.integers(0, 256, n), rng.integers(1, 4000, n)], axis=1)
f[:, 4] *= np.maximum(f[:, 3], 1)

@njit
def loop(model, params, f):
    s = 0.0
    for i in range(f.shape[0]):
        s += price_pass(model, params, f[i, 0], f[i, 1], f[i, 3], f[i, 4], f[i, 0] + f[i, 3],
                        f[i, 1] + f[i, 3], 748368.0, 0, f[i, 2])
    return s

out = []
for model, params in ((TABLE, table), (POLYNOMIAL, np.zeros(5))):
    loop(model, params, f[:10])
    runs = []
    for _ in range(3):
        t = time.perf_counter()
        loop(model, params, f)
        runs.append(time.perf_counter() - t)
    out.append(min(runs) / n * 1e9)
print(json.dumps(out))
"""


def child(code, env, *args):
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    env = dict(os.environ)
    cold, cached = [], []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as cache:
            env["XDG_CACHE_HOME"] = cache
            cold.append(child(STARTUP, env))
            cached.append(child(STARTUP, env))
    parts = child(PARTS, env)
    env.pop("XDG_CACHE_HOME")
    replay = {kind: [child(REPLAY, env, kind) for _ in range(args.repeat)] for kind in ("aic", "polynomial")}
    kernel = child(KERNEL, env)
    print(f"pricing kernel: aic table {kernel[0]:.1f} ns/pass, polynomial {kernel[1]:.1f} ns/pass")
    print(f"start-up cold   {statistics.median(cold):.3f} s  (runs {', '.join(f'{x:.2f}' for x in cold)})")
    print(f"start-up cached {statistics.median(cached):.4f} s")
    n = parts.pop("n")
    print("cold parts (wall / CPU s): " + ", ".join(f"{k} {w:.2f} / {c:.2f}" for k, (w, c) in parts.items())
          + f"; {n} direct calls")
    for kind, runs in replay.items():
        walls = [w for w, _ in runs]
        print(f"replay {kind:<10} {statistics.median(walls):.3f} s wall, {runs[0][1]} passes")


if __name__ == "__main__":
    main()
