"""The graph IR: a static computational graph as nodes with in-edges and out-edges (chapter 01).

A ``Graph`` holds ``Node``s in insertion order. A node names its ``op`` (an op class such as
``"Mul"``, the class itself in ``fn``, or a structural op from ``OPS`` below), its ``inputs``
(in-edges) and ``users`` (out-edges, kept in sync by the graph), the op's non-tensor arguments
``attrs``, and the ``shape`` and ``dtype`` of its value. The topological order, the order in which
the graph can execute, is cached and recomputed after any mutation; ``levels()`` groups the nodes
that depend on nothing in their own group, which is what could run in parallel. Besides its data
in-edges a node may carry *ordering edges* (``after``: TensorFlow's control dependencies): nodes
that must have run before it although it reads none of their values, such as an in-place write
that must wait for the readers of the old value, or a print that must wait for a step to finish.
Every order the graph gives, and every pass and executor, honours them.
``minigrad.graph.trace`` builds graphs and the passes of chapter 03 rewrite them; what they need to
know about an op they read from its class (``node.fn``; ``minigrad.ops.op`` lists the declarations),
never from a table of names.
"""

from __future__ import annotations

import heapq
from typing import Any, Iterable, Iterator

__all__ = ["EFFECT_OPS", "Graph", "GraphError", "Node", "OPS", "SIDE_EFFECT_OPS", "SOURCE_OPS", "op_kind"]

# The structural ops; every other op is the name of the Function class in ``node.fn``.
OPS = {
    "placeholder": "an input of the graph, given at each call",
    "constant": "a fixed array, attrs['value']",
    "parameter": "a tensor that lives outside the graph (weights, buffers, optimizer state), meta['target'], "
                 "read when the graph runs",
    "grad": "the .grad of meta['target'] when the graph starts running",
    "getitem": "output attrs['index'] of a node whose op returns several arrays",
    "saved": "array attrs['index'] that the input node's forward kept for backward (a mask, a statistic)",
    "copy_": "side effect: write inputs[1] into the tensor of inputs[0] (an in-place update)",
    "set_grad": "side effect: set the .grad of the tensor of inputs[0] to inputs[1], or to None without it",
    "call": "side effect: call attrs['fn'] on the arrays of its inputs when it runs (a print, a log, a write "
            "into an input's memory, a collective); its value is None",
    "output": "the values the graph returns, its inputs",
}
SOURCE_OPS = frozenset({"placeholder", "constant", "parameter", "grad"})
SIDE_EFFECT_OPS = frozenset({"copy_", "set_grad", "output"})
EFFECT_OPS = frozenset({"copy_", "set_grad"})  # the side effects that write a tensor
# A call runs where the schedule puts it, not at the end as the writes do, so it is a reader in
# every plan (writeback, overlap) rather than one of SIDE_EFFECT_OPS; dead code keeps it all the same.
# the kinds of the structural ops and of ``fused``, a group merged into one generated kernel (passes/fusion.py)
STRUCTURAL_KINDS = {"getitem": "movement", "saved": "movement", "copy_": "effect", "set_grad": "effect",
                    "call": "effect", "fused": "fused"}

_KIND_COLOR = {
    "placeholder": "#9ecae1", "parameter": "#fdd49e", "grad": "#fdd49e", "constant": "#d9d9d9",
    "elementwise": "#c7e9c0", "reduction": "#fcbba1", "matmul": "#dadaeb", "movement": "#f0f0f0",
    "effect": "#fbb4c4", "fused": "#74c476", "output": "#ffffff", "other": "#ffffff",
}


def op_kind(node: Node) -> str:
    """The kind of a node's op: a source op's own name, output, effect (``copy_``, ``set_grad``),
    movement (``getitem``, ``saved``), fused, or else what its op class declares (``minigrad.ops.op``):
    elementwise, reduction, matmul (and conv), movement or other."""
    if node.op in SOURCE_OPS or node.op == "output":
        return node.op
    if node.op in STRUCTURAL_KINDS:
        return STRUCTURAL_KINDS[node.op]
    return getattr(node.fn, "kind", "other")


class GraphError(RuntimeError):
    """A graph that cannot be built or changed as asked (a cycle, erasing a node still in use)."""


