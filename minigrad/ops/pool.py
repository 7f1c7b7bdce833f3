"""Pooling: max, average and adaptive average over the windows that convolution uses (chapter 02).

Pooling reads the same strided windows as ``conv.py``, one whole-array step per kernel offset (4
passes for a 2x2 pool, never a loop over pixels). Max pooling records which element of each
window won, and its backward sends the gradient there; average pooling sums each window and
spreads the gradient back; adaptive average pooling is a linear map on rows and columns.
"""

from __future__ import annotations

import math

from minigrad.errors import ShapeError
from minigrad.ops.conv import Geometry, IntPair, _check_image, _offsets, _pad, _pair, _windows
from minigrad.ops.elementwise import Op
from minigrad.ops.op import GRADIENT_OP
from minigrad.ops.layout import is_channels_last
from minigrad._tensor import Tensor

__all__ = ["adaptive_avg_pool2d", "avg_pool2d", "max_pool2d"]


def _zeros(xp, shape, dtype, channels_last: bool):
    """Zeros of (N, C, H, W) ``shape``, stored (N, H, W, C) when ``channels_last``."""
    if channels_last:
        n, c, h, w = shape
        return xp.zeros((n, h, w, c), dtype=dtype).transpose(0, 3, 1, 2)
    return xp.zeros(shape, dtype=dtype)


class MaxPool2d(Op):
    """The largest element of each window. The second output says which kernel offset it came
    from (0..KH*KW-1), so backward can route the gradient there and nowhere else."""

    kind = "reduction"
    batch = "fold"

    @staticmethod
    def onnx(b, node, x, g, out_hw): return [b.add("MaxPool", [x], **b.window(g)), None]

    @staticmethod
    def forward(ctx, x, g, out_hw):
        xp = ctx.xp
        n, c = x.shape[:2]
        # one contiguous copy, window offset first: then every step below is a fast whole-array op
        # (channels_last input: channels innermost, so the result is channels_last too, as in PyTorch)
        last = is_channels_last(x)
        win = _windows(xp, _pad(xp, x, g, -math.inf), g, *out_hw).transpose(
            (2, 3, 0, 4, 5, 1) if last else (2, 3, 0, 1, 4, 5))
        win = xp.ascontiguousarray(win).reshape(g.kernel[0] * g.kernel[1], *win.shape[2:])
        if last:
            win = win.transpose(0, 1, 4, 2, 3)
        y = win.max(axis=0)
        # the first offset holding the maximum, as torch picks (a NaN window points at offset 0)
        idx = xp.zeros(y.shape, dtype="int8" if len(win) < 128 else "int64")
        found = win[0] == y
        for k in range(1, len(win)):
            hit = (win[k] == y) & ~found
            idx += hit * idx.dtype.type(k)
            found |= hit
        ctx.save_for_backward(idx)
        ctx.geometry, ctx.hw = g, x.shape[2:]
        return y, idx

    @staticmethod
    def backward(ctx, gy, _):
        (idx,) = ctx.saved_tensors
        return ctx.ops.apply(WindowScatter, gy, ctx.ops.data(idx), ctx.geometry, ctx.hw), None, None


class WindowScatter(Op):
    """Send each value to the element ``idx`` of its window (overlapping windows add up)."""

    kind = "movement"
    onnx_refused = GRADIENT_OP

    @staticmethod
    def forward(ctx, y, idx, g, hw):
        ctx.save_for_backward(idx)
        ctx.geometry = g
        pt, pb, pl, pr = g.padding
        h, w = hw
        out = ctx.xp.zeros((*y.shape[:2], h + pt + pb, w + pl + pr), dtype=y.dtype)
        for k, (_, _, rows, cols) in enumerate(_offsets(g, *y.shape[2:])):
            out[:, :, rows, cols] += y * (idx == k)
        return ctx.xp.ascontiguousarray(out[:, :, pt:pt + h, pl:pl + w])

    @staticmethod
    def backward(ctx, gx):
        (idx,) = ctx.saved_tensors
        return ctx.ops.apply(WindowGather, gx, ctx.ops.data(idx), ctx.geometry), None, None, None


