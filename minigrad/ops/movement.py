"""Movement ops: reshape, transpose, broadcast, concatenate, split, pad, flip, repeat.

They move or copy data without arithmetic, so each backward is the inverse movement: reshape
back, transpose back, sum a broadcast, slice a concatenation. Reshapes, transposes and
broadcasts return views that share memory with their input where numpy can.
"""

from __future__ import annotations

from minigrad.ops.elementwise import Op
from minigrad.tensor import Tensor


class Reshape(Op):
    @staticmethod
    def forward(ctx, a, shape):
        ctx.shape = a.shape
        return a.reshape(shape)

    @staticmethod
    def backward(ctx, g): return reshape(g, ctx.shape), None


class BroadcastTo(Op):
    @staticmethod
    def forward(ctx, a, shape):
        ctx.shape = a.shape
        return ctx.xp.broadcast_to(a, shape)

    @staticmethod
    def backward(ctx, g):
        from minigrad.ops.reduce import sum_to

        return sum_to(g, ctx.shape), None


def reshape(x: Tensor, shape: tuple) -> Tensor:
    return x if x.shape == tuple(shape) else Reshape.apply(x, tuple(shape))


def broadcast_to(x: Tensor, shape: tuple) -> Tensor:
    return x if x.shape == tuple(shape) else BroadcastTo.apply(x, tuple(shape))
