"""Normalisation as one op: ``Standardize``, the core of batch norm and layer norm (chapter 02).

``(x - mean) / sqrt(var + eps)`` composed from single ops records nine nodes and makes about
twice as many passes over the data; as one op it makes two, and its backward, written with
minigrad ops on its own outputs, still differentiates again. ``nn.functional.batch_norm`` and
``layer_norm`` call it; chapter 02's numerical-stability notebook explains the ``eps``. Batch
norm's training pass with a weight and a bias is ``BatchNorm``: Standardize and the affine map in
one op, whose backward shares the per-channel sums that the three would each make.
"""

from __future__ import annotations

from minigrad.autograd.binding import TENSOR_OPS, array_ops
from minigrad.autograd.engine import grad
from minigrad.autograd.grad_mode import enable_grad
from minigrad.backend import numpy
from minigrad.ops import c_loops
from minigrad.ops.elementwise import Rsqrt
from minigrad.ops.op import GRADIENT_OP, Op

__all__: list[str] = []  # no function of its own: nn.functional's batch_norm and layer_norm apply it


def _mean(x, dims: tuple):
    """``x.mean(axis=dims, keepdims=True)``. Over batch norm's dims (every one but the channels,
    dim 1) it is two reductions that each walk contiguous memory, the batch first: numpy's mean
    over (0, 2, 3) at once takes rows as short as one image's width, several times slower on the
    small images of a conv net's deeper layers."""
    if x.ndim < 3 or dims != (0,) + tuple(range(2, x.ndim)):
        return x.mean(axis=dims, keepdims=True)
    c = x.shape[1]
    return (x.sum(axis=0).reshape(c, -1).sum(axis=1) / (x.size // max(c, 1))).reshape((1, c) + (1,) * (x.ndim - 2))


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
        mean = _mean(x, dims)
        xhat = x - mean
        var = _mean(xp.square(xhat), dims)
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


class BatchNorm(Op):
    """Batch norm's training pass in one op: ``Standardize``'s ``xhat`` over ``dims`` (every dim but
    the channels, dim 1), then ``xhat * weight + bias`` per channel; it also returns the batch's
    mean and biased variance (keepdim shapes), which the running stats read.

    As three ops (Standardize, Mul, Add) the backward makes about a dozen passes over the
    activation; as ``BatchNormBackward``, nine in numpy or two in C. Weight and bias are constant
    along ``dims``, so their gradients, ``gw = sum g * xhat`` and ``gb = sum g``, are the sums
    Standardize's rule takes of ``g_xhat = g * weight`` (divided by weight):
    ``dx = g * weight * inv + c0 + xhat * c1`` with ``c0 = g_mean / n - weight * inv * gb / n`` and
    ``c1 = 2 g_var / (n inv) - weight * inv * gw / n``. It saves the input, as PyTorch's batch norm
    does, and recomputes ``xhat`` from it. Its forward is one C loop where one was built.
    """

    kind = "reduction"
    autocast = "fp32"
    onnx_refused = ("batch norm in training mode (a training graph); an eval-mode model exports its batch "
                    "norm as a per-channel scale and shift")

    @staticmethod
    def forward(ctx, x, weight, bias, dims, eps):
        fused = c_loops.batch_norm(x, weight, bias, eps) if dims == (0,) + tuple(range(2, x.ndim)) else None
        if fused is not None:  # one C loop, where one was built: three passes over x
            y, mean, var = fused
            ctx.dims, ctx.eps, ctx.n = dims, eps, x.size // max(mean.size, 1)
        else:
            xhat, mean, var = Standardize.forward(ctx, x, dims, eps)  # sets ctx.dims, ctx.eps, ctx.n
            y = xhat * weight.reshape(mean.shape)
            y += bias.reshape(mean.shape)
        ctx.save_for_backward(x, weight, mean, var)
        return y, mean, var

    @staticmethod
    def backward(ctx, g, g_mean, g_var):
        x, weight, mean, var = ctx.saved_tensors
        ops = ctx.ops
        gx, gw, gb = ops.apply(BatchNormBackward, g, g_mean, g_var, x, weight, mean, var, ctx.eps)
        return (gx if ctx.needs_input_grad[0] else None), ops.reshape(gw, weight.shape), ops.reshape(gb, weight.shape), \
            None, None


class BatchNormBackward(Op):
    """``BatchNorm``'s gradients as one op: ``(g, g_mean, g_var, x, weight, mean, var) -> (gx, gw, gb)``
    from the gradients reaching its three outputs (gw and gb in ``var``'s keepdim shape).

    Its numpy lines (``_batch_norm_grads``) make about nine passes over the activation; a C loop
    (``ops.c_loops``) makes two, one for the sums and one for ``gx``, where one was built. Both
    bindings of ``BatchNorm``'s rule apply this op, so their gradients stay the same bits.
    Differentiable again: the second derivatives are those of the numpy lines' formula, written
    on Tensors and differentiated by the engine."""

    kind = "reduction"
    autocast = "fp32"
    onnx_refused = GRADIENT_OP
    tensor_backward = True

    @staticmethod
    def forward(ctx, g, g_mean, g_var, x, weight, mean, var, eps):
        ctx.save_for_backward(g, g_mean, g_var, x, weight, mean, var)
        ctx.eps = eps
        fused = c_loops.batch_norm_backward(g, g_mean, g_var, x, weight, mean, var, eps)
        if fused is not None:
            return fused
        return _batch_norm_grads(array_ops(ctx.device), g, g_mean, g_var, x, weight, mean, var, eps)

    @staticmethod
    def backward(ctx, u_gx, u_gw, u_gb):
        wanted = [i for i, t in enumerate(ctx.saved_tensors) if t is not None and t.requires_grad]
        with enable_grad():
            # each input through an identity first: mean and var are functions of x, and the partial
            # derivatives wanted here are those at each input alone (the engine adds the paths)
            inputs = [t * 1 if i in wanted else t for i, t in enumerate(ctx.saved_tensors)]
            outputs = _batch_norm_grads(TENSOR_OPS, *inputs, ctx.eps)
        found = grad(outputs, [inputs[i] for i in wanted], (u_gx, u_gw, u_gb), create_graph=True, allow_unused=True)
        out = [None] * (len(inputs) + 1)  # and none for eps
        for i, gi in zip(wanted, found):
            out[i] = gi
        return tuple(out)


def _batch_norm_grads(ops, g, g_mean, g_var, x, weight, mean, var, eps: float) -> tuple:
    """``BatchNormBackward``'s formula with ``ops`` (either binding): see ``BatchNorm``."""
    n = ops.data(x).size // max(ops.data(mean).size, 1)
    inv = ops.apply(Rsqrt, var + eps)
    xhat = (x - mean) * inv
    scale = ops.reshape(weight, var.shape) * inv  # per channel
    gb = _channel_sum(ops, g, var.shape)
    gw = _channel_sum(ops, g * xhat, var.shape)
    c0 = g_mean / n - scale * gb / n
    c1 = g_var * 2 / (n * inv) - scale * gw / n
    return g * scale + c0 + xhat * c1, gw, gb


def _channel_sum(ops, t, shape: tuple):
    """``t`` (N, C, ...) summed over every dim but the channels, in ``shape`` (1, C, 1, ...): the
    batch first, then each channel's contiguous rest, as ``_mean`` does, with ``ops`` (either binding)."""
    per_channel = ops.sum(t, 0)
    if per_channel.ndim > 1:
        per_channel = ops.sum(per_channel, tuple(range(1, per_channel.ndim)))
    return ops.reshape(per_channel, shape)

