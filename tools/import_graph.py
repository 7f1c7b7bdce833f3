"""The import graph of the minigrad package, read with ``ast``: its layers, and the circles in it.

Every ``import`` and ``from ... import`` in a module is an edge from that module to the module it
names (``from minigrad.ops import reshape`` reads ``minigrad.ops``; ``from minigrad.nn import
functional`` reads ``minigrad.nn.functional``). Imports inside a function run when it is called,
so they are edges too, kept apart as "deferred". A circle is a strongly connected component of
more than one module (Tarjan's algorithm). The design allows one: ``minigrad._tensor`` (Tensor's
operators) and the ops that build on Tensor, which ``minigrad/_tensor.py`` closes in one place by
importing ``minigrad.ops`` last; ``tests/suites/test_import_graph.py`` checks that nothing else forms one.

The package is built in layers (``LAYERS``, bottom first): the foundation (errors, hooks, the
list of torch's names), the array and device layer (``minigrad.backend``), the core (Tensor,
autograd, ops), the transforms and tools that watch or rewrite what the core runs (graph, memory,
amp, func, profiler), models and training (nn, optim, data, ...), distributed, and on top the
applications and PyTorch's names (course, examples, compat, the package's ``__init__``). A module
may import from its own layer and the layers below; ``violations`` lists every import that reaches
up, deferred ones included (an import inside a function still depends on the layer above).

State: per-thread state lives on the mode stack (``minigrad.autograd.mode``) or in grad mode's
context variables (``minigrad.autograd.grad_mode``) and nowhere else; process-wide settings
(``global`` in a function) are allowed only where ``PROCESS_WIDE`` says why. ``state_violations``
checks both.

Run ``python tools/import_graph.py`` to print the layers' violations and the circles, or ``--edges``
for every edge, ``--dot`` for the layer picture in Graphviz's language. Chapter 01 teaches the idea
underneath: a graph, its topological order, and the cycles that prevent one.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

PACKAGE = "minigrad"

# Bottom first; a module is in the layer of the longest prefix that names it (a package names its modules).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundation", ("minigrad.errors", "minigrad.hooks", "minigrad.compat.torch_modules",
                    "minigrad.compat.unsupported")),
    ("array and device", ("minigrad.backend",)),
    ("core", ("minigrad._tensor", "minigrad.tensor_types", "minigrad.creation", "minigrad.autograd",
              "minigrad.ops", "minigrad.protocols")),
    ("transforms and tools", ("minigrad.graph", "minigrad.memory", "minigrad.amp", "minigrad.batching",
                              "minigrad.func", "minigrad.profiler", "minigrad.mapped")),
    ("models and training", ("minigrad.nn", "minigrad.optim", "minigrad.data", "minigrad.distributions",
                             "minigrad.quantization", "minigrad.serialization", "minigrad.pickling")),
    ("distributed", ("minigrad.distributed",)),
    ("applications and torch's names", ("minigrad.course", "minigrad.examples", "minigrad.compat", "minigrad")),
]

# The module-level names that a function rebinds with ``global``: process-wide settings, each with why
# it is one setting for the whole process rather than per thread (which would belong on the mode stack).
PROCESS_WIDE: dict[tuple[str, str], str] = {
    ("minigrad.backend", "_default_dtype"): "torch.set_default_dtype is process-wide: every thread builds "
                                            "the same model",
    ("minigrad.backend", "_default_device"): "torch.set_default_device, as the default dtype",
    ("minigrad.backend", "_allocator"): "the CUDA memory pool is one per device and process, as torch's "
                                        "caching allocator",
    ("minigrad.backend", "_seed"): "manual_seed seeds the process's default generator, as torch's",
    ("minigrad.backend.allocator", "_enabled"): "the CPU pool is one per process (its lock serves every "
                                                "thread), and this switch is its configuration, as torch's "
                                                "allocator settings are",
    ("minigrad.backend.host_malloc", "applied"): "glibc's malloc is one per process: its thresholds are set "
                                                 "once, at import, for every thread (MINIGRAD_MALLOC=system opts out)",
    ("minigrad.data.workers", "_worker_info"): "set once in each DataLoader worker process, for the whole process",
    ("minigrad.distributed.process_group", "_default"): "one default process group per process, as torch.distributed",
    ("minigrad.distributed.process_group", "_transport"): "the MPI or NCCL transport of that process group",
    ("minigrad.distributed.process_group", "_watcher"): "the one thread that watches that group's peers",
    ("minigrad.graph.overlap", "_helper"): "one helper thread per process, started on first use",
    ("minigrad.ops.conv_algorithms", "_autotune"): "conv2d autotuning, switched for the whole process as "
                                                   "torch.backends.cudnn.benchmark is (minigrad.backends.autotune)",
    ("minigrad.ops.conv_algorithms", "_cudnn_benchmark"): "the same switch under torch's name "
                                                          "(minigrad.backends.cudnn.benchmark)",
}
# Where per-thread state may live: the mode stack and grad mode's context variables.
PER_THREAD_HOMES = ("minigrad.autograd.mode", "minigrad.autograd.grad_mode")


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


def layer_of(module: str) -> int:
    """The index in ``LAYERS`` of the longest prefix that names ``module``."""
    best, found = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, found = len(p), i
    if found is None:
        raise KeyError(f"{module} is in no layer of LAYERS: add it to the layer it belongs to")
    return found


def violations(edges: dict[str, set[str]]) -> list[str]:
    """Every import that reaches a layer above its own, as ``a (layer) imports b (layer)``."""
    found = []
    for a in sorted(edges):
        for b in sorted(edges[a]):
            if layer_of(b) > layer_of(a):
                found.append(f"{a} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]})")
    return found


def state_violations(root: Path) -> list[str]:
    """Per-thread state outside ``PER_THREAD_HOMES`` (``threading.local``, ``ContextVar``), and every
    ``global`` rebinding that ``PROCESS_WIDE`` does not list."""
    found = []
    for name, path in modules(root).items():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Global):
                found += [f"{name}: global {g} (a process-wide setting not in PROCESS_WIDE)"
                          for g in node.names if (name, g) not in PROCESS_WIDE]
            elif isinstance(node, ast.Call) and name not in PER_THREAD_HOMES:
                f = node.func
                called = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
                if called in ("local", "ContextVar"):
                    found.append(f"{name}:{node.lineno}: {called}() (per-thread state belongs on the mode stack)")
    return found


def dot(edges: dict[str, set[str]]) -> str:
    """The layer picture in Graphviz's language: one box per layer, the bottom layer at the bottom,
    naming its packages and top-level modules (with the modules of ``backend`` and ``compat``), and
    an arrow from each layer to the one below, which it builds on."""
    groups: dict[int, dict[str, set[str]]] = {i: {} for i in range(len(LAYERS))}
    for module in edges:
        parts = module.split(".")
        top = parts[1] if len(parts) > 1 else "__init__"
        children = groups[layer_of(module)].setdefault(top, set())
        if top in ("backend", "compat") and len(parts) > 2:
            children.add(parts[2])
    lines = ["digraph layers {", '  rankdir=BT; node [shape=box, fontname="Helvetica", fontsize=11];',
             '  edge [color="#888888"];']
    for i, (title, _) in enumerate(LAYERS):
        names = [f"{top} ({', '.join(sorted(kids))})" if kids else top for top, kids in sorted(groups[i].items())]
        rows = "\\n".join(", ".join(names[j:j + 4]) for j in range(0, len(names), 4))
        lines.append(f'  L{i} [label="{i}. {title}\\n{rows}"];')
    lines += [f"  L{i} -> L{i - 1};" for i in range(len(LAYERS) - 1, 0, -1)]
    lines.append("}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--edges", action="store_true", help="print every edge")
    parser.add_argument("--load-time", action="store_true", help="leave out the imports inside functions")
    parser.add_argument("--dot", action="store_true", help="print the layer picture in Graphviz's language")
    args = parser.parse_args()
    edges = graph(args.root, deferred=not args.load_time)
    if args.dot:
        print(dot(edges), end="")
        return
    if args.edges:
        for a in sorted(edges):
            for b in sorted(edges[a]):
                print(f"{a} -> {b}")
    found = circles(edges)
    print(f"{len(edges)} modules, {sum(map(len, edges.values()))} edges, {len(found)} circle(s)")
    for c in found:
        print("  " + " <-> ".join(c))
    up = violations(edges) + state_violations(args.root)
    print(f"{len(up)} import(s) reaching up a layer or state outside its place")
    for v in up:
        print("  " + v)


if __name__ == "__main__":
    main()
