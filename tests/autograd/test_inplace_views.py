"""In-place writes that PyTorch keeps in the graph: ``copy_``/``fill_``/``zero_`` over a tensor with a
history give that history a zero gradient (not none), and a write through a view changes its base's
graph too (PyTorch's CopySlices), also when the base required no grad before the write."""

from __future__ import annotations

import numpy as np
import pytest

import minigrad as mg
from minigrad.autograd import gradcheck
from minigrad.errors import AutogradError

X = [0.7, -1.3, 2.1]
W = [1.5, 0.4, -0.8]

OVERWRITES = {
    "copy_": lambda a, w: a.copy_(w),
    "fill_": lambda a, w: a.fill_(2.0),
    "zero_": lambda a, w: a.zero_(),
    "setitem all": lambda a, w: a.__setitem__(slice(None), w),
}


@pytest.mark.parametrize("name", list(OVERWRITES))
def test_an_overwritten_history_gets_a_zero_gradient(name):
    x, w = mg.tensor(X, requires_grad=True), mg.tensor(W, requires_grad=True)
    a = x * 1
    OVERWRITES[name](a, w)
    assert a.requires_grad and a.grad_fn is not None
    (a * mg.tensor([1.0, 2.0, 3.0])).sum().backward()
    assert x.grad is not None and np.array_equal(x.grad.numpy(), np.zeros(3))
    if name in ("copy_", "setitem all"):
        assert np.array_equal(w.grad.numpy(), [1.0, 2.0, 3.0])


def test_an_index_write_zeroes_only_the_overwritten_positions():
    x, w = mg.tensor(X, requires_grad=True), mg.tensor(W[:2], requires_grad=True)
    a = x * 1
    a[mg.tensor([0, 2])] = w
    a.sum().backward()
    assert np.array_equal(x.grad.numpy(), [0.0, 1.0, 0.0]) and np.array_equal(w.grad.numpy(), [1.0, 1.0])


@pytest.mark.parametrize("name", ["copy_", "fill_"])
def test_overwrites_gradcheck(name):
    def f(x, w):
        a = x * x
        OVERWRITES[name](a, w)
        return a * x

    x = mg.tensor(X, dtype=mg.float64, requires_grad=True)
    w = mg.tensor(W, dtype=mg.float64, requires_grad=True)
    assert gradcheck(f, (x, w))


def _write_through_view(w, base=None):
    base = mg.zeros(5, dtype=w.dtype) if base is None else base
    before = base[0:3]  # a view taken before the writes
    v = base[1:4]
    v.mul_(1)  # nothing to record
    v.add_(w * 2)
    v.mul_(w)
    return base, before, v


def test_a_write_through_a_view_gives_a_base_without_grad_a_graph():
    w = mg.tensor(W, requires_grad=True)
    base, before, v = _write_through_view(w)
    assert base.requires_grad and base.grad_fn is not None
    expected = np.array([0.0] + [2 * a * a for a in W] + [0.0], dtype=np.float32)
    assert np.allclose(base.detach().numpy(), expected) and np.allclose(before.detach().numpy(), expected[:3])
    (base * mg.arange(5.0)).sum().backward()
    assert np.allclose(w.grad.numpy(), [4 * a * k for a, k in zip(W, (1, 2, 3))])


def test_a_write_through_a_view_gradchecks():
    def f(w, b):
        base, _, v = _write_through_view(w, b * 1)
        return base * base.sum() + v.sum()

    w = mg.tensor(W, dtype=mg.float64, requires_grad=True)
    b = mg.tensor([0.3, -0.2, 0.9, 1.1, -0.6], dtype=mg.float64, requires_grad=True)
    assert gradcheck(f, (w, b))
    assert gradcheck(lambda w: _write_through_view(w)[0], (w,))


def test_a_view_of_a_leaf_that_requires_grad_is_still_refused():
    x = mg.tensor(X, requires_grad=True)
    with pytest.raises(AutogradError, match="view of a leaf tensor that requires grad"):
        x[0:2].add_(1)


