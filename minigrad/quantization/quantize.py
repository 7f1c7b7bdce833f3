"""Eager-mode quantization, PyTorch's workflow: ``prepare`` -> calibrate -> ``convert`` (chapter 03).

Post-training static quantization: ``prepare`` puts observers around each Linear/Conv2d (fuse
first with ``fuse_modules``), a few calibration batches run through the float model so every
observer sees its tensor's range, and ``convert`` swaps each wrapper for an int8 layer.
Quantization-aware training: ``prepare_qat`` uses fake quantizers instead of plain observers, so a
few epochs of fine-tuning learn weights that survive the rounding, then the same ``convert``.
``quantize_dynamic`` needs no calibration: weights become int8 ahead of time and each batch's
activations get their grid when they arrive.
"""

from __future__ import annotations

import copy
import itertools
from typing import Callable, Iterable

from minigrad.nn import LSTM, Identity, Linear, Module
from minigrad.quantization.observer import check_finite
from minigrad.quantization.modules import (DeQuantStub, DynamicQuantizedLinear, DynamicQuantizedLSTM, QConfig,
                                           Quantize, QuantizedConv2d, QuantizedLinear, QuantStub, QuantWrapper,
                                           default_qat_qconfig, default_qconfig, is_quantizable)

__all__ = ["convert", "model_size", "prepare", "prepare_qat", "quantize_dynamic"]


def _swap(model: Module, new: Callable[[Module], Module | None]) -> None:
    """Replace, depth first, every submodule ``m`` for which ``new(m)`` gives a module."""
    for name, child in list(model._modules.items()):
        if child is None:
            continue
        replacement = new(child)
        if replacement is None:
            _swap(child, new)
        else:
            model._modules[name] = replacement


def prepare(model: Module, qconfig: QConfig = default_qconfig, inplace: bool = False) -> Module:
    """``model`` with observers around its Linear and Conv2d layers (and on its ``QuantStub``s),
    ready for calibration batches."""
    model = model if inplace else copy.deepcopy(model)
    if is_quantizable(model):
        raise TypeError(f"prepare: wrap the {type(model).__name__} in a container (Sequential) to quantize it")

    def observed(m: Module) -> Module | None:
        if isinstance(m, QuantStub):
            m.activation_post_process = qconfig.activation()
            return m
        return QuantWrapper(m, qconfig) if is_quantizable(m) else None

    _swap(model, observed)
    return model


def prepare_qat(model: Module, qconfig: QConfig = default_qat_qconfig, inplace: bool = False) -> Module:
    """``prepare`` with fake quantizers, for quantization-aware training (the model trains as usual)."""
    return prepare(model, qconfig, inplace).train()


def convert(model: Module, inplace: bool = False) -> Module:
    """The int8 model: every observed layer becomes ``QuantizedLinear``/``QuantizedConv2d``, every
    ``QuantStub`` a ``Quantize`` and every ``DeQuantStub`` an ``Identity``. Returned in eval mode."""
    model = model if inplace else copy.deepcopy(model)

    def converted(m: Module) -> Module | None:
        if isinstance(m, QuantWrapper):
            return (QuantizedLinear if isinstance(m.layer, Linear) else QuantizedConv2d)(m)
        if isinstance(m, QuantStub) and "activation_post_process" in m._modules:
            return Quantize(m.activation_post_process.calculate_qparams())
        return Identity() if isinstance(m, DeQuantStub) else None

    _swap(model, converted)
    return model.eval()


def quantize_dynamic(model: Module, qconfig_spec: Iterable[type] = (Linear, LSTM), dtype: str = "qint8",
                     inplace: bool = False) -> Module:
    """``model`` with every layer of a type in ``qconfig_spec`` (Linear, LSTM) dynamically quantized."""
    if dtype != "qint8":
        raise ValueError(f"quantize_dynamic: dtype must be 'qint8', got {dtype!r}")
    dynamic = {Linear: DynamicQuantizedLinear, LSTM: DynamicQuantizedLSTM}
    kinds = tuple(qconfig_spec)
    unsupported = [k.__name__ for k in kinds if k not in dynamic]
    if unsupported:
        raise ValueError(f"quantize_dynamic: supports Linear and LSTM, got {unsupported}")
    for name, m in model.named_modules():  # before any is swapped: a NaN weight names its layer
        if type(m) in kinds:
            for pname, p in m.named_parameters(recurse=False):
                if pname.startswith("weight"):
                    check_finite("quantize_dynamic", f"{name or type(m).__name__}.{pname}", p.array, p.device.xp)
    model = model if inplace else copy.deepcopy(model)
    if type(model) in kinds:
        return dynamic[type(model)](model).eval()
    _swap(model, lambda m: dynamic[type(m)](m) if type(m) in kinds else None)
    return model.eval()


def model_size(model: Module) -> int:
    """Bytes of every parameter and buffer (what a state_dict file holds, less its small header)."""
    return sum(t.array.nbytes for t in itertools.chain(model.parameters(), model.buffers()))
