"""roiops' modules import downward only (docs/architecture.md, "Layers"): the graph of their
imports, read from the sources, function-local imports and the kernel sets that
``_backend`` loads by name included, has no cycle, and no module imports one of a layer
above its own."""

from __future__ import annotations

import ast
from pathlib import Path

import roiops
from roiops import _backend

PACKAGE = Path(roiops.__file__).parent

# Top to bottom. A name stands for that module and everything in the package below it,
# but "roiops" for the root package's __init__ only.
LAYERS = (
    ("roiops", "roiops.__main__", "roiops.cli", "roiops.demo", "roiops.bench", "roiops.compat", "roiops.onnx",
     "roiops._onnx_hook"),
    ("roiops.ops",),
    ("roiops._validation",),
    ("roiops._backend",),
    ("roiops.cpu", "roiops.triton", "roiops.reference"),
    ("roiops._kernel_checks",),
    ("roiops._registry", "roiops._library", "roiops._requirements"),
    ("roiops._spec", "roiops._boxes", "roiops._geometry", "roiops.config"),
)


def modules() -> dict[str, tuple[Path, bool]]:
    """Every module of the package: its file and whether it is a package's __init__."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def imports(name: str, path: Path, is_package: bool, known: set[str]) -> set[str]:
    """The roiops modules that module ``name`` imports anywhere in its source. ``from P
    import x`` imports P.x when that is a module, else P; importing a module of another
    subpackage also runs that subpackage's __init__ (the root package's is left out: every
    module is imported under it)."""
    here = name.split(".") if is_package else name.split(".")[:-1]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(here[:len(here) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else node.module or ""
            for a in node.names:
                targets.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
    parents = set()
    for t in targets:
        parts = t.split(".")
        parents |= {".".join(parts[:i]) for i in range(2, len(parts))}
    return {t for t in targets | parents if t in known and t != name and not name.startswith(t + ".")}


def graph() -> dict[str, set[str]]:
    known = modules()
    edges = {name: imports(name, path, is_package, set(known)) for name, (path, is_package) in known.items()}
    edges["roiops._backend"] |= set(_backend._MODULES.values())  # loaded with importlib, by name
    return edges


def layer(name: str) -> int:
    for i, prefixes in enumerate(LAYERS):
        if any(name == p or (p != "roiops" and name.startswith(p + ".")) for p in prefixes):
            return i
    raise AssertionError(f"{name} is in no layer of tests/test_layers.py")


def test_every_module_has_a_layer():
    for name in modules():
        layer(name)


def test_imports_point_down_or_across():
    upward = [f"{a} (layer {layer(a)}) imports {b} (layer {layer(b)})"
              for a, targets in graph().items() for b in sorted(targets) if layer(b) < layer(a)]
    assert upward == []


def test_no_import_cycle():
    edges = graph()
    cycles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(path[path.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert cycles == []


def test_the_checker_sees_a_cycle_and_an_upward_import(tmp_path):
    """The reading of imports that the tests above rely on: relative imports, a function's
    own import, and a subpackage's __init__."""
    (tmp_path / "ops").mkdir()
    (tmp_path / "ops" / "__init__.py").write_text("from . import a\n")
    (tmp_path / "ops" / "a.py").write_text("from .. import _validation as v\n")
    (tmp_path / "_validation.py").write_text("def f():\n    from .ops.a import g\n")
    known = {"roiops.ops", "roiops.ops.a", "roiops._validation"}
    assert imports("roiops.ops", tmp_path / "ops" / "__init__.py", True, known) == {"roiops.ops.a"}
    assert imports("roiops.ops.a", tmp_path / "ops" / "a.py", False, known) == {"roiops._validation"}
    assert imports("roiops._validation", tmp_path / "_validation.py", False, known) == {"roiops.ops.a", "roiops.ops"}
