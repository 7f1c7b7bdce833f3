"""PyTorch's tutorial "Jacobians, Hessians, hvp, vhp, and more: composing function transforms",
walked through with minigrad in place of torch: each step gives the tutorial's results.

Source: pytorch/tutorials, intermediate_source/jacobians_hessians.py. Each step below makes the
tutorial's calls in its order, with ``torch`` bound to minigrad and ``F`` to minigrad.nn.functional.
What differs: the sizes are smaller (the tutorial's 2048-wide Jacobians and 512-wide Hessians are
sized for timing, which ``benchmarks/bench_jacobian.py`` does at 512), and its torch.utils.benchmark
timings are left out (a test never asserts wall-clock time); its one unchecked comparison is asserted.
"""

from functools import partial

import minigrad as torch
import minigrad.nn.functional as F
from minigrad.func import hessian, jacfwd, jacrev, jvp, grad, vjp, vmap


def predict(weight, bias, x):
    return F.linear(x, weight, bias).tanh()


def test_jacobian_row_by_row_then_by_vmap_of_vjp_then_by_jacrev():
    _ = torch.manual_seed(0)
    D = 16
    weight, bias, x = torch.randn(D, D), torch.randn(D), torch.randn(D)
    xp = x.clone().requires_grad_()
    unit_vectors = torch.eye(D)
    jacobian = torch.stack([torch.autograd.grad(predict(weight, bias, xp), xp, vec)[0] for vec in unit_vectors])
    assert jacobian.shape == (16, 16)

    _, vjp_fn = vjp(partial(predict, weight, bias), x)
    ft_jacobian, = vmap(vjp_fn)(unit_vectors)
    assert torch.allclose(ft_jacobian, jacobian)

    ft_jacobian = jacrev(predict, argnums=2)(weight, bias, x)
    assert torch.allclose(ft_jacobian, jacobian)

    ft_jac_weight, ft_jac_bias = jacrev(predict, argnums=(0, 1))(weight, bias, x)
    assert ft_jac_weight.shape == (D, D, D) and ft_jac_bias.shape == (D, D)


def test_jacfwd_and_jacrev_agree_on_tall_and_wide_jacobians():
    _ = torch.manual_seed(0)
    for Din, Dout in ((4, 64), (64, 4)):  # the tutorial's (32, 2048) and (2048, 32), scaled down
        weight, bias, x = torch.randn(Dout, Din), torch.randn(Dout), torch.randn(Din)
        fwd = jacfwd(predict, argnums=2)(weight, bias, x)
        rev = jacrev(predict, argnums=2)(weight, bias, x)
        assert fwd.shape == (Dout, Din) and torch.allclose(fwd, rev, atol=1e-6)


def test_hessian_three_ways():
    _ = torch.manual_seed(0)
    Din, Dout = 8, 4  # the tutorial's 512, 32
    weight, bias, x = torch.randn(Dout, Din), torch.randn(Dout), torch.randn(Din)
    hess_api = hessian(predict, argnums=2)(weight, bias, x)
    hess_fwdfwd = jacfwd(jacfwd(predict, argnums=2), argnums=2)(weight, bias, x)
    hess_revrev = jacrev(jacrev(predict, argnums=2), argnums=2)(weight, bias, x)
    assert hess_api.shape == (Dout, Din, Din)
    assert torch.allclose(hess_api, hess_fwdfwd, atol=1e-6) and torch.allclose(hess_api, hess_revrev, atol=1e-6)


def test_batch_jacobian_and_batch_hessian():
    _ = torch.manual_seed(0)
    batch_size, Din, Dout = 6, 5, 7  # the tutorial's 64, 31, 33
    weight, bias, x = torch.randn(Dout, Din), torch.randn(Dout), torch.randn(batch_size, Din)
    compute_batch_jacobian = vmap(jacrev(predict, argnums=2), in_dims=(None, None, 0))
    batch_jacobian0 = compute_batch_jacobian(weight, bias, x)

    def predict_with_output_summed(weight, bias, x):
        return predict(weight, bias, x).sum(0)
    batch_jacobian1 = jacrev(predict_with_output_summed, argnums=2)(weight, bias, x).movedim(1, 0)
    assert torch.allclose(batch_jacobian0, batch_jacobian1)

    compute_batch_hessian = vmap(hessian(predict, argnums=2), in_dims=(None, None, 0))
    batch_hess = compute_batch_hessian(weight, bias, x)
    assert batch_hess.shape == (batch_size, Dout, Din, Din)


def test_hessian_vector_products_forward_over_reverse_and_reverse_over_reverse():
    def hvp(f, primals, tangents):
        return jvp(grad(f), primals, tangents)[1]

    def f(x):
        return x.sin().sum()
    _ = torch.manual_seed(0)
    x, tangent = torch.randn(2048), torch.randn(2048)
    result = hvp(f, (x,), (tangent,))

    def hvp_revrev(f, primals, tangents):
        _, vjp_fn = vjp(grad(f), *primals)
        return vjp_fn(*tangents)
    result_hvp_revrev = hvp_revrev(f, (x,), (tangent,))
    assert torch.allclose(result, result_hvp_revrev[0])
    assert torch.allclose(result, -x.sin() * tangent, atol=1e-6)  # H = diag(-sin x)
