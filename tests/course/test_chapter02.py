"""Chapter 02's regions against values worked out by hand or from the formulas: the backward rules,
the engine's order, sums and frees, gradcheck's differences, Module's registration, SGD and Adam.

These stand in for the PyTorch cross-checks a student cannot run: they pass without PyTorch, and
each class is what ``python -m minigrad.course mutants 2`` runs for its regions. A failure states
the contract the region breaks.
"""

import math

import numpy as np
import pytest

import minigrad as mg
from minigrad import nn, optim
from minigrad.autograd import Function, grad
from minigrad.autograd.gradcheck import gradcheck, gradgradcheck
from minigrad.errors import AutogradError, ShapeError
from minigrad.ops.op import Op
from minigrad.ops.reduce import sum_to


def t(values, grad=True):
    return mg.tensor(values, dtype=mg.float64, requires_grad=grad)


def backward_of(out, upstream):
    """Run backward from ``out`` with the upstream gradient ``upstream``."""
    out.backward(mg.tensor(upstream, dtype=out.dtype))


def same(got, want, what):
    assert got is not None, f"{what}: no gradient arrived"
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-12, err_msg=what)


# -- the backward rules, each against its formula ----------------------------------------------------
class TestBackwardRules:
    def test_relu_masks_the_gradient(self):
        x = t([-1.0, 2.0, -3.0, 4.0])
        backward_of(x.relu(), [1.0, 2.0, 3.0, 4.0])
        same(x.grad, [0, 2, 0, 4], "relu passes the gradient only where its input was positive")

    def test_product_rule(self):
        a, b = t([1.0, 2.0]), t([3.0, 5.0])
        backward_of(a * b, [1.0, 10.0])
        same(a.grad, [3, 50], "d(a*b)/da = b")
        same(b.grad, [1, 20], "d(a*b)/db = a")

    def test_quotient_rule(self):
        a, b = t([1.0, 6.0]), t([2.0, 3.0])
        backward_of(a / b, [1.0, 1.0])
        same(a.grad, [0.5, 1 / 3], "d(a/b)/da = 1/b")
        same(b.grad, [-0.25, -6 / 9], "d(a/b)/db = -a/b**2")

    def test_power_rule_and_exponential_base(self):
        a = t([2.0, 3.0])
        backward_of(a ** 3, [1.0, 1.0])
        same(a.grad, [12, 27], "d(a**3)/da = 3 a**2")
        x = t([1.0, 2.0])
        backward_of(2 ** x, [1.0, 1.0])
        same(x.grad, [2 * math.log(2), 4 * math.log(2)], "d(2**x)/dx = 2**x ln 2")

    def test_exp_and_log(self):
        x = t([0.0, 1.0])
        backward_of(x.exp(), [1.0, 2.0])
        same(x.grad, [1, 2 * math.e], "d exp(x)/dx = exp(x)")
        y = t([2.0, 4.0])
        backward_of(y.log(), [1.0, 1.0])
        same(y.grad, [0.5, 0.25], "d log(y)/dy = 1/y")

    def test_second_derivatives_of_tanh_and_sigmoid(self):
        x = t([0.3, -1.2])
        th = np.tanh([0.3, -1.2])
        (g,) = grad(x.tanh().sum(), [x], create_graph=True)
        (gg,) = grad(g.sum(), [x])
        same(gg, -2 * th * (1 - th ** 2), "d2 tanh/dx2 = -2 tanh (1 - tanh**2)")
        s = 1 / (1 + np.exp(-np.array([0.3, -1.2])))
        (g,) = grad(x.sigmoid().sum(), [x], create_graph=True)
        (gg,) = grad(g.sum(), [x])
        same(gg, s * (1 - s) * (1 - 2 * s), "d2 sigmoid/dx2 = s (1 - s) (1 - 2 s)")

    def test_maximum_and_where_route_to_the_chosen_input(self):
        a, b = t([1.0, 5.0]), t([3.0, 2.0])
        backward_of(mg.maximum(a, b), [10.0, 20.0])
        same(a.grad, [0, 20], "maximum's gradient goes to the larger input only")
        same(b.grad, [10, 0], "maximum's gradient goes to the larger input only")
        a, b = t([1.0, 2.0]), t([3.0, 4.0])
        backward_of(mg.where(mg.tensor([True, False]), a, b), [10.0, 20.0])
        same(a.grad, [10, 0], "where's gradient goes to the branch taken")
        same(b.grad, [0, 20], "where's gradient goes to the branch taken")

    def test_indexing_sums_over_repeated_indices(self):
        x = t([1.0, 2.0, 3.0])
        backward_of(x[mg.tensor([0, 0, 2])], [1.0, 2.0, 4.0])
        same(x.grad, [3, 0, 4], "an element read twice gets the sum of both gradients")

    def test_index_put_gives_no_gradient_to_overwritten_elements(self):
        x, v = t([1.0, 2.0, 3.0]), t(9.0)
        y = x * 1
        y[1] = v
        backward_of(y, [10.0, 20.0, 30.0])
        same(x.grad, [10, 0, 30], "an element overwritten by y[i] = v gets no gradient")
        same(v.grad, 20, "the written value gets the gradient of where it went")

    def test_matmul_transposes(self):
        rng = np.random.default_rng(0)
        a_np, b_np, g_np = rng.standard_normal((2, 3)), rng.standard_normal((3, 3)), rng.standard_normal((2, 3))
        a, b = t(a_np), t(b_np)
        backward_of(a @ b, g_np)
        same(a.grad, g_np @ b_np.T, "d(a@b)/da = g @ b.T")
        same(b.grad, a_np.T @ g_np, "d(a@b)/db = a.T @ g")
        sq = rng.standard_normal((3, 3))
        m, v = t(sq), t([1.0, 2.0, 3.0])
        backward_of(m @ v, [1.0, 0.0, -1.0])
        same(m.grad, np.outer([1.0, 0.0, -1.0], [1.0, 2.0, 3.0]), "d(m@v)/dm = outer(g, v)")
        same(v.grad, sq.T @ np.array([1.0, 0.0, -1.0]), "d(m@v)/dv = m.T @ g")
        batch, w = t(rng.standard_normal((2, 2, 3))), t(b_np)
        gb = rng.standard_normal((2, 2, 3))
        backward_of(batch @ w, gb)
        same(w.grad, sum(batch.detach().numpy()[i].T @ gb[i] for i in range(2)),
             "a right operand shared by the batch gets the sum over the batch")

    def test_linear_folds_the_batch_into_rows(self):
        rng = np.random.default_rng(1)
        x_np, w_np, b_np = rng.standard_normal((2, 5, 3)), rng.standard_normal((4, 3)), rng.standard_normal(4)
        g_np = rng.standard_normal((2, 5, 4))
        x, w, b = t(x_np), t(w_np), t(b_np)
        backward_of(nn.functional.linear(x, w, b), g_np)
        same(x.grad, g_np @ w_np, "d(x @ w.T + b)/dx = g @ w (forward used w transposed, so backward does not)")
        same(w.grad, g_np.reshape(-1, 4).T @ x_np.reshape(-1, 3),
             "d(x @ w.T + b)/dw = g.T @ x, summed over every row of the batch")
        same(b.grad, g_np.reshape(-1, 4).sum(0), "the bias's gradient is g summed (not averaged) over the batch")

    def test_reshape_broadcast_permute_cat(self):
        x = t(np.arange(6.0).reshape(2, 3))
        g = np.arange(6.0).reshape(3, 2) * 10
        backward_of(x.reshape(3, 2), g)
        same(x.grad, g.reshape(2, 3), "reshape's gradient is reshaped back")
        col = t([[1.0], [2.0], [3.0]])
        g = np.arange(12.0).reshape(3, 4)
        backward_of(col.broadcast_to((3, 4)), g)
        same(col.grad, g.sum(1, keepdims=True), "a broadcast's gradient sums over the broadcast axes")
        row = t([[1.0, 2.0, 3.0, 4.0]])
        backward_of(row.broadcast_to((3, 4)), g)
        same(row.grad, g.sum(0, keepdims=True), "a broadcast's gradient sums over the broadcast axes")
        p = t(np.arange(24.0).reshape(2, 3, 4))
        g = np.arange(24.0).reshape(3, 4, 2)
        backward_of(p.permute(1, 2, 0), g)
        same(p.grad, g.transpose(2, 0, 1), "permute's gradient is permuted by the inverse permutation")
        a, b = t([1.0, 2.0]), t([3.0, 4.0, 5.0])
        backward_of(mg.cat([a, b]), [10.0, 20.0, 30.0, 40.0, 50.0])
        same(a.grad, [10, 20], "cat's gradient is sliced at each input's offset")
        same(b.grad, [30, 40, 50], "cat's gradient is sliced at each input's offset")

    def test_reductions(self):
        x = t(np.arange(9.0).reshape(3, 3))
        backward_of(x.sum(dim=1), [1.0, 2.0, 3.0])
        same(x.grad, [[1, 1, 1], [2, 2, 2], [3, 3, 3]], "sum(dim=1)'s gradient spreads each row's g along the row")
        y = t(np.arange(6.0).reshape(2, 3))
        y.mean().backward()
        same(y.grad, np.full((2, 3), 1 / 6), "mean's gradient is 1/n")
        m = t([[1.0, 5.0, 2.0], [7.0, 0.0, 3.0], [4.0, 6.0, 9.0]])
        backward_of(m.max(dim=1).values, [1.0, 2.0, 3.0])
        same(m.grad, [[0, 1, 0], [2, 0, 0], [0, 0, 3]], "max(dim)'s gradient goes to the maximum of each row")
        v = t([1.0, 2.0, 3.0, 5.0])
        v.var().backward()
        same(v.grad, 2 * (v.detach().numpy() - 2.75) / 3, "var's gradient is 2 (x - mean) / (n - 1)")
        s = t([[0.0, 1.0, 2.0], [3.0, 3.0, 3.0]])
        backward_of(s.logsumexp(dim=1), [1.0, 2.0])
        e = np.exp(s.detach().numpy())
        same(s.grad, e / e.sum(1, keepdims=True) * [[1.0], [2.0]], "logsumexp's gradient is softmax")

    def test_sum_to_undoes_broadcasting(self):
        g = mg.tensor(np.arange(24.0).reshape(2, 3, 4))
        same(sum_to(g, (3, 1)), np.arange(24.0).reshape(2, 3, 4).sum((0, 2))[:, None], "sum_to (3, 1)")
        same(sum_to(g, (4,)), np.arange(24.0).reshape(2, 3, 4).sum((0, 1)), "sum_to aligns the shapes on the right")
        with pytest.raises(ShapeError, match="cannot sum"):
            sum_to(mg.ones(2, 3), (2,))
            pytest.fail("sum_to must refuse a shape the tensor was not broadcast from")

    def test_softmax_and_log_softmax(self):
        x = t([[0.5, 1.0, -1.0]])
        g = np.array([[1.0, 2.0, 4.0]])
        y = np.exp(x.detach().numpy()) / np.exp(x.detach().numpy()).sum()
        backward_of(x.softmax(dim=1), g)
        same(x.grad, y * (g - (g * y).sum()), "softmax's vector-Jacobian product is y (g - sum(g y))")
        z = t([[0.5, 1.0, -1.0]])
        backward_of(z.log_softmax(dim=1), g)
        same(z.grad, g - y * g.sum(), "log_softmax's vector-Jacobian product is g - softmax * sum(g)")

    def test_cross_entropy_gradient_is_softmax_minus_one_hot(self):
        logits = t([[1.0, 2.0, 0.5], [0.0, -1.0, 3.0]])
        nn.functional.cross_entropy(logits, mg.tensor([1, 2])).backward()
        e = np.exp(logits.detach().numpy())
        want = (e / e.sum(1, keepdims=True) - np.eye(3)[[1, 2]]) / 2
        same(logits.grad, want, "cross-entropy's gradient is (softmax - one_hot) / N")


