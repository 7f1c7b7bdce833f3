"""``Variable``: the wrapper old PyTorch code still calls (chapter 02).

Before PyTorch 0.4 a Tensor held data and a Variable added the graph. The two were merged, and
``Variable(t, requires_grad=True)`` became a deprecated spelling of "this tensor, requiring grad".
minigrad keeps the spelling, so that code runs unchanged: it returns a Tensor, and
``isinstance(x, Variable)`` holds for every Tensor, as in torch.
"""

from __future__ import annotations

from typing import Any

from minigrad._tensor import Tensor


class _VariableMeta(type):
    def __instancecheck__(cls, other: Any) -> bool:
        return isinstance(other, Tensor)


class Variable(metaclass=_VariableMeta):
    """``Variable(t, requires_grad=False)``: a Tensor sharing ``t``'s memory (``volatile`` is ignored)."""

    def __new__(cls, data: Tensor, requires_grad: bool = False, volatile: bool = False) -> Tensor:  # type: ignore[misc]
        if not isinstance(data, Tensor):
            raise TypeError(f"Variable: data must be a Tensor, got {type(data).__name__}")
        return data.detach().requires_grad_(requires_grad)
