"""Movement ops: values against numpy/torch, gradients, views sharing memory and version, errors.

The op table (tests/op_table.py) already checks the common cases of every op's values and
first/second derivatives; this file covers what a table row cannot: which results are views,
the version counter they share, layouts that forbid ``view``, pad modes, and error messages.
"""

import numpy as np
import pytest

import minigrad as mg
import minigrad.ops as M
from helpers import shares_memory
from minigrad.autograd.gradcheck import gradcheck, gradgradcheck
from minigrad.errors import AutogradError, DeviceError, DimensionError, ShapeError


def arange(*shape, dtype="float64"):
    return mg.tensor(np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape))


def rand(*shape, requires_grad=True):
    rng = np.random.default_rng(len(shape) + sum(shape))
    return mg.tensor(rng.standard_normal(shape), dtype="float64", requires_grad=requires_grad)


def torch_of(x):
    torch = pytest.importorskip("torch")
    return torch.from_numpy(np.array(x.detach().numpy()))


# -- views: shared memory and shared version counter ------------------------------------------------
VIEWS = {
    "reshape": lambda x: x.reshape(4, 6),
    "view": lambda x: x.view(-1),
    "transpose": lambda x: x.transpose(0, 2),
    "permute": lambda x: x.permute(1, 2, 0),
    "T": lambda x: x.T,
    "movedim": lambda x: M.movedim(x, 0, -1),
    "unsqueeze": lambda x: x.unsqueeze(1),
    "squeeze": lambda x: x.unsqueeze(0).squeeze(),
    "flatten": lambda x: x.flatten(1),
    "expand": lambda x: x[:, :1].expand(2, 5, 4),
    "narrow": lambda x: M.narrow(x, 1, 1, 2),
    "split": lambda x: x.split(2, dim=2)[1],
    "chunk": lambda x: x.chunk(2, dim=1)[0],
    "unbind": lambda x: x.unbind(1)[2],
    "getitem": lambda x: x[1, ::-2, None],
}


@pytest.mark.parametrize("name", VIEWS)
def test_view_ops_share_memory_and_version(name):
    x = arange(2, 3, 4)
    y = VIEWS[name](x)
    assert shares_memory(y, x)
    assert y._base is x
    x.add_(1.0)
    assert y._version == 1  # an in-place op on the base is seen through the view
    np.testing.assert_array_equal(y.numpy(), VIEWS[name](arange(2, 3, 4) + 1).numpy())
    y._bump_version()
    assert x._version == 2  # and one on the view by the base


def test_view_of_a_view_points_at_the_root():
    x = arange(2, 3, 4)
    y = x.transpose(0, 1)[1:].reshape(2, 2, 2, 2)
    assert y._base is x


@pytest.mark.parametrize("fn", [lambda x: x.T.reshape(-1), lambda x: x.flip(0), lambda x: x.repeat(1, 1),
                                lambda x: M.cat([x, x]), lambda x: M.pad(x, (1, 1)), lambda x: x[[0, 1]]])
def test_copying_ops_do_not_share(fn):
    x = arange(3, 4)
    y = fn(x)
    assert not shares_memory(y, x) and y._base is None


@pytest.mark.parametrize("fn", [lambda x: x.reshape(2, 3), lambda x: x.view(-1, 3), lambda x: x.squeeze(0),
                                lambda x: x.permute(0, 1), lambda x: x.transpose(1, 1), lambda x: x.expand(2, 3),
                                lambda x: x.flatten(1), lambda x: M.pad(x, (0, 0), mode="reflect")])
def test_no_op_movements_still_return_a_new_tensor(fn):
    x = rand(2, 3)
    with mg.no_grad():
        y = fn(x)
    assert y is not x and not y.requires_grad and y.shape == x.shape
    y.array[0, 0] = 7.0  # writable, and a view exactly when torch's is one
    assert (x.array[0, 0] == 7.0) == (y._base is x)


