"""Softmax, log-softmax, and the losses built on them: cross-entropy and negative log-likelihood.

``exp`` overflows float32 above 88, so softmax subtracts each row's maximum first: the result is
unchanged (the shift cancels in the ratio) and every exponent is <= 0. log_softmax goes one step
further and never divides, which is why cross-entropy is computed from it rather than from
``log(softmax(x))`` (chapter 02, numerical stability). Each is one fused Function whose backward
is written with minigrad ops, so second derivatives work.
"""

from __future__ import annotations

from typing import Any

from minigrad import backend
from minigrad.backend import value_checks
from minigrad.errors import DTypeError, ShapeError
from minigrad.backend.meta import has_values
from minigrad.ops import c_loops
from minigrad.ops.compare import ne
from minigrad.ops.elementwise import Op, cast, exp, where
from minigrad.ops.op import GRADIENT_OP
from minigrad.ops.movement import broadcast_to, reshape
# Here ``sum`` is minigrad's, ``sum(x, dim, keepdim=False)`` on tensors: every sum in this module, the
# backward rules' included, reduces a tensor along the softmax's dim (Python's is builtins.sum).
from minigrad.ops.reduce import _axes, reduce_sum as sum
from minigrad._tensor import Tensor

__all__ = ["cross_entropy", "log_softmax", "nll_loss", "softmax"]


def _shifted(xp, a, dim):
    """``a - max(a, dim)`` in at least float32 (float16 exponents lose too much)."""
    if a.dtype.itemsize == 2:
        a = a.astype("float32")
    if a.size == 0:  # no max of an empty row; nothing to shift either
        return a.copy()
    return a - a.max(axis=dim, keepdims=True)


class Softmax(Op):
    kind = "reduction"
    batch = "dim"
    by_rows = True
    autocast = "fp32"

    @staticmethod
    def onnx(b, node, a, dim): return b.add("Softmax", [a], axis=dim)

    @staticmethod
    def forward(ctx, a, dim):
        ctx.dim = dim
        e = ctx.xp.exp(_shifted(ctx.xp, a, dim))
        e /= e.sum(axis=dim, keepdims=True)
        out = e.astype(a.dtype, copy=False)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g):
        """With ``y = softmax(a)`` saved: ``da = y * (g - sum(g * y, dim))``, the sum kept as a
        size-1 axis (in this module ``sum`` is minigrad's: ``sum(x, dim, keepdim=True)``). ``ctx.dim``
        is the softmax's axis. The contract of every rule: ``minigrad.autograd.Function.backward``.
        ``ctx.ops.sum(x, dim, keepdim=True)`` sums under either binding.
        """
        ### BEGIN SOLUTION chapter 02: Softmax.backward
        (y,) = ctx.saved_tensors
        return y * (g - ctx.ops.sum(g * y, ctx.dim, keepdim=True)), None
        ### END SOLUTION


class LogSoftmax(Op):
    kind = "reduction"
    batch = "dim"
    by_rows = True
    autocast = "fp32"

    @staticmethod
    def onnx(b, node, a, dim): return b.add("LogSoftmax", [a], axis=dim)

    @staticmethod
    def forward(ctx, a, dim):
        xp = ctx.xp
        ctx.dim = dim
        out = c_loops.log_softmax(a, dim)  # one C loop over each row, where a compiler built it
        if out is None:
            z = _shifted(xp, a, dim)
            z -= xp.log(xp.exp(z).sum(axis=dim, keepdims=True))
            out = z.astype(a.dtype, copy=False)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g):
        """With ``y = log_softmax(a)`` saved: ``da = g - exp(y) * sum(g, dim)``, the sum kept as a
        size-1 axis (minigrad's ``sum(x, dim, keepdim=True)``). ``ctx.dim`` is the axis. The contract of every rule: ``minigrad.autograd.Function.backward``.
        ``ctx.ops.sum`` and ``ctx.ops.exp`` work under either binding.
        """
        ### BEGIN SOLUTION chapter 02: LogSoftmax.backward
        (y,) = ctx.saved_tensors
        return g - ctx.ops.exp(y) * ctx.ops.sum(g, ctx.dim, keepdim=True), None
        ### END SOLUTION


