"""Algebraic simplification: rewrite ops whose result is known without computing it (chapter 03).

Only exact rules: ``x*1``, ``1*x``, ``x+0``, ``0+x``, ``x-0``, ``x/1``, ``x**1`` and ``-(-x)`` are
``x``; a cast to ``x``'s own dtype, a reshape or broadcast to ``x``'s own shape and a permutation
that keeps every dim are ``x``; a reshape of a reshape is one reshape and a permutation of a
permutation is one permutation (two transposes that cancel vanish). An identity holds only when
the op changes neither shape nor dtype: ``x*1`` with a ``1`` of a larger shape broadcasts ``x``,
and ``int_tensor*1.0`` promotes it, so neither is ``x``. (``x+0`` turns ``-0.0`` into ``0.0``, a
value that compares equal.) A value the graph returns is never replaced by an existing one, so
the caller never receives an input's buffer, or one buffer twice, where eager gave new memory.
The rules see the already simplified inputs, so chains (``x.T.T.T``) collapse in one walk.
"""

from __future__ import annotations

import numbers
from typing import Any

from minigrad.graph.ir import Graph, Node
from minigrad.graph.passes.rewrite import Rewriter, rewrite
from minigrad.graph.trace import ARRAY_ARG, TENSOR_ARG

__all__ = ["simplify"]

# op -> (identity element, positions where it may stand: 0 = left operand, 1 = right operand)
_IDENTITIES = {"Mul": (1, (0, 1)), "Add": (0, (0, 1)), "Sub": (0, (1,)), "Div": (1, (1,)), "Pow": (1, (1,))}


def simplify(graph: Graph) -> Graph:
    """A new graph with the exact algebraic rules of the module docstring applied."""

    def visit(node: Node, rw: Rewriter) -> Node | None:
        if any(u.op == "saved" for u in node.users):
            return None  # its backward reads arrays only this op makes
        same = _same_as(node, rw)
        if same is not None:
            if any(u.op == "output" for u in node.users) or not _keeps_type(node, same):
                return None
            return same
        return _combined(node, rw)

    return rewrite(graph, visit)


def _same_as(node: Node, rw: Rewriter) -> Node | None:
    """The (new) node whose value ``node`` equals, if a rule says so."""
    op, ins = node.op, [rw[i] for i in node.inputs]
    if op in _IDENTITIES:
        unit, sides = _IDENTITIES[op]
        operands = _operands(node, ins)
        for side in sides:
            other = operands[1 - side]
            if isinstance(other, Node) and _is_constant(operands[side], unit):
                return other
    elif op == "Neg" and ins[0].op == "Neg":
        return ins[0].inputs[0]
    elif op == "Cast":
        return ins[0]
    elif op in ("Reshape", "BroadcastTo"):
        return ins[0] if ins[0].shape == node.shape else None
    elif op == "Permute":
        return ins[0] if tuple(node.attrs["dims"]) == tuple(range(len(node.attrs["dims"]))) else None
    return None


def _combined(node: Node, rw: Rewriter) -> Node | None:
    """One node for two stacked reshapes or permutations (the inner one may stay for other users)."""
    inner = rw[node.inputs[0]] if node.inputs else None
    if inner is None or inner.op != node.op or node.op not in ("Reshape", "Permute"):
        return None
    source = inner.inputs[0]
    if node.op == "Reshape":
        if source.shape == node.shape and not any(u.op == "output" for u in node.users):
            return source
        return rw.copy(node, [source])
    dims = tuple(inner.attrs["dims"][d] for d in node.attrs["dims"])  # output dim i reads source dim
    if dims == tuple(range(len(dims))):
        return None if any(u.op == "output" for u in node.users) else source
    return rw.copy(node, [source], attrs=dict(node.attrs, dims=dims))


def _operands(node: Node, ins: list[Node]) -> list[Any]:
    """A binary op's two operands in argument order: new nodes for tensors, attributes for numbers."""
    it = iter(ins)
    return [next(it) if k in (TENSOR_ARG, ARRAY_ARG) else node.attrs.get(k) for k in node.meta["args"]]


def _is_constant(operand: Any, unit: int) -> bool:
    """Whether ``operand`` is the number ``unit``, or a constant node all of whose values are."""
    if isinstance(operand, Node):
        return operand.op == "constant" and bool((operand.attrs["value"] == unit).all())
    return isinstance(operand, numbers.Number) and operand == unit


def _keeps_type(node: Node, same: Node) -> bool:
    return same.shape == node.shape and same.dtype == node.dtype
