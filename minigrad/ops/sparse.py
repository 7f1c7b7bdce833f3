"""Sparse COO tensors: store only the non-zero entries, as (indices, values) (chapter 01, lesson 06).

A COO ("coordinate") tensor of shape (M, N, *D) keeps ``indices``, an integer (2, nnz) array of
positions, and ``values``, an (nnz, *D) Tensor of what sits there; everything else is zero. A
position may appear more than once (the entries add up) until ``coalesce()`` sorts the positions
and sums the repeats, as in PyTorch. Where this pays is gradients: an embedding table of a
million rows sees a few hundred of them per batch, so ``nn.Embedding(sparse=True)`` returns a
COO gradient holding those rows only, and ``optim.SGD`` / ``optim.SparseAdam`` update just them.
``mm(sparse, dense)`` is differentiable in both the dense operand and the sparse values.
A ``SparseTensor`` is its own small class (numpy underneath, no scipy), not a ``Tensor``; the
module is ``minigrad.sparse`` to users (``minigrad.sparse.mm``), as ``torch.sparse``.
"""

from __future__ import annotations

from typing import Any, Sequence

from minigrad import backend
from minigrad.autograd.function import Function
from minigrad.errors import DeviceError, ShapeError
from minigrad.ops.indexing import GetItem, ScatterIndex
from minigrad.ops.movement import cat
from minigrad._tensor import Tensor, _wrap

__all__ = ["SparseTensor", "add_", "mm", "sparse_coo_tensor", "to_sparse"]


class SparseTensor:
    """``indices`` (sparse_dim, nnz) int64 ``xp`` array, ``values`` a Tensor (nnz, *dense_dims)."""

    is_sparse = True
    layout = "sparse_coo"

    def __init__(self, indices: Any, values: Tensor, shape: Sequence[int], coalesced: bool = False) -> None:
        self._indices, self._values, self.shape = indices, values, tuple(int(n) for n in shape)
        self._coalesced = coalesced

    # -- what it is --------------------------------------------------------------------------------
    dtype = property(lambda self: self._values.dtype)
    device = property(lambda self: self._values.device)
    ndim = property(lambda self: len(self.shape))
    requires_grad = property(lambda self: self._values.requires_grad)

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[dim]

    def dim(self) -> int:
        return len(self.shape)

    def sparse_dim(self) -> int:
        return self._indices.shape[0]

    def dense_dim(self) -> int:
        return self.ndim - self.sparse_dim()

    def _nnz(self) -> int:
        return self._indices.shape[1]

    def indices(self) -> Tensor:
        return _wrap(self._indices, self.device)

    def values(self) -> Tensor:
        return self._values

    def is_coalesced(self) -> bool:
        return self._coalesced

    def __repr__(self) -> str:
        return (f"sparse_coo_tensor(indices={self.indices()!r},\n       values={self._values!r},\n"
                f"       size={self.shape}, nnz={self._nnz()})")

    # -- conversions -------------------------------------------------------------------------------
    def coalesce(self) -> SparseTensor:
        """The same tensor with each position once, in row-major order (repeats summed)."""
        if self._coalesced:
            return self
        xp = self.device.xp
        keys = xp.ravel_multi_index(tuple(self._indices), self.shape[:self.sparse_dim()])
        unique, slot = xp.unique(keys, return_inverse=True)
        idx = xp.stack(xp.unravel_index(unique, self.shape[:self.sparse_dim()])).astype(backend.int64)
        values = ScatterIndex.apply(self._values, (len(unique), *self._values.shape[1:]),
                                    ((Ellipsis,), (slot.reshape(-1),)))
        return SparseTensor(idx.reshape(self.sparse_dim(), -1), values, self.shape, coalesced=True)

    def to_dense(self) -> Tensor:
        """The dense tensor; differentiable in ``values``."""
        return ScatterIndex.apply(self._values, self.shape, ((Ellipsis,), tuple(self._indices)))

    def to_sparse(self) -> SparseTensor:
        return self

    def detach(self) -> SparseTensor:
        return SparseTensor(self._indices, self._values.detach(), self.shape, self._coalesced)

    def clone(self) -> SparseTensor:
        return SparseTensor(self._indices.copy(), self._values.clone(), self.shape, self._coalesced)

    def t(self) -> SparseTensor:
        """The transpose of a 2-D sparse matrix: swap the two rows of ``indices``."""
        if self.sparse_dim() != 2 or self.dense_dim():
            raise ShapeError(f"t: expected a 2-D sparse matrix, got shape {self.shape} with {self.sparse_dim()} "
                             "sparse dims")
        return SparseTensor(self._indices[::-1].copy(), self._values, self.shape[::-1])

    # -- arithmetic: what gradients and optimizers need --------------------------------------------
    def __add__(self, other: Any) -> Any:
        """sparse + sparse: both sets of entries, uncoalesced (as PyTorch); sparse + dense: dense."""
        if isinstance(other, SparseTensor):
            if other.shape != self.shape:
                raise ShapeError(f"add: sparse shapes {self.shape} and {other.shape} differ")
            xp = self.device.xp
            return SparseTensor(xp.concatenate([self._indices, other._indices], axis=1),
                                cat([self._values, other._values]), self.shape)
        if isinstance(other, Tensor):
            return other + self.to_dense()
        return NotImplemented

    __radd__ = __add__

    def __mul__(self, scalar: float) -> SparseTensor:
        return SparseTensor(self._indices, self._values * scalar, self.shape, self._coalesced)

    __rmul__ = __mul__

    def __neg__(self) -> SparseTensor:
        return self * -1.0


