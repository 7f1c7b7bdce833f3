"""The modules of a quantized model: stubs, fake quantization, and the int8 layers (chapter 03).

``prepare`` wraps every Linear/Conv2d (fused or not) in a ``QuantWrapper``: an activation
observer on its input and on its output, and a weight observer. In quantization-aware training the
observers are ``FakeQuantize`` modules, which also round what passes through them, so the same
wrapper trains against the rounding error. ``convert`` reads the grids the observers chose and
builds ``QuantizedLinear``/``QuantizedConv2d``: int8 weights, an int32 bias and the grids as buffers,
run by the int8 kernels of ``quantization/ops.py``. ``quantize_dynamic`` gives
``DynamicQuantizedLinear`` and ``DynamicQuantizedLSTM``: int8 weights, activations quantized per
batch. ``QuantStub``/``DeQuantStub`` keep PyTorch's names: the first rounds the model's input to
its grid, the second is where float values resume.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

from minigrad.nn import LSTM, Conv2d, Linear, Module
from minigrad.nn import functional as F
from minigrad.ops.conv import Geometry, _conv_padding
from minigrad.quantization.fuse import ConvReLU2d, LinearReLU
from minigrad.quantization.observer import (HistogramObserver, MinMaxObserver, MovingAverageMinMaxObserver,
                                            PerChannelMinMaxObserver, QParams, check_finite)
from minigrad.quantization.ops import DynamicInt8Linear, Int8Conv2d, Int8Linear, fake_quantize, quantize
from minigrad._tensor import Tensor

__all__ = ["DeQuantStub", "DynamicQuantizedLSTM", "DynamicQuantizedLinear", "FakeQuantize", "QConfig", "QuantStub",
           "QuantWrapper", "Quantize", "QuantizedConv2d", "QuantizedLinear", "default_qat_qconfig",
           "default_qconfig", "full_range_qconfig", "histogram_qconfig"]


class FakeQuantize(Module):
    """An observer that also rounds: ``forward`` records the range (while ``observer_enabled``)
    and returns ``x`` on the grid that range gives, with a straight-through gradient."""

    def __init__(self, observer: Module) -> None:
        super().__init__()
        self.observer, self.observer_enabled = observer, True

    def forward(self, x: Tensor) -> Tensor:
        if self.observer_enabled:
            self.observer(x)
        qp = self.calculate_qparams()
        return fake_quantize(x, qp.scale, qp.zero_point, qp.qmin, qp.qmax, qp.axis)

    def calculate_qparams(self) -> QParams:
        return self.observer.calculate_qparams()


class QConfig(NamedTuple):
    """How to observe a layer: factories for its activation and weight observers (PyTorch's QConfig)."""

    activation: Callable[[], Module]
    weight: Callable[[], Module]


default_qconfig = QConfig(MinMaxObserver, PerChannelMinMaxObserver)
histogram_qconfig = QConfig(HistogramObserver, PerChannelMinMaxObserver)
default_qat_qconfig = QConfig(lambda: FakeQuantize(MovingAverageMinMaxObserver()),
                              lambda: FakeQuantize(PerChannelMinMaxObserver()))
# weights' full 8 bits: exact on numpy and cuda, but onnxruntime on x86 without VNNI saturates
full_range_qconfig = QConfig(MinMaxObserver, lambda: PerChannelMinMaxObserver(reduce_range=False))


class QuantStub(Module):
    """Marks where the model's input enters the quantized region (PyTorch's name); after ``prepare``
    it observes the input, after ``convert`` it is a ``Quantize`` that rounds it to that grid."""

    def forward(self, x: Tensor) -> Tensor:
        observer = self._modules.get("activation_post_process")
        return observer(x) if observer is not None else x


class DeQuantStub(Module):
    """Marks where float values resume: values between int8 layers already travel as floats on their
    grid, so it returns its input."""

    def forward(self, x: Tensor) -> Tensor:
        return x


class Quantize(Module):
    """``x`` rounded to a fixed uint8 grid: a converted ``QuantStub``."""

    def __init__(self, qparams: QParams) -> None:
        super().__init__()
        self.register_buffer("scale", Tensor(qparams.scale))
        self.register_buffer("zero_point", Tensor(qparams.zero_point))

    def forward(self, x: Tensor) -> Tensor:
        return fake_quantize(x, self.scale.array, self.zero_point.array, 0, 255)


class QuantWrapper(Module):
    """A float Linear/Conv2d (and a fused ReLU) between observers, or fake quantizers in QAT."""

    def __init__(self, layer: Module, qconfig: QConfig) -> None:
        super().__init__()
        self.relu = isinstance(layer, (LinearReLU, ConvReLU2d))
        self.layer = layer[0] if self.relu else layer
        self.activation_pre_process = qconfig.activation()
        self.weight_post_process = qconfig.weight()
        self.activation_post_process = qconfig.activation()

    def forward(self, x: Tensor) -> Tensor:
        layer = self.layer
        x, w = self.activation_pre_process(x), self.weight_post_process(layer.weight)
        if isinstance(layer, Linear):
            y = F.linear(x, w, layer.bias)
        else:
            y = F.conv2d(x, w, layer.bias, layer.stride, layer.padding, layer.dilation, layer.groups)
        return self.activation_post_process(F.relu(y) if self.relu else y)


def _observer(m: Module) -> Module:
    return m.observer if isinstance(m, FakeQuantize) else m


class _Int8Layer(Module):
    """The buffers of an int8 layer, made from a prepared (calibrated or QAT-trained) wrapper."""

    def __init__(self, wrapper: QuantWrapper) -> None:
        super().__init__()
        layer, xp = wrapper.layer, wrapper.layer.weight.device.xp
        weight_observer = _observer(wrapper.weight_post_process)
        weight_observer(layer.weight.detach())  # the weight's current range (it moved since the last forward)
        x_qp = _observer(wrapper.activation_pre_process).calculate_qparams()
        w_qp = weight_observer.calculate_qparams()
        out_qp = _observer(wrapper.activation_post_process).calculate_qparams()
        for qp in (x_qp, out_qp):
            if (qp.dtype, qp.qmin, qp.qmax) != ("quint8", 0, 255):
                raise ValueError(f"convert: the int8 kernels take activations on quint8 grids 0..255, got {qp.dtype} "
                                 f"{qp.qmin}..{qp.qmax}; narrower grids can be simulated with FakeQuantize "
                                 "(prepare_qat)")
        bias = layer.bias.array if layer.bias is not None else xp.zeros(layer.weight.shape[0], "float32")
        buffers = {"weight": quantize(xp, layer.weight.array, w_qp.scale, w_qp.zero_point, w_qp.qmin, w_qp.qmax, 0),
                   "weight_scale": w_qp.scale,
                   "bias": xp.rint(bias / (x_qp.scale * w_qp.scale)).astype("int32"),
                   "input_scale": x_qp.scale, "input_zero_point": x_qp.zero_point,
                   "scale": out_qp.scale, "zero_point": out_qp.zero_point}
        for name, array in buffers.items():
            self.register_buffer(name, Tensor(array, device=layer.weight.device))
        self.relu = wrapper.relu

    def _operands(self) -> tuple:
        return (self.weight, self.weight_scale, self.bias, self.input_scale, self.input_zero_point, self.scale,
                self.zero_point, self.relu)

    def extra_repr(self) -> str:
        return (f"{tuple(self.weight.shape)}, scale={float(self.scale.array):.4g}, "
                f"zero_point={int(self.zero_point.array)}, relu={self.relu}")


class QuantizedLinear(_Int8Layer):
    """An int8 Linear: uint8 input x int8 weight, int32 sums, uint8 output grid."""

    def forward(self, x: Tensor) -> Tensor:
        return Int8Linear.apply(x, *self._operands())


class QuantizedConv2d(_Int8Layer):
    """An int8 Conv2d, as ``QuantizedLinear`` on im2col's columns."""

    def __init__(self, wrapper: QuantWrapper) -> None:
        super().__init__(wrapper)
        c = wrapper.layer
        self.geometry = Geometry(c.kernel_size, c.stride,
                                 _conv_padding(c.padding, c.kernel_size, c.stride, c.dilation, "QuantizedConv2d"),
                                 c.dilation)
        self.groups = c.groups

    def forward(self, x: Tensor) -> Tensor:
        return Int8Conv2d.apply(x, *self._operands(), self.geometry, self.groups)


def _int8_weight(weight: Tensor, weight_observer: Callable[[], Module] = PerChannelMinMaxObserver) -> tuple:
    """A weight as int8 (per output channel, symmetric) and its scales, both as Tensors."""
    observer = weight_observer()
    observer(weight.detach())
    qp, xp = observer.calculate_qparams(), weight.device.xp
    q = quantize(xp, weight.array, qp.scale, qp.zero_point, qp.qmin, qp.qmax, 0)
    return Tensor(q, device=weight.device), Tensor(qp.scale, device=weight.device)


class DynamicQuantizedLinear(Module):
    """A Linear with int8 weights whose input grid is chosen per batch (``quantize_dynamic``)."""

    def __init__(self, linear: Linear) -> None:
        super().__init__()
        weight, scale = _int8_weight(linear.weight)
        self.register_buffer("weight", weight)
        self.register_buffer("weight_scale", scale)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float())

    def forward(self, x: Tensor) -> Tensor:
        return _dynamic_int8_linear(x, self.weight, self.weight_scale, self.bias)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, dtype=qint8"