# -- each rule under both bindings of ctx.ops -------------------------------------------------------
def _rand(*shape, seed=0, low=-2.0, high=2.0):
    return t(np.random.default_rng(seed + len(shape)).uniform(low, high, shape))


_IDX = mg.tensor([0, 2, 0])
# (region, function, inputs): every chapter-02 rule, run by an op that reaches it
BINDING_ROWS = [
    ("Relu.backward", lambda x: x.relu(), lambda: [t([-1.5, 0.7, 2.0, -0.3])]),
    ("Mul.backward", lambda a, b: a * b, lambda: [_rand(3, 4), _rand(4, seed=1)]),
    ("Div.backward", lambda a, b: a / b, lambda: [_rand(3, 4), _rand(3, 4, seed=2, low=0.5)]),
    ("Pow.backward", lambda a, b: a ** b + 2 ** b, lambda: [_rand(3, seed=3, low=0.5), _rand(3, seed=4)]),
    ("Exp.backward", lambda x: x.exp(), lambda: [_rand(2, 3)]),
    ("Log.backward", lambda x: x.log(), lambda: [_rand(2, 3, low=0.5)]),
    ("TanhBackward.backward", lambda x: x.tanh(), lambda: [_rand(2, 3)]),
    ("SigmoidBackward.backward", lambda x: x.sigmoid(), lambda: [_rand(2, 3)]),
    ("Maximum.backward", lambda a, b: mg.maximum(a, b) + mg.minimum(a, b) * 2,
     lambda: [t([1.0, 5.0, -2.0]), t([3.0, 2.0, -1.0])]),
    ("Where.backward", lambda a, b: mg.where(mg.tensor([True, False, True]), a, b), lambda: [_rand(3), _rand(2, 3, seed=5)]),
    ("GetItem.backward", lambda x: x[_IDX] * x[_IDX], lambda: [_rand(4)]),
    ("ScatterIndex.backward", lambda x: x[_IDX] * x[_IDX], lambda: [_rand(4)]),
    ("IndexPut.backward", lambda x, v: mg.ops.index_put(x, mg.tensor([1]), v) ** 2, lambda: [_rand(3), _rand(1, seed=6)]),
    ("Matmul.backward", lambda a, b, v: (a @ b) @ v + (v @ b.mT) @ a.mT + (a @ b).sum() * (v @ v),
     lambda: [_rand(2, 3, 3), _rand(3, 3, seed=7), _rand(3, seed=8)]),
    ("Linear.backward", lambda x, w, b: mg.nn.functional.linear(x, w, b) ** 2,
     lambda: [_rand(2, 2, 3), _rand(4, 3, seed=9), _rand(4, seed=10)]),
    ("Reshape.backward", lambda x: x.reshape(3, 2) ** 2, lambda: [_rand(2, 3)]),
    ("BroadcastTo.backward", lambda x: x.broadcast_to((3, 4)) ** 2, lambda: [_rand(3, 1)]),
    ("Permute.backward (transpose)", lambda x: x.permute(1, 2, 0) ** 2, lambda: [_rand(2, 3, 2)]),
    ("Cat.backward", lambda a, b: mg.cat([a, b], 1) ** 2, lambda: [_rand(2, 2), _rand(2, 3, seed=11)]),
    ("Sum.backward", lambda x: x.sum(dim=1) ** 2, lambda: [_rand(3, 4)]),
    ("Mean.backward", lambda x: x.mean(dim=0) ** 2, lambda: [_rand(3, 4)]),
    ("undoing broadcasting", lambda a, b: (a + b) ** 2, lambda: [_rand(3, 1), _rand(2, 1, 4, seed=12)]),
    ("undoing broadcasting: the sum", lambda a, b: (a * b) ** 2, lambda: [_rand(3, 1), _rand(4, seed=13)]),
    ("MaxDim.backward", lambda x: x.max(dim=1).values ** 2, lambda: [t([[1.0, 5.0, 2.0], [7.0, 0.0, 3.0]])]),
    ("Var.backward", lambda x: x.var(dim=1), lambda: [_rand(2, 4)]),
    ("Logsumexp.backward", lambda x: x.logsumexp(dim=1), lambda: [_rand(2, 3)]),
    ("Softmax.backward", lambda x: x.softmax(dim=1), lambda: [_rand(2, 3)]),
    ("LogSoftmax.backward", lambda x: x.log_softmax(dim=1), lambda: [_rand(2, 3)]),
    ("Pick.backward (cross-entropy's gather)", lambda x: nn.functional.cross_entropy(x, mg.tensor([1, 2])),
     lambda: [_rand(2, 3)]),
    ("Place.backward", lambda x: nn.functional.cross_entropy(x, mg.tensor([1, 2])), lambda: [_rand(2, 3)]),
]


