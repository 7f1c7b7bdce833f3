"""Convolution and pooling layers: ``Conv2d``, ``ConvTranspose1d/2d``, ``MaxPool2d``, ``AvgPool2d``,
``AdaptiveAvgPool2d``.

A convolution layer owns a bank of small filters (``weight`` of shape (out_channels,
in_channels/groups, kH, kW)) that it slides over the image; the work is done by
``minigrad.ops.conv`` (im2col and one matrix product). Weights start as PyTorch's do, so a
minigrad CNN and its torch twin train from the same distribution (chapter 02). A transposed
convolution (a decoder's or a GAN generator's upsampling) is the adjoint of one: its weight is
(in_channels, out_channels/groups, kH, kW), as in torch, and each input pixel paints a kernel-sized
patch of the output.
"""

from __future__ import annotations

from typing import Any

from minigrad import creation
from minigrad.nn import init
from minigrad.nn.module import Module, Parameter
from minigrad.ops.conv import IntPair, _pair, conv2d, conv_transpose1d, conv_transpose2d
from minigrad.ops.pool import adaptive_avg_pool2d, avg_pool2d, max_pool2d
from minigrad._tensor import Tensor

__all__ = ["AdaptiveAvgPool2d", "AvgPool2d", "Conv2d", "ConvTranspose1d", "ConvTranspose2d", "MaxPool2d"]


