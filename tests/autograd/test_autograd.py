"""Autograd semantics, as PyTorch defines them: accumulation, freed graphs, saved-tensor versions,
hooks, grad modes, higher-order gradients, custom Functions and the graph as data (chapter 02)."""

from __future__ import annotations

import numpy as np
import pytest

import minigrad
from helpers import shares_memory
from minigrad.autograd import Function, consumers, topological_order
from minigrad.autograd import function as F
from minigrad.autograd.mode import Mode
from minigrad.errors import AutogradError, DTypeError


def leaf(values, dtype=None) -> minigrad.Tensor:
    return minigrad.tensor(values, dtype=dtype, requires_grad=True)


def close(t: minigrad.Tensor, expected, **kw) -> None:
    np.testing.assert_allclose(t.detach().numpy(), expected, rtol=kw.get("rtol", 1e-6), atol=kw.get("atol", 1e-6))


# -- backward and accumulation ---------------------------------------------------------------------
def test_polynomial_gradient_is_2x_plus_3():
    x = minigrad.randn(3, requires_grad=True)
    (x ** 2 + 3 * x + 1).sum().backward()
    close(x.grad, 2 * x.detach().numpy() + 3)


def test_grad_accumulates_across_backward_calls():
    x = leaf([1.0, 2.0])
    (x * 3).sum().backward()
    (x * 3).sum().backward()
    close(x.grad, [6.0, 6.0])


def test_tensor_used_twice_gets_both_contributions():
    x = leaf([1.0, -2.0])
    (x * x).sum().backward()
    close(x.grad, [2.0, -4.0])
    y = leaf([0.5])
    a = y * 2
    (a + a * y).sum().backward()  # d/dy (2y + 2y^2) = 2 + 4y
    close(y.grad, [4.0])


def test_second_backward_through_freed_graph_raises():
    x = leaf([1.0, 2.0])
    y = (x.exp() * x).sum()
    y.backward()
    with pytest.raises(AutogradError, match="retain_graph"):
        y.backward()


def test_retain_graph_allows_a_second_backward():
    x = leaf([1.0, 2.0])
    y = (x.exp() * x).sum()
    y.backward(retain_graph=True)
    first = x.grad.numpy().copy()
    y.backward()
    close(x.grad, 2 * first)


def test_autograd_error_is_a_runtime_error():
    assert issubclass(AutogradError, RuntimeError)


def test_modifying_a_saved_tensor_in_place_names_the_op():
    x = leaf([0.1, 0.2, 0.3])
    a = x * 2
    b = a.sin()  # Sin saves a
    a.add_(1)
    with pytest.raises(AutogradError, match="Sin"):
        b.sum().backward()


def test_modifying_a_saved_output_in_place_names_the_op():
    x = leaf([0.1, 0.2])
    y = x.exp()  # Exp saves its output
    y.mul_(2)
    with pytest.raises(AutogradError, match="Exp"):
        y.sum().backward()


class _KeepsByPosition(Function):
    """An array-forward op that saves one of each kind by position: its output, a tensor input, a
    Python number, a raw array argument and an empty slot."""

    array_forward = True
    tensor_backward = False

    @staticmethod
    def forward(ctx, a, k, m):
        ctx.save_positions(F.OUTPUT, 0, 1, 2, None)
        return a * k + m

    @staticmethod
    def backward(ctx, g):
        y, a, k, m, nothing = ctx.saved_tensors
        return g * k, None, None


