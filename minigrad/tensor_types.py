"""``minigrad.Size`` and the legacy tensor type names (``"minigrad.FloatTensor"``), as PyTorch's.

``x.shape`` is a ``Size``: a tuple that prints as ``minigrad.Size([64, 1, 28, 28])``.
``x.type()`` names a tensor's type the old way, and ``x.type("minigrad.LongTensor")`` converts;
the typed constructors ``FloatTensor(...)`` are in ``minigrad.creation`` (chapter 01).
"""

from __future__ import annotations

from typing import Any

from minigrad import backend

__all__ = ["Size", "TYPE_NAMES", "dtype_of_type_name"]


class Size(tuple):
    """A tensor's shape: a tuple of ints that prints as ``minigrad.Size([2, 3])``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"minigrad.Size({list(self)})"

    def numel(self) -> int:
        n = 1
        for s in self:
            n *= s
        return n

    def __getitem__(self, index: Any) -> Any:
        out = tuple.__getitem__(self, index)
        return Size(out) if isinstance(index, slice) else out


TYPE_NAMES = {
    backend.float32: "FloatTensor", backend.float64: "DoubleTensor", backend.float16: "HalfTensor",
    backend.int64: "LongTensor", backend.int32: "IntTensor", backend.int16: "ShortTensor",
    backend.int8: "CharTensor", backend.uint8: "ByteTensor", backend.bool_: "BoolTensor",
}
_DTYPE_OF_NAME = {name: dtype for dtype, name in TYPE_NAMES.items()}


def dtype_of_type_name(name: str) -> Any:
    """``"minigrad.FloatTensor"`` (or ``"torch.FloatTensor"``, or ``"FloatTensor"``) -> float32."""
    dtype = _DTYPE_OF_NAME.get(name.rpartition(".")[2])
    if dtype is None:
        raise ValueError(f"type(): unknown tensor type {name!r}; expected one of "
                         f"{sorted('minigrad.' + n for n in _DTYPE_OF_NAME)}")
    return dtype
