"""RMSprop: divide the gradient by a running root-mean-square of recent gradients.

``v = alpha v + (1 - alpha) g^2``; centered RMSprop also tracks the mean ``a`` of g and uses the
variance ``v - a^2``; the step is ``p -= lr * g / (sqrt(v) + eps)``, optionally through a momentum
buffer. PyTorch's defaults: lr=1e-2, alpha=0.99, eps=1e-8. Chapter 02 compares the optimisers.
"""

from __future__ import annotations

from typing import Callable, Iterable

from minigrad.autograd.grad_mode import no_grad
from minigrad.creation import zeros_like
from minigrad.optim.optimizer import Optimizer
from minigrad._tensor import Tensor


class RMSprop(Optimizer):
    def __init__(self, params: Iterable, lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0.0, momentum: float = 0.0, centered: bool = False,
                 maximize: bool = False) -> None:
        if lr < 0 or eps < 0 or momentum < 0 or weight_decay < 0 or alpha < 0:
            raise ValueError(f"RMSprop: invalid hyper-parameters lr={lr}, alpha={alpha}, eps={eps}, "
                             f"momentum={momentum}, weight_decay={weight_decay}")
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay,
                                      momentum=momentum, centered=centered, maximize=maximize))

    @no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        loss = self._evaluate(closure)
        for group in self.param_groups:
            alpha, eps, mu = group["alpha"], group["eps"], group["momentum"]
            for p in self._params_with_grad(group):
                g = self._descent_gradient(p, group)
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["square_avg"] = zeros_like(p)
                    if mu:
                        state["momentum_buffer"] = zeros_like(p)
                    if group["centered"]:
                        state["grad_avg"] = zeros_like(p)
                self._count_step(state, p)
                v = state["square_avg"]
                v.mul_(alpha).add_(g * g, alpha=1 - alpha)
                if group["centered"]:
                    a = state["grad_avg"]
                    a.mul_(alpha).add_(g, alpha=1 - alpha)
                    avg = (v - a * a).sqrt() + eps
                else:
                    avg = v.sqrt() + eps
                if mu:
                    buf = state["momentum_buffer"]
                    buf.mul_(mu).add_(g / avg)
                    p.sub_(buf, alpha=group["lr"])
                else:
                    p.sub_(g / avg, alpha=group["lr"])
        return loss
