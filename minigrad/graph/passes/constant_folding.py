"""Constant folding: compute once what every run would compute the same way (chapter 03).

A node whose inputs are all constants has the same value at every run, so the pass runs it now
(with ``run_node``, the replay's own code) and replaces it by a ``constant``; the walk goes in
topological order, so whole subgraphs of constants fold. Parameters are not constants, since an
optimizer changes them between runs; for inference, ``freeze=True`` treats them as constants too
(a snapshot of their current values: BatchNorm's scale ``weight / sqrt(running_var + eps)``
becomes one array). Random ops and user Functions never fold, and neither does a node the graph
returns, so a call never hands out a buffer that the graph keeps, nor one with an ordering edge
(``Node.after``: folding would run it before everything), nor anything read from a source that a
``call`` node reads, since a call may write into what it is given.
"""

from __future__ import annotations

from typing import Any

from minigrad.graph.ir import Graph, Node
from minigrad.graph.passes.rewrite import DROP, Rewriter, is_pure, rewrite
from minigrad.graph.interpret import run_node, saved_value

__all__ = ["fold_constants", "frozen_parameters"]


def fold_constants(graph: Graph, freeze: bool = False) -> Graph:
    """A new graph in which every value computable from constants alone (and from parameters,
    with ``freeze=True``) is a ``constant`` node. The input graph is not changed.

    A node is foldable (``_foldable``) when it is pure and all its inputs are constants, frozen
    parameters (``frozen_parameters(graph)``) or foldable; compute the foldable nodes' values in
    topological order (``run_node``), and in the new graph replace each foldable node that a
    non-foldable node (or the output) reads by one ``constant`` node holding its value; keep a
    node that a ``saved`` node reads (a backward reads the op's saved arrays, ``saved_value``)
    as it is. Build it with ``rewrite(graph, visit)`` (``passes/rewrite.py``): ``visit(node, rw)`` is called
    once per node in topological order and returns ``None`` to copy the node as it is, ``DROP`` to
    leave it out, or a node of the new graph (``rw.copy(node)``, ``rw.constant(...)``, an earlier
    one) to stand for it.
    """
    ### BEGIN SOLUTION chapter 03: constant folding
    frozen = frozen_parameters(graph) if freeze else set()
    foldable: set[Node] = set()
    for node in graph.topological_order():
        if _foldable(node, foldable, frozen):
            foldable.add(node)
    values: dict[Node, Any] = {}  # the value of each foldable node, computed in the walk
    ctxs: dict[Node, Any] = {}  # the ctx of folded ops whose saved arrays are read

    def visit(node: Node, rw: Rewriter) -> object:
        if node not in foldable:
            return None
        op = node.op
        if op == "constant":
            values[node] = node.attrs["value"]
            return None
        if op == "parameter":  # a copy: later updates of the parameter must not leak in
            values[node] = node.meta["target"].array.copy()
        elif op == "getitem":
            values[node] = values[node.inputs[0]][node.attrs["index"]]
        elif op == "saved":
            values[node] = saved_value(ctxs[node.inputs[0]], node)
        else:
            values[node], ctx = run_node(node, [values[i] for i in node.inputs])
            if any(u.op == "saved" for u in node.users):
                ctxs[node] = ctx
        if node.shape is None or all(u in foldable for u in node.users):
            return DROP  # only folded nodes read it (a tuple is read through its getitems)
        return rw.constant(values[node], node)

    return rewrite(graph, visit)
    ### END SOLUTION


def frozen_parameters(graph: Graph) -> set[Node]:
    """The parameter nodes ``freeze=True`` treats as constants: those the graph never writes
    (a parameter a ``copy_`` updates, or whose ``.grad`` is set, is state, not a constant)."""
    written = {u.inputs[0] for u in graph.nodes if u.op in ("copy_", "set_grad")}
    return {n for n in graph.nodes if n.op == "parameter" and n not in written}


def _foldable(node: Node, foldable: set, frozen: set) -> bool:
    """Whether ``node``'s value is the same at every run (its inputs already decided)."""
    if node.ordered or any(u.op == "call" for u in node.users):
        return False
    if node.op == "constant":
        return True
    if any(u.op == "output" for u in node.users):
        return False
    if node.shape is None and any(r.op == "output" for u in node.users for r in u.users):
        return False  # a tuple, of which a part is returned: it has no constant to become
    if node in frozen:
        return True
    if node.op in ("getitem", "saved") or is_pure(node):
        return all(i in foldable for i in node.inputs)
    return False