def test_inplace_on_base_invalidates_a_saved_view():
    w = rand(6, requires_grad=True)
    x = arange(2, 3)
    y = x.view(6)
    z = (y * w).sum()  # Mul saved y to compute w's gradient
    x.add_(1.0)
    with pytest.raises(AutogradError, match="modified by an in-place operation"):
        z.backward()


def test_inplace_on_base_through_autograd_invalidates_a_saved_view():
    a = rand(2, 3)
    x = a * 1.0
    y = x.view(6)
    z = (y * y).sum()
    x.mul_(2.0)  # recorded in place: x's grad_fn changes, and its version moves on
    with pytest.raises(AutogradError, match="version"):
        z.backward()


def test_inplace_on_view_invalidates_a_saved_base():
    w = rand(2, 3, requires_grad=True)
    x = arange(2, 3)
    z = (x * w).sum()
    x.view(6)[0] = 5.0  # writes through the view, into x's memory
    assert x.array[0, 0] == 5.0
    with pytest.raises(AutogradError):
        z.backward()


# -- view vs reshape ---------------------------------------------------------------------------------
@pytest.mark.parametrize("make, shape", [
    (lambda x: x, (4, 6)),
    (lambda x: x.transpose(1, 2), (2, 4, 3)),        # split/merge inside contiguous chunks is fine
    (lambda x: x.transpose(0, 1), (3, 2, 2, 2)),
    (lambda x: x[:, :, ::2], (2, 3, 2, 1)),
    (lambda x: x[:, 0:1].expand(2, 5, 4), (2, 5, 2, 2)),
    (lambda x: x.permute(2, 0, 1), (4, 6)),
    (lambda x: x[:, :, ::2], (12,)),
])
def test_view_agrees_with_torch_when_possible(make, shape):
    torch = pytest.importorskip("torch")
    x = arange(2, 3, 4)
    tx = make(torch.arange(24, dtype=torch.float64).reshape(2, 3, 4))
    y = M.view(make(x), shape)
    np.testing.assert_array_equal(y.numpy(), tx.view(shape).numpy())
    assert shares_memory(y, x)


@pytest.mark.parametrize("make, shape", [
    (lambda x: x.transpose(1, 2), (24,)),
    (lambda x: x.permute(2, 0, 1), (8, 3)),
    (lambda x: x[:, ::2], (16,)),
])
def test_view_refuses_a_copy_like_torch(make, shape):
    torch = pytest.importorskip("torch")
    with pytest.raises(RuntimeError):
        make(torch.arange(24.0).reshape(2, 3, 4)).view(shape)
    with pytest.raises(ShapeError, match=r"view: .*shape \(.*cannot be viewed as shape .*reshape"):
        M.view(make(arange(2, 3, 4)), shape)
    y = M.reshape(make(arange(2, 3, 4)), shape)  # reshape copies instead
    np.testing.assert_array_equal(y.numpy(), make(torch.arange(24.0).reshape(2, 3, 4)).reshape(shape).numpy())


def test_reshape_errors_name_both_shapes():
    x = arange(2, 3)
    with pytest.raises(ShapeError, match=r"reshape.*\(2, 3\).*\(4, 2\)"):
        x.reshape(4, 2)
    with pytest.raises(ShapeError, match="at most one -1"):
        x.reshape(-1, -1)
    with pytest.raises(ShapeError, match=r"-1.*\(4, -1\)"):
        x.reshape(4, -1)
    with pytest.raises(ShapeError, match="-1"):
        arange(0, 3).reshape(0, -1)


