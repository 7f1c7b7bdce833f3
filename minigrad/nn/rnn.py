"""``LSTMCell`` and ``LSTM``: a recurrent network as a Python loop over time (chapters 01 and 02).

An LSTM carries two vectors from step to step, the hidden state ``h`` and the cell state ``c``.
At each step four gates, computed from the input and ``h``, decide what the cell forgets (f),
what it writes (i times the candidate g) and what it shows (o):
``c' = f * c + i * g`` and ``h' = o * tanh(c')``. The loop below runs for as many steps as the
sequence has, so every sequence builds its own graph: this is the dynamic graph of chapter 01,
and backpropagation through time of chapter 02 is just ``backward()`` through that unrolled loop.
Parameter names, gate order (i, f, g, o) and initialisation are PyTorch's, so weights load both ways.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable

from minigrad import creation
from minigrad.errors import ShapeError
from minigrad.nn import functional as F
from minigrad.nn import init
from minigrad.nn.module import Module, Parameter
from minigrad.ops import cat, sigmoid, stack, tanh
from minigrad._tensor import Tensor

__all__ = ["LSTM", "LSTMCell", "lstm_cell"]


def lstm_cell(x: Tensor, h: Tensor, c: Tensor, w_ih: Any, w_hh: Any, b_ih: Tensor | None = None,
              b_hh: Tensor | None = None, linear: Callable[..., Tensor] = F.linear) -> tuple[Tensor, Tensor]:
    """One LSTM step: (N, input) and the state (N, hidden) twice -> the next (h, c). ``linear``
    applies a weight (a dynamically quantized LSTM passes its int8 product)."""
    gates = linear(x, w_ih, b_ih) + linear(h, w_hh, b_hh)
    i, f, g, o = gates.chunk(4, dim=-1)
    c = sigmoid(f) * c + sigmoid(i) * tanh(g)
    h = sigmoid(o) * tanh(c)
    return h, c


def _init_uniform(module: Module, hidden_size: int) -> None:
    # torch's default for every recurrent weight and bias: U(-1/sqrt(hidden), 1/sqrt(hidden))
    bound = 1 / math.sqrt(hidden_size) if hidden_size > 0 else 0
    for p in module.parameters():
        init.uniform_(p, -bound, bound)


class LSTMCell(Module):
    """One LSTM step as a layer: ``(h, c) = cell(x, (h, c))``; the caller writes the loop."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        self.input_size, self.hidden_size, self.bias = input_size, hidden_size, bias
        self.weight_ih = Parameter(creation.empty(4 * hidden_size, input_size, device=device, dtype=dtype))
        self.weight_hh = Parameter(creation.empty(4 * hidden_size, hidden_size, device=device, dtype=dtype))
        if bias:
            self.bias_ih = Parameter(creation.empty(4 * hidden_size, device=device, dtype=dtype))
            self.bias_hh = Parameter(creation.empty(4 * hidden_size, device=device, dtype=dtype))
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _init_uniform(self, self.hidden_size)

    def forward(self, input: Tensor, hx: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        if input.ndim not in (1, 2) or input.shape[-1] != self.input_size:
            raise ShapeError(f"LSTMCell: expected input of shape (batch, {self.input_size}) or "
                             f"({self.input_size},), got {tuple(input.shape)}")
        unbatched = input.ndim == 1
        x = input.reshape(1, -1) if unbatched else input
        if hx is None:
            h = c = creation.zeros(x.shape[0], self.hidden_size, device=x.device, dtype=x.dtype)
        else:
            h, c = (t.reshape(1, -1) if unbatched else t for t in hx)
            for name, t in (("h", h), ("c", c)):
                if tuple(t.shape) != (x.shape[0], self.hidden_size):
                    raise ShapeError(f"LSTMCell: expected {name} of shape {(x.shape[0], self.hidden_size)}, "
                                     f"got {tuple(t.shape)}")
        h, c = lstm_cell(x, h, c, self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh)
        return (h.reshape(-1), c.reshape(-1)) if unbatched else (h, c)

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}" + ("" if self.bias else ", bias=False")


