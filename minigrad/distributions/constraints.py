"""``minigrad.distributions.constraints``: the sets a parameter or a sample must lie in.

A distribution checks its parameters against these at construction, and ``log_prob``'s value
against its ``support``, when validation is on (torch's default): a negative ``scale`` or a
probability of 1.5 raises ``ValueError`` naming the parameter and the set, instead of quietly
giving NaN losses later. Names and reprs are torch's (``constraints.positive``, ``Real()``).
"""

from __future__ import annotations

from typing import Any

from minigrad._tensor import Tensor

__all__ = ["Constraint", "boolean", "integer_interval", "positive", "real", "real_vector", "simplex",
           "unit_interval"]


class Constraint:
    """A set of values: ``check(value)`` is a bool array, True where an element (or, for an
    ``event_dim`` of 1, a row of the last dimension) is in the set."""

    is_discrete = False
    event_dim = 0

    def check(self, value: Tensor) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.check: a subclass defines its set")

    def __repr__(self) -> str:
        return type(self).__name__.lstrip("_") + "()"


class _Real(Constraint):
    def check(self, value: Tensor) -> Any:
        return value.array == value.array  # False only at NaN


class _RealVector(_Real):
    event_dim = 1

    def check(self, value: Tensor) -> Any:
        return (value.array == value.array).all(-1)


class _GreaterThan(Constraint):
    def __init__(self, lower_bound: float) -> None:
        self.lower_bound = lower_bound

    def check(self, value: Tensor) -> Any:
        return value.array > self.lower_bound

    def __repr__(self) -> str:
        return f"GreaterThan(lower_bound={self.lower_bound})"


class _Interval(Constraint):
    def __init__(self, lower_bound: float, upper_bound: float) -> None:
        self.lower_bound, self.upper_bound = lower_bound, upper_bound

    def check(self, value: Tensor) -> Any:
        return (value.array >= self.lower_bound) & (value.array <= self.upper_bound)

    def __repr__(self) -> str:
        return f"Interval(lower_bound={self.lower_bound}, upper_bound={self.upper_bound})"


class _IntegerInterval(_Interval):
    is_discrete = True

    def check(self, value: Tensor) -> Any:
        return (value.array % 1 == 0) & super().check(value)

    def __repr__(self) -> str:
        return f"IntegerInterval(lower_bound={self.lower_bound}, upper_bound={self.upper_bound})"


class _Boolean(Constraint):
    is_discrete = True

    def check(self, value: Tensor) -> Any:
        return (value.array == 0) | (value.array == 1)


class _Simplex(Constraint):
    """Non-negative rows that sum to 1 (within 1e-6, as torch)."""

    event_dim = 1

    def check(self, value: Tensor) -> Any:
        a = value.array
        return (a >= 0).all(-1) & (abs(a.sum(-1) - 1) < 1e-6)


real = _Real()
real_vector = _RealVector()
positive = _GreaterThan(0.0)
unit_interval = _Interval(0.0, 1.0)
boolean = _Boolean()
simplex = _Simplex()


def integer_interval(lower_bound: int, upper_bound: int) -> Constraint:
    """The integers ``lower_bound..upper_bound``, both included."""
    return _IntegerInterval(lower_bound, upper_bound)
