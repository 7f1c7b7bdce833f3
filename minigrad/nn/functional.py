"""``minigrad.nn.functional``: the layers' math as plain functions, as ``torch.nn.functional``.

A layer (``nn.Linear``) owns its parameters and calls one of these (``F.linear``) in ``forward``.
Everything here is built from differentiable minigrad ops (normalisation from one fused op,
``minigrad.ops.normalize.Standardize``, whose backward is minigrad ops too), so second derivatives
flow through normalisation and losses (chapter 02 takes a Hessian-vector product through a whole
MLP). Cross-entropy and NLL delegate to the fused ops in ``minigrad.ops``; the convolution and
pooling functions are re-exported from ``minigrad.ops.conv`` and ``minigrad.ops.pool``.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Sequence

from minigrad import ops as _ops
from minigrad.backend import value_checks
from minigrad.autograd.grad_mode import no_grad
from minigrad.creation import ones
from minigrad.errors import DTypeError, ShapeError
from minigrad.backend.meta import has_values
from minigrad.ops.indexing import check_range
from minigrad.ops.conv import conv1d, conv2d, conv_transpose1d, conv_transpose2d  # noqa: F401  (with the ops)
from minigrad.ops.pool import adaptive_avg_pool2d, avg_pool2d, max_pool2d  # noqa: F401
from minigrad.ops.normalize import BatchNorm, Standardize
from minigrad.ops.sparse import embedding as sparse_embedding
from minigrad._tensor import Tensor, _wrap

__all__ = [
    "adaptive_avg_pool2d", "avg_pool2d", "conv1d", "conv2d", "conv_transpose1d", "conv_transpose2d", "max_pool2d",
    "batch_norm", "binary_cross_entropy", "binary_cross_entropy_with_logits", "cross_entropy",
    "dropout", "dropout1d", "dropout2d", "dropout3d", "embedding", "gelu", "hardswish", "huber_loss", "l1_loss",
    "layer_norm", "leaky_relu", "linear", "log_softmax", "mse_loss", "nll_loss", "one_hot", "pad", "relu",
    "scaled_dot_product_attention", "sigmoid", "silu", "smooth_l1_loss", "softmax", "tanh",
]


# -- linear and activations ---------------------------------------------------------------------------
def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``input @ weight.T + bias``; weight is (out_features, in_features), as in PyTorch."""
    if input.shape[-1] != weight.shape[-1]:
        raise ShapeError(f"linear: input has {input.shape[-1]} features (shape {tuple(input.shape)}) but "
                         f"the weight expects {weight.shape[-1]} (weight shape {tuple(weight.shape)})")
    return _ops.linear(input, weight, bias)


def relu(input: Tensor, inplace: bool = False) -> Tensor:
    return _ops.inplace(input, _ops.relu) if inplace else _ops.relu(input)


def leaky_relu(input: Tensor, negative_slope: float = 0.01, inplace: bool = False) -> Tensor:
    if inplace:
        return _ops.inplace(input, _ops.leaky_relu, negative_slope)
    return _ops.leaky_relu(input, negative_slope)


def gelu(input: Tensor, approximate: str = "none") -> Tensor:
    return _ops.gelu(input, approximate)


def silu(input: Tensor, inplace: bool = False) -> Tensor:
    return _ops.inplace(input, _ops.silu) if inplace else _ops.silu(input)


def hardswish(input: Tensor, inplace: bool = False) -> Tensor:
    return _ops.inplace(input, _ops.hardswish) if inplace else _ops.hardswish(input)


def tanh(input: Tensor) -> Tensor:
    return _ops.tanh(input)


def sigmoid(input: Tensor) -> Tensor:
    return _ops.sigmoid(input)


def _softmax_dim(name: str, ndim: int) -> int:
    # torch's legacy rule for dim=None, kept so old code gives the same numbers
    warnings.warn(f"Implicit dimension choice for {name} has been deprecated; pass dim explicitly",
                  stacklevel=3)
    return 0 if ndim in (0, 1, 3) else 1


def softmax(input: Tensor, dim: int | None = None, dtype: Any = None) -> Tensor:
    if dim is None:
        dim = _softmax_dim("softmax", input.ndim)
    return (input if dtype is None else input.to(dtype)).softmax(dim)


