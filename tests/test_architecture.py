"""The house rules, checked by reading the sources (nothing is imported or run).

- Imports go only downward through the layers of docs/architecture.md, function-level
  (lazy) imports included; ``pallas_kernels`` imports nothing from ``inference_lab``.
- No import cycle among the modules of either package.
- No module over ~400 lines; every notebook has a lesson module of its own name and imports it.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("pallas_kernels", "inference_lab")

# Layer of every inference_lab module (a prefix names a package and everything in it), and the
# layers each may import from. The order is the one in docs/architecture.md.
LAYER_OF = {
    "inference_lab.base": "base",
    "inference_lab.analytic": "analytic",
    "inference_lab.model": "model",
    "inference_lab.runtime": "runtime",
    "inference_lab.measure": "measure",
    "inference_lab.serving": "serving",
    "inference_lab.lessons": "top", "inference_lab.plots": "top", "inference_lab.widgets": "top",
    "inference_lab.cli": "top", "inference_lab.train": "top", "inference_lab.triton_report": "top",
    "inference_lab.__main__": "top", "inference_lab": "top",
}
ALLOWED = {
    "kernels": {"kernels"},
    "base": {"kernels", "base"},
    "analytic": {"base", "analytic"},   # the roofline, prices and simulator: config and hardware only
    "model": {"kernels", "base", "model"},
    "runtime": {"kernels", "base", "model", "runtime"},
    "measure": {"kernels", "base", "analytic", "model", "runtime", "measure"},
    # the serving engine: the runtime behind a scheduler and an HTTP API; the analytic layer's
    # workloads and metrics for its load generator
    "serving": {"kernels", "base", "analytic", "model", "runtime", "serving"},
    "top": {"kernels", "base", "analytic", "model", "runtime", "measure", "serving", "top"},
}
MAX_LINES = 600   # a guard, not a goal: a module holds one concern; past this, it likely holds two


def module_files() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def layer(module: str) -> str:
    if module.startswith("pallas_kernels"):
        return "kernels"
    best = max((k for k in LAYER_OF if module == k or module.startswith(k + ".")), key=len, default=None)
    if best is None:
        raise AssertionError(f"{module} has no layer: add it to LAYER_OF here and to docs/architecture.md")
    return LAYER_OF[best]


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """Modules of the two packages that ``module`` imports anywhere in its source."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from pkg import mod` depends on pkg.mod; `from mod import name` on mod. (The parent
            # package's __init__ runs first either way: that is Python's doing, not counted.)
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for name in names:
            # the longest known module this name refers to (a function import names its module)
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    files = module_files()
    known = set(files)
    return {m: imports_of(m, p, known) for m, p in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_kernels_import_nothing_from_the_lab():
    bad = {m: sorted(d for d in deps if d.startswith("inference_lab"))
           for m, deps in import_graph().items() if m.startswith("pallas_kernels")}
    assert not any(bad.values()), bad


def test_imports_only_go_down_the_layers():
    bad = []
    for module, deps in import_graph().items():
        mine = layer(module)
        for dep in deps:
            if layer(dep) not in ALLOWED[mine]:
                bad.append(f"{module} ({mine}) imports {dep} ({layer(dep)})")
    assert not bad, "\n".join(bad)


def test_cycle_finder_finds_a_cycle():
    # The checks above would pass vacuously with a broken finder: feed it counter-data.
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_lazy_imports_are_seen(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from inference_lab.runtime import generation\n    import inference_lab.model.transformer as m\n")
    got = imports_of("inference_lab.x", src, {"inference_lab", "inference_lab.runtime.generation", "inference_lab.model.transformer"})
    assert got == {"inference_lab.runtime.generation", "inference_lab.model.transformer"}


def test_no_module_is_too_long():
    long = {m: n for m, p in module_files().items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_each_notebook_calls_its_own_lesson_module(nb):
    name = nb.stem[3:]
    assert (ROOT / "inference_lab" / "lessons" / f"{name}.py").is_file(), f"no lesson module for {nb.name}"
    code = "\n".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code")
    assert "lessons import" in code and name in code, f"{nb.name} does not import inference_lab.lessons.{name}"


# ----------------------------------------------------------------------------- one home per name
def _defined_names(tree) -> set:
    """Every name a module defines or binds: functions, classes, assignments, attributes it
    stores, arguments, imports."""
    names = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(n.name)
        elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
            names.add(n.attr)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            names.add(n.id)
        elif isinstance(n, ast.arg):
            names.add(n.arg)
        elif isinstance(n, ast.ImportFrom):
            names.update(a.asname or a.name for a in n.names)
    return names


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_reaches(sources: dict) -> list:
    """Places where a module of the two packages uses another module's private name: an import
    of ``_name`` (or of a ``_module``) from one of them, or an attribute ``x._name`` where
    ``_name`` is defined in another of their modules and not in this one."""
    trees = {m: ast.parse(text) for m, text in sources.items()}
    defined = {m: _defined_names(t) for m, t in trees.items()}
    found = []
    for module, tree in trees.items():
        elsewhere = set().union(*(d for m, d in defined.items() if m != module))
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] in PACKAGES:
                found += [f"{module}: from {n.module} import {a.name}" for a in n.names if _is_private(a.name)]
                if any(_is_private(part) for part in (n.module or "").split(".")):
                    found.append(f"{module}: from {n.module} import ...")
            elif isinstance(n, ast.Import):
                found += [f"{module}: import {a.name}" for a in n.names if a.name.split(".")[0] in PACKAGES
                          and any(_is_private(part) for part in a.name.split("."))]
            elif (isinstance(n, ast.Attribute) and _is_private(n.attr) and n.attr not in defined[module]
                  and n.attr in elsewhere and not (isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"))):
                found.append(f"{module}:{n.lineno}: {ast.unparse(n)}")
    return found


def reexports(sources: dict) -> list:
    """Names a plain module (not a package's ``__init__``) imports from the two packages and
    never uses: a re-export block by another name. And every ``noqa: F401``."""
    found = []
    for module, text in sources.items():
        if "noqa: F401" in text:
            found.append(f"{module}: noqa: F401")
        if module.endswith("__init__"):
            continue
        tree = ast.parse(text)
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] in PACKAGES:
                found += [f"{module}: {a.asname or a.name} from {n.module}" for a in n.names
                          if (a.asname or a.name) not in used]
    return found


def _package_sources() -> dict:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            out[".".join(path.relative_to(ROOT).with_suffix("").parts)] = path.read_text()
    return out


def test_no_module_uses_another_modules_private_names():
    found = private_reaches(_package_sources())
    assert not found, "give these names one public home:\n" + "\n".join(found)


def test_no_module_reexports_names():
    found = reexports(_package_sources())
    assert not found, "import each name from its home, not through another module:\n" + "\n".join(found)


def test_the_rules_find_what_they_look_for():
    # The checks above would pass vacuously with broken finders: feed them counter-data.
    srcs = {"inference_lab.a": "def _helper():\n    pass\nclass C:\n    def __init__(self):\n        self._k = 1\n",
            "inference_lab.b": ("import inference_lab.a as a\n"
                                "def f(c):\n    return c._k, a._helper, c._local\n"),
            "inference_lab.c": "from inference_lab.a import C  # noqa: F401\nfrom inference_lab.b import f\nf()\n",
            "inference_lab.d": "from inference_lab.a import _helper\n_helper()\n"}
    found = private_reaches(srcs)
    assert any("from inference_lab.a import _helper" in x for x in found)
    assert any("c._k" in x for x in found) and any("a._helper" in x for x in found)
    assert not any("_local" in x for x in found)          # defined nowhere: a third-party attribute
    assert reexports(srcs) == ["inference_lab.c: noqa: F401", "inference_lab.c: C from inference_lab.a"]


# ----------------------------------------------------------------------------- one timer
# The only clocks outside the timer: a live stream's timestamps (when each token appeared: the
# streamed answer, the serving engine's token events, the load generator's chunks), the API's
# `created` fields (a server's, an answer's), training's wall clock (tokens/s of the run) and a
# cached ceiling's age (now against its file's modification time). Every measured time is a sample
# of the timer.
CLOCK_ALLOWED = {"pallas_kernels.timing", "inference_lab.runtime.streaming", "inference_lab.train",
                 "inference_lab.serving.requests", "inference_lab.serving.load", "inference_lab.serving.api",
                 "inference_lab.serving.protocol", "inference_lab.base.hardware"}


def test_one_timer():
    clocks = {m for m, text in _package_sources().items() if "perf_counter" in text or "time.time(" in text}
    assert clocks == CLOCK_ALLOWED, f"time through pallas_kernels.timing instead: {sorted(clocks - CLOCK_ALLOWED)}"


# ----------------------------------------------------------------------------- what an import costs
def _imported_after(statement: str) -> set:
    import subprocess
    import sys

    code = f"import sys; {statement}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return set(out.stdout.split())


@pytest.mark.parametrize("module", ["inference_lab", "inference_lab.measure.records", "inference_lab.analytic.roofline",
                                    "inference_lab.analytic.simulator", "inference_lab.analytic.economics",
                                    "inference_lab.measure.schema", "inference_lab.measure.vllm_bench"])
def test_file_and_analytic_modules_import_without_jax(module):
    assert "jax" not in _imported_after(f"import {module}")


# Our Hopper tier and the Pallas API it is written in (jax's own Pallas loads parts of the Mosaic GPU
# compiler for any call, an interpreted one included: that is jax's doing, and not counted).
MOSAIC_GPU = ("pallas_kernels.mosaic", "jax.experimental.pallas.mosaic_gpu")


def test_pallas_kernels_loads_the_mosaic_gpu_tier_only_when_a_mosaic_kernel_is_used():
    assert "jax" not in _imported_after("import pallas_kernels, pallas_kernels.files")
    # The Hopper tier (and its import time) waits until a call runs it.
    mods = _imported_after("import pallas_kernels as pk, jax.numpy as jnp; x = jnp.ones((4, 64)); "
                           "pk.matmul(x, x.T, mode='interpret'); pk.decode_attention, pk.flash_attention")
    assert "jax" in mods and not [m for m in mods if m.startswith(MOSAIC_GPU)], sorted(
        m for m in mods if m.startswith(MOSAIC_GPU))
    assert "pallas_kernels.mosaic.matmul" in _imported_after(
        "import pallas_kernels as pk, jax.numpy as jnp; x = jnp.ones((8, 64), jnp.bfloat16); "
        "pk.matmul(x, x.T, mode='mosaic_interpret')")
