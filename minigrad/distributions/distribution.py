"""``Distribution``: what every probability distribution offers, and its argument checks.

A distribution over a *batch* of independent variables (``batch_shape``), each an *event* of
``event_shape``, answers ``sample`` (no gradient), ``rsample`` (a reparameterised sample that
gradients flow through, where one exists), ``log_prob``, ``entropy``, ``mean`` and ``variance``,
all built from differentiable minigrad ops, so a policy gradient (REINFORCE) or a VAE's loss
backpropagates into the parameters. With validation on (torch's default, switched by
``Distribution.set_default_validate_args``), bad parameters and values outside the support raise
``ValueError`` naming them, as in torch.
"""

from __future__ import annotations

from typing import Any, Sequence

from minigrad import backend, creation
from minigrad.autograd.grad_mode import no_grad
from minigrad.distributions import constraints
from minigrad.distributions.utils import lazy_property
from minigrad.tensor_types import Size
from minigrad._tensor import Tensor

__all__ = ["Distribution"]


def broadcast_all(*values: Any) -> tuple[Tensor, ...]:
    """The values as float tensors of one shape: numbers take the dtype and device of the first
    tensor among them (the default dtype when there is none), as torch's ``broadcast_all``."""
    like = next((v for v in values if isinstance(v, Tensor)), None)
    dtype = like.dtype if like is not None and like.dtype.kind == "f" else backend.get_default_dtype()
    device = like.device if like is not None else None
    tensors = [v if isinstance(v, Tensor) and v.dtype.kind == "f" else
               (v.to(dtype) if isinstance(v, Tensor) else creation.tensor(v, dtype=dtype, device=device))
               for v in values]
    shape = backend.numpy.broadcast_shapes(*(tuple(t.shape) for t in tensors))
    return tuple(t if tuple(t.shape) == shape else t.expand(*shape) for t in tensors)


class Distribution:
    """The base class: subclasses set ``arg_constraints`` and ``support`` and define the math."""

    has_rsample = False
    arg_constraints: dict[str, constraints.Constraint] = {}
    support: constraints.Constraint | None = None
    _validate_args = __debug__  # torch's default: checks on, unless Python runs with -O

    @staticmethod
    def set_default_validate_args(value: bool) -> None:
        """Turn argument checking on or off for distributions made after this call."""
        if value not in (True, False):
            raise ValueError(f"set_default_validate_args: expected True or False, got {value!r}")
        Distribution._validate_args = value

    def __init__(self, batch_shape: Sequence[int] = (), event_shape: Sequence[int] = (),
                 validate_args: bool | None = None) -> None:
        self._batch_shape, self._event_shape = Size(batch_shape), Size(event_shape)
        if validate_args is not None:
            self._validate_args = validate_args
        if self._validate_args:
            for name, constraint in self.arg_constraints.items():
                if name not in self.__dict__ and isinstance(getattr(type(self), name, None), lazy_property):
                    continue  # a parameter computed from another one (probs from logits) is valid if that is
                value = getattr(self, name)
                if not bool(constraint.check(value).all()):
                    raise ValueError(f"Expected parameter {name} ({type(value).__name__} of shape "
                                     f"{tuple(value.shape)}) of distribution {self!r} to satisfy the constraint "
                                     f"{constraint!r}, but found invalid values:\n{value}")

    @property
    def batch_shape(self) -> Size:
        return self._batch_shape

    @property
    def event_shape(self) -> Size:
        return self._event_shape

    @property
    def stddev(self) -> Tensor:
        return self.variance.sqrt()

    def _extended_shape(self, sample_shape: Sequence[int] = ()) -> tuple[int, ...]:
        return tuple(sample_shape) + tuple(self._batch_shape) + tuple(self._event_shape)

    def sample(self, sample_shape: Sequence[int] = Size()) -> Tensor:
        """Samples of shape ``sample_shape + batch_shape + event_shape``, without gradient."""
        with no_grad():
            return self.rsample(sample_shape)

    def rsample(self, sample_shape: Sequence[int] = Size()) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__} has no reparameterised sample (rsample); sampling it "
                                  "is not differentiable: use sample() and a score-function estimator")

    def sample_n(self, n: int) -> Tensor:
        return self.sample((n,))

    def _validate_sample(self, value: Tensor) -> None:
        """A value ``log_prob`` can score: its trailing dims match the event and broadcast with the
        batch, and (with validation on) it lies in the support."""
        if not isinstance(value, Tensor):
            raise ValueError(f"The value argument to log_prob must be a Tensor, got {type(value).__name__}")
        event = len(self._event_shape)
        if tuple(value.shape[value.ndim - event:]) != tuple(self._event_shape) or value.ndim < event:
            raise ValueError(f"The right-most size of value must match event_shape: {tuple(value.shape)} vs "
                             f"{tuple(self._event_shape)}")
        batch = tuple(value.shape[:value.ndim - event])
        for a, b in zip(reversed(batch), reversed(tuple(self._batch_shape))):
            if a != 1 and b != 1 and a != b:
                raise ValueError(f"Value is not broadcastable with batch_shape+event_shape: {tuple(value.shape)} vs "
                                 f"{tuple(self._batch_shape) + tuple(self._event_shape)}")
        if self._validate_args and not bool(self.support.check(value).all()):
            raise ValueError(f"Expected value argument ({type(value).__name__} of shape {tuple(value.shape)}) to be "
                             f"within the support ({self.support!r}) of the distribution {self!r}, but found "
                             f"invalid values:\n{value}")

    def __repr__(self) -> str:
        params = ", ".join(f"{k}: {tuple(getattr(self, k).shape) if getattr(self, k).numel() > 1 else getattr(self, k)}"
                           for k in self.arg_constraints if k in self.__dict__)
        return f"{type(self).__name__}({params})"
