"""minigrad.func: the torch.func transforms, checked against central finite differences in float64,
against each other when composed, and against torch.func where PyTorch is installed."""

import threading

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minigrad
from minigrad import nn
from minigrad.autograd import mode
from minigrad.autograd.functional import hessian as functional_hessian
from minigrad.errors import ArgumentError, ShapeError
from minigrad.func import (
    functional_call, grad, grad_and_value, hessian, jacfwd, jacrev, jvp, vjp, vmap,
)

f64 = minigrad.float64


def rand(*shape):
    return minigrad.randn(*shape, dtype=f64)


def numeric_jacobian(f, x, eps=1e-6):
    """d f(x) / d x by central differences: shape f(x).shape + x.shape."""
    x0 = x.numpy().astype(np.float64)
    cols = []
    for j in range(x0.size):
        step = np.zeros(x0.size)
        step[j] = eps
        hi = f(minigrad.tensor(x0 + step.reshape(x0.shape), dtype=f64)).numpy()
        lo = f(minigrad.tensor(x0 - step.reshape(x0.shape), dtype=f64)).numpy()
        cols.append((hi - lo) / (2 * eps))
    out_shape = np.shape(cols[0])
    return np.moveaxis(np.stack(cols), 0, -1).reshape(out_shape + x0.shape)


def smooth(x):
    return (x.sin() * x.exp()).sum() + (x * x).sum() ** 2


def vector_fn(x):
    return (x.tanh() * x.sum()).reshape(2, -1)


def test_grad_matches_finite_differences():
    x = rand(5)
    np.testing.assert_allclose(grad(smooth)(x).numpy(), numeric_jacobian(smooth, x), rtol=1e-6)


@pytest.mark.parametrize("transform", [jacrev, jacfwd])
def test_jacobians_match_finite_differences(transform):
    x = rand(2, 3)
    jac = transform(vector_fn)(x)
    assert jac.shape == (2, 3, 2, 3)
    np.testing.assert_allclose(jac.numpy(), numeric_jacobian(vector_fn, x), rtol=1e-6, atol=1e-9)


def test_hessian_is_the_finite_difference_jacobian_of_the_gradient():
    x = rand(4)
    np.testing.assert_allclose(hessian(smooth)(x).numpy(), numeric_jacobian(grad(smooth), x),
                               rtol=1e-6, atol=1e-8)


def test_compositions_agree_with_each_other_and_with_autograd_functional():
    x = rand(4)
    expected = functional_hessian(smooth, x).numpy()
    for composed in (hessian(smooth), jacfwd(jacrev(smooth)), jacrev(jacrev(smooth)),
                     jacfwd(jacfwd(smooth)), jacrev(grad(smooth))):
        np.testing.assert_allclose(composed(x).numpy(), expected, rtol=1e-10)


def test_third_derivative_by_composing_three_transforms():
    x = rand(3)
    third = jacrev(hessian(lambda x: x.sin().sum()))(x).numpy()
    np.testing.assert_allclose(third, np.einsum("i,ij,ik->ijk", -np.cos(x.numpy()), np.eye(3), np.eye(3)),
                               atol=1e-12)


def test_argnums_tuple_and_has_aux():
    x, y = rand(3), rand(3)

    def f(x, y):
        loss = (x * y.exp()).sum()
        return loss, {"loss": loss, "step": 3}
    (gx, gy), aux = grad(f, argnums=(0, 1), has_aux=True)(x, y)
    np.testing.assert_allclose(gx.numpy(), np.exp(y.numpy()))
    np.testing.assert_allclose(gy.numpy(), x.numpy() * np.exp(y.numpy()))
    assert aux["loss"].item() == pytest.approx(f(x, y)[0].item()) and aux["step"] == 3
    g, (value, aux) = grad_and_value(f, argnums=-1, has_aux=True)(x, y)
    np.testing.assert_allclose(g.numpy(), gy.numpy())
    assert value.item() == pytest.approx(aux["loss"].item())


def test_grad_over_a_dict_of_parameters_with_functional_call():
    minigrad.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1)).double()
    params = {k: v.detach() for k, v in model.named_parameters()}
    x, t = rand(5, 3), rand(5, 1)

    def loss(p):
        return ((functional_call(model, p, (x,)) - t) ** 2).mean()
    grads = grad(loss)(params)
    assert list(grads) == list(params)
    ((model(x) - t) ** 2).mean().backward()
    for name, p in model.named_parameters():
        np.testing.assert_allclose(grads[name].numpy(), p.grad.numpy(), rtol=1e-12)
    assert model[0].weight is dict(model.named_parameters())["0.weight"]  # the originals are back