class LSTM(Module):
    """A stack of ``num_layers`` LSTMs over a whole sequence: input (L, N, input_size), or
    (N, L, input_size) with ``batch_first``, gives ``output, (h_n, c_n)`` with output
    (L, N, D * hidden_size) and h_n, c_n (D * num_layers, N, hidden_size); D is 2 if bidirectional."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        if not 0 <= dropout <= 1:
            raise ValueError(f"LSTM: dropout should be a number in [0, 1], got {dropout}")
        if dropout > 0 and num_layers == 1:
            warnings.warn("LSTM: dropout acts between layers, so with num_layers=1 it does nothing", stacklevel=2)
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout, self.bidirectional = bias, batch_first, float(dropout), bidirectional
        directions = 2 if bidirectional else 1
        for layer in range(num_layers):
            for suffix in ("", "_reverse")[:directions]:
                size_in = input_size if layer == 0 else hidden_size * directions
                shapes = {"weight_ih": (4 * hidden_size, size_in), "weight_hh": (4 * hidden_size, hidden_size)}
                if bias:
                    shapes.update(bias_ih=(4 * hidden_size,), bias_hh=(4 * hidden_size,))
                for name, shape in shapes.items():
                    setattr(self, f"{name}_l{layer}{suffix}",
                            Parameter(creation.empty(*shape, device=device, dtype=dtype)))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _init_uniform(self, self.hidden_size)

    _linear = staticmethod(F.linear)  # what applies a gate's weight (minigrad.quantization swaps it)

    def _weights(self, layer: int, suffix: str) -> tuple:
        names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh") if self.bias else ("weight_ih", "weight_hh")
        return tuple(getattr(self, f"{name}_l{layer}{suffix}") for name in names)

    def flatten_parameters(self) -> None:
        """Nothing to do: torch packs cuDNN's weights into one buffer here; minigrad keeps them apart."""

    def forward(self, input: Tensor, hx: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        if input.ndim not in (2, 3) or input.shape[-1] != self.input_size:
            layout = "(N, L, input_size)" if self.batch_first else "(L, N, input_size)"
            raise ShapeError(f"LSTM: expected input of shape {layout} or (L, input_size) with input_size="
                             f"{self.input_size}, got {tuple(input.shape)}")
        unbatched = input.ndim == 2
        x = input.unsqueeze(1) if unbatched else (input.transpose(0, 1) if self.batch_first else input)
        length, batch = x.shape[:2]
        directions = 2 if self.bidirectional else 1
        state_shape = (self.num_layers * directions, batch, self.hidden_size)
        if hx is None:
            h0 = c0 = creation.zeros(*state_shape, device=x.device, dtype=x.dtype)
        else:
            h0, c0 = (t.unsqueeze(1) if unbatched else t for t in hx)
            for name, t in (("h_0", h0), ("c_0", c0)):
                if tuple(t.shape) != state_shape:
                    raise ShapeError(f"LSTM: expected {name} of shape {state_shape}, got {tuple(t.shape)}")

        steps = [x[t] for t in range(length)]  # one (N, features) tensor per time step
        h_n, c_n = [], []
        for layer in range(self.num_layers):
            if layer > 0 and self.dropout > 0:
                steps = [F.dropout(s, self.dropout, self.training) for s in steps]
            outputs = []
            for d, suffix in enumerate(("", "_reverse")[:directions]):
                k = layer * directions + d
                h, c = h0[k], c0[k]
                out = [None] * length
                for t in (reversed(range(length)) if suffix else range(length)):
                    h, c = lstm_cell(steps[t], h, c, *self._weights(layer, suffix), linear=self._linear)
                    out[t] = h
                outputs.append(out)
                h_n.append(h)
                c_n.append(c)
            steps = outputs[0] if directions == 1 else [cat(pair, -1) for pair in zip(*outputs)]

        output, h_n, c_n = stack(steps), stack(h_n), stack(c_n)
        if unbatched:
            return output.squeeze(1), (h_n.squeeze(1), c_n.squeeze(1))
        return (output.transpose(0, 1) if self.batch_first else output), (h_n, c_n)

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if not self.bias:
            s += ", bias=False"
        if self.batch_first:
            s += ", batch_first=True"
        if self.dropout != 0:
            s += f", dropout={self.dropout}"
        if self.bidirectional:
            s += ", bidirectional=True"
        return s
