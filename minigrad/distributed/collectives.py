"""Collectives on tensors, as ``torch.distributed``: every rank calls the same function in the
same order, and each tensor is changed in place.

``all_reduce`` leaves the sum (or average, max...) of every rank's tensor on every rank: the one
operation data-parallel training needs. ``broadcast``, ``all_gather``, ``reduce_scatter``,
``send`` and ``recv`` complete the set. With ``async_op=True`` they return a ``Work`` to
``wait()`` on, so computation can overlap communication (chapter 04). They write into a tensor's
memory outside autograd, like ``torch.distributed``, and bump its version counter.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

from minigrad import backend as _backend
from minigrad.distributed.process_group import ProcessGroup, ReduceOp, Work, group
from minigrad.errors import ShapeError
from minigrad._tensor import Tensor

__all__ = [
    "all_gather", "all_gather_into_tensor", "all_reduce", "broadcast", "irecv", "isend", "recv",
    "reduce_scatter", "reduce_scatter_tensor", "send",
]

_SHAPE_SLOTS = 8  # dims compared one by one; any further ones are compared by their product


def _signature(t: Tensor) -> list[int]:
    shape = list(t.shape)
    if len(shape) > _SHAPE_SLOTS:
        shape = shape[:_SHAPE_SLOTS - 1] + [math.prod(shape[_SHAPE_SLOTS - 1:])]
    dtypes = list(_backend.DTYPES)
    return [dtypes.index(t.dtype.name), t.ndim] + shape + [-1] * (_SHAPE_SLOTS - len(shape))


def _describe(sig: Any) -> str:
    dtype, ndim = list(_backend.DTYPES)[int(sig[0])], int(sig[1])
    if ndim > _SHAPE_SLOTS:
        return f"{ndim} dims starting {tuple(int(d) for d in sig[2:1 + _SHAPE_SLOTS])} {dtype}"
    return f"{tuple(int(d) for d in sig[2:2 + ndim])} {dtype}"


def check_same(op: str, tensor: Tensor, pg: ProcessGroup | None = None) -> None:
    """Raise a ``ShapeError`` on every rank when the ranks' tensors differ in shape or dtype
    (one all-gather of a few integers; skipped when the group was made with check_shapes=False)."""
    pg = pg or group()
    if not pg.check_shapes or pg.size() == 1:
        return
    xp = tensor.device.xp
    mine = xp.asarray(_signature(tensor), dtype=xp.int64)
    every = xp.empty((pg.size(), mine.size), dtype=xp.int64)
    pg.backend.all_gather(every, mine, False).wait()
    every = _backend.to_device(every, _backend.cpu)
    if (every != every[0]).any():
        ranks = ", ".join(f"rank {r} has {_describe(sig)}" for r, sig in enumerate(every))
        raise ShapeError(f"{op}: every rank must pass a tensor of the same shape and dtype, but {ranks}")


def _buffer(tensor: Tensor) -> tuple[Any, Callable[[], None]]:
    """A contiguous array with the tensor's values, and what to run once the backend has written
    into it: copy back if it was a copy, and bump the tensor's version (autograd's saved-tensor check)."""
    data = tensor.array
    if data.flags.c_contiguous:
        return data, tensor._bump_version
    buf = tensor.device.xp.ascontiguousarray(data)

    def write_back() -> None:
        tensor.device.xp.copyto(data, buf)
        tensor._bump_version()

    return buf, write_back


def _finish(work: Work, async_op: bool) -> Work | None:
    if async_op:
        return work
    work.wait()
    return None


def all_reduce(tensor: Tensor, op: ReduceOp = ReduceOp.SUM, *, async_op: bool = False) -> Work | None:
    """Every rank's ``tensor`` becomes the element-wise ``op`` over all ranks' tensors."""
    pg = group()
    check_same("all_reduce", tensor, pg)
    buf, done = _buffer(tensor)
    return _finish(pg.backend.all_reduce(buf, op, async_op).then(done), async_op)


def broadcast(tensor: Tensor, src: int, *, async_op: bool = False) -> Work | None:
    """Every rank's ``tensor`` becomes rank ``src``'s."""
    pg = group()
    _check_rank("broadcast", src, pg)
    check_same("broadcast", tensor, pg)
    buf, done = _buffer(tensor)
    return _finish(pg.backend.broadcast(buf, src, async_op).then(done), async_op)


def all_gather_into_tensor(output_tensor: Tensor, input_tensor: Tensor, *, async_op: bool = False) -> Work | None:
    """``output_tensor`` (world_size times the input's elements) receives every rank's
    ``input_tensor`` one after another, in rank order: (N * d0, ...) or (N, d0, ...)."""
    pg = group()
    _check_sizes("all_gather_into_tensor", output_tensor, input_tensor, pg)
    check_same("all_gather_into_tensor", input_tensor, pg)
    out, done = _buffer(output_tensor)
    src = input_tensor.device.xp.ascontiguousarray(input_tensor.array)
    return _finish(pg.backend.all_gather(out, src, async_op).then(done), async_op)


def all_gather(tensor_list: Sequence[Tensor], tensor: Tensor, *, async_op: bool = False) -> Work | None:
    """``tensor_list[r]`` receives rank r's ``tensor`` (a list of world_size tensors of its shape)."""
    pg = group()
    _check_list("all_gather", tensor_list, tensor, pg)
    check_same("all_gather", tensor, pg)
    xp = tensor.device.xp
    out = xp.empty((pg.size(),) + tuple(tensor.shape), dtype=tensor.dtype)

    def scatter_to_list() -> None:
        for t, part in zip(tensor_list, out):
            xp.copyto(t.array, part)
            t._bump_version()

    work = pg.backend.all_gather(out, xp.ascontiguousarray(tensor.array), async_op).then(scatter_to_list)
    return _finish(work, async_op)


def reduce_scatter_tensor(output: Tensor, input: Tensor, op: ReduceOp = ReduceOp.SUM, *,
                          async_op: bool = False) -> Work | None:
    """Rank r's ``output`` becomes the reduction over ranks of block r of ``input`` (world_size
    blocks of output's size, one after another)."""
    pg = group()
    _check_sizes("reduce_scatter_tensor", input, output, pg)
    check_same("reduce_scatter_tensor", input, pg)
    out, done = _buffer(output)
    src = input.device.xp.ascontiguousarray(input.array)
    return _finish(pg.backend.reduce_scatter(out, src, op, async_op).then(done), async_op)


def reduce_scatter(output: Tensor, input_list: Sequence[Tensor], op: ReduceOp = ReduceOp.SUM, *,
                   async_op: bool = False) -> Work | None:
    """Rank r's ``output`` becomes the reduction over ranks of their ``input_list[r]``."""
    pg = group()
    _check_list("reduce_scatter", input_list, output, pg)
    xp = output.device.xp
    stacked = xp.stack([t.array for t in input_list])
    check_same("reduce_scatter", output, pg)
    out, done = _buffer(output)
    return _finish(pg.backend.reduce_scatter(out, stacked, op, async_op).then(done), async_op)


def send(tensor: Tensor, dst: int, tag: int = 0) -> None:
    """Send ``tensor`` to rank ``dst`` (which calls ``recv`` with a tensor of the same size)."""
    isend(tensor, dst, tag).wait()


def isend(tensor: Tensor, dst: int, tag: int = 0) -> Work:
    """Start sending ``tensor``; do not change it before ``wait()``."""
    pg = group()
    _check_rank("isend", dst, pg)
    return pg.backend.send(tensor.device.xp.ascontiguousarray(tensor.array), dst, tag, True)


def recv(tensor: Tensor, src: int | None = None, tag: int = 0) -> int:
    """Receive into ``tensor`` from rank ``src`` (any rank when None); returns the sender's rank."""
    work = irecv(tensor, src, tag)
    work.wait()
    return work.source


def irecv(tensor: Tensor, src: int | None = None, tag: int = 0) -> Work:
    """Start receiving into ``tensor``; its values are there after ``wait()``."""
    pg = group()
    if src is not None:
        _check_rank("irecv", src, pg)
    buf, done = _buffer(tensor)
    return pg.backend.recv(buf, src, tag, True).then(done)


def _check_rank(op: str, rank: int, pg: ProcessGroup) -> None:
    if not 0 <= rank < pg.size():
        raise ValueError(f"{op}: rank {rank} is out of range for a world of size {pg.size()}")


def _check_sizes(op: str, big: Tensor, small: Tensor, pg: ProcessGroup) -> None:
    if big.numel() != pg.size() * small.numel() or big.dtype != small.dtype:
        raise ShapeError(f"{op}: expected a {small.dtype} tensor of world_size x {small.numel()} = "
                         f"{pg.size() * small.numel()} elements, got {tuple(big.shape)} {big.dtype}")


def _check_list(op: str, tensors: Sequence[Tensor], like: Tensor, pg: ProcessGroup) -> None:
    if len(tensors) != pg.size():
        raise ValueError(f"{op}: expected a list of world_size = {pg.size()} tensors, got {len(tensors)}")
    for r, t in enumerate(tensors):
        if t.shape != like.shape or t.dtype != like.dtype:
            raise ShapeError(f"{op}: tensor {r} of the list has shape {tuple(t.shape)} {t.dtype}, "
                             f"expected {tuple(like.shape)} {like.dtype}")
