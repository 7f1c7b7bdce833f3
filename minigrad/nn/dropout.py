"""``Dropout`` (and ``Dropout1d/2d/3d``): randomly zero activations while training (chapter 02).

Each element is kept with probability ``1 - p`` and scaled by ``1 / (1 - p)``, so the layer is
the identity in expectation and does nothing in ``eval()`` mode. The mask comes from the input's
device generator, so ``minigrad.manual_seed`` makes a run repeatable. The 1d/2d/3d variants
zero whole channels of a feature map, whose neighbouring values are too alike for element dropout.
"""

from __future__ import annotations

from minigrad.nn import functional as F
from minigrad.nn.module import Module
from minigrad._tensor import Tensor

__all__ = ["Dropout", "Dropout1d", "Dropout2d", "Dropout3d"]


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


class Dropout1d(Dropout):
    """Zero whole channels of (N, C, L) or (C, L) with probability ``p``."""

    def forward(self, input: Tensor) -> Tensor:
        return F.dropout1d(input, self.p, self.training, self.inplace)


class Dropout2d(Dropout):
    """Zero whole channels of (N, C, H, W) or (C, H, W) with probability ``p``."""

    def forward(self, input: Tensor) -> Tensor:
        return F.dropout2d(input, self.p, self.training, self.inplace)


class Dropout3d(Dropout):
    """Zero whole channels of (N, C, D, H, W) or (C, D, H, W) with probability ``p``."""

    def forward(self, input: Tensor) -> Tensor:
        return F.dropout3d(input, self.p, self.training, self.inplace)
