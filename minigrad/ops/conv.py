"""Convolution and pooling: im2col, one matrix product, and col2im for the way back (chapter 02).

A 2-D convolution slides a kernel over the image. ``_windows`` turns the padded image into a
strided *view* of every kernel-sized window (no data is copied and no Python loop visits a
pixel); copying that view into a matrix (im2col) makes the whole convolution one matrix
product. Its gradients are convolutions too: the weight gradient correlates the input with the
output gradient, and the input gradient is a transposed convolution, which multiplies by the
transposed weight and adds every window back to where it came from (col2im). ``Conv2d``,
``ConvTranspose2d`` and ``Conv2dWeight`` are the three faces of one trilinear form, so each one's
backward is written with the other two and gradients of gradients come for free. Pooling
(``ops/pool.py``) works on the same windows.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

from minigrad.autograd import mode  # autocast casts mixed dtypes itself
from minigrad.errors import DTypeError, ShapeError
from minigrad.backend import allocator as pool  # im2col's columns, the largest temporary of a conv step
from minigrad.ops.elementwise import Op
from minigrad.ops.op import GRADIENT_OP
from minigrad.ops import c_loops, conv_algorithms
from minigrad._tensor import Tensor

__all__ = ["conv2d", "conv1d", "conv_transpose1d", "conv_transpose2d"]

IntPair = int | Sequence[int]


class Geometry(NamedTuple):
    """How windows sit on an image: kernel size, stride, padding (top, bottom, left, right) and
    dilation, each per spatial axis."""

    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int, int, int]
    dilation: tuple[int, int]

    def out_size(self, h: int, w: int) -> tuple[int, int]:
        """Number of window positions along each axis of an ``h x w`` image."""
        (kh, kw), (sh, sw), (pt, pb, pl, pr), (dh, dw) = self
        return (h + pt + pb - dh * (kh - 1) - 1) // sh + 1, (w + pl + pr - dw * (kw - 1) - 1) // sw + 1


# -- array helpers: the only code that knows about strides -------------------------------------
def _pad(xp, x, g: Geometry, value: float = 0.0):
    """``x`` (N, C, H, W) with ``value`` around each H x W plane (``x`` itself if no padding)."""
    pt, pb, pl, pr = g.padding
    if not (pt or pb or pl or pr):
        return x
    n, c, h, w = x.shape
    out = xp.full((n, c, h + pt + pb, w + pl + pr), value, dtype=x.dtype)
    out[:, :, pt:pt + h, pl:pl + w] = x
    return out


def _offsets(g: Geometry, oh: int, ow: int):
    """For each kernel offset (u, v): the rows and columns of the padded image that the
    (OH, OW) windows read at that offset, as slices. Looping over these (9 for a 3x3 kernel)
    instead of over pixels keeps every operation a whole-array one."""
    (kh, kw), (sh, sw), (dh, dw) = g.kernel, g.stride, g.dilation
    for u in range(kh):
        for v in range(kw):
            yield u, v, slice(u * dh, u * dh + sh * (oh - 1) + 1, sh), slice(v * dw, v * dw + sw * (ow - 1) + 1, sw)


def _windows(xp, xpad, g: Geometry, oh: int, ow: int):
    """A view of every window of the padded ``xpad`` (N, C, Hp, Wp), shape (N, C, KH, KW, OH, OW):
    element [n, c, u, v, i, j] is ``xpad[n, c, i*sh + u*dh, j*sw + v*dw]``. ``as_strided`` only
    sets new strides, so nothing is copied and no loop visits a pixel; cupy has the same call."""
    s_n, s_c, s_h, s_w = xpad.strides
    (sh, sw), (dh, dw) = g.stride, g.dilation
    return xp.lib.stride_tricks.as_strided(
        xpad, (*xpad.shape[:2], *g.kernel, oh, ow), (s_n, s_c, s_h * dh, s_w * dw, s_h * sh, s_w * sw)
    )


def _im2col(xp, x, g: Geometry, groups: int):
    """Every window of ``x`` (N, C, H, W) as a column: a (groups, C/groups*KH*KW, N*OH*OW) matrix.
    One copy of the window view lays it out for a single big matrix product, whose result
    (O, N, OH, OW) is one cheap transpose away from (N, O, OH, OW)."""
    oh, ow = g.out_size(*x.shape[2:])
    win = _windows(xp, _pad(xp, x, g), g, oh, ow).transpose(1, 2, 3, 0, 4, 5)  # (C, KH, KW, N, OH, OW)
    c, kh, kw = win.shape[:3]
    return pool.ascontiguousarray(xp, win).reshape(groups, c // groups * kh * kw, x.shape[0] * oh * ow)


def _conv_columns(xp, x, g: Geometry, groups: int):
    """conv2d's im2col: ``_im2col``'s matrix, or, where that costs at most one column in sixteen more,
    its *wide* form (groups, C/groups*KH*KW, N*OH*WQ) with WQ = OW + (KW-1)*DW//SW >= OW columns a row.

    im2col copies rows of OW numbers read every SW-th pixel (numpy pays per row: a 4x4 kernel at
    stride 2 takes 65,536 rows of 16 for a 16-channel 32x32 batch of 16). Split the padded image
    by stride phase first, (C, SH, SW, N, HQ, WQ), phase (r, q) holding the pixels at rows r mod SH
    and columns q mod SW: then the window at kernel offset (u, v) is one *contiguous* run of OH*WQ
    numbers of phase ((u*DH) mod SH, (v*DW) mod SW) starting at row (u*DH)//SH, column (v*DW)//SW,
    if each of its rows runs on past column OW into the next row (wrapping). So im2col is KH*KW
    block copies. The WQ - OW wrapped columns are products nobody reads: conv2d crops them from
    its output, and the weight gradient multiplies them by zeros."""
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (pt, _, pl, _), (dh, dw) = g
    oh, ow = g.out_size(h, w)
    wq = ow + (kw - 1) * dw // sw
    if 16 * wq > 17 * ow:  # measured: one in eight more (a 4x4 kernel at stride 2, OW = 8) already loses
        return _im2col(xp, x, g, groups)
    hq = oh + (kh - 1) * dh // sh + 1  # the wrap of the last window's last row reads one row further
    phases = xp.zeros((c, sh, sw, n, hq, wq), dtype=x.dtype)
    for r in range(sh):
        for q in range(sw):
            first_row, first_col = (r - pt) % sh, (q - pl) % sw  # the first image pixel of phase (r, q)
            i, j = (first_row + pt) // sh, (first_col + pl) // sw  # where it sits in the phase
            rows, cols = min(len(range(first_row, h, sh)), hq - i), min(len(range(first_col, w, sw)), wq - j)
            if rows > 0 and cols > 0:
                phases[:, r, q, :, i:i + rows, j:j + cols] = x[:, :, first_row::sh, first_col::sw][
                    :, :, :rows, :cols].transpose(1, 0, 2, 3)
    flat = phases.reshape(c, sh, sw, n, hq * wq)
    out = pool.empty(xp, (c, kh, kw, n, oh * wq), x.dtype)
    for u in range(kh):
        for v in range(kw):
            start = (u * dh // sh) * wq + v * dw // sw
            out[:, u, v] = flat[:, u * dh % sh, v * dw % sw, :, start:start + oh * wq]
    return out.reshape(groups, c // groups * kh * kw, n * oh * wq)


def _col2im(xp, cols, g: Geometry, h: int, w: int):
    """The adjoint of im2col: add every window of ``cols`` (C, KH, KW, OH, OW, N) back to where it
    was taken from, giving (N, C, H, W). With stride s, output row ``i*s + u*d`` has phase
    ``u*d mod s``: the kernel offsets of one phase (4 of a 4x4 kernel at stride 2) land on the same
    rows and columns of the output, shifted by whole steps. So each phase is summed in a buffer of
    its own, where every add is a shifted block of rows of OW*N contiguous numbers (not a scatter
    into every s-th pixel), and the phases are interleaved into the output once; each output
    pixel receives its windows in the same order as a scatter would add them (and as the C loop
    that replaces these lines where one was built)."""
    out = c_loops.col2im(cols, g, h, w)
    if out is not None:
        return out
    c, kh, kw, oh, ow, n = cols.shape
    (sh, sw), (dh, dw) = g.stride, g.dilation
    pt, pb, pl, pr = g.padding
    hp, wp = h + pt + pb, w + pl + pr  # the padded output, which the windows cover
    out = xp.empty((n, c, h, w), dtype=cols.dtype)
    for r in range(sh):
        first_row = (r - pt) % sh  # the first unpadded output row of phase r
        rows = len(range(first_row, h, sh))
        for q in range(sw):
            first_col = (q - pl) % sw
            columns = len(range(first_col, w, sw))
            if not rows or not columns:
                continue
            phase = xp.zeros((c, len(range(r, hp, sh)), len(range(q, wp, sw)), n), dtype=cols.dtype)
            for u in range(kh):
                for v in range(kw):
                    if u * dh % sh == r and v * dw % sw == q:
                        a, b = u * dh // sh, v * dw // sw
                        phase[:, a:a + oh, b:b + ow] += cols[:, u, v]
            i, j = (first_row + pt - r) // sh, (first_col + pl - q) // sw  # the padding cropped off
            out[:, :, first_row::sh, first_col::sw] = phase[:, i:i + rows, j:j + columns].transpose(3, 0, 1, 2)
    return out


def _channels_first(y, groups: int):
    """(N, C, H, W) -> (groups, C/groups, N*H*W): the layout of im2col's columns."""
    n, c, h, w = y.shape
    return y.transpose(1, 0, 2, 3).reshape(groups, c // groups, n * h * w)


# -- convolution: three Functions, each the gradient of the other two ----------------------------
class Conv2d(Op):
    """y[n, o] = sum over c, u, v of w[o, c, u, v] * x[n, c, window]; one matmul over im2col."""

    kind = "matmul"
    batch = "fold"
    epilogue = True
    channel_axis = 1
    autocast = "low"

    @staticmethod
    def onnx(b, node, x, w, bias, g, groups):
        return b.add("Conv", [x, w] + ([bias] if bias is not None else []), group=groups, **b.window(g))

    @staticmethod
    def forward(ctx, x, w, b, g, groups):
        need_x, need_w = ctx.needs_input_grad[:2]
        # im2col, or with minigrad.backends.autotune the algorithm timed fastest for this shape
        y, cols = conv_algorithms.conv2d(ctx.xp, x, w, b, g, groups, need_w, _conv_columns)
        # keeping the columns for the weight gradient trades memory for a second im2col
        ctx.save_for_backward(x if need_w else None, w if need_x else None, cols if need_w else None)
        ctx.geometry, ctx.groups, ctx.hw, ctx.kernel = g, groups, x.shape[2:], w.shape[2:]
        return y

    @staticmethod
    def backward(ctx, gy):
        x, w, cols = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        gx = ctx.ops.apply(ConvTranspose2d, gy, w, ctx.geometry, ctx.groups, ctx.hw) if need_x else None
        gw = ctx.ops.apply(Conv2dWeight, x, gy, ctx.geometry, ctx.groups, ctx.kernel, ctx.ops.data(cols)) if need_w else None
        gb = ctx.ops.sum(gy, (0, 2, 3)) if need_b else None
        return gx, gw, gb, None, None


class ConvTranspose2d(Op):
    """The input gradient of ``Conv2d``: multiply by the transposed weight, then col2im."""

    kind = "matmul"
    batch = "fold"
    onnx_refused = "no emitter written yet: ONNX ConvTranspose, with pads and output_padding mapped"
    autocast = "low"

    @staticmethod
    def forward(ctx, y, w, g, groups, hw):
        need_y, need_w = ctx.needs_input_grad[:2]
        ctx.save_for_backward(y if need_w else None, w if need_y else None)
        ctx.geometry, ctx.groups, ctx.kernel = g, groups, w.shape[2:]
        n, o, oh, ow = y.shape
        c = w.shape[1] * groups
        wt = w.reshape(groups, o // groups, -1).transpose(0, 2, 1)
        cols = wt @ y.transpose(1, 2, 3, 0).reshape(groups, o // groups, oh * ow * n)  # batch last, for col2im
        return _col2im(ctx.xp, cols.reshape(c, *w.shape[2:], oh, ow, n), g, *hw)

    @staticmethod
    def backward(ctx, gx):
        y, w = ctx.saved_tensors
        need_y, need_w = ctx.needs_input_grad[:2]
        g, groups, ops = ctx.geometry, ctx.groups, ctx.ops
        if need_y and need_w:  # both read gx's windows: one op, one im2col
            return (*ops.apply(Conv2dAndWeight, gx, w, y, g, groups), None, None, None)
        gy = ops.apply(Conv2d, gx, w, None, g, groups) if need_y else None
        gw = ops.apply(Conv2dWeight, gx, y, g, groups, ctx.kernel) if need_w else None
        return gy, gw, None, None, None


class Conv2dAndWeight(Op):
    """``ConvTranspose2d``'s two gradients as one op: ``(Conv2d(x, w), Conv2dWeight(x, y))``. Both
    read the windows of x (the transposed convolution's output gradient, its largest image), so
    one im2col serves the two products, recorded (a traced step) or not."""

    kind = "matmul"
    onnx_refused = GRADIENT_OP
    autocast = "low"

    @staticmethod
    def forward(ctx, x, w, y, g, groups):
        ctx.save_for_backward(x, w, y)
        ctx.geometry, ctx.groups, ctx.hw, ctx.kernel = g, groups, x.shape[2:], w.shape[2:]
        out, cols = conv_algorithms.conv2d(ctx.xp, x, w, None, g, groups, True, _conv_columns)
        return out, _weight_gradient(ctx.xp, x, y, g, groups, w.shape[2:], cols)

    @staticmethod
    def backward(ctx, u, v):
        """Conv2d's rule for ``u`` and Conv2dWeight's for ``v``, added where both reach x."""
        x, w, y = ctx.saved_tensors
        need_x, need_w, need_y = ctx.needs_input_grad[:3]
        g, groups, ops = ctx.geometry, ctx.groups, ctx.ops
        gx = None
        if need_x:
            gx = ops.apply(ConvTranspose2d, u, w, g, groups, ctx.hw) + ops.apply(ConvTranspose2d, y, v, g, groups, ctx.hw)
        gw = ops.apply(Conv2dWeight, x, u, g, groups, ctx.kernel) if need_w else None
        gy = ops.apply(Conv2d, x, v, None, g, groups) if need_y else None
        return gx, gw, gy, None, None


class Conv2dWeight(Op):
    """The weight gradient of ``Conv2d``: correlate the input's windows with the output gradient."""

    kind = "matmul"
    onnx_refused = GRADIENT_OP
    autocast = "low"

    @staticmethod
    def forward(ctx, x, y, g, groups, kernel, cols=None):
        """``cols``: x's im2col (``_conv_columns``) when the caller already has it."""
        need_x, need_y = ctx.needs_input_grad[:2]
        ctx.save_for_backward(x if need_y else None, y if need_x else None)
        ctx.geometry, ctx.groups, ctx.hw = g, groups, x.shape[2:]
        if cols is None:
            cols = _conv_columns(ctx.xp, x, g, groups)
        return _weight_gradient(ctx.xp, x, y, g, groups, kernel, cols)

    @staticmethod
    def backward(ctx, gw):
        x, y = ctx.saved_tensors
        need_x, need_y = ctx.needs_input_grad[:2]
        gx = ctx.ops.apply(ConvTranspose2d, y, gw, ctx.geometry, ctx.groups, ctx.hw) if need_x else None
        gy = ctx.ops.apply(Conv2d, x, gw, None, ctx.geometry, ctx.groups) if need_y else None
        return gx, gy, None, None, None, None


def _weight_gradient(xp, x, y, g: Geometry, groups: int, kernel: tuple, cols):
    """Conv2dWeight's array forward: the output gradient ``y`` (N, O, OH, OW) times x's columns."""
    n, o, oh, ow = y.shape
    wq = cols.shape[2] // (n * oh) if n * oh else ow
    if wq == ow:
        gy = _channels_first(y, groups)
    else:  # wide columns: the gradient is zero at their wrapped columns
        gy = xp.zeros((o, n, oh, wq), dtype=y.dtype)
        gy[..., :ow] = y.transpose(1, 0, 2, 3)
        gy = gy.reshape(groups, o // groups, n * oh * wq)
    gw = gy @ cols.transpose(0, 2, 1)
    return gw.reshape(o, x.shape[1] // groups, *kernel)


# -- argument checking ---------------------------------------------------------------------------
def _pair(v: IntPair, name: str, op: str, low: int) -> tuple[int, int]:
    t = (v, v) if isinstance(v, int) else tuple(v)
    if len(t) == 1:
        t = t * 2
    if len(t) != 2 or not all(isinstance(a, int) and a >= low for a in t):
        raise ValueError(f"{op}: {name} must be an int >= {low} or a pair of them, got {v!r}")
    return t


def _check_image(x: Tensor, op: str) -> tuple[Tensor, bool]:
    """Accept (N, C, H, W) or unbatched (C, H, W) floating input; return it 4-D."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}: expected a Tensor input, got {type(x).__name__}")
    if x.ndim not in (3, 4):
        raise ShapeError(
            f"{op}: expected a 3-D (C, H, W) or 4-D (N, C, H, W) input, got shape {tuple(x.shape)}"
        )
    if x.dtype.kind != "f":
        raise DTypeError(f"{op}: expected a floating point input, got {x.dtype}")
    return (x.reshape((1,) + x.shape), True) if x.ndim == 3 else (x, False)


def _check_fits(op: str, x: Tensor, g: Geometry) -> None:
    if min(g.out_size(*x.shape[2:])) < 1:
        (kh, kw), (dh, dw), (pt, pb, pl, pr) = g.kernel, g.dilation, g.padding
        raise ShapeError(
            f"{op}: input of spatial size {tuple(x.shape[2:])} padded to "
            f"({x.shape[2] + pt + pb}, {x.shape[3] + pl + pr}) is smaller than the (dilated) kernel "
            f"size ({dh * (kh - 1) + 1}, {dw * (kw - 1) + 1})"
        )


def _conv_padding(padding, kernel, stride, dilation, op: str) -> tuple[int, int, int, int]:
    if padding == "valid":
        return (0, 0, 0, 0)
    if padding == "same":
        if stride != (1, 1):
            raise ValueError(f"{op}: padding='same' is not supported for strided convolutions, got stride {stride}")
        # an even total goes half each side; an odd one puts the extra row/column after, as torch
        th, tw = dilation[0] * (kernel[0] - 1), dilation[1] * (kernel[1] - 1)
        return (th // 2, th - th // 2, tw // 2, tw - tw // 2)
    if isinstance(padding, str):
        raise ValueError(f"{op}: padding must be 'valid', 'same', an int or a pair, got {padding!r}")
    ph, pw = _pair(padding, "padding", op, 0)
    return (ph, ph, pw, pw)


def _check_conv(op: str, x: Tensor, weight: Tensor, bias: Tensor | None, groups: int, in_dim: int) -> None:
    """``in_dim`` is the weight axis that must match the input's channels divided by groups."""
    if not isinstance(weight, Tensor) or weight.ndim != 4:
        raise ShapeError(f"{op}: expected a 4-D weight, got shape {tuple(getattr(weight, 'shape', ()))}")
    if (weight.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype)) and not mode.casts_inputs():
        got = f"{weight.dtype}" + (f" and bias {bias.dtype}" if bias is not None else "")
        raise DTypeError(f"{op}: input ({x.dtype}) and weight ({got}) must have the same dtype")
    if not isinstance(groups, int) or groups < 1:
        raise ValueError(f"{op}: groups must be a positive int, got {groups!r}")
    expected = weight.shape[in_dim] * groups if in_dim == 1 else weight.shape[0]
    if x.shape[1] != expected:
        raise ShapeError(
            f"{op}: expected input with {expected} channels (weight of shape {tuple(weight.shape)}, "
            f"groups={groups}), got input of shape {tuple(x.shape)} with {x.shape[1]} channels"
        )
    if weight.shape[0] % groups:
        raise ShapeError(f"{op}: the first dim of weight (shape {tuple(weight.shape)}) must be divisible by "
                         f"groups={groups}")
    out = weight.shape[0] if in_dim == 1 else weight.shape[1] * groups
    if bias is not None and tuple(bias.shape) != (out,):
        raise ShapeError(f"{op}: expected a bias of shape ({out},), got {tuple(bias.shape)}")


# -- the functions users call (torch.nn.functional's names and arguments) ---------------------------
def conv2d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: IntPair = 1,
           padding: IntPair | str = 0, dilation: IntPair = 1, groups: int = 1) -> Tensor:
    """2-D cross-correlation of ``input`` (N, C, H, W) with ``weight`` (O, C/groups, KH, KW)."""
    x, unbatched = _check_image(input, "conv2d")
    _check_conv("conv2d", x, weight, bias, groups, 1)
    k = tuple(weight.shape[2:])
    s, d = _pair(stride, "stride", "conv2d", 1), _pair(dilation, "dilation", "conv2d", 1)
    g = Geometry(k, s, _conv_padding(padding, k, s, d, "conv2d"), d)
    _check_fits("conv2d", x, g)
    y = Conv2d.apply(x, weight, bias, g, groups)
    return y.reshape(y.shape[1:]) if unbatched else y


def conv1d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: int = 1,
           padding: int | str = 0, dilation: int = 1, groups: int = 1) -> Tensor:
    """1-D convolution of (N, C, L) with (O, C/groups, K): conv2d over images of height 1."""
    for name, t, dims in (("input", input, (2, 3)), ("weight", weight, (3,))):
        if not isinstance(t, Tensor) or t.ndim not in dims:
            raise ShapeError(f"conv1d: expected a {' or '.join(f'{d}-D' for d in dims)} {name}, "
                             f"got shape {tuple(getattr(t, 'shape', ()))}")

    def row(v, fill):  # a 1-D argument as the (height, width) pair of a height-1 image
        return v if isinstance(v, str) else (fill, v if isinstance(v, int) else v[0])

    y = conv2d(input.unsqueeze(-2), weight.unsqueeze(-2), bias, row(stride, 1), row(padding, 0), row(dilation, 1),
               groups)
    return y.squeeze(-2)


def conv_transpose2d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: IntPair = 1,
                     padding: IntPair = 0, output_padding: IntPair = 0, groups: int = 1,
                     dilation: IntPair = 1) -> Tensor:
    """The transpose (adjoint) of conv2d: ``weight`` is (C_in, C_out/groups, KH, KW), as in torch."""
    x, unbatched = _check_image(input, "conv_transpose2d")
    _check_conv("conv_transpose2d", x, weight, bias, groups, 0)
    s, d = _pair(stride, "stride", "conv_transpose2d", 1), _pair(dilation, "dilation", "conv_transpose2d", 1)
    ph, pw = _pair(padding, "padding", "conv_transpose2d", 0)
    oph, opw = _pair(output_padding, "output_padding", "conv_transpose2d", 0)
    if oph >= max(s[0], d[0]) or opw >= max(s[1], d[1]):
        raise ValueError(f"conv_transpose2d: output_padding {(oph, opw)} must be smaller than stride {s} or "
                         f"dilation {d}")
    k = tuple(weight.shape[2:])
    hw = tuple((n - 1) * st - 2 * p + dl * (kk - 1) + op + 1
               for n, st, p, dl, kk, op in zip(x.shape[2:], s, (ph, pw), d, k, (oph, opw)))
    if min(hw) < 1:
        raise ShapeError(f"conv_transpose2d: input of shape {tuple(x.shape)} gives a non-positive output size {hw}")
    y = ConvTranspose2d.apply(x, weight, Geometry(k, s, (ph, ph, pw, pw), d), groups, hw)
    if bias is not None:
        y = y + bias.reshape(1, -1, 1, 1)
    return y.reshape(y.shape[1:]) if unbatched else y


def conv_transpose1d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: int = 1,
                     padding: int = 0, output_padding: int = 0, groups: int = 1, dilation: int = 1) -> Tensor:
    """The transpose of conv1d: (N, C_in, L) with ``weight`` (C_in, C_out/groups, K), as
    conv_transpose2d over images of height 1."""
    for name, t, dims in (("input", input, (2, 3)), ("weight", weight, (3,))):
        if not isinstance(t, Tensor) or t.ndim not in dims:
            raise ShapeError(f"conv_transpose1d: expected a {' or '.join(f'{d}-D' for d in dims)} {name}, "
                             f"got shape {tuple(getattr(t, 'shape', ()))}")

    def row(v, fill):  # a 1-D argument as the (height, width) pair of a height-1 image
        return (fill, v if isinstance(v, int) else v[0])

    y = conv_transpose2d(input.unsqueeze(-2), weight.unsqueeze(-2), bias, row(stride, 1), row(padding, 0),
                         row(output_padding, 0), groups, row(dilation, 1))
    return y.squeeze(-2)
