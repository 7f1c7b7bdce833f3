"""Weight initialisation, as ``torch.nn.init``: fill a tensor in place from a chosen distribution.

The scale is what matters: Xavier/Glorot keeps activations' variance constant through linear or
tanh layers (``2 / (fan_in + fan_out)``), Kaiming/He compensates for ReLU halving it
(``gain**2 / fan``). Chapter 02 shows the activations of a deep MLP dying or exploding without
these scales. Samples come from the tensor's device generator, seeded by ``minigrad.manual_seed``;
inside ``vmap`` the random fills follow its ``randomness``, as torch.func's do.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from minigrad.autograd.mode import random_call
from minigrad.backend.meta import has_values
from minigrad._tensor import Tensor

__all__ = [
    "calculate_gain", "constant_", "kaiming_normal_", "kaiming_uniform_", "layer_default_", "normal_", "ones_",
    "trunc_normal_", "uniform_", "xavier_normal_", "xavier_uniform_", "zeros_",
]


def _write(tensor: Tensor, values: Any) -> Tensor:
    """Store ``values`` in ``tensor``'s memory (no graph: initialisation is not differentiated)."""
    tensor.array[...] = values
    tensor._bump_version()
    return tensor


def _rng(tensor: Tensor, generator: Any):
    return generator if generator is not None else tensor.device.rng


def _fill(name: str, tensor: Tensor, fill: Callable[[Tensor], Any]) -> Tensor:
    """``fill(tensor)``, a random fill, as the vmaps running want it: inside ``vmap`` a batched
    tensor gets a draw per example (``"different"``) or the one draw in each (``"same"``)."""
    return random_call(name, fill, (tensor,), fills=True)


def uniform_(tensor: Tensor, a: float = 0.0, b: float = 1.0, generator: Any = None) -> Tensor:
    """Samples from U(a, b)."""
    return _fill("uniform_", tensor, lambda t: _write(t, _rng(t, generator).uniform(a, b, size=t.shape)))


def normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, generator: Any = None) -> Tensor:
    """Samples from N(mean, std**2)."""
    # loc + scale * standard_normal: cupy's Generator has no normal()
    return _fill("normal_", tensor, lambda t: _write(t, mean + std * _rng(t, generator).standard_normal(t.shape)))


def trunc_normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0,
                  generator: Any = None) -> Tensor:
    """N(mean, std**2) restricted to [a, b]: redraw the samples that fall outside until none do."""
    if not a < b:
        raise ValueError(f"trunc_normal_: expected a < b, got a={a}, b={b}")

    def fill(t: Tensor) -> Tensor:
        rng = _rng(t, generator)
        values = mean + std * rng.standard_normal(t.shape)
        bad = (values < a) | (values > b)
        while has_values(bad) and bad.any():
            values[bad] = mean + std * rng.standard_normal(int(bad.sum()))
            bad = (values < a) | (values > b)
        return _write(t, values)
    return _fill("trunc_normal_", tensor, fill)


def constant_(tensor: Tensor, val: float) -> Tensor:
    return _write(tensor, val)


def zeros_(tensor: Tensor) -> Tensor:
    return _write(tensor, 0)


def ones_(tensor: Tensor) -> Tensor:
    return _write(tensor, 1)


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """The factor that keeps the activations' variance at 1 through ``nonlinearity`` (torch's table)."""
    if nonlinearity in ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
                        "conv_transpose3d", "sigmoid"):
        return 1
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            slope = 0.01
        elif isinstance(param, (int, float)) and not isinstance(param, bool):
            slope = param
        else:
            raise ValueError(f"calculate_gain: negative_slope {param} is not a valid number")
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"calculate_gain: unsupported nonlinearity {nonlinearity!r}")


def _calculate_fan_in_and_fan_out(tensor: Tensor) -> tuple[int, int]:
    """Inputs and outputs per unit: a weight is (out, in, *kernel), so fan_in = in * kernel size."""
    if tensor.ndim < 2:
        raise ValueError(
            f"fan in and fan out can not be computed for a tensor with fewer than 2 dimensions "
            f"(got shape {tuple(tensor.shape)})"
        )
    receptive = math.prod(tensor.shape[2:])
    return tensor.shape[1] * receptive, tensor.shape[0] * receptive


def _fan(tensor: Tensor, mode: str) -> int:
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"kaiming init: mode {mode!r} is not supported; use 'fan_in' or 'fan_out'")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return fan_in if mode == "fan_in" else fan_out


def xavier_uniform_(tensor: Tensor, gain: float = 1.0, generator: Any = None) -> Tensor:
    """U(-a, a) with a = gain * sqrt(6 / (fan_in + fan_out)) (Glorot & Bengio, 2010)."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    a = math.sqrt(3.0) * gain * math.sqrt(2.0 / (fan_in + fan_out))
    return uniform_(tensor, -a, a, generator)


def xavier_normal_(tensor: Tensor, gain: float = 1.0, generator: Any = None) -> Tensor:
    """N(0, std**2) with std = gain * sqrt(2 / (fan_in + fan_out))."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)), generator)


def kaiming_uniform_(tensor: Tensor, a: float = 0, mode: str = "fan_in", nonlinearity: str = "leaky_relu",
                     generator: Any = None) -> Tensor:
    """U(-bound, bound) with bound = gain * sqrt(3 / fan) (He et al., 2015)."""
    if 0 in tensor.shape:
        return tensor
    std = calculate_gain(nonlinearity, a) / math.sqrt(_fan(tensor, mode))
    return uniform_(tensor, -math.sqrt(3.0) * std, math.sqrt(3.0) * std, generator)


def kaiming_normal_(tensor: Tensor, a: float = 0, mode: str = "fan_in", nonlinearity: str = "leaky_relu",
                    generator: Any = None) -> Tensor:
    """N(0, std**2) with std = gain / sqrt(fan)."""
    if 0 in tensor.shape:
        return tensor
    return normal_(tensor, 0.0, calculate_gain(nonlinearity, a) / math.sqrt(_fan(tensor, mode)), generator)


def layer_default_(weight: Tensor, bias: Tensor | None = None) -> None:
    """PyTorch's default for Linear and Conv layers: ``kaiming_uniform_(a=sqrt(5))`` for the weight,
    which is U(-1/sqrt(fan_in), 1/sqrt(fan_in)), and the same range for the bias."""
    kaiming_uniform_(weight, a=math.sqrt(5))
    if bias is not None:
        fan_in, _ = _calculate_fan_in_and_fan_out(weight)
        bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
        uniform_(bias, -bound, bound)