def sparse_coo_tensor(indices: Any, values: Any, size: Sequence[int] | None = None, dtype: Any = None,
                      device: Any = None, requires_grad: bool = False) -> SparseTensor:
    """A COO tensor with ``values[k]`` at position ``indices[:, k]`` (size: the smallest that fits)."""
    values = values if isinstance(values, Tensor) and dtype is None and device is None else \
        Tensor(values, dtype=dtype, device=device)
    xp = values.device.xp
    idx = backend.to_device(indices.array if isinstance(indices, Tensor) else backend.numpy.asarray(indices),
                            values.device).astype(backend.int64)
    if idx.ndim != 2 or idx.shape[1] != values.shape[0]:
        raise ShapeError(f"sparse_coo_tensor: indices must be (sparse_dim, nnz) with nnz = values.shape[0] = "
                         f"{values.shape[0]}, got indices of shape {tuple(idx.shape)}")
    fits = tuple(int(n) + 1 for n in idx.max(axis=1)) if idx.shape[1] else (0,) * idx.shape[0]
    size = tuple(size) if size is not None else fits + tuple(values.shape[1:])
    if len(size) != idx.shape[0] + values.ndim - 1 or any(f > n for f, n in zip(fits, size)) or (idx < 0).any():
        raise ShapeError(f"sparse_coo_tensor: size {size} does not hold indices reaching {fits} with "
                         f"values of shape {values.shape}")
    if requires_grad:
        values.requires_grad_()
    return SparseTensor(xp.ascontiguousarray(idx), values, size)


def to_sparse(x: Tensor, sparse_dim: int | None = None) -> SparseTensor:
    """The non-zero entries of ``x`` (with ``sparse_dim``: its non-zero slices along the first
    ``sparse_dim`` dims), coalesced; differentiable in the kept values."""
    xp, k = x.device.xp, x.ndim if sparse_dim is None else sparse_dim
    nonzero = x.array != 0 if k == x.ndim else (x.array != 0).reshape(*x.shape[:k], -1).any(axis=-1)
    idx = xp.stack(xp.nonzero(nonzero)).astype(backend.int64).reshape(k, -1)
    return SparseTensor(idx, GetItem.apply(x, ((Ellipsis,), tuple(idx))), x.shape, coalesced=True)


class SparseMM(Function):
    """``sparse @ dense`` for a 2-D COO ``sparse``: out[i] += v * dense[j] for every entry (i, j, v)."""

    # its rule builds a SparseTensor (a Tensor kind with no array form), so it reads Tensors under
    # either binding of ctx.ops; the engine wraps the gradient for it
    tensor_backward = True

    @staticmethod
    def forward(ctx, values, dense, indices, shape):
        ctx.save_for_backward(values, dense)
        ctx.indices, ctx.shape = indices, shape
        rows, cols = indices
        xp = dense.device.xp
        out = xp.zeros((shape[0], dense.shape[1]), dtype=dense.dtype)
        backend.add_at(xp, out, rows, values.array[:, None] * dense.array[cols])
        return _wrap(out, dense.device)

    @staticmethod
    def backward(ctx, g):
        values, dense = ctx.saved_tensors
        rows, cols = ctx.indices
        gv = (g[rows] * dense[cols]).sum(1) if ctx.needs_input_grad[0] else None
        gd = mm(SparseTensor(ctx.indices, values, ctx.shape).t(), g) if ctx.needs_input_grad[1] else None
        return gv, gd, None, None


def mm(sparse: SparseTensor, dense: Tensor) -> Tensor:
    """The matrix product of a 2-D COO tensor and a dense matrix, differentiable in both."""
    if not isinstance(sparse, SparseTensor) or sparse.sparse_dim() != 2 or sparse.dense_dim():
        raise ShapeError(f"sparse.mm: expected a 2-D sparse matrix first, got {type(sparse).__name__} "
                         f"of shape {getattr(sparse, 'shape', None)}")
    if dense.ndim != 2 or dense.shape[0] != sparse.shape[1]:
        raise ShapeError(f"sparse.mm: cannot multiply {sparse.shape} by {tuple(dense.shape)}")
    if dense.device != sparse.device:
        raise DeviceError(f"sparse.mm: sparse on {sparse.device}, dense on {dense.device}")
    values = sparse.values() if sparse.dtype == dense.dtype else sparse.values().to(dense.dtype)
    return SparseMM.apply(values, dense, sparse._indices, sparse.shape)


class SparseEmbedding(Function):
    """``weight[index]`` whose weight gradient is a COO tensor: one row of the output gradient
    per looked-up index (repeats kept, uncoalesced, as PyTorch's ``Embedding(sparse=True)``)."""

    # the gradient is a SparseTensor, which only exists as a Tensor: the rule stays on Tensors,
    # and the engine hands the sparse gradient to the weight's .grad as it is
    tensor_backward = True

    @staticmethod
    def forward(ctx, weight, index):
        ctx.index, ctx.shape = index.array.reshape(1, -1).astype(backend.int64), weight.shape
        return _wrap(weight.array[index.array], weight.device)

    @staticmethod
    def backward(ctx, g):
        return SparseTensor(ctx.index, g.reshape(-1, ctx.shape[1]), ctx.shape), None


def embedding(index: Tensor, weight: Tensor) -> Tensor:
    return SparseEmbedding.apply(weight, index)


def add_(dense: Tensor, sparse: SparseTensor, alpha: float = 1.0) -> Tensor:
    """``dense += alpha * sparse`` in place, touching only ``sparse``'s entries (repeats add up):
    what an optimizer does with a sparse gradient."""
    backend.add_at(dense.device.xp, dense.array, tuple(sparse._indices), sparse._values.array * alpha)
    dense._bump_version()
    return dense
