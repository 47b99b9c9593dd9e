"""Profile a servesim run with Linux `perf`, with the compiled kernels named.

Numba's kernels live in anonymous memory, so `perf report` shows them as bare
addresses. This runs one config in-process (the `servesim run` command's plain
reference counts, as that command sets them), then writes `/tmp/perf-PID.map`
— the file perf reads to name JIT code — from the symbols of the cached
object code (the `*.nbc` files of this source state's cache folder,
`servesim.cache.numba_cache_dir()`; `nm` reads their names and sizes) and the
addresses this process loaded them at, plus Numba's reference-count helpers
(`NRT_incref`/`NRT_decref`, compiled at start-up, never cached).

    perf record -F 4000 -o perf.data python benchmarks/perf_map.py CONFIG.yaml
    perf report -i perf.data --no-children --sort symbol

Run it once before, so that the kernels come from the cache and the profile
is of a warm run. Linux only; needs `perf` and binutils' `nm`.
"""

import glob
import os
import subprocess
import sys
import tempfile

NRT_HELPERS = {"NRT_MemInfo_data_fast": 16, "NRT_incref": 16, "NRT_decref": 32}


def cached_symbols(cache_dir):
    """{symbol: size} of the functions in the cached kernels' object code."""
    symbols = {}
    for path in glob.glob(os.path.join(cache_dir, "**", "*.nbc"), recursive=True):
        data = open(path, "rb").read()
        start = data.find(b"\x7fELF")
        while start >= 0:
            with tempfile.NamedTemporaryFile(suffix=".o") as obj:
                obj.write(data[start:])
                obj.flush()
                out = subprocess.run(["nm", "-S", "--defined-only", obj.name],
                                     capture_output=True, text=True).stdout
            for line in out.splitlines():
                fields = line.split()
                if len(fields) == 4 and fields[2] in "tT":
                    symbols[fields[3]] = int(fields[1], 16)
            start = data.find(b"\x7fELF", start + 4)
    return symbols


def write_perf_map(cache_dir):
    """Write /tmp/perf-PID.map for the kernels this process has loaded."""
    from numba.core.registry import cpu_target

    engine = cpu_target.target_context.codegen()._engine
    symbols = cached_symbols(cache_dir)
    symbols.update(NRT_HELPERS)
    rows = sorted((engine.get_function_address(name), size, name)
                  for name, size in symbols.items())
    path = f"/tmp/perf-{os.getpid()}.map"
    with open(path, "w") as out:
        for address, size, name in rows:
            if address:
                out.write(f"{address:x} {size:x} {name}\n")
    return path


def main(config):
    from servesim import jit

    jit.single_thread_refcounts()
    import servesim

    from servesim.cache import numba_cache_dir

    servesim.run(config)
    path = write_perf_map(numba_cache_dir())
    print(f"symbols in {path}", file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
