"""Storage, strides and memory formats: how an N-D tensor sits in a flat buffer (chapter 01, lesson 05).

A tensor is a view of a one-dimensional *storage*: element ``x[i, j, ...]`` lives at
``storage_offset + i*stride[0] + j*stride[1] + ...`` (strides counted in elements, as in PyTorch;
numpy counts bytes). The default layout is row-major (C order): the last index moves fastest,
so ``empty(2, 3).stride()`` is ``(3, 1)``, in numpy, PyTorch and minigrad alike. Transpose,
permute, expand and slicing only change strides and offset, so they copy nothing; ``as_strided``
sets them by hand. ``channels_last`` keeps a 4-D (N, C, H, W) tensor's shape but stores it as
(N, H, W, C), the layout convolutions on many back ends prefer.
"""

from __future__ import annotations

from typing import Any, Sequence

from minigrad import backend
from minigrad.backend import storage_of
from minigrad.errors import ArgumentError, ShapeError
from minigrad.ops.elementwise import Op, contiguous as _contiguous, same_value
from minigrad.ops.indexing import GetItem, ScatterIndex, _as_view
from minigrad._tensor import Tensor

__all__ = [  # the ops; the helpers below are reached as minigrad.ops.layout.<name>
    "MemoryFormat", "as_strided", "channels_last", "contiguous_format", "preserve_format", "to_memory_format",
]


class MemoryFormat:
    """A layout rule for a tensor's memory: ``order`` lists the dims from outermost to innermost
    (``None``: keep the tensor's own layout)."""

    def __init__(self, name: str, order: tuple[int, ...] | None) -> None:
        self.name, self.order = name, order

    def __repr__(self) -> str:
        return f"minigrad.{self.name}"


contiguous_format = MemoryFormat("contiguous_format", None)  # row-major over however many dims
channels_last = MemoryFormat("channels_last", (0, 2, 3, 1))  # (N, C, H, W) stored as (N, H, W, C)
preserve_format = MemoryFormat("preserve_format", None)


# -- reading the geometry of an array -----------------------------------------------------------------
def data_ptr(a) -> int:
    """The address of ``a``'s first element."""
    return a.data.ptr if hasattr(a.data, "ptr") else a.__array_interface__["data"][0]


def array_strides(a) -> tuple[int, ...]:
    """``a``'s strides in elements (numpy's ``.strides`` are in bytes)."""
    return tuple(s // a.itemsize for s in a.strides)


def array_offset(a) -> int:
    """How many elements into its storage ``a``'s first element sits."""
    return (data_ptr(a) - data_ptr(storage_of(a))) // a.itemsize


def dense_in_order(shape: Sequence[int], stride: Sequence[int], order: Sequence[int]) -> bool:
    """Are the dims packed without gaps, ``order[-1]`` innermost? (Strides in elements.)

    Walking ``order`` from its innermost dim outwards, each dim's stride must be the number of
    elements one step of it skips: 1 for the innermost dim, then the product of the sizes of the
    dims inside it. ``order = range(ndim)`` is row-major (``is_contiguous()``): shape (2, 3, 4) is
    dense with strides (12, 4, 1) only; ``channels_last.order`` is (N, H, W, C) storage. A dim of
    size 1 is never stepped along, so, as in PyTorch, its stride may be anything and it adds
    nothing to the product: shape (4, 1) with strides (1, 7) is dense."""
    ### BEGIN SOLUTION chapter 01: strided views: is_contiguous
    expected = 1
    for d in reversed(order):
        if shape[d] != 1:
            if stride[d] != expected:
                return False
            expected *= shape[d]
    return True
    ### END SOLUTION


def is_contiguous(x: Tensor, memory_format: MemoryFormat = contiguous_format) -> bool:
    """Whether ``x`` is stored densely in ``memory_format``'s order (``dense_in_order``). For
    row-major order numpy keeps this same answer as a flag on every array (``c_contiguous``, with
    PyTorch's rule for size-1 dims), which ``.contiguous()`` reads rather than walk the strides."""
    if memory_format is channels_last:
        return x.ndim == 4 and dense_in_order(x.shape, array_strides(x.array), channels_last.order)
    if memory_format is not contiguous_format:
        raise ArgumentError(f"is_contiguous: memory_format must be contiguous_format or channels_last, "
                            f"got {memory_format}")
    return bool(x.array.flags.c_contiguous)


def is_channels_last(a) -> bool:
    """Is the array ``a`` 4-D and stored (N, H, W, C), and not also row-major (as when C is 1)?"""
    return a.ndim == 4 and not a.flags.c_contiguous and dense_in_order(a.shape, array_strides(a), channels_last.order)



# -- changing the layout -----------------------------------------------------------------------------
class ToChannelsLast(Op):
    """The same values, stored (N, H, W, C): one copy through the transposed view."""

    kind = "movement"
    onnx = staticmethod(same_value)

    @staticmethod
    def forward(ctx, a): return ctx.xp.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)

    @staticmethod
    def backward(ctx, g): return g