class WindowGather(Op):
    """The adjoint of ``WindowScatter``: out[n, c, i, j] = element ``idx`` of window (i, j)."""

    kind = "movement"
    onnx_refused = GRADIENT_OP

    @staticmethod
    def forward(ctx, x, idx, g):
        ctx.save_for_backward(idx)
        ctx.geometry, ctx.hw = g, x.shape[2:]
        xpad = _pad(ctx.xp, x, g)
        y = ctx.xp.zeros(idx.shape, dtype=x.dtype)
        for k, (_, _, rows, cols) in enumerate(_offsets(g, *idx.shape[2:])):
            y += xpad[:, :, rows, cols] * (idx == k)
        return y

    @staticmethod
    def backward(ctx, gy):
        (idx,) = ctx.saved_tensors
        return ctx.ops.apply(WindowScatter, gy, ctx.ops.data(idx), ctx.geometry, ctx.hw), None, None


class WindowSum(Op):
    """out[n, c, i, j] = the sum of window (i, j): average pooling before the division."""

    kind = "reduction"
    batch = "fold"

    @staticmethod
    def onnx(b, node, x, g, out_hw):
        # the sum of a window is its mean (padding counted) times its size; avg_pool2d has no dilation
        mean = b.add("AveragePool", [x], count_include_pad=1, **b.window(g, dilation=False))
        return b.add("Mul", [mean, b.scalar(g.kernel[0] * g.kernel[1], node.dtype)])

    @staticmethod
    def forward(ctx, x, g, out_hw):
        ctx.geometry, ctx.hw = g, x.shape[2:]
        xpad = _pad(ctx.xp, x, g)
        y = _zeros(ctx.xp, (*x.shape[:2], *out_hw), x.dtype, is_channels_last(x))
        for _, _, rows, cols in _offsets(g, *out_hw):
            y += xpad[:, :, rows, cols]
        return y

    @staticmethod
    def backward(ctx, gy):
        return ctx.ops.apply(WindowSpread, gy, ctx.geometry, ctx.hw), None, None


class WindowSpread(Op):
    """The adjoint of ``WindowSum``: add each value to every element of its window."""

    kind = "movement"
    onnx_refused = GRADIENT_OP

    @staticmethod
    def forward(ctx, y, g, hw):
        ctx.geometry, ctx.out_hw = g, y.shape[2:]
        pt, pb, pl, pr = g.padding
        h, w = hw
        out = ctx.xp.zeros((*y.shape[:2], h + pt + pb, w + pl + pr), dtype=y.dtype)
        for _, _, rows, cols in _offsets(g, *y.shape[2:]):
            out[:, :, rows, cols] += y
        return ctx.xp.ascontiguousarray(out[:, :, pt:pt + h, pl:pl + w])

    @staticmethod
    def backward(ctx, gx):
        return ctx.ops.apply(WindowSum, gx, ctx.geometry, ctx.out_hw), None, None


class RowColumnMap(Op):
    """out = A @ x @ B.T on every (H, W) plane, for constant matrices A and B: adaptive average
    pooling is this with averaging matrices. It is linear, so its backward is itself with the
    matrices transposed."""


    @staticmethod
    def onnx(b, node, x, rows, cols):  # rows @ x @ cols.T
        return b.add("MatMul", [b.add("MatMul", [rows, x]), b.add("Transpose", [cols], perm=[1, 0])])

    @staticmethod
    def forward(ctx, x, a, b):
        ctx.a, ctx.b = a, b
        return ctx.xp.einsum("ih,nchw,jw->ncij", a, x, b, optimize=True)

    @staticmethod
    def backward(ctx, gy):
        return ctx.ops.apply(RowColumnMap, gy, ctx.a.T, ctx.b.T), None, None