@pytest.mark.parametrize("watched", [False, True], ids=["no mode", "a mode on the stack"])
def test_saved_positions_are_packed_by_kind(watched):
    # with no mode on the stack apply packs positions itself; with one, _pack_saved does and tells
    # the mode of kept arrays: both must give the same entries, which the rule reads back in order
    x, m = leaf([1.0, 2.0]), np.array([0.5, 0.25], dtype=np.float32)
    if watched:
        with Mode():
            y = _KeepsByPosition.apply(x, 3.0, m)
    else:
        y = _KeepsByPosition.apply(x, 3.0, m)
    entries = list(F.saved_entries(y.grad_fn))
    assert [kind for kind, _ in entries] == [F.SAVED_OUTPUT, F.SAVED_TENSOR, F.SAVED_VALUE, F.SAVED_ARRAY, F.SAVED_VALUE]
    assert entries[0][1][0] is y.array and entries[0][1][2]() is y
    assert entries[1][1] is x and entries[2][1] == 3.0 and entries[3][1] is m and entries[4][1] is None
    y.sum().backward()
    close(x.grad, [3.0, 3.0])


def test_built_in_nodes_keep_their_fields_in_slots():
    # a per-node __dict__ costs more than all the slot writes of an op: recording and walking the
    # graph of the common elementwise ops must not make one (an op's own ctx fields still may)
    x, w = leaf([0.5, -1.0]), leaf([2.0, 3.0])
    y = ((x * w + 0.5).tanh() * 1.5).sigmoid().exp() - 1.0
    nodes = topological_order([y.grad_fn])
    assert all(not vars(n) for n in nodes)
    y.sum().backward(retain_graph=True)
    y.sum().backward()
    assert all(not vars(n) for n in nodes)


def test_views_share_the_version_counter():
    base = minigrad.zeros(2, 3)
    views = [base.view(6), base.reshape(3, 2), base.transpose(0, 1), base[0], base.detach()]
    start = base._version
    views[0].add_(1)
    assert base._version == start + 1
    assert all(v._version == base._version for v in views)
    base.mul_(2)
    assert all(v._version == start + 2 for v in views)
    close(views[2], np.full((3, 2), 2.0))


def test_in_place_on_a_view_is_seen_by_the_saved_tensor_check():
    x = leaf([1.0, 2.0, 3.0])
    a = x * 1
    b = a * a
    with minigrad.no_grad():
        a[1:].add_(1.0)  # a view of a saved tensor; bumps a's version
    with pytest.raises(AutogradError, match="Mul"):
        b.sum().backward()


# -- hooks and retain_grad ----------------------------------------------------------------------
def test_leaf_hook_sees_and_can_replace_the_gradient():
    x = leaf([1.0, 2.0])
    seen = []
    x.register_hook(lambda g: seen.append(g.numpy().copy()))
    x.register_hook(lambda g: g * 10)
    (x * 3).sum().backward()
    close(minigrad.tensor(seen[0]), [3.0, 3.0])
    close(x.grad, [30.0, 30.0])


def test_non_leaf_hook_replaces_the_gradient_flowing_on():
    x = leaf([1.0, 2.0])
    y = x * 3
    seen = []
    y.register_hook(lambda g: seen.append(g.numpy().copy()))
    y.register_hook(lambda g: g * 0)
    (y * y).sum().backward()
    close(minigrad.tensor(seen[0]), 2 * 3 * np.array([1.0, 2.0]))
    close(x.grad, [0.0, 0.0])


def test_hook_handle_removes_the_hook():
    x = leaf([1.0])
    y = x * 2
    calls = []
    handle_leaf = x.register_hook(lambda g: calls.append("leaf"))
    handle_mid = y.register_hook(lambda g: calls.append("mid"))
    handle_leaf.remove()
    handle_mid.remove()
    y.sum().backward()
    assert calls == []
    close(x.grad, [2.0])


def test_retain_grad_keeps_a_non_leaf_gradient():
    x = leaf([1.0, 2.0])
    y = x * 2
    z = x * 3
    y.retain_grad()
    (y * y + z).sum().backward()
    close(y.grad, [4.0, 8.0])
    assert z.grad is None  # not retained
    assert x.grad is not None


# -- grad modes ---------------------------------------------------------------------------------
def test_no_grad_and_enable_grad_as_context_managers():
    x = leaf([1.0])
    with minigrad.no_grad():
        assert not minigrad.is_grad_enabled()
        assert not (x * 2).requires_grad
        with minigrad.enable_grad():
            assert (x * 2).requires_grad
        assert not (x * 2).requires_grad
    assert minigrad.is_grad_enabled()
    assert (x * 2).requires_grad


