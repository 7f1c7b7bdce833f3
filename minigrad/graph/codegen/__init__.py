"""Code generation for fused groups: from a group's sub-graph to one kernel (chapter 03).

The fusion pass (``minigrad.graph.passes.fusion``) cuts a graph into groups and keeps each group as
a small ``Graph`` of its own: placeholders for the values it reads, its member nodes, and one output.
``program(group)`` reads such a sub-graph as a recipe (an optional matmul computed first, the
elementwise ops in order, an optional reduction at the end) and ``generate(group)`` turns the recipe
into a kernel for the group's device: a blocked numpy function on the CPU (``codegen.cpu``), a
``cupy.ElementwiseKernel`` or ``ReductionKernel`` on a GPU (``codegen.cuda``). Every kernel is
called with the group's input arrays, returns its output array, and shows its code in ``.source``.
Both generators write each op as its class declares (``cpu``, ``ufunc``, ``cuda``: ``minigrad.ops.op``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from minigrad.graph.ir import Graph, Node, op_kind

__all__ = ["Program", "fuses_rows", "generate", "is_anchor", "program", "reduces_rows", "row_compatible", "supports"]


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


def fuses_rows(node: Node) -> bool:
    """Whether the node's device has kernels that run a group by blocks of rows, so that row
    reductions may sit inside a group (the CPU's; a CUDA kernel maps one element per thread)."""
    return _device_type(node) == "cpu"


def supports(node: Node) -> bool:
    """Whether the kernel generator for the node's device can evaluate this op inside a group."""
    if _device_type(node) == "cuda":
        from minigrad.graph.codegen import cuda

        return cuda.supports(node)
    return True  # the CPU generator runs any op it has no template for through the op's forward


def generate(group: Graph) -> Any:
    """The kernel for a fused group on its device: ``kernel(*arrays) -> array``, with ``.source``."""
    if _device_type(group.outputs[0]) == "cuda":
        from minigrad.graph.codegen import cuda

        return cuda.generate(group)
    from minigrad.graph.codegen import cpu

    return cpu.generate(group)


def _device_type(node: Node) -> str:
    device = node.meta.get("device")
    return getattr(device, "type", "cpu")
