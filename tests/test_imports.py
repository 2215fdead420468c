"""How the shipped packages' modules (orchestrator, dashboard) import each other, read from the source (nothing
here imports the project; benchmarks and tests measure internals and may reach into them):

- no circle between modules or between packages, counting imports inside functions (a lazy import hides a circle from Python, not
  from the design) and imports by name (`importlib.import_module("...")`, a card's "module:Class");
- no private name (`_x`) of one module used by another, whether imported or read off an imported module;
- a lazy import is an import statement inside a function, which static tools see; `importlib` is left to the
  places where the module's name is data (a plugin, a card's implementation, a dataset's loader).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("orchestrator", "dashboard")

# The module's name comes from data here: a plugin or a built-in method folder found on disk, a card's
# "module:Class", a dataset card's loader.
IMPORTLIB_ALLOWED = {"orchestrator/registry/methods.py", "orchestrator/registry/card.py",
                     "orchestrator/data/datasets.py"}

_TARGET = re.compile(r"^(orchestrator|dashboard|benchmarks)(\.\w+)+:\w+$")  # "module:attribute", imported on use


def _files() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


FILES = _files()
TREES = {m: ast.parse(p.read_text(), filename=str(p)) for m, p in FILES.items()}


def _rel(module: str) -> str:
    return FILES[module].relative_to(REPO).as_posix()


def _absolute(module: str, node: ast.ImportFrom) -> str:
    """The absolute module a `from ... import` names (relative imports resolved against `module`)."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if FILES[module].name == "__init__.py" else module.split(".")[:-1]
    base = base[:len(base) - node.level + 1]
    return ".".join([*base, *([node.module] if node.module else [])])


def _owner(dotted: str) -> str | None:
    """The project module that a dotted name is, or lies in (the longest prefix that is a module)."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in FILES:
            return ".".join(parts[:n])
    return None


def _edges(module: str) -> set[str]:
    """The project modules `module` imports, wherever the import stands: `from P import m` counts m when it is a
    module, else P; a package's `__init__` that Python runs on the way to a submodule is not counted."""
    out: set[str] = set()
    for node in ast.walk(TREES[module]):
        if isinstance(node, ast.Import):
            out |= {o for a in node.names if (o := _owner(a.name))}
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, node)
            for a in node.names:
                target = f"{source}.{a.name}" if f"{source}.{a.name}" in FILES else _owner(source)
                out |= {target} if target else set()
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) \
                and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "__import__"):
            out |= {o for o in [_owner(node.args[0].value)] if o}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _TARGET.match(node.value):
            out |= {o for o in [_owner(node.value.partition(":")[0])] if o}
    return out - {module}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                out.append(sorted([v, *component]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _assert_no_circle(graph: dict[str, set[str]]) -> None:
    circles = _circles(graph)
    assert not circles, "\n".join(  # each circle with its arrows, so a failure says where to look
        " <-> ".join(c) + ": " + ", ".join(f"{a} -> {b}" for a in c for b in sorted(graph[a] & set(c)))
        for c in circles)


def test_no_import_circle_between_modules_or_packages():
    """Packages too (orchestrator.results, orchestrator.sweep, dashboard, ...): two modules each importing the
    other's package is a circle in the design even where no two modules import each other."""
    graph = {m: _edges(m) for m in FILES}
    _assert_no_circle(graph)

    def package(m: str) -> str:
        return ".".join(m.split(".")[:2])

    packages: dict[str, set[str]] = {}
    for m, targets in graph.items():
        packages.setdefault(package(m), set()).update(package(t) for t in targets if package(t) != package(m))
    _assert_no_circle(packages)


def _bound_modules(module: str) -> dict[str, str]:
    """Local name -> the project module it is bound to by an import anywhere in the file."""
    out: dict[str, str] = {}
    for node in ast.walk(TREES[module]):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname and a.name in FILES:
                    out[a.asname] = a.name
                elif not a.asname and a.name.partition(".")[0] in FILES:
                    out[a.name.partition(".")[0]] = a.name.partition(".")[0]
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, node)
            for a in node.names:
                if f"{source}.{a.name}" in FILES:
                    out[a.asname or a.name] = f"{source}.{a.name}"
    return out


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and (head := _dotted(node.value)):
        return f"{head}.{node.attr}"
    return None


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_no_private_name_crosses_a_module():
    found = []
    for module, tree in TREES.items():
        bound = _bound_modules(module)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and _owner(_absolute(module, node)):
                source = _absolute(module, node)
                found += [f"{_rel(module)}:{node.lineno} from {source} import {a.name}" for a in node.names
                          if _private(a.name) and source != module]
            elif isinstance(node, ast.Attribute) and _private(node.attr) and (head := _dotted(node.value)):
                first, _, rest = head.partition(".")
                target = ".".join(filter(None, [bound.get(first), rest])) if first in bound else None
                if target in FILES and target != module:
                    found.append(f"{_rel(module)}:{node.lineno} {target}.{node.attr}")
    assert not found, "\n".join(found)


def test_lazy_imports_are_import_statements():
    found = []
    for module, tree in TREES.items():
        if _rel(module) in IMPORTLIB_ALLOWED:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in (
                    "import_module", "__import__"):
                found.append(f"{_rel(module)}:{node.lineno}")
    assert not found, "\n".join(found)
