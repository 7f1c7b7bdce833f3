"""vmap by batching rules (minigrad.batching): every rule agrees with running the function once per
example, the rules run each op once for the whole batch (the per-example loop only for ops without
one), nested vmaps work, and a Jacobian takes a fixed number of backward passes whatever its size,
checked against finite differences and, where PyTorch is installed, torch.func."""

import numpy as np
import pytest

import minigrad
import minigrad.nn.functional as F
from minigrad.autograd import engine
from minigrad.autograd.function import Function
from minigrad.autograd.mode import Mode
from minigrad import batching
from minigrad.batching import rule_of
from minigrad.func import hessian, jacfwd, jacrev, vmap

f64 = minigrad.float64


def rand(*shape):
    return minigrad.randn(*shape, dtype=f64)


def per_example(f, *args, in_dims=0):
    """What vmap must give: f on each example (numpy slices), stacked along dim 0."""
    dims = in_dims if isinstance(in_dims, tuple) else (in_dims,) * len(args)
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    outs = [f(*(a if d is None else minigrad.tensor(np.take(a.numpy(), i, axis=d), dtype=a.dtype)
                for a, d in zip(args, dims))).numpy() for i in range(size)]
    return np.stack(outs)


# one case per rule (and the fallback): (function, argument shapes, in_dims)
CASES = {
    "elementwise, ranks differ": (lambda x, y: x * y + y.exp() - 1, [(4, 3), (2, 3)], (0, None)),
    "elementwise, batched scalar": (lambda x, y: (x + y).sigmoid(), [(4,), (2, 3)], (0, None)),
    "where and clamp": (lambda x: minigrad.where(x > 0, x, -x).clamp(0.1, 1.0), [(5, 2, 3)], 0),
    "dims: sum with keepdim": (lambda x: x.sum(dim=-1, keepdim=True) + x.mean(0), [(3, 4, 5)], 0),
    "dims: sum of all": (lambda x: x.sum() * x.amax(), [(3, 4, 5)], 1),
    "dim: softmax, cumsum": (lambda x: F.softmax(x, dim=0).cumsum(-1), [(3, 4, 5)], 2),
    "dim: max along a dim": (lambda x: x.max(dim=1)[0], [(3, 4, 5)], 0),
    "shape: reshape, expand": (lambda x: x.reshape(-1, 2).unsqueeze(0).expand(3, 10, 2), [(4, 5, 4)], 0),
    "perm: transpose, permute": (lambda x: x.transpose(0, 1).permute(2, 0, 1), [(3, 4, 5, 2)], 0),
    "matmul: vector @ matrix": (lambda v, m: v @ m, [(4, 3), (3, 5)], (0, None)),
    "matmul: matrix @ vector": (lambda m, v: m @ v, [(2, 3), (4, 3)], (None, 0)),
    "matmul: both batched": (lambda a, b: a @ b, [(4, 2, 3), (3, 4, 5)], (0, 1)),
    "matmul: vector . vector": (lambda a, b: a @ b, [(4, 3), (4, 3)], (0, 0)),
    "rows: linear": (lambda x, w, b: F.linear(x, w, b).tanh(), [(4, 3), (5, 3), (5,)], (0, None, None)),
    "index: basic": (lambda x: x[1:, None, ::2][..., 0], [(4, 3, 5)], 0),
    "cat: with an unbatched operand": (lambda x, y: minigrad.cat([x, y], dim=-1), [(4, 3, 2), (3, 1)], (0, None)),
    "stack": (lambda x: minigrad.stack([x, x * 2], dim=1), [(4, 3)], 0),
    "fold: conv, max pool, avg pool": (lambda x, w: F.avg_pool2d(F.max_pool2d(F.conv2d(x, w, padding=1), 2), 2),
                                       [(3, 2, 2, 8, 8), (4, 2, 3, 3)], (0, None)),
    "bitwise on integers": (lambda a: ((a * 4).long() & 3) | 8, [(4, 3)], 0),
    "fallback: advanced index": (lambda x: x[minigrad.tensor([2, 0])], [(4, 3)], 0),
}


@pytest.mark.parametrize("name", CASES)
def test_each_rule_agrees_with_the_per_example_loop(name, monkeypatch):
    f, shapes, in_dims = CASES[name]
    args = [rand(*s) for s in shapes]
    loops = []
    fallback = batching._per_example
    monkeypatch.setattr(batching, "_per_example", lambda cls, *a: loops.append(cls.__name__) or fallback(cls, *a))
    got = vmap(f, in_dims=in_dims)(*args).numpy()
    np.testing.assert_allclose(got, per_example(f, *args, in_dims=in_dims), rtol=1e-12, atol=1e-12)
    assert loops == (["GetItem"] if name.startswith("fallback") else [])  # the rules ran, not the loop


def test_every_declared_rule_exists():
    from minigrad.ops.op import all_ops

    declared = {cls.__name__: rule_of(cls) for cls in all_ops() if rule_of(cls) is not None}
    assert {"Matmul", "Linear", "Sum", "Reshape", "Permute", "Tanh", "GetItem", "Cat"} <= set(declared)
    assert not {name: r for name, r in declared.items() if r not in batching.RULES}


def test_gradients_flow_through_the_batched_ops():
    w, xs = rand(5, 3).requires_grad_(), rand(4, 3)
    vmap(lambda x: F.linear(x, w).tanh().sum(), in_dims=0)(xs).sum().backward()
    expected = sum((1 - np.tanh(w.detach().numpy() @ x) ** 2)[:, None] * x for x in xs.numpy())
    np.testing.assert_allclose(w.grad.numpy(), expected, rtol=1e-12)


