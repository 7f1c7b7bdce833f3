"""matmul (with mm, bmm, dot, outer) and einsum (minigrad/ops/linalg.py): every 1-D promotion and
batch-broadcasting rule against numpy and PyTorch, gradients and second derivatives by finite
differences, dtype promotion, and the errors."""

from __future__ import annotations

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


PAIRS = [
    ((3,), (3,)), ((3,), (3, 2)), ((2, 3), (3,)), ((3,), (4, 3, 2)), ((4, 2, 3), (3,)),
    ((2, 3), (3, 4)), ((4, 2, 3), (3, 5)), ((2, 3), (4, 3, 5)), ((4, 2, 3), (4, 3, 5)),
    ((2, 1, 2, 3), (4, 3, 2)), ((1, 2, 3), (5, 3, 2)),
]


@pytest.mark.parametrize("sa, sb", PAIRS, ids=str)
def test_matmul_values_and_gradients(sa, sb):
    a, b = RNG.standard_normal(sa), RNG.standard_normal(sb)
    ta, tb = t(a, grad=True), t(b, grad=True)
    out = ta @ tb
    np.testing.assert_allclose(out.detach().numpy(), a @ b, rtol=1e-12, atol=1e-12)
    assert out.shape == np.shape(a @ b)
    assert gradcheck(ops.matmul, (t(a, grad=True), t(b, grad=True)))


@pytest.mark.parametrize("sa, sb", [((3,), (3,)), ((3,), (3, 2)), ((2, 3), (3,)), ((2, 2, 3), (3, 2)),
                                    ((2, 3), (2, 3, 2))], ids=str)
def test_matmul_second_derivatives(sa, sb):
    a, b = t(RNG.standard_normal(sa), grad=True), t(RNG.standard_normal(sb), grad=True)
    assert gradgradcheck(lambda a, b: ops.matmul(a, b) ** 2, (a, b))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_matmul_against_torch(dtype):
    torch = pytest.importorskip("torch")
    for sa, sb in PAIRS:
        a, b = RNG.standard_normal(sa).astype(dtype), RNG.standard_normal(sb).astype(dtype)
        ta, tb = t(a, grad=True), t(b, grad=True)
        xa, xb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
        out, ref = ta @ tb, xa @ xb
        v = RNG.standard_normal(ref.shape).astype(dtype)
        (out * t(v)).sum().backward()
        (ref * torch.tensor(v)).sum().backward()
        tol = 1e-5 if dtype == "float32" else 1e-12
        np.testing.assert_allclose(out.detach().numpy(), ref.detach().numpy(), rtol=tol, atol=tol)
        np.testing.assert_allclose(ta.grad.numpy(), xa.grad.numpy(), rtol=tol, atol=tol)
        np.testing.assert_allclose(tb.grad.numpy(), xb.grad.numpy(), rtol=tol, atol=tol)
        assert out.dtype == ta.dtype


def test_batched_times_matrix_with_a_non_contiguous_batch():
    a = RNG.standard_normal((3, 4, 5))
    b = RNG.standard_normal((3, 2))
    ta = t(a, grad=True)
    at = ta.transpose(0, 2)  # (5, 4, 3), not contiguous
    tb = t(b, grad=True)
    out = at @ tb
    np.testing.assert_allclose(out.detach().numpy(), a.transpose(2, 1, 0) @ b, rtol=1e-12)
    out.sum().backward()
    np.testing.assert_allclose(tb.grad.numpy(), a.transpose(2, 1, 0).reshape(-1, 3).T @ np.ones((20, 2)), rtol=1e-12)