def _under(binding, region, check, fn, xs):
    """Run a check, naming the binding and the rule when it fails or raises."""
    try:
        ok = check(fn, xs, raise_exception=False)
    except Exception as e:  # a rule that only works under one binding raises there (an array has no
        # .unsqueeze, a Tensor is no numpy array): say which
        pytest.fail(f"{region}: the rule fails under the {binding}: {type(e).__name__}: {e}. A rule is "
                    "written once against ctx.ops (operators and ctx.ops functions), which are arrays "
                    "when nobody records the backward pass and Tensors when it is recorded")
    assert ok, f"{region}: wrong gradient under the {binding}"


class TestBothBindings:
    """Each rule is checked as the engine runs it: gradcheck's backward is not recorded (ctx.ops
    is the array module), gradgradcheck records the first backward (ctx.ops is minigrad's ops)."""

    @pytest.mark.parametrize("region,fn,inputs", BINDING_ROWS, ids=[r[0] for r in BINDING_ROWS])
    def test_gradcheck_on_arrays_and_gradgradcheck_on_tensors(self, region, fn, inputs):
        _under("array binding (gradcheck)", region, gradcheck, fn, inputs())
        _under("Tensor binding (gradgradcheck)", region, gradgradcheck, fn, inputs())

    def test_a_rule_that_reads_tensors_only_is_named_with_its_binding(self):
        class TensorsOnly(Op):
            onnx_refused = "a test probe"

            @staticmethod
            def forward(ctx, a):
                ctx.save_for_backward(a)
                return a * a

            @staticmethod
            def backward(ctx, g):
                (a,) = ctx.saved_tensors
                return g * 2 * a.detach()  # .detach() is a Tensor method: no array has it

        with pytest.raises(pytest.fail.Exception, match="under the array binding"):
            _under("array binding (gradcheck)", "TensorsOnly.backward", gradcheck, TensorsOnly.apply, [t([1.0, 2.0])])


