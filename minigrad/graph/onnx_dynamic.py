"""Dynamic axes for ONNX export: which dims of a traced graph follow the batch size (chapter 03, export).

A trace records concrete shapes, so a reshape's target bakes in the batch size it saw. To export a
model whose batch (or any other input axis) may vary, ``export_onnx(..., dynamic_axes=...)`` traces
it once more per named axis, with that axis one longer: a dim that grows by ``k`` is
``k * size + c``. Reshape and Expand then compute their targets at run time (``-1``, or
``Shape``/``Gather``/``Concat`` of the input's shape). Whatever else differs between the two
exported graphs (a constant of batch shape, a slice that ends at the batch size) would not follow
the batch, so ``difference`` names it and the export refuses.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from minigrad.errors import ShapeError
from minigrad.graph.ir import Node
from minigrad._tensor import Tensor, _wrap

__all__ = ["DynamicDim", "difference", "grown_inputs", "resolve_dynamic_axes", "symbolic_dims"]

DynamicDim = tuple[str, int, int]  # (symbol, k, c): the dim is k * symbol + c


def resolve_dynamic_axes(dynamic_axes: Mapping[str, Mapping[int, str] | Sequence[int]], in_names: Sequence[str],
                         out_names: Sequence[str], inputs: Sequence[Tensor]) -> tuple[list[dict[int, str]], dict]:
    """``dynamic_axes`` as ``torch.onnx.export`` takes it (``{"x": {0: "batch"}}``, or a list of
    axes, named ``x_dim0``...) split into the symbols of each input's axes and those of the outputs."""
    per_input: list[dict[int, str]] = [{} for _ in inputs]
    outputs: dict[str, dict[int, str]] = {}
    for name, axes in dynamic_axes.items():
        axes = dict(axes) if isinstance(axes, Mapping) else {a: f"{name}_dim{a}" for a in axes}
        if name in out_names:
            outputs[name] = axes
            continue
        if name not in in_names:
            raise ValueError(f"export_onnx: dynamic_axes names {name!r}, which is neither an input {list(in_names)} "
                             f"nor an output {list(out_names)}")
        i = list(in_names).index(name)
        ndim = len(inputs[i].shape)
        for axis, symbol in axes.items():
            if not -ndim <= axis < ndim:
                raise ShapeError(f"export_onnx: dynamic axis {axis} of input {name!r} is out of range for its "
                                 f"shape {tuple(inputs[i].shape)}")
            per_input[i][axis % ndim] = str(symbol)
    return per_input, outputs


def grown_inputs(inputs: Sequence[Tensor], axes: Sequence[dict[int, str]], symbol: str) -> list[Tensor]:
    """The example inputs with every axis named ``symbol`` one longer (its first slice repeated)."""
    grown = []
    for x, named in zip(inputs, axes):
        a = x.array
        for axis in (ax for ax, s in named.items() if s == symbol):
            a = x.device.xp.concatenate([a, a.take([0], axis=axis)], axis=axis)
        grown.append(_wrap(a, x.device) if a is not x.array else x)
    return grown


def symbolic_dims(base: list[Node], grown: Mapping[str, list[Node]],
                  sizes: Mapping[str, int]) -> list[dict[int, DynamicDim]]:
    """For each node of ``base`` (in topological order), the dims that follow a symbol: compared
    with the same node of the graph traced with that symbol one larger (``grown``)."""
    dims: list[dict[int, DynamicDim]] = [{} for _ in base]
    for symbol, nodes in grown.items():
        if len(nodes) != len(base) or any(a.op != b.op for a, b in zip(base, nodes)):
            raise ShapeError(f"export_onnx: the traced graph changes when {symbol} changes (Python control flow "
                             "reads the shape), so no single ONNX graph computes it")
        for i, (a, b) in enumerate(zip(base, nodes)):
            for axis, (da, db) in enumerate(zip(a.shape or (), b.shape or ())):
                if da == db:
                    continue
                if axis in dims[i]:
                    raise ShapeError(f"export_onnx: dim {axis} of {a.name} depends on both {dims[i][axis][0]} and "
                                     f"{symbol}; ONNX export supports one symbol per dim")
                k = db - da
                dims[i][axis] = (symbol, k, da - k * sizes[symbol])
    return dims


def difference(a: Any, b: Any) -> str | None:
    """What differs between two ONNX graphs built from two traces, or None if they are the same."""
    inits_b = {t.name: t for t in b.initializer}
    for t in a.initializer:
        other = inits_b.get(t.name)
        if other is None or other.SerializeToString() != t.SerializeToString():
            user = next((f", read by {n.op_type} ({n.name})" for n in a.node if t.name in n.input), "")
            return f"the constant {t.name} (shape {list(t.dims)}{user}) depends on it"
    if len(a.node) != len(b.node):
        return "the graph has a different number of ops"
    for na, nb in zip(a.node, b.node):
        if na.SerializeToString() != nb.SerializeToString():
            return f"the ONNX node {na.name} ({na.op_type}) has arguments that depend on it"
    return None
