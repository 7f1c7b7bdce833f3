"""Indexing: ``x[index]`` against numpy and torch (hypothesis draws the index expressions),
scatter-add gradients, ``x[index] = value`` with and without autograd, gather and friends, errors."""

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import minigrad as mg
import minigrad.ops as M
from helpers import shares_memory
from minigrad.autograd.gradcheck import gradcheck, gradgradcheck
from minigrad.errors import AutogradError, DeviceError, ShapeError


def rand(*shape, requires_grad=True, seed=0):
    rng = np.random.default_rng(seed)
    return mg.tensor(rng.standard_normal(shape), dtype="float64", requires_grad=requires_grad)


def scatter_reference(shape, index, g):
    """What x[index]'s gradient must be: g added (once per occurrence) into zeros of x's shape."""
    out = np.zeros(shape)
    np.add.at(out, index, g)
    return out


# -- index expressions drawn by hypothesis -------------------------------------------------------------
@st.composite
def indexed(draw):
    """A shape and an index into it mixing ints, slices (any step), None, Ellipsis, int lists and
    bool masks; it may be out of range or ill-formed (then both numpy and minigrad must refuse)."""
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=4)))
    items, dim, ellipsis = [], 0, False
    for _ in range(draw(st.integers(0, len(shape) + 1))):
        n = shape[dim] if dim < len(shape) else 1
        kind = draw(st.sampled_from(["int", "slice", "slice", "none", "ellipsis", "list", "mask"]))
        if kind == "int":
            items.append(draw(st.integers(-n - 1, n)))
        elif kind == "slice":
            bound = st.none() | st.integers(-n - 2, n + 2)
            items.append(slice(draw(bound), draw(bound), draw(st.none() | st.sampled_from([-3, -2, -1, 1, 2, 3]))))
        elif kind == "none":
            items.append(None)
            continue
        elif kind == "ellipsis" and not ellipsis:
            items.append(Ellipsis)
            ellipsis = True
            continue
        elif kind == "list":
            items.append(draw(st.lists(st.integers(-n, n - 1), min_size=0, max_size=4)))
        else:
            items.append(np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n))))
        dim += 1
    index = tuple(items) if len(items) != 1 or draw(st.booleans()) else items[0]
    return shape, index


def mixes_ints_and_arrays(index):
    """numpy counts ints as advanced indices when arrays are present; torch (and minigrad) don't,
    which moves the indexed dims: the two agree on everything else."""
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, int) for i in items) and any(isinstance(i, (list, np.ndarray)) for i in items)


def numpy_index(index):
    """The same index for numpy (empty lists would otherwise be float arrays)."""
    fix = lambda i: np.array(i, dtype=np.int64) if isinstance(i, list) else i  # noqa: E731
    return tuple(fix(i) for i in index) if isinstance(index, tuple) else fix(index)


@settings(max_examples=150, deadline=None)
@given(indexed())
def test_getitem_matches_numpy_values_and_gradient(case):
    shape, index = case
    assume(not mixes_ints_and_arrays(index))
    a = np.random.default_rng(0).standard_normal(shape)
    try:
        expected = np.asarray(a[numpy_index(index)])
    except IndexError:
        with pytest.raises(IndexError):
            mg.tensor(a)[index]
        return
    x = mg.tensor(a, requires_grad=True)
    y = x[index]
    np.testing.assert_array_equal(y.detach().numpy(), expected)
    g = np.random.default_rng(1).standard_normal(expected.shape)
    y.backward(mg.tensor(g))
    np.testing.assert_allclose(x.grad.numpy(), scatter_reference(shape, numpy_index(index), g))
    assert shares_memory(y, x) == (y._base is x)


