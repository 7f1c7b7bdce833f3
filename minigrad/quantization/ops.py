"""The quantized ops: fake quantization with a straight-through gradient, and int8 kernels (chapter 03).

``FakeQuant`` rounds a float tensor to its grid and back (``(clamp(round(x / s) + z) - z) * s``),
so training sees the rounding error; round has zero derivative almost everywhere, so its backward
passes the gradient straight through where the value was on the grid's range and stops it where it
was clamped (the straight-through estimator, as PyTorch defines it). ``Int8Linear`` and
``Int8Conv2d`` are the deployed kernels: the input is rounded to uint8, multiplied by int8
weights with int32 accumulation (an int32 bias added), and the sum is requantized to the output's
uint8 grid by one float multiplier per channel. The integer product runs in float32 BLAS where
that is provably exact (``int_matmul``), in int32 otherwise: the same integers either way. Values
between layers travel as floats on the grid, which is exactly the QuantizeLinear/DequantizeLinear
(QDQ) form each op's ``onnx`` emitter writes.
Every line computes on ``xp``, so the same kernels run on cuda through CuPy.
"""

from __future__ import annotations

from typing import Any

from minigrad.errors import ArgumentError
from minigrad.ops.conv import Geometry, _im2col
from minigrad.ops.op import Op
from minigrad.quantization.observer import check_finite, check_range
from minigrad._tensor import Tensor

__all__ = ["DynamicInt8Linear", "FakeQuant", "Int8Conv2d", "Int8Linear", "fake_quantize", "int_matmul", "quantize"]


def _along(v: Any, ndim: int, axis: int | None) -> Any:
    """``v`` shaped to broadcast along ``axis`` of an ``ndim``-D array (unchanged per tensor)."""
    if axis is None or v.ndim == 0:
        return v
    shape = [1] * ndim
    shape[axis] = -1
    return v.reshape(shape)


def quantize(xp: Any, x: Any, scale: Any, zero_point: Any, qmin: int, qmax: int, axis: int | None = None) -> Any:
    """``clamp(round(x / scale) + zero_point, qmin, qmax)`` in ``zero_point``'s integer dtype (ONNX's
    QuantizeLinear: divide, round half to even)."""
    s, z = _along(scale, x.ndim, axis), _along(zero_point, x.ndim, axis)
    return xp.clip(xp.rint(x / s) + z, qmin, qmax).astype(zero_point.dtype)


def _qdq(b: Any, x: str, scale: str, zero_point: str, axis: int | None = None) -> str:
    """QuantizeLinear then DequantizeLinear: ``x`` rounded to its grid, as ONNX writes it."""
    kw = {} if axis is None else {"axis": axis}
    return b.add("DequantizeLinear", [b.add("QuantizeLinear", [x, scale, zero_point], **kw), scale, zero_point], **kw)


class FakeQuant(Op):
    """``x`` rounded to the grid (``scale``, ``zero_point``, ``[qmin, qmax]``, per channel along
    ``axis``) and read back as a float; the gradient is the straight-through estimator."""

    kind = "other"  # per-channel scales broadcast along an axis the fused elementwise kernels do not know
    autocast = "fp32"

    @staticmethod
    def onnx(b, node, x, scale, zero_point, qmin, qmax, axis):
        return _qdq(b, x, scale, zero_point, axis)

    @staticmethod
    def forward(ctx, x, scale, zero_point, qmin, qmax, axis):
        xp = ctx.xp
        s, z = _along(scale, x.ndim, axis), _along(zero_point, x.ndim, axis).astype(x.dtype)
        q = xp.rint(x / s) + z
        ctx.save_for_backward((q >= qmin) & (q <= qmax))
        return ((xp.clip(q, qmin, qmax) - z) * s).astype(x.dtype)

    @staticmethod
    def backward(ctx, g):
        return g * ctx.saved_tensors[0], None, None, None, None, None


def fake_quantize(x: Tensor, scale: Any, zero_point: Any, qmin: int, qmax: int, axis: int | None = None) -> Tensor:
    """``FakeQuant`` with numbers or arrays for the grid (PyTorch: ``fake_quantize_per_tensor_affine``
    and ``fake_quantize_per_channel_affine``)."""
    xp = x.device.xp
    check_range("fake_quantize", qmin, qmax, strict=False)
    scale = xp.asarray(scale, dtype="float32")
    check_finite("fake_quantize", "scale", scale, xp)
    if not bool((scale > 0).all()):
        raise ArgumentError(f"fake_quantize: scale must be positive, got {scale.min().item()}")
    zero_point = xp.asarray(zero_point, dtype="uint8" if qmin >= 0 else "int8")
    return FakeQuant.apply(x, scale, zero_point, qmin, qmax, axis)


def _requantize(xp: Any, acc: Any, x_scale: Any, w_scale: Any, out_scale: Any, out_zp: Any, relu: bool,
                axis: int) -> Any:
    """int32 sums (output channels along ``axis``) -> the output grid -> floats on that grid; the
    multiplier ``s_x s_w / s_y`` is float32, as onnxruntime's requantization has it."""
    m = _along((x_scale * w_scale / out_scale).astype("float32"), acc.ndim, axis)
    lo = int(out_zp) if relu else 0  # a fused ReLU is the clamp at the output's zero
    q = xp.clip(xp.rint(acc.astype("float32") * m) + out_zp.astype("float32"), lo, 255)
    return ((q - out_zp.astype("float32")) * out_scale).astype("float32")


