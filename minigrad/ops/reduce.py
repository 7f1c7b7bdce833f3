"""Reductions: sum, mean, prod, max/min, var/std, logsumexp, cumsum, and ``sum_to``.

A reduction's backward spreads the incoming gradient back over the reduced axes (reshape it to
the keepdim shape, then broadcast it to the input's shape) and weights it by how much each input
element contributed: 1 for sum, 1/n for mean, the product of the others for prod, an even share
of the ties for max. ``sum_to``, the inverse of broadcasting, is what the engine uses to undo
broadcasting in every op (chapter 02).

The functions that torch calls ``sum``, ``max``, ``min``, ``all`` and ``any`` are named
``reduce_sum``... here, and ``minigrad.ops`` gives them their public names: in this module, where
students write backward rules, ``sum``, ``max`` and ``any`` stay Python's builtins.
"""

from __future__ import annotations

import builtins
from typing import NamedTuple

from minigrad import backend
from minigrad.errors import DeviceError, DimensionError, DTypeError, ShapeError
from minigrad.ops.elementwise import Op, _floating, _not_bool, cast, exp, maximum, minimum, sqrt, where
from minigrad.ops.op import GRADIENT_OP
from minigrad.ops.movement import BroadcastTo, Reshape, broadcast_to, reshape
from minigrad._tensor import Tensor, _dim, _wrap

# (reduce_sum, reduce_max, reduce_min, reduce_all and reduce_any are exported by minigrad.ops as
# sum, max, min, all and any)
__all__ = [
    "ValuesIndices", "allclose", "amax", "amin", "argmax", "argmin", "cumsum", "equal",
    "logsumexp", "mean", "prod", "std", "sum_to", "var",
]


def _dims(dim, ndim: int, op: str) -> tuple | None:
    """Normalise ``dim`` (None, an int or a sequence of ints) to a sorted tuple of axes. As in
    PyTorch, an empty sequence means every axis, and a 0-D tensor accepts dim 0 or -1."""
    if dim is None:
        return None
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    dims = tuple(sorted({_dim(d, ndim, op) for d in dims}))
    return dims if dims and ndim else None


def _axes(x: Tensor, dim, op: str) -> tuple | None:
    """``_dims`` for a tensor, naming its shape when a dim is out of range."""
    try:
        return _dims(dim, x.ndim, op)
    except DimensionError as e:
        raise DimensionError(f"{e} (input shape {tuple(x.shape)})") from None


def _keep_shape(shape: tuple, dims: tuple | None) -> tuple:
    """The shape a keepdim=True reduction over ``dims`` gives."""
    if dims is None:
        return (1,) * len(shape)
    return tuple(1 if i in dims else n for i, n in enumerate(shape))


def _count(shape: tuple, dims: tuple | None) -> int:
    """How many elements each output element of a reduction over ``dims`` combines."""
    n = 1
    for i, s in enumerate(shape):
        if dims is None or i in dims:
            n *= s
    return n


def _spread(g, ctx):
    """Undo a reduction's shape: the gradient reshaped to keepdim form and broadcast back to the
    input's shape (with ``ctx.ops``: arrays or Tensors, as the engine bound the rule)."""
    ops = ctx.ops
    if not ctx.keepdim:
        g = ops.apply(Reshape, g, _keep_shape(ctx.shape, ctx.dims))
    return ops.apply(BroadcastTo, g, ctx.shape)


def _acc_dtype(a):
    """Accumulate float16 in float32 and integers in int64, as PyTorch does."""
    if a.dtype.kind == "f":
        return "float32" if a.dtype.itemsize == 2 else None
    return "int64"


def _out(out, a):
    """Cast a float16 result accumulated in float32 back to the input's dtype."""
    return out.astype(a.dtype, copy=False) if a.dtype.kind == "f" else out


def _nonempty(x: Tensor, dims: tuple | None, op: str) -> None:
    """max, min and argmax have no identity, so they refuse an empty reduction as PyTorch does."""
    for i, n in enumerate(x.shape):
        if n == 0 and (dims is None or i in dims):
            raise ShapeError(
                f"{op}: cannot reduce over dim {i} of size 0 (input shape {tuple(x.shape)}); "
                "the reduction has no identity, pass a dim whose size is not zero"
            )


