"""A fused group read as a recipe: the ``Program`` both kernel generators write code from (chapter 03).

A group's sub-graph (placeholders, members, one output) is an optional product computed first
(a matmul or conv whose op declares ``epilogue``), elementwise ops in order, and an optional
reduction at the end. ``reduces_rows`` and ``row_compatible`` say when a group may run by blocks
of whole rows instead, which the fusion pass and the CPU generator both ask. ``expression`` writes
one op of the recipe in C or CUDA, which differ only in the ``Dialect`` that spells some constants.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

from minigrad.graph.ir import Graph, Node, op_kind
from minigrad.graph.trace import ARRAY_ARG, TENSOR_ARG

__all__ = ["Dialect", "Program", "expression", "is_anchor", "literal", "program", "reduces_rows", "row_compatible"]


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
    # named after the telling ops, not the scales and shifts (x * s, x + t) that nearly every kernel has
    plain = ("scale", "shift")
    distinct = list(dict.fromkeys(n.op.lower() for n in members if getattr(n.fn, "affine", None) not in plain))
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


class Dialect(NamedTuple):
    """What a C-like target spells its own way: the C type of each dtype, an op class's expression
    (a format string of its arguments and ``{T}``, or a function of (args, T, out_type)), and
    ``spell(value, ctype)``, its own literal for a constant (a bool, NaN, an infinity) or None."""

    ctypes: dict[str, str]
    expression_of: Callable[[type], Any]
    spell: Callable[[Any, str], str | None]


def expression(node: Node, value: dict[Node, str], dialect: Dialect) -> str:
    """``node``'s value as an expression of its inputs' names (``value``). The op computes in its
    first tensor argument's C type, unless that is a bool (the condition of ``where``, or ``mask +
    2``), whose constants would be cast to 0 or 1: then in its result's."""
    ctypes = dialect.ctypes
    first = node.inputs[0] if node.inputs and node.inputs[0].dtype.kind != "b" else node
    ctype = ctypes[str(first.dtype)]
    inputs = iter(node.inputs)
    args = [value[next(inputs)] if k in (TENSOR_ARG, ARRAY_ARG) else literal(node.attrs[k], ctype, dialect.spell)
            for k in node.meta["args"]]
    expr = dialect.expression_of(node.fn)
    return expr.format(*args, T=ctype) if isinstance(expr, str) else expr(args, ctype, ctypes[str(node.dtype)])


def literal(v: Any, ctype: str, spell: Callable[[Any, str], str | None]) -> str:
    """A constant argument as a C literal of type ``ctype``: ``(float)0.5``, not a double."""
    if v is None:
        return "None"
    if hasattr(v, "item") and getattr(v, "shape", None) == ():
        v = v.item()  # a numpy scalar: its repr, np.float32(0.5), is not C
    if isinstance(v, int) and not -2**63 <= v < 2**63:  # no C integer literal holds it
        v = float(v)
    own = spell(v, ctype)
    return own if own is not None else f"({ctype}){v!r}"