def _softmax_dim(x: Tensor, dim: int, op: str) -> int | None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}: expected a Tensor, got {type(x).__name__}")
    if x.dtype.kind != "f":
        raise DTypeError(
            f"{op}: expected a floating point tensor, got dtype {x.dtype}; convert it first, e.g. x.float()"
        )
    if not isinstance(dim, int):
        raise TypeError(f"{op}: dim must be an int, got {dim!r}")
    axes = _axes(x, dim, op)
    return axes[0] if axes else None


def softmax(x: Tensor, dim: int) -> Tensor:
    """``exp(x) / sum(exp(x), dim)``, shifted by the row maximum so it never overflows."""
    return Softmax.apply(x, _softmax_dim(x, dim, "softmax"))


def log_softmax(x: Tensor, dim: int) -> Tensor:
    """``x - logsumexp(x, dim)``: finite wherever ``softmax`` would round to 0."""
    return LogSoftmax.apply(x, _softmax_dim(x, dim, "log_softmax"))


# -- losses --------------------------------------------------------------------------------------
class Pick(Op):
    """``x[n, t[n, ...], ...]``: the entry of each sample's class along dim 1 (the NLL's gather).
    The targets are an input, not a constant, so a traced training step replays new targets."""

    kind = "movement"
    onnx_refused = "the loss's gather of each target class; export the model without its loss"
    autocast = "fp32"

    @staticmethod
    def forward(ctx, x, t):
        ctx.classes = x.shape[1]
        ctx.save_for_backward(t)
        return ctx.xp.take_along_axis(x, t[:, None], axis=1)[:, 0]

    @staticmethod
    def backward(ctx, g):
        """The gradient of ``x`` has x's shape ``(N, C, ...)`` (``ctx.classes`` is C): zeros, with
        ``g[n, ...]`` at class ``t[n, ...]`` along dim 1 (forward saved the targets ``t``). The targets
        get ``None``. The contract of every rule: ``minigrad.autograd.Function.backward``.
        Run another op with ``ctx.ops.apply(OtherOp, *args)``.
        """
        ### BEGIN SOLUTION chapter 02: Pick.backward (cross-entropy's gather)
        return ctx.ops.apply(Place, g, ctx.saved_tensors[0], ctx.classes), None
        ### END SOLUTION


class Place(Op):
    """Zeros of shape (N, C, ...) holding ``g[n, ...]`` at class ``t[n, ...]`` along dim 1."""

    kind = "movement"
    onnx_refused = GRADIENT_OP

    @staticmethod
    def forward(ctx, g, t, classes):
        out = ctx.xp.zeros((g.shape[0], classes) + g.shape[1:], dtype=g.dtype)
        ctx.xp.put_along_axis(out, t[:, None], g[:, None], axis=1)
        ctx.save_for_backward(t)
        return out

    @staticmethod
    def backward(ctx, gg):
        """Forward took ``(g, t, classes)`` and saved the targets ``t``; ``t`` and ``classes`` get
        ``None``. Each element of ``g`` went to one place of the output, so its gradient is
        ``gg`` at that place. The contract of every rule: ``minigrad.autograd.Function.backward``.
        Run another op with ``ctx.ops.apply(OtherOp, *args)``.
        """
        ### BEGIN SOLUTION chapter 02: Place.backward
        return ctx.ops.apply(Pick, gg, ctx.saved_tensors[0]), None, None
        ### END SOLUTION


def _class_weights(weight: Any, x: Tensor, op: str) -> Tensor | None:
    """Per-class weights as a tensor of the input's dtype, shaped (1, C, 1, ...) to broadcast."""
    classes = x.shape[1]
    if weight is None:
        return None
    w = weight if isinstance(weight, Tensor) else Tensor(weight, device=x.device)
    if w.shape != (classes,):
        raise ShapeError(f"{op}: weight must have shape ({classes},), one entry per class, got {tuple(w.shape)}")
    return reshape(cast(w.detach(), x.dtype), (1, classes) + (1,) * (x.ndim - 2))


