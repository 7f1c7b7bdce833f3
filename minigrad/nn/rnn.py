"""``LSTMCell`` and ``LSTM``: a recurrent network as a Python loop over time (chapters 01 and 02).

An LSTM carries two vectors from step to step, the hidden state ``h`` and the cell state ``c``.
At each step four gates, computed from the input and ``h``, decide what the cell forgets (f),
what it writes (i times the candidate g) and what it shows (o):
``c' = f * c + i * g`` and ``h' = o * tanh(c')``. The loop over time runs for as many steps as the
sequence has (``nn.recurrent._Stack``, shared with RNN and GRU), so every sequence builds its own
graph: this is the dynamic graph of chapter 01, and backpropagation through time of chapter 02 is
just ``backward()`` through that unrolled loop. The gate arithmetic of a step is one op
(``minigrad.ops.recurrent.lstm_gates``).
Parameter names, gate order (i, f, g, o) and initialisation are PyTorch's, so weights load both ways.
"""

from __future__ import annotations

from typing import Any, Callable

from minigrad import creation
from minigrad.errors import ShapeError
from minigrad.nn import functional as F
from minigrad.nn.module import Module, Parameter
from minigrad.nn.recurrent import _init_uniform, _Stack
from minigrad.ops.recurrent import LSTMGates, lstm_gates
from minigrad._tensor import Tensor

__all__ = ["LSTM", "LSTMCell", "lstm_cell"]


def lstm_cell(x: Tensor, h: Tensor, c: Tensor, w_ih: Any, w_hh: Any, b_ih: Tensor | None = None,
              b_hh: Tensor | None = None, linear: Callable[..., Tensor] = F.linear) -> tuple[Tensor, Tensor]:
    """One LSTM step: (N, input) and the state (N, hidden) twice -> the next (h, c). ``linear``
    applies a weight (a dynamically quantized LSTM passes its int8 product)."""
    return lstm_gates(linear(x, w_ih, b_ih), linear(h, w_hh, b_hh), c)


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


class LSTM(_Stack):
    """A stack of ``num_layers`` LSTMs over a whole sequence: input (L, N, input_size), or
    (N, L, input_size) with ``batch_first``, gives ``output, (h_n, c_n)`` with output
    (L, N, D * hidden_size) and h_n, c_n (D * num_layers, N, hidden_size); D is 2 if bidirectional.
    The loop is ``nn.recurrent``'s, shared with RNN and GRU."""

    gates, states, kind = 4, 2, "LSTM"

    def forward(self, input: Tensor, hx: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        return super().forward(input, hx)

    def _step(self, xg: Tensor, hg: Tensor, state: tuple) -> tuple:
        return LSTMGates.apply(xg, hg, state[1])  # the loop's shapes fit: lstm_gates's checks are not needed
