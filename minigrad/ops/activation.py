"""Activation functions and dropout: the elementwise nonlinearities of neural networks.

ReLU and its relatives pass the gradient through where the input was positive; GELU and erf use
an accurate erf (``special.erf``); softplus switches to the identity past ``threshold`` so it
never overflows. Dropout draws its mask inside forward, so a traced training step draws a fresh
mask on every replay (chapter 02 trains with these; chapter 03 fuses them).
"""

from __future__ import annotations

import math

from minigrad.ops import c_loops
from minigrad.ops.elementwise import Sigmoid, _floating, _not_bool, exp, sigmoid, tanh, where
from minigrad.ops.op import Op, same_value
from minigrad.ops.special import erf as _erf

__all__ = ["dropout", "erf", "gelu", "hardswish", "leaky_relu", "relu", "silu", "softplus"]


class Relu(Op):
    kind = "elementwise"
    cpu = "maximum({0}, 0, out={o})"
    cuda = "({0} > ({T})0 || {0} != {0}) ? {0} : ({T})0"
    onnx = "Relu"

    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a > 0)
        return ctx.xp.maximum(a, 0)

    @staticmethod
    def backward(ctx, g):
        """Forward saved the mask ``a > 0``: the gradient passes where it holds, 0 elsewhere
        (also at exactly 0, as PyTorch). The contract of every rule: ``minigrad.autograd.Function.backward``.
        """
        ### BEGIN SOLUTION chapter 02: Relu.backward
        return g * ctx.saved_tensors[0]
        ### END SOLUTION


class LeakyRelu(Op):
    kind = "elementwise"
    cuda = "{0} > ({T})0 ? {0} : ({T})({0} * {1})"

    @staticmethod
    def onnx(b, node, a, slope): return b.add("LeakyRelu", [a], alpha=float(slope))

    @staticmethod
    def forward(ctx, a, negative_slope):
        # the slope, 1 or negative_slope, made in a's dtype (not float64, then cast) is also the factor
        xp, one, slope = ctx.xp, a.dtype.type(1), a.dtype.type(negative_slope)
        fused = c_loops.leaky_relu(a, slope)  # both in one pass, where a C loop was built
        if fused is not None:
            ctx.save_for_backward(fused[1])
            return fused[0]
        if a.dtype.kind == "f" and 0 <= slope <= 1:
            # the same numbers as where(a > 0, 1, slope), whose scalar operands numpy broadcasts
            # with a zero stride and walks several times slower: max(1, slope) = 1, max(0, slope) = slope
            slope = xp.maximum((a > 0).astype(a.dtype), slope)
        else:
            slope = xp.where(a > 0, one, slope)
        ctx.save_for_backward(slope)
        return a * slope

    @staticmethod
    def backward(ctx, g): return g * ctx.saved_tensors[0], None


class Softplus(Op):
    kind = "elementwise"
    cuda = "{0} * {1} > {2} ? {0} : ({T})(log1p(exp({0} * {1})) / {1})"
    autocast = "fp32"

    @staticmethod
    def onnx(b, node, a, beta, threshold):
        ba = b.add("Mul", [a, b.scalar(beta, node.dtype)])
        soft = b.add("Div", [b.add("Softplus", [ba]), b.scalar(beta, node.dtype)])
        return b.add("Where", [b.add("Greater", [ba, b.scalar(threshold, node.dtype)]), a, soft])

    @staticmethod
    def forward(ctx, a, beta, threshold):
        ctx.save_for_backward(a)
        ctx.beta, ctx.threshold = beta, threshold
        xp = ctx.xp
        ba = a * beta
        soft = xp.logaddexp(0, ba) / beta  # log(1 + exp(ba)) without overflow
        return xp.where(ba > threshold, a, soft).astype(a.dtype)

    @staticmethod
    def backward(ctx, g):
        (a,) = ctx.saved_tensors
        ba = a * ctx.beta
        return g * ctx.ops.where(ba > ctx.threshold, 1.0, ctx.ops.apply(Sigmoid, ba)), None, None


