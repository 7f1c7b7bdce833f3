"""int8 quantization, PyTorch's eager-mode workflow (chapter 03, lesson 08).

Observers pick a grid per tensor (``observer``), ``fuse_modules`` merges Conv+BN+ReLU and
Linear+ReLU (``fuse``), ``prepare``/``convert`` and ``quantize_dynamic`` turn a float model into
an int8 one (``quantize``), whose layers run int8 kernels with int32 sums (``ops``) and export to
ONNX in QuantizeLinear/DequantizeLinear form with ``minigrad.graph.onnx_export.export_onnx``.
"""

from minigrad.quantization.fuse import ConvReLU2d, LinearReLU, fuse_modules
from minigrad.quantization.modules import (DeQuantStub, DynamicQuantizedLinear, DynamicQuantizedLSTM, FakeQuantize,
                                           QConfig, Quantize, QuantizedConv2d, QuantizedLinear, QuantStub,
                                           QuantWrapper, default_qat_qconfig, default_qconfig, full_range_qconfig,
                                           histogram_qconfig)
from minigrad.quantization.observer import (HistogramObserver, MinMaxObserver, MovingAverageMinMaxObserver,
                                            PerChannelMinMaxObserver, QParams, calculate_qparams)
from minigrad.quantization.ops import fake_quantize
from minigrad.quantization.quantize import convert, model_size, prepare, prepare_qat, quantize_dynamic

__all__ = ["ConvReLU2d", "DeQuantStub", "DynamicQuantizedLSTM", "DynamicQuantizedLinear", "FakeQuantize",
           "HistogramObserver", "LinearReLU", "MinMaxObserver", "MovingAverageMinMaxObserver",
           "PerChannelMinMaxObserver", "QConfig", "QParams", "QuantStub", "QuantWrapper", "Quantize",
           "QuantizedConv2d", "QuantizedLinear", "calculate_qparams", "convert", "default_qat_qconfig",
           "default_qconfig", "fake_quantize", "full_range_qconfig", "fuse_modules", "histogram_qconfig",
           "model_size", "prepare", "prepare_qat", "quantize_dynamic"]
