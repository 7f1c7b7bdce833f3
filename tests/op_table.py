"""The op table: one row per op (and per interesting input shape) that every op test runs over.

Each row pairs a minigrad callable with the PyTorch callable that must give the same values and
gradients, the input shapes (broadcasting pairs and 0-D where valid) and a domain that keeps the
inputs where the op is defined and away from its kinks. ``test_ops.py`` turns every row into a
float64 gradient check, a second-order check for smooth rows and a cross-check against torch in
float32 and float64, so adding an op to minigrad means adding one row here (the MiniTorch habit).

Non-tensor arguments (dims, index arrays, class targets, masks) are constants closed over by the
callables, so a row's inputs are always the floating tensors being differentiated.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

import minigrad
import minigrad.nn.functional as F
import minigrad.ops as M
from minigrad.quantization import fake_quantize

try:  # the torch callables only run in the torch section of test_ops.py
    import torch
    import torch.nn.functional as TF
except ImportError:  # pragma: no cover - depends on the environment
    torch = TF = None

Shapes = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class OpInfo:
    """One op applied to inputs of given shapes, with what the tests may assume about it."""

    name: str
    mg: Callable[..., Any]  # minigrad tensors in, a tensor or a tuple of tensors out
    th: Callable[..., Any]  # the same with torch
    shapes: Shapes
    domain: str = "real"  # see DOMAINS
    differentiable: bool = True
    smooth: bool = True  # second derivatives are checked (gradgradcheck)
    float64: bool = True
    reduction: bool = False  # float32 sums in a different order than torch: looser tolerance
    # False for straight-through estimators: their gradient is a definition (torch's), not the
    # derivative finite differences would measure, so it is checked against torch only
    finite_differences: bool = True

    def arrays(self, dtype: str = "float64") -> list[np.ndarray]:
        """The row's inputs, the same for every run (seeded by the row's name)."""
        rng = np.random.default_rng(zlib.crc32(self.name.encode()))
        return [np.asarray(DOMAINS[self.domain](rng, s, i), dtype=dtype) for i, s in enumerate(self.shapes)]

    def __repr__(self) -> str:
        return self.name


def _distinct(rng: np.random.Generator, shape: tuple, i: int) -> np.ndarray:
    """No two values within 0.02 of each other (within one input and across inputs) and none
    within 0.03 of a multiple of 0.1, so max/min have no ties and abs/relu/clamp no kinks."""
    n = math.prod(shape)
    grid = (rng.permutation(n) - n // 2) * 0.1 + 0.037 + 0.021 * i
    return grid.reshape(shape)


def _nonzero(rng: np.random.Generator, shape: tuple, i: int) -> np.ndarray:
    return rng.choice([-1.0, 1.0], size=shape) * rng.uniform(0.3, 1.5, size=shape)


def _one_zero(rng: np.random.Generator, shape: tuple, i: int) -> np.ndarray:
    a = _nonzero(rng, shape, i)
    a.reshape(-1)[1] = 0.0  # prod's gradient must not divide by the input
    return a


DOMAINS: dict[str, Callable[[np.random.Generator, tuple, int], np.ndarray]] = {
    "real": lambda rng, s, i: rng.standard_normal(s),
    "positive": lambda rng, s, i: rng.uniform(0.5, 2.0, size=s),
    "unit": lambda rng, s, i: rng.uniform(-0.9, 0.9, size=s),
    "large": lambda rng, s, i: rng.standard_normal(s) * 100.0,  # overflows a naive exp
    "nonzero": _nonzero,
    "distinct": _distinct,
    "one_zero": _one_zero,
}


def _tag(shapes: Shapes) -> str:
    return ",".join("x".join(map(str, s)) or "0d" for s in shapes)


def rows(name: str, mg: Callable, th: Callable, *shape_sets: Shapes, **flags: Any) -> list[OpInfo]:
    """One row per shape set; the shapes join the name when there are several."""
    if len(shape_sets) == 1:
        return [OpInfo(name, mg, th, shape_sets[0], **flags)]
    return [OpInfo(f"{name}[{_tag(s)}]", mg, th, s, **flags) for s in shape_sets]


# Shapes that binary ops are tried on: equal, row/column broadcast, rank broadcast, 0-D.
BINARY = (((3, 4), (3, 4)), ((3, 1), (1, 4)), ((2, 3, 4), (4,)), ((), (2, 3)))
UNARY = (((3, 4),), ((),))

# Constants the index, mask and target rows close over.
IDX = np.array([0, 2, 0])  # a repeated index: gradients must accumulate
MASK = np.array([[True, False, True, False], [False, False, True, True], [True, True, False, False]])
COND = np.array([[True, False, False, True], [False, True, True, False], [True, True, False, True]])
TARGET = np.array([1, 0, 4, 2])
QSCALE, QZERO = np.array([0.05, 0.1, 0.05, 0.1], "float32"), np.array([3, 5, 0, -2], "int32")  # a per-channel grid
UNIQUE = np.array([2, 0])  # distinct indices, for writes that do not accumulate
GATHER = np.array([[0, 2, 2, 1], [1, 0, 0, 2]])  # indices into dim 0 of a (3, 4) input


def _mt(a: np.ndarray) -> minigrad.Tensor:
    return minigrad.tensor(a)


def _tt(a: np.ndarray):
    return torch.from_numpy(a.copy())


def _torch_lstm_gates(xg, hg, c):
    """An LSTM step's gate arithmetic as torch.nn.LSTM computes it (gate order i, f, g, o)."""
    i, f, g, o = (xg + hg).chunk(4, -1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


def _torch_gru_gates(gx, gh, h):
    """A GRU step's gate arithmetic as torch.nn.GRU computes it (gate order r, z, n)."""
    (xr, xz, xn), (hr, hz, hn) = gx.chunk(3, -1), gh.chunk(3, -1)
    r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
    n = torch.tanh(xn + r * hn)
    return (1 - z) * n + z * h


OPS: list[OpInfo] = [
    # -- arithmetic ----------------------------------------------------------------------------
    *rows("add", lambda a, b: a + b, lambda a, b: a + b, *BINARY),
    *rows("sub", lambda a, b: a - b, lambda a, b: a - b, *BINARY),
    *rows("mul", lambda a, b: a * b, lambda a, b: a * b, *BINARY),
    *rows("div", lambda a, b: a / b, lambda a, b: a / b, *BINARY, domain="nonzero"),
    *rows("pow", lambda a, b: a ** b, lambda a, b: a ** b, *BINARY, domain="positive"),
    *rows("pow_method", lambda a, b: a.pow(b), lambda a, b: a.pow(b), ((3, 1), (4,)), domain="positive"),
    *rows("neg", lambda x: -x, lambda x: -x, *UNARY),
    *rows("add_scalar", lambda x: x + 2.5, lambda x: x + 2.5, *UNARY),
    *rows("radd_scalar", lambda x: 2.5 + x, lambda x: 2.5 + x, *UNARY),
    *rows("sub_scalar", lambda x: x - 1, lambda x: x - 1, *UNARY),
    *rows("rsub_scalar", lambda x: 1 - x, lambda x: 1 - x, *UNARY),
    *rows("mul_scalar", lambda x: x * -2, lambda x: x * -2, *UNARY),
    *rows("rmul_scalar", lambda x: 3.0 * x, lambda x: 3.0 * x, *UNARY),
    *rows("div_scalar", lambda x: x / 4, lambda x: x / 4, *UNARY),
    *rows("rdiv_scalar", lambda x: 2.0 / x, lambda x: 2.0 / x, *UNARY, domain="nonzero"),
    *rows("pow_scalar2", lambda x: x ** 2, lambda x: x ** 2, *UNARY),
    *rows("pow_scalar3", lambda x: x ** 3, lambda x: x ** 3, ((3, 4),)),
    *rows("pow_scalar_half", lambda x: x ** 0.5, lambda x: x ** 0.5, ((3, 4),), domain="positive"),
    *rows("pow_scalar_neg", lambda x: x ** -1.5, lambda x: x ** -1.5, ((3, 4),), domain="positive"),
    *rows("rpow_scalar", lambda x: 2.0 ** x, lambda x: 2.0 ** x, *UNARY),
    # -- math functions and activations --------------------------------------------------------
    *rows("exp", lambda x: x.exp(), lambda x: x.exp(), *UNARY),
    *rows("log", lambda x: x.log(), lambda x: x.log(), *UNARY, domain="positive"),
    *rows("sqrt", lambda x: x.sqrt(), lambda x: x.sqrt(), *UNARY, domain="positive"),
    *rows("rsqrt", lambda x: x.rsqrt(), lambda x: x.rsqrt(), *UNARY, domain="positive"),
    *rows("abs", lambda x: x.abs(), lambda x: x.abs(), *UNARY, domain="distinct"),
    *rows("sign", lambda x: x.sign(), lambda x: x.sign(), ((3, 4),), domain="distinct"),
    *rows("sin", lambda x: x.sin(), lambda x: x.sin(), *UNARY),
    *rows("cos", lambda x: x.cos(), lambda x: x.cos(), *UNARY),
    *rows("tanh", lambda x: x.tanh(), lambda x: x.tanh(), *UNARY),
    *rows("sigmoid", lambda x: M.sigmoid(x), lambda x: torch.sigmoid(x), *UNARY),
    *rows("sigmoid_large", lambda x: x.sigmoid(), lambda x: x.sigmoid(), ((3, 4),), domain="large"),
    *rows("relu", lambda x: M.relu(x), lambda x: torch.relu(x), *UNARY, domain="distinct"),
    *rows("leaky_relu", lambda x: M.leaky_relu(x, 0.2), lambda x: TF.leaky_relu(x, 0.2), ((3, 4),),
          domain="distinct"),
    *rows("leaky_relu_default", lambda x: M.leaky_relu(x), lambda x: TF.leaky_relu(x), ((3, 4),),
          domain="distinct"),
    *rows("fake_quantize_per_tensor", lambda x: fake_quantize(x, 0.05, 5, 0, 15),
          lambda x: torch.fake_quantize_per_tensor_affine(x, 0.05, 5, 0, 15), ((3, 4),), domain="distinct",
          smooth=False, finite_differences=False),
    *rows("fake_quantize_per_channel", lambda x: fake_quantize(x, QSCALE, QZERO, -8, 7, axis=1),
          lambda x: torch.fake_quantize_per_channel_affine(x, torch.tensor(QSCALE), torch.tensor(QZERO), 1, -8, 7),
          ((3, 4),), domain="distinct", smooth=False, finite_differences=False),
    *rows("gelu", lambda x: M.gelu(x), lambda x: TF.gelu(x), *UNARY),
    *rows("gelu_tanh", lambda x: M.gelu(x, approximate="tanh"), lambda x: TF.gelu(x, approximate="tanh"),
          *UNARY),
    *rows("silu", lambda x: M.silu(x), lambda x: TF.silu(x), *UNARY),
    *rows("hardswish", lambda x: M.hardswish(x * 4), lambda x: TF.hardswish(x * 4), *UNARY),
    *rows("softplus", lambda x: M.softplus(x), lambda x: TF.softplus(x), *UNARY),
    *rows("softplus_beta", lambda x: M.softplus(x, beta=2.0), lambda x: TF.softplus(x, beta=2.0), ((3, 4),)),
    *rows("softplus_large", lambda x: M.softplus(x), lambda x: TF.softplus(x), ((3, 4),), domain="large"),
    *rows("clamp", lambda x: x.clamp(-0.5, 0.5), lambda x: x.clamp(-0.5, 0.5), *UNARY, domain="distinct"),
    *rows("clamp_min", lambda x: x.clamp(min=0.1), lambda x: x.clamp(min=0.1), ((3, 4),), domain="distinct"),
    *rows("clamp_max", lambda x: M.clamp(x, max=-0.2), lambda x: torch.clamp(x, max=-0.2), ((3, 4),),
          domain="distinct"),
    *rows("clamp_tensor", lambda x, lo: x.clamp(min=lo), lambda x, lo: x.clamp(min=lo), ((3, 4), (4,)),
          domain="distinct"),
    *rows("maximum", lambda a, b: M.maximum(a, b), lambda a, b: torch.maximum(a, b), *BINARY[:3],
          domain="distinct"),
    *rows("minimum", lambda a, b: a.minimum(b), lambda a, b: a.minimum(b), *BINARY[:3], domain="distinct"),
    *rows("where", lambda a, b: M.where(_mt(COND), a, b), lambda a, b: torch.where(_tt(COND), a, b),
          ((3, 4), (3, 4)), ((3, 1), (1, 4)), ((), (4,))),
    *rows("where_scalar", lambda a: M.where(_mt(COND), a, 0.0), lambda a: torch.where(_tt(COND), a, 0.0),
          ((3, 4),)),
    # -- comparisons and logic (bool results, no gradient) -------------------------------------
    *rows("lt", lambda a, b: a < b, lambda a, b: a < b, *BINARY, differentiable=False),
    *rows("le", lambda a, b: a <= b, lambda a, b: a <= b, ((3, 1), (1, 4)), differentiable=False),
    *rows("gt", lambda a, b: a > b, lambda a, b: a > b, ((3, 1), (1, 4)), differentiable=False),
    *rows("ge", lambda a, b: a.ge(b), lambda a, b: a.ge(b), ((3, 4), (3, 4)), differentiable=False),
    *rows("eq", lambda a: a == a, lambda a: a == a, ((3, 4),), differentiable=False),
    *rows("eq_ties", lambda a: a == a.clamp(max=0.0), lambda a: a == a.clamp(max=0.0), ((3, 4),),
          differentiable=False),
    *rows("ne", lambda a, b: a != b, lambda a, b: a != b, ((2, 3, 4), (4,)), differentiable=False),
    *rows("gt_scalar", lambda a: a > 0, lambda a: a > 0, *UNARY, differentiable=False),
    *rows("logical", lambda a, b: ((a > 0) & (b > 0)) | ~(a > b), lambda a, b: ((a > 0) & (b > 0)) | ~(a > b),
          ((3, 4), (3, 4)), differentiable=False),
    # -- reductions ----------------------------------------------------------------------------
    *rows("sum", lambda x: x.sum(), lambda x: x.sum(), ((3, 4, 5),), ((),), reduction=True),
    *rows("sum_dim", lambda x: x.sum(dim=1), lambda x: x.sum(dim=1), ((3, 4, 5),), reduction=True),
    *rows("sum_dims_keepdim", lambda x: x.sum(dim=(0, 2), keepdim=True),
          lambda x: x.sum(dim=(0, 2), keepdim=True), ((3, 4, 5),), reduction=True),
    *rows("sum_negdim", lambda x: M.sum(x, -1), lambda x: torch.sum(x, -1), ((3, 4),), reduction=True),
    *rows("mean", lambda x: x.mean(), lambda x: x.mean(), ((3, 4, 5),), ((),), reduction=True),
    *rows("mean_dim", lambda x: x.mean(dim=-1, keepdim=True), lambda x: x.mean(dim=-1, keepdim=True),
          ((3, 4, 5),), reduction=True),
    *rows("mean_dims", lambda x: x.mean(dim=(0, 1)), lambda x: x.mean(dim=(0, 1)), ((3, 4, 5),), reduction=True),
    *rows("max", lambda x: x.max(), lambda x: x.max(), ((3, 4),), domain="distinct"),
    *rows("max_dim", lambda x: x.max(dim=1), lambda x: x.max(dim=1), ((3, 4, 5),), domain="distinct"),
    *rows("max_dim_keepdim", lambda x: x.max(dim=0, keepdim=True), lambda x: x.max(dim=0, keepdim=True),
          ((3, 4),), domain="distinct"),
    *rows("min", lambda x: x.min(), lambda x: x.min(), ((3, 4),), domain="distinct"),
    *rows("min_dim", lambda x: x.min(dim=-1), lambda x: x.min(dim=-1), ((3, 4),), domain="distinct"),
    *rows("amax", lambda x: x.amax(dim=(0, 2)), lambda x: x.amax(dim=(0, 2)), ((3, 4, 5),), domain="distinct"),
    *rows("amax_keepdim", lambda x: x.amax(dim=1, keepdim=True), lambda x: x.amax(dim=1, keepdim=True),
          ((3, 4),), domain="distinct"),
    *rows("amin", lambda x: x.amin(dim=0), lambda x: x.amin(dim=0), ((3, 4),), domain="distinct"),
    *rows("argmax", lambda x: x.argmax(), lambda x: x.argmax(), ((3, 4),), domain="distinct",
          differentiable=False),
    *rows("argmax_dim", lambda x: x.argmax(dim=1), lambda x: x.argmax(dim=1), ((3, 4, 5),), domain="distinct",
          differentiable=False),
    *rows("argmin_dim_keepdim", lambda x: x.argmin(dim=0, keepdim=True), lambda x: x.argmin(dim=0, keepdim=True),
          ((3, 4),), domain="distinct", differentiable=False),
    *rows("var", lambda x: x.var(), lambda x: x.var(), ((3, 4, 5),), reduction=True),
    *rows("var_dim", lambda x: x.var(dim=1), lambda x: x.var(dim=1), ((3, 4, 5),), reduction=True),
    *rows("var_dim_correction0", lambda x: x.var(dim=(0, 1), correction=0, keepdim=True),
          lambda x: x.var(dim=(0, 1), correction=0, keepdim=True), ((3, 4, 5),), reduction=True),
    *rows("std", lambda x: x.std(), lambda x: x.std(), ((3, 4),), reduction=True),
    *rows("std_dim", lambda x: x.std(dim=-1, keepdim=True), lambda x: x.std(dim=-1, keepdim=True),
          ((3, 4, 5),), reduction=True),
    *rows("prod", lambda x: x.prod(), lambda x: x.prod(), ((3, 4),), domain="nonzero", reduction=True),
    *rows("prod_dim", lambda x: x.prod(dim=1), lambda x: x.prod(dim=1), ((3, 4, 5),), domain="nonzero",
          reduction=True),
    *rows("prod_keepdim", lambda x: x.prod(dim=0, keepdim=True), lambda x: x.prod(dim=0, keepdim=True),
          ((3, 4),), domain="nonzero", reduction=True),
    *rows("prod_with_zero", lambda x: x.prod(), lambda x: x.prod(), ((2, 3),), domain="one_zero", reduction=True),
    *rows("prod_dim_with_zero", lambda x: x.prod(dim=1), lambda x: x.prod(dim=1), ((2, 3),), domain="one_zero",
          reduction=True),
    *rows("logsumexp", lambda x: x.logsumexp(dim=1), lambda x: x.logsumexp(dim=1), ((3, 4, 5),), reduction=True),
    *rows("logsumexp_dims_keepdim", lambda x: M.logsumexp(x, (0, 1), keepdim=True),
          lambda x: torch.logsumexp(x, (0, 1), keepdim=True), ((3, 4, 5),), reduction=True),
    *rows("logsumexp_large", lambda x: x.logsumexp(dim=-1), lambda x: x.logsumexp(dim=-1), ((3, 4),),
          domain="large", reduction=True),
    *rows("softmax", lambda x: M.softmax(x, -1), lambda x: torch.softmax(x, -1), ((3, 4),), reduction=True),
    *rows("softmax_dim0", lambda x: x.softmax(0), lambda x: x.softmax(0), ((3, 4, 5),), reduction=True),
    *rows("softmax_large", lambda x: M.softmax(x, 1), lambda x: torch.softmax(x, 1), ((3, 4),), domain="large",
          reduction=True),
    *rows("log_softmax", lambda x: M.log_softmax(x, -1), lambda x: torch.log_softmax(x, -1), ((3, 4),),
          reduction=True),
    *rows("log_softmax_dim1", lambda x: x.log_softmax(1), lambda x: x.log_softmax(1), ((2, 3, 4),),
          reduction=True),
    *rows("log_softmax_large", lambda x: M.log_softmax(x, -1), lambda x: torch.log_softmax(x, -1), ((3, 4),),
          domain="large", reduction=True),
    *rows("cross_entropy", lambda z: M.cross_entropy(z, _mt(TARGET)), lambda z: TF.cross_entropy(z, _tt(TARGET)),
          ((4, 5),), reduction=True),
    *rows("cross_entropy_sum", lambda z: M.cross_entropy(z, _mt(TARGET), reduction="sum"),
          lambda z: TF.cross_entropy(z, _tt(TARGET), reduction="sum"), ((4, 5),), reduction=True),
    *rows("cross_entropy_large", lambda z: M.cross_entropy(z, _mt(TARGET)),
          lambda z: TF.cross_entropy(z, _tt(TARGET)), ((4, 5),), domain="large", reduction=True),
    # -- movement ------------------------------------------------------------------------------
    *rows("reshape", lambda x: x.reshape(4, 3), lambda x: x.reshape(4, 3), ((3, 4),)),
    *rows("reshape_infer", lambda x: x.reshape((2, -1, 2)), lambda x: x.reshape((2, -1, 2)), ((3, 4),)),
    *rows("reshape_0d", lambda x: x.reshape(1, 1), lambda x: x.reshape(1, 1), ((),)),
    *rows("reshape_fn", lambda x: M.reshape(x, (-1,)), lambda x: torch.reshape(x, (-1,)), ((2, 3, 4),)),
    *rows("view", lambda x: x.view(12), lambda x: x.view(12), ((3, 4),)),
    *rows("view_infer", lambda x: x.view(-1, 6), lambda x: x.view(-1, 6), ((2, 3, 4),)),
    *rows("flatten", lambda x: x.flatten(), lambda x: x.flatten(), ((2, 3, 4),)),
    *rows("flatten_start", lambda x: x.flatten(1), lambda x: x.flatten(1), ((2, 3, 4),)),
    *rows("flatten_range", lambda x: M.flatten(x, 0, 1), lambda x: torch.flatten(x, 0, 1), ((2, 3, 4),)),
    *rows("squeeze", lambda x: x.squeeze(), lambda x: x.squeeze(), ((1, 3, 1, 4),)),
    *rows("squeeze_dim", lambda x: x.squeeze(0), lambda x: x.squeeze(0), ((1, 3, 1, 4),)),
    *rows("squeeze_negdim", lambda x: x.squeeze(-2), lambda x: x.squeeze(-2), ((1, 3, 1, 4),)),
    *rows("squeeze_noop", lambda x: x.squeeze(1), lambda x: x.squeeze(1), ((1, 3, 1, 4),)),
    *rows("unsqueeze", lambda x: x.unsqueeze(0), lambda x: x.unsqueeze(0), ((3, 4),), ((),)),
    *rows("unsqueeze_neg", lambda x: M.unsqueeze(x, -1), lambda x: torch.unsqueeze(x, -1), ((3, 4),)),
    *rows("transpose", lambda x: x.transpose(0, 1), lambda x: x.transpose(0, 1), ((3, 4),)),
    *rows("transpose_neg", lambda x: M.transpose(x, -1, 0), lambda x: torch.transpose(x, -1, 0), ((2, 3, 4),)),
    *rows("t", lambda x: x.t(), lambda x: x.t(), ((3, 4),), ((4,),), ((),)),
    *rows("permute", lambda x: x.permute(2, 0, 1), lambda x: x.permute(2, 0, 1), ((2, 3, 4),)),
    *rows("permute_tuple", lambda x: M.permute(x, (1, 0, 2)), lambda x: torch.permute(x, (1, 0, 2)), ((2, 3, 4),)),
    *rows("T", lambda x: x.T, lambda x: x.T, ((3, 4),)),
    *rows("mT", lambda x: x.mT, lambda x: x.mT, ((2, 3, 4),)),
    *rows("expand", lambda x: x.expand(3, 4), lambda x: x.expand(3, 4), ((3, 1),)),
    *rows("expand_new_dims", lambda x: x.expand(2, 3, 4), lambda x: x.expand(2, 3, 4), ((3, 1),)),
    *rows("expand_minus_one", lambda x: x.expand(-1, 4), lambda x: x.expand(-1, 4), ((3, 1),)),
    *rows("expand_0d", lambda x: x.expand(2, 3), lambda x: x.expand(2, 3), ((),)),
    *rows("broadcast_to", lambda x: x.broadcast_to((2, 3, 4)), lambda x: x.broadcast_to((2, 3, 4)), ((3, 1),)),
    *rows("broadcast_to_fn", lambda x: M.broadcast_to(x, (3, 4)), lambda x: torch.broadcast_to(x, (3, 4)), ((4,),)),
    *rows("cat", lambda a, b: M.cat([a, b]), lambda a, b: torch.cat([a, b]), ((2, 3), (4, 3))),
    *rows("cat_dim1", lambda a, b, c: M.cat((a, b, c), dim=1), lambda a, b, c: torch.cat((a, b, c), dim=1),
          ((2, 1), (2, 3), (2, 2))),
    *rows("cat_negdim", lambda a, b: M.cat([a, b], -1), lambda a, b: torch.cat([a, b], -1), ((2, 3, 1), (2, 3, 2))),
    *rows("stack", lambda a, b: M.stack([a, b]), lambda a, b: torch.stack([a, b]), ((3, 4), (3, 4))),
    *rows("stack_dim", lambda a, b, c: M.stack([a, b, c], dim=1), lambda a, b, c: torch.stack([a, b, c], dim=1),
          ((3, 4), (3, 4), (3, 4))),
    *rows("stack_negdim", lambda a, b: M.stack([a, b], -1), lambda a, b: torch.stack([a, b], -1), ((3,), (3,))),
    *rows("stack_0d", lambda a, b: M.stack([a, b]), lambda a, b: torch.stack([a, b]), ((), ())),
    *rows("split", lambda x: x.split(2), lambda x: x.split(2), ((5, 3),)),
    *rows("split_dim", lambda x: x.split(2, dim=1), lambda x: x.split(2, dim=1), ((3, 5),)),
    *rows("split_sections", lambda x: M.split(x, [1, 4], 1), lambda x: torch.split(x, [1, 4], 1), ((3, 5),)),
    *rows("chunk", lambda x: x.chunk(3), lambda x: x.chunk(3), ((6, 2),)),
    *rows("chunk_uneven", lambda x: M.chunk(x, 2, dim=1), lambda x: torch.chunk(x, 2, dim=1), ((3, 5),)),
    *rows("pad", lambda x: M.pad(x, (1, 2)), lambda x: TF.pad(x, (1, 2)), ((3, 4),)),
    *rows("pad_2d", lambda x: M.pad(x, (1, 1, 2, 0)), lambda x: TF.pad(x, (1, 1, 2, 0)), ((2, 3, 4),)),
    *rows("pad_value", lambda x: M.pad(x, (0, 1), value=0.5), lambda x: TF.pad(x, (0, 1), value=0.5), ((3, 4),)),
    *rows("flip", lambda x: x.flip((0,)), lambda x: x.flip((0,)), ((3, 4),)),
    *rows("flip_dims", lambda x: M.flip(x, (0, 2)), lambda x: torch.flip(x, (0, 2)), ((2, 3, 4),)),
    *rows("repeat", lambda x: x.repeat(2, 3), lambda x: x.repeat(2, 3), ((2, 3),)),
    *rows("repeat_new_dim", lambda x: x.repeat(2, 1, 1), lambda x: x.repeat(2, 1, 1), ((2, 3),)),
    # -- indexing ------------------------------------------------------------------------------
    *rows("getitem_int", lambda x: x[1], lambda x: x[1], ((3, 4),)),
    *rows("getitem_negint", lambda x: x[-1, 2], lambda x: x[-1, 2], ((3, 4),)),
    *rows("getitem_slice", lambda x: x[1:3], lambda x: x[1:3], ((4, 3),)),
    *rows("getitem_step", lambda x: x[::2, 1:], lambda x: x[::2, 1:], ((5, 3),)),
    *rows("getitem_column", lambda x: x[:, 1], lambda x: x[:, 1], ((3, 4),)),
    *rows("getitem_none", lambda x: x[None, :, None], lambda x: x[None, :, None], ((3, 4),)),
    *rows("getitem_ellipsis", lambda x: x[..., 0], lambda x: x[..., 0], ((2, 3, 4),)),
    *rows("getitem_mixed", lambda x: x[1, ..., None, ::2], lambda x: x[1, ..., None, ::2], ((2, 3, 4),)),
    *rows("getitem_int_list", lambda x: x[[0, 2, 0]], lambda x: x[[0, 2, 0]], ((3, 4),)),
    *rows("getitem_int_tensor", lambda x: x[_mt(IDX)], lambda x: x[_tt(IDX)], ((3, 4),)),
    *rows("getitem_int_tensor_dim1", lambda x: x[:, _mt(IDX)], lambda x: x[:, _tt(IDX)], ((2, 3),)),
    *rows("getitem_int_pair", lambda x: x[[0, 1, 1], [2, 3, 3]], lambda x: x[[0, 1, 1], [2, 3, 3]], ((3, 4),)),
    *rows("getitem_bool_mask", lambda x: x[_mt(MASK)], lambda x: x[_tt(MASK)], ((3, 4),)),
    *rows("getitem_bool_from_input", lambda x: x[x > 0], lambda x: x[x > 0], ((3, 4),)),
    *rows("getitem_bool_rows", lambda x: x[_mt(MASK[:, 0])], lambda x: x[_tt(MASK[:, 0])], ((3, 4),)),
    # -- linear algebra ------------------------------------------------------------------------
    *rows("matmul", lambda a, b: a @ b, lambda a, b: a @ b,
          ((3,), (3,)), ((3, 4), (4,)), ((3,), (3, 4)), ((3, 4), (4, 5)), ((2, 3, 4), (4, 5)),
          ((2, 1, 3, 4), (5, 4, 2)), ((3, 4), (2, 4, 5)), ((2, 3, 4), (4,)), reduction=True),
    *rows("roll", lambda x: x.roll(1, 0), lambda x: x.roll(1, 0), ((3, 4),)),
    *rows("roll_dims", lambda x: x.roll((2, -1), (1, 0)), lambda x: x.roll((2, -1), (1, 0)), ((3, 4),)),
    *rows("roll_flat", lambda x: x.roll(5), lambda x: x.roll(5), ((3, 4),)),
    *rows("linear", lambda x, w, b: M.linear(x, w, b), lambda x, w, b: torch.nn.functional.linear(x, w, b),
          ((3, 4), (5, 4), (5,)), ((2, 3, 4), (5, 4), (5,)), reduction=True),
    *rows("linear_no_bias", lambda x, w: M.linear(x, w), lambda x, w: torch.nn.functional.linear(x, w),
          ((3, 4), (5, 4)), reduction=True),
    *rows("matmul_fn", lambda a, b: M.matmul(a, b), lambda a, b: torch.matmul(a, b), ((3, 4), (4, 2)),
          reduction=True),
    *rows("einsum_mm", lambda a, b: M.einsum("ij,jk->ik", a, b), lambda a, b: torch.einsum("ij,jk->ik", a, b),
          ((3, 4), (4, 5)), reduction=True),
    *rows("einsum_bmm", lambda a, b: M.einsum("bij,bjk->bik", a, b),
          lambda a, b: torch.einsum("bij,bjk->bik", a, b), ((2, 3, 4), (2, 4, 5)), reduction=True),
    *rows("einsum_dot", lambda a, b: M.einsum("i,i->", a, b), lambda a, b: torch.einsum("i,i->", a, b),
          ((4,), (4,)), reduction=True),
    *rows("einsum_outer", lambda a, b: M.einsum("i,j->ij", a, b), lambda a, b: torch.einsum("i,j->ij", a, b),
          ((3,), (4,))),
    *rows("einsum_rowdot", lambda a, b: M.einsum("ij,ij->i", a, b), lambda a, b: torch.einsum("ij,ij->i", a, b),
          ((3, 4), (3, 4)), reduction=True),
    *rows("einsum_transposed", lambda a, b: M.einsum("ij,kj->ki", a, b),
          lambda a, b: torch.einsum("ij,kj->ki", a, b), ((3, 4), (5, 4)), reduction=True),
    *rows("einsum_implicit", lambda a, b: M.einsum("ij,jk", a, b), lambda a, b: torch.einsum("ij,jk", a, b),
          ((3, 4), (4, 5)), reduction=True),
    # -- more elementwise, logic and reductions -------------------------------------------------
    *rows("erf", lambda x: M.erf(x), lambda x: torch.erf(x), *UNARY),
    *rows("clip", lambda x: M.clip(x, -0.5, 0.5), lambda x: torch.clip(x, -0.5, 0.5), ((3, 4),), domain="distinct"),
    *rows("clone", lambda x: M.clone(x), lambda x: torch.clone(x), *UNARY),
    *rows("contiguous", lambda x: M.contiguous(x.T), lambda x: x.T.contiguous(), ((3, 4),)),
    *rows("cast", lambda x: M.cast(x > 0, x.dtype) * x, lambda x: (x > 0).to(x.dtype) * x, ((3, 4),),
          domain="distinct"),
    *rows("to_device", lambda x: M.to_device(x * 2, x.device), lambda x: (x * 2).to(x.device), ((3, 4),)),
    *rows("dropout_p0", lambda x: M.dropout(x, 0.0), lambda x: TF.dropout(x, 0.0), ((3, 4),)),  # random masks
    *rows("dropout_p1", lambda x: M.dropout(x, 1.0), lambda x: TF.dropout(x, 1.0), ((3, 4),)),  # never agree
    *rows("logical_and", lambda a, b: M.logical_and(a > 0, b > 0), lambda a, b: torch.logical_and(a > 0, b > 0),
          ((3, 4), (3, 4)), differentiable=False),
    *rows("logical_or", lambda a, b: M.logical_or(a > 0, b > 0), lambda a, b: torch.logical_or(a > 0, b > 0),
          ((3, 4), (3, 4)), differentiable=False),
    *rows("logical_not", lambda a: M.logical_not(a > 0), lambda a: torch.logical_not(a > 0), ((3, 4),),
          differentiable=False),
    *rows("bitwise_and", lambda a, b: M.bitwise_and((a * 10).long(), (b * 10).long()),
          lambda a, b: torch.bitwise_and((a * 10).long(), (b * 10).long()), ((3, 4), (3, 4)), differentiable=False),
    *rows("bitwise_or", lambda a, b: M.bitwise_or((a * 10).long(), (b * 10).long()),
          lambda a, b: torch.bitwise_or((a * 10).long(), (b * 10).long()), ((3, 4), (3, 4)), differentiable=False),
    *rows("bitwise_not", lambda a: M.bitwise_not((a * 10).long()), lambda a: torch.bitwise_not((a * 10).long()),
          ((3, 4),), differentiable=False),
    *rows("all", lambda x: M.all(x > 0), lambda x: torch.all(x > 0), ((3, 4),), differentiable=False),
    *rows("all_dim", lambda x: M.all(x > -1, dim=1), lambda x: torch.all(x > -1, dim=1), ((3, 4),),
          differentiable=False),
    *rows("any", lambda x: M.any(x > 1, dim=0, keepdim=True), lambda x: torch.any(x > 1, dim=0, keepdim=True),
          ((3, 4),), differentiable=False),
    *rows("cumsum", lambda x: M.cumsum(x, 1), lambda x: torch.cumsum(x, 1), ((3, 4, 5),), reduction=True),
    *rows("cumsum_neg", lambda x: x.cumsum(-1), lambda x: x.cumsum(-1), ((3, 4),), reduction=True),
    *rows("sum_to", lambda x: M.sum_to(x, (1, 4)), lambda x: x.sum(0, keepdim=True), ((3, 4),), reduction=True),
    *rows("layer_norm", lambda x: F.layer_norm(x, (5,)), lambda x: TF.layer_norm(x, (5,)), ((3, 4, 5),),
          reduction=True),
    *rows("batch_norm", lambda x: F.batch_norm(x, None, None, training=True),
          lambda x: TF.batch_norm(x, None, None, training=True), ((4, 3, 2, 2),), reduction=True),
    *rows("batch_norm_affine", lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
          lambda x, w, b: TF.batch_norm(x, None, None, w, b, training=True), ((4, 3, 2, 2), (3,), (3,)),
          reduction=True),
    *rows("nll_loss", lambda z: M.nll_loss(M.log_softmax(z, -1), _mt(TARGET)),
          lambda z: TF.nll_loss(torch.log_softmax(z, -1), _tt(TARGET)), ((4, 5),), reduction=True),
    *rows("nll_loss_sum", lambda z: M.nll_loss(z, _mt(TARGET), reduction="sum"),
          lambda z: TF.nll_loss(z, _tt(TARGET), reduction="sum"), ((4, 5),)),
    # -- more movement and indexing --------------------------------------------------------------
    *rows("movedim", lambda x: M.movedim(x, 0, -1), lambda x: torch.movedim(x, 0, -1), ((2, 3, 4),)),
    *rows("narrow", lambda x: M.narrow(x, 1, 1, 2), lambda x: torch.narrow(x, 1, 1, 2), ((3, 4),)),
    *rows("gather", lambda x: M.gather(x, 0, _mt(GATHER)), lambda x: torch.gather(x, 0, _tt(GATHER)), ((3, 4),)),
    *rows("index_select", lambda x: M.index_select(x, 0, _mt(IDX)), lambda x: torch.index_select(x, 0, _tt(IDX)),
          ((3, 4),)),
    *rows("index_select_dim1", lambda x: M.index_select(x, 1, _mt(IDX)),
          lambda x: torch.index_select(x, 1, _tt(IDX)), ((2, 3),)),
    *rows("index_add", lambda x, s: M.index_add(x, 0, _mt(IDX), s), lambda x, s: torch.index_add(x, 0, _tt(IDX), s),
          ((3, 4), (3, 4))),
    *rows("scatter_add", lambda x, s: M.scatter_add(x, 0, _mt(GATHER), s),
          lambda x, s: torch.scatter_add(x, 0, _tt(GATHER), s), ((3, 4), (2, 4))),
    # -- masks, triangles, top-k and norms (minigrad/ops/masking.py) --------------------------------
    *rows("tril", lambda x: M.tril(x), lambda x: torch.tril(x), ((3, 4),), ((2, 4, 3),)),
    *rows("tril_diagonal", lambda x: x.tril(-1), lambda x: x.tril(-1), ((4, 4),)),
    *rows("triu", lambda x: M.triu(x, 1), lambda x: torch.triu(x, 1), ((3, 4),), ((2, 4, 3),)),
    *rows("masked_fill", lambda x: M.masked_fill(x, _mt(MASK), -2.5), lambda x: x.masked_fill(_tt(MASK), -2.5),
          ((3, 4),)),
    *rows("masked_fill_broadcast", lambda x: x.masked_fill(_mt(MASK[:1]), 0.0),
          lambda x: x.masked_fill(_tt(MASK[:1]), 0.0), ((3, 4),)),
    *rows("topk", lambda x: M.topk(x, 2)[0], lambda x: torch.topk(x, 2)[0], ((3, 4),), domain="distinct"),
    *rows("topk_smallest_dim0", lambda x: x.topk(2, dim=0, largest=False).values,
          lambda x: x.topk(2, dim=0, largest=False).values, ((3, 4),), domain="distinct"),
    *rows("norm", lambda x: M.norm(x), lambda x: torch.norm(x), ((3, 4),), domain="positive", reduction=True),
    *rows("norm_p1_dim", lambda x: x.norm(1, dim=1), lambda x: x.norm(1, dim=1), ((3, 4),), domain="distinct",
          reduction=True, smooth=False),
    *rows("norm_p3_keepdim", lambda x: M.norm(x, 3, dim=0, keepdim=True),
          lambda x: torch.norm(x, 3, dim=0, keepdim=True), ((3, 4),), domain="positive", reduction=True),
    *rows("norm_inf", lambda x: M.norm(x, math.inf, dim=-1), lambda x: torch.norm(x, math.inf, dim=-1),
          ((3, 4),), domain="distinct", reduction=True, smooth=False),
    *rows("index_put", lambda x, v: M.index_put(x, (_mt(UNIQUE),), v),
          lambda x, v: torch.index_put(x, (_tt(UNIQUE),), v), ((3, 4), (2, 4))),
    # -- linear algebra, convolution and pooling -------------------------------------------------
    *rows("mm", lambda a, b: M.mm(a, b), lambda a, b: torch.mm(a, b), ((3, 4), (4, 5)), reduction=True),
    *rows("bmm", lambda a, b: M.bmm(a, b), lambda a, b: torch.bmm(a, b), ((2, 3, 4), (2, 4, 5)), reduction=True),
    *rows("dot", lambda a, b: M.dot(a, b), lambda a, b: torch.dot(a, b), ((4,), (4,)), reduction=True),
    *rows("outer", lambda a, b: M.outer(a, b), lambda a, b: torch.outer(a, b), ((3,), (4,))),
    *rows("conv2d", lambda x, w, b: M.conv2d(x, w, b), lambda x, w, b: TF.conv2d(x, w, b),
          ((2, 3, 5, 5), (4, 3, 3, 3), (4,)), reduction=True),
    *rows("conv2d_strided", lambda x, w: M.conv2d(x, w, stride=2, padding=1, dilation=(1, 2)),
          lambda x, w: TF.conv2d(x, w, stride=2, padding=1, dilation=(1, 2)), ((1, 2, 6, 7), (3, 2, 3, 2)),
          reduction=True),
    *rows("conv2d_groups", lambda x, w: M.conv2d(x, w, groups=2), lambda x, w: TF.conv2d(x, w, groups=2),
          ((1, 4, 4, 4), (6, 2, 2, 2)), reduction=True),
    *rows("conv1d", lambda x, w, b: M.conv1d(x, w, b, padding=1), lambda x, w, b: TF.conv1d(x, w, b, padding=1),
          ((2, 3, 6), (4, 3, 3), (4,)), reduction=True),
    *rows("conv_transpose2d", lambda x, w, b: M.conv_transpose2d(x, w, b, stride=2),
          lambda x, w, b: TF.conv_transpose2d(x, w, b, stride=2), ((1, 3, 3, 3), (3, 2, 2, 2), (2,)),
          reduction=True),
    *rows("conv_transpose1d", lambda x, w, b: M.conv_transpose1d(x, w, b, stride=2, padding=1, output_padding=1),
          lambda x, w, b: TF.conv_transpose1d(x, w, b, stride=2, padding=1, output_padding=1),
          ((2, 4, 5), (4, 3, 3), (3,)), reduction=True),
    *rows("conv_transpose1d_groups", lambda x, w: M.conv_transpose1d(x, w, groups=2, dilation=2),
          lambda x, w: TF.conv_transpose1d(x, w, groups=2, dilation=2), ((1, 4, 4), (4, 1, 2)), reduction=True),
    *rows("conv_transpose2d_output_padding",
          lambda x, w: M.conv_transpose2d(x, w, stride=(2, 3), output_padding=(1, 2)),
          lambda x, w: TF.conv_transpose2d(x, w, stride=(2, 3), output_padding=(1, 2)), ((1, 2, 3, 2), (2, 3, 2, 2)),
          reduction=True),
    # -- regression losses and channel dropout (nn.functional) -------------------------------------
    *rows("smooth_l1_loss", lambda a, b: F.smooth_l1_loss(a, b), lambda a, b: TF.smooth_l1_loss(a, b),
          ((3, 4), (3, 4)), domain="distinct", reduction=True),
    *rows("smooth_l1_loss_beta", lambda a, b: F.smooth_l1_loss(a, b, reduction="none", beta=0.5),
          lambda a, b: TF.smooth_l1_loss(a, b, reduction="none", beta=0.5), ((3, 4), (3, 4)), domain="distinct"),
    *rows("smooth_l1_loss_beta0", lambda a, b: F.smooth_l1_loss(a, b, reduction="sum", beta=0.0),
          lambda a, b: TF.smooth_l1_loss(a, b, reduction="sum", beta=0.0), ((3, 4), (3, 4)), domain="distinct",
          reduction=True, smooth=False),
    *rows("huber_loss", lambda a, b: F.huber_loss(a, b), lambda a, b: TF.huber_loss(a, b), ((3, 4), (3, 4)),
          domain="distinct", reduction=True),
    *rows("huber_loss_delta", lambda a, b, w: F.huber_loss(a, b, reduction="sum", delta=0.5, weight=w),
          lambda a, b, w: TF.huber_loss(a, b, reduction="sum", delta=0.5, weight=w), ((3, 4), (3, 4), (3, 4)),
          domain="distinct", reduction=True),
    *rows("dropout1d_p1", lambda x: F.dropout1d(x, 1.0), lambda x: TF.dropout1d(x, 1.0), ((2, 3, 4),)),
    # -- storage and layout (chapter 01, lesson 05) ----------------------------------------------
    *rows("as_strided", lambda x: M.as_strided(x, (3, 3), (2, 1), 1), lambda x: torch.as_strided(x, (3, 3), (2, 1), 1),
          ((3, 4),)),
    *rows("as_strided_overlap", lambda x: x.as_strided((4, 3), (1, 1)), lambda x: x.as_strided((4, 3), (1, 1)),
          ((6,),)),
    *rows("as_strided_of_view", lambda x: x.T.as_strided((2, 2), (1, 4)), lambda x: x.T.as_strided((2, 2), (1, 4)),
          ((3, 4),)),
    *rows("as_strided_of_expand", lambda x: x.expand(3, 4).as_strided((2, 2), (1, 1)),
          lambda x: x.expand(3, 4).as_strided((2, 2), (1, 1)), ((3, 1),)),
    *rows("to_memory_format", lambda x: M.to_memory_format(x, minigrad.channels_last) * x,
          lambda x: x.to(memory_format=torch.channels_last) * x, ((2, 3, 4, 5),)),
    *rows("conv2d_channels_last", lambda x, w: M.conv2d(x.contiguous(memory_format=minigrad.channels_last), w, padding=1),
          lambda x, w: TF.conv2d(x.contiguous(memory_format=torch.channels_last), w, padding=1),
          ((2, 3, 5, 5), (4, 3, 3, 3)), reduction=True),
    *rows("max_pool2d_channels_last", lambda x: M.max_pool2d(x.contiguous(memory_format=minigrad.channels_last), 2),
          lambda x: TF.max_pool2d(x.contiguous(memory_format=torch.channels_last), 2), ((2, 3, 4, 6),),
          domain="distinct"),
    *rows("max_pool2d", lambda x: M.max_pool2d(x, 2), lambda x: TF.max_pool2d(x, 2), ((2, 3, 4, 6),),
          domain="distinct"),
    *rows("max_pool2d_padded", lambda x: M.max_pool2d(x, 3, stride=2, padding=1),
          lambda x: TF.max_pool2d(x, 3, stride=2, padding=1), ((1, 2, 5, 5),), domain="distinct"),
    *rows("avg_pool2d", lambda x: M.avg_pool2d(x, 2), lambda x: TF.avg_pool2d(x, 2), ((2, 3, 4, 6),),
          reduction=True),
    *rows("avg_pool2d_padded", lambda x: M.avg_pool2d(x, 3, stride=2, padding=1, count_include_pad=False),
          lambda x: TF.avg_pool2d(x, 3, stride=2, padding=1, count_include_pad=False), ((1, 2, 5, 5),),
          reduction=True),
    *rows("adaptive_avg_pool2d", lambda x: M.adaptive_avg_pool2d(x, (2, 3)),
          lambda x: TF.adaptive_avg_pool2d(x, (2, 3)), ((2, 3, 4, 6),), ((1, 2, 5, 7),), reduction=True),
    *rows("lstm_gates", M.lstm_gates, _torch_lstm_gates, ((2, 12), (2, 12), (2, 3)), ((2, 5, 8), (2, 5, 8), (2, 5, 2))),
    *rows("gru_gates", M.gru_gates, _torch_gru_gates, ((2, 9), (2, 9), (2, 3)), ((4, 6), (4, 6), (4, 2))),
    *rows("unbind", lambda x: M.unbind(x, 1), lambda x: torch.unbind(x, 1), ((3, 4, 2),)),
]

assert len({op.name for op in OPS}) == len(OPS), "op names must be unique (they are the test ids)"