class Dropout(Op):
    """Inverted dropout: keep each element with probability 1 - p and scale it by 1 / (1 - p).
    The mask is drawn inside forward, so a traced step draws a fresh one on every replay."""

    random = True
    onnx = staticmethod(same_value)  # an exported graph is for inference

    @staticmethod
    def forward(ctx, a, p):
        if p == 1.0:
            scale = ctx.xp.zeros(a.shape, a.dtype)
        else:
            keep = ctx.device.rng.random(a.shape, dtype="float32") >= p
            scale = keep.astype(a.dtype) * a.dtype.type(1.0 / (1.0 - p))
        ctx.save_for_backward(scale)
        return a * scale

    @staticmethod
    def backward(ctx, g): return g * ctx.saved_tensors[0], None


class Hardswish(Op):
    """``x * relu6(x + 3) / 6``: MobileNetV3's swish, made of a clip instead of a sigmoid."""

    kind = "elementwise"
    cpu = "add({0}, 3, out={o}); clip({o}, 0, 6, out={o}); multiply({0}, {o}, out={o}); divide({o}, 6, out={o})"
    cuda = "{0} * ({0} + ({T})3 < ({T})0 ? ({T})0 : {0} + ({T})3 > ({T})6 ? ({T})6 : ({T})({0} + ({T})3)) / ({T})6"

    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return a * ctx.xp.clip(a + 3, 0, 6) / 6

    @staticmethod
    def backward(ctx, g):
        (a,) = ctx.saved_tensors
        where = ctx.ops.where
        return g * where(a < -3, 0.0, where(a > 3, 1.0, (2 * a + 3) / 6))

    @staticmethod
    def onnx(b, node, a):  # HardSwish came in opset 14; HardSigmoid(x) = relu6(x + 3) / 6 is older
        if b.opset >= 14:
            return b.add("HardSwish", [a])
        return b.add("Mul", [a, b.add("HardSigmoid", [a], alpha=1 / 6, beta=0.5)])


def relu(x): return Relu.apply(_not_bool(x, "relu"))
def hardswish(x): return Hardswish.apply(x)
def leaky_relu(x, negative_slope=0.01): return LeakyRelu.apply(x, negative_slope)
def softplus(x, beta=1.0, threshold=20.0): return Softplus.apply(x, beta, threshold)
def silu(x): return x * sigmoid(x)
def dropout(x, p=0.5): return Dropout.apply(x, p)


def gelu(x, approximate: str = "none"):
    """GELU, exact (``x * Phi(x)``, composed from erf-free ops via tanh when ``approximate='tanh'``)."""
    if approximate == "tanh":
        return 0.5 * x * (1 + tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)))
    if approximate != "none":
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return Gelu.apply(x)


class Gelu(Op):
    kind = "elementwise"
    cuda = "({T})0.5 * {0} * (({T})1 + erf({0} * ({T})0.7071067811865476))"

    @staticmethod
    def onnx(b, node, a):
        if b.opset >= 20:
            return b.add("Gelu", [a])
        cdf = b.add("Add", [b.add("Erf", [b.add("Mul", [a, b.scalar(1 / math.sqrt(2), node.dtype)])]),
                            b.scalar(1.0, node.dtype)])
        return b.add("Mul", [b.add("Mul", [a, b.scalar(0.5, node.dtype)]), cdf])  # x * (1 + erf(x / sqrt 2)) / 2

    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return (0.5 * a * (1 + _erf(ctx.xp, a / math.sqrt(2)))).astype(a.dtype)

    @staticmethod
    def backward(ctx, g):
        (a,) = ctx.saved_tensors
        cdf = 0.5 * (1 + ctx.ops.apply(Erf, a / math.sqrt(2)))
        pdf = ctx.ops.exp(-0.5 * a * a) / math.sqrt(2 * math.pi)
        return g * (cdf + a * pdf)


class Erf(Op):
    kind = "elementwise"
    cuda = "erf({0})"
    onnx = "Erf"

    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return _erf(ctx.xp, a).astype(a.dtype)

    @staticmethod
    def backward(ctx, g):
        (a,) = ctx.saved_tensors
        return g * (2 / math.sqrt(math.pi)) * ctx.ops.exp(-a * a)


def erf(x): return Erf.apply(_floating(x, "erf"))


