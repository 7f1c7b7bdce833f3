"""Normalisation as one op: ``Standardize``, the core of batch norm and layer norm (chapter 02).

``(x - mean) / sqrt(var + eps)`` composed from single ops records nine nodes and makes about
twice as many passes over the data; as one op it makes two, and its backward, written with
minigrad ops on its own outputs, still differentiates again. ``nn.functional.batch_norm`` and
``layer_norm`` call it; chapter 02's numerical-stability notebook explains the ``eps``.
"""

from __future__ import annotations

from minigrad.backend import numpy
from minigrad.ops.elementwise import Rsqrt
from minigrad.ops.op import Op

__all__: list[str] = []  # no function of its own: nn.functional's batch_norm and layer_norm apply it


class Standardize(Op):
    """``(x - mean) / sqrt(var + eps)`` over ``dims``, also returning the mean and the biased
    variance (keepdim shapes): batch norm and layer norm in one fused op.

    Composed from single ops this records nine nodes and makes about twice as many passes over
    the data. The backward still uses only minigrad ops on the op's own outputs (``xhat`` and
    ``var``), so second derivatives flow. With ``inv = 1 / sqrt(var + eps)`` and ``n`` elements
    per group: ``dx = inv * g_xhat + c0 + xhat * c1``, where the per-group constants ``c0`` and
    ``c1`` gather the mean and variance terms (including gradients arriving at ``mean``/``var``).
    """

    kind = "reduction"
    batch = "dims"
    autocast = "fp32"

    @staticmethod
    def forward(ctx, x, dims, eps):
        xp = ctx.xp
        mean = x.mean(axis=dims, keepdims=True)
        xhat = x - mean
        var = xp.square(xhat).mean(axis=dims, keepdims=True)
        xhat *= 1 / xp.sqrt(var + eps)
        ctx.dims, ctx.eps, ctx.n = dims, eps, x.size // max(mean.size, 1)
        ctx.save_for_backward(xhat, var)
        return xhat, mean, var

    @staticmethod
    def backward(ctx, g_xhat, g_mean, g_var):
        xhat, var = ctx.saved_tensors
        dims, n = ctx.dims, ctx.n
        ops = ctx.ops
        inv = ops.apply(Rsqrt, var + ctx.eps)
        c0 = g_mean / n - inv * ops.mean(g_xhat, dims, keepdim=True)
        c1 = g_var * 2 / (n * inv) - inv * ops.mean(g_xhat * xhat, dims, keepdim=True)
        return g_xhat * inv + c0 + xhat * c1, None, None

    @staticmethod
    def onnx(b, node, x, dims, eps):
        """LayerNormalization (its scale of ones: the graph's own Mul and Add apply the affine part)
        when it normalises the trailing dims and only the result is read; else the formula."""
        shape, dtype = node.inputs[0].shape, node.inputs[0].dtype
        used = {u.attrs["index"] for u in node.users if u in b.live}
        if b.opset >= 17 and tuple(dims) == tuple(range(len(shape) - len(dims), len(shape))) and used <= {0}:
            ones = b.initializer(numpy.ones(shape[dims[0]:], dtype=dtype))
            return [b.add("LayerNormalization", [x, ones], axis=dims[0], epsilon=float(eps)), None, None]
        mean = b.reduce("ReduceMean", x, dims, True)
        d = b.add("Sub", [x, mean])
        var = b.reduce("ReduceMean", b.add("Mul", [d, d]), dims, True)
        return [b.add("Div", [d, b.add("Sqrt", [b.add("Add", [var, b.scalar(eps, dtype)])])]), mean, var]
