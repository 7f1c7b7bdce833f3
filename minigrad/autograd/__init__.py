"""Automatic differentiation: Function, the backward engine, grad modes, the mode stack and checking tools (chapter 02)."""

from minigrad.autograd.engine import backward, consumers, grad, topological_order
from minigrad.autograd.function import AccumulateGrad, Function
from minigrad.autograd.grad_mode import enable_grad, inference_mode, is_grad_enabled, no_grad, set_grad_enabled
from minigrad.autograd.mode import Mode, is_backward_running
from minigrad.autograd.anomaly import detect_anomaly, is_anomaly_enabled, set_detect_anomaly
from minigrad.autograd.gradcheck import GradcheckError, gradcheck, gradgradcheck
from minigrad.autograd.variable import Variable
from minigrad.autograd import functional  # noqa: F401  (minigrad.autograd.functional.hessian, as in torch)

__all__ = [
    "AccumulateGrad", "Function", "GradcheckError", "Mode", "backward", "consumers", "detect_anomaly",
    "enable_grad", "functional", "grad", "gradcheck", "gradgradcheck", "inference_mode", "is_anomaly_enabled",
    "is_backward_running", "is_grad_enabled", "no_grad", "set_detect_anomaly", "set_grad_enabled", "topological_order",
    "Variable",
]
