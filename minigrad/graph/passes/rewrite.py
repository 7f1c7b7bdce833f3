"""Rewriting a graph by copying it: the one mechanism the passes share (chapter 03).

A pass never edits the graph it is given. ``rewrite(graph, visit)`` walks the old graph in
topological order and builds a new one: for each old node ``visit`` returns ``None`` (copy it),
a node of the new graph that stands for it (a simpler node, an earlier duplicate, a constant), or
``DROP`` (emit nothing; no kept node may read it). Emitting in the old order keeps the new graph's
insertion order a valid topological order, so side effects run in the same order as before.
A copied node keeps its ordering edges (``Node.after``), mapped to what stands for each of those
nodes in the new graph. Nodes that the rewrite left without readers are removed at the end, as are
the nodes only they read.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from minigrad.graph.ir import OPS as STRUCTURAL_OPS
from minigrad.graph.ir import Graph, GraphError, Node

__all__ = ["DROP", "Rewriter", "is_pure", "is_random", "live_nodes", "reaching", "rewrite"]

DROP = object()  # what ``visit`` returns for a node the new graph leaves out


def is_random(node: Node) -> bool:
    """Whether the node's op draws from the device's random generator (its class declares ``random``)."""
    return getattr(node.fn, "random", False)


def is_pure(node: Node) -> bool:
    """True for an op node whose value depends on its inputs and attributes alone: a built-in op
    that draws no random numbers (a user ``Function`` might do anything, so it is not)."""
    return node.op not in STRUCTURAL_OPS and not is_random(node) and getattr(node.fn, "array_forward", False)


def live_nodes(graph: Graph) -> set[Node]:
    """The nodes whose values reach the output or a side effect (a write, a call), and the nodes
    those must run after. Placeholders count (they are the graph's signature), and so do random
    ops: a draw from the random generator is itself an effect, and removing one would shift every later draw."""
    return reaching(n for n in graph.nodes if n.has_side_effects or n.op == "placeholder" or is_random(n))


def reaching(roots: Iterable[Node]) -> set[Node]:
    """``roots`` and every node they depend on: a walk back along the in-edges and ordering edges."""
    found: set[Node] = set()
    stack = list(roots)
    while stack:
        n = stack.pop()
        if n not in found:
            found.add(n)
            stack.extend(n.predecessors)
    return found


class Rewriter:
    """The state of one rewrite: the old graph, the new graph and the map between them."""

    def __init__(self, graph: Graph) -> None:
        self.old, self.new = graph, Graph()
        self.env: dict[Node, Node] = {}  # old node -> the new node holding its value

    def __getitem__(self, old: Node) -> Node:
        try:
            return self.env[old]
        except KeyError:
            raise GraphError(f"rewrite: {old.name} ({old.op}) was dropped but is still read") from None

    def copy(self, node: Node, inputs: list[Node] | None = None, **changes: Any) -> Node:
        """``node`` copied into the new graph, reading the new twins of its inputs (or ``inputs``);
        keyword arguments replace fields: ``op``, ``attrs``, ``shape``, ``dtype``, ``fn``, ``meta``."""
        fields = {"attrs": node.attrs, "shape": node.shape, "dtype": node.dtype, "fn": node.fn,
                  "meta": node.meta, "name": node.name, "after": self.after(node)}
        fields.update(changes)
        op = fields.pop("op", node.op)
        new_inputs = [self[i] for i in node.inputs] if inputs is None else inputs
        return self.new.add_node(op, new_inputs, **fields)

    def after(self, node: Node) -> list[Node]:
        """The new nodes that ``node``'s twin must run after: the twins of its ``after`` nodes, and
        for one the rewrite dropped, what that node itself ran after (so no ordering is lost)."""
        found: list[Node] = []
        stack = list(node.after)
        while stack:
            a = stack.pop(0)
            if a in self.env:
                found.append(self.env[a])
            else:
                stack.extend(a.predecessors)
        return list(dict.fromkeys(found))

    def constant(self, value: Any, like: Node, name: str | None = None) -> Node:
        """A new ``constant`` node holding ``value`` on ``like``'s device."""
        device = like.meta.get("device", like.meta.get("ctx_device"))
        return self.new.add_node("constant", attrs={"value": value}, shape=value.shape, dtype=value.dtype,
                                 name=name or like.name, meta={"device": device} if device is not None else {})

    def finish(self) -> Graph:
        """The new graph, without the nodes the rewrite left dead (nodes that were dead before stay,
        so each pass changes only what it is about; dead code is ``eliminate_dead_code``'s job)."""
        new = self.new
        was_live = live_nodes(self.old)
        keep = {self.env[n] for n in self.old.nodes if n in self.env and n not in was_live}
        alive = live_nodes(new) | keep
        for n in reversed(new.topological_order()):
            if n not in alive and not n.users:
                new.erase(n)
        return new


def rewrite(graph: Graph, visit: Callable[[Node, Rewriter], Any]) -> Graph:
    """A new graph built from ``graph`` node by node as ``visit`` decides (see the module docstring)."""
    rw = Rewriter(graph)
    for node in graph.topological_order():
        result = visit(node, rw)
        if result is DROP:
            continue
        rw.env[node] = rw.copy(node) if result is None else result
    return rw.finish()