# -- the other ops against torch ------------------------------------------------------------------------
CASES = [
    ("squeeze_tuple", lambda m, x: x.squeeze((0, 2)), (1, 3, 1, 1)),
    ("squeeze_0d", lambda m, x: x.squeeze(0), ()),
    ("unsqueeze_end", lambda m, x: x.unsqueeze(2), (3, 4)),
    ("flatten_0d", lambda m, x: x.flatten(), ()),
    ("flatten_mid", lambda m, x: m.flatten(x, 1, 2), (2, 3, 4, 5)),
    ("movedim", lambda m, x: m.movedim(x, 0, 2), (2, 3, 4)),
    ("movedim_many", lambda m, x: m.movedim(x, (0, 3), (2, 0)), (2, 3, 4, 5)),
    ("narrow", lambda m, x: m.narrow(x, -1, 1, 2), (3, 4)),
    ("narrow_neg_start", lambda m, x: m.narrow(x, 0, -2, 2), (3, 4)),
    ("expand_keep", lambda m, x: x.expand(2, -1, -1), (1, 3)),
    ("flip_all", lambda m, x: x.flip((0, 1, 2)), (2, 3, 4)),
    ("repeat_ones", lambda m, x: x.repeat(1, 1), (2, 3)),
    ("repeat_3d", lambda m, x: x.repeat(2, 1, 3, 2), (2, 1, 3)),
    ("repeat_0d", lambda m, x: x.repeat(3, 2), ()),
    ("chunk_more_than_size", lambda m, x: x.chunk(5), (3, 2)),
    ("chunk_7_by_3", lambda m, x: x.chunk(3), (7,)),
    ("split_empty_piece", lambda m, x: m.split(x, [0, 2, 1], 1), (2, 3)),
    ("unbind_method", lambda m, x: x.unbind(), (3, 2)),
    ("unbind_negative_dim", lambda m, x: m.unbind(x, -2), (2, 3, 4)),
    ("cat_three", lambda m, x: m.cat([x, x * 2, x[:1]], 0), (2, 3)),
    ("stack_last", lambda m, x: m.stack([x, -x], -1), (2, 3)),
    ("pad_negative", lambda m, x: _pad(m)(x, (-1, 2, 1, -1)), (3, 4)),
    ("pad_reflect", lambda m, x: _pad(m)(x, (2, 1), mode="reflect"), (2, 3, 4)),
    ("pad_reflect_2d", lambda m, x: _pad(m)(x, (1, 2, 2, 1), mode="reflect"), (1, 2, 3, 4)),
    ("pad_replicate", lambda m, x: _pad(m)(x, (3, 1, 0, 2), mode="replicate"), (1, 2, 3, 4)),
    ("pad_circular", lambda m, x: _pad(m)(x, (2, 3), mode="circular"), (1, 2, 4)),
]


def _pad(m):
    return m.pad if m is M else m.nn.functional.pad


def _as_tuple(out):
    return out if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize("name, fn, shape", CASES, ids=[c[0] for c in CASES])
def test_values_and_gradients_match_torch(name, fn, shape):
    torch = pytest.importorskip("torch")
    x = rand(*shape)
    tx = torch_of(x).requires_grad_(True)
    outs, touts = _as_tuple(fn(M, x)), _as_tuple(fn(torch, tx))
    assert len(outs) == len(touts)
    for o, t in zip(outs, touts):
        assert o.shape == tuple(t.shape)
        np.testing.assert_allclose(o.detach().numpy(), t.detach().numpy())
    weights = [np.random.default_rng(i).standard_normal(o.shape) for i, o in enumerate(outs)]
    sum((o * mg.tensor(w)).sum() for o, w in zip(outs, weights)).backward()
    sum((t * torch.from_numpy(w)).sum() for t, w in zip(touts, weights)).backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy())


SMALL = [c for c in CASES if np.prod(c[2]) <= 24]


@pytest.mark.parametrize("name, fn, shape", SMALL, ids=[c[0] for c in SMALL])
def test_first_and_second_derivatives(name, fn, shape):
    x = rand(*shape)
    f = lambda t: fn(M, t)  # noqa: E731
    assert gradcheck(f, (x,))
    assert gradgradcheck(lambda t: tuple(o * o for o in _as_tuple(f(t))), (x,))


def test_grad_of_grad_through_cat():
    a, b = rand(3), rand(2)
    y = (M.cat([a, b]) ** 3).sum()
    ga, gb = mg.grad(y, (a, b), create_graph=True)
    np.testing.assert_allclose(ga.detach().numpy(), 3 * a.detach().numpy() ** 2)
    (ga.sum() + gb.sum()).backward()
    np.testing.assert_allclose(a.grad.numpy(), 6 * a.detach().numpy())
    np.testing.assert_allclose(b.grad.numpy(), 6 * b.detach().numpy())