def to_memory_format(x: Tensor, memory_format: MemoryFormat = contiguous_format) -> Tensor:
    """``x`` itself when already stored in ``memory_format``, else a copy that is."""
    if memory_format is preserve_format or is_contiguous(x, memory_format):
        return x
    if memory_format is channels_last:
        if x.ndim != 4:
            raise ShapeError(f"channels_last: expected a 4-D (N, C, H, W) tensor, got shape {x.shape}")
        return ToChannelsLast.apply(x)
    return _contiguous(x)


# -- as_strided ---------------------------------------------------------------------------------------
def _flat_storage(a):
    """``a``'s whole storage as a 1-D array of ``a``'s dtype (a view, no copy)."""
    root = storage_of(a)
    xp = backend.device_of(a).xp
    flat = xp.lib.stride_tricks.as_strided(root, (root.nbytes // root.itemsize,), (root.itemsize,))
    return flat.view(a.dtype)


def storage_index(index: Sequence[Any], stride: Sequence[int], storage_offset: Any) -> Any:
    """Where element ``index`` of a view lives in its storage (strides in elements):
    ``storage_offset + index[0]*stride[0] + index[1]*stride[1] + ...``.

    Element [1, 2] of a (3, 4) row-major view at offset 0 (strides (4, 1)) is storage element 6;
    of its transpose (strides (1, 4)) it is 9; element [2, 1] of ``x[:, 1:3]`` (strides (4, 1), offset 1) is 10.
    The index entries may also be integer arrays that broadcast together (``positions`` passes
    one ``arange`` per dim, shaped to its own axis): the same sum, element by element."""
    ### BEGIN SOLUTION chapter 01: strided views: index to offset
    return storage_offset + sum(i * s for i, s in zip(index, stride))
    ### END SOLUTION


def positions(xp, size: Sequence[int], stride: Sequence[int], offset: int):
    """The storage position of every element of a view with this geometry, shaped like the view."""
    axes = [xp.arange(n, dtype=backend.int64).reshape((1,) * d + (n,) + (1,) * (len(size) - d - 1))
            for d, n in enumerate(size)]
    pos = storage_index(axes, stride, offset)  # the axes broadcast to the view's shape
    return pos if axes else xp.full((), pos, dtype=backend.int64)


class AsStrided(Op):
    """A view of the input's storage with a given size, stride and offset. Its gradient follows
    PyTorch: scatter the output gradient into a zero storage (overlapping elements add up), then
    read it back through the input's own geometry (dividing where the input itself overlaps)."""

    kind = "movement"
    returns_view = True
    onnx_refused = "ONNX tensors have no strides: a view of raw storage has no ONNX form"

    @staticmethod
    def forward(ctx, a, size, stride, offset):
        ctx.geometry = (a.shape, array_strides(a), array_offset(a))
        ctx.out_geometry = (stride, offset)
        flat = _flat_storage(a)
        ctx.numel = flat.size
        return ctx.xp.lib.stride_tricks.as_strided(flat[offset:], size, tuple(s * a.itemsize for s in stride))

    @staticmethod
    def backward(ctx, g):
        xp = ctx.xp
        size, stride, offset = ctx.geometry
        where_out = positions(xp, g.shape, *ctx.out_geometry)
        where_in = positions(xp, size, stride, offset)
        storage = ctx.ops.apply(ScatterIndex, g, (ctx.numel,), ((Ellipsis,), (where_out,)))
        gx = ctx.ops.apply(GetItem, storage, ((Ellipsis,), (where_in,)))
        count = xp.bincount(where_in.reshape(-1), minlength=ctx.numel)[where_in]
        if (count > 1).any():
            gx = gx / ctx.ops.constant(count.astype(g.dtype))
        return gx, None, None, None


def as_strided(x: Tensor, size: Sequence[int], stride: Sequence[int], storage_offset: int | None = None) -> Tensor:
    """A view of ``x``'s storage with the given size and strides (in elements), starting
    ``storage_offset`` elements into the storage (default: where ``x`` starts). Nothing is copied;
    the view must stay inside the storage, and strides must be >= 0, as in PyTorch."""
    size, stride = tuple(int(n) for n in size), tuple(int(s) for s in stride)
    offset = array_offset(x.array) if storage_offset is None else int(storage_offset)
    if len(size) != len(stride):
        raise ShapeError(f"as_strided: size {size} and stride {stride} must have the same length")
    if any(n < 0 for n in size) or any(s < 0 for s in stride) or offset < 0:
        raise ShapeError(f"as_strided: sizes, strides and storage_offset must be >= 0, got size {size}, "
                         f"stride {stride}, storage_offset {offset}")
    numel = storage_of(x.array).nbytes // x.array.itemsize
    last = storage_index([n - 1 for n in size], stride, offset) if 0 not in size else offset - 1
    if last >= numel:
        raise ShapeError(f"as_strided: size {size}, stride {stride} and storage_offset {offset} reach element "
                         f"{last} of a storage of {numel} elements")
    return _as_view(AsStrided.apply(x, size, stride, offset), x)


class UntypedStorage:
    """The flat buffer a tensor views (``tensor.untyped_storage()``): every view of one tensor
    has the same ``data_ptr()``."""

    def __init__(self, root) -> None:
        self._root = root

    def data_ptr(self) -> int:
        return data_ptr(self._root)

    def nbytes(self) -> int:
        return int(self._root.nbytes)

    size = nbytes
