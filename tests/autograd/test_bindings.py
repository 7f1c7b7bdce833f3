"""One backward rule, two bindings: every rule gives the same gradients, bit for bit, whether the
engine binds ``ctx.ops`` to raw arrays (nobody records the backward pass) or to minigrad's
differentiable ops (the pass is recorded), and every op either writes its rule against
``ctx.ops`` or says why it cannot (``tensor_backward``).

The Tensor binding is forced with an empty mode on the stack (any mode means someone watches),
so both runs take the same engine walk and differ only in the binding.
"""

from __future__ import annotations

import inspect
import re

import numpy as np
import pytest

import minigrad
import minigrad.ops as M
from minigrad.autograd import binding
from minigrad.autograd.function import SAVED_NUMBER, SAVED_VALUE, Function, saved_entries
from minigrad.autograd.mode import Mode
from minigrad.ops.op import Op
from op_table import OPS, OpInfo

DIFFERENTIABLE = [op for op in OPS if op.differentiable]
SMOOTH = [op for op in DIFFERENTIABLE if op.smooth]


def _outs(op: OpInfo, xs: list) -> list:
    res = op.mg(*xs)
    res = list(res) if isinstance(res, (tuple, list)) else [res]
    return [o for o in res if o.requires_grad]


def _grads(op: OpInfo, dtype: str, tensors: bool, order: int = 1) -> list:
    """The gradients of the row's outputs (weighted by fixed cotangents) with respect to its inputs,
    under the Tensor binding when ``tensors`` else under the array binding; ``order=2``: the
    gradients of the sum of those gradients (first order always recorded)."""
    xs = [minigrad.tensor(a, requires_grad=True) for a in op.arrays(dtype)]
    outs = _outs(op, xs)
    rng = np.random.default_rng(0)
    vs = [minigrad.tensor(rng.standard_normal(o.shape).astype(dtype), requires_grad=order == 2) for o in outs]
    if order == 2:
        first = minigrad.grad(outs, xs, vs, create_graph=True, allow_unused=True)
        outs = [sum(g.sum() for g in first if g is not None and g.requires_grad)]
        if not isinstance(outs[0], minigrad.Tensor):
            return []
        vs, xs = [None], xs + vs
    with Mode() if tensors else _Nothing():
        got = minigrad.grad(outs, xs, vs, allow_unused=True)
    return [None if g is None else g.detach().numpy() for g in got]


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> None:
        return None


def _same(op: OpInfo, a: list, b: list) -> None:
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        assert (x is None) == (y is None), f"{op.name}: input {i} has a gradient under one binding only"
        if x is not None:
            assert x.dtype == y.dtype and x.shape == y.shape, f"{op.name}: input {i}: {x.dtype}{x.shape} vs {y.dtype}{y.shape}"
            assert np.array_equal(x, y, equal_nan=True), (
                f"{op.name}: input {i}: the array binding's gradient differs from the Tensor binding's "
                f"(largest difference {np.nanmax(np.abs(x - y))})")


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("op", DIFFERENTIABLE, ids=str)
def test_first_order_gradients_are_bit_identical_under_both_bindings(op: OpInfo, dtype: str):
    if dtype == "float64" and not op.float64:
        pytest.skip("a float32-only row")
    _same(op, _grads(op, dtype, tensors=False), _grads(op, dtype, tensors=True))


@pytest.mark.parametrize("op", SMOOTH, ids=str)
def test_second_order_gradients_are_bit_identical_under_both_bindings(op: OpInfo):
    dtype = "float64" if op.float64 else "float32"
    _same(op, _grads(op, dtype, tensors=False, order=2), _grads(op, dtype, tensors=True, order=2))


def test_the_engine_binds_arrays_only_when_nobody_records():
    seen = []

    class Probe(minigrad.autograd.Function):
        pass

    class Spy(Op):
        onnx_refused = "a test probe"

        @staticmethod
        def forward(ctx, a): return a * 2

        @staticmethod
        def backward(ctx, g):
            seen.append((type(g), ctx.ops.arrays))
            return g * 2

    x = minigrad.randn(3, requires_grad=True)
    Spy.apply(x).sum().backward()
    assert seen[-1] == (np.ndarray, True) and type(x.grad) is minigrad.Tensor
    minigrad.grad(Spy.apply(x).sum(), [x], create_graph=True)
    assert seen[-1] == (minigrad.Tensor, False)
    with Mode():
        Spy.apply(x).sum().backward()
    assert seen[-1] == (minigrad.Tensor, False)
    del Probe


