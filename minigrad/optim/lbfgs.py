"""L-BFGS: a quasi-Newton method that builds a curvature model from recent steps (chapter 02).

Newton's method steps by ``-H^{-1} g``; L-BFGS never forms the Hessian ``H``. It keeps the last
``history_size`` pairs ``s = x_{k+1} - x_k`` and ``y = g_{k+1} - g_k`` and applies the inverse
curvature they imply with the two-loop recursion. Each ``step(closure)`` runs up to ``max_iter``
iterations, re-evaluating the loss through the closure, optionally with a strong-Wolfe line
search. This follows PyTorch's implementation (itself after minFunc) step for step, so the
iterates match it.
"""

from __future__ import annotations

from typing import Callable, Iterable

from minigrad.autograd import mode
from minigrad.autograd.grad_mode import enable_grad, no_grad
from minigrad.ops import cat
from minigrad.optim.optimizer import Optimizer
from minigrad._tensor import Tensor


def _dot(a: Tensor, b: Tensor) -> float:
    return (a * b).sum().item()


def _amax_abs(a: Tensor) -> float:
    return a.abs().max().item()


def _cubic_interpolate(x1, f1, g1, x2, f2, g2, bounds=None) -> float:
    """Minimiser of the cubic through (x1, f1, g1) and (x2, f2, g2), clipped to ``bounds``."""
    lo, hi = bounds if bounds is not None else (min(x1, x2), max(x1, x2))
    d1 = g1 + g2 - 3 * (f1 - f2) / (x1 - x2)
    d2_square = d1 ** 2 - g1 * g2
    if d2_square < 0:
        return (lo + hi) / 2.0
    d2 = d2_square ** 0.5
    if x1 <= x2:
        pos = x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2 * d2))
    else:
        pos = x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2 * d2))
    return min(max(pos, lo), hi)


def _strong_wolfe(obj_func, x, t, d, f, g, gtd, c1=1e-4, c2=0.9, tolerance_change=1e-9, max_ls=25):
    """Find a step ``t`` along ``d`` with sufficient decrease (c1) and curvature (c2): first
    bracket an interval that contains one, then zoom into it by cubic interpolation."""
    d_norm = _amax_abs(d)
    f_new, g_new = obj_func(x, t, d)
    evals = 1
    gtd_new = _dot(g_new, d)
    t_prev, f_prev, g_prev, gtd_prev = 0.0, f, g, gtd
    done = False
    ls_iter = 0
    while ls_iter < max_ls:
        too_far = f_new > f + c1 * t * gtd or (ls_iter > 1 and f_new >= f_prev)
        if not too_far and abs(gtd_new) <= -c2 * gtd:
            bracket, bracket_f, bracket_g = [t], [f_new], [g_new]
            done = True
            break
        if too_far or gtd_new >= 0:
            bracket, bracket_f = [t_prev, t], [f_prev, f_new]
            bracket_g, bracket_gtd = [g_prev, g_new], [gtd_prev, gtd_new]
            break
        min_step, max_step = t + 0.01 * (t - t_prev), t * 10
        t_prev, t = t, _cubic_interpolate(t_prev, f_prev, gtd_prev, t, f_new, gtd_new, (min_step, max_step))
        f_prev, g_prev, gtd_prev = f_new, g_new, gtd_new
        f_new, g_new = obj_func(x, t, d)
        evals += 1
        gtd_new = _dot(g_new, d)
        ls_iter += 1
    if ls_iter == max_ls:
        bracket, bracket_f, bracket_g = [0.0, t], [f, f_new], [g, g_new]
        bracket_gtd = [gtd, gtd_new]

    insuf_progress = False
    low, high = (0, 1) if bracket_f[0] <= bracket_f[-1] else (1, 0)
    while not done and ls_iter < max_ls:
        if abs(bracket[1] - bracket[0]) * d_norm < tolerance_change:
            break
        t = _cubic_interpolate(bracket[0], bracket_f[0], bracket_gtd[0], bracket[1], bracket_f[1], bracket_gtd[1])
        # keep away from the ends of the bracket, or the search stalls
        eps = 0.1 * (max(bracket) - min(bracket))
        if min(max(bracket) - t, t - min(bracket)) < eps:
            if insuf_progress or t >= max(bracket) or t <= min(bracket):
                t = max(bracket) - eps if abs(t - max(bracket)) < abs(t - min(bracket)) else min(bracket) + eps
                insuf_progress = False
            else:
                insuf_progress = True
        else:
            insuf_progress = False
        f_new, g_new = obj_func(x, t, d)
        evals += 1
        gtd_new = _dot(g_new, d)
        ls_iter += 1
        if f_new > f + c1 * t * gtd or f_new >= bracket_f[low]:
            bracket[high], bracket_f[high], bracket_g[high], bracket_gtd[high] = t, f_new, g_new, gtd_new
            low, high = (0, 1) if bracket_f[0] <= bracket_f[1] else (1, 0)
        else:
            if abs(gtd_new) <= -c2 * gtd:
                done = True
            elif gtd_new * (bracket[high] - bracket[low]) >= 0:
                bracket[high], bracket_f[high] = bracket[low], bracket_f[low]
                bracket_g[high], bracket_gtd[high] = bracket_g[low], bracket_gtd[low]
            bracket[low], bracket_f[low], bracket_g[low], bracket_gtd[low] = t, f_new, g_new, gtd_new
    return bracket_f[low], bracket_g[low], bracket[low], evals