def test_dtype_promotion_follows_elementwise_rules():
    i, f = mg.tensor([[1, 2], [3, 4]]), mg.tensor([[0.5, 1.0], [1.5, 2.0]])
    assert (i @ i).dtype == mg.int64 and (i @ i).tolist() == [[7, 10], [15, 22]]
    assert (i @ f).dtype == mg.float32 and (f @ i).dtype == mg.float32
    assert (f @ f.double()).dtype == mg.float64
    w = mg.tensor([[1.0, 0.0], [0.0, 1.0]], requires_grad=True)
    (i @ w).sum().backward()
    assert w.grad.tolist() == [[4, 4], [6, 6]]
    assert (mg.tensor([1, 2]) @ np.array([3, 4])).item() == 11


@pytest.mark.parametrize("sa, sb", [((2, 3), (4, 5)), ((3,), (4,)), ((2, 3, 4), (5, 6)), ((2, 2, 3), (3, 3, 4)),
                                    ((3,), (2, 4, 5))], ids=str)
def test_matmul_errors_name_both_shapes(sa, sb):
    with pytest.raises(ShapeError) as info:
        ops.matmul(mg.ones(*sa), mg.ones(*sb))
    assert "matmul" in str(info.value) and str(sa) in str(info.value) and str(sb) in str(info.value)


def test_matmul_rejects_0d_and_scalars():
    with pytest.raises(ShapeError, match="at least 1 dimension"):
        ops.matmul(mg.tensor(2.0), mg.ones(3))
    with pytest.raises(TypeError, match="matmul"):
        ops.matmul(mg.ones(3), 2.0)


def test_mm_bmm_dot_outer():
    a, b = RNG.standard_normal((2, 3)), RNG.standard_normal((3, 4))
    np.testing.assert_allclose(ops.mm(t(a), t(b)).numpy(), a @ b)
    x, y = RNG.standard_normal((5, 2, 3)), RNG.standard_normal((5, 3, 4))
    np.testing.assert_allclose(ops.bmm(t(x), t(y)).numpy(), x @ y)
    u, v = RNG.standard_normal(3), RNG.standard_normal(4)
    assert ops.dot(t(u), t(u)).shape == () and np.isclose(ops.dot(t(u), t(u)).item(), u @ u)
    np.testing.assert_allclose(ops.outer(t(u), t(v)).numpy(), np.outer(u, v))
    assert gradcheck(ops.outer, (t(u, grad=True), t(v, grad=True)))
    for call, name in [(lambda: ops.mm(t(u), t(b)), "mm"), (lambda: ops.bmm(t(x), t(b)), "bmm"),
                       (lambda: ops.bmm(t(x), t(y[:2])), "bmm"), (lambda: ops.dot(t(u), t(v)), "dot"),
                       (lambda: ops.outer(t(a), t(v)), "outer")]:
        with pytest.raises(ShapeError, match=name):
            call()
    with pytest.raises(DTypeError, match="dot"):
        ops.dot(t(u), t(u, dtype="float32"))


# -- einsum ----------------------------------------------------------------------------------------
EQUATIONS = [
    ("ij,jk->ik", (2, 3), (3, 4)), ("bij,bjk->bik", (2, 2, 3), (2, 3, 2)), ("i,i->", (3,), (3,)),
    ("i,j->ij", (2, 3), None), ("ij->ji", (2, 3)), ("ij->", (2, 3)), ("ij->j", (2, 3)),
    ("ii->i", (3, 3)), ("ii", (3, 3)), ("iij->j", (2, 2, 3)), ("ij,jk", (2, 3), (3, 2)), ("ba", (2, 3)),
    ("...ij->...ji", (2, 2, 3)), ("...i,...i->...", (2, 2, 3), (2, 3)), ("b...,b...->b", (2, 3, 2), (2, 3, 2)),
    ("ij,ij->ij", (1, 3), (2, 3)), ("ij,ij->i", (2, 3), (2, 1)), ("i,ii->i", (3,), (3, 3)),
    ("ij,jk,kl->il", (2, 3), (3, 2), (2, 2)), ("bhqd,bhkd->bhqk", (1, 2, 3, 2), (1, 2, 2, 2)),
]


# numpy refuses to sum over '...' dims that the output drops; torch (and minigrad) allow it
NUMPY_EQUATION = {"b...,b...->b": "bxy,bxy->b"}