@settings(max_examples=60, deadline=None)
@given(indexed())
def test_getitem_matches_torch(case):
    torch = pytest.importorskip("torch")
    shape, index = case
    items = index if isinstance(index, tuple) else (index,)
    if any(isinstance(i, slice) and (i.step or 1) < 0 for i in items):
        return  # torch has no negative steps
    a = np.random.default_rng(0).standard_normal(shape)
    to_torch = lambda i: torch.tensor(i, dtype=torch.int64) if isinstance(i, list) else (  # noqa: E731
        torch.from_numpy(i) if isinstance(i, np.ndarray) else i)
    t_index = tuple(to_torch(i) for i in index) if isinstance(index, tuple) else to_torch(index)
    tx = torch.from_numpy(a).requires_grad_(True)
    try:
        ty = tx[t_index]
    except IndexError:
        with pytest.raises(IndexError):
            mg.tensor(a)[index]
        return
    x = mg.tensor(a, requires_grad=True)
    try:
        y = x[index]
    except IndexError:
        assert ty.numel() == 0  # torch skips the range check when nothing is selected
        return
    np.testing.assert_array_equal(y.detach().numpy(), ty.detach().numpy())
    g = np.random.default_rng(1).standard_normal(y.shape)
    y.backward(mg.tensor(g))
    ty.backward(torch.from_numpy(g))
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy())


# -- explicit cases ---------------------------------------------------------------------------------------
IDX = np.array([[0, 2], [2, 2]])
MASK = np.array([[True, False, True, True], [False, False, True, False], [True, True, False, False]])
CASES = {
    "int": lambda T, x: x[1],
    "neg_int_pair": lambda T, x: x[-1, -2],
    "slice_steps": lambda T, x: x[::2, 1::2],
    "none_ellipsis": lambda T, x: x[None, ..., None, 1],
    "int_tensor": lambda T, x: x[T(IDX)],
    "int_tensor_dim1": lambda T, x: x[:, T(IDX)],
    "two_arrays_broadcast": lambda T, x: x[T(np.array([[0], [2]])), T(np.array([1, 3, 3]))],
    "arrays_split_by_slice": lambda T, x: x[T(np.array([0, 2])), :, T(np.array([1, 0]))],
    "mask": lambda T, x: x[T(MASK)],
    "mask_rows": lambda T, x: x[T(MASK[:, 0])],
    "mask_and_slice": lambda T, x: x[1:, T(MASK[0])],
    "zero_d_int_tensor": lambda T, x: x[T(np.array(1))],
    "empty_list": lambda T, x: x[[]],
    "numpy_int": lambda T, x: x[np.int64(2)],
    "python_bool": lambda T, x: x[True, 1:],
    "int_then_array": lambda T, x: x[1, T(np.array([0, 3, 3]))],
    "int_slice_array": lambda T, x: x[0, :, T(np.array([1, 0, 1]))],  # torch: (4, 3); numpy: (3, 4)
    "array_slice_int": lambda T, x: x[T(np.array([[2], [0]])), 1:3, -1],
}
SHAPES = {"arrays_split_by_slice": (3, 4, 2), "int_slice_array": (3, 4, 2), "array_slice_int": (3, 4, 2)}


@pytest.mark.parametrize("name", CASES)
def test_cases_match_torch_values_and_gradients(name):
    torch = pytest.importorskip("torch")
    shape = SHAPES.get(name, (3, 4))
    x = rand(*shape)
    tx = torch.from_numpy(x.detach().numpy().copy()).requires_grad_(True)
    y, ty = CASES[name](mg.tensor, x), CASES[name](torch.from_numpy, tx)
    np.testing.assert_array_equal(y.detach().numpy(), ty.detach().numpy())
    g = np.random.default_rng(2).standard_normal(y.shape)
    y.backward(mg.tensor(g))
    ty.backward(torch.from_numpy(g))
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy())


@pytest.mark.parametrize("name", ["int_tensor", "two_arrays_broadcast", "mask_and_slice", "slice_steps"])
def test_second_derivatives(name):
    f = lambda x: CASES[name](mg.tensor, x) ** 2  # noqa: E731
    assert gradcheck(f, (rand(3, 4),))
    assert gradgradcheck(f, (rand(3, 4),))


def test_repeated_indices_accumulate_to_every_order():
    x = rand(3)
    y = (x[[0, 0, 2, 0]] ** 3).sum()
    (g,) = mg.grad(y, x, create_graph=True)
    counts = np.array([3.0, 0.0, 1.0])
    np.testing.assert_allclose(g.detach().numpy(), counts * 3 * x.detach().numpy() ** 2)
    g.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), counts * 6 * x.detach().numpy())


