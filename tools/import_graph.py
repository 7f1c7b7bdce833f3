"""The import graph of the minigrad package, read with ``ast``, and the circles in it.

Every ``import`` and ``from ... import`` in a module is an edge from that module to the module it
names (``from minigrad.ops import reshape`` reads ``minigrad.ops``; ``from minigrad.nn import
functional`` reads ``minigrad.nn.functional``). Imports inside a function run when it is called,
so they are edges too, kept apart as "deferred". A circle is a strongly connected component of
more than one module (Tarjan's algorithm). The design allows one: ``minigrad._tensor`` (Tensor's
operators) and the ops that build on Tensor, which ``minigrad/_tensor.py`` closes in one place by
importing ``minigrad.ops`` last; ``tests/suites/test_import_graph.py`` checks that nothing else forms one.

Run ``python tools/import_graph.py`` to print the circles, or ``--edges`` for every edge. Chapter 01
teaches the idea underneath: a graph, its topological order, and the cycles that prevent one.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

PACKAGE = "minigrad"


def modules(root: Path) -> dict[str, Path]:
    """Every module of the package under ``root`` (the repository): dotted name -> file."""
    found = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> list[tuple[str, bool]]:
    """``(module, deferred)`` for each package module that ``name`` imports; deferred: inside a function."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, deferred: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = deferred or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((_owner(a.name, known), inside) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = _absolute(child, name, is_package)
                for a in child.names:
                    found.append((_owner(f"{base}.{a.name}", known) if f"{base}.{a.name}" in known else
                                  _owner(base, known), inside))
            elif not (isinstance(child, ast.If) and _is_type_checking(child.test)):  # typing only: never runs
                visit(child, inside)

    visit(tree, False)
    return [(m, d) for m, d in found if m is not None and m != name]


def _absolute(node: ast.ImportFrom, name: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    parts = name.split(".")
    base = parts[: len(parts) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def _owner(module: str, known: set[str]) -> str | None:
    """The package module that ``module`` names (itself, or the nearest package above it)."""
    while module and module not in known:
        module = module.rpartition(".")[0]
    return module or None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def graph(root: Path, deferred: bool = True) -> dict[str, set[str]]:
    """module -> the modules it imports (with the deferred imports unless ``deferred=False``)."""
    mods = modules(root)
    known = set(mods)
    return {name: {m for m, d in imports(name, path, known) if deferred or not d} for name, path in mods.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module, each sorted, largest first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(edges) + 100))

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return sorted(found, key=lambda c: (-len(c), c))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--edges", action="store_true", help="print every edge")
    parser.add_argument("--load-time", action="store_true", help="leave out the imports inside functions")
    args = parser.parse_args()
    edges = graph(args.root, deferred=not args.load_time)
    if args.edges:
        for a in sorted(edges):
            for b in sorted(edges[a]):
                print(f"{a} -> {b}")
    found = circles(edges)
    print(f"{len(edges)} modules, {sum(map(len, edges.values()))} edges, {len(found)} circle(s)")
    for c in found:
        print("  " + " <-> ".join(c))


if __name__ == "__main__":
    main()
