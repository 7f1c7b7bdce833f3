"""``RNN``, ``GRU`` and their cells: the recurrences that carry one state vector (chapter 02).

An Elman RNN updates its hidden state with one affine map and a nonlinearity,
``h' = tanh(W_ih x + b_ih + W_hh h + b_hh)``; a GRU adds two gates, a reset gate r that decides
how much of ``h`` the candidate n sees and an update gate z that blends: ``h' = (1 - z) * n + z * h``.
``_Stack`` is the one sequence loop of all three recurrences (``nn.rnn``'s LSTM too): a Python
loop over time, so backpropagation through time is ``backward()`` through the unrolled graph. The
input's projection for every step is one matrix product before the loop, and each step is one
product with the recurrent weight and one gate op, to keep the loop cheap. Parameter names, gate
order (r, z, n for the GRU) and initialisation are PyTorch's, so weights load both ways.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

from minigrad import creation
from minigrad.errors import ShapeError
from minigrad.nn import functional as F
from minigrad.nn.module import Module, Parameter
from minigrad.nn import init
from minigrad.ops import cat, relu, stack, tanh
from minigrad.ops.linalg import Matmul
from minigrad.ops.recurrent import GRUGates, Stack, gru_gates, unbind
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
    return gru_gates(F.linear(x, w_ih, b_ih), F.linear(h, w_hh, b_hh), h)


def _init_uniform(module: Module, hidden_size: int) -> None:
    # torch's default for every recurrent weight and bias: U(-1/sqrt(hidden), 1/sqrt(hidden))
    bound = 1 / math.sqrt(hidden_size) if hidden_size > 0 else 0
    for p in module.parameters():
        init.uniform_(p, -bound, bound)


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
    """``num_layers`` recurrences over a whole sequence, the one loop behind ``RNN``, ``GRU`` and
    ``LSTM``: input (L, N, input_size), or (N, L, input_size) with ``batch_first``, gives
    ``output, h_n`` (``LSTM``: ``output, (h_n, c_n)``) with output (L, N, D * hidden_size) and each
    final state (D * num_layers, N, hidden_size), D = 2 if bidirectional. A subclass gives
    ``gates``, ``states`` (1, or 2 for the LSTM's h and c) and ``_step``."""

    gates = 1
    states = 1
    kind = "RNN"
    hidden_bias_per_step = False  # True: bias_hh is added to each step's h W_hh^T (the GRU's reset gate scales both)
    _linear = staticmethod(F.linear)  # what applies a gate's weight (minigrad.quantization swaps it)

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

    def flatten_parameters(self) -> None:
        """Nothing to do: torch packs cuDNN's weights into one buffer here; minigrad keeps them apart."""

    def _weights(self, layer: int, suffix: str) -> tuple:
        names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh") if self.bias else ("weight_ih", "weight_hh")
        return tuple(getattr(self, f"{name}_l{layer}{suffix}") for name in names)

    def _step(self, xg: Tensor, hg: Tensor, state: tuple) -> tuple:
        """The next state from the step's input projection ``xg``, the state's projection ``hg``
        (each (N, gates * hidden) with its bias) and the state."""
        raise NotImplementedError(f"{type(self).__name__} must define _step")

    def forward(self, input: Tensor, hx: Any = None) -> tuple[Tensor, Any]:
        if input.ndim not in (2, 3) or input.shape[-1] != self.input_size:
            layout = "(N, L, input_size)" if self.batch_first else "(L, N, input_size)"
            raise ShapeError(f"{self.kind}: expected input of shape {layout} or (L, input_size) with "
                             f"input_size={self.input_size}, got {tuple(input.shape)}")
        unbatched = input.ndim == 2
        x = input.unsqueeze(1) if unbatched else (input.transpose(0, 1) if self.batch_first else input)
        directions = 2 if self.bidirectional else 1
        state_shape = (self.num_layers * directions, x.shape[1], self.hidden_size)
        names = ("h_0", "c_0")[:self.states]
        if hx is None:
            initial = (creation.zeros(*state_shape, device=x.device, dtype=x.dtype),) * self.states
        else:
            initial = tuple(t.unsqueeze(1) if unbatched else t for t in (hx if self.states > 1 else (hx,)))
            for name, t in zip(names, initial):
                if tuple(t.shape) != state_shape:
                    raise ShapeError(f"{self.kind}: expected {name} of shape {state_shape}, got {tuple(t.shape)}")

        finals = []
        for layer in range(self.num_layers):
            if layer > 0 and self.dropout > 0:
                x = F.dropout(x, self.dropout, self.training)
            outputs = []
            for d, suffix in enumerate(("", "_reverse")[:directions]):
                state = tuple(s[layer * directions + d] for s in initial)
                out, state = self._direction(x, state, self._weights(layer, suffix), bool(suffix))
                outputs.append(out)
                finals.append(state)
            x = outputs[0] if directions == 1 else cat(outputs, -1)

        last = tuple(stack([f[k] for f in finals]) for k in range(self.states))
        if unbatched:
            x, last = x.squeeze(1), tuple(s.squeeze(1) for s in last)
        elif self.batch_first:
            x = x.transpose(0, 1)
        return x, (last if self.states > 1 else last[0])

    def _direction(self, x: Tensor, state: tuple, weights: tuple, reverse: bool) -> tuple[Tensor, tuple]:
        """One layer in one direction over x (L, N, features): its outputs (L, N, hidden) and last
        state. Every step's input projection is one matrix product before the loop, so each step
        is one product with ``weight_hh`` and one gate op (``minigrad.ops.recurrent``)."""
        w_ih, w_hh, b_ih, b_hh = weights if len(weights) == 4 else (*weights, None, None)
        linear = self._linear
        if linear is not F.linear:  # a dynamically quantized weight picks its input's grid step by step
            inputs = [linear(xt, w_ih, b_ih) for xt in unbind(x)]
            hidden = lambda h: linear(h, w_hh, b_hh)  # noqa: E731
        elif self.hidden_bias_per_step:
            inputs = unbind(F.linear(x, w_ih, b_ih))
            hidden = lambda h: F.linear(h, w_hh, b_hh)  # noqa: E731
        else:  # both biases join the product over the whole sequence, and a step is one matmul
            inputs = unbind(F.linear(x, w_ih, b_ih if b_hh is None else b_ih + b_hh))
            w_t = w_hh.mT
            if all(t.dtype == w_hh.dtype for t in (*state, *inputs[:1])):  # matmul()'s checks and promotion hold
                hidden = lambda h: Matmul.apply(h, w_t)  # noqa: E731
            else:
                hidden = w_t.__rmatmul__
        out = [None] * len(inputs)
        for t in (reversed(range(len(inputs))) if reverse else range(len(inputs))):
            state = self._step(inputs[t], hidden(state[0]), state)
            out[t] = state[0]
        return Stack.apply(0, *out), state

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

    def _step(self, xg: Tensor, hg: Tensor, state: tuple) -> tuple:
        return (tanh(xg + hg) if self.nonlinearity == "tanh" else relu(xg + hg),)


class GRU(_Stack):
    """A stack of GRUs over a whole sequence."""

    gates, kind, hidden_bias_per_step = 3, "GRU", True

    def _step(self, xg: Tensor, hg: Tensor, state: tuple) -> tuple:
        return (GRUGates.apply(xg, hg, state[0]),)  # the loop's shapes fit: gru_gates's checks are not needed