# -- sums and products --------------------------------------------------------------------------
class Sum(Op):
    kind = "reduction"
    batch = "dims"
    by_rows = True
    cuda_reduce = ("a + b", "0", "y = a")
    c_reduce = ("{a} + {x}", "0", "{a}")
    autocast = "fp32"

    @staticmethod
    def onnx(b, node, a, dims, keepdim): return b.reduce("ReduceSum", a, dims, keepdim)

    @staticmethod
    def forward(ctx, a, dims, keepdim):
        ctx.shape, ctx.dims, ctx.keepdim = a.shape, dims, keepdim
        return _out(a.sum(axis=dims, keepdims=keepdim, dtype=_acc_dtype(a)), a)

    @staticmethod
    def backward(ctx, g):
        """Each input element contributed once: spread ``g`` back over the reduced axes
        (``_spread(g, ctx)``: reshape to the keepdim shape, broadcast to ``ctx.shape``). Forward set
        ``ctx.shape``, ``ctx.dims`` (``None``: all axes) and ``ctx.keepdim``. ``dims`` and ``keepdim``
        get ``None``. The contract of every rule: ``minigrad.autograd.Function.backward``.
        """
        ### BEGIN SOLUTION chapter 02: Sum.backward
        return _spread(g, ctx), None, None
        ### END SOLUTION


class SumTo(Op):
    kind = "reduction"
    batch = "shape"
    onnx_refused = GRADIENT_OP

    @staticmethod
    def forward(ctx, a, shape):
        """The array ``a`` summed down to ``shape``, which broadcasts to a's shape (``sum_to``
        checked it): sum over every axis broadcasting added or stretched, in one
        ``a.sum(axis=axes, keepdims=True)`` call (one reduction, so the result's rounding is
        numpy's), then reshape to ``shape``."""
        ctx.shape = a.shape
        ### BEGIN SOLUTION chapter 02: undoing broadcasting: the sum
        lead = a.ndim - len(shape)
        axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape) if n == 1 and a.shape[lead + i] != 1)
        out = a.sum(axis=axes, keepdims=True) if axes else a
        return out.reshape(shape)
        ### END SOLUTION

    @staticmethod
    def backward(ctx, g): return ctx.ops.apply(BroadcastTo, g, ctx.shape), None


class Mean(Op):
    kind = "reduction"
    batch = "dims"
    by_rows = True
    cpu = "mean({0}, axis={1}, keepdims={2}, out={o})"  # inside a kernel by rows
    cuda_reduce = ("a + b", "0", "y = a / ({T})(_in_ind.size() / _out_ind.size())")
    c_reduce = ("{a} + {x}", "0", "{a} / {n}")
    autocast = "fp32"

    @staticmethod
    def onnx(b, node, a, dims, keepdim): return b.reduce("ReduceMean", a, dims, keepdim)

    @staticmethod
    def forward(ctx, a, dims, keepdim):
        ctx.shape, ctx.dims, ctx.keepdim = a.shape, dims, keepdim
        return a.mean(axis=dims, keepdims=keepdim)  # numpy accumulates float16 in float32 here

    @staticmethod
    def backward(ctx, g):
        """As ``Sum.backward``, each element weighted by 1/n, n the number of elements each output
        averaged (``_count(ctx.shape, ctx.dims)``; an empty reduction must not divide by zero). The contract of every rule: ``minigrad.autograd.Function.backward``.
        """
        ### BEGIN SOLUTION chapter 02: Mean.backward
        return _spread(g, ctx) * (1 / builtins.max(_count(ctx.shape, ctx.dims), 1)), None, None
        ### END SOLUTION


class Prod(Op):
    kind = "reduction"
    batch = "dims"
    by_rows = True
    autocast = "fp32"

    @staticmethod
    def onnx(b, node, a, dims, keepdim): return b.reduce("ReduceProd", a, dims, keepdim)

    @staticmethod
    def forward(ctx, a, dims, keepdim):
        ctx.shape, ctx.dims, ctx.keepdim = a.shape, dims, keepdim
        if ctx.needs_input_grad[0]:
            ctx.save_for_backward(a)
        return _out(a.prod(axis=dims, keepdims=keepdim, dtype=_acc_dtype(a)), a)

    @staticmethod
    def backward(ctx, g):
        (a,) = ctx.saved_tensors
        return _spread(g, ctx) * _prod_of_others(ctx.ops, a, ctx.dims), None, None