def test_grad_modes_as_decorators():
    x = leaf([1.0])

    @minigrad.no_grad()
    def frozen(t):
        return t * 2

    @minigrad.enable_grad()
    def tracked(t):
        return t * 2

    @minigrad.set_grad_enabled(False)
    def also_frozen(t):
        return t * 2

    assert not frozen(x).requires_grad
    assert not also_frozen(x).requires_grad
    assert minigrad.is_grad_enabled()  # the decorator did not switch the mode for the caller
    with minigrad.no_grad():
        assert tracked(x).requires_grad


def test_set_grad_enabled_as_context_manager_and_plain_call():
    x = leaf([1.0])
    with minigrad.set_grad_enabled(False):
        assert not (x * 2).requires_grad
    assert (x * 2).requires_grad
    minigrad.set_grad_enabled(False)
    try:
        assert not (x * 2).requires_grad
    finally:
        minigrad.set_grad_enabled(True)
    assert (x * 2).requires_grad


def test_grad_mode_is_restored_after_an_exception():
    with pytest.raises(ValueError):
        with minigrad.no_grad():
            raise ValueError("boom")
    assert minigrad.is_grad_enabled()


# -- deep graphs and higher order ---------------------------------------------------------------
def test_a_chain_of_100000_ops_backpropagates():
    x = leaf([0.0])
    y = x
    for _ in range(100_000):
        y = y + 1.0
    y.backward()
    close(y, [100_000.0])
    close(x.grad, [1.0])


def test_grad_with_create_graph_gives_the_exact_second_derivative():
    x = leaf([0.5, -1.0, 2.0], dtype=minigrad.float64)
    (g,) = minigrad.grad((x ** 3).sum(), x, create_graph=True)
    assert g.requires_grad
    (h,) = minigrad.grad(g.sum(), x)
    np.testing.assert_array_equal(h.numpy(), 6 * np.array([0.5, -1.0, 2.0]))


def test_grad_does_not_touch_dot_grad():
    x = leaf([1.0, 2.0])
    (g,) = minigrad.grad((x * x).sum(), x)
    close(g, [2.0, 4.0])
    assert x.grad is None


def test_allow_unused():
    x, z = leaf([1.0]), leaf([2.0])
    y = (x * 2).sum()
    with pytest.raises(AutogradError):
        minigrad.grad(y, [x, z], retain_graph=True)
    gx, gz = minigrad.grad(y, [x, z], allow_unused=True)
    close(gx, [2.0])
    assert gz is None


def test_grad_accepts_only_inputs_in_torchs_position():
    x, z = leaf([1.0]), leaf([2.0])
    gx, gz = minigrad.autograd.grad((x * 3).sum(), [x, z], None, None, False, True, True)  # only_inputs, allow_unused
    close(gx, [3.0])
    assert gz is None


def test_variable_is_a_tensor_sharing_memory():
    x = minigrad.ones(3)
    v = minigrad.autograd.Variable(x, requires_grad=True)
    assert isinstance(v, minigrad.Tensor) and isinstance(v, minigrad.autograd.Variable)
    assert v is not x and v.requires_grad and not x.requires_grad and shares_memory(v, x)
    y = minigrad.autograd.Variable(x * 2)  # as in torch: cut from the graph, no grad unless asked
    assert not y.requires_grad and y.grad_fn is None
    assert not isinstance(np.ones(3), minigrad.autograd.Variable)
    with pytest.raises(TypeError, match="must be a Tensor, got list"):
        minigrad.autograd.Variable([1.0])


def test_backward_inputs_restricts_accumulation():
    a, b = leaf([2.0]), leaf([3.0])
    (a * b).sum().backward(inputs=[a])
    close(a.grad, [3.0])
    assert b.grad is None