def test_hessian_of_a_small_mlp_loss_matches_finite_differences():
    minigrad.manual_seed(1)
    model = nn.Sequential(nn.Linear(2, 3), nn.Tanh(), nn.Linear(3, 1)).double()
    x, t = rand(4, 2), rand(4, 1)

    def loss(w):
        return ((functional_call(model, {"0.weight": w}, x) - t) ** 2).mean()
    w = model[0].weight.detach()
    H = hessian(loss)(w)
    assert H.shape == (3, 2, 3, 2)
    np.testing.assert_allclose(H.numpy(), numeric_jacobian(grad(loss), w), rtol=1e-5, atol=1e-8)


def test_vmap_of_grad_is_the_per_example_gradient():
    xs = rand(6, 4)
    per_example = vmap(grad(smooth))(xs)
    for i in range(6):
        np.testing.assert_allclose(per_example[i].numpy(), grad(smooth)(xs[i]).numpy())


def test_vmap_in_dims_none_out_dims_and_tuple_outputs():
    w, xs = rand(3, 4), rand(4, 5)  # examples along dim 1

    def f(w, x):
        y = w @ x
        return y, y.sum()
    ys, sums = vmap(f, in_dims=(None, 1), out_dims=(1, 0))(w, xs)
    np.testing.assert_allclose(ys.numpy(), w.numpy() @ xs.numpy())
    np.testing.assert_allclose(sums.numpy(), (w.numpy() @ xs.numpy()).sum(0))


@settings(max_examples=25, deadline=None)
@given(shape=st.lists(st.integers(1, 3), min_size=1, max_size=3), data=st.data())
def test_vmap_moves_the_mapped_dimension_like_numpy(shape, data):
    in_dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    out_dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = rand(*shape)
    out = vmap(lambda t: t * 2 + 1, in_dims=in_dim, out_dims=out_dim)(x)
    np.testing.assert_allclose(out.numpy(), np.moveaxis(x.numpy() * 2 + 1, in_dim, out_dim))


def test_vjp_and_jvp_give_rows_and_columns_of_the_jacobian():
    x = rand(2, 3)
    J = jacrev(vector_fn)(x).numpy().reshape(6, 6)
    out, vjp_fn = vjp(vector_fn, x)
    np.testing.assert_allclose(out.numpy(), vector_fn(x).numpy())
    rows = vmap(vjp_fn)(minigrad.eye(6, dtype=f64).reshape(6, 2, 3))[0]
    np.testing.assert_allclose(rows.numpy().reshape(6, 6), J, atol=1e-12)
    v = rand(2, 3)
    out, jv = jvp(vector_fn, (x,), (v,))
    np.testing.assert_allclose(jv.numpy().ravel(), J @ v.numpy().ravel(), atol=1e-12)


def test_hvp_forward_over_reverse_equals_reverse_over_reverse():
    x, v = rand(5), rand(5)
    fwd = jvp(grad(smooth), (x,), (v,))[1]
    rev = vjp(grad(smooth), x)[1](v)[0]
    np.testing.assert_allclose(fwd.numpy(), rev.numpy(), rtol=1e-10)
    np.testing.assert_allclose(fwd.numpy(), hessian(smooth)(x).numpy() @ v.numpy(), rtol=1e-10)


def test_results_are_cut_from_the_graph_unless_the_caller_asks_for_one():
    x = rand(3)
    assert not grad(smooth)(x).requires_grad
    assert not hessian(smooth)(x).requires_grad
    x.requires_grad_()
    g = grad(lambda x: (x ** 3).sum())(x)  # connected to the caller's x: 3x^2, differentiable again
    g.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 6 * x.detach().numpy())


def test_a_transform_running_on_another_thread_does_not_nest_this_threads():
    inside, done = threading.Event(), threading.Event()
    depths = []

    def waits(x):
        depths.append(mode.transform_depth())
        inside.set()
        done.wait(60)  # hold the transform open while the main thread runs its own
        return (x * x).sum()

    t = threading.Thread(target=lambda: grad(waits)(rand(3)))
    t.start()
    inside.wait(60)
    depths.append(mode.transform_depth())
    g = grad(smooth)(rand(3))  # not nested in the other thread's: its result is cut from the graph
    done.set()
    t.join()
    assert depths == [1, 0] and not g.requires_grad and mode.transform_depth() == 0


def test_grad_of_a_closure_under_an_outer_transform():
    w, x = rand(3), rand(3)

    def inner_gradient(w):
        return grad(lambda x: (x * w).sin().sum())(x)  # x is the caller's constant; w flows from outside
    expected = np.diag(np.cos(x.numpy() * w.numpy()) - x.numpy() * w.numpy() * np.sin(x.numpy() * w.numpy()))
    np.testing.assert_allclose(jacrev(inner_gradient)(w).numpy(), expected, atol=1e-12)


