"""``RNN``, ``GRU`` and their cells: the recurrences that carry one state vector (chapter 02).

An Elman RNN updates its hidden state with one affine map and a nonlinearity,
``h' = tanh(W_ih x + b_ih + W_hh h + b_hh)``; a GRU adds two gates, a reset gate r that decides
how much of ``h`` the candidate n sees and an update gate z that blends: ``h' = (1 - z) * n + z * h``.
As in ``nn.rnn`` (the LSTM), the sequence is a Python loop, so backpropagation through time is
``backward()`` through the unrolled graph. Parameter names, gate order (r, z, n for the GRU) and
initialisation are PyTorch's, so weights load both ways.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable

from minigrad import creation
from minigrad.errors import ShapeError
from minigrad.nn import functional as F
from minigrad.nn.module import Module, Parameter
from minigrad.nn.rnn import _init_uniform
from minigrad.ops import cat, relu, sigmoid, stack, tanh
from minigrad._tensor import Tensor

__all__ = ["GRU", "GRUCell", "RNN", "RNNCell", "gru_cell", "rnn_cell"]


def rnn_cell(x: Tensor, h: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor | None = None,
             b_hh: Tensor | None = None, nonlinearity: str = "tanh") -> Tensor:
    """One Elman step: (N, input) and (N, hidden) -> the next (N, hidden)."""
    pre = F.linear(x, w_ih, b_ih) + F.linear(h, w_hh, b_hh)
    return tanh(pre) if nonlinearity == "tanh" else relu(pre)


def gru_cell(x: Tensor, h: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor | None = None,
             b_hh: Tensor | None = None) -> Tensor:
    """One GRU step: the reset gate scales the hidden part of the candidate only, as in PyTorch."""
    xr, xz, xn = F.linear(x, w_ih, b_ih).chunk(3, dim=-1)
    hr, hz, hn = F.linear(h, w_hh, b_hh).chunk(3, dim=-1)
    r, z = sigmoid(xr + hr), sigmoid(xz + hz)
    n = tanh(xn + r * hn)
    return (1 - z) * n + z * h


def _check_nonlinearity(nonlinearity: str) -> None:
    if nonlinearity not in ("tanh", "relu"):
        raise ValueError(f"RNN: nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")


class _Cell(Module):
    """A one-step layer ``h = cell(x, h)``: ``gates`` weight blocks of ``hidden_size`` rows each;
    a subclass gives ``_step(x, h)``."""

    gates = 1
    kind = "RNNCell"

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        self.input_size, self.hidden_size, self.bias = input_size, hidden_size, bias
        rows = self.gates * hidden_size
        self.weight_ih = Parameter(creation.empty(rows, input_size, device=device, dtype=dtype))
        self.weight_hh = Parameter(creation.empty(rows, hidden_size, device=device, dtype=dtype))
        if bias:
            self.bias_ih = Parameter(creation.empty(rows, device=device, dtype=dtype))
            self.bias_hh = Parameter(creation.empty(rows, device=device, dtype=dtype))
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _init_uniform(self, self.hidden_size)

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
        if input.ndim not in (1, 2) or input.shape[-1] != self.input_size:
            raise ShapeError(f"{self.kind}: expected input of shape (batch, {self.input_size}) or "
                             f"({self.input_size},), got {tuple(input.shape)}")
        unbatched = input.ndim == 1
        x = input.reshape(1, -1) if unbatched else input
        if hx is None:
            h = creation.zeros(x.shape[0], self.hidden_size, device=x.device, dtype=x.dtype)
        else:
            h = hx.reshape(1, -1) if unbatched else hx
            if tuple(h.shape) != (x.shape[0], self.hidden_size):
                raise ShapeError(f"{self.kind}: expected hx of shape {(x.shape[0], self.hidden_size)}, "
                                 f"got {tuple(h.shape)}")
        h = self._step(x, h)
        return h.reshape(-1) if unbatched else h

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}" + ("" if self.bias else ", bias=False")


class RNNCell(_Cell):
    """One Elman step as a layer: ``h = cell(x, h)``."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, nonlinearity: str = "tanh",
                 device: Any = None, dtype: Any = None) -> None:
        _check_nonlinearity(nonlinearity)
        super().__init__(input_size, hidden_size, bias, device, dtype)
        self.nonlinearity = nonlinearity

    def _step(self, x: Tensor, h: Tensor) -> Tensor:
        return rnn_cell(x, h, self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh, self.nonlinearity)


class GRUCell(_Cell):
    """One GRU step as a layer: ``h = cell(x, h)``."""

    gates, kind = 3, "GRUCell"

    def _step(self, x: Tensor, h: Tensor) -> Tensor:
        return gru_cell(x, h, self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh)


