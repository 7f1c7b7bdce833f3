"""Grad mode: the one switch that decides whether ops record the graph (chapter 02).

``no_grad()``, ``enable_grad()`` and ``set_grad_enabled(mode)`` work as context managers and as
decorators, like PyTorch's. The flag is per thread, as in PyTorch (a context variable, which
``Function.apply`` reads), so a thread that runs ops (the executor's pool) has its own.
"""

from __future__ import annotations

import functools
from contextvars import ContextVar
from typing import Any, Callable

_enabled: ContextVar[bool] = ContextVar("minigrad_grad_enabled", default=True)
is_grad_enabled = _enabled.get  # () -> bool; read by Function.apply on every op that could record


class _GradMode:
    mode: bool

    def __enter__(self) -> None:
        self.prev = _enabled.get()
        _enabled.set(self.mode)

    def __exit__(self, *exc: Any) -> None:
        _enabled.set(self.prev)

    def __call__(self, fn: Callable) -> Callable:
        mode = self.mode

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with set_grad_enabled(mode):
                return fn(*args, **kwargs)

        return wrapper


class no_grad(_GradMode):
    """Run without recording the graph: ``with minigrad.no_grad(): p -= lr * p.grad``."""

    mode = False


class enable_grad(_GradMode):
    """Record the graph again inside a ``no_grad`` block."""

    mode = True


class set_grad_enabled(_GradMode):
    """Set grad mode for a block (``with``), a function (decorator) or from now on (plain call)."""

    def __init__(self, mode: bool) -> None:
        self.mode = bool(mode)
        self.prev = _enabled.get()
        _enabled.set(self.mode)  # a plain call takes effect at once, as in torch

    def __enter__(self) -> None:
        pass  # __init__ already switched the mode and remembered the previous one

    def __call__(self, fn: Callable) -> Callable:
        _enabled.set(self.prev)  # used as a decorator: undo the plain-call effect
        return super().__call__(fn)


class inference_mode(_GradMode):
    """``torch.inference_mode``: in minigrad the same as ``no_grad`` (there are no separate
    inference tensors to make). ``inference_mode(False)`` records again; usable bare as a decorator."""

    def __new__(cls, mode: Any = True) -> Any:
        if callable(mode):  # @inference_mode without parentheses
            return cls()(mode)
        return super().__new__(cls)

    def __init__(self, mode: bool = True) -> None:
        self.mode = not mode
