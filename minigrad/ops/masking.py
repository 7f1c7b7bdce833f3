"""Ops that keep some entries and drop the rest: ``tril``/``triu``, ``masked_fill``, ``topk``, and
the vector ``norm`` built on them by composition (chapter 02).

A triangle keeps the entries on one side of a diagonal and zeroes the others, so its gradient is
the same triangle of the output gradient (causal attention masks are built this way). ``masked_fill``
is ``where(mask, value, x)``; ``topk`` picks indices with a sort, which has no gradient, and then
gathers the values, so the gradient flows to the chosen entries through ``gather``'s backward.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Sequence

from minigrad.errors import DTypeError, ShapeError
from minigrad.ops.elementwise import Op, absolute as abs, cast, power as pow, where
from minigrad.ops.indexing import gather
from minigrad.ops.reduce import amax, amin, reduce_sum as sum
from minigrad._tensor import Tensor, _dim

__all__ = ["masked_fill", "norm", "topk", "tril", "triu"]


class Triangle(Op):
    """The lower (``upper=False``) or upper triangle of the last two dims, from ``diagonal`` on."""

    kind = "movement"
    batch = "rows"
    onnx_refused = "no emitter written yet: ONNX Trilu (opset 14), with upper and k mapped"

    @staticmethod
    def forward(ctx, a, diagonal, upper):
        ctx.diagonal, ctx.upper = diagonal, upper
        return (ctx.xp.triu if upper else ctx.xp.tril)(a, diagonal)

    @staticmethod
    def backward(ctx, g): return ctx.ops.apply(Triangle, g, ctx.diagonal, ctx.upper), None, None


def _triangle(x: Tensor, diagonal: int, upper: bool) -> Tensor:
    if x.ndim < 2:
        raise ShapeError(f"{'triu' if upper else 'tril'}: expected a tensor with at least 2 dims, got shape {tuple(x.shape)}")
    return Triangle.apply(x, int(diagonal), upper)


def tril(input: Tensor, diagonal: int = 0) -> Tensor:
    """Zero the entries above the ``diagonal``-th diagonal of the last two dims (0: the main one)."""
    return _triangle(input, diagonal, upper=False)


def triu(input: Tensor, diagonal: int = 0) -> Tensor:
    """Zero the entries below the ``diagonal``-th diagonal of the last two dims."""
    return _triangle(input, diagonal, upper=True)


def masked_fill(input: Tensor, mask: Tensor, value: Any) -> Tensor:
    """``value`` where the bool ``mask`` (broadcast to ``input``) is true, else ``input``."""
    if not isinstance(mask, Tensor) or mask.dtype.kind != "b":
        raise DTypeError(f"masked_fill: mask must be a bool tensor, got "
                         f"{mask.dtype if isinstance(mask, Tensor) else type(mask).__name__}")
    if isinstance(value, Tensor):
        if value.ndim != 0:
            raise ShapeError(f"masked_fill: value must be a 0-d tensor or a number, got shape {tuple(value.shape)}")
        value = cast(value, input.dtype)
    return where(mask, value, input)


class TopK(NamedTuple):
    values: Tensor
    indices: Tensor


class TopKIndices(Op):
    """The indices of the ``k`` largest (or smallest) entries along ``dim``, in order (a stable
    sort): an op, not a read of the array, so that a vmap shifts ``dim`` past its batch dim."""

    kind = "other"
    batch = "dim"
    onnx_refused = "no emitter written yet: ONNX TopK (its indices output)"

    @staticmethod
    def forward(ctx, a, dim, k, largest):
        order = ctx.xp.argsort(-a if largest else a, axis=dim, kind="stable")
        return ctx.xp.take(order, ctx.xp.arange(k), axis=dim).astype("int64")


def topk(input: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> TopK:
    """The ``k`` largest (or smallest) entries along ``dim`` and their indices, largest first."""
    d = _dim(dim, input.ndim, "topk")
    n = input.shape[d] if input.ndim else 1
    if not 0 <= k <= n:
        raise ShapeError(f"topk: k ({k}) must be between 0 and the size of dim {d} ({n})")
    if input.ndim == 0:
        indices = TopKIndices.apply(input.detach().reshape(1), 0, k, largest).reshape(())
        return TopK(input.clone() if k else input[()], indices)
    indices = TopKIndices.apply(input.detach(), d, k, largest)
    return TopK(gather(input, d, indices), indices)


def norm(input: Tensor, p: Any = "fro", dim: int | Sequence[int] | None = None, keepdim: bool = False,
         dtype: Any = None) -> Tensor:
    """The ``p``-norm of ``input`` over ``dim`` (all dims by default) as ``torch.norm``: ``p`` a
    number, ``inf``/``-inf`` (largest / smallest absolute value), or ``"fro"`` (the 2-norm)."""
    x = input if dtype is None else cast(input, dtype)
    if x.dtype.kind != "f":
        raise DTypeError(f"norm: expected a floating tensor, got {x.dtype}")
    if p == "fro" or p is None:
        p = 2
    if isinstance(p, str):
        raise ValueError(f"norm: p must be a number, inf or 'fro', got {p!r}")
    if p == math.inf:
        return amax(abs(x), dim, keepdim)
    if p == -math.inf:
        return amin(abs(x), dim, keepdim)
    if p == 0:
        return sum(cast(x != 0, x.dtype), dim, keepdim)
    if p == 1:
        return sum(abs(x), dim, keepdim)
    if p == 2:  # x*x has a gradient at 0, |x|**2 does not
        return pow(sum(x * x, dim, keepdim), 0.5)
    return pow(sum(pow(abs(x), p), dim, keepdim), 1.0 / p)