def test_cat_promotes_dtypes_like_torch():
    torch = pytest.importorskip("torch")
    for dts in [("int64", "float32"), ("int32", "int64"), ("bool", "int32"), ("float32", "float64")]:
        ms = [mg.tensor(np.ones((1, 2)), dtype=d) for d in dts]
        ts = [torch.ones(1, 2, dtype=getattr(torch, d)) for d in dts]
        assert str(M.cat(ms).dtype) == str(torch.cat(ts).dtype).removeprefix("torch.")
        assert M.stack(ms).dtype == M.cat(ms).dtype


def test_cat_gradient_only_for_inputs_that_need_it():
    a, b = rand(2, 2), arange(3, 2)
    M.cat([a, b]).sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), np.ones((2, 2)))
    assert b.grad is None


def test_repeat_and_flip_copy_like_torch():
    x = arange(2, 3)
    for y in (x.flip(0), x.repeat(1, 1)):
        y.array[...] = -1
    assert x.array.min() == 0 and x._version == 0


# -- errors ----------------------------------------------------------------------------------------------
def test_cat_and_stack_errors_name_the_tensor_and_shapes():
    a, b = arange(2, 3), arange(2, 4)
    with pytest.raises(ShapeError, match=r"cat: tensor 1 has shape \(2, 4\) but tensor 0 has shape \(2, 3\)"):
        M.cat([a, b])
    with pytest.raises(ShapeError, match=r"tensor 2 has shape \(3,\)"):
        M.cat([a, a, arange(3)], 1)
    with pytest.raises(ShapeError, match="zero-dimensional tensor at index 1"):
        M.cat([arange(1), mg.tensor(1.0)])
    with pytest.raises(ShapeError, match="non-empty"):
        M.cat([])
    with pytest.raises(TypeError, match="at index 1"):
        M.cat([a, np.ones((2, 3))])
    with pytest.raises(ShapeError, match=r"stack: tensor 1 has shape \(2, 4\) but tensor 0 has shape \(2, 3\)"):
        M.stack([a, b])
    with pytest.raises(ShapeError, match="cat: dim 2 is out of range"):
        M.cat([a, a], 2)


def test_cat_device_error():
    a, b = arange(2), arange(2)
    fake = object.__new__(type(a.device))  # stands for a GPU: cat checks devices before touching data
    fake.type, fake.index = "cuda", 0
    b.device = fake
    with pytest.raises(DeviceError, match="cat: tensor 1 is on"):
        M.cat([a, b])


@pytest.mark.parametrize("call, pattern", [
    (lambda x: x.permute(0, 1), r"permute: got 2 dims"),
    (lambda x: x.permute(0, 0, 1), r"permute: dims \(0, 0, 1\) repeat"),
    (lambda x: x.transpose(0, 3), r"transpose: dim 3 is out of range"),
    (lambda x: x.unsqueeze(4), r"unsqueeze: dim 4 is out of range"),
    (lambda x: x.squeeze(3), r"squeeze: dim 3 is out of range"),
    (lambda x: x.flatten(2, 1), r"flatten: start_dim 2 comes after end_dim 1"),
    (lambda x: x.expand(2, 5, 4), r"expand: cannot expand a tensor of shape \(2, 3, 4\) to \(2, 5, 4\)"),
    (lambda x: x.expand(3, 4), r"fewer dims"),
    (lambda x: x.expand(-1, 2, 3, 4), r"new leading dim"),
    (lambda x: M.narrow(x, 1, 2, 2), r"narrow: start 2 and length 2 do not fit in dimension 1 of size 3"),
    (lambda x: x.split([1, 1], 1), r"split: sizes \[1, 1\] must be >= 0 and sum to 3"),
    (lambda x: x.split(0), r"split_size must be positive"),
    (lambda x: x.chunk(0), r"chunks must be positive"),
    (lambda x: M.pad(x, (1,)), r"pad: needs an even number"),
    (lambda x: M.pad(x, (4, 0), mode="reflect"), r"reflect padding \(4, 0\) does not fit dimension 2 of size 4"),
    (lambda x: M.pad(x, (0, 5), mode="circular"), r"circular padding"),
    (lambda x: x.flip((0, -3)), r"flip: dims \(0, 0\) repeat"),
    (lambda x: x.repeat(2, 2), r"repeat: needs one non-negative count per dim"),
    (lambda x: M.movedim(x, (0, 1), 2), r"movedim"),
    (lambda x: x.unbind(3), r"unbind: dim 3 is out of range for a tensor with 3 dimension"),
    (lambda x: mg.unbind(x, -4), r"unbind: dim -4 is out of range for a tensor with 3 dimension"),
    (lambda x: mg.unbind(x[0, 0, 0]), r"unbind: expects a tensor with at least one dimension, got a 0-d"),
])
def test_errors_name_the_op_and_the_shapes(call, pattern):
    with pytest.raises(ShapeError, match=pattern):
        call(arange(2, 3, 4))


