"""``minigrad.distributions.utils``: moving between probabilities and logits, and lazy parameters.

A categorical or Bernoulli distribution is given either probabilities or logits and computes the
other on first use (``lazy_property``). Probabilities are clamped one machine epsilon inside
(0, 1) before their log is taken, so a probability of exactly 0 or 1 gives a large finite logit
rather than an infinity that would turn a gradient into NaN (torch's ``clamp_probs``).
"""

from __future__ import annotations

from typing import Any, Callable

from minigrad import backend
from minigrad._tensor import Tensor

__all__ = ["clamp_probs", "lazy_property", "logits_to_probs", "probs_to_logits"]


class lazy_property:
    """A parameter computed from another on first access, then kept in the instance's ``__dict__``
    (which a non-data descriptor lets win from then on)."""

    def __init__(self, wrapped: Callable[[Any], Any]) -> None:
        self.wrapped = wrapped
        self.__doc__ = wrapped.__doc__

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        value = self.wrapped(instance)
        instance.__dict__[self.wrapped.__name__] = value
        return value


def clamp_probs(probs: Tensor) -> Tensor:
    eps = float(backend.numpy.finfo(probs.dtype).eps)
    return probs.clamp(min=eps, max=1 - eps)


def probs_to_logits(probs: Tensor, is_binary: bool = False) -> Tensor:
    """``log p`` (categorical) or ``log p - log(1 - p)`` (binary), of clamped probabilities."""
    p = clamp_probs(probs)
    return p.log() - (1 - p).log() if is_binary else p.log()


def logits_to_probs(logits: Tensor, is_binary: bool = False) -> Tensor:
    """``sigmoid`` (binary) or ``softmax`` over the last dim (categorical)."""
    return logits.sigmoid() if is_binary else logits.softmax(-1)
