"""Engine details: a leaf's .grad never aliases memory that something else holds."""

import numpy as np
import pytest

import minigrad as mg


def test_pass_through_gradient_is_not_shared_between_leaves():
    x, y = mg.ones(3, requires_grad=True), mg.ones(3, requires_grad=True)
    (x + y).sum().backward()
    x.grad.zero_()
    np.testing.assert_array_equal(y.grad.numpy(), [1.0, 1.0, 1.0])


def test_user_gradient_is_copied():
    x = mg.ones(3, requires_grad=True)
    v = mg.tensor([1.0, 2.0, 3.0])
    x.backward(v)
    v.zero_()
    np.testing.assert_array_equal(x.grad.numpy(), [1.0, 2.0, 3.0])


def test_hook_result_and_retained_grad_are_copied():
    x = mg.ones(2, requires_grad=True)
    seen = []
    x.register_hook(lambda g: seen.append(g))
    y = x * 1.0
    y.retain_grad()
    (y * 2).sum().backward()
    seen[0].zero_()
    y.grad.zero_()
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 2.0])


def test_fresh_gradient_is_kept_without_copy_and_accumulates_out_of_place():
    w = mg.ones(2, 3, requires_grad=True)
    x = mg.ones(4, 2)
    (x @ w).sum().backward()
    first = w.grad
    (x @ w).sum().backward()
    np.testing.assert_array_equal(first.numpy(), np.full((2, 3), 4.0))
    np.testing.assert_array_equal(w.grad.numpy(), np.full((2, 3), 8.0))


def test_user_function_gradient_is_copied():
    class Identity(mg.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return x.detach()  # returns the input's own memory as its gradient

    x = mg.tensor([5.0, 6.0], requires_grad=True)
    Identity.apply(x).sum().backward()
    x.grad.zero_()
    np.testing.assert_array_equal(x.detach().numpy(), [5.0, 6.0])


class PassThrough(mg.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x  # the input as is

    @staticmethod
    def backward(ctx, g):
        return g


def test_a_user_function_that_returns_its_input_returns_a_view_of_it():
    """One memory, one version counter: a write through the output cannot slip past the check of
    the input saved by another op (it gave gradients of the modified values, silently, when the
    output had a counter of its own). As in PyTorch, the write is refused."""
    a = mg.tensor([1.0, 2.0], requires_grad=True) * 2
    y = PassThrough.apply(a)
    assert y is not a and y._base is a and y.data_ptr() == a.data_ptr()
    with pytest.raises(mg.errors.AutogradError, match="in-place modification of a view"):
        y.add_(1)
    saved = a * a  # Mul keeps a for backward
    with mg.no_grad():
        y.mul_(2)  # outside autograd the write is allowed, and it bumps a's version
    with pytest.raises(mg.errors.AutogradError, match="modified by an in-place operation"):
        saved.sum().backward()


def test_grad_wrt_a_non_leaf_does_not_run_or_free_its_producer():
    x = mg.randn(3, requires_grad=True)
    h = x.exp()
    (g,) = mg.grad((h * 3).sum(), [h])
    np.testing.assert_array_equal(g.numpy(), [3.0, 3.0, 3.0])
    h.sum().backward()  # h's graph is intact: Exp's saved output was not freed
    np.testing.assert_allclose(x.grad.numpy(), x.detach().exp().numpy(), rtol=1e-6)


def test_full_reductions_hold_arrays_so_in_place_ops_work():
    s = mg.ones(3).sum()
    assert isinstance(s.array, np.ndarray) and s.shape == ()
    s.add_(1)
    assert s.item() == 4.0
    s.zero_()
    assert s.item() == 0.0