class LBFGS(Optimizer):
    def __init__(self, params: Iterable, lr: float = 1.0, max_iter: int = 20, max_eval: int | None = None,
                 tolerance_grad: float = 1e-7, tolerance_change: float = 1e-9, history_size: int = 100,
                 line_search_fn: str | None = None) -> None:
        if lr < 0:
            raise ValueError(f"LBFGS: invalid learning rate {lr}")
        if line_search_fn not in (None, "strong_wolfe"):
            raise ValueError(f"LBFGS: line_search_fn must be None or 'strong_wolfe', got {line_search_fn!r}")
        super().__init__(params, dict(lr=lr, max_iter=max_iter, max_eval=max_eval or max_iter * 5 // 4,
                                      tolerance_grad=tolerance_grad, tolerance_change=tolerance_change,
                                      history_size=history_size, line_search_fn=line_search_fn))
        if len(self.param_groups) != 1:
            raise ValueError("LBFGS doesn't support per-parameter options (parameter groups)")
        self._params = self.param_groups[0]["params"]

    # the parameters seen as one flat vector
    def _flat_grad(self) -> Tensor:
        return cat([p.grad.reshape(-1) if p.grad is not None else p.detach().reshape(-1) * 0
                    for p in self._params])

    def _add_grad(self, step: float, update: Tensor) -> None:
        offset = 0
        for p in self._params:
            n = p.numel()
            p.add_(update[offset:offset + n].reshape(p.shape), alpha=step)
            offset += n

    def _directional_evaluate(self, closure, x, t, d):
        self._add_grad(t, d)
        loss = float(closure())
        flat_grad = self._flat_grad()
        for p, saved in zip(self._params, x):
            p.copy_(saved)
        return loss, flat_grad

    @no_grad()
    def step(self, closure: Callable[[], Tensor]) -> Tensor:  # type: ignore[override]
        """Run up to ``max_iter`` iterations; ``closure`` zeroes grads, computes the loss, calls backward."""
        mode.reads_python_state(self)
        closure = enable_grad()(closure)
        group = self.param_groups[0]
        lr, max_iter, max_eval = group["lr"], group["max_iter"], group["max_eval"]
        tol_grad, tol_change = group["tolerance_grad"], group["tolerance_change"]
        state = self.state[self._params[0]]
        state.setdefault("func_evals", 0)
        state.setdefault("n_iter", 0)

        orig_loss = closure()
        loss = float(orig_loss)
        evals = 1
        state["func_evals"] += 1
        flat_grad = self._flat_grad()
        if _amax_abs(flat_grad) <= tol_grad:
            return orig_loss

        d, t = state.get("d"), state.get("t")
        old_dirs, old_stps, ro = state.get("old_dirs"), state.get("old_stps"), state.get("ro")
        H_diag, prev_flat_grad = state.get("H_diag"), state.get("prev_flat_grad")
        n_iter = 0
        while n_iter < max_iter:
            n_iter += 1
            state["n_iter"] += 1
            if state["n_iter"] == 1:
                d, old_dirs, old_stps, ro, H_diag = -flat_grad, [], [], [], 1.0
            else:
                y, s = flat_grad - prev_flat_grad, d * t
                ys = _dot(y, s)
                if ys > 1e-10:  # only pairs with positive curvature keep the model positive definite
                    if len(old_dirs) == group["history_size"]:
                        old_dirs.pop(0), old_stps.pop(0), ro.pop(0)
                    old_dirs.append(y), old_stps.append(s), ro.append(1.0 / ys)
                    H_diag = ys / _dot(y, y)
                # two-loop recursion: d = -H^{-1} g from the stored (s, y) pairs
                al = [0.0] * len(old_dirs)
                q = -flat_grad
                for i in range(len(old_dirs) - 1, -1, -1):
                    al[i] = _dot(old_stps[i], q) * ro[i]
                    q = q - al[i] * old_dirs[i]
                d = q * H_diag
                for i in range(len(old_dirs)):
                    be_i = _dot(old_dirs[i], d) * ro[i]
                    d = d + (al[i] - be_i) * old_stps[i]
            prev_flat_grad = flat_grad.clone()
            prev_loss = loss
            t = min(1.0, 1.0 / flat_grad.abs().sum().item()) * lr if state["n_iter"] == 1 else lr
            gtd = _dot(flat_grad, d)
            if gtd > -tol_change:  # not a descent direction
                break

            ls_evals = 0
            if group["line_search_fn"] == "strong_wolfe":
                x_init = [p.clone() for p in self._params]
                loss, flat_grad, t, ls_evals = _strong_wolfe(
                    lambda x, t, d: self._directional_evaluate(closure, x, t, d),
                    x_init, t, d, loss, flat_grad, gtd, max_ls=max_eval - evals)
                self._add_grad(t, d)
                opt_cond = _amax_abs(flat_grad) <= tol_grad
            else:
                self._add_grad(t, d)
                opt_cond = False
                if n_iter != max_iter:
                    loss = float(closure())
                    flat_grad = self._flat_grad()
                    opt_cond = _amax_abs(flat_grad) <= tol_grad
                    ls_evals = 1
            evals += ls_evals
            state["func_evals"] += ls_evals
            if (n_iter == max_iter or evals >= max_eval or opt_cond
                    or _amax_abs(d * t) <= tol_change or abs(loss - prev_loss) < tol_change):
                break

        state.update(d=d, t=t, old_dirs=old_dirs, old_stps=old_stps, ro=ro, H_diag=H_diag,
                     prev_flat_grad=prev_flat_grad, prev_loss=prev_loss)
        return orig_loss