class OpLog(Mode):
    """Records the class of every op that runs."""

    def __init__(self):
        self.ops = []

    def after_op(self, ctx, args, kwargs, outputs):
        self.ops.append(type(ctx).__name__)


class Doubled(Function):
    """A user-defined Function: no batching rule, so vmap runs it once per example."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


def test_ops_with_a_rule_run_once_and_ops_without_one_once_per_example():
    assert rule_of(minigrad.ops.elementwise.Tanh) == "elementwise"
    assert rule_of(Doubled) is None
    with OpLog() as log:
        out = vmap(lambda x: Doubled.apply(x.tanh().sum(-1)))(rand(6, 3))
    assert log.ops.count("Tanh") == 1 and log.ops.count("Sum") == 1
    assert log.ops.count("Doubled") == 6  # the fallback: one call per example, then one stack
    assert tuple(out.shape) == (6,)


def test_nested_vmap_is_a_double_loop():
    x, y = rand(3, 4), rand(5, 4)
    got = vmap(lambda a: vmap(lambda b: (a * b).sum() + a.amax())(y))(x).numpy()
    xn, yn = x.numpy(), y.numpy()
    np.testing.assert_allclose(got, xn @ yn.T + xn.max(1)[:, None], rtol=1e-12)
    inner_first = vmap(vmap(lambda a, b: a @ b, in_dims=(None, 0)), in_dims=(0, None))(x, y).numpy()
    np.testing.assert_allclose(inner_first, xn @ yn.T, rtol=1e-12)


def predict(weight, bias, x):
    return F.linear(x, weight, bias).tanh()


def predict_args(d):
    return rand(d, d) / d ** 0.5, rand(d), rand(d)


@pytest.fixture
def backward_passes(monkeypatch):
    """Counts the engine's backward passes (one per call of its graph walk)."""
    calls = []
    run = engine._run

    def counted(*args, **kwargs):
        calls.append(1)
        return run(*args, **kwargs)
    monkeypatch.setattr(engine, "_run", counted)
    return calls


@pytest.mark.parametrize("transform,passes", [(jacrev, 1), (jacfwd, 2), (hessian, 3)])
def test_a_jacobian_takes_the_same_few_backward_passes_at_any_size(backward_passes, transform, passes):
    for d in (3, 24):
        backward_passes.clear()
        out = transform(predict, argnums=2)(*predict_args(d))
        assert len(backward_passes) == passes, (transform.__name__, d)
        assert tuple(out.shape) == (d,) * (3 if transform is hessian else 2)


def test_jacobian_and_hessian_of_predict_match_closed_forms_and_finite_differences():
    w, b, x = predict_args(7)
    wn, y = w.numpy(), np.tanh(w.numpy() @ x.numpy() + b.numpy())
    jac = (1 - y ** 2)[:, None] * wn
    hess = (-2 * y * (1 - y ** 2))[:, None, None] * wn[:, :, None] * wn[:, None, :]
    np.testing.assert_allclose(jacrev(predict, argnums=2)(w, b, x).numpy(), jac, rtol=1e-12)
    np.testing.assert_allclose(jacfwd(predict, argnums=2)(w, b, x).numpy(), jac, rtol=1e-12)
    np.testing.assert_allclose(hessian(predict, argnums=2)(w, b, x).numpy(), hess, rtol=1e-10, atol=1e-14)
    eps, x0 = 1e-6, x.numpy()
    numeric = np.stack([(predict(w, b, minigrad.tensor(x0 + eps * e)).numpy()
                         - predict(w, b, minigrad.tensor(x0 - eps * e)).numpy()) / (2 * eps)
                        for e in np.eye(7)], axis=-1)
    np.testing.assert_allclose(jac, numeric, rtol=1e-6, atol=1e-9)


def test_jacobians_against_torch_func():
    torch = pytest.importorskip("torch")
    import torch.func as tf

    w, b, x = predict_args(9)
    xs = rand(4, 9)
    tw, tb, tx, txs = (torch.tensor(t.numpy()) for t in (w, b, x, xs))

    def tpredict(weight, bias, x):
        return torch.nn.functional.linear(x, weight, bias).tanh()

    def same(got, want):
        for g, t in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            np.testing.assert_allclose(g.numpy(), t.numpy(), rtol=1e-10, atol=1e-12)
    same(jacrev(predict, argnums=(0, 1, 2))(w, b, x), tf.jacrev(tpredict, argnums=(0, 1, 2))(tw, tb, tx))
    same(jacfwd(predict, argnums=(0, 2))(w, b, x), tf.jacfwd(tpredict, argnums=(0, 2))(tw, tb, tx))
    same(hessian(predict, argnums=2)(w, b, x), tf.hessian(tpredict, argnums=2)(tw, tb, tx))
    batched = (None, None, 0)
    same(vmap(jacrev(predict, argnums=2), in_dims=batched)(w, b, xs),
         tf.vmap(tf.jacrev(tpredict, argnums=2), in_dims=batched)(tw, tb, txs))


def test_per_example_gradients_take_one_forward_and_one_backward_pass(backward_passes):
    w, xs = rand(3, 4), rand(6, 4)
    calls = []

    def loss(w, x):
        calls.append(1)
        return (F.linear(x, w).tanh() ** 2).sum()
    from minigrad.func import grad
    per_weight, per_input = vmap(grad(loss, argnums=(0, 1)), in_dims=(None, 0))(w, xs)
    assert len(calls) == 1 and len(backward_passes) == 1
    wn = w.numpy()
    for i, x in enumerate(xs.numpy()):
        y = np.tanh(wn @ x)
        dz = 2 * y * (1 - y ** 2)
        np.testing.assert_allclose(per_weight[i].numpy(), np.outer(dz, x), rtol=1e-12)
        np.testing.assert_allclose(per_input[i].numpy(), wn.T @ dz, rtol=1e-12)


