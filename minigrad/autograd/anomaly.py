"""Anomaly detection: find the op that first produced a NaN or Inf, and where it was created (chapter 02).

A NaN in the loss says nothing about where it came from: it spreads through every op after it.
While anomaly mode is on (a ``Mode`` on the thread's stack, see ``minigrad.autograd.mode``), every
op remembers the lines of user code that created it, and every forward output and every backward
result is checked; the first non-finite value raises ``AnomalyError`` naming the op (``Log`` in
forward, ``SqrtBackward`` in backward) and that place. The checks cost time, so the mode is off by
default.
"""

from __future__ import annotations

import functools
import os
import sys
import traceback
from typing import Any, Callable

from minigrad.autograd.function import Function
from minigrad.autograd.mode import Mode, active, is_backward_running, pop, push
from minigrad.errors import AnomalyError
from minigrad._tensor import Tensor

__all__ = ["detect_anomaly", "is_anomaly_check_nan_enabled", "is_anomaly_enabled", "set_detect_anomaly"]

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_TRACE_DEPTH = 5  # user frames kept per op: enough to see the call chain, cheap to record


class AnomalyMode(Mode):
    """The mode itself: with ``check_nan=False`` ops only record where they were created."""

    def __init__(self, check_nan: bool) -> None:
        self.check_nan = check_nan

    def after_op(self, ctx: Any, args: tuple, kwargs: dict, outputs: Any) -> None:
        check_forward(ctx, outputs, self.check_nan)

    def node_backward(self, node: Any, grads: tuple) -> None:
        check_backward(node, grads, self.check_nan)


def is_anomaly_enabled() -> bool:
    return active(AnomalyMode) is not None


def is_anomaly_check_nan_enabled() -> bool:
    current = active(AnomalyMode)
    return current.check_nan if current is not None else True


def _switch(mode: AnomalyMode | None) -> AnomalyMode | None:
    """Put ``mode`` (None: no anomaly mode) in place of this thread's anomaly mode; returns the old one."""
    current = active(AnomalyMode)
    if current is not None:
        pop(current)
    if mode is not None:
        push(mode)
    return current


class detect_anomaly:
    """Turn anomaly mode on for a block (``with``) or a function (decorator), as in torch::

        with minigrad.autograd.detect_anomaly():
            loss = model(x).log().sum()   # AnomalyError here if log produced nan
            loss.backward()               # or here, naming the backward op and its forward line
    """

    def __init__(self, check_nan: bool = True) -> None:
        self.check_nan = check_nan

    def __enter__(self) -> None:
        self.prev = _switch(AnomalyMode(bool(self.check_nan)))

    def __exit__(self, *exc: Any) -> None:
        _switch(self.prev)

    def __call__(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with detect_anomaly(self.check_nan):
                return fn(*args, **kwargs)

        return wrapper


class set_detect_anomaly(detect_anomaly):
    """Set anomaly mode on or off: from now on (plain call) or for a block (``with``)."""

    def __init__(self, mode: bool, check_nan: bool = True) -> None:
        self.check_nan = check_nan
        self.prev = _switch(AnomalyMode(bool(check_nan)) if mode else None)  # a plain call acts at once, as in torch

    def __enter__(self) -> None:
        pass  # __init__ already switched the mode and remembered the previous one


# ---------------------------------------------------------------------------------------------
def check_forward(ctx: Function, outputs: Tensor | tuple, check_nan: bool = True) -> None:
    """After each op: remember where it was created, check its outputs."""
    ctx._trace = _origin()
    # An op run by a backward rule is left to check_backward, which names the node whose rule
    # failed (SqrtBackward) rather than the Div inside that rule.
    if not check_nan or is_backward_running():
        return
    for i, out in enumerate(outputs if type(outputs) is tuple else (outputs,)):
        bad = _non_finite(out)
        if bad:
            at = f" at {ctx._trace[-1].filename}:{ctx._trace[-1].lineno}" if ctx._trace else ""
            raise AnomalyError(
                f"Function '{ctx.name()}' returned {bad} values in its {i}th output (forward){at}.\n"
                f"Traceback of the call that created it:\n{_format(ctx._trace)}"
            )


def check_backward(node: Function, grads: tuple, check_nan: bool = True) -> None:
    """After each node's backward, with the gradients it returned."""
    if not check_nan:
        return
    for i, g in enumerate(grads):
        bad = _non_finite(g)
        if bad:
            trace = getattr(node, "_trace", None)
            raise AnomalyError(
                f"Function '{node.name()}Backward' returned {bad} values in its {i}th output.\n"
                f"Traceback of the forward call that created {node.name()}:\n{_format(trace)}"
            )


def _non_finite(t: Any) -> str | None:
    """'nan' or 'inf' when a float tensor holds such a value, else None."""
    if not isinstance(t, Tensor) or t.dtype.kind not in "fc":
        return None
    xp = t.device.xp
    if bool(xp.isnan(t.array).any()):
        return "nan"
    if bool(xp.isinf(t.array).any()):
        return "inf"
    return None


def _origin() -> traceback.StackSummary:
    """The innermost few frames outside the minigrad package, outermost first."""
    frames = []
    f = sys._getframe()
    while f is not None and len(frames) < _TRACE_DEPTH:
        if not f.f_code.co_filename.startswith(_PACKAGE_DIR):
            frames.append((f, f.f_lineno))
        f = f.f_back
    return traceback.StackSummary.extract(reversed(frames))


def _format(trace: traceback.StackSummary | None) -> str:
    if not trace:
        return "  (unknown: the op ran before anomaly detection was enabled)\n"
    return "".join(trace.format())
