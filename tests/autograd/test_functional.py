"""autograd.functional: Jacobians, Hessians and their vector products, checked against closed forms,
against each other (jvp = J v, hvp = H v) and against torch.autograd.functional."""

import numpy as np
import pytest

import minigrad
from helpers import to_numpy
from minigrad.autograd import grad
from minigrad.autograd.functional import hessian, hvp, jacobian, jvp, vhp, vjp
from minigrad.errors import AutogradError

f64 = minigrad.float64


def rand(*shape):
    return minigrad.randn(*shape, dtype=f64)


def quadratic(A):
    n = A.shape[0]
    return lambda x: (x.reshape(n, 1) * A * x.reshape(1, n)).sum()  # x^T A x with elementwise ops


def two_by_two(x, y):
    """Two inputs, two outputs, with broadcasting: a good test of the tuple nesting."""
    return (x * y).tanh(), (x.exp() * y.sin()).sum(0)


def scalar_of_two(x, y):
    return ((x * y).sin() + x ** 3 * y.sigmoid()).sum()


def test_hessian_of_quadratic_form_is_a_plus_a_transpose():
    A, x = rand(4, 4), rand(4)
    H = hessian(quadratic(A), x)
    np.testing.assert_allclose(H.numpy(), A.numpy() + A.numpy().T, atol=1e-12)


def test_jacobian_of_elementwise_function_is_diagonal():
    x = rand(2, 3)
    J = jacobian(lambda a: a.sin() * 2, x)
    assert J.shape == (2, 3, 2, 3)
    expected = np.diag(2 * np.cos(x.numpy()).ravel()).reshape(2, 3, 2, 3)
    np.testing.assert_allclose(J.numpy(), expected, atol=1e-12)


def test_jacobian_nesting_follows_torch():
    x, y = rand(2, 3), rand(3)
    J = jacobian(two_by_two, (x, y))
    assert isinstance(J, tuple) and all(isinstance(row, tuple) for row in J)
    assert [[j.shape for j in row] for row in J] == [[(2, 3, 2, 3), (2, 3, 3)], [(3, 2, 3), (3, 3)]]
    assert isinstance(jacobian(lambda a: a.exp(), (x,))[0], minigrad.Tensor)  # tuple in: tuple out
    assert jacobian(lambda a: (a.exp(),), x)[0].shape == (2, 3, 2, 3)
    H = hessian(scalar_of_two, (x, y))
    assert [[h.shape for h in row] for row in H] == [[(2, 3, 2, 3), (2, 3, 3)], [(3, 2, 3), (3, 3)]]


def test_vjp_jvp_are_products_with_the_jacobian():
    x, y = rand(2, 3), rand(3)
    u, v = rand(2, 3), rand(3)
    (J00, J01), (J10, J11) = jacobian(two_by_two, (x, y))
    outs, (vx, vy) = vjp(two_by_two, (x, y), (u, v))
    np.testing.assert_allclose(outs[1].numpy(), two_by_two(x, y)[1].numpy())
    np.testing.assert_allclose(vx.numpy(), np.einsum("ij,ijkl->kl", u.numpy(), J00.numpy())
                               + np.einsum("i,ikl->kl", v.numpy(), J10.numpy()), atol=1e-12)
    np.testing.assert_allclose(vy.numpy(), np.einsum("ij,ijk->k", u.numpy(), J01.numpy())
                               + v.numpy() @ J11.numpy(), atol=1e-12)
    _, (jx, jy) = jvp(two_by_two, (x, y), (u, v))  # the double-vjp trick
    np.testing.assert_allclose(jx.numpy(), np.einsum("ijkl,kl->ij", J00.numpy(), u.numpy())
                               + J01.numpy() @ v.numpy(), atol=1e-12)
    np.testing.assert_allclose(jy.numpy(), np.einsum("ikl,kl->i", J10.numpy(), u.numpy())
                               + J11.numpy() @ v.numpy(), atol=1e-12)


def test_hvp_vhp_are_products_with_the_hessian():
    A, x, v = rand(5, 5), rand(5), rand(5)
    H = (A.numpy() + A.numpy().T)
    value, Hv = hvp(quadratic(A), x, v)
    assert value.item() == pytest.approx(quadratic(A)(x).item())
    np.testing.assert_allclose(Hv.numpy(), H @ v.numpy(), atol=1e-12)
    np.testing.assert_allclose(vhp(quadratic(A), x, v)[1].numpy(), v.numpy() @ H, atol=1e-12)
    x2, y2, u2, v2 = rand(2, 3), rand(3), rand(2, 3), rand(3)
    (Hxx, Hxy), (Hyx, Hyy) = hessian(scalar_of_two, (x2, y2))
    _, (hx, hy) = hvp(scalar_of_two, (x2, y2), (u2, v2))
    np.testing.assert_allclose(hx.numpy(), np.einsum("ijkl,kl->ij", Hxx.numpy(), u2.numpy())
                               + Hxy.numpy() @ v2.numpy(), atol=1e-12)
    np.testing.assert_allclose(hy.numpy(), np.einsum("ikl,kl->i", Hyx.numpy(), u2.numpy())
                               + Hyy.numpy() @ v2.numpy(), atol=1e-12)