def _prod_of_others(ops, x, dims: tuple | None):
    """d prod(x) / dx_i = the product of every other element. ``prod / x_i`` is that only when no
    element is zero. With one zero, the zero's slot gets the product p of the nonzero rest and
    every other slot gets 0; with two, only the zeros' slots are nonzero in their derivative; with
    more, all is zero. Each zero is written as ``zsum`` (the sum of the zero elements, a
    differentiable 0) so that second derivatives come out right too."""
    where = ops.where
    zero = x == 0
    nonzero = where(zero, 1.0, x)
    p = ops.apply(Prod, nonzero, dims, True)
    zeros = ops.apply(Sum, zero, dims, True)
    zsum = ops.apply(Sum, where(zero, x, 0.0), dims, True)
    one = where(zero, p, zsum * p / nonzero)
    two = where(zero, (zsum - x) * p, 0.0)
    return where(zeros == 0, p / nonzero, where(zeros == 1, one, where(zeros == 2, two, 0.0)))


class Cumsum(Op):
    kind = "reduction"
    batch = "dim"
    onnx_refused = "no emitter written yet: ONNX CumSum"
    by_rows = True
    autocast = "fp32"

    @staticmethod
    def forward(ctx, a, dim):
        ctx.dim = dim
        return _out(a.cumsum(axis=dim, dtype=_acc_dtype(a)), a).reshape(a.shape)

    @staticmethod
    def backward(ctx, g):
        # the reversed cumulative sum, sum(g) - cumsum(g) + g, keeps to ops that have a backward
        return ctx.ops.sum(g, ctx.dim, keepdim=True) - ctx.ops.apply(Cumsum, g, ctx.dim) + g, None