def test_basic_indexing_is_a_view_and_advanced_a_copy():
    x = rand(3, 4, requires_grad=False)
    for y in (x[1], x[:, 1:3], x[..., ::-1], x[None, 2, 3]):
        assert shares_memory(y, x) and y._base is x
    assert x[1, 2].shape == () and x[1, 2].array.ndim == 0  # an array, not a numpy scalar
    for y in (x[[1]], x[x > 0], x[mg.tensor([0, 1])]):
        assert not shares_memory(y, x) and y._base is None


# -- errors ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("index, pattern", [
    (5, r"getitem: index 5 is out of range for dimension 0 of size 3 \(index 5, tensor shape \(3, 4\)\)"),
    ((0, -5), r"index -5 is out of range for dimension 1 of size 4"),
    ((slice(None), [0, 4]),
     r"index 4 is out of range for dimension 1 of size 4 \(index \(:, \[0, 4\]\), tensor shape \(3, 4\)\)"),
    (mg.tensor([-4]), r"index -4 is out of range for dimension 0 of size 3"),
    ((0, 0, 0), r"too many indices for a tensor of shape \(3, 4\)"),
    ((Ellipsis, 0, Ellipsis), r"single ellipsis"),
    (mg.tensor([True, False]), r"bool mask of shape \(2,\) must match the sizes \(3,\) it covers \(from dimension 0\)"),
    (mg.tensor([0.0, 1.0]), r"must be integer or bool, got dtype float32"),
])
def test_index_errors_name_op_index_and_shape(index, pattern):
    with pytest.raises(IndexError, match=pattern):
        rand(3, 4)[index]


# -- setitem ----------------------------------------------------------------------------------------
def test_setitem_without_autograd_writes_in_place():
    x = mg.zeros(3, 4, dtype="float64")
    a = np.zeros((3, 4))
    data = x.array
    for index, value in [((1, slice(None, None, 2)), 5.0), (([0, 2], [1, 1]), mg.tensor([7.0, 8.0])),
                         (slice(None), np.arange(4.0)), ((Ellipsis, -1), [1.0, 2.0, 3.0])]:
        x[index] = value
        a[numpy_index(index)] = value.numpy() if isinstance(value, mg.Tensor) else value
    x[x > 6] = 0.0
    a[a > 6] = 0.0
    np.testing.assert_array_equal(x.numpy(), a)
    assert x.array is data and x._version == 5


def test_setitem_under_no_grad_updates_a_leaf():
    w = rand(3, 2)
    with mg.no_grad():
        w[0] = 0.0
    assert w.is_leaf and w.requires_grad and w.array[0].sum() == 0


def test_setitem_through_a_view_reaches_the_base():
    x = mg.zeros(2, 3)
    x[1][::2] = 1.0
    np.testing.assert_array_equal(x.numpy(), [[0, 0, 0], [1, 0, 1]])
    assert x._version == 1


def test_setitem_records_gradients_for_target_and_value():
    torch = pytest.importorskip("torch")
    a, w, s = rand(3, 4, seed=1), rand(4, seed=2), rand(seed=3)
    c = np.random.default_rng(4).standard_normal((3, 4))
    ta, tw, ts = (torch.from_numpy(t.detach().numpy().copy()).requires_grad_(True) for t in (a, w, s))
    for lib, (p, q, r), wrap in ((mg, (a, w, s), mg.tensor), (torch, (ta, tw, ts), torch.from_numpy)):
        x = p * 1.0
        x[1] = q
        x[[0, 2], 0] = r  # broadcast: the value's gradient is summed
        (x * wrap(c)).sum().backward()
    for t, tt in ((a, ta), (w, tw), (s, ts)):
        np.testing.assert_allclose(t.grad.numpy(), tt.grad.numpy())


def test_setitem_second_derivative():
    def f(a, v):
        x = a * a
        x[0] = v * v
        return x * x

    assert gradgradcheck(f, (rand(3), rand(seed=1)))


