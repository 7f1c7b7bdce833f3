"""Stochastic gradient descent with momentum, dampening, Nesterov momentum and weight decay.

The update is PyTorch's: ``g = grad + wd * p``; with momentum, ``buf = mu * buf + (1 - dampening) * g``
(the first step sets ``buf = g``) and ``g = g + mu * buf`` (Nesterov) or ``g = buf``; then
``p -= lr * g``. Chapter 02 trains its first models with it.
"""

from __future__ import annotations

from typing import Callable, Iterable

from minigrad.autograd.grad_mode import no_grad
from minigrad.errors import ArgumentError
from minigrad.optim.optimizer import Optimizer
from minigrad.ops.sparse import add_
from minigrad._tensor import Tensor


class SGD(Optimizer):
    accepts_sparse = True

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
        """One SGD step on every parameter that has a gradient (the formulas: this module's docstring).

        Returns ``self._evaluate(closure)``, called first. Per group: ``lr``, ``momentum`` (mu),
        ``dampening``, ``weight_decay``, ``nesterov``, ``maximize`` (negate the gradient). Per
        parameter (``self._params_with_grad(group)``; a sparse gradient goes to
        ``self._sparse_step(p, group)``): ``g = grad + weight_decay * p``; with momentum, the
        buffer ``self.state[p]["momentum_buffer"]`` (PyTorch's key, saved by ``state_dict()``) is
        a copy of g at the first step and ``buf = mu * buf + (1 - dampening) * g`` after, in
        place; the step direction is ``buf``, or ``g + mu * buf`` with ``nesterov``. Then
        ``p -= lr * direction``, in place. The momentum is a running sum, not an average.
        """
        ### BEGIN SOLUTION chapter 02: SGD with momentum
        loss = self._evaluate(closure)
        for group in self.param_groups:
            mu, wd = group["momentum"], group["weight_decay"]
            for p in self._params_with_grad(group):
                if p.grad.is_sparse:
                    self._sparse_step(p, group)
                    continue
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

    def _sparse_step(self, p: Tensor, group: dict) -> None:
        """A sparse gradient (``nn.Embedding(sparse=True)``) moves only its rows. The momentum
        buffer is sparse too, so untouched rows cost nothing, with the same values as the dense
        rule: ``mu * buf`` decays every stored row. Weight decay would touch every row; PyTorch
        refuses it with sparse gradients, and so does minigrad."""
        if group["weight_decay"]:
            raise ArgumentError("SGD: weight_decay is not supported with sparse gradients (it would update "
                                f"every row); got weight_decay={group['weight_decay']}")
        g = self._descent_gradient(p, group)
        mu = group["momentum"]
        if mu:
            state = self.state[p]
            buf = state.get("momentum_buffer")
            buf = g.coalesce() if buf is None else (buf * mu + g * (1 - group["dampening"])).coalesce()
            state["momentum_buffer"] = buf
            g = (g + buf * mu).coalesce() if group["nesterov"] else buf
        add_(p, g, -group["lr"])