def test_transforms_under_vmap_give_each_examples_derivatives():
    from minigrad.func import grad, jvp, vjp

    xs, ts = rand(4, 3), rand(4, 3)
    x, t = xs.numpy(), ts.numpy()
    dfdx = np.cos(x) * x + np.sin(x)  # of f below, elementwise

    def f(x):
        return (x.sin() * x).sum(-1, keepdim=True)
    _, tangents = vmap(lambda x, t: jvp(f, (x,), (t,)))(xs, ts)
    np.testing.assert_allclose(tangents.numpy(), (dfdx * t).sum(-1, keepdims=True), rtol=1e-12)

    def pulled(x, ct):
        return vjp(f, x)[1](ct)[0]
    np.testing.assert_allclose(vmap(pulled)(xs, minigrad.ones(4, 1, dtype=f64)).numpy(), dfdx, rtol=1e-12)
    cubes = rand(2, 3, 4)
    nested = vmap(vmap(grad(lambda x: (x ** 3).sum())))(cubes).numpy()
    np.testing.assert_allclose(nested, 3 * cubes.numpy() ** 2, rtol=1e-12)
    np.testing.assert_allclose(vmap(lambda a: a.data * 2)(xs).numpy(), 2 * x)


@pytest.mark.parametrize("transform,passes", [(jacrev, 1), (jacfwd, 2), (hessian, 3)])
def test_a_batch_of_jacobians_takes_the_passes_of_one(backward_passes, transform, passes):
    w, b, _ = predict_args(5)
    xs = rand(4, 5)
    batched = vmap(transform(predict, argnums=2), in_dims=(None, None, 0))(w, b, xs)
    assert len(backward_passes) == passes
    for i in range(4):
        np.testing.assert_allclose(batched[i].numpy(), transform(predict, argnums=2)(w, b, xs[i]).numpy(),
                                   rtol=1e-12, atol=1e-15)
    per_weight = vmap(jacrev(predict, argnums=0), in_dims=(None, None, 0))(w, b, xs)  # unbatched argument
    np.testing.assert_allclose(per_weight[2].numpy(), jacrev(predict, argnums=0)(w, b, xs[2]).numpy(), rtol=1e-12)


# -- randomness: what a random op inside the mapped function draws, as torch.func.vmap's argument --------
RANDOM = {  # each maps a (16,) example of ones; the random part is what the examples may share
    "randn": lambda t: t * minigrad.randn(16, dtype=f64),
    "rand": lambda t: t + minigrad.rand(16, dtype=f64),
    "randn_like": lambda t: minigrad.randn_like(t),
    "randint": lambda t: t + minigrad.randint(0, 1000, (16,)).double(),
    "randperm": lambda t: t + minigrad.randperm(16).double(),
    "dropout": lambda t: F.dropout(t, 0.5),  # on the batched input
    "dropout of an unbatched tensor": lambda t: t * F.dropout(minigrad.ones(16, dtype=f64), 0.5),
    "dropout1d's channel mask": lambda t: F.dropout1d(t.reshape(16, 1), 0.5).reshape(16),
    "multinomial": lambda t: minigrad.multinomial(t, 16, replacement=True).double(),  # batched weights
    "multinomial of unbatched weights": lambda t: t + minigrad.multinomial(minigrad.ones(16), 8).double().repeat(2),
    "normal_": lambda t: minigrad.nn.init.normal_(t.clone()),  # an in-place fill of a batched tensor
    "xavier_uniform_": lambda t: minigrad.nn.init.xavier_uniform_(t.reshape(4, 4) * 1.0).reshape(16),
    "trunc_normal_": lambda t: minigrad.nn.init.trunc_normal_(t * 1.0, std=2.0),
}
NAMES = {"randn_like": "randn", "dropout of an unbatched tensor": "Dropout", "dropout1d's channel mask": "Dropout",
         "dropout": "Dropout", "multinomial of unbatched weights": "multinomial", "xavier_uniform_": "uniform_"}


def _rows_equal(out):
    return [np.array_equal(out[0].numpy(), out[i].numpy()) for i in range(1, len(out))]


@pytest.mark.parametrize("name", RANDOM)
def test_randomness_error_is_the_default_and_names_the_op(name):
    with pytest.raises(RuntimeError, match=rf"vmap: {NAMES.get(name, name)} draws random numbers .* "
                                           r"randomness is 'error' \(the default\); pass randomness="):
        vmap(RANDOM[name])(minigrad.ones(6, 16, dtype=f64))
    with pytest.raises(batching.RandomnessError):
        vmap(RANDOM[name], randomness="error")(minigrad.ones(6, 16, dtype=f64))


@pytest.mark.parametrize("name", RANDOM)
def test_randomness_different_draws_for_each_example_and_same_once(name):
    minigrad.manual_seed(0)
    different = vmap(RANDOM[name], randomness="different")(minigrad.ones(6, 16, dtype=f64))
    assert different.shape == (6, 16) and not any(_rows_equal(different))
    minigrad.manual_seed(0)
    same = vmap(RANDOM[name], randomness="same")(minigrad.ones(6, 16, dtype=f64))
    assert same.shape == (6, 16) and all(_rows_equal(same))
    minigrad.manual_seed(0)  # the one draw is the one the function makes outside vmap
    np.testing.assert_array_equal(same[0].numpy(), RANDOM[name](minigrad.ones(16, dtype=f64)).numpy())


