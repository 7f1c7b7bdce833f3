"""Code generation for fused groups: from a group's sub-graph to one kernel (chapter 03).

The fusion pass (``minigrad.graph.passes.fusion``) cuts a graph into groups and keeps each group as
a small ``Graph`` of its own: placeholders for the values it reads, its member nodes, and one output.
``program(group)`` (``codegen.program``) reads such a sub-graph as a recipe (an optional matmul computed first, the
elementwise ops in order, an optional reduction at the end) and ``generate(group)`` turns the recipe
into a kernel for the group's device: on the CPU one C function compiled by the system compiler
(``codegen.c``, ``backend="c"``) or a blocked numpy function (``codegen.numpy_blocks``, ``backend="numpy"``,
also what runs where C cannot), on a GPU a ``cupy.ElementwiseKernel`` or ``ReductionKernel``
(``codegen.cuda``). Every kernel is called with the group's input arrays, returns its output array,
and shows its code in ``.source``. The generators write each op as its class declares (``c``,
``cpu``, ``ufunc``, ``cuda``: ``minigrad.ops.op``).
"""

from __future__ import annotations

import os
from typing import Any

from minigrad.errors import ArgumentError
from minigrad.graph.codegen import c, cuda, numpy_blocks
from minigrad.graph.codegen.program import Program, is_anchor, program, reduces_rows, row_compatible
from minigrad.graph.ir import Graph, Node

__all__ = ["BACKENDS", "Program", "default_backend", "fuses_rows", "generate", "is_anchor", "program", "reduces_rows", "row_compatible", "supports"]


def fuses_rows(node: Node) -> bool:
    """Whether the node's device has kernels that run a group by blocks of rows, so that row
    reductions may sit inside a group (the CPU's; a CUDA kernel maps one element per thread)."""
    return _device_type(node) == "cpu"


def supports(node: Node) -> bool:
    """Whether the kernel generator for the node's device can evaluate this op inside a group."""
    if _device_type(node) == "cuda":
        return cuda.supports(node)
    return True  # the CPU generator runs any op it has no template for through the op's forward


BACKENDS = ("c", "numpy")  # how CPU groups are written: compiled C, or blocked numpy


def default_backend() -> str:
    """The CPU kernel backend ``minigrad.compile`` uses unless told: ``$MINIGRAD_KERNELS`` or ``"c"``."""
    return check_backend(os.environ.get("MINIGRAD_KERNELS") or "c")


def check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ArgumentError(f"kernel backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
    return backend


def generate(group: Graph, backend: str = "numpy") -> Any:
    """The kernel for a fused group on its device: ``kernel(*arrays) -> array``, with ``.source``.
    On the CPU ``backend`` chooses compiled C or blocked numpy (``BACKENDS``)."""
    if _device_type(group.outputs[0]) == "cuda":
        return cuda.generate(group)
    return c.generate(group) if check_backend(backend) == "c" else numpy_blocks.generate(group)


def _device_type(node: Node) -> str:
    device = node.meta.get("device")
    return getattr(device, "type", "cpu")