def reduce_sum(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    """``minigrad.sum``: sum over ``dim`` (None: every axis). Integer and bool tensors sum to int64, as in PyTorch."""
    return Sum.apply(x, _axes(x, dim, "sum"), keepdim)


def sum_to(x: Tensor, shape: tuple) -> Tensor:
    """Sum ``x`` down to ``shape`` (the shape it was broadcast from).

    ``shape`` may be any sequence of ints. Return ``x`` itself when the shapes are equal. Else
    ``shape`` must broadcast to x's shape, by numpy's rule read from the right: fewer or equally
    many axes, each axis of ``shape`` 1 or equal to x's. Otherwise raise ``ShapeError`` naming
    both shapes. The sum itself is the ``SumTo`` op, whose backward broadcasts back.
    """
    ### BEGIN SOLUTION chapter 02: undoing broadcasting
    shape = tuple(shape)
    if x.shape == shape:
        return x
    lead = x.ndim - len(shape)
    if lead < 0 or builtins.any(n != 1 and n != m for n, m in zip(shape, x.shape[lead:])):
        raise ShapeError(f"sum_to: cannot sum a tensor of shape {tuple(x.shape)} to shape {shape}")
    return SumTo.apply(x, shape)
    ### END SOLUTION


def mean(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    _need_float(x, "mean")
    return Mean.apply(x, _axes(x, dim, "mean"), keepdim)


def prod(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    """The product over ``dim``; its gradient is exact even where inputs are zero."""
    return Prod.apply(x, _axes(x, dim, "prod"), keepdim)


def cumsum(x: Tensor, dim: int) -> Tensor:
    """Running sum along ``dim``; integers accumulate in int64, as in PyTorch."""
    _single_dim(dim, "cumsum")
    axes = _axes(x, dim, "cumsum")
    return Cumsum.apply(x, axes[0] if axes else None)


def _single_dim(dim, op: str) -> None:
    if not isinstance(dim, int):
        raise TypeError(f"{op}: dim must be an int, got {dim!r}")


def _need_float(x: Tensor, op: str) -> None:
    if x.dtype.kind != "f":
        raise DTypeError(
            f"{op}: expected a floating point tensor, got dtype {x.dtype}; convert it first, e.g. x.float()"
        )


# -- max and min -----------------------------------------------------------------------------------
class ValuesIndices(NamedTuple):
    """What ``max(x, dim)`` and ``min(x, dim)`` return, as ``torch.return_types.max``."""

    values: Tensor
    indices: Tensor


class Amax(Op):
    """The largest element over ``dims``; ties share the gradient evenly, as in PyTorch."""

    kind = "reduction"
    batch = "dims"
    by_rows = True
    cuda_reduce = ("(a > b || a != a) ? a : b", "{lowest}", "y = a")
    c_reduce = ("({x} > {a} || {x} != {x}) ? {x} : {a}", "-INFINITY", "{a}")

    @staticmethod
    def onnx(b, node, a, dims, keepdim): return b.reduce("ReduceMax", a, dims, keepdim)

    pick = "max"

    @staticmethod
    def forward(ctx, a, dims, keepdim):
        ctx.shape, ctx.dims, ctx.keepdim = a.shape, dims, keepdim
        out = getattr(a, ctx.pick)(axis=dims, keepdims=True)
        if ctx.needs_input_grad[0]:
            hit = a == out
            ctx.save_for_backward((hit / hit.sum(axis=dims, keepdims=True)).astype(a.dtype))
        return out if keepdim else out.reshape(_reduced_shape(a.shape, dims))

    @staticmethod
    def backward(ctx, g): return _spread(g, ctx) * ctx.saved_tensors[0], None, None


class Amin(Amax):
    cuda_reduce = ("(a < b || a != a) ? a : b", "{highest}", "y = a")
    c_reduce = ("({x} < {a} || {x} != {x}) ? {x} : {a}", "INFINITY", "{a}")

    @staticmethod
    def onnx(b, node, a, dims, keepdim): return b.reduce("ReduceMin", a, dims, keepdim)

    pick = "min"


class MaxDim(Op):
    """The largest element along one dim and its index; the gradient goes to that index."""

    kind = "reduction"
    batch = "dim"
    onnx_refused = "no emitter written yet: ReduceMax / ReduceMin and ArgMax / ArgMin for its two outputs"

    pick = "argmax"

    @staticmethod
    def forward(ctx, a, dim, keepdim):
        ctx.shape, ctx.dims, ctx.keepdim = a.shape, (dim,), keepdim
        index = getattr(ctx.xp, ctx.pick)(a, axis=dim, keepdims=True)
        values = ctx.xp.take_along_axis(a, index, axis=dim)
        ctx.save_for_backward(index)
        if not keepdim:
            values, index = values.squeeze(dim), index.squeeze(dim)
        return values, index.astype("int64", copy=False)

    @staticmethod
    def backward(ctx, g, _):
        """``max(x, dim)`` returns ``(values, indices)``; only ``values`` has a gradient (the second
        argument, the indices' gradient, is ignored). Forward saved the picked ``index`` (keepdim form)
        and set ``ctx.shape``, ``ctx.dims == (dim,)`` and ``ctx.keepdim``. The gradient is ``g`` at the
        picked position along ``dim`` and 0 elsewhere (a one-hot mask built from the index array, then
        ``where``); when not keepdim, ``g`` lacks the reduced axis. The contract of every rule: ``minigrad.autograd.Function.backward``.
        ``ctx.ops.data(index)`` is the saved index's array under either binding; ``ctx.ops.reshape``
        and ``ctx.ops.where`` work on arrays and on Tensors.
        """
        ### BEGIN SOLUTION chapter 02: MaxDim.backward
        (index,) = ctx.saved_tensors
        xp, dim = ctx.xp, ctx.dims[0]
        positions = xp.arange(ctx.shape[dim]).reshape((-1,) + (1,) * (len(ctx.shape) - dim - 1))
        hot = positions == ctx.ops.data(index)  # one-hot at the picked index: an array, a constant
        if not ctx.keepdim:
            g = ctx.ops.reshape(g, _keep_shape(ctx.shape, ctx.dims))
        return ctx.ops.where(hot, g, 0.0), None, None
        ### END SOLUTION


class MinDim(MaxDim):
    pick = "argmin"


class Argmax(Op):
    kind = "reduction"
    batch = "dim"
    onnx_refused = "no emitter written yet: ONNX ArgMax / ArgMin (flatten first when dim is None)"
    by_rows = True

    pick = "argmax"

    @staticmethod
    def forward(ctx, a, dim, keepdim):
        index = getattr(ctx.xp, ctx.pick)(a, axis=dim, keepdims=keepdim)
        if dim is None and keepdim:
            index = index.reshape((1,) * a.ndim)
        return index.astype("int64", copy=False)


class Argmin(Argmax):
    pick = "argmin"


def _reduced_shape(shape: tuple, dims: tuple | None) -> tuple:
    return () if dims is None else tuple(n for i, n in enumerate(shape) if i not in dims)


def _extreme(x: Tensor, dim, keepdim: bool, op: str, whole: type, along: type):
    if dim is None:
        _nonempty(x, None, op)
        return whole.apply(x, None, keepdim)
    if not isinstance(dim, int):
        raise TypeError(f"{op}: dim must be an int (use amax/amin for several dims), got {dim!r}")
    axes = _axes(x, dim, op)
    if x.ndim == 0:  # a 0-D tensor is its own maximum, at index 0
        values, indices = along.apply(reshape(x, (1,)), 0, False)
        return ValuesIndices(reshape(values, ()), reshape(indices, ()))
    _nonempty(x, axes, op)
    return ValuesIndices(*along.apply(x, axes[0], keepdim))


def reduce_max(x: Tensor, dim: int | Tensor | None = None, keepdim: bool = False):
    """``minigrad.max``. ``max(x)``: the largest element (0-D). ``max(x, dim)``: ``(values, indices)`` along dim.
    ``max(x, other)`` with a tensor ``other`` is ``maximum(x, other)``, as in PyTorch."""
    if isinstance(dim, Tensor):
        return maximum(x, dim)
    return _extreme(x, dim, keepdim, "max", Amax, MaxDim)


def reduce_min(x: Tensor, dim: int | Tensor | None = None, keepdim: bool = False):
    """``minigrad.min``. ``min(x)``: the smallest element (0-D). ``min(x, dim)``: ``(values, indices)`` along dim.
    ``min(x, other)`` with a tensor ``other`` is ``minimum(x, other)``, as in PyTorch."""
    if isinstance(dim, Tensor):
        return minimum(x, dim)
    return _extreme(x, dim, keepdim, "min", Amin, MinDim)


def amax(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    axes = _axes(x, dim, "amax")
    _nonempty(x, axes, "amax")
    return Amax.apply(x, axes, keepdim)


def amin(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    axes = _axes(x, dim, "amin")
    _nonempty(x, axes, "amin")
    return Amin.apply(x, axes, keepdim)


def _arg(cls: type, x: Tensor, dim: int | None, keepdim: bool, op: str) -> Tensor:
    _not_bool(x, op)
    if dim is not None:
        _single_dim(dim, op)
    axes = _axes(x, dim, op)
    _nonempty(x, axes, op)
    return cls.apply(x, axes[0] if axes else None, keepdim)


class All(Op):
    onnx_refused = "no emitter written yet: ONNX has no boolean reduction (Cast, ReduceMin, Cast)"
    batch = "dims"

    @staticmethod
    def forward(ctx, a, dims, keepdim): return ctx.xp.all(a, axis=dims, keepdims=keepdim)


class Any(Op):
    onnx_refused = "no emitter written yet: ONNX has no boolean reduction (Cast, ReduceMax, Cast)"
    batch = "dims"

    @staticmethod
    def forward(ctx, a, dims, keepdim): return ctx.xp.any(a, axis=dims, keepdims=keepdim)


def reduce_all(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    """``minigrad.all``: whether every element (along ``dim``) is nonzero: a bool tensor (uint8 for uint8, as in PyTorch)."""
    out = All.apply(x, _dims(dim, x.ndim, "all"), keepdim)
    return cast(out, x.dtype) if x.dtype == backend.uint8 else out


def reduce_any(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    """``minigrad.any``: whether some element (along ``dim``) is nonzero: a bool tensor (uint8 for uint8, as in PyTorch)."""
    out = Any.apply(x, _dims(dim, x.ndim, "any"), keepdim)
    return cast(out, x.dtype) if x.dtype == backend.uint8 else out


def equal(a: Tensor, b: Tensor) -> bool:
    """True when both have the same shape and the same elements (``torch.equal``)."""
    return a.shape == b.shape and bool(reduce_all(a == b))


def allclose(a: Tensor, b: Tensor, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False) -> bool:
    """``|a - b| <= atol + rtol * |b|`` everywhere (``torch.allclose``)."""
    if a.device is not b.device:
        raise DeviceError(f"allclose: tensors on different devices, {a.device} and {b.device}")
    if a.dtype != b.dtype:
        raise DTypeError(f"allclose: tensors of different dtypes, {a.dtype} and {b.dtype}")
    try:
        backend.numpy.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise ShapeError(f"allclose: shapes {tuple(a.shape)} and {tuple(b.shape)} do not broadcast") from None
    return bool(a.device.xp.allclose(a.array, b.array, rtol=rtol, atol=atol, equal_nan=equal_nan))


def argmax(x: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """Index of the largest element (of the flattened tensor when ``dim`` is None), as int64."""
    return _arg(Argmax, x, dim, keepdim, "argmax")


def argmin(x: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    return _arg(Argmin, x, dim, keepdim, "argmin")


# -- statistics ---------------------------------------------------------------------------------------
class Var(Op):
    kind = "reduction"
    batch = "dims"
    onnx_refused = "no emitter written yet: ReduceMean of the squared deviations, times n / (n - correction)"
    by_rows = True
    autocast = "fp32"

    @staticmethod
    def forward(ctx, a, dims, correction, keepdim):
        ctx.shape, ctx.dims, ctx.keepdim = a.shape, dims, keepdim
        dof = _count(a.shape, dims) - correction
        ctx.scale = 2 / dof if dof > 0 else float("nan")
        if ctx.needs_input_grad[0]:
            ctx.save_for_backward(a)
        out = a.var(axis=dims, ddof=correction, keepdims=keepdim, dtype=_acc_dtype(a))
        return out.astype(a.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        """d var / d a_i = 2 (a_i - mean) / (n - correction): forward saved ``a`` and set
        ``ctx.scale = 2 / (n - correction)`` (nan when that is not positive), with ``ctx.shape``,
        ``ctx.dims``, ``ctx.keepdim`` as for ``Sum``. Return ``None`` for dims, correction and keepdim.
        The contract of every rule: ``minigrad.autograd.Function.backward``.
        ``ctx.ops.mean(a, dims, keepdim=True)`` is the mean under either binding.
        """
        ### BEGIN SOLUTION chapter 02: Var.backward
        (a,) = ctx.saved_tensors
        centred = a - ctx.ops.mean(a, ctx.dims, keepdim=True)
        return _spread(g, ctx) * centred * ctx.scale, None, None, None
        ### END SOLUTION


def var(x: Tensor, dim=None, correction: float = 1, keepdim: bool = False) -> Tensor:
    """Variance with Bessel's ``correction`` (1: unbiased, 0: population), as ``torch.var``."""
    _need_float(x, "var")
    return Var.apply(x, _axes(x, dim, "var"), correction, keepdim)


def std(x: Tensor, dim=None, correction: float = 1, keepdim: bool = False) -> Tensor:
    _need_float(x, "std")
    return sqrt(Var.apply(x, _axes(x, dim, "std"), correction, keepdim))


class Logsumexp(Op):
    kind = "reduction"
    batch = "dims"
    by_rows = True
    autocast = "fp32"

    @staticmethod
    def onnx(b, node, a, dims, keepdim): return b.reduce("ReduceLogSumExp", a, dims, keepdim)

    @staticmethod
    def forward(ctx, a, dims, keepdim):
        xp = ctx.xp
        ctx.shape, ctx.dims, ctx.keepdim = a.shape, dims, keepdim
        m = a.max(axis=dims, keepdims=True) if a.size else xp.zeros(_keep_shape(a.shape, dims), a.dtype)
        m = xp.where(xp.isfinite(m), m, 0)  # all -inf stays -inf instead of becoming nan
        # shifting by the max keeps exp() <= 1, so logits of 1e4 do not overflow
        out = xp.log(xp.exp(a - m).sum(axis=dims, keepdims=True)) + m
        out = out if keepdim else out.reshape(_reduced_shape(a.shape, dims))
        ctx.save_for_backward(a, out)
        return out

    @staticmethod
    def backward(ctx, g):
        """d logsumexp(a) / d a = softmax(a) = exp(a - out). Forward saved ``(a, out)`` (``out``
        without the reduced axes unless keepdim) and set ``ctx.shape``, ``ctx.dims``, ``ctx.keepdim``.
        The contract of every rule: ``minigrad.autograd.Function.backward``.
        ``ctx.ops.reshape`` and ``ctx.ops.exp`` work on arrays and on Tensors.
        """
        ### BEGIN SOLUTION chapter 02: Logsumexp.backward
        a, out = ctx.saved_tensors
        if not ctx.keepdim:
            out = ctx.ops.reshape(out, _keep_shape(ctx.shape, ctx.dims))
        return _spread(g, ctx) * ctx.ops.exp(a - out), None, None
        ### END SOLUTION


def logsumexp(x: Tensor, dim, keepdim: bool = False) -> Tensor:
    """``log(sum(exp(x), dim))`` computed without overflow; its gradient is ``softmax(x, dim)``."""
    x = _floating(x, "logsumexp")
    return Logsumexp.apply(x, _axes(x, dim, "logsumexp"), keepdim)
