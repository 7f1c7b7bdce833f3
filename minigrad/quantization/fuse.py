"""Module fusion before quantizing: Conv+BN(+ReLU) and Linear(+ReLU) become one layer (chapter 03).

A quantized model rounds every value that leaves a layer, so each layer boundary costs accuracy
and a pass over memory. Folding BatchNorm into the convolution before it (``nn/fusion.py``'s
``fuse_conv_bn_eval``: the same conv with scaled filters and a new bias) removes one rounding;
keeping ReLU with its layer lets the int8 kernel clamp at the output's zero point instead of
writing negatives it would then discard. ``fuse_modules`` takes PyTorch's lists of module names,
or finds every fusable run inside ``Sequential`` containers when given none.
"""

from __future__ import annotations

import copy
from typing import Sequence

from minigrad.nn.fusion import fuse_conv_bn_eval, fuse_linear_bn_eval
from minigrad.nn import BatchNorm1d, BatchNorm2d, Conv2d, Identity, Linear, Module, ReLU, Sequential

__all__ = ["ConvReLU2d", "LinearReLU", "fuse_modules"]


class LinearReLU(Sequential):
    """Linear then ReLU, quantized as one layer."""


class ConvReLU2d(Sequential):
    """Conv2d (with any BatchNorm folded in) then ReLU, quantized as one layer."""


PATTERNS = [(Conv2d, BatchNorm2d, ReLU), (Conv2d, BatchNorm2d), (Conv2d, ReLU), (Linear, BatchNorm1d, ReLU),
            (Linear, BatchNorm1d), (Linear, ReLU)]


def _fused(mods: list[Module]) -> Module:
    layer, rest = mods[0], mods[1:]
    if rest and isinstance(rest[0], (BatchNorm1d, BatchNorm2d)):
        if rest[0].training:
            raise ValueError("fuse_modules: BatchNorm is in training mode, where it uses batch statistics; "
                             "call .eval() first")
        layer = (fuse_conv_bn_eval if isinstance(layer, Conv2d) else fuse_linear_bn_eval)(layer, rest[0])
        rest = rest[1:]
    if not rest:
        return layer
    return (ConvReLU2d if isinstance(layer, Conv2d) else LinearReLU)(layer, rest[0])


def _find(model: Module) -> list[list[str]]:
    """The name lists of every run matching a pattern inside a Sequential (longest first)."""
    found = []
    for prefix, m in model.named_modules():
        if not isinstance(m, Sequential) or isinstance(m, (LinearReLU, ConvReLU2d)):
            continue
        names, i = list(m._modules), 0
        while i < len(names):
            for p in PATTERNS:
                run = names[i:i + len(p)]
                if len(run) == len(p) and all(type(m._modules[n]) is t for n, t in zip(run, p)):
                    found.append([f"{prefix}.{n}" if prefix else n for n in run])
                    i += len(p) - 1
                    break
            i += 1
    return found


def fuse_modules(model: Module, modules_to_fuse: Sequence[Sequence[str]] | None = None,
                 inplace: bool = False) -> Module:
    """``model`` (a copy unless ``inplace``) with each list of names in ``modules_to_fuse`` (every
    fusable run inside a Sequential when None) replaced by one fused module; the others become
    ``Identity``, so indices and names stay valid."""
    model = model if inplace else copy.deepcopy(model)
    for names in _find(model) if modules_to_fuse is None else modules_to_fuse:
        mods = [model.get_submodule(n) for n in names]
        kinds = tuple(type(m) for m in mods)
        if kinds not in PATTERNS:
            raise ValueError(f"fuse_modules: cannot fuse {[k.__name__ for k in kinds]} ({list(names)}); "
                             f"supported: {[[k.__name__ for k in p] for p in PATTERNS]}")
        for name, new in zip(names, [_fused(mods)] + [Identity()] * (len(names) - 1)):
            parent, _, leaf = name.rpartition(".")
            # written into _modules directly: assigning an existing name would move it to the end
            (model.get_submodule(parent) if parent else model)._modules[leaf] = new
    return model
