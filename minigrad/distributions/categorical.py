"""``Categorical(probs=None, logits=None)``: one of ``n`` classes, as a policy's action or a token.

Given probabilities (normalised to sum to 1) or logits (normalised so that ``logsumexp`` is 0),
it samples class indices, scores them with ``log_prob`` (the normalised logit at the index, which
REINFORCE multiplies by the return) and gives the ``entropy`` ``-sum p log p`` (an RL bonus for
exploring). There is no reparameterised sample: a class index is not differentiable.
"""

from __future__ import annotations

import math
from typing import Sequence

from minigrad import backend, creation
from minigrad.distributions import constraints
from minigrad.distributions.distribution import Distribution
from minigrad.distributions.utils import lazy_property, logits_to_probs, probs_to_logits
from minigrad.autograd.grad_mode import no_grad
from minigrad.ops import multinomial
from minigrad.tensor_types import Size
from minigrad._tensor import Tensor

__all__ = ["Categorical"]


class Categorical(Distribution):
    arg_constraints = {"probs": constraints.simplex, "logits": constraints.real_vector}
    has_enumerate_support = True

    def __init__(self, probs: Tensor | None = None, logits: Tensor | None = None,
                 validate_args: bool | None = None) -> None:
        if (probs is None) == (logits is None):
            raise ValueError("Either `probs` or `logits` must be specified, but not both.")
        if probs is not None:
            if probs.ndim < 1:
                raise ValueError("`probs` parameter must be at least one-dimensional.")
            self.probs = probs / probs.sum(-1, keepdim=True)
        else:
            if logits.ndim < 1:
                raise ValueError("`logits` parameter must be at least one-dimensional.")
            self.logits = logits - logits.logsumexp(dim=-1, keepdim=True)
        self._param = self.probs if probs is not None else self.logits
        self._num_events = self._param.shape[-1]
        super().__init__(self._param.shape[:-1], (), validate_args)

    @lazy_property
    def logits(self) -> Tensor:
        return probs_to_logits(self.probs)

    @lazy_property
    def probs(self) -> Tensor:
        return logits_to_probs(self.logits)

    @property
    def param_shape(self) -> Size:
        return Size(self._param.shape)

    @property
    def support(self) -> constraints.Constraint:
        return constraints.integer_interval(0, self._num_events - 1)

    @property
    def mean(self) -> Tensor:
        return creation.full(tuple(self.batch_shape), math.nan, dtype=self._param.dtype, device=self._param.device)

    @property
    def mode(self) -> Tensor:
        return self.probs.argmax(dim=-1)

    @property
    def variance(self) -> Tensor:
        return self.mean

    def sample(self, sample_shape: Sequence[int] = Size()) -> Tensor:
        """Class indices (int64) of shape ``sample_shape + batch_shape``."""
        n = math.prod(tuple(sample_shape))
        with no_grad():
            rows = self.probs.reshape(-1, self._num_events)
            if n:
                draws = multinomial(rows, n, True)
            else:
                draws = creation.zeros(rows.shape[0], 0, dtype="int64", device=rows.device)
            return draws.transpose(0, 1).reshape(*tuple(sample_shape), *tuple(self.batch_shape))

    def log_prob(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        shape = backend.numpy.broadcast_shapes(tuple(value.shape), tuple(self.batch_shape))
        index = value.long().expand(*shape).unsqueeze(-1)
        return self.logits.expand(*shape, self._num_events).gather(-1, index).squeeze(-1)

    def entropy(self) -> Tensor:
        # p log p is 0 where p is 0; clamping -inf logits to the lowest float keeps 0 * logit finite
        logits = self.logits.clamp(min=float(backend.numpy.finfo(self.logits.dtype).min))
        return -(logits * self.probs).sum(-1)

    def enumerate_support(self, expand: bool = True) -> Tensor:
        values = creation.arange(self._num_events, device=self._param.device)
        values = values.reshape(-1, *(1,) * len(self.batch_shape))
        return values.expand(self._num_events, *tuple(self.batch_shape)) if expand else values