class _Int8Weight(NamedTuple):
    weight: Tensor
    scale: Tensor


class DynamicQuantizedLSTM(LSTM):
    """An LSTM whose gate weights are int8: each step's two gate products run ``DynamicInt8Linear``
    (the LSTM's loop and gate arithmetic are ``nn.LSTM``'s, in float32)."""

    def __init__(self, lstm: LSTM) -> None:
        Module.__init__(self)  # nn.LSTM's own __init__ would allocate float weights only to drop them
        for name in ("input_size", "hidden_size", "num_layers", "bias", "batch_first", "dropout", "bidirectional"):
            setattr(self, name, getattr(lstm, name))
        for name, p in lstm.named_parameters():
            if name.startswith("weight"):
                weight, scale = _int8_weight(p)
                self.register_buffer(name, weight)
                self.register_buffer(f"{name}_scale", scale)
            else:
                self.register_buffer(name, p.detach().float())

    def _weights(self, layer: int, suffix: str) -> tuple:
        w_ih, w_hh, *biases = super()._weights(layer, suffix)
        return (_Int8Weight(w_ih, getattr(self, f"weight_ih_l{layer}{suffix}_scale")),
                _Int8Weight(w_hh, getattr(self, f"weight_hh_l{layer}{suffix}_scale")), *biases)

    @staticmethod
    def _linear(x: Tensor, w: _Int8Weight, b: Tensor | None) -> Tensor:
        return _dynamic_int8_linear(x, w.weight, w.scale, b)


def _dynamic_int8_linear(x: Tensor, w_q: Tensor, w_scale: Tensor, bias: Tensor | None) -> Tensor:
    """``DynamicInt8Linear``, whose grid comes from ``x``'s range: a NaN or an infinity in ``x``
    would make it meaningless, so it is named instead."""
    check_finite("DynamicInt8Linear", "the input", x.array, x.device.xp)
    return DynamicInt8Linear.apply(x, w_q, w_scale, bias)


def is_quantizable(m: Any) -> bool:
    return type(m) in (Linear, Conv2d, LinearReLU, ConvReLU2d)