class TestEngine:
    def test_a_gradient_is_summed_over_every_consumer(self):
        x = t(2.0)
        ((x * 3) + (x * x)).backward()  # d/dx = 3 + 2x
        assert x.grad is not None, "the engine must reach every leaf that requires grad"
        assert x.grad.item() == 7.0, (
            f"a node's gradient must be summed over its consumers: d(3x + x*x)/dx at 2 is 7, got {x.grad.item()}")
        a = t(3.0)
        h = a * 2
        (h * h * h).backward()  # 8 a**3: 24 a**2
        assert a.grad.item() == 216.0, (
            f"a node must run only after all its consumers have added their gradients: want 216, got {a.grad.item()}")

    def test_pre_hooks_can_replace_a_nodes_gradient(self):
        x = t([1.0, 2.0])
        y = x * 2
        y.grad_fn.register_prehook(lambda grads: tuple(g * 10 for g in grads))
        y.sum().backward()
        same(x.grad, [20, 20], "a node's pre-hook may return new gradients, which the node then uses")

    def test_the_graph_is_freed_unless_retained(self):
        x = t([1.0, 2.0])
        y = (x * x).sum()
        y.backward(retain_graph=True)
        y.backward()
        same(x.grad, [4, 8], "retain_graph=True keeps the saved tensors for a second backward")
        with pytest.raises(AutogradError, match="second time"):
            y.backward()
            pytest.fail("a backward without retain_graph=True frees the saved tensors: a second one must raise")

    def test_grad_accumulates_out_of_place(self):
        x = t([1.0, 2.0])
        (x * 3).sum().backward()
        first = x.grad
        (x * 3).sum().backward()
        same(x.grad, [6, 6], ".grad accumulates over backward calls")
        same(first, [3, 3], "accumulating must not change a .grad tensor kept from an earlier backward")

    def test_two_leaves_never_share_a_gradient(self):
        a, b = t([1.0, 2.0]), t([3.0, 4.0])
        (a + b).sum().backward()
        a.grad.zero_()
        same(b.grad, [1, 1], "a leaf's .grad must be its own tensor, not one another leaf also holds")