@pytest.mark.parametrize("root", ["own", "float64"])
@pytest.mark.parametrize("number", [1.5, -3.0, 0.1])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("op", ["mul", "div"])
def test_a_product_with_a_number_keeps_its_bits_when_read_as_an_operand_array(op: str, dtype: str, number: float,
                                                                              root: str):
    # the array binding reads the 0-d array forward computed with (numpy's faster path) where it
    # holds the number exactly, the number itself elsewhere: bit for bit numpy's g * number (g /
    # number), with a gradient of the output's dtype or a wider one
    f = (lambda t: t * number) if op == "mul" else (lambda t: t / number)
    x = minigrad.tensor(np.linspace(-2, 3, 7).astype(dtype), requires_grad=True)
    y = f(x)
    exact = float(np.asarray(number, dtype)) == number
    assert [k for k, _ in saved_entries(y.grad_fn)] == [SAVED_VALUE, SAVED_NUMBER if exact else SAVED_VALUE]
    g = np.random.default_rng(1).standard_normal(7).astype(dtype if root == "own" else root)
    grads = []
    for mode in (_Nothing(), Mode()):
        with mode:
            (got,) = minigrad.grad(f(x), [x], minigrad.tensor(g))
        grads.append(got.numpy())
    want = (g * number if op == "mul" else g / number).astype(dtype)
    for got in grads:
        assert got.dtype == want.dtype and np.array_equal(got, want)


def test_a_user_function_reads_tensors_under_the_array_binding():
    seen = []

    class Cube(minigrad.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            seen.append((type(g), type(x), minigrad.is_grad_enabled()))
            return g * 3 * x * x

    x = minigrad.tensor([1.0, 2.0], requires_grad=True)
    Cube.apply(x.exp()).sum().backward()
    assert seen == [(minigrad.Tensor, minigrad.Tensor, False)]
    assert np.allclose(x.grad.numpy(), 3 * np.exp(3 * np.array([1.0, 2.0])))


# Ops whose rule stays on Tensors under either binding, and why (each class says it in a comment).
TENSOR_RULES = {
    "SparseMM": "its rule builds a SparseTensor, which has no array form",
    "SparseEmbedding": "its gradient is a SparseTensor, kept sparse for the weight's .grad",
    "CheckpointFunction": "its rule recomputes the segment and runs a nested backward on Tensors",
    "ToDevice": "its forward and rule move Tensors between devices",
    "LSTMGatesBackward": "a second-derivative rule, written on Tensors (sigmoid, tanh, cat)",
    "GRUGatesBackward": "a second-derivative rule, written on Tensors (sigmoid, tanh, cat)",
    "BatchNormBackward": "a second-derivative rule: its formula on Tensors, differentiated by the engine",
}


def _classes() -> list[type]:
    """Every Function class the package's ops define: the Ops, and the Functions of minigrad.ops."""
    found = list(M.all_ops())
    for mod in ("minigrad.ops.sparse", "minigrad.memory.recompute", "minigrad.ops.elementwise"):
        module = __import__(mod, fromlist=["_"])
        found += [c for c in vars(module).values() if inspect.isclass(c) and issubclass(c, Function)
                  and not issubclass(c, Op) and c is not Function and c.__module__ == mod]
    return found


def test_every_rule_is_written_against_ctx_ops_or_says_why_not():
    for cls in _classes():
        if cls.__name__ in TENSOR_RULES:
            assert "tensor_backward" in vars(cls) and cls.tensor_backward, (
                f"{cls.__name__}: listed as a Tensor rule but does not declare tensor_backward = True")
            continue
        assert not cls.tensor_backward, f"{cls.__name__}: declares tensor_backward without a reason in TENSOR_RULES"
        if cls.backward is Function.backward:
            continue  # no rule (a forward-only op: comparisons, int8 kernels)
        src = re.sub(r'"""[\s\S]*?"""', "", inspect.getsource(cls.backward))  # the code, not its docstring
        for tensor_only in (".array", "_wrap(", "Tensor(", ".apply(g", ".unsqueeze(", ".rsqrt("):
            assert tensor_only not in src, (
                f"{cls.__name__}.backward uses {tensor_only!r}, which only Tensors have: write it with ctx.ops")


def test_the_two_bindings_offer_the_same_names():
    arrays = {n for n in vars(binding.ArrayOps) if not n.startswith("_")} - {"arrays"}
    for name in arrays:
        assert hasattr(binding.TENSOR_OPS, name), f"ctx.ops.{name} exists under the array binding only"


def test_hooks_see_tensors_under_the_array_binding():
    x = minigrad.tensor([1.0, 2.0], requires_grad=True)
    y = x * 3
    seen = []
    y.grad_fn.register_prehook(lambda grads: seen.append(type(grads[0])))
    y.grad_fn.next_functions[0][0].register_prehook(lambda grads: seen.append(type(grads[0])))  # a leaf's node
    x.register_hook(lambda g: seen.append(type(g)))
    y.sum().backward()
    assert seen == [minigrad.Tensor] * 3 and np.array_equal(x.grad.numpy(), [3.0, 3.0])
