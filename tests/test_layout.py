"""The package layout (README "Layout"): dependencies between servesim's
sub-packages point one way.

Every module's imports are read with `ast`, those inside functions too (the
lazy imports that keep `servesim --help` light are dependencies all the same).
An import of a sub-package from a module of another is an edge between the
two; the edges must form no circle, and each must point down the layers below.

The compiled kernels of the scheduler and the KV cache are read the same way:
each docstring names the vLLM method it mirrors (issue 37, item 5).
"""

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "servesim"

# Each layer may import the layers below it, never one above or beside it.
LAYERS = (
    ("cli",),  # the command line: argument parsing and every subcommand
    ("capacity",),  # the highest load under SLOs, the cheapest deployment of a grid
    ("sweep", "fitting"),  # a grid of replays; pass-time models from measured passes
    ("replay",),  # the run API, the driver, routers, disaggregated pools, telemetry
    ("workload",),  # traces, synthetic workloads, sessions, prefix identities
    ("config",),  # the config schema: YAML reading, validation, examples, SLOs
    ("engine",),  # one engine core: the event loop, pass pricing, KV transfer
    ("scheduler", "deployment", "sglang"),  # vLLM's and SGLang's schedulers; model + GPU specs and aic tables
    ("kvcache", "results"),  # the block pool and CPU tier; records, metrics, outputs
)
# Top-level modules any sub-package may use (they import no sub-package).
BASE = {"errors", "jit", "cache", "bundles"}
RANK = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}


def unit_of(module: str) -> str:
    """The layout unit of a dotted module name under servesim: its sub-package,
    or the top-level module's name."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def module_name(path: Path, root: Path = PACKAGE) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path, root: Path = PACKAGE) -> list:
    """(line, dotted servesim module) of every import in the file, at any depth."""
    module = module_name(path, root)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            # `from servesim import replay` imports the sub-package itself
            names = [f"{target}.{a.name}" for a in node.names] if target == "servesim" else [target]
            out += [(node.lineno, n) for n in names]
    return [(line, name) for line, name in out if name == "servesim" or name.startswith("servesim.")]


def edges() -> dict:
    """{(importing unit, imported unit): ["file:line", ...]} across units."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        src = unit_of(module_name(path))
        if module_name(path) == "servesim.__main__":
            src = "cli"
        for line, name in imported_modules(path):
            dst = unit_of(name)
            if dst and dst != src:
                found.setdefault((src, dst), []).append(f"{path.relative_to(PACKAGE.parent)}:{line}")
    return found


