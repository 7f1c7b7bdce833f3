"""Adadelta: a per-coordinate step size from running averages of squared gradients and of
squared updates, so the update has the units of the parameter and needs almost no tuning.

``v = rho v + (1 - rho) g^2``; ``delta = sqrt(u + eps) / sqrt(v + eps) * g``;
``u = rho u + (1 - rho) delta^2``; ``p -= lr * delta``. PyTorch's defaults: lr=1.0, rho=0.9,
eps=1e-6 (the pytorch/examples MNIST script trains with it). Chapter 02 compares the optimisers.
"""

from __future__ import annotations

from typing import Callable, Iterable

from minigrad.autograd.grad_mode import no_grad
from minigrad.creation import zeros_like
from minigrad.optim.optimizer import Optimizer
from minigrad._tensor import Tensor


class Adadelta(Optimizer):
    def __init__(self, params: Iterable, lr: float = 1.0, rho: float = 0.9, eps: float = 1e-6,
                 weight_decay: float = 0.0, *, maximize: bool = False) -> None:
        if lr < 0 or eps < 0 or weight_decay < 0 or not 0.0 <= rho <= 1.0:
            raise ValueError(f"Adadelta: invalid hyper-parameters lr={lr}, rho={rho}, eps={eps}, "
                             f"weight_decay={weight_decay}")
        super().__init__(params, dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay, maximize=maximize))

    @no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        loss = self._evaluate(closure)
        for group in self.param_groups:
            rho, eps = group["rho"], group["eps"]
            for p in self._params_with_grad(group):
                g = self._descent_gradient(p, group)
                state = self.state[p]
                if not state:
                    state["step"], state["square_avg"], state["acc_delta"] = 0, zeros_like(p), zeros_like(p)
                self._count_step(state, p)
                v, u = state["square_avg"], state["acc_delta"]
                v.mul_(rho).add_(g * g, alpha=1 - rho)
                delta = (u + eps).sqrt() / (v + eps).sqrt() * g
                u.mul_(rho).add_(delta * delta, alpha=1 - rho)
                p.sub_(delta, alpha=group["lr"])
        return loss