class TestGradcheck:
    def test_central_differences_of_a_cube(self):
        from minigrad.autograd.gradcheck import _numerical_jacobian

        x = t([1.0, 2.0])
        before = x.detach().numpy().copy()
        eps = 1e-3
        jac = _numerical_jacobian(lambda a: a ** 3, (x,), [0], (x ** 3,), eps)
        # ((x + e)**3 - (x - e)**3) / 2e = 3 x**2 + e**2, exactly
        np.testing.assert_allclose(jac[0, 0], np.diag(3 * before ** 2 + eps ** 2), rtol=1e-9, atol=1e-9,
                                   err_msg="the numerical Jacobian is (f(x + eps) - f(x - eps)) / (2 eps)")
        np.testing.assert_array_equal(x.detach().numpy(), before, err_msg="the inputs must be left as they were")

    def test_a_cross_term_is_measured_at_the_point(self):
        from minigrad.autograd.gradcheck import _numerical_jacobian

        x = t([1.0, 2.0])
        jac = _numerical_jacobian(lambda a: (a[0] * a[1]).reshape(1), (x,), [0], ((x[0] * x[1]).reshape(1),), 1e-3)
        np.testing.assert_allclose(jac[0, 0][:, 0], [2.0, 1.0], rtol=1e-9,
                                   err_msg="each column is measured with every other input at its own value")

    def test_gradcheck_passes_a_right_rule_and_catches_a_wrong_one(self):
        def square(factor):
            class Square(Function):
                @staticmethod
                def forward(ctx, a):
                    ctx.save_for_backward(a)
                    return a * a

                @staticmethod
                def backward(ctx, g):
                    (a,) = ctx.saved_tensors
                    return g * a * factor

            return Square.apply

        assert gradcheck(square(2.0), (t([0.5, -1.5]),)), "d(a*a)/da = 2a must pass gradcheck"
        assert gradcheck(square(1.0), (t([0.5, -1.5]),), raise_exception=False) is False, (
            "a backward that gives a instead of 2a must fail gradcheck")