def test_detach_cuts_the_graph_and_shares_memory():
    x = leaf([1.0, 2.0])
    d = x.detach()
    assert not d.requires_grad and d.grad_fn is None
    assert shares_memory(d, x)
    (x * d).sum().backward()
    close(x.grad, [1.0, 2.0])  # d is a constant: the gradient is d, not 2x


# -- dtypes and requires_grad ---------------------------------------------------------------------
def test_integer_tensors_cannot_require_grad():
    with pytest.raises(DTypeError):
        minigrad.tensor([1, 2]).requires_grad_()
    with pytest.raises(DTypeError):
        minigrad.tensor([1, 2], requires_grad=True)
    assert issubclass(DTypeError, TypeError)


def test_integer_and_bool_results_never_require_grad():
    x = leaf([1.5, -2.0, 3.0])
    for result in (x > 0, x == x, x.argmax(), x.long(), x.max(dim=0)[1]):
        assert result.dtype.kind in "iub"
        assert not result.requires_grad and result.grad_fn is None


def test_sgd_step_under_no_grad_updates_the_leaf_in_place():
    p = leaf([1.0, 2.0])
    (p * p).sum().backward()
    ident, version = id(p), p._version
    with minigrad.no_grad():
        p -= 0.1 * p.grad
    assert id(p) == ident and p.is_leaf and p.requires_grad
    assert p._version == version + 1
    close(p, [0.8, 1.6])
    p.grad = None
    (p * 3).sum().backward()
    close(p.grad, [3.0, 3.0])


def test_in_place_on_a_leaf_that_requires_grad_raises_outside_no_grad():
    p = leaf([1.0])
    with pytest.raises(AutogradError, match="leaf"):
        p.add_(1.0)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_python_scalars_do_not_promote(dtype):
    x = minigrad.ones(3, dtype=dtype)
    for y in (x * 2.5, 2.5 * x, x + 1, x / 3, 1 - x, x ** 2.0, 2.0 ** x, -x):
        assert y.dtype == minigrad.tensor(0.0, dtype=dtype).dtype


def test_pow_with_a_tensor_exponent_broadcasts():
    base = leaf([[1.0], [2.0], [3.0]])
    exponent = leaf([1.0, 2.0])
    y = base.pow(exponent)
    assert y.shape == (3, 2)
    y.sum().backward()
    b, e = np.array([[1.0], [2.0], [3.0]]), np.array([1.0, 2.0])
    close(base.grad, (e * b ** (e - 1)).sum(1, keepdims=True), rtol=1e-5)
    close(exponent.grad, (b ** e * np.log(b)).sum(0), rtol=1e-5)


def test_randn_of_empty_shape_is_0d():
    x = minigrad.randn(())
    assert x.shape == () and x.ndim == 0


