"""BatchNorm folded into the layer before it, on a model's modules, for inference (chapter 03).

``fold_conv_bn(model)`` returns a copy of a model in eval mode in which every Conv2d followed by a
BatchNorm2d, and every Linear followed by a BatchNorm1d, inside a ``Sequential``, is one layer with
scaled weights and a new bias, as torch's ``torch.nn.utils.fusion`` does (``fuse_conv_bn_eval``).
The arithmetic is ``minigrad.graph.passes.fold_bn.fold_weights``, which the same fold on a traced
graph uses; that file explains it.
"""

from __future__ import annotations

import copy

from minigrad.graph.passes.fold_bn import fold_weights
from minigrad.nn.conv import Conv2d
from minigrad.nn.containers import Sequential
from minigrad.nn.linear import Identity, Linear
from minigrad.nn.module import Module, Parameter
from minigrad.nn.normalization import BatchNorm1d, BatchNorm2d
from minigrad._tensor import Tensor

__all__ = ["fold_conv_bn", "fuse_conv_bn_eval", "fuse_linear_bn_eval"]


def fold_conv_bn(module: Module) -> Module:
    """A copy of ``module`` (in eval mode) in which every Conv2d followed by a BatchNorm2d, and every
    Linear followed by a BatchNorm1d, inside a ``Sequential``, is one layer; the BatchNorm becomes
    ``Identity``. BatchNorms without running statistics normalise with the batch's and stay."""
    if module.training:
        raise ValueError("fold_conv_bn: the module is in training mode, where BatchNorm uses batch statistics; "
                         "call .eval() first")
    folded = copy.deepcopy(module)
    for m in folded.modules():
        if isinstance(m, Sequential):
            names = list(m._modules)
            for a, b in zip(names, names[1:]):
                layer, bn = m._modules[a], m._modules[b]
                if getattr(bn, "training", True) or getattr(bn, "running_mean", None) is None:
                    continue
                # written into _modules directly: assigning an existing name would move it to the end
                if isinstance(layer, Conv2d) and type(bn) is BatchNorm2d:
                    m._modules[a], m._modules[b] = fuse_conv_bn_eval(layer, bn), Identity()
                elif isinstance(layer, Linear) and type(bn) is BatchNorm1d:
                    m._modules[a], m._modules[b] = fuse_linear_bn_eval(layer, bn), Identity()
    return folded


def fuse_conv_bn_eval(conv: Conv2d, bn: BatchNorm2d) -> Conv2d:
    """A new Conv2d equal to ``bn(conv(x))`` with ``bn`` in eval mode."""
    return _fused_layer(conv, bn)


def fuse_linear_bn_eval(linear: Linear, bn: BatchNorm1d) -> Linear:
    """A new Linear equal to ``bn(linear(x))`` for inputs (N, in_features), with ``bn`` in eval mode."""
    return _fused_layer(linear, bn)


def _fused_layer(layer: Module, bn: Module) -> Module:
    xp = layer.weight.device.xp
    var, mean = bn.running_var.array.astype("float64"), bn.running_mean.array.astype("float64")
    scale = 1.0 / xp.sqrt(var + bn.eps)
    if bn.weight is not None:
        scale = scale * bn.weight.array
    shift = -mean * scale + (bn.bias.array if bn.bias is not None else 0.0)
    w = layer.weight.array
    b = layer.bias.array if layer.bias is not None else None
    new_w, new_b = fold_weights(w, b, scale, shift)
    fused = copy.deepcopy(layer)
    fused.weight.array = new_w
    if fused.bias is None:
        fused.bias = Parameter(Tensor(new_b, device=layer.weight.device), layer.weight.requires_grad)
    else:
        fused.bias.array = new_b
    return fused