class TestModule:
    def test_parameters_and_children_are_registered_in_order(self):
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.scale = nn.Parameter(mg.ones(2))
                self.body = nn.Linear(2, 3)
                self.plain = mg.zeros(2)

        net = Net()
        names = [name for name, _ in net.named_parameters()]
        assert names == ["scale", "body.weight", "body.bias"], (
            f"assigning a Parameter or a Module as an attribute registers it, in order; got {names}")
        assert list(net.state_dict()) == names
        net.scale = nn.Parameter(mg.zeros(2))
        assert [name for name, _ in net.named_parameters()] == names, "a replaced parameter keeps its place"
        with pytest.raises(TypeError, match="parameter 'scale'"):
            net.scale = mg.ones(2)


# -- the optimizers, step by step against the formulas ------------------------------------------
def steps(opt_cls, grads, p0=1.0, **kw):
    """The parameter after each step of ``opt_cls`` given these gradients."""
    p = nn.Parameter(mg.tensor([p0], dtype=mg.float64))
    opt = opt_cls([p], **kw)
    out = []
    for g in grads:
        p.grad = mg.tensor([g], dtype=mg.float64)
        opt.step()
        out.append(p.item())
    return out


class TestSGD:
    def test_momentum_sums_the_past_gradients(self):
        # buf_1 = g, buf_t = 0.9 buf + g: 1, 1.9, 2.71; p = 1 - 0.1 * (1 + 1.9 + 2.71)
        got = steps(optim.SGD, [1.0, 1.0, 1.0], lr=0.1, momentum=0.9)
        np.testing.assert_allclose(got, [0.9, 0.71, 0.439], rtol=1e-12,
                                   err_msg="SGD momentum: buf = momentum * buf + g (no 1 - momentum), p -= lr * buf")

    def test_nesterov_looks_ahead(self):
        # update = g + 0.9 buf: 1.9, 2.71, 3.439
        got = steps(optim.SGD, [1.0, 1.0, 1.0], lr=0.1, momentum=0.9, nesterov=True)
        np.testing.assert_allclose(got, [1 - 0.19, 1 - 0.19 - 0.271, 1 - 0.19 - 0.271 - 0.3439], rtol=1e-12,
                                   err_msg="nesterov=True steps by g + momentum * buf")

    def test_weight_decay_adds_wd_times_p(self):
        got = steps(optim.SGD, [0.0], p0=2.0, lr=0.1, weight_decay=0.5)
        np.testing.assert_allclose(got, [2.0 - 0.1 * 0.5 * 2.0], rtol=1e-12, err_msg="weight decay: g + wd * p")