def _einsum_case(case):
    eq, *shapes = case
    if shapes[-1] is None:  # 'i,j->ij': the second operand has its own length
        shapes = [shapes[0][:1], shapes[0][1:]]
    return eq, [RNG.standard_normal(s) for s in shapes]


@pytest.mark.parametrize("case", EQUATIONS, ids=lambda c: c[0])
def test_einsum_values_and_gradients(case):
    eq, arrays = _einsum_case(case)
    out = ops.einsum(eq, *[t(a) for a in arrays])
    expected = np.einsum(NUMPY_EQUATION.get(eq, eq), *arrays)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-12, atol=1e-12)
    assert gradcheck(lambda *xs: ops.einsum(eq, *xs), tuple(t(a, grad=True) for a in arrays))


@pytest.mark.parametrize("case", [EQUATIONS[i] for i in (0, 7, 8, 13, 15)], ids=lambda c: c[0])
def test_einsum_second_derivatives(case):
    eq, arrays = _einsum_case(case)
    assert gradgradcheck(lambda *xs: ops.einsum(eq, *xs) ** 2, tuple(t(a, grad=True) for a in arrays))


def test_einsum_against_torch():
    torch = pytest.importorskip("torch")
    for case in EQUATIONS:
        eq, arrays = _einsum_case(case)
        ours = [t(a, grad=True) for a in arrays]
        theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
        out, ref = ops.einsum(eq, *ours), torch.einsum(eq, *theirs)
        np.testing.assert_allclose(out.detach().numpy(), ref.detach().numpy(), rtol=1e-12, atol=1e-12)
        v = RNG.standard_normal(ref.shape)
        (out * t(v)).sum().backward()
        (ref * torch.tensor(v)).sum().backward()
        for a, b in zip(ours, theirs):
            np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-12, atol=1e-12, err_msg=eq)


def test_einsum_accepts_a_list_and_promotes_dtypes():
    a, b = mg.tensor([[1, 2], [3, 4]]), mg.tensor([[0.5, 0.0], [0.0, 0.5]])
    out = ops.einsum("ij,jk->ik", [a, b])
    assert out.dtype == mg.float32 and out.tolist() == [[0.5, 1.0], [1.5, 2.0]]


@pytest.mark.parametrize("eq, shapes, error, words", [
    ("ij,jk->ik", [(2, 3)], ShapeError, ["2 operand", "1 were given"]),
    ("ij,jk->ik", [(2, 3), (4, 2)], ShapeError, ["'j'", "3", "4", "(2, 3)", "(4, 2)"]),
    ("ijk->i", [(2, 3)], ShapeError, ["'ijk'", "(2, 3)"]),
    ("ij->ik", [(2, 3)], ValueError, ["'ik'"]),
    ("ij->ii", [(2, 2)], ValueError, ["distinct"]),
    ("i1->i", [(2, 2)], ValueError, ["'i1'"]),
    ("ii->i", [(2, 3)], ShapeError, ["'i'", "2", "3"]),
])
def test_einsum_errors(eq, shapes, error, words):
    with pytest.raises(error) as info:
        ops.einsum(eq, *[mg.ones(*s) for s in shapes])
    for w in words:
        assert w in str(info.value), str(info.value)


def test_matmul_mm_bmm_take_torchs_keyword_names():  # pytorch/tutorials' polynomial_tensor calls matmul(input=, other=)
    a, b = mg.randn(2, 3, 4), mg.randn(2, 4, 5)
    expected = a.numpy() @ b.numpy()
    np.testing.assert_allclose(mg.matmul(input=a, other=b).numpy(), expected, rtol=1e-5)
    np.testing.assert_allclose(mg.bmm(input=a, mat2=b).numpy(), expected, rtol=1e-5)
    np.testing.assert_allclose(mg.mm(input=a[0], mat2=b[0]).numpy(), expected[0], rtol=1e-5)
