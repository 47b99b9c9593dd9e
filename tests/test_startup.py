"""A warm run's start-up (servesim/jit.py, "Loading a cached kernel"): cache
loads start Numba's runtime only, without its registries of typings and
lowerings, and the kernels' cached code needs nothing those registries would
have set up."""

import json
import subprocess
import sys

from helpers import TINY

from servesim.replay.api import run
from test_plain_python import CPU_TIER_ASYNC, DISAGGREGATED_DP

# What a cached kernel's code may call: Numba's runtime's C functions
# (registered at a load), Numba's C helpers and Python's C API (registered
# when a target context is made), LLVM's intrinsics; not the functions of
# the runtime's LLVM module (a load does not compile it: each kernel has its
# own copy of NRT_incref & co). Numba's registries register other
# symbols as they are imported (the hash secret's, the parallel backend's),
# which a load without them would leave unresolved.
RUNTIME_SYMBOLS = ("NRT_", "numba_", "Py", "_Py", "llvm.")

SCRIPT = """
import json, sys
from servesim.cli.main import main
sys.argv = ["servesim", "run", sys.argv[1], "-q", "-o", sys.argv[2]]
try:
    main()
except SystemExit as exc:
    assert not exc.code, exc.code
print(json.dumps(sorted(m for m in sys.modules if m.startswith("numba."))))
"""


def test_a_warm_run_loads_its_kernels_without_numbas_registries(tmp_path):
    # the first process compiles or loads the tiny run's kernels, the second loads them
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY)
    for out in ("first", "second"):
        done = subprocess.run([sys.executable, "-c", SCRIPT, str(config), str(tmp_path / out)],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
    modules = set(json.loads(done.stdout.splitlines()[-1]))
    assert "numba.core.dispatcher" in modules
    for registry in ("numba.np.npyimpl", "numba.np.arrayobj", "numba.np.arraymath",
                     "numba.np.random.generator_methods", "numba.typed.dictimpl"):
        assert registry not in modules
    assert (tmp_path / "first" / "requests.jsonl").read_bytes() \
        == (tmp_path / "second" / "requests.jsonl").read_bytes()


def declared_symbols(library):
    """The symbols a kernel's code declares but does not define."""
    module = getattr(library, "_shared_module", None)  # a cached kernel's, parsed
    if module is None:
        module = library._final_module  # one compiled in this process
    return {g.name for gs in (module.functions, module.global_variables) for g in gs
            if g.is_declaration}


def test_cached_kernels_call_only_what_a_load_sets_up(tmp_path):
    # every kernel a few runs use (plain, async CPU tier, disaggregated DP
    # ranks, speculative decoding), loaded or compiled in this process
    from numba.core.registry import CPUDispatcher

    speculative = CPU_TIER_ASYNC.split("engine:")[0] + """\
engine:
  block_size: 16
  num_gpu_blocks: 48
  speculative: {method: mtp, num_speculative_tokens: 2, acceptance_rates: [0.7, 0.5]}
  timing: {type: linear, base_ms: 5.0, per_token_ms: 0.1}
"""
    for k, text in enumerate([TINY, CPU_TIER_ASYNC, DISAGGREGATED_DP, speculative]):
        path = tmp_path / f"config{k}.yaml"
        path.write_text(text)
        run(str(path))
    libraries = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith("servesim."):
            continue
        for value in vars(module).values():
            if isinstance(value, CPUDispatcher):
                for cres in value.overloads.values():
                    libraries[cres.library.name] = cres.library
    # the entry kernels the runs called, compiled here or loaded from the cache (a
    # loaded kernel's library holds the code of the kernels it calls)
    assert {"run_passes", "run_workers", "init_pool", "init_tier", "_prompt_identities",
            "_fill_gaps"} <= set(libraries)
    from numba.core.runtime import _nrt_python

    runtime = {name if name.startswith("_") else "NRT_" + name for name in _nrt_python.c_helpers}
    unknown = {}
    for name, library in libraries.items():
        odd = {s for s in declared_symbols(library) if not s.startswith(RUNTIME_SYMBOLS)
               or (s.startswith("NRT_") and s not in runtime)}  # NRT_incref & co: compiled in
        if odd:
            unknown[name] = sorted(odd)
    assert not unknown, ("kernels whose code calls symbols a cache load without Numba's "
                         f"registries may not set up (servesim/jit.py): {unknown}")