class TestAdam:
    def test_first_step_is_lr_times_the_sign(self):
        # bias correction makes m_hat = g and v_hat = g**2 at step 1: p -= lr * g / (|g| + eps)
        got = steps(optim.Adam, [0.5], lr=0.1, eps=1e-8)
        np.testing.assert_allclose(got, [1 - 0.1 * 0.5 / (0.5 + 1e-8)], rtol=1e-12,
                                   err_msg="Adam's first step is lr * g / (|g| + eps): bias-corrected moments")

    def test_three_steps_by_the_formulas(self):
        b1, b2, lr, eps = 0.9, 0.999, 0.1, 0.1
        gs = [0.5, -0.2, 0.3]
        p, m, v, want = 1.0, 0.0, 0.0, []
        for k, g in enumerate(gs, 1):
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
            p -= lr * (m / (1 - b1 ** k)) / (math.sqrt(v / (1 - b2 ** k)) + eps)
            want.append(p)
        got = steps(optim.Adam, gs, lr=lr, betas=(b1, b2), eps=eps)
        np.testing.assert_allclose(got, want, rtol=1e-12, err_msg=(
            "Adam: m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g**2, p -= lr m_hat / (sqrt(v_hat) + eps) with "
            "m_hat = m / (1 - b1**t), v_hat = v / (1 - b2**t); eps outside the square root"))

    def test_adamw_decays_by_lr_times_wd(self):
        got = steps(optim.AdamW, [0.0], p0=2.0, lr=0.1, weight_decay=0.5, eps=1e-8)
        np.testing.assert_allclose(got, [2.0 * (1 - 0.1 * 0.5)], rtol=1e-12,
                                   err_msg="AdamW multiplies p by 1 - lr * weight_decay before its step")
