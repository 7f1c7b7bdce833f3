"""``Dropout``: randomly zero activations while training, a cheap regulariser (chapter 02).

Each element is kept with probability ``1 - p`` and scaled by ``1 / (1 - p)``, so the layer is
the identity in expectation and does nothing in ``eval()`` mode. The mask comes from the input's
device generator, so ``minigrad.manual_seed`` makes a run repeatable.
"""

from __future__ import annotations

from minigrad.nn import functional as F
from minigrad.nn.module import Module
from minigrad._tensor import Tensor

__all__ = ["Dropout"]


class Dropout(Module):
    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p, self.inplace = p, inplace

    def forward(self, input: Tensor) -> Tensor:
        return F.dropout(input, self.p, self.training, self.inplace)

    def extra_repr(self) -> str:
        return f"p={self.p}, inplace={self.inplace}"
