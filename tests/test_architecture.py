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
    "top": {"kernels", "base", "analytic", "model", "runtime", "measure", "top"},
}
MAX_LINES = 420   # "no module over ~400 lines"


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
    src.write_text("def f():\n    from inference_lab.runtime import engine\n    import inference_lab.model.transformer as m\n")
    got = imports_of("inference_lab.x", src, {"inference_lab", "inference_lab.runtime.engine", "inference_lab.model.transformer"})
    assert got == {"inference_lab.runtime.engine", "inference_lab.model.transformer"}


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
