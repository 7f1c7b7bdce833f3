"""Learning-rate schedules: how ``lr`` changes with the epoch (or step) count, as in PyTorch.

Each scheduler computes the learning rate of every parameter group in closed form from
``last_epoch`` and the group's initial lr, writes it into the optimizer's ``param_groups`` on
``step()``, and reports it with ``get_last_lr()``. Call ``scheduler.step()`` after
``optimizer.step()``. ``OneCycleLR`` and ``LinearLR`` cover the warm-up schedules of chapter 02.
"""

from __future__ import annotations

import bisect
import math
from typing import Any, Callable, Sequence

from minigrad.optim.optimizer import Optimizer


class LRScheduler:
    """Base class: subclasses implement ``lr_at(base_lr, epoch)`` (the lr of one group)."""

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1) -> None:
        self.optimizer = optimizer
        if last_epoch == -1:
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self.step()

    def lr_at(self, base_lr: float, epoch: int, group: int) -> float:
        raise NotImplementedError

    def step(self) -> None:
        self.last_epoch += 1
        self._last_lr = [self.lr_at(base, self.last_epoch, i) for i, base in enumerate(self.base_lrs)]
        for group, lr in zip(self.optimizer.param_groups, self._last_lr):
            group["lr"] = lr

    def get_last_lr(self) -> list[float]:
        return list(self._last_lr)

    def state_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "optimizer" and not callable(v)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.__dict__.update(state_dict)


class LambdaLR(LRScheduler):
    """``lr = base_lr * lr_lambda(epoch)`` (one function, or one per group)."""

    def __init__(self, optimizer: Optimizer, lr_lambda: Callable[[int], float] | Sequence[Callable],
                 last_epoch: int = -1) -> None:
        n = len(optimizer.param_groups)
        self.lr_lambdas = list(lr_lambda) if isinstance(lr_lambda, (list, tuple)) else [lr_lambda] * n
        if len(self.lr_lambdas) != n:
            raise ValueError(f"LambdaLR: expected {n} lr_lambdas, got {len(self.lr_lambdas)}")
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr, epoch, group):
        return base_lr * self.lr_lambdas[group](epoch)

    def state_dict(self) -> dict[str, Any]:
        return {k: v for k, v in super().state_dict().items() if k != "lr_lambdas"}


class StepLR(LRScheduler):
    """Multiply the lr by ``gamma`` every ``step_size`` epochs."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1) -> None:
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr, epoch, group):
        return base_lr * self.gamma ** (epoch // self.step_size)


class MultiStepLR(LRScheduler):
    """Multiply the lr by ``gamma`` at each epoch in ``milestones``."""

    def __init__(self, optimizer: Optimizer, milestones: Sequence[int], gamma: float = 0.1,
                 last_epoch: int = -1) -> None:
        self.milestones, self.gamma = sorted(milestones), gamma
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr, epoch, group):
        return base_lr * self.gamma ** bisect.bisect_right(self.milestones, epoch)


class ExponentialLR(LRScheduler):
    """Multiply the lr by ``gamma`` every epoch."""

    def __init__(self, optimizer: Optimizer, gamma: float, last_epoch: int = -1) -> None:
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr, epoch, group):
        return base_lr * self.gamma ** epoch


class CosineAnnealingLR(LRScheduler):
    """``eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2``."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1) -> None:
        self.T_max, self.eta_min = T_max, eta_min
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr, epoch, group):
        return self.eta_min + (base_lr - self.eta_min) * (1 + math.cos(math.pi * epoch / self.T_max)) / 2


class LinearLR(LRScheduler):
    """Linear warm-up: the factor goes from ``start_factor`` to ``end_factor`` over ``total_iters``."""

    def __init__(self, optimizer: Optimizer, start_factor: float = 1 / 3, end_factor: float = 1.0,
                 total_iters: int = 5, last_epoch: int = -1) -> None:
        if not 0 < start_factor <= 1 or not 0 <= end_factor <= 1:
            raise ValueError(f"LinearLR: factors must be in (0, 1], got {start_factor} and {end_factor}")
        self.start_factor, self.end_factor, self.total_iters = start_factor, end_factor, total_iters
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr, epoch, group):
        t = min(epoch, self.total_iters) / self.total_iters
        return base_lr * (self.start_factor + (self.end_factor - self.start_factor) * t)


