"""Common subexpression elimination: compute each distinct value once (chapter 03).

Two nodes that apply the same op to the same inputs with the same attributes compute the same
value, so the later one can read the earlier one's result. The pass walks in topological order
and keys every node by (op, inputs, attributes); since inputs are looked up after their own
merging, whole duplicated chains collapse in one walk (a traced backward often recomputes what
forward had). Random ops, user Functions, side effects and sources (but equal constants) never
merge, and two values that the graph both returns stay separate buffers. A node's ordering edges
are part of its key: ``W * 2`` ordered after a write into ``W`` is not the ``W * 2`` before it.
"""

from __future__ import annotations

from typing import Any, Hashable

from minigrad.graph.ir import Graph, Node
from minigrad.graph.passes.rewrite import Rewriter, is_pure, rewrite

__all__ = ["eliminate_common_subexpressions"]

_SMALL = 64  # constant arrays up to this many elements are compared by value, larger ones by identity


def eliminate_common_subexpressions(graph: Graph) -> Graph:
    """A new graph in which each distinct (op, inputs, attributes) is computed by one node.

    ``_key(node, rw)`` says what makes two nodes' values equal (``None``: the node never merges,
    e.g. a random op); the first node of each key is copied, the later ones stand for it, except
    that two nodes both returned by the function (``_returned``) stay apart, since merging them
    would make the caller's two tensors share memory. Build it with ``rewrite(graph, visit)`` (``passes/rewrite.py``): ``visit(node, rw)`` is called
    once per node in topological order and returns ``None`` to copy the node as it is, ``DROP`` to
    leave it out, or a node of the new graph (``rw.copy(node)``, ``rw.constant(...)``, an earlier
    one) to stand for it.
    """
    ### BEGIN SOLUTION chapter 03: common-subexpression elimination
    seen: dict[Hashable, tuple[Node, Node]] = {}  # key -> (first old node, its new node)

    def visit(node: Node, rw: Rewriter) -> Node | None:
        key = _key(node, rw)
        if key is None:
            return None
        first = seen.get(key)
        if first is None:
            seen[key] = (node, rw.copy(node))
            return seen[key][1]
        if _returned(node) and _returned(first[0]):
            return None  # the caller gets two tensors; merging would make them share memory
        return first[1]

    return rewrite(graph, visit)
    ### END SOLUTION


def _key(node: Node, rw: Rewriter) -> Hashable | None:
    """What makes two nodes' values equal, or None for a node that must not merge."""
    if node.op == "constant":
        if any(u.op == "call" for u in node.users):
            return None  # a call may write into it: two equal arrays must stay two
        return ("constant", node.dtype, node.shape, _value_key(node.attrs["value"]))
    if not (is_pure(node) or node.op in ("getitem", "saved")):
        return None
    meta = node.meta
    return (node.op, node.fn, tuple(rw[i] for i in node.inputs), _value_key(node.attrs), node.shape, node.dtype,
            meta.get("args"), meta.get("kwargs"), meta.get("ctx_device"), _value_key(meta.get("needs_input_grad")),
            tuple(rw.after(node)))


def _value_key(v: Any) -> Hashable:
    """A hashable stand-in for an attribute value that is equal only for equal values, with the
    type included (``1``, ``1.0`` and ``True`` compare equal in Python but promote differently)."""
    if isinstance(v, dict):
        return ("dict", tuple((k, _value_key(x)) for k, x in sorted(v.items())))
    if isinstance(v, (tuple, list)):
        return (type(v), tuple(_value_key(x) for x in v))
    if isinstance(v, slice):
        return ("slice", _value_key(v.start), _value_key(v.stop), _value_key(v.step))
    if hasattr(v, "shape") and hasattr(v, "dtype") and hasattr(v, "tobytes"):  # an array or array scalar
        if getattr(v, "size", 0) <= _SMALL:  # by bits: distinguishes -0.0 from 0.0, and NaN equals NaN
            return ("array", type(v), str(v.dtype), tuple(v.shape), v.tobytes())
        return ("id", id(v))
    try:
        hash(v)
    except TypeError:
        return ("id", id(v))
    return (type(v), v)


def _returned(node: Node) -> bool:
    return any(u.op == "output" for u in node.users)
