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
Which rule applies to an op is what its class declares (``unit``, ``involution``, ``is_identity``,
``compose``: ``minigrad.ops.op``).
"""

from __future__ import annotations

import numbers
from typing import Any

from minigrad.graph.ir import Graph, Node
from minigrad.graph.passes.rewrite import Rewriter, rewrite
from minigrad.graph.trace import ARRAY_ARG, TENSOR_ARG

__all__ = ["simplify"]


def simplify(graph: Graph) -> Graph:
    """A new graph with the exact algebraic rules of the module docstring applied."""

    def visit(node: Node, rw: Rewriter) -> Node | None:
        if node.ordered:
            return None  # an ordering edge pins this node: standing in for it would move it
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
    """The (new) node whose value ``node`` equals, if a rule its op declares says so: ``unit``
    (``x*1``), ``involution`` (``-(-x)``) or ``is_identity`` (a cast or reshape that changes nothing)."""
    fn, ins = node.fn, [rw[i] for i in node.inputs]
    if getattr(fn, "unit", None) is not None:
        unit, sides = fn.unit
        operands = _operands(node, ins)
        for side in sides:
            other = operands[1 - side]
            if isinstance(other, Node) and _is_constant(operands[side], unit):
                return other
    elif getattr(fn, "involution", False) and ins[0].op == node.op:
        return ins[0].inputs[0]
    elif _is_identity(node.fn, node.attrs) and _keeps_type(node, ins[0]):
        return ins[0]
    return None


def _combined(node: Node, rw: Rewriter) -> Node | None:
    """One node for two stacked ops that ``compose`` (reshapes, permutations); the inner one may
    stay for other users."""
    inner = rw[node.inputs[0]] if node.inputs else None
    if inner is None or inner.op != node.op or getattr(node.fn, "compose", None) is None:
        return None
    source = inner.inputs[0]
    attrs = node.fn.compose(inner.attrs, node.attrs)
    if _is_identity(node.fn, attrs) and _keeps_type(node, source):
        return None if any(u.op == "output" for u in node.users) else source
    return rw.copy(node, [source], attrs=attrs)


def _is_identity(fn: Any, attrs: dict) -> bool:
    identity = getattr(fn, "is_identity", False)
    return identity is True or (callable(identity) and identity(attrs))


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
