"""The communication ops of model parallelism, each the mirror of another in backward (chapter 04).

``copy_to_parallel`` is the identity forward and an all-reduce of the gradients backward;
``reduce_from_parallel`` is the reverse. ``gather_from_parallel`` concatenates the ranks' blocks
of the last dim and ``scatter_to_parallel`` keeps this rank's block; each is the other's backward.
``minigrad.distributed.model_parallel`` builds its column- and row-parallel layers from them.
"""

from __future__ import annotations

from minigrad.distributed.process_group import ReduceOp, group
from minigrad.errors import ShapeError
from minigrad.ops.op import Op
from minigrad._tensor import Tensor

__all__ = ["copy_to_parallel", "gather_from_parallel", "reduce_from_parallel", "scatter_to_parallel"]


class CopyToParallel(Op):
    onnx_refused = "tensor-parallel communication between processes; export the model unsharded"

    @staticmethod
    def forward(ctx, x): return x
    @staticmethod
    def backward(ctx, g): return ctx.ops.apply(ReduceFromParallel, g)


class ReduceFromParallel(Op):
    onnx_refused = "tensor-parallel communication between processes; export the model unsharded"

    @staticmethod
    def forward(ctx, x):
        out = ctx.xp.array(x, order="C")
        group().backend.all_reduce(out, ReduceOp.SUM, False).wait()
        return out

    @staticmethod
    def backward(ctx, g): return ctx.ops.apply(CopyToParallel, g)


class GatherFromParallel(Op):
    onnx_refused = "tensor-parallel communication between processes; export the model unsharded"

    @staticmethod
    def forward(ctx, x):
        pg = group()
        every = ctx.xp.empty((pg.size(),) + x.shape, dtype=x.dtype)
        pg.backend.all_gather(every, ctx.xp.ascontiguousarray(x), False).wait()
        return ctx.xp.concatenate(list(every), axis=-1)

    @staticmethod
    def backward(ctx, g): return ctx.ops.apply(ScatterToParallel, g)


class ScatterToParallel(Op):
    onnx_refused = "tensor-parallel communication between processes; export the model unsharded"

    @staticmethod
    def forward(ctx, x):
        pg = group()
        k = x.shape[-1] // pg.size()
        return ctx.xp.ascontiguousarray(x[..., pg.rank() * k:(pg.rank() + 1) * k])

    @staticmethod
    def backward(ctx, g): return ctx.ops.apply(GatherFromParallel, g)


def copy_to_parallel(x: Tensor) -> Tensor:
    """``x`` unchanged; in backward, the ranks' gradients of it are summed (each rank used x)."""
    return CopyToParallel.apply(x)


def reduce_from_parallel(x: Tensor) -> Tensor:
    """The sum over ranks of their ``x``; in backward, the gradient passes unchanged."""
    return ReduceFromParallel.apply(x)


def gather_from_parallel(x: Tensor) -> Tensor:
    """The ranks' ``x`` concatenated along the last dim; in backward, each keeps its block."""
    return GatherFromParallel.apply(x)


def scatter_to_parallel(x: Tensor) -> Tensor:
    """This rank's block of ``x``'s last dim; in backward, the blocks' gradients are gathered."""
    n = group().size()
    if x.shape[-1] % n:
        raise ShapeError(f"scatter_to_parallel: the last dim ({x.shape[-1]}) of shape {tuple(x.shape)} "
                         f"does not split evenly across {n} ranks")
    return ScatterToParallel.apply(x)