def test_unbind_is_a_function_and_a_method_as_in_torch():
    """torch.unbind(x, dim) and x.unbind(dim): the slices along dim, without it, as a tuple (empty
    for a dim of size 0); the same dims as torch, negative ones counted from the end."""
    x = rand(2, 3)
    assert mg.unbind is M.unbind
    for dim in (0, 1, -1, -2):
        rows = x.unbind(dim)
        assert type(rows) is tuple and len(rows) == x.shape[dim]
        for i, (a, b) in enumerate(zip(rows, mg.unbind(x, dim=dim))):
            np.testing.assert_array_equal(a.detach().numpy(), np.take(x.detach().numpy(), i, axis=dim))
            np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())
    assert mg.zeros((0, 3)).unbind() == () and len(mg.zeros((3, 0)).unbind(-1)) == 0
    assert gradcheck(lambda t: t.unbind(-1), (x,))  # every output, so the one Stack backward meets all
    assert gradcheck(lambda t: mg.unbind(t)[1] * 2, (x,))  # the outputs not used get zeros


def test_pad_rejects_unknown_mode():
    with pytest.raises(ValueError, match="pad: mode must be"):
        M.pad(arange(3), (1, 1), mode="wrap")


@pytest.mark.parametrize("call, op, valid, got", [
    (lambda x: x.sum(dim=5), "sum", "[-2, 1]", 5),
    (lambda x: x.unbind(2), "unbind", "[-2, 1]", 2),
    (lambda x: x.softmax(-3), "softmax", "[-2, 1]", -3),
    (lambda x: x.transpose(0, 4), "transpose", "[-2, 1]", 4),
    (lambda x: x.unsqueeze(3), "unsqueeze", "[-3, 2]", 3),
    (lambda x: M.cat([x, x], 2), "cat", "[-2, 1]", 2),
    (lambda x: x.mean((0, 7)), "mean", "[-2, 1]", 7),
])
def test_a_dim_out_of_range_is_torchs_index_error_and_a_shape_error(call, op, valid, got):
    """torch raises IndexError ("Dimension out of range (expected to be in range of [-2, 1], but got
    5)"); minigrad's DimensionError is that IndexError and its own ShapeError at once, naming the op,
    the valid range and the dim given."""
    x = arange(2, 3)
    with pytest.raises(DimensionError) as info:
        call(x)
    assert isinstance(info.value, IndexError) and isinstance(info.value, ShapeError)
    assert str(info.value).startswith(f"{op}: dim {got} ")
    assert f"expected to be in range of {valid}, but got {got}" in str(info.value)


def test_a_dim_out_of_range_raises_what_torch_raises():
    torch = pytest.importorskip("torch")
    for call in (lambda L, x: x.sum(dim=5), lambda L, x: x.unbind(2), lambda L, x: L.stack([x, x], -4)):
        with pytest.raises(IndexError, match=r"expected to be in range of \[-\d, \d\], but got -?\d"):
            call(torch, torch.zeros(2, 3))
        with pytest.raises(IndexError, match=r"expected to be in range of \[-\d, \d\], but got -?\d"):
            call(mg, mg.zeros(2, 3))