def test_writes_through_views_match_torch():
    torch = pytest.importorskip("torch")
    results = []
    for lib in (mg, torch):
        w = lib.tensor(W, requires_grad=True)
        b = lib.tensor([0.3, -0.2, 0.9, 1.1, -0.6], requires_grad=True)
        base = b * 1
        v = base[1:4]
        v.add_(w * 2)
        v.mul_(w)
        base[0:2].copy_(w[:2])
        out = (base * lib.arange(5.0)).sum()  # (v's own graph predates the copy_: torch re-reads it, minigrad not yet)
        out.backward()
        results.append([t.detach().numpy().copy() for t in (base, v, w.grad, b.grad)])
        x = lib.tensor(X, requires_grad=True)
        a = x * 1
        a.copy_(w)
        a.zero_()
        a.sum().backward()
        results[-1].append(x.grad.numpy().copy())
    for got, want in zip(*results):
        assert np.allclose(got, want, atol=1e-6)


def test_fill_through_a_view_zeroes_the_base_gradient_there():
    w = mg.tensor(W, dtype=mg.float64, requires_grad=True)
    base = w * 1
    base[1:3].zero_()
    assert np.array_equal(base.detach().numpy(), [W[0], 0.0, 0.0])
    (base * mg.tensor([1.0, 2.0, 3.0], dtype=mg.float64)).sum().backward()
    assert np.array_equal(w.grad.numpy(), [1.0, 0.0, 0.0])
    assert gradcheck(lambda w: (lambda b: (b[0:2].fill_(0.5), b * b)[1])(w * w), (w,))


def test_a_detached_alias_is_cut_from_the_graph():
    """``y.detach()`` shares y's memory (and version counter) but not its graph, as in PyTorch: a
    recorded write into it leaves y's ``grad_fn`` alone, and a leaf's detach may be written twice."""
    x, w = mg.tensor(X, requires_grad=True), mg.tensor(W, requires_grad=True)
    y = x * 2
    node = y.grad_fn
    d = y.detach()
    d.add_(w)
    assert y.grad_fn is node and d.grad_fn is not None
    e = x.detach()
    e.add_(w)
    e.mul_(w)
    e.sum().backward()
    assert x.grad is None and np.allclose(w.grad.numpy(), [b + 2 * a for a, b in zip(W, X)])


def test_detached_alias_and_view_fill_match_torch():
    torch = pytest.importorskip("torch")
    results = []
    for lib in (mg, torch):
        x = lib.tensor(X, requires_grad=True)
        w = lib.tensor(W, requires_grad=True)
        y = x * 2
        d = y.detach()
        d.add_(w)
        base = w * 1
        base[1:3].zero_()
        (y.sum() + d.sum() + (base * lib.tensor([1.0, 2.0, 3.0])).sum()).backward()
        results.append([x.grad.numpy().copy(), w.grad.numpy().copy(), y.detach().numpy().copy()])
    for got, want in zip(*results):
        assert np.allclose(got, want, atol=1e-6)


def test_a_strided_view_of_a_view_writes_the_right_base_positions():
    w = mg.tensor(np.arange(1.0, 5.0).reshape(2, 2), dtype=mg.float64, requires_grad=True)
    base = mg.zeros((3, 4), dtype=mg.float64)
    v = base.t()[1:3, ::2]  # base[0:3:2, 1:3] transposed
    v.add_(w)
    want = np.zeros((3, 4))
    want[0:3:2, 1:3] = w.detach().numpy().T
    assert np.array_equal(base.detach().numpy(), want)
    (base * mg.tensor(np.arange(12.0).reshape(3, 4), dtype=mg.float64)).sum().backward()
    assert np.array_equal(w.grad.numpy(), np.arange(12.0).reshape(3, 4)[0:3:2, 1:3].T)
    assert gradcheck(lambda w: (lambda b: (b.t()[1:3, ::2].mul_(w), b)[1])(mg.ones((3, 4), dtype=mg.float64) * 1), (w,))


def test_a_view_of_a_base_in_no_c_order_writes_the_right_positions():
    """A base whose own memory is not in C order (a Fortran-ordered array taken as it is) maps
    each view element to its position by looking its address up among the base's."""
    w = mg.tensor([[1.0, 2.0]], dtype=mg.float64, requires_grad=True)
    base = mg.Tensor(np.zeros((2, 3), order="F"))
    assert not base.array.flags.c_contiguous
    v = base[1:2, 0:2]
    v.add_(w)
    assert np.array_equal(base.detach().numpy(), [[0.0, 0.0, 0.0], [1.0, 2.0, 0.0]])
    (base * mg.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=mg.float64)).sum().backward()
    assert np.array_equal(w.grad.numpy(), [[4.0, 5.0]])