class Conv2d(Module):
    """2-D convolution: (N, in_channels, H, W) -> (N, out_channels, H', W')."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: IntPair, stride: IntPair = 1,
                 padding: IntPair | str = 0, dilation: IntPair = 1, groups: int = 1, bias: bool = True,
                 padding_mode: str = "zeros", device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        if groups < 1 or in_channels % groups or out_channels % groups:
            raise ValueError(f"Conv2d: in_channels ({in_channels}) and out_channels ({out_channels}) must "
                             f"both be divisible by groups ({groups})")
        if padding_mode != "zeros":
            raise ValueError(f"Conv2d: padding_mode {padding_mode!r} is not supported; minigrad pads with 'zeros'")
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size = _pair(kernel_size, "kernel_size", "Conv2d", 1)
        self.stride = _pair(stride, "stride", "Conv2d", 1)
        self.padding = padding if isinstance(padding, str) else _pair(padding, "padding", "Conv2d", 0)
        self.dilation = _pair(dilation, "dilation", "Conv2d", 1)
        self.padding_mode = padding_mode
        shape = (out_channels, in_channels // groups, *self.kernel_size)
        self.weight = Parameter(creation.empty(*shape, device=device, dtype=dtype))
        if bias:
            self.bias = Parameter(creation.empty(out_channels, device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # torch's default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for both, fan_in = in/groups * kH * kW
        init.layer_default_(self.weight, self.bias)

    def forward(self, input: Tensor) -> Tensor:
        return conv2d(input, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)

    def extra_repr(self) -> str:
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0, 0):
            s += f", padding={self.padding}"
        if self.dilation != (1, 1):
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        return s


class _ConvTransposeNd(Module):
    """The shared body of ConvTranspose1d and ConvTranspose2d; ``dims`` is 1 or 2."""

    dims = 2

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1, padding: Any = 0,
                 output_padding: Any = 0, groups: int = 1, bias: bool = True, dilation: Any = 1,
                 padding_mode: str = "zeros", device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        name = type(self).__name__
        if groups < 1 or in_channels % groups or out_channels % groups:
            raise ValueError(f"{name}: in_channels ({in_channels}) and out_channels ({out_channels}) must both be "
                             f"divisible by groups ({groups})")
        if padding_mode != "zeros":
            raise ValueError(f'Only "zeros" padding mode is supported for {name}, got {padding_mode!r}')
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.padding_mode = padding_mode
        self.kernel_size, self.stride = self._tuple(kernel_size, "kernel_size", 1), self._tuple(stride, "stride", 1)
        self.padding, self.dilation = self._tuple(padding, "padding", 0), self._tuple(dilation, "dilation", 1)
        self.output_padding = self._tuple(output_padding, "output_padding", 0)
        shape = (in_channels, out_channels // groups, *self.kernel_size)
        self.weight = Parameter(creation.empty(*shape, device=device, dtype=dtype))
        if bias:
            self.bias = Parameter(creation.empty(out_channels, device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def _tuple(self, v: Any, name: str, low: int) -> tuple[int, ...]:
        pair = _pair(v, name, type(self).__name__, low)
        return pair[:1] if self.dims == 1 else pair

    def reset_parameters(self) -> None:
        # torch's default, with fan_in read from the transposed layout: out_channels/groups * kernel
        init.layer_default_(self.weight, self.bias)

    def _output_padding(self, input: Tensor, output_size: Any) -> tuple[int, ...]:
        """``output_padding``, or the one that makes the output ``output_size`` (several input
        sizes map to one output size under a stride, so the caller may say which it wants)."""
        if output_size is None:
            return self.output_padding
        spatial = tuple(input.shape[-self.dims:])
        wanted = tuple(output_size)[-self.dims:]
        if len(wanted) != self.dims:
            raise ValueError(f"{type(self).__name__}: output_size must have {self.dims} or {self.dims + 2} "
                             f"elements, got {tuple(output_size)}")
        pads = []
        for n, s, p, d, k, want in zip(spatial, self.stride, self.padding, self.dilation, self.kernel_size, wanted):
            smallest = (n - 1) * s - 2 * p + d * (k - 1) + 1
            if not smallest <= want < smallest + s:
                raise ValueError(f"{type(self).__name__}: requested an output size of {tuple(wanted)}, but valid "
                                 f"sizes range from {smallest} to {smallest + s - 1} (for an input of {spatial})")
            pads.append(want - smallest)
        return tuple(pads)

    def extra_repr(self) -> str:
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        for name, default in (("padding", 0), ("output_padding", 0), ("dilation", 1)):
            if getattr(self, name) != (default,) * self.dims:
                s += f", {name}={getattr(self, name)}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        return s


class ConvTranspose1d(_ConvTransposeNd):
    """1-D transposed convolution: (N, in_channels, L) -> (N, out_channels, L')."""

    dims = 1

    def forward(self, input: Tensor, output_size: Any = None) -> Tensor:
        (op,) = self._output_padding(input, output_size)
        return conv_transpose1d(input, self.weight, self.bias, self.stride[0], self.padding[0], op, self.groups,
                                self.dilation[0])


class ConvTranspose2d(_ConvTransposeNd):
    """2-D transposed convolution: (N, in_channels, H, W) -> (N, out_channels, H', W')."""

    def forward(self, input: Tensor, output_size: Any = None) -> Tensor:
        return conv_transpose2d(input, self.weight, self.bias, self.stride, self.padding,
                                self._output_padding(input, output_size), self.groups, self.dilation)


class MaxPool2d(Module):
    """The maximum of each ``kernel_size`` window (stride defaults to the kernel size)."""

    def __init__(self, kernel_size: IntPair, stride: IntPair | None = None, padding: IntPair = 0,
                 dilation: IntPair = 1, return_indices: bool = False, ceil_mode: bool = False) -> None:
        super().__init__()
        self.kernel_size, self.stride = kernel_size, stride if stride is not None else kernel_size
        self.padding, self.dilation = padding, dilation
        self.return_indices, self.ceil_mode = return_indices, ceil_mode

    def forward(self, input: Tensor):
        return max_pool2d(input, self.kernel_size, self.stride, self.padding, self.dilation,
                          self.ceil_mode, self.return_indices)

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, ceil_mode={self.ceil_mode}")


class AvgPool2d(Module):
    """The mean of each ``kernel_size`` window (stride defaults to the kernel size)."""

    def __init__(self, kernel_size: IntPair, stride: IntPair | None = None, padding: IntPair = 0,
                 ceil_mode: bool = False, count_include_pad: bool = True, divisor_override: int | None = None) -> None:
        super().__init__()
        self.kernel_size, self.stride = kernel_size, stride if stride is not None else kernel_size
        self.padding, self.ceil_mode = padding, ceil_mode
        self.count_include_pad, self.divisor_override = count_include_pad, divisor_override

    def forward(self, input: Tensor) -> Tensor:
        return avg_pool2d(input, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                          self.count_include_pad, self.divisor_override)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AdaptiveAvgPool2d(Module):
    """Average over an ``output_size`` grid of bins, whatever the input's size."""

    def __init__(self, output_size: IntPair) -> None:
        super().__init__()
        self.output_size = output_size

    def forward(self, input: Tensor) -> Tensor:
        return adaptive_avg_pool2d(input, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"