def _pool_size(n: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """torch's pooling output size: with ceil_mode the last window may hang over the edge, but
    must start inside the input or the leading padding."""
    out = (n + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= n + p:
        out -= 1
    return out


def _pool_geometry(op: str, x: Tensor, kernel_size, stride, padding, dilation, ceil_mode: bool):
    k = _pair(kernel_size, "kernel_size", op, 1)
    s = k if stride is None or (isinstance(stride, (tuple, list)) and not stride) else _pair(stride, "stride", op, 1)
    p, d = _pair(padding, "padding", op, 0), _pair(dilation, "dilation", op, 1)
    if p[0] > k[0] // 2 or p[1] > k[1] // 2:
        raise ValueError(f"{op}: padding should be at most half of the kernel size, got padding {p} for kernel {k}")
    out = tuple(_pool_size(n, *a, ceil_mode) for n, a in zip(x.shape[2:], zip(k, s, p, d)))
    if min(out) < 1:
        raise ShapeError(f"{op}: input of shape {tuple(x.shape)} is too small for kernel {k} (output size {out})")
    # pad after the image far enough for the last (ceil_mode) window
    after = [max(pi, (o - 1) * si + di * (ki - 1) + 1 - n - pi)
             for n, o, ki, si, pi, di in zip(x.shape[2:], out, k, s, p, d)]
    return Geometry(k, s, (p[0], after[0], p[1], after[1]), d), out


def max_pool2d(input: Tensor, kernel_size: IntPair, stride: IntPair | None = None, padding: IntPair = 0,
               dilation: IntPair = 1, ceil_mode: bool = False, return_indices: bool = False):
    """The maximum of each window; with ``return_indices`` also where it is (a flat index into
    each input plane, as torch returns)."""
    x, unbatched = _check_image(input, "max_pool2d")
    g, out = _pool_geometry("max_pool2d", x, kernel_size, stride, padding, dilation, ceil_mode)
    y, idx = MaxPool2d.apply(x, g, out)
    if return_indices:
        xp, w, (oh, ow) = x.device.xp, x.shape[3], out
        (kh, kw), (sh, sw), (pt, _, pl, _), (dh, dw) = g
        offset = idx.array.astype("int64")
        rows = xp.arange(oh).reshape(oh, 1) * sh + (offset // kw) * dh - pt
        cols = xp.arange(ow) * sw + (offset % kw) * dw - pl
        indices = Tensor(rows * w + cols, device=x.device)
    if unbatched:
        y = y.reshape(y.shape[1:])
        indices = indices.reshape(indices.shape[1:]) if return_indices else None
    return (y, indices) if return_indices else y


def avg_pool2d(input: Tensor, kernel_size: IntPair, stride: IntPair | None = None, padding: IntPair = 0,
               ceil_mode: bool = False, count_include_pad: bool = True, divisor_override: int | None = None) -> Tensor:
    """The mean of each window (padding counts as zeros unless ``count_include_pad=False``)."""
    x, unbatched = _check_image(input, "avg_pool2d")
    g, out = _pool_geometry("avg_pool2d", x, kernel_size, stride, padding, 1, ceil_mode)
    y = WindowSum.apply(x, g, out)
    if divisor_override:
        y = y * (1.0 / divisor_override)
    else:
        xp = x.device.xp
        # torch's divisor: the window clipped to the padded image, or to the image itself
        sizes = []
        for n, o, k, s, p in zip(x.shape[2:], out, g.kernel, g.stride, g.padding[::2]):
            start = xp.arange(o) * s - p
            end = xp.minimum(start + k, n + p)
            if not count_include_pad:
                start, end = xp.maximum(start, 0), xp.minimum(end, n)
            sizes.append(end - start)
        y = y * Tensor((1.0 / (sizes[0][:, None] * sizes[1][None, :])).astype(x.dtype), device=x.device)
    return y.reshape(y.shape[1:]) if unbatched else y


def adaptive_avg_pool2d(input: Tensor, output_size: IntPair) -> Tensor:
    """Average over a grid of ``output_size`` bins, bin i spanning rows floor(i*H/OH) to
    ceil((i+1)*H/OH), as torch does; ``None`` in ``output_size`` keeps that input size."""
    x, unbatched = _check_image(input, "adaptive_avg_pool2d")
    sizes = (output_size, output_size) if isinstance(output_size, int) or output_size is None else tuple(output_size)
    if len(sizes) == 1:
        sizes = sizes * 2
    sizes = tuple(n if o is None else o for o, n in zip(sizes, x.shape[2:]))
    if len(sizes) != 2 or not all(isinstance(o, int) and o >= 1 for o in sizes):
        raise ValueError(f"adaptive_avg_pool2d: output_size must be a positive int or pair, got {output_size!r}")
    xp = x.device.xp
    mats = []
    for n, o in zip(x.shape[2:], sizes):
        i = xp.arange(o)[:, None]
        start, end = (i * n) // o, -((-(i + 1) * n) // o)
        cols = xp.arange(n)[None, :]
        mats.append((((cols >= start) & (cols < end)) / (end - start)).astype(x.dtype))
    y = RowColumnMap.apply(x, *mats)
    return y.reshape(y.shape[1:]) if unbatched else y