def test_grad_runs_under_no_grad():
    with minigrad.no_grad():
        np.testing.assert_allclose(grad(lambda x: (x * x).sum())(rand(3) * 0 + 1).numpy(), [2, 2, 2])


def test_functional_call_ties_shared_weights_and_checks_names():
    minigrad.manual_seed(2)
    a = nn.Linear(2, 2, bias=False)
    model = nn.Sequential(a, a)
    w = minigrad.zeros(2, 2)
    assert functional_call(model, {"0.weight": w}, minigrad.ones(1, 2)).abs().sum().item() == 0
    with pytest.raises(ArgumentError, match="unexpected keys \\['bogus'\\]"):
        functional_call(model, {"bogus": w}, minigrad.ones(1, 2))
    with pytest.raises(ArgumentError, match="missing keys"):
        functional_call(nn.Linear(2, 2), {"weight": w}, minigrad.ones(1, 2), strict=True)


def test_errors_name_what_was_expected():
    with pytest.raises(ShapeError, match="single element, got \\(3,\\)"):
        grad(lambda x: x * 2)(rand(3))
    with pytest.raises(ArgumentError, match="argnums"):
        grad(smooth, argnums=1)(rand(3))
    with pytest.raises(ArgumentError, match="has_aux=True"):
        grad(smooth, has_aux=True)(rand(3))
    with pytest.raises(ShapeError, match="same size"):
        vmap(lambda a, b: a + b)(rand(2, 3), rand(3, 3))
    with pytest.raises(ArgumentError, match="randomness must be 'error', 'different' or 'same', got 'each'"):
        vmap(smooth, randomness="each")
    with pytest.raises(ArgumentError, match="expected Tensors"):
        jacrev(lambda x: [x, "label"])(rand(2))
    with pytest.raises(ShapeError, match="cotangents"):
        vjp(vector_fn, rand(2, 3))[1](rand(6))


# -- against torch.func ----------------------------------------------------------------------
def test_against_torch_func():
    torch = pytest.importorskip("torch")
    from torch import func as tf

    def both(fn_mg, fn_t, *arrays):
        ours = fn_mg(*(minigrad.tensor(a, dtype=f64) for a in arrays))
        theirs = fn_t(*(torch.tensor(a, dtype=torch.float64) for a in arrays))
        ours, theirs = (ours if isinstance(ours, tuple) else (ours,)), (theirs if isinstance(theirs, tuple) else (theirs,))
        for a, b in zip(ours, theirs):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-10, atol=1e-12)

    rng = np.random.default_rng(0)
    x, y, v, batch = rng.normal(size=4), rng.normal(size=4), rng.normal(size=4), rng.normal(size=(3, 4))

    def f(x, y):
        return (x.sin() * y.exp()).sum() + (x * y).tanh().sum()

    def g(x):
        return x.tanh() * x.sum()
    both(grad(f, argnums=(0, 1)), tf.grad(f, argnums=(0, 1)), x, y)
    both(jacrev(g), tf.jacrev(g), x)
    both(jacfwd(g), tf.jacfwd(g), x)
    both(hessian(f, argnums=1), tf.hessian(f, argnums=1), x, y)
    both(jacfwd(jacrev(f)), tf.jacfwd(tf.jacrev(f)), x, y)
    both(vmap(grad(f), in_dims=(0, None)), tf.vmap(tf.grad(f), in_dims=(0, None)), batch, y)
    both(lambda x, v: jvp(g, (x,), (v,)), lambda x, v: tf.jvp(g, (x,), (v,)), x, v)
    both(lambda x, v: vjp(g, x)[1](v), lambda x, v: tf.vjp(g, x)[1](v), x, v)

    torch.manual_seed(0)
    t_model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1)).double()
    model = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 1)).double()
    model.load_state_dict({k: minigrad.tensor(p.detach().numpy()) for k, p in t_model.state_dict().items()})

    def per_example_grads(fc, model, params, xs, grad_fn, vmap_fn):
        def loss(p, x):
            return fc(model, p, (x.reshape(1, 4),)).sum()
        return vmap_fn(grad_fn(loss), in_dims=(None, 0))(params, xs)
    ours = per_example_grads(functional_call, model, {k: p.detach() for k, p in model.named_parameters()},
                             minigrad.tensor(batch, dtype=f64), grad, vmap)
    theirs = per_example_grads(tf.functional_call, t_model, {k: p.detach() for k, p in t_model.named_parameters()},
                               torch.tensor(batch, dtype=torch.float64), tf.grad, tf.vmap)
    for name in theirs:
        np.testing.assert_allclose(ours[name].numpy(), theirs[name].numpy(), rtol=1e-10, atol=1e-12)