class OneCycleLR(LRScheduler):
    """The 1cycle policy (Smith, 2018): warm up from ``max_lr / div_factor`` to ``max_lr`` over
    ``pct_start`` of the steps, then anneal to ``max_lr / (div_factor * final_div_factor)``; with
    ``cycle_momentum`` the momentum (or Adam's beta1) moves the opposite way. Step it every batch."""

    def __init__(self, optimizer: Optimizer, max_lr: float | Sequence[float], total_steps: int | None = None,
                 epochs: int | None = None, steps_per_epoch: int | None = None, pct_start: float = 0.3,
                 anneal_strategy: str = "cos", cycle_momentum: bool = True, base_momentum: float = 0.85,
                 max_momentum: float = 0.95, div_factor: float = 25.0, final_div_factor: float = 1e4,
                 three_phase: bool = False, last_epoch: int = -1) -> None:
        if total_steps is None:
            if epochs is None or steps_per_epoch is None:
                raise ValueError("OneCycleLR: give total_steps, or both epochs and steps_per_epoch")
            total_steps = epochs * steps_per_epoch
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"OneCycleLR: anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}")
        self.total_steps = total_steps
        self.anneal_strategy = anneal_strategy
        n = len(optimizer.param_groups)
        max_lrs = list(max_lr) if isinstance(max_lr, (list, tuple)) else [max_lr] * n
        end = float(pct_start * total_steps) - 1
        if three_phase:
            # (end step, start key, end key) of each phase, as in torch
            self.phases = [(end, "initial_lr", "max_lr"), (2 * end, "max_lr", "initial_lr"),
                           (total_steps - 1, "initial_lr", "min_lr")]
        else:
            self.phases = [(end, "initial_lr", "max_lr"), (total_steps - 1, "max_lr", "min_lr")]
        self.cycle_momentum = cycle_momentum
        self.use_beta1 = "betas" in optimizer.defaults
        for group, top in zip(optimizer.param_groups, max_lrs):
            if last_epoch == -1:
                group["initial_lr"] = top / div_factor
                group["max_lr"], group["min_lr"] = top, top / div_factor / final_div_factor
            if cycle_momentum:
                if "momentum" not in optimizer.defaults and not self.use_beta1:
                    raise ValueError("OneCycleLR: the optimizer has no momentum to cycle; pass cycle_momentum=False")
                group["max_momentum"], group["base_momentum"] = max_momentum, base_momentum
                self._set_momentum(group, max_momentum)
        super().__init__(optimizer, last_epoch)

    def _anneal(self, start: float, end: float, pct: float) -> float:
        if self.anneal_strategy == "cos":
            return end + (start - end) / 2 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def _set_momentum(self, group: dict, value: float) -> None:
        if self.use_beta1:
            group["betas"] = (value, *group["betas"][1:])
        else:
            group["momentum"] = value

    def lr_at(self, base_lr, epoch, group):
        if epoch > self.total_steps:
            raise ValueError(
                f"OneCycleLR: tried to step {epoch} times; total_steps is {self.total_steps}"
            )
        g = self.optimizer.param_groups[group]
        start_step = 0.0
        last = len(self.phases) - 1
        for i, (end_step, start_key, end_key) in enumerate(self.phases):
            if epoch <= end_step or i == last:
                break
            start_step = end_step
        pct = (epoch - start_step) / (end_step - start_step)
        if self.cycle_momentum:
            momentum = {"initial_lr": "max_momentum", "max_lr": "base_momentum", "min_lr": "max_momentum"}
            self._set_momentum(g, self._anneal(g[momentum[start_key]], g[momentum[end_key]], pct))
        return self._anneal(g[start_key], g[end_key], pct)
