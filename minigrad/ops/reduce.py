"""Reductions: sum, mean, max/min, var/std, prod, and ``sum_to``, the inverse of broadcasting.

A reduction's backward spreads the incoming gradient back over the reduced axes (broadcasting it
to the input's shape). ``sum_to`` is what the engine uses to undo broadcasting in every op.
"""

from __future__ import annotations

from minigrad.ops.elementwise import Op
from minigrad.ops.movement import broadcast_to, reshape
from minigrad.tensor import Tensor, _dim


def _dims(dim, ndim: int, op: str) -> tuple | None:
    """Normalise ``dim`` (None, an int or a sequence of ints) to a sorted tuple of axes."""
    if dim is None:
        return None
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    return tuple(sorted({_dim(d, ndim, op) for d in dims}))


def _keep_shape(shape: tuple, dims: tuple | None) -> tuple:
    """The shape a keepdim=True reduction over ``dims`` gives."""
    if dims is None:
        return (1,) * len(shape)
    return tuple(1 if i in dims else n for i, n in enumerate(shape))


class Sum(Op):
    @staticmethod
    def forward(ctx, a, dims, keepdim):
        ctx.shape, ctx.dims, ctx.keepdim = a.shape, dims, keepdim
        return a.sum(axis=dims, keepdims=keepdim)

    @staticmethod
    def backward(ctx, g):
        if not ctx.keepdim:
            g = reshape(g, _keep_shape(ctx.shape, ctx.dims))
        return broadcast_to(g, ctx.shape), None, None


class SumTo(Op):
    @staticmethod
    def forward(ctx, a, shape):
        ctx.shape = a.shape
        lead = a.ndim - len(shape)
        axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape) if n == 1 and a.shape[lead + i] != 1)
        out = a.sum(axis=axes, keepdims=True) if axes else a
        return out.reshape(shape)

    @staticmethod
    def backward(ctx, g): return broadcast_to(g, ctx.shape), None


def sum(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    return Sum.apply(x, _dims(dim, x.ndim, "sum"), keepdim)


def sum_to(x: Tensor, shape: tuple) -> Tensor:
    """Sum ``x`` down to ``shape`` (the shape it was broadcast from)."""
    from minigrad.errors import ShapeError

    shape = tuple(shape)
    if x.shape == shape:
        return x
    lead = x.ndim - len(shape)
    if lead < 0 or any(n != 1 and n != m for n, m in zip(shape, x.shape[lead:])):
        raise ShapeError(f"sum_to: cannot sum a tensor of shape {tuple(x.shape)} to shape {shape}")
    return SumTo.apply(x, shape)