def test_randomness_different_draws_what_one_draw_per_example_would():
    minigrad.manual_seed(0)
    got = vmap(lambda t: t + minigrad.randn(3, dtype=f64), randomness="different")(minigrad.zeros(4, 3, dtype=f64))
    minigrad.manual_seed(0)
    np.testing.assert_array_equal(got.numpy(), np.stack([minigrad.randn(3, dtype=f64).numpy() for _ in range(4)]))


def test_randomness_same_dropout_keeps_the_examples_apart():
    """One mask for the batch, applied to each example's own values (and their own gradients)."""
    xs = rand(5, 16)
    out = vmap(lambda t: F.dropout(t, 0.5), randomness="same")(xs).numpy()
    mask = out / xs.numpy()
    assert np.allclose(mask, mask[0]) and set(np.unique(mask[0])) <= {0.0, 2.0}
    g = vmap(minigrad.func.grad(lambda t: (F.dropout(t, 0.5) * t).sum()), randomness="same")(xs).numpy()
    assert np.allclose(g / (2 * xs.numpy()), (g / (2 * xs.numpy()))[0])


def test_randomness_of_nested_vmaps_is_per_level():
    outer_only = vmap(vmap(lambda t: t * minigrad.rand((), dtype=f64), randomness="same"),
                      randomness="different")(minigrad.ones(3, 4, dtype=f64)).numpy()
    assert all(np.all(row == row[0]) for row in outer_only) and len(set(outer_only[:, 0])) == 3
    inner_only = vmap(vmap(lambda t: t * minigrad.rand((), dtype=f64), randomness="different"),
                      randomness="same")(minigrad.ones(3, 4, dtype=f64)).numpy()
    assert np.all(inner_only == inner_only[0]) and len(set(inner_only[0])) == 4
    both = vmap(vmap(lambda t: t * minigrad.rand((), dtype=f64), randomness="different"),
                randomness="different")(minigrad.ones(3, 4, dtype=f64)).numpy()
    assert len(set(both.ravel())) == 12
    with pytest.raises(batching.RandomnessError, match="rand draws"):  # any level that says 'error' refuses
        vmap(vmap(lambda t: t * minigrad.rand(()), randomness="same"))(minigrad.ones(3, 4))


def test_randomness_reaches_the_transforms_that_run_per_example():
    """vjp and jvp under vmap run once per example: their draws follow the vmap's randomness too."""
    from minigrad.func import jvp, vjp

    def value(t):
        return vjp(lambda y: y * minigrad.randn(16, dtype=f64), t)[0]

    def tangent(t):
        return jvp(lambda y: y * minigrad.rand(16, dtype=f64), (t,), (t,))[1]
    for f in (value, tangent):
        assert all(_rows_equal(vmap(f, randomness="same")(minigrad.ones(4, 16, dtype=f64))))
        assert not any(_rows_equal(vmap(f, randomness="different")(minigrad.ones(4, 16, dtype=f64))))
        with pytest.raises(batching.RandomnessError):
            vmap(f)(minigrad.ones(4, 16, dtype=f64))


def test_an_in_place_fill_of_an_unbatched_tensor_cannot_differ_per_example():
    """As in torch.func: 'different' refuses it (each example would see the one draw), 'same' fills
    it once; a batched tensor gets one draw per example, into its own memory."""
    init = minigrad.nn.init
    with pytest.raises(batching.RandomnessError, match=r"vmap: uniform_ fills a tensor that the vmap does not batch"):
        vmap(lambda t: t + init.uniform_(minigrad.empty(16)), randomness="different")(minigrad.ones(6, 16))
    assert all(_rows_equal(vmap(lambda t: t + init.uniform_(minigrad.empty(16)), randomness="same")(minigrad.ones(6, 16))))
    stacked = minigrad.zeros(6, 16, dtype=f64)
    vmap(lambda t: init.normal_(t), randomness="different")(stacked)
    assert not any(_rows_equal(stacked)) and abs(float(stacked.std()) - 1) < 0.2  # written through


def test_randomness_follows_torch_func():
    torch = pytest.importorskip("torch")
    from torch.func import vmap as tvmap

    tf = torch.nn.functional
    for mg_f, t_f in [(lambda t: t * minigrad.rand(16), lambda t: t * torch.rand(16)),
                      (lambda t: F.dropout(t, 0.5), lambda t: tf.dropout(t, 0.5)),
                      (lambda t: F.dropout(t, 0.5, training=False), lambda t: tf.dropout(t, 0.5, training=False)),
                      # torch refuses 'same' with batched weights, which minigrad draws as it does dropout's
                      (lambda t: t + minigrad.multinomial(minigrad.ones(16), 16, True),
                       lambda t: t + torch.multinomial(torch.ones(16), 16, True)),
                      (lambda t: minigrad.nn.init.normal_(t.clone()), lambda t: torch.nn.init.normal_(t.clone())),
                      (lambda t: t + minigrad.nn.init.normal_(minigrad.empty(16)),
                       lambda t: t + torch.nn.init.normal_(torch.empty(16)))]:
        for randomness in ("error", "different", "same"):
            try:
                t_out = tvmap(t_f, randomness=randomness)(torch.ones(6, 16))
            except RuntimeError:
                with pytest.raises(RuntimeError):
                    vmap(mg_f, randomness=randomness)(minigrad.ones(6, 16))
                continue
            out = vmap(mg_f, randomness=randomness)(minigrad.ones(6, 16))
            assert _rows_equal(out) == [torch.equal(t_out[0], t_out[i]) for i in range(1, 6)]