class Node:
    """One node of a ``Graph``; create nodes with ``Graph.add_node``."""

    __slots__ = ("graph", "op", "_inputs", "_users", "attrs", "shape", "dtype", "name", "fn", "meta", "_index",
                 "_after", "_followers")

    def __init__(self, graph: Graph, op: str, inputs: tuple, attrs: dict, shape: tuple | None, dtype: Any,
                 name: str, fn: Any, meta: dict, index: int) -> None:
        self.graph, self.op, self._inputs, self.attrs = graph, op, inputs, attrs
        self._users: dict[Node, None] = {}  # an ordered set
        self._after: tuple[Node, ...] = ()  # ordering in-edges: nodes that run first, values unread
        self._followers: dict[Node, None] = {}  # ordering out-edges
        self.shape, self.dtype, self.name, self.fn, self.meta, self._index = shape, dtype, name, fn, meta, index

    @property
    def inputs(self) -> tuple[Node, ...]:
        """The in-edges: the nodes whose values this node reads, in argument order."""
        return self._inputs

    @inputs.setter
    def inputs(self, new: Iterable[Node]) -> None:
        self.graph._set_inputs(self, tuple(new))

    @property
    def users(self) -> list[Node]:
        """The out-edges: the nodes that read this node's value, in the order they were added."""
        return list(self._users)

    @property
    def after(self) -> tuple[Node, ...]:
        """The ordering in-edges: nodes that must have run before this one, whose values it does
        not read (``Graph.add_ordering`` adds one)."""
        return self._after

    @after.setter
    def after(self, new: Iterable[Node]) -> None:
        self.graph._set_after(self, tuple(dict.fromkeys(new)))

    @property
    def followers(self) -> list[Node]:
        """The ordering out-edges: the nodes that must wait for this one."""
        return list(self._followers)

    @property
    def predecessors(self) -> tuple[Node, ...]:
        """Everything that runs before this node: its inputs, then its ``after`` nodes."""
        return self._inputs + self._after if self._after else self._inputs

    @property
    def successors(self) -> list[Node]:
        """Everything that waits for this node: its users, then its followers."""
        return list(self._users) + [f for f in self._followers if f not in self._users]

    @property
    def kind(self) -> str:
        return op_kind(self)

    @property
    def has_side_effects(self) -> bool:
        """True for nodes that must run although nothing reads them (writes, calls and the output)."""
        return self.op in SIDE_EFFECT_OPS or self.op == "call"

    @property
    def ordered(self) -> bool:
        """Whether an ordering edge starts or ends here (passes keep such a node where it is)."""
        return bool(self._after or self._followers)

    def replace_input(self, old: Node, new: Node) -> None:
        self.inputs = [new if i is old else i for i in self._inputs]

    def format(self) -> str:
        """The node as one line of an SSA listing: ``%3 = Mul(%1, %2)  # (128, 512) float32``."""
        args = [i.name for i in self._inputs] + [f"{k}={_short(v)}" for k, v in self.attrs.items()]
        call = f"{self.op}({', '.join(args)})" if args or self.op not in SOURCE_OPS else self.op
        if self._after:
            call += f"  after {', '.join(a.name for a in self._after)}"
        if self.has_side_effects:
            return call
        line = f"{self.name} = {call}"
        if self.shape is not None:
            line += f"  # {tuple(self.shape)} {self.dtype}"
        return line

    def __repr__(self) -> str:
        return f"<Node {self.format()}>"


