"""Gradient utilities: clipping and flattening parameters into one vector (chapter 02).

``clip_grad_norm_`` rescales all gradients together when their joint norm exceeds ``max_norm``,
keeping the update's direction while bounding its size: the standard guard against exploding
gradients in RNNs and transformers. A sparse gradient (``nn.Embedding(sparse=True)``) counts with
its coalesced values, the norm of the dense gradient it stands for, and is scaled in its values.
``parameters_to_vector`` views a model as one point in parameter space, which second-order
methods and line searches work with.
"""

from __future__ import annotations

import math
from typing import Iterable

from minigrad import ops as _ops
from minigrad.autograd.grad_mode import no_grad
from minigrad.ops.recurrent import Stack
from minigrad._tensor import Tensor

__all__ = ["clip_grad_norm_", "clip_grad_value_", "parameters_to_vector", "vector_to_parameters"]


def _as_list(parameters: Tensor | Iterable[Tensor]) -> list[Tensor]:
    return [parameters] if isinstance(parameters, Tensor) else list(parameters)


def _dense(g: Tensor) -> Tensor:
    """The Tensor whose norm is the gradient's: a sparse gradient's coalesced values (an index
    looked up twice holds two rows that sum to one, as ``torch.norm`` of a sparse tensor counts it)."""
    return g.coalesce().values() if g.is_sparse else g


def _norm(t: Tensor, norm_type: float) -> Tensor:
    if norm_type == math.inf:
        return t.abs().max()
    if norm_type == 2.0:
        return (t * t).sum().sqrt()
    return (t.abs() ** norm_type).sum() ** (1.0 / norm_type)


def clip_grad_norm_(parameters: Tensor | Iterable[Tensor], max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False, foreach: bool | None = None) -> Tensor:
    """Scale the gradients in place so their joint ``norm_type``-norm is at most ``max_norm``.

    Returns the total norm before clipping (a 0-d tensor), as torch does. ``foreach`` is accepted
    as torch's: minigrad has one implementation, which already joins the per-gradient norms in
    one node, so every value gives the same result (torch's foreach path exists on CPU and CUDA).
    """
    grads = [p.grad for p in _as_list(parameters) if p.grad is not None]
    norm_type = float(norm_type)
    if not grads:
        return Tensor(0.0)
    with no_grad():
        if norm_type == 2.0:  # each gradient's sum of squares as one dot product (one pass, no squared copy),
            # joined in one node (ops.stack would add an unsqueeze per gradient)
            squares = [_ops.dot(v, v) for v in (_dense(g).reshape(-1) for g in grads)]
            total = Stack.apply(0, *squares).sum().sqrt()
        else:
            total = _norm(_ops.stack([_norm(_dense(g), norm_type) for g in grads]), norm_type)
        if error_if_nonfinite and not math.isfinite(total.item()):
            raise RuntimeError(
                f"The total norm of order {norm_type} for gradients from `parameters` is non-finite, so it "
                "cannot be clipped. To disable this error and scale the gradients by the non-finite norm "
                "anyway, set `error_if_nonfinite=False`"
            )
        # always multiply (by at most 1): no data-dependent branch, so it can run asynchronously on a GPU
        coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
        for g in grads:  # scaling is linear, so a sparse gradient's repeated rows may stay uncoalesced
            (g.values() if g.is_sparse else g).mul_(coef.to(g.dtype))
    return total


def clip_grad_value_(parameters: Tensor | Iterable[Tensor], clip_value: float,
                     foreach: bool | None = None) -> None:
    """Clamp every gradient element into ``[-clip_value, clip_value]`` in place (``foreach`` as in
    ``clip_grad_norm_``). A sparse gradient is coalesced first (``.grad`` becomes the coalesced
    tensor): clamping is not linear, so what is clamped is the sum of an element's repeated rows."""
    clip_value = float(clip_value)
    with no_grad():
        for p in _as_list(parameters):
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                p.grad = p.grad.coalesce()
            _dense(p.grad).clamp_(-clip_value, clip_value)


def parameters_to_vector(parameters: Iterable[Tensor]) -> Tensor:
    """All parameters flattened and concatenated into one 1-D tensor (differentiable)."""
    return _ops.cat([p.reshape(-1) for p in parameters])


def vector_to_parameters(vec: Tensor, parameters: Iterable[Tensor]) -> None:
    """Copy consecutive slices of ``vec`` into the parameters, in place."""
    if not isinstance(vec, Tensor) or vec.ndim != 1:
        raise TypeError(f"vector_to_parameters: expected a 1-D Tensor, got {getattr(vec, 'shape', type(vec))}")
    params = list(parameters)
    total = sum(p.numel() for p in params)
    if vec.numel() != total:
        raise ValueError(f"vector_to_parameters: the vector has {vec.numel()} elements but the parameters "
                         f"hold {total}")
    with no_grad():
        start = 0
        for p in params:
            p.copy_(vec[start:start + p.numel()].reshape(p.shape))
            start += p.numel()