# -- batched index tensors: each example reads x_b[i_b] -----------------------------------------------
def _ints(high, *shape):
    return minigrad.tensor(np.random.default_rng(sum(shape) + high).integers(0, high, shape))


# (function, arguments, in_dims, whether GetItem runs once for the batch): shapes per example in
# the comments; a bool mask, and a batched 0-d index beside another advanced index (an int for each
# example, which torch does not count as advanced), run once per example
BATCHED_INDEX = {
    "t[i], both batched": (lambda t, i: t[i], lambda: (rand(4, 3), _ints(3, 4, 3)), 0, True),
    "t[i], t unbatched": (lambda t, i: t[i], lambda: (rand(5), _ints(5, 4, 3)), (None, 0), True),
    "adjacent after a slice": (lambda t, a, b: t[:, a, b], lambda: (rand(4, 5, 6, 7), _ints(6, 4, 2, 3),
                                                                 _ints(7, 4, 3)), 0, True),
    "apart, go first": (lambda t, a, b: t[a, :, b], lambda: (rand(4, 5, 6, 7), _ints(5, 4, 2, 3), _ints(7, 4, 3)),
                        0, True),
    "ints do not part them": (lambda t, a, b: t[:, a, 1, b], lambda: (rand(4, 2, 5, 6, 7), _ints(5, 4, 3),
                                                                   _ints(7, 4, 3)), 0, True),
    "None, steps, Ellipsis": (lambda t, a: t[None, 1:, a, ..., ::2], lambda: (rand(4, 5, 6, 7), _ints(6, 4, 2, 3)),
                              0, True),
    "an unbatched list beside": (lambda t, a: t[a, :, [1, 2, 0]], lambda: (rand(4, 5, 6, 7), _ints(5, 4, 3)),
                                 0, True),
    "t unbatched, apart": (lambda t, a, b: t[a, :, b], lambda: (rand(5, 6, 7), _ints(5, 4, 2, 3), _ints(7, 4, 3)),
                           (None, 0, 0), True),
    "t unbatched, after a slice": (lambda t, a: t[:, a, 2], lambda: (rand(5, 6, 7), _ints(6, 4, 2)), (None, 0), True),
    "a 0-d index": (lambda t, c: t[:, c], lambda: (rand(4, 5, 6), _ints(6, 4)), 0, True),
    "index mapped along dim 1": (lambda t, i: t[i], lambda: (rand(4, 3), _ints(3, 2, 4)), (0, 1), True),
    "a 0-d index beside another": (lambda t, c: t[c, :, [1, 2]], lambda: (rand(4, 3, 5, 6), _ints(3, 4)), 0, False),
    "a bool mask beside": (lambda t, b: t[[True, False, True], b],
                           lambda: (rand(4, 3, 5), _ints(5, 4, 2)), 0, False),
    "gather": (lambda t, i: t.gather(1, i), lambda: (rand(4, 5, 2), _ints(2, 4, 5, 3)), 0, True),
    "gather, t unbatched": (lambda t, i: t.gather(0, i), lambda: (rand(5, 6), _ints(5, 4, 2, 6)), (None, 0), True),
    "index_select": (lambda t, i: t.index_select(1, i), lambda: (rand(4, 5, 6), _ints(6, 4, 3)), 0, True),
    "index_select, t unbatched": (lambda t, i: t.index_select(0, i), lambda: (rand(5, 6), _ints(5, 4, 3)),
                                  (None, 0), True),
}


@pytest.mark.parametrize("name", BATCHED_INDEX)
def test_a_batched_index_reads_each_examples_own_elements(name):
    f, make, in_dims, once = BATCHED_INDEX[name]
    args = make()
    with OpLog() as log:
        got = vmap(f, in_dims=in_dims)(*args)
    np.testing.assert_array_equal(got.numpy(), per_example(f, *args, in_dims=in_dims))
    assert (log.ops.count("GetItem") == 1) == once  # one read for the whole batch, not one per example


def test_a_batched_index_gives_torchs_shape():
    """The issue's case: t_b[i_b] for each example is (3,), so the batch is (4, 3), not (4, 4, 3)."""
    x, i = rand(4, 3), _ints(3, 4, 3)
    out = vmap(lambda t, i: t[i])(x, i)
    assert out.shape == (4, 3)
    np.testing.assert_array_equal(out.numpy(), np.take_along_axis(x.numpy(), i.numpy(), 1))


def test_batched_indices_in_nested_vmaps():
    xs, idx = rand(2, 4, 5), _ints(5, 2, 3)
    expected = np.stack([xs.numpy()[b][:, idx.numpy()[b]] for b in range(2)])
    np.testing.assert_array_equal(vmap(lambda t, j: vmap(lambda r: r[j])(t))(xs, idx).numpy(), expected)
    inner = vmap(lambda j: vmap(lambda r, k: r[k], in_dims=(0, None))(xs[0], j))(idx).numpy()
    np.testing.assert_array_equal(inner, np.stack([xs.numpy()[0][:, j] for j in idx.numpy()]))
    both = _ints(5, 2, 4, 3)
    np.testing.assert_array_equal(vmap(vmap(lambda r, k: r[k]))(xs, both).numpy(),
                                  np.take_along_axis(xs.numpy(), both.numpy(), 2))