class Graph:
    """A DAG of ``Node``s with placeholders (inputs), one ``output`` node and side-effect nodes."""

    def __init__(self) -> None:
        self._nodes: dict[Node, None] = {}  # insertion order
        self._names: set[str] = set()
        self._counter = 0
        self._order: list[Node] | None = None
        self._output: Node | None = None

    # -- building ---------------------------------------------------------------------------------
    def add_node(self, op: str, inputs: Iterable[Node] = (), attrs: dict | None = None, *, shape: tuple | None = None,
                 dtype: Any = None, fn: Any = None, name: str | None = None, meta: dict | None = None,
                 after: Iterable[Node] = ()) -> Node:
        """Append a node; ``name`` defaults to ``%<n>`` and is made unique by a suffix; ``after``
        are nodes it must run after without reading their values (ordering edges)."""
        inputs = tuple(inputs)
        for i in inputs:
            self._check_member(i)
        name = self._unique(name if name is not None else f"%{self._counter}")
        node = Node(self, op, inputs, dict(attrs or {}), None if shape is None else tuple(shape), dtype,
                    name, fn, dict(meta or {}), self._counter)
        self._counter += 1
        self._nodes[node] = None
        for i in inputs:
            i._users[node] = None
        self._order = None
        if op == "output":
            if self._output is not None:
                raise GraphError("a graph has one output node; use set_outputs to change it")
            self._output = node
        if after:
            self._set_after(node, tuple(dict.fromkeys(after)))
        return node

    def add_ordering(self, first: Node, then: Node) -> None:
        """An ordering edge: ``then`` runs after ``first`` although it reads nothing of it (as
        ``tf.control_dependencies``): a write into memory after the readers of the old contents,
        a print or a collective after a value is ready."""
        self._check_member(first)
        if first is then:
            raise GraphError(f"add_ordering: {first.name} cannot run after itself")
        self._set_after(then, tuple(dict.fromkeys(then._after + (first,))))

    def set_outputs(self, nodes: Iterable[Node]) -> Node:
        """Make ``nodes`` the values the graph returns (replacing the previous output node)."""
        if self._output is not None:
            self._output.inputs = nodes
            return self._output
        return self.add_node("output", nodes, name="output")

    def erase(self, node: Node) -> None:
        """Remove a node that no other node reads."""
        self._check_member(node)
        if node._users or node._followers:
            users = ", ".join(u.name for u in [*node._users, *node._followers])
            raise GraphError(f"erase: {node.name} ({node.op}) is still used by {users}")
        for i in node._inputs:
            i._users.pop(node, None)
        for a in node._after:
            a._followers.pop(node, None)
        del self._nodes[node]
        self._names.discard(node.name)
        if node is self._output:
            self._output = None
        self._order = None

    def replace_all_uses_with(self, old: Node, new: Node) -> int:
        """Make every user of ``old`` read ``new`` instead; returns how many users changed."""
        self._check_member(old)
        self._check_member(new)
        users = [u for u in old._users if u is not new]
        for u in users:
            u.replace_input(old, new)
        for f in [f for f in old._followers if f is not new]:  # what waited for the value waits for its new node
            f.after = [new if a is old else a for a in f._after]
        return len(users)

    def _set_inputs(self, node: Node, inputs: tuple) -> None:
        self._check_member(node)
        for i in inputs:
            self._check_member(i)
        for i in node._inputs:
            i._users.pop(node, None)
        node._inputs = inputs
        for i in inputs:
            i._users[node] = None
        self._order = None

    def _set_after(self, node: Node, after: tuple) -> None:
        self._check_member(node)
        for a in after:
            self._check_member(a)
        for a in node._after:
            a._followers.pop(node, None)
        node._after = after
        for a in after:
            a._followers[node] = None
        self._order = None

    # -- reading ----------------------------------------------------------------------------------
    @property
    def nodes(self) -> list[Node]:
        """Every node, in insertion order."""
        return list(self._nodes)

    @property
    def placeholders(self) -> list[Node]:
        return [n for n in self._nodes if n.op == "placeholder"]

    @property
    def output_node(self) -> Node | None:
        return self._output

    @property
    def outputs(self) -> list[Node]:
        """The nodes whose values the graph returns."""
        return list(self._output.inputs) if self._output is not None else []

    def __len__(self) -> int:
        return len(self._nodes)

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __contains__(self, node: object) -> bool:
        return node in self._nodes

    def topological_order(self) -> list[Node]:
        """Every node after all of its inputs and ``after`` nodes (Kahn's algorithm; ties go to the
        earlier-added node, so the order is deterministic and equals insertion order whenever that is valid)."""
        if self._order is not None:
            return list(self._order)
        missing = {n: len(set(n.predecessors)) for n in self._nodes}
        ready = [(n._index, n) for n, k in missing.items() if k == 0]
        heapq.heapify(ready)
        order = []
        while ready:
            _, n = heapq.heappop(ready)
            order.append(n)
            for u in n.successors:
                missing[u] -= 1
                if missing[u] == 0:
                    heapq.heappush(ready, (u._index, u))
        if len(order) != len(self._nodes):
            stuck = ", ".join(n.name for n, k in missing.items() if k > 0)
            raise GraphError(f"the graph has a cycle through {stuck}")
        self._order = order
        return list(order)

    def levels(self) -> list[list[Node]]:
        """Nodes grouped by depth (sources at level 0, every other node one past its deepest input
        or ``after`` node): no node depends on another of its level, so each level could run in parallel."""
        depth: dict[Node, int] = {}
        groups: list[list[Node]] = []
        for n in self.topological_order():
            d = 1 + max((depth[i] for i in n.predecessors), default=-1)
            depth[n] = d
            if d == len(groups):
                groups.append([])
            groups[d].append(n)
        return groups

    def copy(self) -> Graph:
        """A new graph with the same nodes (names, attrs and meta copied shallowly; arrays shared)."""
        new = Graph()
        twin: dict[Node, Node] = {}
        for n in self.topological_order():
            twin[n] = new.add_node(n.op, [twin[i] for i in n._inputs], n.attrs, shape=n.shape, dtype=n.dtype,
                                   fn=n.fn, name=n.name, meta=n.meta, after=[twin[a] for a in n._after])
        new._counter = max(new._counter, self._counter)
        return new

    def __str__(self) -> str:
        return "\n".join(n.format() for n in self.topological_order())

    def __repr__(self) -> str:
        return f"<Graph: {len(self._nodes)} nodes, {len(self.placeholders)} inputs, {len(self.outputs)} outputs>"

    # -- drawing ----------------------------------------------------------------------------------
    def dot_elements(self) -> tuple[list[tuple[str, dict]], list[tuple[str, str]]]:
        """The drawing as data: ``(id, attributes)`` per node and ``(id, id)`` per edge, ids
        numbered in topological order (never ``id()``, so the picture is the same every run)."""
        order = self.topological_order()
        ids = {n: f"n{k}" for k, n in enumerate(order)}
        nodes, edges = [], []
        for n in order:
            label = n.name if n.op == "output" else f"{n.name}  {n.op}"
            attrs = [f"{k}={_short(v)}" for k, v in n.attrs.items() if n.op != "constant" or k != "value"]
            if attrs:
                label += "\n" + ", ".join(attrs)
            if n.shape is not None:
                label += f"\n{tuple(n.shape)} {n.dtype}"
            shape = "ellipse" if n.kind in SOURCE_OPS else "box"
            style = {"label": label, "shape": shape, "style": "filled,rounded" if shape == "box" else "filled",
                     "fillcolor": _KIND_COLOR[n.kind]}
            if n.op == "output":
                style.update(shape="doubleoctagon", style="filled")
            nodes.append((ids[n], style))
            edges.extend((ids[i], ids[n]) for i in n._inputs)
        return nodes, edges

    def to_dot(self, rankdir: str = "TB") -> str:
        """The graph as Graphviz DOT text, nodes coloured by kind (``minigrad.graph.draw`` renders it)."""
        nodes, edges = self.dot_elements()
        lines = ["digraph {", f"\trankdir={rankdir}", '\tnode [fontname="Helvetica" fontsize=10]']
        for name, attrs in nodes:
            body = " ".join(f'{k}="{_escape(v)}"' for k, v in attrs.items())
            lines.append(f"\t{name} [{body}]")
        lines.extend(f"\t{a} -> {b}" for a, b in edges)
        ids = {n: f"n{k}" for k, n in enumerate(self.topological_order())}
        lines.extend(f"\t{ids[a]} -> {ids[n]} [style=dashed]" for n in ids for a in n._after)  # ordering edges
        lines.append("}")
        return "\n".join(lines) + "\n"

    # -- helpers ----------------------------------------------------------------------------------
    def _check_member(self, node: Node) -> None:
        if not isinstance(node, Node) or node.graph is not self or node not in self._nodes:
            raise GraphError(f"{node!r} is not a node of this graph")

    def _unique(self, name: str) -> str:
        base, k = name, 1
        while name in self._names:
            name = f"{base}_{k}"
            k += 1
        self._names.add(name)
        return name


def _short(v: Any) -> str:
    """A short, deterministic text for an attribute value (no memory addresses)."""
    if hasattr(v, "shape") and hasattr(v, "dtype") and not isinstance(v, type):
        if getattr(v, "size", 5) > 4 or not hasattr(v, "tolist"):
            return f"array{tuple(v.shape)}"
        items = [f"{x:.4g}" if isinstance(x, float) else str(x) for x in v.reshape(-1).tolist()]
        return items[0] if v.ndim == 0 else "[" + ", ".join(items) + "]"
    if isinstance(v, (tuple, list)):
        items = [_short(x) for x in v]
        if isinstance(v, list):
            return "[" + ", ".join(items) + "]"
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    if isinstance(v, slice):
        text = f"{'' if v.start is None else v.start}:{'' if v.stop is None else v.stop}"
        return text if v.step is None else f"{text}:{v.step}"
    if v is Ellipsis:
        return "..."
    if hasattr(v, "__code__"):  # a call node's function: its name, not its address
        return v.__qualname__
    text = str(v) if not isinstance(v, str) else repr(v)
    if " at 0x" in text:
        return type(v).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def _escape(v: Any) -> str:
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
