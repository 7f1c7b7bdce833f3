"""``SparseAdam``: Adam for sparse gradients, updating only the rows a batch touched (chapter 01, lesson 06).

With ``nn.Embedding(sparse=True)`` a step's gradient holds a few hundred rows of a table of
millions. SparseAdam (PyTorch's rule) updates the moments and the parameter at those rows only;
the other rows keep their moments unchanged rather than decaying them, which is the one way it
differs from ``Adam`` and what makes a step cost O(rows touched) instead of O(table).
"""

from __future__ import annotations

import math
from typing import Callable, Iterable

from minigrad.autograd.grad_mode import no_grad
from minigrad.creation import zeros_like
from minigrad.errors import ArgumentError
from minigrad.optim.optimizer import Optimizer
from minigrad._tensor import Tensor


class SparseAdam(Optimizer):
    accepts_sparse = True

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, maximize: bool = False) -> None:
        if lr < 0 or eps < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"SparseAdam: invalid hyper-parameters lr={lr}, betas={betas}, eps={eps}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, maximize=maximize))

    @no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        loss = self._evaluate(closure)
        for group in self.param_groups:
            (b1, b2), eps = group["betas"], group["eps"]
            for p in self._params_with_grad(group):
                if not p.grad.is_sparse:
                    raise ArgumentError(f"SparseAdam: expected a sparse gradient, got a dense one of shape "
                                        f"{tuple(p.grad.shape)}; use optim.Adam for dense gradients")
                grad = p.grad.coalesce()  # each row once: the updates below read, then write, each row
                rows, g = tuple(grad._indices), grad.values().array
                if group["maximize"]:
                    g = -g
                state = self.state[p]
                if not state:
                    state["step"], state["exp_avg"], state["exp_avg_sq"] = 0, zeros_like(p), zeros_like(p)
                state["step"] += 1
                t = state["step"]
                m, v = state["exp_avg"].array, state["exp_avg_sq"].array
                m[rows] = m_rows = m[rows] + (1 - b1) * (g - m[rows])
                v[rows] = v_rows = v[rows] + (1 - b2) * (g * g - v[rows])
                step_size = group["lr"] * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
                p.array[rows] -= step_size * m_rows / (p.device.xp.sqrt(v_rows) + eps)
                p._bump_version()
        return loss