def log_softmax(input: Tensor, dim: int | None = None, dtype: Any = None) -> Tensor:
    if dim is None:
        dim = _softmax_dim("log_softmax", input.ndim)
    return (input if dtype is None else input.to(dtype)).log_softmax(dim)


# -- dropout and embedding ---------------------------------------------------------------------------
def dropout(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """Zero each element with probability ``p`` and scale the rest by ``1 / (1 - p)``, so the
    expected value is unchanged and evaluation needs no rescaling (inverted dropout)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0.0:
        return input
    return _ops.inplace(input, _ops.dropout, p) if inplace else _ops.dropout(input, p)


def _feature_dropout(op: str, input: Tensor, p: float, training: bool, inplace: bool, batched: int) -> Tensor:
    """Zero whole channels (dim 1 of a batched input of ``batched`` dims, dim 0 of an unbatched
    one) with probability ``p`` and scale the rest by 1 / (1 - p): neighbouring pixels of a
    feature map are correlated, so dropping single elements would barely regularise."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if input.ndim not in (batched - 1, batched):
        raise ShapeError(f"{op}: expected a {batched - 1}-D (unbatched) or {batched}-D (batched) input, "
                         f"got shape {tuple(input.shape)}")
    if not training or p == 0.0:
        return input
    lead = tuple(input.shape[:2]) if input.ndim == batched else tuple(input.shape[:1])
    # the dropout op draws the mask (one value per channel) inside its forward, so a traced or
    # compiled step draws a fresh one on every replay, as with element dropout
    mask = _ops.dropout(ones(*lead, *(1,) * (input.ndim - len(lead)), dtype=input.dtype, device=input.device), p)
    return input.mul_(mask) if inplace else input * mask


def dropout1d(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """Channel dropout of (N, C, L) or (C, L)."""
    return _feature_dropout("dropout1d", input, p, training, inplace, 3)


def dropout2d(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """Channel dropout of (N, C, H, W) or (C, H, W). Other shapes are deprecated in torch but
    still taken, with a warning, as torch takes them: each (dim 0, dim 1) entry is dropped whole,
    so a 2-D (N, C) input gets element dropout (pytorch/examples mnist_rnn feeds it one)."""
    if input.ndim not in (3, 4) and input.ndim >= 2:
        warnings.warn(f"dropout2d: received a {input.ndim}-D input, which PyTorch deprecates; each entry of its "
                      f"first two dims is dropped whole (use dropout for element dropout)", stacklevel=2)
        return _feature_dropout("dropout2d", input, p, training, inplace, input.ndim)
    return _feature_dropout("dropout2d", input, p, training, inplace, 4)


def dropout3d(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """Channel dropout of (N, C, D, H, W) or (C, D, H, W)."""
    return _feature_dropout("dropout3d", input, p, training, inplace, 5)


def embedding(input: Tensor, weight: Tensor, padding_idx: int | None = None, max_norm: float | None = None,
              norm_type: float = 2.0, scale_grad_by_freq: bool = False, sparse: bool = False) -> Tensor:
    """Rows of ``weight`` picked by the integer ``input``; ``padding_idx``'s row gets no gradient."""
    if not isinstance(input, Tensor) or input.dtype.kind not in "iu":
        got = input.dtype if isinstance(input, Tensor) else type(input).__name__
        raise DTypeError(f"embedding: expected an integer index tensor, got {got}")
    if scale_grad_by_freq:
        raise NotImplementedError("embedding: scale_grad_by_freq is not supported")
    n = weight.shape[0]
    check_range(input.array, n, 0, "embedding", input, weight.shape, negative=False)
    if max_norm is not None and has_values(weight.array):  # a meta table has no rows to shrink
        _renorm_rows(weight, input, max_norm, norm_type)
    out = sparse_embedding(input, weight) if sparse else weight[input]
    if padding_idx is not None:
        keep = _ops.ne(input, padding_idx % n).unsqueeze(-1)
        out = _ops.where(keep, out, out.detach())  # same values, no gradient at padding positions
    return out


def _renorm_rows(weight: Tensor, input: Tensor, max_norm: float, norm_type: float) -> None:
    """Shrink the used rows whose norm exceeds ``max_norm`` in place (torch's embedding_renorm_)."""
    xp = weight.device.xp
    rows = xp.unique(input.array)
    w = weight.array[rows]
    norms = (xp.abs(w) ** norm_type).sum(axis=1) ** (1.0 / norm_type)
    scale = xp.where(norms > max_norm, max_norm / (norms + 1e-7), 1.0).astype(w.dtype)
    weight.array[rows] = w * scale[:, None]
    weight._bump_version()


def one_hot(tensor: Tensor, num_classes: int = -1) -> Tensor:
    """An int64 tensor with one more dimension, 1 at each index and 0 elsewhere."""
    if tensor.dtype.kind not in "iu":
        raise DTypeError(f"one_hot: expected an integer tensor, got {tensor.dtype}")
    xp = tensor.device.xp
    if num_classes == -1:  # the output's shape depends on a value: the host must read it (as in torch)
        num_classes = int(tensor.array.max()) + 1 if tensor.numel() else 0
    if tensor.numel() and has_values(tensor.array):  # a given num_classes: checked without waiting for a GPU
        lo, hi = tensor.array.min(), tensor.array.max()
        value_checks.check(xp, (lo < 0) | (hi >= num_classes), ValueError,
                           lambda: f"one_hot: class values must be in [0, {num_classes}), got [{int(lo)}, {int(hi)}]")
    classes = _wrap(xp.arange(num_classes), tensor.device)
    return _ops.cast(_ops.eq(tensor.unsqueeze(-1), classes), "int64")  # ops, so tracing sees the input


def pad(input: Tensor, pad: Sequence[int], mode: str = "constant", value: float = 0.0) -> Tensor:
    """Pad the last ``len(pad) // 2`` dims: ``pad=(left, right, top, bottom, ...)`` as in torch."""
    if mode != "constant":
        raise NotImplementedError(f"pad: mode {mode!r} is not supported; only 'constant'")
    return _ops.pad(input, tuple(pad), mode, value)


# -- normalisation ------------------------------------------------------------------------------------
def batch_norm(input: Tensor, running_mean: Tensor | None, running_var: Tensor | None,
               weight: Tensor | None = None, bias: Tensor | None = None, training: bool = False,
               momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    """Normalise each channel (dim 1) over the batch and spatial dims.

    Training uses the batch's mean and biased variance and blends them into the running stats
    (the unbiased variance, as PyTorch does); evaluation uses the running stats. An empty batch
    gives an empty output and leaves the running stats as they were, as in PyTorch.
    """
    if input.ndim < 2:
        raise ShapeError(f"batch_norm: expected an input of at least 2 dims (N, C, ...), "
                         f"got shape {tuple(input.shape)}")
    c = input.shape[1]
    shape = (1, c) + (1,) * (input.ndim - 2)
    if training and input.numel() == 0:  # as PyTorch: an empty output, running stats left as they were
        out = input.clone() if weight is None else input * weight.reshape(shape)
        return out if bias is None else out + bias.reshape(shape)
    if training:
        n = input.numel() // c
        if n <= 1:
            raise ValueError("Expected more than 1 value per channel when training, "
                             f"got input size {tuple(input.shape)}")
        dims = (0,) + tuple(range(2, input.ndim))
        if weight is not None and bias is not None:  # the affine map in the same op (ops.normalize)
            out, mean, var = BatchNorm.apply(input, weight, bias, dims, eps)
        else:
            xhat, mean, var = Standardize.apply(input, dims, eps)
            out = xhat if weight is None else xhat * weight.reshape(shape)
            out = out if bias is None else out + bias.reshape(shape)
        if running_mean is not None or running_var is not None:
            with no_grad():
                if running_mean is not None:
                    running_mean.mul_(1 - momentum).add_(mean.reshape(c) * momentum)
                if running_var is not None:
                    running_var.mul_(1 - momentum).add_(var.reshape(c) * (momentum * n / (n - 1)))
        return out
    if running_mean is None or running_var is None:
        raise ValueError("batch_norm: running_mean and running_var are required when training=False")
    # fold the running stats and the affine transform into one scale and shift per channel
    scale = (running_var + eps).rsqrt()
    if weight is not None:
        scale = scale * weight
    shift = -running_mean * scale
    if bias is not None:
        shift = shift + bias
    return input * scale.reshape(shape) + shift.reshape(shape)


def layer_norm(input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None = None,
               bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """Normalise over the last ``len(normalized_shape)`` dims of each sample (biased variance)."""
    normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    k = len(normalized_shape)
    if tuple(input.shape[input.ndim - k:]) != normalized_shape or k > input.ndim:
        raise ShapeError(f"layer_norm: normalized_shape {normalized_shape} does not match the last dims "
                         f"of the input of shape {tuple(input.shape)}")
    out = Standardize.apply(input, tuple(range(input.ndim - k, input.ndim)), eps)[0]
    if weight is not None:
        out = out * weight
    return out if bias is None else out + bias


# -- losses ------------------------------------------------------------------------------------------
_REDUCTIONS = ("none", "mean", "sum")


def _reduce(loss: Tensor, reduction: str) -> Tensor:
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    return loss


def _check_reduction(reduction: str) -> None:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{reduction!r} is not a valid value for reduction; expected one of {_REDUCTIONS}")


def _check_same_shape(op: str, input: Tensor, target: Tensor) -> None:
    if tuple(input.shape) != tuple(target.shape):
        warnings.warn(f"{op}: using a target size {tuple(target.shape)} that is different to the input size "
                      f"{tuple(input.shape)}; it will be broadcast, which is likely not what you want",
                      stacklevel=3)


def mse_loss(input: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """Mean squared error ``(input - target)**2``."""
    _check_reduction(reduction)
    _check_same_shape("mse_loss", input, target)
    diff = input - target
    return _reduce(diff * diff, reduction)


def l1_loss(input: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """Mean absolute error ``|input - target|``."""
    _check_reduction(reduction)
    _check_same_shape("l1_loss", input, target)
    return _reduce((input - target).abs(), reduction)


def smooth_l1_loss(input: Tensor, target: Tensor, reduction: str = "mean", beta: float = 1.0) -> Tensor:
    """Squared error below ``beta``, absolute error above: ``0.5 d**2 / beta`` where ``|d| < beta``,
    else ``|d| - 0.5 beta`` (Fast R-CNN's box loss; ``beta=0`` is ``l1_loss``)."""
    _check_reduction(reduction)
    _check_same_shape("smooth_l1_loss", input, target)
    if beta < 0:
        raise ValueError(f"smooth_l1_loss: beta must be non-negative, got {beta}")
    diff = input - target
    if beta == 0.0:
        return _reduce(diff.abs(), reduction)
    ad = diff.abs()
    return _reduce(_ops.where(ad < beta, 0.5 * diff * diff / beta, ad - 0.5 * beta), reduction)


def huber_loss(input: Tensor, target: Tensor, reduction: str = "mean", delta: float = 1.0,
               weight: Tensor | None = None) -> Tensor:
    """``0.5 d**2`` where ``|d| < delta``, else ``delta (|d| - 0.5 delta)``: ``delta`` times
    ``smooth_l1_loss`` with ``beta=delta``; ``weight`` scales each element's loss."""
    _check_reduction(reduction)
    _check_same_shape("huber_loss", input, target)
    if delta <= 0:
        raise ValueError(f"huber_loss: delta must be positive, got {delta}")
    diff = input - target
    ad = diff.abs()
    loss = _ops.where(ad < delta, 0.5 * diff * diff, delta * (ad - 0.5 * delta))
    return _reduce(loss if weight is None else loss * weight, reduction)


def cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None, ignore_index: int = -100,
                  reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
    """Softmax cross-entropy of logits (N, C, ...) against class indices (N, ...) or class
    probabilities (same shape as the logits)."""
    return _ops.cross_entropy(input, target, weight=weight, ignore_index=ignore_index, reduction=reduction,
                              label_smoothing=label_smoothing)


def nll_loss(input: Tensor, target: Tensor, weight: Tensor | None = None, ignore_index: int = -100,
             reduction: str = "mean") -> Tensor:
    """Negative log-likelihood of log-probabilities (N, C, ...) at class indices (N, ...)."""
    return _ops.nll_loss(input, target, weight=weight, ignore_index=ignore_index, reduction=reduction)


def binary_cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None,
                         reduction: str = "mean") -> Tensor:
    """``-(t log p + (1 - t) log(1 - p))`` of probabilities; logs are clamped at -100, as in torch."""
    _check_reduction(reduction)
    if tuple(input.shape) != tuple(target.shape):
        raise ShapeError(f"binary_cross_entropy: target shape {tuple(target.shape)} must equal the input "
                         f"shape {tuple(input.shape)}")
    if input.numel() and has_values(input.array):  # on a GPU read at the next host read (value_checks)
        lo, hi = input.array.min(), input.array.max()
        value_checks.check(input.device.xp, (lo < 0.0) | (hi > 1.0), ValueError, lambda: (
            "binary_cross_entropy: all elements of input should be between 0 and 1, got values in "
            f"[{float(lo)}, {float(hi)}]"))
    loss = -(target * input.log().clamp(min=-100) + (1 - target) * (1 - input).log().clamp(min=-100))
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


def binary_cross_entropy_with_logits(input: Tensor, target: Tensor, weight: Tensor | None = None,
                                     reduction: str = "mean", pos_weight: Tensor | None = None) -> Tensor:
    """BCE of ``sigmoid(input)`` without ever forming it: ``(1 - t) x + w_t softplus(-x)``, which
    stays finite for any logit (log(sigmoid(x)) = -softplus(-x))."""
    _check_reduction(reduction)
    if tuple(input.shape) != tuple(target.shape):
        raise ShapeError(f"binary_cross_entropy_with_logits: target shape {tuple(target.shape)} must equal "
                         f"the input shape {tuple(input.shape)}")
    log_weight = 1 if pos_weight is None else 1 + (pos_weight - 1) * target
    loss = (1 - target) * input + log_weight * _ops.softplus(-input)
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


# -- attention (nn.MultiheadAttention builds on these) ---------------------------------------------
def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
                                 dropout_p: float = 0.0, is_causal: bool = False,
                                 scale: float | None = None, enable_gqa: bool = False) -> Tensor:
    """``softmax(query @ key^T * scale + mask) @ value`` over the last two dims, as
    ``torch.nn.functional.scaled_dot_product_attention``; a bool mask marks the allowed pairs.
    ``enable_gqa`` (grouped-query attention, fewer key/value heads) is not supported."""
    if enable_gqa:
        raise NotImplementedError("scaled_dot_product_attention: minigrad does not implement enable_gqa=True")
    return _attention(query, key, value, attn_mask, dropout_p, is_causal, scale, allowed_if_true=True)[0]


def _attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float, is_causal: bool,
               scale: float | None, allowed_if_true: bool) -> tuple[Tensor, Tensor]:
    scores = (q @ k.transpose(-2, -1)) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
    if is_causal:
        xp = q.device.xp
        causal = Tensor(xp.triu(xp.ones(scores.shape[-2:], dtype=bool), 1), device=q.device)
        scores = scores + _additive(causal, scores.dtype, "scaled_dot_product_attention", "is_causal",
                                    blocked_if_true=True)
    if mask is not None:
        scores = scores + _additive(mask, scores.dtype, "scaled_dot_product_attention", "attn_mask",
                                    blocked_if_true=not allowed_if_true)
    weights = dropout(scores.softmax(-1), dropout_p) if dropout_p > 0 else scores.softmax(-1)
    return weights @ v, weights


def _additive(mask: Tensor, dtype: Any, op: str, name: str, blocked_if_true: bool) -> Tensor:
    """A mask as something to add to the scores: -inf where a bool mask blocks, a float mask as is
    (``op`` and ``name`` say whose argument it is in the error for any other dtype)."""
    if mask.dtype.kind == "b":
        xp = mask.device.xp
        blocked = mask.array if blocked_if_true else ~mask.array
        return Tensor(xp.where(blocked, -math.inf, 0.0).astype(dtype), device=mask.device)
    if mask.dtype.kind != "f":
        raise DTypeError(f"{op}: {name} must be a bool or float tensor, got {mask.dtype}")
    return mask.to(dtype)