class _Stack(Module):
    """``num_layers`` recurrences over a whole sequence, as ``nn.LSTM`` but with one state:
    input (L, N, input_size), or (N, L, input_size) with ``batch_first``, gives ``output, h_n``
    with output (L, N, D * hidden_size) and h_n (D * num_layers, N, hidden_size). A subclass gives
    ``_cell()``, the step function of (x, h, *weights)."""

    gates = 1
    kind = "RNN"

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        if not 0 <= dropout <= 1:
            raise ValueError(f"{self.kind}: dropout should be a number in [0, 1], got {dropout}")
        if dropout > 0 and num_layers == 1:
            warnings.warn(f"{self.kind}: dropout acts between layers, so with num_layers=1 it does nothing",
                          stacklevel=2)
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout, self.bidirectional = bias, batch_first, float(dropout), bidirectional
        directions = 2 if bidirectional else 1
        rows = self.gates * hidden_size
        for layer in range(num_layers):
            for suffix in ("", "_reverse")[:directions]:
                size_in = input_size if layer == 0 else hidden_size * directions
                shapes = {"weight_ih": (rows, size_in), "weight_hh": (rows, hidden_size)}
                if bias:
                    shapes.update(bias_ih=(rows,), bias_hh=(rows,))
                for name, shape in shapes.items():
                    setattr(self, f"{name}_l{layer}{suffix}",
                            Parameter(creation.empty(*shape, device=device, dtype=dtype)))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _init_uniform(self, self.hidden_size)

    def _weights(self, layer: int, suffix: str) -> tuple:
        names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh") if self.bias else ("weight_ih", "weight_hh")
        return tuple(getattr(self, f"{name}_l{layer}{suffix}") for name in names)

    def forward(self, input: Tensor, hx: Tensor | None = None) -> tuple[Tensor, Tensor]:
        if input.ndim not in (2, 3) or input.shape[-1] != self.input_size:
            layout = "(N, L, input_size)" if self.batch_first else "(L, N, input_size)"
            raise ShapeError(f"{self.kind}: expected input of shape {layout} or (L, input_size) with "
                             f"input_size={self.input_size}, got {tuple(input.shape)}")
        unbatched = input.ndim == 2
        x = input.unsqueeze(1) if unbatched else (input.transpose(0, 1) if self.batch_first else input)
        length, batch = x.shape[:2]
        directions = 2 if self.bidirectional else 1
        state_shape = (self.num_layers * directions, batch, self.hidden_size)
        if hx is None:
            h0 = creation.zeros(*state_shape, device=x.device, dtype=x.dtype)
        else:
            h0 = hx.unsqueeze(1) if unbatched else hx
            if tuple(h0.shape) != state_shape:
                raise ShapeError(f"{self.kind}: expected h_0 of shape {state_shape}, got {tuple(h0.shape)}")

        step_fn, steps, h_n = self._cell(), [x[t] for t in range(length)], []
        for layer in range(self.num_layers):
            if layer > 0 and self.dropout > 0:
                steps = [F.dropout(s, self.dropout, self.training) for s in steps]
            outputs = []
            for d, suffix in enumerate(("", "_reverse")[:directions]):
                h, out = h0[layer * directions + d], [None] * length
                for t in (reversed(range(length)) if suffix else range(length)):
                    h = step_fn(steps[t], h, *self._weights(layer, suffix))
                    out[t] = h
                outputs.append(out)
                h_n.append(h)
            steps = outputs[0] if directions == 1 else [cat(pair, -1) for pair in zip(*outputs)]

        output, h_n = stack(steps), stack(h_n)
        if unbatched:
            return output.squeeze(1), h_n.squeeze(1)
        return (output.transpose(0, 1) if self.batch_first else output), h_n

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        for name, default in (("num_layers", 1), ("bias", True), ("batch_first", False), ("dropout", 0.0),
                              ("bidirectional", False)):
            if getattr(self, name) != default:
                s += f", {name}={getattr(self, name)}"
        return s


class RNN(_Stack):
    """A stack of Elman RNNs (``nonlinearity`` 'tanh' or 'relu') over a whole sequence."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, nonlinearity: str = "tanh",
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 device: Any = None, dtype: Any = None) -> None:
        _check_nonlinearity(nonlinearity)
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         device, dtype)
        self.nonlinearity = nonlinearity

    def _cell(self) -> Callable[..., Tensor]:
        return functools.partial(rnn_cell, nonlinearity=self.nonlinearity)


class GRU(_Stack):
    """A stack of GRUs over a whole sequence."""

    gates, kind = 3, "GRU"

    def _cell(self) -> Callable[..., Tensor]:
        return gru_cell
