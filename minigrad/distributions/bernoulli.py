"""``Bernoulli(probs=None, logits=None)``: a coin that shows 1 with probability ``probs``.

``log_prob`` and ``entropy`` are written through binary cross-entropy with logits, which stays
finite for any logit, so a probability near 0 or 1 never gives an infinite loss or a NaN gradient.
"""

from __future__ import annotations

from typing import Sequence

from minigrad import creation
from minigrad.autograd.grad_mode import no_grad
from minigrad.distributions import constraints
from minigrad.distributions.distribution import Distribution, broadcast_all
from minigrad.distributions.utils import lazy_property, logits_to_probs, probs_to_logits
from minigrad.nn import functional as F
from minigrad.tensor_types import Size
from minigrad._tensor import Tensor

__all__ = ["Bernoulli"]


class Bernoulli(Distribution):
    arg_constraints = {"probs": constraints.unit_interval, "logits": constraints.real}
    support = constraints.boolean
    has_enumerate_support = True

    def __init__(self, probs: Tensor | float | None = None, logits: Tensor | float | None = None,
                 validate_args: bool | None = None) -> None:
        if (probs is None) == (logits is None):
            raise ValueError("Either `probs` or `logits` must be specified, but not both.")
        if probs is not None:
            (self.probs,) = broadcast_all(probs)
        else:
            (self.logits,) = broadcast_all(logits)
        self._param = self.probs if probs is not None else self.logits
        super().__init__(self._param.shape, (), validate_args)

    @lazy_property
    def logits(self) -> Tensor:
        return probs_to_logits(self.probs, is_binary=True)

    @lazy_property
    def probs(self) -> Tensor:
        return logits_to_probs(self.logits, is_binary=True)

    @property
    def param_shape(self) -> Size:
        return Size(self._param.shape)

    @property
    def mean(self) -> Tensor:
        return self.probs

    @property
    def mode(self) -> Tensor:
        return (self.probs >= 0.5).to(self.probs.dtype)

    @property
    def variance(self) -> Tensor:
        return self.probs * (1 - self.probs)

    def sample(self, sample_shape: Sequence[int] = Size()) -> Tensor:
        """0.0 or 1.0 (the parameter's dtype), of shape ``sample_shape + batch_shape``."""
        shape = self._extended_shape(sample_shape)
        with no_grad():
            u = creation.rand(*shape, dtype=self._param.dtype, device=self._param.device)
            return (u < self.probs.expand(*shape)).to(self._param.dtype)

    def log_prob(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        logits, value = broadcast_all(self.logits, value)
        return -F.binary_cross_entropy_with_logits(logits, value, reduction="none")

    def entropy(self) -> Tensor:
        return F.binary_cross_entropy_with_logits(self.logits, self.probs, reduction="none")

    def enumerate_support(self, expand: bool = True) -> Tensor:
        values = creation.tensor([0.0, 1.0], dtype=self._param.dtype, device=self._param.device)
        values = values.reshape(2, *(1,) * len(self.batch_shape))
        return values.expand(2, *tuple(self.batch_shape)) if expand else values
