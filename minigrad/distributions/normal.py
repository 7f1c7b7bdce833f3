"""``Normal(loc, scale)``: the Gaussian, with a reparameterised sample ``loc + scale * eps``.

Because ``rsample`` draws ``eps`` from N(0, 1) and then scales and shifts it, the sample is a
differentiable function of ``loc`` and ``scale``: this is the reparameterisation trick that lets a
VAE's encoder learn through its sampled code. ``log_prob`` and ``entropy`` are closed forms.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from minigrad import creation
from minigrad.distributions import constraints
from minigrad.distributions.distribution import Distribution, broadcast_all
from minigrad.ops import erf
from minigrad.tensor_types import Size
from minigrad._tensor import Tensor

__all__ = ["Normal"]


class Normal(Distribution):
    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    support = constraints.real
    has_rsample = True

    def __init__(self, loc: Tensor | float, scale: Tensor | float, validate_args: bool | None = None) -> None:
        self.loc, self.scale = broadcast_all(loc, scale)
        super().__init__(self.loc.shape, (), validate_args)

    @property
    def mean(self) -> Tensor:
        return self.loc

    @property
    def mode(self) -> Tensor:
        return self.loc

    @property
    def stddev(self) -> Tensor:
        return self.scale

    @property
    def variance(self) -> Tensor:
        return self.scale ** 2

    def rsample(self, sample_shape: Sequence[int] = Size()) -> Tensor:
        eps = creation.randn(*self._extended_shape(sample_shape), dtype=self.loc.dtype, device=self.loc.device)
        return self.loc + eps * self.scale

    def log_prob(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        return -((value - self.loc) ** 2) / (2 * self.variance) - self.scale.log() - math.log(math.sqrt(2 * math.pi))

    def cdf(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        return 0.5 * (1 + erf((value - self.loc) / (self.scale * math.sqrt(2))))

    def entropy(self) -> Tensor:
        return 0.5 + 0.5 * math.log(2 * math.pi) + self.scale.log()

    def expand(self, batch_shape: Sequence[int], _instance: Any = None) -> Normal:
        shape = tuple(batch_shape)
        return Normal(self.loc.expand(*shape), self.scale.expand(*shape), validate_args=False)
