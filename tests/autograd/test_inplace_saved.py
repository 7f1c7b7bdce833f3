"""In-place ops whose own backward reads the tensor they overwrite: ``a.mul_(w)`` keeps ``a``'s old
values for ``w``'s gradient (a copy taken before the write, only when the op saved ``a``), as
PyTorch does; a tensor saved by an earlier op and then written in place is still refused."""

from __future__ import annotations

import numpy as np
import pytest

import minigrad as mg
import minigrad.nn.functional as F
from minigrad.autograd import function as fn
from minigrad.autograd import gradcheck, gradgradcheck
from minigrad.errors import AutogradError
from minigrad.ops.elementwise import Clone

X = [0.7, -1.3, 2.1, 0.45]
W = [1.5, 0.4, -0.8, 2.2]

# name -> (the in-place op on (a, w), with a the written tensor) and whether its second derivative
# is checked (relu-like ops have a piecewise-constant first derivative: nothing to check there)
OPS = {
    "mul_": (lambda a, w: a.mul_(w), True),
    "imul": (lambda a, w: a.__imul__(w), True),
    "div_": (lambda a, w: a.div_(w), True),
    "itruediv": (lambda a, w: a.__itruediv__(w), True),
    "pow_ tensor": (lambda a, w: a.abs().pow_(w), True),
    "pow_ number": (lambda a, w: a.pow_(3) * w, True),
    "pow_ both": (lambda a, w: a.abs().mul_(w.abs() + 1).pow_(w), True),
    "ipow": (lambda a, w: a.abs().__ipow__(w), True),
    "silu inplace": (lambda a, w: F.silu(a.mul_(w), inplace=True), True),
    "hardswish inplace": (lambda a, w: F.hardswish(a.mul_(w), inplace=True), True),
    "mul_ then div_": (lambda a, w: a.mul_(w).div_(w * w + 1).mul_(w), True),
    "add_ sub_": (lambda a, w: a.add_(w).sub_(w, alpha=3).mul_(w), True),
    "relu inplace": (lambda a, w: F.relu(a.mul_(w), inplace=True), False),
    "leaky_relu inplace": (lambda a, w: F.leaky_relu(a.mul_(w), inplace=True), False),
}


def _minigrad(op):
    def f(x, w):
        a = x * 1  # a non-leaf: in-place ops on a leaf that requires grad are refused
        out = op(a, w)
        return a if out is a or out is None else out
    return f


def _inputs():
    return (mg.tensor(X, dtype=mg.float64, requires_grad=True), mg.tensor(W, dtype=mg.float64, requires_grad=True))


@pytest.mark.parametrize("name", list(OPS))
def test_in_place_gradients_pass_gradcheck(name):
    op, second_order = OPS[name]
    assert gradcheck(_minigrad(op), _inputs())
    if second_order:
        assert gradgradcheck(_minigrad(op), _inputs())


@pytest.mark.parametrize("name", [n for n in OPS if "inplace" not in n])
def test_in_place_gradients_match_torch(name):
    torch = pytest.importorskip("torch")
    op, second_order = OPS[name]
    x, w = _inputs()
    _minigrad(op)(x, w).sum().backward()
    tx, tw = (torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (X, W))
    ta = tx * 1
    out = op(ta, tw)
    (ta if out is ta else out).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-12)


@pytest.mark.parametrize("name,torch_fn", [("silu inplace", "silu"), ("hardswish inplace", "hardswish"),
                                           ("relu inplace", "relu"), ("leaky_relu inplace", "leaky_relu")])
def test_in_place_activations_match_torch_to_second_order(name, torch_fn):
    torch = pytest.importorskip("torch")
    op, second_order = OPS[name]
    x, w = _inputs()
    y = _minigrad(op)(x, w)
    gx, gw = mg.autograd.grad(y.sum(), (x, w), create_graph=True)
    tx, tw = (torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (X, W))
    ty = getattr(torch.nn.functional, torch_fn)((tx * 1).mul_(tw), inplace=True)
    tgx, tgw = torch.autograd.grad(ty.sum(), (tx, tw), create_graph=True)
    np.testing.assert_allclose(gx.detach().numpy(), tgx.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(gw.detach().numpy(), tgw.detach().numpy(), rtol=1e-12)
    if second_order:
        (gx * gw).sum().backward()
        (tgx * tgw).sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-12)
        np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-12)