def test_gradients_through_a_batched_index():
    """Each example's gradient scatters back into its own row only, adding where an index repeats:
    through backward, vmap of grad, and jacrev under vmap."""
    from minigrad.func import grad

    x, i = rand(4, 3), minigrad.tensor([[0, 0, 2], [1, 2, 1], [2, 2, 2], [0, 1, 2]])
    xn, ix = x.numpy(), i.numpy()
    expected = np.zeros_like(xn)
    for b in range(4):
        np.add.at(expected[b], ix[b], 2 * xn[b][ix[b]])
    xg = x.detach().requires_grad_()
    (vmap(lambda t, j: t[j])(xg, i) ** 2).sum().backward()
    np.testing.assert_allclose(xg.grad.numpy(), expected, rtol=1e-12)
    np.testing.assert_allclose(vmap(grad(lambda t, j: (t[j] ** 2).sum()))(x, i).numpy(), expected, rtol=1e-12)
    jac = vmap(jacrev(lambda t, j: t[j] * t[0]))(x, i).numpy()
    for b in range(4):
        one = np.zeros((3, 3))
        one[np.arange(3), ix[b]] += xn[b, 0]
        one[:, 0] += xn[b][ix[b]]
        np.testing.assert_allclose(jac[b], one, rtol=1e-12)


def test_batched_indices_against_torch_func():
    torch = pytest.importorskip("torch")
    from torch.func import grad as tgrad, jacrev as tjacrev, vmap as tvmap
    from minigrad.func import grad

    for name, (f, make, in_dims, _) in BATCHED_INDEX.items():
        if name.startswith("a 0-d index beside"):  # torch moves the block to the front, unlike its own loop
            continue
        args = make()
        got = vmap(f, in_dims=in_dims)(*args)
        want = tvmap(f, in_dims=in_dims)(*[torch.tensor(a.numpy()) for a in args])
        assert tuple(got.shape) == tuple(want.shape), name
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    x, i = rand(4, 3), _ints(3, 4, 3)
    tx, ti = torch.tensor(x.numpy()), torch.tensor(i.numpy())
    np.testing.assert_allclose(vmap(grad(lambda t, j: (t[j] ** 3).sum()))(x, i).numpy(),
                               tvmap(tgrad(lambda t, j: (t[j] ** 3).sum()))(tx, ti).numpy(), rtol=1e-12)
    np.testing.assert_allclose(vmap(jacrev(lambda t, j: t[j].sin()))(x, i).numpy(),
                               tvmap(tjacrev(lambda t, j: t[j].sin()))(tx, ti).numpy(), rtol=1e-12)
    np.testing.assert_allclose(jacrev(lambda t: vmap(lambda r, j: r[j])(t, i))(x).numpy(),
                               tjacrev(lambda t: tvmap(lambda r, j: r[j])(t, ti))(tx).numpy(), rtol=1e-12)


def test_writes_at_an_index_under_vmap_write_each_examples_own_elements():
    """t[index] = value inside vmap writes into each example (a basic index too: it wrote the
    batch's first rows), with an index tensor and a value that the vmap may batch."""
    def write(t, j, v):
        t = t.clone()
        t[0] = -1.0
        t[1:, j] = v
        return t
    x, j, v = rand(4, 3, 5), _ints(5, 4, 2), rand(4, 2)
    np.testing.assert_array_equal(vmap(write)(x, j, v).numpy(), per_example(write, x, j, v))
    np.testing.assert_array_equal(vmap(write, in_dims=(0, None, 0))(x, j[0], v).numpy(),
                                  per_example(write, x, j[0], v, in_dims=(0, None, 0)))

    def put(t, j):
        return minigrad.ops.index_put(t, (j,), minigrad.tensor(7.0, dtype=f64))
    np.testing.assert_array_equal(vmap(put)(x[:, 0], j).numpy(), per_example(put, x[:, 0], j))


# -- in-place ops under vmap: the node they record is the one the returned batch carries ----------
def _clone_write(t, v):
    y = t * 1.0
    y[0] = v[1] * 2.0
    return y


IN_PLACE = {  # f(t, v) of one example (t and v of shape (4,)), through in-place ops
    "mul_": lambda t, v: (t * v).mul_(2.0),
    "add_": lambda t, v: t.clone().add_(v, alpha=2.0),
    "sub_": lambda t, v: t.clone().sub_(v),
    "div_": lambda t, v: (t * v).div_(3.0),
    "+= and *=": lambda t, v: _iadd_imul(t, v),
    "copy_ of a batched source": lambda t, v: (t * 3.0).copy_(v) * t,
    "clamp_": lambda t, v: (t * v).clamp_(-0.3, 0.5),
    "setitem at an int": _clone_write,
    "setitem at a slice": lambda t, v: _write(t * 1.0, slice(1, 3), v[:2] * t[0]),
    "masked_fill_": lambda t, v: (t * v).masked_fill_(t > 0, 0.5),
    "zero_": lambda t, v: (t * v).zero_() + t,
    "fill_": lambda t, v: (t * v).fill_(2.0) * t,
    "a chain": lambda t, v: (t * v).add_(t).mul_(2.0).sub_(v).clamp_(-1.0, 1.0),
}


def _iadd_imul(t, v):
    y = t * v
    y += t
    y *= 2.0
    return y


def _write(y, index, value):
    y[index] = value
    return y


def _values_and_grads(f, x, v, mapped):
    x, v = x.detach().requires_grad_(), v.detach().requires_grad_()
    out = vmap(f)(x, v) if mapped else minigrad.stack([f(x[i], v[i]) for i in range(x.shape[0])])
    (out * out).sum().backward()
    return [out.detach().numpy()] + [np.zeros(a.shape) if a.grad is None else a.grad.numpy() for a in (x, v)]


