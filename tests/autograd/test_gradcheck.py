"""gradcheck / gradgradcheck: they pass on correct gradients, and on a wrong one they say exactly where."""

import numpy as np
import pytest

import minigrad
from helpers import to_numpy
from minigrad.autograd import Function, GradcheckError, gradcheck, gradgradcheck
from minigrad.errors import DTypeError


def rand(*shape, requires_grad=True):
    return minigrad.randn(*shape, dtype=minigrad.float64, requires_grad=requires_grad)


def positive(*shape):
    return (minigrad.rand(*shape, dtype=minigrad.float64) + 0.5).requires_grad_()


OPS = {
    "add_broadcast": (lambda a, b: a + b, lambda: (rand(2, 3), rand(3))),
    "sub": (lambda a, b: a - b, lambda: (rand(2, 3), rand(2, 1))),
    "mul_broadcast": (lambda a, b: a * b, lambda: (rand(2, 3), rand(1, 3))),
    "div": (lambda a, b: a / b, lambda: (rand(2, 3), positive(2, 3))),
    "pow": (lambda a, b: a ** b, lambda: (positive(4), rand(4))),
    "pow_scalar": (lambda a: a ** 3, lambda: (rand(4),)),
    "exp": (lambda a: a.exp(), lambda: (rand(3, 2),)),
    "log": (lambda a: a.log(), lambda: (positive(3, 2),)),
    "tanh": (lambda a: a.tanh(), lambda: (rand(5),)),
    "sigmoid": (lambda a: a.sigmoid(), lambda: (rand(5),)),
    "sin_cos": (lambda a: a.sin() * a.cos(), lambda: (rand(2, 2),)),
    "sum_dim": (lambda a: a.sum(1), lambda: (rand(2, 3),)),
    "getitem_repeated": (lambda a: a[[0, 2, 0]] * a[1:].sum(0), lambda: (rand(3, 2),)),
    "reshape_broadcast": (lambda a: a.reshape(3, 1).broadcast_to((3, 4)) * 2, lambda: (rand(3),)),
    "scalar": (lambda a: (a * a).sum(), lambda: (rand(),)),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_correct_gradients_pass(name):
    fn, make = OPS[name]
    inputs = make()
    assert gradcheck(fn, inputs, eps=1e-6, atol=1e-5, rtol=1e-3)
    assert gradgradcheck(fn, inputs)


def test_several_outputs_non_tensor_args_and_inputs_without_grad():
    x, w = rand(2, 3), rand(3, requires_grad=False).to(minigrad.float32)  # not checked: may be float32
    fn = lambda a, b, k: ((a * b).tanh().sum(), a.sin() * k, a > 0)  # noqa: E731  (a bool output is skipped)
    assert gradcheck(fn, (x, w, 2.5))
    assert gradgradcheck(fn, (x, w, 2.5))


def test_identity_and_constant_outputs():
    x = rand(3)
    assert gradcheck(lambda a: a, x)
    assert gradcheck(lambda a: (a * 2, minigrad.ones(2, dtype=minigrad.float64)), x)


def test_inputs_are_left_as_they_were():
    x = rand(2, 3)
    before, version = to_numpy(x), x._version
    gradcheck(lambda a: (a * a).exp(), x)
    assert np.array_equal(to_numpy(x), before) and x._version == version
    assert x.grad is None


class WrongAt(Function):
    """x**2 whose backward is wrong (by half) for one element only: (1, 2)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        wrong = np.ones(x.shape)
        wrong[1, 2] = 1.5
        return g * 2 * x * minigrad.tensor(wrong, dtype=x.dtype)


def test_mismatch_names_input_output_element_and_values():
    x = minigrad.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=minigrad.float64, requires_grad=True)
    y = rand(2, 3)
    with pytest.raises(GradcheckError) as info:
        gradcheck(lambda a, b: (a.sin(), a * WrongAt.apply(b)), (x, y))
    msg = str(info.value)
    assert "output 1 with respect to input 1" in msg
    assert "d output1[1, 2] / d input1[1, 2]" in msg
    numerical, analytical = 2 * 6.0 * y[1, 2].item(), 3 * 6.0 * y[1, 2].item()
    assert f"{numerical:.6g} numerically" in msg and f"{analytical:.6g} analytically" in msg
    assert f"max abs difference {abs(analytical - numerical):.3g}" in msg
    assert isinstance(info.value, RuntimeError)  # torch's GradcheckError is a RuntimeError too


def test_raise_exception_false_returns_false():
    assert gradcheck(WrongAt.apply, rand(2, 3), raise_exception=False) is False


def test_inputs_must_be_float64_and_one_must_require_grad():
    with pytest.raises(DTypeError, match="input 1 requires grad but has dtype float32"):
        gradcheck(lambda a, b: a * b, (rand(2), minigrad.randn(2, requires_grad=True)))
    with pytest.raises(ValueError, match="at least one input"):
        gradcheck(lambda a: a * 2, rand(2, requires_grad=False))


class Jittery(Function):
    """2x with a backward that changes by 1e-9 on every call: right, but not reentrant."""

    calls = 0

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        Jittery.calls += 1
        return g * (2 + 1e-9 * Jittery.calls)


def test_nondeterministic_backward_is_caught_unless_tolerated():
    with pytest.raises(GradcheckError, match="not reentrant"):
        gradcheck(Jittery.apply, rand(3))
    assert gradcheck(Jittery.apply, rand(3), nondet_tol=1e-6)


class CubeFrozenBackward(Function):
    """x**3 whose backward computes 3x**2 from raw arrays: right once, invisible to a second backward."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * minigrad.tensor(3 * x.array ** 2)


def test_gradgradcheck_catches_a_backward_that_is_not_differentiable():
    x = rand(3)
    assert gradcheck(CubeFrozenBackward.apply, x)
    with pytest.raises(GradcheckError, match="with respect to input 0"):
        gradgradcheck(CubeFrozenBackward.apply, x)
    assert gradgradcheck(lambda a: a * a * a, x)


def test_gradgradcheck_with_given_grad_outputs():
    x, y = rand(2, 2), rand(2, 2)
    v = minigrad.tensor([[1.0, -2.0], [0.5, 3.0]], dtype=minigrad.float64, requires_grad=True)
    assert gradgradcheck(lambda a, b: (a * b).tanh(), (x, y), grad_outputs=v)


def test_agrees_with_torch_on_what_passes():
    torch = pytest.importorskip("torch")
    x = rand(4)
    xt = torch.tensor(to_numpy(x), requires_grad=True)
    assert gradcheck(lambda a: a.sigmoid() * a, x) == torch.autograd.gradcheck(lambda a: a.sigmoid() * a, (xt,))
    assert gradgradcheck(lambda a: a.sigmoid() * a, x) == torch.autograd.gradgradcheck(lambda a: a.sigmoid() * a, (xt,))


def test_gradcheck_of_a_function_that_differentiates_inside():
    def meta(theta):  # a MAML-style inner step: the function itself calls grad
        (g,) = minigrad.grad((theta ** 3).sum(), theta, create_graph=True)
        return ((theta - 0.1 * g) ** 2).sum()

    t = minigrad.randn(3, dtype=minigrad.float64, requires_grad=True)
    assert gradcheck(meta, (t,))
    assert gradgradcheck(meta, (t,))