def test_setitem_errors():
    with pytest.raises(AutogradError, match="leaf tensor that requires grad"):
        rand(3)[0] = 1.0
    with pytest.raises(ShapeError, match=r"setitem: .*tensor shape \(3, 4\)"):
        mg.zeros(3, 4)[0] = mg.ones(3)
    with pytest.raises(IndexError, match="setitem: index 3 is out of range"):
        mg.zeros(3)[3] = 1.0
    v = mg.ones(1, device="cpu")
    fake = object.__new__(type(v.device))  # stands for a GPU: setitem checks devices before copying
    fake.type, fake.index = "cuda", 0
    v.device = fake
    with pytest.raises(DeviceError, match="setitem: the value is on cuda:0 but the tensor is on cpu"):
        mg.zeros(3, device="cpu")[0] = v


def test_setitem_invalidates_saved_tensors():
    w = rand(3)
    x = mg.ones(3, dtype="float64")
    y = (x * w).sum()
    x[0] = 2.0
    with pytest.raises(AutogradError, match="modified by an in-place operation"):
        y.backward()


# -- gather, index_select, index_add, scatter_add -----------------------------------------------------
GATHER_IDX = np.array([[0, 3, 3], [1, 0, 2]])
OPS = {  # L is minigrad.ops or torch, with L.idx making an index tensor
    "gather_dim1": (lambda L, x: L.gather(x, 1, L.idx(GATHER_IDX)), (2, 4)),
    "gather_dim0_smaller": (lambda L, x: L.gather(x, 0, L.idx(np.array([[2, 0], [1, 1]]))), (3, 4)),
    "index_select": (lambda L, x: L.index_select(x, 1, L.idx(np.array([3, 0, 3]))), (2, 4)),
    "index_add": (lambda L, x: L.index_add(x, 0, L.idx(np.array([2, 0, 2])), x[:1].expand(3, 4) * 2), (3, 4)),
    "scatter_add": (lambda L, x: L.scatter_add(x, 1, L.idx(GATHER_IDX), x[:, :3] * 3), (2, 4)),
}


def _libs(torch):
    names = ("gather", "index_select", "index_add", "scatter_add")
    mlib = SimpleNamespace(idx=mg.tensor, **{n: getattr(M, n) for n in names})
    tlib = SimpleNamespace(idx=torch.from_numpy, **{n: getattr(torch, n) for n in names})
    return mlib, tlib


@pytest.mark.parametrize("name", OPS)
def test_gather_family_matches_torch(name):
    torch = pytest.importorskip("torch")
    fn, shape = OPS[name]
    mlib, tlib = _libs(torch)
    x = rand(*shape)
    tx = torch.from_numpy(x.detach().numpy().copy()).requires_grad_(True)
    y, ty = fn(mlib, x), fn(tlib, tx)
    np.testing.assert_allclose(y.detach().numpy(), ty.detach().numpy())
    g = np.random.default_rng(5).standard_normal(y.shape)
    y.backward(mg.tensor(g))
    ty.backward(torch.from_numpy(g))
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy())
    assert gradgradcheck(lambda t: fn(mlib, t) ** 2, (rand(*shape),))


def test_gather_family_errors():
    x = rand(2, 4)
    with pytest.raises(IndexError, match=r"gather: index 4 is out of range for dimension 1 of size 4"):
        M.gather(x, 1, mg.tensor([[4]]))
    with pytest.raises(IndexError, match=r"gather: index -1 is out of range"):
        M.gather(x, 1, mg.tensor([[-1]]))
    with pytest.raises(ShapeError, match=r"gather: index of shape \(3, 1\) must have as many dimensions"):
        M.gather(x, 1, mg.tensor([[0], [0], [0]]))
    with pytest.raises(ShapeError, match=r"gather: index of shape \(2,\)"):
        M.gather(x, 1, mg.tensor([0, 1]))
    with pytest.raises(IndexError, match="must be an integer tensor"):
        M.index_select(x, 0, mg.tensor([True, False]))
    with pytest.raises(ShapeError, match="index_select: index must be 1-D"):
        M.index_select(x, 0, mg.tensor([[0]]))
    with pytest.raises(ShapeError, match=r"index_add: source must have shape \(2, 4\)"):
        M.index_add(x, 0, mg.tensor([0, 1]), rand(2, 3))