def test_the_issue_example_gives_each_factor_the_other():
    x = mg.randn(3, requires_grad=True)
    w = mg.randn(3, requires_grad=True)
    a = x.clone()
    a.mul_(w)
    a.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), w.detach().numpy())
    np.testing.assert_array_equal(w.grad.numpy(), x.detach().numpy())


def _saved_tensors(t):
    return [v for kind, v in fn.saved_entries(t.grad_fn) if kind == fn.SAVED_TENSOR]


def test_the_copy_is_taken_only_when_the_op_saved_the_written_tensor():
    x = mg.tensor(X, requires_grad=True)
    a = x * 1
    a.mul_(mg.tensor(W))  # w needs no gradient: Mul keeps w only, and nothing is copied
    assert [v.tolist() for v in _saved_tensors(a)] == [mg.tensor(W).tolist()]
    w = mg.tensor(W, requires_grad=True)
    b = x * 1
    b.mul_(w)  # w's gradient needs b's old values: Mul keeps a copy of them, not b
    kept = _saved_tensors(b)
    assert all(v is not b for v in kept)
    np.testing.assert_allclose(kept[0].detach().numpy(), np.array(X, np.float32))
    assert isinstance(kept[0].grad_fn, Clone)  # recorded, so a second derivative reaches x


def test_a_write_into_a_view_of_a_constant_keeps_the_old_values():
    base = mg.tensor([[1.0, 2.0], [3.0, 4.0]])
    w = mg.tensor([0.5, -2.0], requires_grad=True)
    row = base[1]
    row.mul_(w)  # the view shares base's version counter: the copy is of its own old values
    row.sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), [3.0, 4.0])
    np.testing.assert_allclose(base.detach().numpy(), [[1.0, 2.0], [1.5, -8.0]])


def test_a_tensor_saved_by_an_earlier_op_then_written_in_place_is_still_refused():
    x, w = _inputs()
    a = x * 1
    b = a * w  # this Mul saves a
    a.mul_(w)
    with pytest.raises(AutogradError, match="Mul: a tensor of shape \\(4,\\) saved for backward was modified"):
        b.sum().backward()
    a.sum().backward()  # the in-place op's own node kept its copy
    np.testing.assert_allclose(w.grad.numpy(), X)


def test_an_argument_whose_node_saved_the_written_tensor_is_still_refused():
    x, w = _inputs()
    a = x * 1
    b = a.sin()  # Sin saves a; the in-place op reads b but did not record Sin
    a.mul_(b)
    with pytest.raises(AutogradError, match="Sin"):
        a.sum().backward()


def _step_through_in_place_ops(w):
    def step(x):
        w.grad = None
        a = x * 1
        a.mul_(w)  # keeps a copy of a's old values for w's gradient: the replay must remake it
        loss = F.silu(a, inplace=True).sum()
        loss.backward()
        return loss.detach() + 0, w.grad * 1
    return step


@pytest.mark.parametrize("how", ["trace", "compile"])
def test_a_traced_step_replays_the_copy_of_the_old_values(how):
    from minigrad.graph import trace

    w = mg.tensor(W, requires_grad=True)
    step = _step_through_in_place_ops(w)
    x = mg.tensor(X)
    replayed = trace(step, x) if how == "trace" else mg.compile(step)
    for _ in range(3):  # compile traces on the first call and replays the graph after
        x = mg.randn(4)
        got, want = replayed(x), step(x)
        for g, e in zip(got, want):
            np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-6)
    if how == "compile":
        assert all(g is not None for g in replayed.graphs.values())  # replayed, not run eagerly


def test_ipow_writes_in_place_as_torch():
    a = mg.tensor([2.0, 3.0])
    b = a
    b **= 2
    assert b is a and a.tolist() == [4.0, 9.0]
