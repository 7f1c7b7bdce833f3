"""A fused group read as a recipe: the ``Program`` both kernel generators write code from (chapter 03).

A group's sub-graph (placeholders, members, one output) is an optional product computed first
(a matmul or conv whose op declares ``epilogue``), elementwise ops in order, and an optional
reduction at the end. ``reduces_rows`` and ``row_compatible`` say when a group may run by blocks
of whole rows instead, which the fusion pass and the CPU generator both ask.
"""

from __future__ import annotations

from typing import NamedTuple

from minigrad.graph.ir import Graph, Node, op_kind

__all__ = ["Program", "is_anchor", "program", "reduces_rows", "row_compatible"]


def is_anchor(node: Node) -> bool:
    """Whether the node computes a whole product first and may take an elementwise epilogue
    (GEMM + bias + ReLU): its op declares ``epilogue``."""
    return getattr(node.fn, "epilogue", False)


class Program(NamedTuple):
    """A fused group read as a recipe. ``ops`` run elementwise over ``shape``; the last of them
    writes the block output, which is the group's result unless a ``reduction`` follows."""

    name: str
    inputs: list[Node]  # the group's placeholders: the kernel's arguments, in order
    anchor: Node | None  # a matmul or conv computed first; the ops read its value
    ops: list[Node]  # the elementwise ops, in topological order
    reduction: Node | None  # the reduction that ends the group, if any
    shape: tuple  # the shape the elementwise ops produce
    root: Node  # the node whose value the kernel returns


def program(group: Graph) -> Program:
    """Read a fused group's sub-graph (as built by the fusion pass) as a ``Program``."""
    (root,) = group.outputs
    members = [n for n in group.topological_order() if n.op not in ("placeholder", "output")]
    anchor = next((n for n in members if is_anchor(n)), None)
    reduction = root if op_kind(root) == "reduction" else None
    ops = [n for n in members if n is not anchor and n is not reduction]
    shape = tuple(reduction.inputs[0].shape if reduction is not None else root.shape)
    distinct = list(dict.fromkeys(n.op.lower() for n in members if n.op not in ("Mul", "Add")))  # the telling ones
    name = "_".join(["fused"] + (distinct or [root.op.lower()])[:3])
    return Program(name, group.placeholders, anchor, ops, reduction, shape, root)


def reduces_rows(node: Node) -> bool:
    """Whether a reduction keeps axis 0 of its input, so that each block of rows reduces on its own:
    its op declares ``by_rows`` (its forward on a block of rows gives those rows of its result)
    and the dims it reduces leave axis 0 alone."""
    shape, attrs = node.inputs[0].shape, node.attrs
    dims = attrs["dims"] if "dims" in attrs else attrs.get("dim", ())
    if shape is None or len(shape) < 2 or dims is None or dims == () or not getattr(node.fn, "by_rows", False):
        return False
    dims = (dims,) if isinstance(dims, int) else dims
    return all(d % len(shape) != 0 for d in dims)


def row_compatible(shape: tuple, full: tuple) -> bool:
    """Whether a value of ``shape`` lives in the rows of ``full``: the same rows (axis 0), and every
    other axis either ``full``'s or 1 (a per-row statistic kept with ``keepdim``)."""
    return (len(shape) == len(full) >= 2 and shape[0] == full[0]
            and all(n in (f, 1) for n, f in zip(shape[1:], full[1:])))
