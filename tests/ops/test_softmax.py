"""Softmax, log-softmax, cross-entropy and nll_loss (minigrad/ops/softmax.py): values and
gradients against PyTorch over every option (weights, ignore_index, label smoothing, reductions,
probability targets, extra dims, unbatched input), first and second derivatives by finite
differences, stability for logits of 1e4, and the errors."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import minigrad as mg
from minigrad import ops
from minigrad.autograd import gradcheck, gradgradcheck
from minigrad.errors import DTypeError, ShapeError

RNG = np.random.default_rng(0)


def t(a, grad=False, dtype=None):
    a = np.asarray(a)
    return mg.tensor(a, dtype=dtype or a.dtype, requires_grad=grad)


# -- softmax and log_softmax ---------------------------------------------------------------------
def np_softmax(a, dim):
    e = np.exp(a - a.max(axis=dim, keepdims=True))
    return e / e.sum(axis=dim, keepdims=True)


@pytest.mark.parametrize("dim", [0, 1, -1, 2])
def test_softmax_and_log_softmax_values(dim):
    x = RNG.standard_normal((2, 3, 4))
    np.testing.assert_allclose(ops.softmax(t(x), dim).numpy(), np_softmax(x, dim), rtol=1e-12)
    np.testing.assert_allclose(ops.log_softmax(t(x), dim).numpy(), np.log(np_softmax(x, dim)), rtol=1e-12)
    assert t(x).softmax(dim).shape == x.shape


def test_0d_and_float16_inputs():
    assert ops.softmax(t(3.0), 0).item() == 1.0 and ops.log_softmax(t(3.0), -1).item() == 0.0
    x = RNG.standard_normal((4, 6))
    for fn, ref in ((ops.softmax, np_softmax), (ops.log_softmax, lambda a, d: np.log(np_softmax(a, d)))):
        out = fn(t(x, dtype="float16"), 1)
        assert out.dtype == mg.float16
        np.testing.assert_allclose(out.numpy().astype("float64"), ref(x.astype("float16").astype("float64"), 1),
                                   rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("fn", [ops.softmax, ops.log_softmax])
@pytest.mark.parametrize("dim", [0, -1])
def test_first_and_second_derivatives(fn, dim):
    x = t(RNG.standard_normal((3, 4)), grad=True)
    assert gradcheck(lambda x: fn(x, dim), (x,))
    assert gradgradcheck(lambda x: fn(x, dim), (x,))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_against_torch(dtype):
    torch = pytest.importorskip("torch")
    x = RNG.standard_normal((3, 5, 2)).astype(dtype)
    v = RNG.standard_normal((3, 5, 2)).astype(dtype)
    for name in ("softmax", "log_softmax"):
        for dim in (1, -1):
            a, ta = t(x, grad=True), torch.tensor(x, requires_grad=True)
            out, tout = getattr(ops, name)(a, dim), getattr(torch, name)(ta, dim)
            (out * t(v)).sum().backward()
            (tout * torch.tensor(v)).sum().backward()
            tol = 1e-6 if dtype == "float32" else 1e-12
            np.testing.assert_allclose(out.detach().numpy(), tout.detach().numpy(), rtol=tol, atol=tol)
            np.testing.assert_allclose(a.grad.numpy(), ta.grad.numpy(), rtol=tol, atol=tol)
            assert out.dtype == a.dtype


def test_logits_of_1e4_stay_finite():
    x = t([[1e4, 0.0, -1e4], [1e4, 1e4, 1e4]], grad=True, dtype="float32")
    s, ls = ops.softmax(x, 1), ops.log_softmax(x, 1)
    np.testing.assert_allclose(s.detach().numpy(), [[1, 0, 0], [1 / 3, 1 / 3, 1 / 3]], atol=1e-6)
    np.testing.assert_allclose(ls.detach().numpy()[0], [0, -1e4, -2e4])
    assert np.all(np.isfinite(ls.detach().numpy()))
    (s[:, 0].sum() + ls[:, 1].sum()).backward()
    assert np.all(np.isfinite(x.grad.numpy()))


def test_integer_input_is_rejected():
    with pytest.raises(DTypeError, match="softmax"):
        ops.softmax(mg.tensor([1, 2, 3]), 0)
    with pytest.raises(ShapeError, match=r"log_softmax.*\(2, 3\)"):
        ops.log_softmax(mg.ones(2, 3), 2)


# -- cross_entropy and nll_loss --------------------------------------------------------------------
C = 4
SHAPES = {"2d": ((5, C), (5,)), "4d": ((2, C, 3, 2), (2, 3, 2)), "unbatched": ((C,), ())}


def _targets(shape, ignore=True):
    target = RNG.integers(0, C, shape)
    if ignore and target.size > 1:
        target.reshape(-1)[1] = -100
    return target


@pytest.mark.parametrize("kind", list(SHAPES))
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_with_class_indices_against_torch(kind, reduction):
    torch = pytest.importorskip("torch")
    TF = torch.nn.functional
    xs, ts = SHAPES[kind]
    x, target = RNG.standard_normal(xs), _targets(ts, ignore=kind != "unbatched")
    weight = RNG.uniform(0.5, 2.0, C)
    for use_weight, ls in itertools.product((False, True), (0.0, 0.2)):
        w = dict(weight=t(weight)) if use_weight else {}
        tw = dict(weight=torch.tensor(weight)) if use_weight else {}
        a, ta = t(x, grad=True), torch.tensor(x, requires_grad=True)
        out = ops.cross_entropy(a, t(target), reduction=reduction, label_smoothing=ls, **w)
        tout = TF.cross_entropy(ta, torch.tensor(target), reduction=reduction, label_smoothing=ls, **tw)
        assert out.shape == tuple(tout.shape)
        np.testing.assert_allclose(out.detach().numpy(), tout.detach().numpy(), rtol=1e-12, atol=1e-12)
        v = RNG.standard_normal(out.shape)
        (out * t(v)).sum().backward()
        (tout * torch.tensor(v)).sum().backward()
        np.testing.assert_allclose(a.grad.numpy(), ta.grad.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["2d", "4d", "unbatched"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_with_probabilities_against_torch(kind, reduction):
    torch = pytest.importorskip("torch")
    TF = torch.nn.functional
    xs, _ = SHAPES[kind]
    x = RNG.standard_normal(xs)
    p = np_softmax(RNG.standard_normal(xs), 0 if kind == "unbatched" else 1)
    weight = RNG.uniform(0.5, 2.0, C)
    for use_weight, ls in itertools.product((False, True), (0.0, 0.3)):
        w = dict(weight=t(weight)) if use_weight else {}
        tw = dict(weight=torch.tensor(weight)) if use_weight else {}
        a, pa = t(x, grad=True), t(p, grad=True)
        ta, tp = torch.tensor(x, requires_grad=True), torch.tensor(p, requires_grad=True)
        out = ops.cross_entropy(a, pa, reduction=reduction, label_smoothing=ls, **w)
        tout = TF.cross_entropy(ta, tp, reduction=reduction, label_smoothing=ls, **tw)
        np.testing.assert_allclose(out.detach().numpy(), tout.detach().numpy(), rtol=1e-12, atol=1e-12)
        out.sum().backward()
        tout.sum().backward()
        np.testing.assert_allclose(a.grad.numpy(), ta.grad.numpy(), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(pa.grad.numpy(), tp.grad.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss_against_torch(reduction):
    torch = pytest.importorskip("torch")
    TF = torch.nn.functional
    for xs, ts in (SHAPES["2d"], SHAPES["4d"]):
        logp, target = np.log(np_softmax(RNG.standard_normal(xs), 1)), _targets(ts)
        weight = RNG.uniform(0.5, 2.0, C)
        a, ta = t(logp, grad=True), torch.tensor(logp, requires_grad=True)
        out = ops.nll_loss(a, t(target), weight=t(weight), reduction=reduction)
        tout = TF.nll_loss(ta, torch.tensor(target), weight=torch.tensor(weight), reduction=reduction)
        np.testing.assert_allclose(out.detach().numpy(), tout.detach().numpy(), rtol=1e-12)
        out.sum().backward()
        tout.sum().backward()
        np.testing.assert_allclose(a.grad.numpy(), ta.grad.numpy(), rtol=1e-12)
    out = ops.nll_loss(t([-0.5, -1.0, -2.0]), t(2))
    assert out.shape == () and out.item() == 2.0


def test_cross_entropy_derivatives_by_finite_differences():
    x = t(RNG.standard_normal((3, C, 2)), grad=True)
    target, weight = t(_targets((3, 2))), t(RNG.uniform(0.5, 2.0, C))
    for reduction, ls in (("mean", 0.1), ("none", 0.0), ("sum", 0.0)):
        def loss(x, reduction=reduction, ls=ls):
            return ops.cross_entropy(x, target, weight=weight, reduction=reduction, label_smoothing=ls)

        assert gradcheck(loss, (x,))
        assert gradgradcheck(loss, (x,))
    p = t(np_softmax(RNG.standard_normal((3, C)), 1), grad=True)
    assert gradcheck(lambda x, p: ops.cross_entropy(x, p), (t(RNG.standard_normal((3, C)), grad=True), p))


def test_cross_entropy_is_stable_for_logits_of_1e4():
    logits = t([[1e4, -1e4, 0.0], [0.0, 1e4, 1e4], [-1e4, -1e4, -1e4]], grad=True, dtype="float32")
    loss = ops.cross_entropy(logits, t([1, 0, 2]), label_smoothing=0.1)
    loss.backward()
    assert np.isfinite(loss.item()) and np.all(np.isfinite(logits.grad.numpy()))
    torch = pytest.importorskip("torch")
    tl = torch.tensor(logits.detach().numpy(), requires_grad=True)
    tloss = torch.nn.functional.cross_entropy(tl, torch.tensor([1, 0, 2]), label_smoothing=0.1)
    tloss.backward()
    np.testing.assert_allclose(loss.item(), tloss.item(), rtol=1e-6)
    np.testing.assert_allclose(logits.grad.numpy(), tl.grad.numpy(), atol=1e-6)


def test_all_targets_ignored_gives_nan_mean_like_torch():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loss = ops.cross_entropy(t(RNG.standard_normal((2, 3))), t([-100, -100]))
    assert np.isnan(loss.item())
    assert ops.cross_entropy(t(RNG.standard_normal((2, 3))), t([-100, -100]), reduction="sum").item() == 0


@pytest.mark.parametrize("call, error, words", [
    (lambda x: ops.cross_entropy(x, t([0, 1.5])), ShapeError, ["cross_entropy", "(2, 3)", "(2,)"]),
    (lambda x: ops.cross_entropy(x, t([True, False])), DTypeError, ["cross_entropy", "bool"]),
    (lambda x: ops.cross_entropy(x, t([[0, 1]])), ShapeError, ["cross_entropy", "(2,)", "(1, 2)"]),
    (lambda x: ops.cross_entropy(x, t([0, 3])), IndexError, ["cross_entropy", "3", "3 classes"]),
    (lambda x: ops.nll_loss(x, t([-1, 0])), IndexError, ["nll_loss", "-1"]),
    (lambda x: ops.cross_entropy(x, t([0, 1]), weight=t([1.0, 2.0])), ShapeError, ["weight", "(3,)", "(2,)"]),
    (lambda x: ops.cross_entropy(x, t([0, 1]), reduction="avg"), ValueError, ["reduction", "avg"]),
    (lambda x: ops.cross_entropy(x, t([0, 1]), label_smoothing=1.5), ValueError, ["label_smoothing"]),
    (lambda x: ops.cross_entropy(x[0, 0], t(0)), ShapeError, ["cross_entropy", "0-D"]),
])
def test_errors_name_the_op_and_the_values(call, error, words):
    with pytest.raises(error) as info:
        call(t(RNG.standard_normal((2, 3))))
    for w in words:
        assert w in str(info.value), str(info.value)
