"""BatchNorm folding for inference: a conv (or linear layer) followed by BatchNorm is one conv (chapter 03).

In evaluation mode BatchNorm is an affine map per channel, ``y * s + t`` with
``s = weight / sqrt(running_var + eps)`` and ``t = bias - running_mean * s``; applied to a conv's
output ``y = W * x + b`` it gives ``(W * s) * x + (b * s + t)``: the same conv with each output
channel's filter scaled by ``s`` and a new bias. Folding removes a whole pass over the activations.

Two forms, as torch.fx's fuser has: ``minigrad.nn.fusion.fold_conv_bn(module)`` rewrites the
layers of a model in eval mode (Conv2d + BatchNorm2d, Linear + BatchNorm1d in ``Sequential``s)
with ``fold_weights``, and ``fold_batch_norm(graph)`` here finds the pattern in a traced graph,
where BatchNorm is the ops ``Mul(conv, scale)`` then ``Add(., shift)``, known by what their
classes declare (``affine``); run ``fold_constants(graph, freeze=True)`` first so the weights,
scale and shift are constants. The new weights are computed in float64.
"""

from __future__ import annotations

from typing import Any

from minigrad.backend import device_of
from minigrad.graph.ir import Graph, Node
from minigrad.graph.passes.rewrite import DROP, Rewriter, rewrite
from minigrad.graph.trace import ARRAY_ARG, TENSOR_ARG

__all__ = ["fold_batch_norm", "fold_weights"]


def fold_weights(w: Any, b: Any, scale: Any, shift: Any) -> tuple[Any, Any]:
    """``(w * scale, b * scale + shift)`` per output channel (dim 0 of w), in float64, cast to w's dtype."""
    s = scale.reshape((-1,) + (1,) * (w.ndim - 1))
    new_w = (w.astype("float64") * s).astype(w.dtype)
    new_b = (b.astype("float64") * scale if b is not None else scale * 0.0) + shift
    return new_w, new_b.astype(w.dtype)


def fold_batch_norm(graph: Graph) -> Graph:
    """A new graph in which ``Conv2d``/``Linear`` followed by a per-channel scale (and shift) by
    constants, such as ``Mul`` (and ``Add`` or ``Sub``), is one ``Conv2d``/``Linear`` with folded
    constant weights."""
    plans: dict[Node, tuple] = {}  # the last node of each pattern -> (layer, scale, shift)
    inside: set[Node] = set()  # the pattern's other nodes, which the folded layer replaces
    for node in graph.topological_order():
        found = _match(node)
        if found is not None:
            chain, scale, shift = found
            plans[chain[-1]] = (node, scale, shift)
            inside.update(chain[:-1])
            inside.add(node)

    def visit(node: Node, rw: Rewriter) -> object:
        if node in plans:
            return _fold(node, *plans[node], rw)
        return DROP if node in inside else None

    return rewrite(graph, visit)


# BatchNorm's two steps after the layer, as the ops declare their part in an affine map (``Op.affine``):
# a scale, then maybe a shift
_STEPS = (("scale",), ("shift", "negated_shift"))


def _match(layer: Node) -> tuple[list[Node], Any, Any] | None:
    """For a conv or linear node with constant weights that only a per-channel scale (then maybe
    a shift) by constants reads: (the scale and shift nodes, scale, shift)."""
    if _channel_axis(layer) is None or not all(i.op == "constant" for i in layer.inputs[1:]):
        return None
    chain, scale, shift = [], None, None
    for roles in _STEPS:
        last = chain[-1] if chain else layer
        users = last.users
        if len(users) != 1 or _affine(users[0]) not in roles:
            break
        user = users[0]
        value = _per_channel(user, last, layer)
        if value is None:
            break
        if _affine(user) == "scale":
            scale = value
        else:
            shift = -value if _affine(user) == "negated_shift" else value
        chain.append(user)
    if scale is None:
        return None
    return chain, scale, shift


def _per_channel(node: Node, x: Node, layer: Node) -> Any:
    """The other operand of binary ``node`` as a vector over ``layer``'s output channels, when it
    is a constant that varies along that axis only and ``node`` keeps x's shape and dtype."""
    if node.shape != x.shape or node.dtype != x.dtype or any(u.op == "saved" for u in node.users):
        return None
    it = iter(node.inputs)
    operands = [next(it) if k in (TENSOR_ARG, ARRAY_ARG) else node.attrs.get(k) for k in node.meta["args"]]
    if x not in operands or (_affine(node) == "negated_shift" and operands[0] is not x):
        return None
    other = operands[1] if operands[0] is x else operands[0]
    if isinstance(other, Node):
        if other.op != "constant":
            return None
        other = other.attrs["value"]
    elif not isinstance(other, (int, float)):
        return None
    xp = device_of(layer.inputs[1].attrs["value"]).xp
    value = xp.asarray(other, dtype="float64")
    channels, axis = x.shape[_channel_axis(layer)], _channel_axis(layer) % len(x.shape)
    full = (1,) * (len(x.shape) - value.ndim) + tuple(value.shape)
    if len(full) != len(x.shape) or any(n != 1 for i, n in enumerate(full) if i != axis):
        return None
    return xp.broadcast_to(value.reshape(-1), (channels,))


def _channel_axis(layer: Node) -> int | None:
    """The axis of a conv's or linear layer's output channels, as its op declares (None: another op)."""
    return getattr(layer.fn, "channel_axis", None)


def _affine(node: Node) -> str | None:
    """The node's part in an affine map, as its op declares (None: none, or a structural node)."""
    return getattr(node.fn, "affine", None)


def _fold(last: Node, layer: Node, scale: Any, shift: Any, rw: Rewriter) -> Node:
    """The folded layer node that stands for ``last``."""
    w_node = layer.inputs[1]
    w = w_node.attrs["value"]
    b = layer.inputs[2].attrs["value"] if len(layer.inputs) > 2 else None
    new_w, new_b = fold_weights(w, b, scale, shift if shift is not None else scale * 0.0)
    attrs = {k: v for k, v in layer.attrs.items() if k != "b"}
    args = tuple(TENSOR_ARG if k == "b" else k for k in layer.meta["args"])
    meta = dict(layer.meta, args=args, needs_input_grad=(False,) * len(args))
    inputs = [rw[layer.inputs[0]], rw.constant(new_w, w_node, name=f"{w_node.name}_folded"),
              rw.constant(new_b, w_node, name=f"{last.name}_bias")]
    return rw.copy(layer, inputs, attrs=attrs, meta=meta, name=last.name)