@pytest.mark.parametrize("name", IN_PLACE)
def test_gradients_through_in_place_ops_under_vmap_are_the_per_example_loops(name):
    """An in-place op under vmap records its node on the batch the vmap returns (it stayed on the
    wrapper, and ``t.clone().mul_(2)`` had a gradient of 1): values and gradients, to the target and
    to the value written, are the per-example loop's."""
    x, v = rand(3, 4), rand(3, 4)
    for got, want in zip(_values_and_grads(IN_PLACE[name], x, v, True), _values_and_grads(IN_PLACE[name], x, v, False)):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_an_in_place_op_under_vmap_bumps_the_version_the_saved_values_check():
    """A node that saved a batch's value notices an in-place write to the batch (the wrapper's own
    counter moved, the value's did not, and backward silently used the new values), as the loop does."""
    def f(t):
        y = t * 1.0
        z = y * y  # saves y
        y.mul_(2.0)
        return z
    x = rand(3, 4).requires_grad_()
    with pytest.raises(minigrad.errors.AutogradError, match="modified by an in-place operation"):
        minigrad.stack([f(x[i]) for i in range(3)]).sum().backward()
    with pytest.raises(minigrad.errors.AutogradError, match="modified by an in-place operation"):
        vmap(f)(x).sum().backward()


def test_setitem_under_vmap_sends_gradients_to_the_target_and_the_value():
    """``y[j] = v`` with an index the vmap batches, or one it does not: each example's gradient."""
    def batched(t, v, j):
        y = t * 1.0
        y[j] = v
        return y * t

    def shared(t, v, j):
        y = t * 1.0
        y[minigrad.tensor([1, 3])] = v
        return y * t
    j, x0, v0 = minigrad.tensor([[0, 2], [1, 3], [3, 0]]), rand(3, 4), rand(3, 2)
    for f in (batched, shared):
        got, want = [], []
        for out in (got, want):
            x, v = x0.detach().requires_grad_(), v0.detach().requires_grad_()
            y = vmap(f)(x, v, j) if out is got else minigrad.stack([f(x[i], v[i], j[i]) for i in range(3)])
            (y * y).sum().backward()
            out += [y.detach().numpy(), x.grad.numpy(), v.grad.numpy()]
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-12)


def test_transforms_through_in_place_ops_under_vmap():
    """vmap(grad), jacrev and vmap(jacrev) of a function that writes in place, against the loop
    of grad and jacrev over the examples."""
    def loss(t):
        y = t * 1.0
        y.mul_(3.0)
        y[0] = t[1] * 2.0
        y.clamp_(-1.0, 1.0)
        return (y * y).sum()

    def f(t):
        y = t * 1.0
        y.mul_(3.0)
        y[0] = t[1] * 2.0
        y.add_(t)
        return y * y
    x = rand(3, 4) * 0.4
    np.testing.assert_allclose(vmap(minigrad.func.grad(loss))(x).numpy(),
                               np.stack([minigrad.func.grad(loss)(x[i]).numpy() for i in range(3)]), rtol=1e-12)
    np.testing.assert_allclose(vmap(jacrev(f))(x).numpy(),
                               np.stack([jacrev(f)(x[i]).numpy() for i in range(3)]), rtol=1e-12)
    jac = jacrev(f)(x[0]).numpy()
    eps, x0 = 1e-6, x[0].numpy()
    fd = np.stack([(f(minigrad.tensor(x0 + eps * e)).numpy() - f(minigrad.tensor(x0 - eps * e)).numpy()) / (2 * eps)
                   for e in np.eye(4)], axis=1)
    np.testing.assert_allclose(jac, fd, rtol=1e-6, atol=1e-8)


def test_in_place_ops_under_vmap_against_torch_func():
    torch = pytest.importorskip("torch")
    x, v = rand(3, 4), rand(3, 4)
    for name in ("mul_", "add_", "setitem at an int", "masked_fill_", "zero_", "a chain"):
        ours = _values_and_grads(IN_PLACE[name], x, v, True)
        tx, tv = (torch.tensor(a.numpy(), requires_grad=True) for a in (x, v))
        out = torch.func.vmap(IN_PLACE[name])(tx, tv)
        (out * out).sum().backward()
        theirs = [out.detach().numpy()] + [np.zeros(a.shape) if a.grad is None else a.grad.numpy() for a in (tx, tv)]
        for got, want in zip(ours, theirs):
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=name)


def test_an_in_place_write_of_a_batch_into_an_unbatched_tensor_is_a_shape_error():
    def f(t):
        y = minigrad.zeros(4, dtype=f64)
        y[0] = t[1]
        return y
    with pytest.raises(minigrad.errors.ShapeError, match="does not batch"):
        vmap(f)(rand(3, 4))
    with pytest.raises(minigrad.errors.ShapeError, match="does not batch"):
        vmap(lambda t: minigrad.zeros(4, dtype=f64).add_(t))(rand(3, 4))


# -- ops that name a dim, and index ops with an index the vmap batches ------------------------------
DIM_OPS = {  # f(t) of one example of shape (4, 5)
    "topk along the last dim": lambda t: t.topk(2)[0],
    "topk along dim 0, its indices": lambda t: t.topk(3, dim=0, largest=False)[1],
    "topk of a 0-d tensor": lambda t: t[0, 0].topk(1)[0],
    "max along a dim and its index": lambda t: t.max(dim=0)[0] + t.max(dim=-1, keepdim=True)[1],
    "min along a dim": lambda t: t.min(dim=1)[0],
    "argmax, argmin": lambda t: t.argmax(dim=0) * 10 + t.argmin(dim=0),
    "argmax of all": lambda t: t.argmax(),
    "cumsum": lambda t: t.cumsum(0) + t.cumsum(-1),
}


