"""Stochastic gradient descent with momentum, dampening, Nesterov momentum and weight decay.

The update is PyTorch's: ``g = grad + wd * p``; with momentum, ``buf = mu * buf + (1 - dampening) * g``
(the first step sets ``buf = g``) and ``g = g + mu * buf`` (Nesterov) or ``g = buf``; then
``p -= lr * g``. Chapter 02 trains its first models with it.
"""

from __future__ import annotations

from typing import Callable, Iterable

from minigrad.autograd.grad_mode import no_grad
from minigrad.optim.optimizer import Optimizer
from minigrad._tensor import Tensor


class SGD(Optimizer):
    def __init__(self, params: Iterable, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, maximize: bool = False) -> None:
        if lr < 0 or momentum < 0 or weight_decay < 0:
            raise ValueError(f"SGD: invalid hyper-parameters lr={lr}, momentum={momentum}, weight_decay={weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("SGD: Nesterov momentum requires a momentum and zero dampening")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov, maximize=maximize))

    @no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        ### BEGIN SOLUTION chapter 02: SGD with momentum
        loss = self._evaluate(closure)
        for group in self.param_groups:
            mu, wd = group["momentum"], group["weight_decay"]
            for p in self._params_with_grad(group):
                g = -p.grad if group["maximize"] else p.grad
                if wd:
                    g = g + wd * p
                if mu:
                    state = self.state[p]
                    buf = state.get("momentum_buffer")
                    if buf is None:
                        buf = state["momentum_buffer"] = g.clone()
                    else:
                        buf.mul_(mu).add_(g, alpha=1 - group["dampening"])
                    g = g + mu * buf if group["nesterov"] else buf
                p.sub_(g, alpha=group["lr"])
        return loss
        ### END SOLUTION
