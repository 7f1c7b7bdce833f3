"""Adam and AdamW: per-parameter step sizes from running moments of the gradient (chapter 02).

``m = b1 m + (1 - b1) g``, ``v = b2 v + (1 - b2) g^2``; with the bias corrections
``c1 = 1 - b1^t`` and ``c2 = 1 - b2^t`` the step is ``p -= lr / c1 * m / (sqrt(v / c2) + eps)``.
Adam adds ``weight_decay * p`` to the gradient (L2 regularisation); AdamW instead shrinks the
weights directly, ``p *= 1 - lr * weight_decay`` (decoupled weight decay). ``amsgrad`` uses the
running maximum of ``v``.
"""

from __future__ import annotations

from typing import Callable, Iterable

from minigrad.autograd.grad_mode import no_grad
from minigrad.creation import zeros_like
from minigrad.ops import maximum
from minigrad.optim.optimizer import Optimizer
from minigrad._tensor import Tensor


class Adam(Optimizer):
    decoupled_weight_decay = False

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False,
                 maximize: bool = False) -> None:
        if lr < 0 or eps < 0 or weight_decay < 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(
                f"{type(self).__name__}: invalid hyper-parameters lr={lr}, betas={betas}, eps={eps}, "
                f"weight_decay={weight_decay}"
            )
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                      amsgrad=amsgrad, maximize=maximize))

    @no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        """One Adam step on every parameter that has a gradient (the formulas: this module's docstring).

        Returns ``self._evaluate(closure)``, called first. Per group: ``lr``, ``betas``, ``eps``,
        ``weight_decay``, ``amsgrad``, ``maximize`` (negate the gradient). Per parameter
        (``self._params_with_grad(group)``), ``self.state[p]`` is a dict with PyTorch's keys, which
        ``state_dict()`` saves and the tests read: ``"exp_avg"`` (m) and ``"exp_avg_sq"`` (v),
        tensors of p's shape starting at zeros, ``"max_exp_avg_sq"`` with ``amsgrad``, and
        ``"step"``, set to 0 in a new state and counted by ``t = self._count_step(state, p)``
        (t is 1 at the first step). Weight decay: ``self.decoupled_weight_decay`` (AdamW) shrinks
        p by ``1 - lr * weight_decay``, else ``weight_decay * p`` joins the gradient. Update m, v
        and p in place (``mul_``, ``add_(..., alpha=)``, ``copy_``, ``sub_``): the tensors in
        ``state`` must stay the same objects. Both bias corrections apply from the first step;
        ``eps`` is added after the square root.
        """
        ### BEGIN SOLUTION chapter 02: Adam
        loss = self._evaluate(closure)
        for group in self.param_groups:
            b1, b2 = group["betas"]
            lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
            for p in self._params_with_grad(group):
                g = -p.grad if group["maximize"] else p.grad
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = zeros_like(p)
                    state["exp_avg_sq"] = zeros_like(p)
                    if group["amsgrad"]:
                        state["max_exp_avg_sq"] = zeros_like(p)
                t = self._count_step(state, p)
                if wd and self.decoupled_weight_decay:
                    p.mul_(1 - lr * wd)
                elif wd:
                    g = g + wd * p
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(b1).add_(g, alpha=1 - b1)
                v.mul_(b2).add_(g * g, alpha=1 - b2)
                if group["amsgrad"]:
                    state["max_exp_avg_sq"].copy_(maximum(state["max_exp_avg_sq"], v))
                    v = state["max_exp_avg_sq"]
                denom = (v / (1 - b2 ** t)).sqrt() + eps
                p.sub_(m / denom * (lr / (1 - b1 ** t)))
        return loss
        ### END SOLUTION


class AdamW(Adam):
    """Adam with decoupled weight decay (default 0.01, as in PyTorch)."""

    decoupled_weight_decay = True

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False,
                 maximize: bool = False) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize)