def _check_reduction(reduction: str, op: str) -> None:
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"{op}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def _index_targets(x: Tensor, target: Tensor, ignore_index: int, op: str) -> tuple[Tensor, Tensor]:
    """Check class-index targets; return them with ignored entries set to class 0, and the mask
    of entries that count (both tensors computed by ops, so tracing keeps them as inputs)."""
    if target.dtype.kind not in "iu":
        raise DTypeError(f"{op}: class-index targets must be an integer tensor, got dtype {target.dtype}")
    expected = x.shape[:1] + x.shape[2:]
    if target.shape != expected:
        raise ShapeError(
            f"{op}: for input of shape {tuple(x.shape)} the target must have shape {expected}, "
            f"got {tuple(target.shape)}"
        )
    t = target.array
    counts = t != ignore_index
    classes = x.shape[1]
    bad = counts & ((t < 0) | (t >= classes))
    if has_values(t):  # on a GPU the check is read at the next host read (minigrad.backend.value_checks)
        value_checks.check(target.device.xp, bad.any(), IndexError, lambda: (
            f"{op}: target {int(t[bad].ravel()[0])} is out of range for {classes} classes "
            f"(expected 0 <= target < {classes}, or ignore_index={ignore_index})"))
    keep = ne(target, ignore_index)
    return cast(where(keep, target, 0), backend.int64), keep


def _nll(logp: Tensor, target: Tensor, w: Tensor | None, ignore_index: int, reduction: str, op: str):
    """The weighted negative log-likelihood of index targets, and the per-element weights."""
    t, keep = _index_targets(logp, target, ignore_index, op)
    per = cast(keep, logp.dtype)
    if w is not None:
        per = per * Pick.apply(broadcast_to(w, logp.shape), t)
    loss = -per * Pick.apply(logp, t)
    if reduction == "none":
        return loss, per, keep
    # mean divides by the total weight; all targets ignored gives 0/0 = nan, as in PyTorch
    return (sum(loss) if reduction == "sum" else sum(loss) / sum(per)), per, keep


def _batched(x: Tensor, target: Tensor, op: str):
    """Treat an unbatched input of shape (C,) as a batch of one."""
    if x.ndim == 0:
        raise ShapeError(f"{op}: input must have a class dimension, got a 0-D tensor")
    if x.ndim == 1:
        return reshape(x, (1,) + x.shape), reshape(target, (1,) + target.shape), True
    return x, target, False


def nll_loss(input: Tensor, target: Tensor, weight: Tensor | None = None, ignore_index: int = -100,
             reduction: str = "mean") -> Tensor:
    """Negative log-likelihood of class indices, for ``input`` holding log-probabilities
    (N, C, d1, ...) or (C,); ``target`` has shape (N, d1, ...) or ()."""
    _check_reduction(reduction, "nll_loss")
    x, t, unbatched = _batched(input, target, "nll_loss")
    out = _nll(x, t, _class_weights(weight, x, "nll_loss"), ignore_index, reduction, "nll_loss")[0]
    return reshape(out, ()) if unbatched and reduction == "none" else out


def cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None, ignore_index: int = -100,
                  reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
    """``nll_loss(log_softmax(input, 1), target)`` with PyTorch's options. ``target`` holds class
    indices (shape (N, d1, ...)) or class probabilities (the input's shape)."""
    op = "cross_entropy"
    _check_reduction(reduction, op)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"{op}: label_smoothing must be in [0, 1], got {label_smoothing}")
    x, t, unbatched = _batched(input, target, op)
    wb = _class_weights(weight, x, op)
    classes = x.shape[1]
    logp = log_softmax(x, 1)
    if t.dtype.kind == "f":
        if t.shape != x.shape:
            raise ShapeError(
                f"{op}: class-probability targets must have the input's shape {tuple(x.shape)}, got {tuple(t.shape)}"
            )
        if label_smoothing > 0:
            t = t * (1 - label_smoothing) + label_smoothing / classes
        term = logp * t if wb is None else logp * t * wb
        if reduction == "none":
            out = -sum(term, 1)
        else:
            out = -sum(term) if reduction == "sum" else -sum(term) / (x.array.size // max(classes, 1))
    else:
        out, per, keep = _nll(logp, t, wb, ignore_index, reduction, op)
        if label_smoothing > 0:
            smooth = -sum(logp if wb is None else logp * wb, 1) * cast(keep, logp.dtype)
            if reduction == "mean":
                smooth = sum(smooth) / sum(per)
            elif reduction == "sum":
                smooth = sum(smooth)
            out = out * (1 - label_smoothing) + smooth * (label_smoothing / classes)
    return reshape(out, ()) if unbatched and reduction == "none" else out