# -- user-defined Functions ----------------------------------------------------------------------
class Cube(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 3 * x * x


class ScaleBy(Function):
    """Two inputs, one maybe without grad: records what ctx.needs_input_grad said."""

    seen: list = []

    @staticmethod
    def forward(ctx, x, s):
        ctx.save_for_backward(x, s)
        ScaleBy.seen.append(ctx.needs_input_grad)
        return x * s

    @staticmethod
    def backward(ctx, g):
        x, s = ctx.saved_tensors
        return (g * s if ctx.needs_input_grad[0] else None), (g * x if ctx.needs_input_grad[1] else None)


class SplitSign(Function):
    """Two outputs: the positive and the negative part."""

    @staticmethod
    def forward(ctx, x):
        mask = x > 0
        ctx.save_for_backward(mask)
        return minigrad.ops.where(mask, x, 0.0), minigrad.ops.where(mask, 0.0, x)

    @staticmethod
    def backward(ctx, g_pos, g_neg):
        (mask,) = ctx.saved_tensors
        return minigrad.ops.where(mask, g_pos, g_neg)


def test_custom_function_forward_and_backward():
    x = leaf([1.0, -2.0])
    y = Cube.apply(x)
    close(y, [1.0, -8.0])
    assert type(y.grad_fn) is Cube
    y.sum().backward()
    close(x.grad, [3.0, 12.0])


def test_custom_function_needs_input_grad():
    ScaleBy.seen.clear()
    x, s = leaf([1.0, 2.0]), minigrad.tensor([3.0, 4.0])
    ScaleBy.apply(x, s).sum().backward()
    assert ScaleBy.seen == [(True, False)]
    close(x.grad, [3.0, 4.0])
    assert s.grad is None


def test_custom_function_with_two_outputs():
    x = leaf([1.0, -2.0, 3.0])
    pos, neg = SplitSign.apply(x)
    close(pos, [1.0, 0.0, 3.0])
    close(neg, [0.0, -2.0, 0.0])
    assert pos.grad_fn is neg.grad_fn
    (2 * pos + 5 * neg).sum().backward()
    close(x.grad, [2.0, 5.0, 2.0])
    x.grad = None
    pos, _ = SplitSign.apply(x)
    pos.sum().backward()  # the unused output's gradient arrives as zeros
    close(x.grad, [1.0, 0.0, 1.0])


def test_create_graph_through_a_custom_function():
    x = leaf([0.5, 2.0], dtype=minigrad.float64)
    (g,) = minigrad.grad(Cube.apply(x).sum(), x, create_graph=True)
    close(g, 3 * np.array([0.5, 2.0]) ** 2)
    (h,) = minigrad.grad(g.sum(), x)
    close(h, 6 * np.array([0.5, 2.0]))


def test_custom_function_saved_tensor_version_check():
    x = leaf([1.0, 2.0])
    a = x * 1
    y = Cube.apply(a)
    with minigrad.no_grad():
        a.add_(1.0)
    with pytest.raises(AutogradError, match="Cube"):
        y.sum().backward()


# -- the graph as data ---------------------------------------------------------------------------
def test_next_functions_are_the_in_edges():
    x = leaf([1.0, 2.0])
    c = minigrad.tensor([3.0, 4.0])
    y = x * c
    (x_edge, c_edge) = y.grad_fn.next_functions
    node, nr = x_edge
    assert node.name() == "AccumulateGrad" and node.variable is x and nr == 0
    assert c_edge is None or c_edge[0] is None
    z = y.exp()
    assert z.grad_fn.next_functions[0][0] is y.grad_fn


def test_topological_order_puts_consumers_before_producers():
    x = leaf([1.0, 2.0])
    a = x * 2
    b = a.exp()
    c = a.sin()
    y = (b + c).sum()
    order = topological_order([y.grad_fn])
    pos = {node: i for i, node in enumerate(order)}
    assert order[0] is y.grad_fn
    for node in order:
        for edge in node.next_functions:
            if edge is not None and edge[0] is not None:
                assert pos[node] < pos[edge[0]], f"{node} must come before its input {edge[0]}"
    assert pos[b.grad_fn] < pos[a.grad_fn] and pos[c.grad_fn] < pos[a.grad_fn]


def test_consumers_are_the_out_edges():
    x = leaf([1.0, 2.0])
    a = x * 2
    b, c = a.exp(), a.sin()
    y = (b + c).sum()
    users = consumers([y.grad_fn])
    assert set(users[a.grad_fn]) == {b.grad_fn, c.grad_fn}
    assert users[y.grad_fn] == []
    acc = a.grad_fn.next_functions[0][0]
    assert users[acc] == [a.grad_fn]


def test_hessian_of_a_quadratic_form_is_a_plus_a_transpose():
    from minigrad.autograd.functional import hessian

    rng = np.random.default_rng(0)
    a_np = rng.standard_normal((3, 3))
    a = minigrad.tensor(a_np, dtype=minigrad.float64)
    x = minigrad.tensor(rng.standard_normal(3), dtype=minigrad.float64)
    h = hessian(lambda v: v @ a @ v, x)
    np.testing.assert_allclose(h.numpy(), a_np + a_np.T, rtol=1e-12, atol=1e-12)
