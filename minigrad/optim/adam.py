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
        (t is 1 at the first step). ``ops, (w, g, t, m, v, *v_max) = self._bind(p, t, *state
        tensors)`` gives the values to compute on: the Tensors when a mode records the step (a
        trace), else the arrays inside them, with the matching ``ops`` (``sqrt``, ``maximum``,
        ``copy_``, ``scalar``); write the rule once, with in-place operators (``m *= b1``) that
        mean the same for both, and wrap a number computed from ``t`` in ``ops.scalar``. Weight
        decay: ``self.decoupled_weight_decay`` (AdamW) shrinks w by ``1 - lr * weight_decay``,
        else ``weight_decay * w`` joins the gradient. Update m, v and w in place: the tensors in
        ``state`` must stay the same objects. Both bias corrections apply from the first step;
        ``eps`` is added after the square root.
        """
        ### BEGIN SOLUTION chapter 02: Adam
        loss = self._evaluate(closure)
        for group in self.param_groups:
            b1, b2 = group["betas"]
            lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
            keys = ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if group["amsgrad"] else ())
            for p in self._params_with_grad(group):
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    for key in keys:
                        state[key] = zeros_like(p)
                t = self._count_step(state, p)
                ops, (w, g, t, m, v, *v_max) = self._bind(p, t, *(state[key] for key in keys))
                if group["maximize"]:
                    g = -g
                if wd and self.decoupled_weight_decay:
                    w *= 1 - lr * wd
                elif wd:
                    g = g + wd * w
                m *= b1
                m += g * (1 - b1)
                v *= b2
                v += g * g * (1 - b2)
                if v_max:
                    v = ops.copy_(v_max[0], ops.maximum(v_max[0], v))
                denom = ops.sqrt(v / ops.scalar(1 - b2 ** t)) + eps
                w -= m / denom * ops.scalar(lr / (1 - b1 ** t))
        return loss
        ### END SOLUTION


class AdamW(Adam):
    """Adam with decoupled weight decay (default 0.01, as in PyTorch)."""

    decoupled_weight_decay = True

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False,
                 maximize: bool = False) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize)