def int_matmul(a: Any, b: Any, bound: int) -> Any:
    """``a @ b`` of int32 arrays whose entrywise products are at most ``bound`` in magnitude, as int32.
    numpy has no BLAS kernel for integers, so where every partial sum provably fits float32's
    24-bit mantissa (``K * bound < 2^24``: K <= 1044 for uint8 inputs and 7-bit weights) the
    product runs in float32 BLAS, whose sums are then exact integers; otherwise in int32."""
    if a.shape[-1] * bound < 2 ** 24:
        return (a.astype("float32") @ b.astype("float32")).astype("int32")
    return a @ b


def _bound(w_q: Any) -> int:
    """The largest magnitude of one product: uint8 minus its zero point (at most 255) times a weight."""
    return 255 * int(abs(w_q.astype("int32")).max())


def _int_input(xp: Any, x: Any, x_scale: Any, x_zp: Any) -> Any:
    """The input on its uint8 grid, minus the zero point, as int32: the left factor of the product."""
    return quantize(xp, x, x_scale, x_zp, 0, 255).astype("int32") - x_zp.astype("int32")


class Int8Linear(Op):
    """``y = requantize((q(x) - z_x) @ w_q.T + b_q)``: uint8 x int8 products summed in int32."""

    kind = "matmul"
    autocast = "fp32"

    @staticmethod
    def onnx(b, node, x, w_q, w_scale, bias_q, x_scale, x_zp, out_scale, out_zp, relu):
        if len(node.inputs[0].shape) != 2:
            raise b.unsupported(f"Int8Linear ({node.name}) exports (N, features) inputs, got {node.inputs[0].shape}")
        w = b.add("DequantizeLinear", [w_q, w_scale], axis=0)
        bias = b.add("DequantizeLinear", [bias_q, b.add("Mul", [x_scale, w_scale])], axis=0)
        y = b.add("Gemm", [_qdq(b, x, x_scale, x_zp), w, bias], transB=1)
        return _qdq(b, b.add("Relu", [y]) if relu else y, out_scale, out_zp)

    @staticmethod
    def forward(ctx, x, w_q, w_scale, bias_q, x_scale, x_zp, out_scale, out_zp, relu):
        xp = ctx.xp
        acc = int_matmul(_int_input(xp, x, x_scale, x_zp), w_q.astype("int32").T, _bound(w_q)) + bias_q
        return _requantize(xp, acc, x_scale, w_scale, out_scale, out_zp, relu, acc.ndim - 1)

    @staticmethod
    def backward(ctx, g):
        raise RuntimeError("Int8Linear: int8 inference kernels have no gradient; train with prepare_qat")


class Int8Conv2d(Op):
    """The convolution of ``ops/conv.py`` (im2col, one product) on uint8 columns and int8 filters."""

    kind = "matmul"
    autocast = "fp32"

    @staticmethod
    def onnx(b, node, x, w_q, w_scale, bias_q, x_scale, x_zp, out_scale, out_zp, relu, g, groups):
        w = b.add("DequantizeLinear", [w_q, w_scale], axis=0)
        bias = b.add("DequantizeLinear", [bias_q, b.add("Mul", [x_scale, w_scale])], axis=0)
        y = b.add("Conv", [_qdq(b, x, x_scale, x_zp), w, bias], group=groups, **b.window(g))
        return _qdq(b, b.add("Relu", [y]) if relu else y, out_scale, out_zp)

    @staticmethod
    def forward(ctx, x, w_q, w_scale, bias_q, x_scale, x_zp, out_scale, out_zp, relu, g: Geometry, groups):
        xp = ctx.xp
        cols = _im2col(xp, _int_input(xp, x, x_scale, x_zp), g, groups)  # zero padding: z_x - z_x = 0
        o = w_q.shape[0]
        acc = int_matmul(w_q.astype("int32").reshape(groups, o // groups, -1), cols, _bound(w_q))
        acc = acc.reshape(o, cols.shape[2])
        acc = (acc + bias_q.reshape(o, 1)).reshape(o, x.shape[0], *g.out_size(*x.shape[2:]))
        return xp.ascontiguousarray(_requantize(xp, acc, x_scale, w_scale, out_scale, out_zp, relu, 0)
                                    .transpose(1, 0, 2, 3))

    @staticmethod
    def backward(ctx, g):
        raise RuntimeError("Int8Conv2d: int8 inference kernels have no gradient; train with prepare_qat")


class DynamicInt8Linear(Op):
    """Dynamic quantization: the input's uint8 grid is chosen from each batch's own range at run
    time, so no calibration is needed; the int32 sums are read back as floats (no output grid)."""

    kind = "matmul"
    autocast = "fp32"
    onnx_refused = ("its input grid is chosen per batch at run time (ONNX DynamicQuantizeLinear + MatMulInteger "
                    "would express it; no emitter written yet): export a statically quantized model instead")

    @staticmethod
    def forward(ctx, x, w_q, w_scale, bias):
        xp = ctx.xp
        lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
        x_scale = xp.asarray(max((hi - lo) / 255, 1e-8), dtype="float32")
        x_zp = xp.asarray(min(max(round(-lo / float(x_scale)), 0), 255), dtype="uint8")
        acc = int_matmul(_int_input(xp, x, x_scale, x_zp), w_q.astype("int32").T, _bound(w_q))
        y = acc.astype("float32") * (x_scale * w_scale)
        return (y + bias if bias is not None else y).astype("float32")

    @staticmethod
    def backward(ctx, g):
        raise RuntimeError("DynamicInt8Linear: int8 inference kernels have no gradient")