def circles(graph: dict) -> list:
    """Every strongly connected set of more than one unit (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                out.append(sorted(scc))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_every_unit_has_a_place():
    units = {unit_of(module_name(p)) for p in PACKAGE.rglob("*.py")} - {""}
    subpackages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert subpackages == set(RANK), "a sub-package missing from LAYERS, or a layer without one"
    assert units - subpackages == BASE | {"__main__"}


def test_no_circle_between_subpackages():
    graph = {}
    for src, dst in edges():
        graph.setdefault(src, set()).add(dst)
    found = circles(graph)
    assert found == [], "sub-packages on a circle of imports: " + "; ".join(", ".join(c) for c in found)


def test_imports_point_down_the_layers():
    wrong = []
    for (src, dst), where in sorted(edges().items()):
        if src in BASE and dst not in BASE:
            wrong.append(f"{src} -> {dst} (a base module imports a sub-package): {where}")
        elif dst in BASE:
            continue
        elif RANK[dst] <= RANK[src]:
            wrong.append(f"{src} -> {dst}: {', '.join(where)}")
    assert wrong == [], "imports against the layers:\n" + "\n".join(wrong)


def test_results_import_no_engine_module():
    below = {dst for (src, dst) in edges() if src == "results"}
    assert below <= BASE


def test_the_checks_see_lazy_and_relative_imports(tmp_path):
    """The reader is what the layout rests on: a lazy import inside a function
    and a relative import both count, and a circle is found."""
    pkg = tmp_path / "servesim" / "replay"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "x.py").write_text("def f():\n    from servesim.cli.main import main\n"
                              "    from ..sweep import sweep\n    import servesim.errors\n")
    got = imported_modules(pkg / "x.py", root=tmp_path / "servesim")
    assert [name for _, name in got] == ["servesim.cli.main", "servesim.sweep", "servesim.errors"]
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": {"c"}}) == []



def module_edges(root: Path = PACKAGE) -> dict:
    """{module: {imported module, ...}} between servesim's own modules, lazy imports
    included; `from servesim.pkg import mod` counts as an import of the module `mod`."""
    modules = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    graph = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        names = {n.lineno: [a.name for a in n.names] for n in ast.walk(tree)
                 if isinstance(n, ast.ImportFrom)}
        for line, name in imported_modules(path, root):
            targets = [f"{name}.{a}" for a in names.get(line, ()) if f"{name}.{a}" in modules]
            for target in targets or ([name] if name in modules else []):
                if target != module:
                    graph.setdefault(module, set()).add(target)
    return graph


def test_no_module_circle():
    """No module imports, through any chain, a module that imports it (lazy
    imports included): each folder's modules form a hierarchy too."""
    found = sorted(circles(module_edges()))
    assert found == [], "module circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_module_circles_are_found(tmp_path):
    """`from pkg import mod` is an edge to the module, so a circle through it is seen."""
    pkg = tmp_path / "servesim" / "replay"
    pkg.mkdir(parents=True)
    (tmp_path / "servesim" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from servesim.replay import b\n")
    (pkg / "b.py").write_text("def f():\n    from .a import g\n")
    assert circles(module_edges(tmp_path / "servesim")) == [["servesim.replay.a", "servesim.replay.b"]]


# -- the kernels' docstrings (issue 37, item 5) ----------------------------------

# Where a kernel's docstring may start: the vLLM name it mirrors, in backticks,
# `Class.method`, with the file in parentheses if wanted, then a colon; or
# "servesim's own:" for a kernel with no vLLM counterpart.
MIRRORS = re.compile(r"`([A-Za-z_]\w*)(\.[A-Za-z_]\w*)+(\(\))?`(\s+\([^()]*\))?:\s+\S")
OWN = "servesim's own: "
# The vLLM file of each class a kernel may mirror: named in the kernel's docstring
# or in its module's. A class missing here is a typo, or a file to add.
VLLM_FILES = {
    "BlockPool": "vllm/v1/core/block_pool.py",
    "FreeKVCacheBlockQueue": "vllm/v1/core/kv_cache_utils.py",
    "KVCacheManager": "vllm/v1/core/kv_cache_manager.py",
    "SingleTypeKVCacheManager": "vllm/v1/core/single_type_kv_cache_manager.py",
    "FullAttentionManager": "vllm/v1/core/single_type_kv_cache_manager.py",
    "Scheduler": "vllm/v1/core/sched/scheduler.py",
    "AsyncScheduler": "vllm/v1/core/sched/async_scheduler.py",
    "FCFSRequestQueue": "vllm/v1/core/sched/request_queue.py",
    "PriorityRequestQueue": "vllm/v1/core/sched/request_queue.py",
    "Request": "vllm/v1/request.py",
    "LRUOffloadingManager": "vllm/v1/kv_offload/lru_manager.py",
    "OffloadingHandler": "vllm/v1/kv_offload/worker/worker.py",
    "OffloadingConnectorScheduler":
        "vllm/distributed/kv_transfer/kv_connector/v1/offloading_connector.py",
    "NixlConnectorScheduler": "vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py",
}
KERNEL_PACKAGES = ("scheduler", "kvcache")
NOT_KERNELS = {"check.py", "scheduler_arrays.py"}  # the debug mode; record constructors


def _is_njit(decorator) -> bool:
    if isinstance(decorator, ast.Call):
        decorator = decorator.func
    return isinstance(decorator, ast.Name) and decorator.id == "njit"


def kernels(root: Path = PACKAGE) -> list:
    """(where, docstring, module docstring) of every `@njit` function of the
    kernel packages, the debug mode and the record constructors aside."""
    out = []
    for pkg in KERNEL_PACKAGES:
        for path in sorted((root / pkg).glob("*.py")):
            if path.name in NOT_KERNELS:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            module_doc = ast.get_docstring(tree) or ""
            for node in ast.walk(tree):
                if isinstance(node, ast.FunctionDef) and any(map(_is_njit, node.decorator_list)):
                    where = f"{path.relative_to(root.parent)}:{node.lineno} {node.name}"
                    out.append((where, ast.get_docstring(node) or "", module_doc))
    return out


def docstring_faults(doc: str, module_doc: str) -> list:
    """What a kernel's docstring gets wrong against the rule (empty: nothing)."""
    faults = []
    paragraphs = [p for p in doc.split("\n\n") if p.strip()]
    mirrored = MIRRORS.match(doc)
    if doc.startswith(OWN):
        if not re.search(r"docs/engine\.md §\d", doc):
            faults.append("servesim's own, but no docs/engine.md §N says where it is documented")
    elif mirrored:
        cls = mirrored.group(1)
        if cls not in VLLM_FILES:
            faults.append(f"`{cls}` is not a vLLM class VLLM_FILES knows")
        elif VLLM_FILES[cls] not in re.sub(r"/\s+", "/", doc + " " + module_doc):
            faults.append(f"neither it nor its module's docstring names {VLLM_FILES[cls]}")
    else:
        faults.append("starts neither with the vLLM `Class.method` it mirrors and a colon"
                      " nor with \"servesim's own:\"")
        return faults
    if len(paragraphs[0].splitlines()) > 4:
        faults.append("its first paragraph is more than one short sentence")
    for p in paragraphs[1:]:
        lines = p.strip().splitlines()
        if not lines[0].startswith(("- ", "NOTE")) and len(lines) > 3:
            faults.append("a paragraph of rules: make them bullets (\"- ...\")")
    return faults


def test_each_kernel_names_the_vllm_method_it_mirrors():
    """Each kernel's docstring starts with the vLLM `Class.method` it mirrors
    (its file named there or in the module's docstring), or with "servesim's
    own:" and the docs/engine.md section of what it models; its rules follow as
    short bullets."""
    found = kernels()
    assert len(found) > 80, "the kernels were not found"
    wrong = [f"{where}: {fault}" for where, doc, module_doc in found
             for fault in docstring_faults(doc, module_doc)]
    assert wrong == [], "kernel docstrings against the rule:\n" + "\n".join(wrong)


def test_the_docstring_rule_is_read_as_meant():
    ok = "`BlockPool.free_blocks` (vllm/v1/core/block_pool.py): free them.\n\n- one rule\n- two"
    assert docstring_faults(ok, "") == []
    in_module = "vllm/v1/core/block_pool.py"
    assert docstring_faults("`BlockPool.free_blocks`: free them.", in_module) == []
    assert docstring_faults("servesim's own: a draw (docs/engine.md §12).", "") == []
    assert docstring_faults("servesim's own: a draw.", "")
    assert docstring_faults("`free_blocks`: free them (vllm/v1/core/block_pool.py).", "")
    assert docstring_faults("`BlockPool.free_blocks`: free them.", "")  # no file named
    assert docstring_faults("`BlokPool.free_blocks` (vllm/v1/core/block_pool.py): typo.", "")
    assert docstring_faults("Free them (`BlockPool.free_blocks`).", "vllm/v1/core/block_pool.py")
    prose = ok.split("\n\n")[0] + "\n\nOne rule,\nthen another,\nthen a third,\nthen more."
    assert docstring_faults(prose, "")