def test_third_derivative_of_x_to_the_fourth_is_exact():
    x = minigrad.tensor([-1.5, 0.0, 0.5, 2.0], dtype=f64, requires_grad=True)
    (g,) = grad((x ** 4).sum(), x, create_graph=True)
    (gg,) = grad(g.sum(), x, create_graph=True)
    (ggg,) = grad(gg.sum(), x)
    assert g.tolist() == [4 * t ** 3 for t in x.tolist()]
    assert gg.tolist() == [12 * t ** 2 for t in x.tolist()]
    assert ggg.tolist() == [24 * t for t in x.tolist()]
    np.testing.assert_array_equal(hessian(lambda a: (a ** 4).sum(), x).numpy(), np.diag(12 * to_numpy(x) ** 2))


def test_create_graph_results_can_be_differentiated_again():
    x = minigrad.tensor([1.0, -2.0, 0.5], dtype=f64, requires_grad=True)
    H = hessian(lambda a: (a ** 4).sum(), x, create_graph=True)  # diag(12 x^2)
    assert H.requires_grad
    (d,) = grad(H.sum(), x)
    np.testing.assert_allclose(d.numpy(), 24 * to_numpy(x))
    _, Hv = hvp(lambda a: (a ** 4).sum(), x, minigrad.ones(3, dtype=f64), create_graph=True)
    (d,) = grad(Hv.sum(), x)
    np.testing.assert_allclose(d.numpy(), 24 * to_numpy(x))


def test_inputs_are_detached_and_results_carry_no_graph():
    x = minigrad.tensor([0.3, 0.7], dtype=f64, requires_grad=True)
    out, g = vjp(lambda a: (a * a).sum(), x)  # v may be omitted for a one-element output
    assert not out.requires_grad and not g.requires_grad and x.grad is None
    np.testing.assert_allclose(g.numpy(), 2 * to_numpy(x))
    assert not jacobian(lambda a: a.exp(), x).requires_grad


def test_unused_inputs_give_zeros_or_errors_in_strict_mode():
    x, y = rand(3), rand(2)
    _, (gx, gy) = vjp(lambda a, b: (a * 2).sum(), (x, y))
    assert gy.tolist() == [0.0, 0.0]
    assert jacobian(lambda a, b: a.exp(), (x, y))[1].tolist() == np.zeros((3, 2)).tolist()
    with pytest.raises(AutogradError, match="independent of input 1"):
        vjp(lambda a, b: (a * 2).sum(), (x, y), strict=True)
    with pytest.raises(AutogradError, match="does not require gradients"):
        vjp(lambda a: minigrad.ones(1, dtype=f64), x, strict=True)
    with pytest.raises(AutogradError, match="jacobian .* independent of the inputs"):
        hessian(lambda a: (a * 3).sum(), x, strict=True)  # linear: the Hessian is meaningless
    assert hessian(lambda a: (a * 3).sum(), x).tolist() == np.zeros((3, 3)).tolist()


def test_argument_errors():
    x = rand(3)
    with pytest.raises(AutogradError, match="v can only be None"):
        vjp(lambda a: a * 2, x)
    with pytest.raises(AutogradError, match=r"v has invalid size: should be \(3,\) but got \(2,\)"):
        jvp(lambda a: a * 2, x, rand(2))
    with pytest.raises(AutogradError, match="single element"):
        hessian(lambda a: a * 2, x)
    with pytest.raises(TypeError, match="value at index 1 has type list"):
        jacobian(lambda a, b: a, (x, [1.0]))


def test_agrees_with_torch():
    torch = pytest.importorskip("torch")
    TF = torch.autograd.functional

    def th_two_by_two(x, y):
        return (x * y).tanh(), (x.exp() * y.sin()).sum(0)

    def th_scalar_of_two(x, y):
        return ((x * y).sin() + x ** 3 * y.sigmoid()).sum()

    x, y, u, v = rand(2, 3), rand(3), rand(2, 3), rand(3)
    T = lambda *ts: tuple(torch.tensor(t.numpy()) for t in ts)  # noqa: E731

    def close(mine, theirs):
        if isinstance(mine, tuple):
            assert isinstance(theirs, tuple) and len(mine) == len(theirs)
            for m, t in zip(mine, theirs):
                close(m, t)
        else:
            np.testing.assert_allclose(mine.numpy(), theirs.numpy(), atol=1e-10)

    close(jacobian(two_by_two, (x, y)), TF.jacobian(th_two_by_two, T(x, y)))
    close(jacobian(lambda a: a.tanh(), x), TF.jacobian(torch.tanh, T(x)[0]))
    close(hessian(scalar_of_two, (x, y)), TF.hessian(th_scalar_of_two, T(x, y)))
    close(vjp(two_by_two, (x, y), (u, v)), TF.vjp(th_two_by_two, T(x, y), T(u, v)))
    close(jvp(two_by_two, (x, y), (u, v)), TF.jvp(th_two_by_two, T(x, y), T(u, v)))
    close(hvp(scalar_of_two, (x, y), (u, v)), TF.hvp(th_scalar_of_two, T(x, y), T(u, v)))
    close(vhp(scalar_of_two, (x, y), (u, v)), TF.vhp(th_scalar_of_two, T(x, y), T(u, v)))