@pytest.mark.parametrize("name", DIM_OPS)
@pytest.mark.parametrize("in_dim", [0, 2])
def test_ops_that_name_a_dim_name_the_examples_dim(name, in_dim):
    """``topk`` sorted the batch's array along the example's dim number (the batch dim, for dim 0)
    and then failed in gather: every op that names a dim names the same one of each example."""
    x = rand(3, 4, 5).permute(*{0: (0, 1, 2), 2: (1, 2, 0)}[in_dim])
    np.testing.assert_allclose(vmap(DIM_OPS[name], in_dims=in_dim)(x).numpy(),
                               per_example(DIM_OPS[name], x, in_dims=in_dim), rtol=1e-12)


def test_topk_under_vmap_sends_the_gradient_to_each_examples_largest():
    x = rand(3, 6).requires_grad_()
    values, indices = vmap(lambda t: minigrad.topk(t, 2))(x)
    values.sum().backward()
    want = np.zeros((3, 6))
    np.put_along_axis(want, np.argsort(-x.detach().numpy(), axis=1)[:, :2], 1.0, axis=1)
    np.testing.assert_array_equal(x.grad.numpy(), want)
    np.testing.assert_array_equal(indices.numpy(), np.argsort(-x.detach().numpy(), axis=1, kind="stable")[:, :2])


INDEX_OPS = {  # f(x, index, src) of one example: x (4, 5), index (2,) or (4, 2), src (4, 2)
    "index_add": (lambda x, i, s: x.index_add(1, i, s, alpha=2.0), (2,)),
    "index_add along dim 0": (lambda x, i, s: x.transpose(0, 1).index_add(0, i, s.transpose(0, 1)), (2,)),
    "scatter_add": (lambda x, j, s: x.scatter_add(1, j, s), (4, 2)),
    "index_select": (lambda x, i, s: x.index_select(1, i) * s, (2,)),
    "gather": (lambda x, j, s: x.gather(1, j) * s, (4, 2)),
}
IN_DIMS = [(0, 0, 0), (0, None, 0), (None, 0, 0), (None, 0, None), (0, 0, None)]


def _index_case(name, in_dims):
    f, index_shape = INDEX_OPS[name]
    full = [rand(3, 4, 5), _ints(5, 3, *index_shape), rand(3, 4, 2)]
    return f, [a if d == 0 else a[0] for a, d in zip(full, in_dims)]


@pytest.mark.parametrize("name", INDEX_OPS)
@pytest.mark.parametrize("in_dims", IN_DIMS)
def test_index_ops_with_an_index_the_vmap_batches_use_each_examples_index(name, in_dims):
    """index_add and scatter_add read the batched index's array whole (every example's indices
    into each example); values and gradients are the per-example loop's."""
    f, args = _index_case(name, in_dims)

    def run(mapped):
        xs = [a.detach().requires_grad_() if a.dtype == f64 else a for a in args]
        if mapped:
            out = vmap(f, in_dims=in_dims)(*xs)
        else:
            out = minigrad.stack([f(*[a[k] if d == 0 else a for a, d in zip(xs, in_dims)]) for k in range(3)])
        (out * out).sum().backward()
        return [out.detach().numpy()] + [xs[k].grad.numpy() for k in (0, 2)]
    for got, want in zip(run(True), run(False)):
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_an_index_batched_by_an_outer_vmap_indexes_each_example():
    f = INDEX_OPS["index_add"][0]
    x, i, s = rand(2, 3, 4, 5), _ints(5, 3, 2), rand(2, 3, 4, 2)
    got = vmap(vmap(f, in_dims=(0, None, 0)), in_dims=(1, 0, 1))(x, i, s).numpy()
    want = np.stack([np.stack([f(x[q, p], i[p], s[q, p]).numpy() for q in range(2)]) for p in range(3)])
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_dim_and_index_ops_under_vmap_against_torch_func():
    torch = pytest.importorskip("torch")
    x = rand(3, 4, 5)
    for name in ("topk along the last dim", "topk along dim 0, its indices", "max along a dim and its index"):
        np.testing.assert_allclose(vmap(DIM_OPS[name])(x).numpy(),
                                   torch.func.vmap(DIM_OPS[name])(torch.tensor(x.numpy())).numpy(), rtol=1e-12)
    for name in ("index_add", "scatter_add"):
        f, args = _index_case(name, (0, 0, 0))
        ours = [a.detach().requires_grad_() if a.dtype == f64 else a for a in args]
        theirs = [torch.tensor(a.numpy(), requires_grad=a.dtype == f64) for a in args]
        outs = [vmap(f)(*ours), torch.func.vmap(f)(*theirs)]
        for o in outs:
            (o * o).sum().backward()
        np.testing.assert_allclose(outs[0].detach().numpy(), outs[1].detach().numpy(), rtol=1e-12)
        for a, b in ((ours[0], theirs[0]), (ours[2], theirs[2])):
            np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-12)


def test_fill_with_a_value_the_vmap_batches_fills_each_example_with_its_own():
    """``t.fill_(v)`` with a 0-d ``v`` the vmap batches: its array (one number per example) was
    broadcast against the batch's trailing dim, so example i got every example's number."""
    x, v = rand(3, 4), rand(3)
    np.testing.assert_array_equal(vmap(lambda t, s: (t * 1.0).fill_(s))(x, v).numpy(),
                                  per_example(lambda t, s: (t * 1.0).fill_(s), x, v))
    with pytest.raises(minigrad.errors.ShapeError, match="does not batch"):
        vmap(lambda s: minigrad.zeros(2, dtype=f64).fill_(s))(v)
