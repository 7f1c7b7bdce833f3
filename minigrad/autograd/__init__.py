"""Automatic differentiation: Function, the backward engine, grad modes and checking tools."""

from minigrad.autograd.engine import backward, consumers, grad, topological_order
from minigrad.autograd.function import AccumulateGrad, Function
from minigrad.autograd.grad_mode import enable_grad, is_grad_enabled, no_grad, set_grad_enabled

__all__ = [
    "AccumulateGrad", "Function", "backward", "consumers", "enable_grad", "grad", "is_grad_enabled",
    "no_grad", "set_grad_enabled", "topological_order",
]
