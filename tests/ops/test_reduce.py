"""Reductions (minigrad/ops/reduce.py): values against numpy and PyTorch for every dim form,
gradients by finite differences (including prod with zeros and max with ties), second
derivatives, integer dtypes, 0-D inputs, stability of logsumexp and the errors."""

from __future__ import annotations

import numpy as np
import pytest

import minigrad as mg
from minigrad import ops
from minigrad.autograd import gradcheck, gradgradcheck
from minigrad.errors import DTypeError, ShapeError

RNG = np.random.default_rng(0)
X = RNG.standard_normal((3, 4, 5))
DIMS = [None, 1, -1, (0, 2), (-1, 0, 1), ()]


def t(a, grad=False, dtype="float64"):
    return mg.tensor(np.asarray(a), dtype=dtype, requires_grad=grad)


def torch_or_skip():
    return pytest.importorskip("torch")


def _np_dims(dim):
    return None if dim == () else dim


# -- values ------------------------------------------------------------------------------------------
NUMPY = {
    "sum": (lambda x, d, k: ops.sum(x, d, k), lambda a, d, k: a.sum(axis=d, keepdims=k)),
    "mean": (lambda x, d, k: ops.mean(x, d, k), lambda a, d, k: a.mean(axis=d, keepdims=k)),
    "prod": (lambda x, d, k: ops.prod(x, d, k), lambda a, d, k: a.prod(axis=d, keepdims=k)),
    "amax": (lambda x, d, k: ops.amax(x, d, k), lambda a, d, k: a.max(axis=d, keepdims=k)),
    "amin": (lambda x, d, k: ops.amin(x, d, k), lambda a, d, k: a.min(axis=d, keepdims=k)),
    "var": (lambda x, d, k: ops.var(x, d, keepdim=k), lambda a, d, k: a.var(axis=d, ddof=1, keepdims=k)),
    "std": (lambda x, d, k: ops.std(x, d, correction=0, keepdim=k), lambda a, d, k: a.std(axis=d, keepdims=k)),
    "logsumexp": (lambda x, d, k: ops.logsumexp(x, d, k),
                  lambda a, d, k: np.log(np.exp(a).sum(axis=d, keepdims=k))),
}


@pytest.mark.parametrize("name", NUMPY)
@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("keepdim", [False, True])
def test_values_match_numpy(name, dim, keepdim):
    ours, ref = NUMPY[name]
    out = ours(t(X), dim, keepdim)
    expected = ref(X, _np_dims(dim), keepdim)
    assert out.shape == np.shape(expected)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", NUMPY)
def test_0d_input_reduces_to_itself(name):
    ours, _ = NUMPY[name]
    for dim in (None, 0, -1):
        out = ours(t(1.5), dim, False)
        assert out.shape == ()
    assert ops.sum(t(1.5), 0, True).shape == ()


@pytest.mark.parametrize("name", ["sum", "mean", "prod", "amax", "logsumexp", "var"])
@pytest.mark.parametrize("dim", [None, 1, (0, 2)])
def test_gradients_by_finite_differences(name, dim):
    if name == "logsumexp" and dim is None:
        dim = (0, 1, 2)
    ours, _ = NUMPY[name]
    x = t(RNG.standard_normal((2, 3, 2)), grad=True)
    assert gradcheck(lambda x: ours(x, dim, False), (x,))
    assert gradcheck(lambda x: ours(x, dim, True), (x,))


@pytest.mark.parametrize("fn", [
    lambda x: ops.logsumexp(x, 1), lambda x: ops.logsumexp(x, (0, 1), keepdim=True),
    lambda x: ops.var(x, 1), lambda x: ops.var(x), lambda x: ops.std(x, 0, correction=0),
    lambda x: ops.mean(x, 1) ** 2, lambda x: ops.prod(x, 1), lambda x: ops.cumsum(x, 1) ** 2,
], ids=["logsumexp", "logsumexp_keep", "var_dim", "var", "std", "mean", "prod", "cumsum"])
def test_second_derivatives(fn):
    x = t(RNG.uniform(0.5, 1.5, (3, 4)), grad=True)
    assert gradgradcheck(fn, (x,))


def test_against_torch_including_max_min_with_indices():
    torch = torch_or_skip()
    tx = torch.tensor(X)
    for dim in (None, 1, -1, (0, 2)):
        for keep in ((False,) if dim is None else (False, True)):
            kw = {} if dim is None else {"dim": dim, "keepdim": keep}
            for name, ref in [("sum", tx.sum), ("mean", tx.mean), ("amax", tx.amax), ("amin", tx.amin),
                              ("var", tx.var), ("std", tx.std)]:
                np.testing.assert_allclose(getattr(t(X), name)(**kw).numpy(), ref(**kw).numpy(),
                                           rtol=1e-12, atol=1e-12)
    for dim in (0, 1, -1):
        for keep in (False, True):
            for name in ("max", "min"):
                ours, theirs = getattr(t(X), name)(dim, keep), getattr(tx, name)(dim, keep)
                np.testing.assert_array_equal(ours.values.numpy(), theirs.values.numpy())
                np.testing.assert_array_equal(ours.indices.numpy(), theirs.indices.numpy())
                assert ours.indices.dtype == mg.int64
            for name in ("argmax", "argmin"):
                np.testing.assert_array_equal(getattr(t(X), name)(dim, keep).numpy(),
                                              getattr(tx, name)(dim, keep).numpy())
    assert t(X).argmax().item() == tx.argmax().item()
    assert t(X).argmin(keepdim=True).shape == tuple(tx.argmin(dim=None, keepdim=True).shape)
    np.testing.assert_allclose(ops.logsumexp(t(X), (0, 2)).numpy(), torch.logsumexp(tx, (0, 2)).numpy())
    np.testing.assert_allclose(ops.var(t(X), 1, correction=0).numpy(), tx.var(1, correction=0).numpy())


def test_max_and_min_return_a_named_tuple_and_grad_goes_to_the_index():
    x = t([[1.0, 5.0, 2.0], [7.0, 0.0, 3.0]], grad=True)
    out = ops.max(x, 1)
    values, indices = out
    assert out.values is values and out.indices is indices
    assert indices.tolist() == [1, 0] and not indices.requires_grad
    (values * t([10.0, 20.0])).sum().backward()
    assert x.grad.tolist() == [[0, 10, 0], [20, 0, 0]]
    x.grad = None
    ops.min(x, 0, keepdim=True).values.sum().backward()
    assert x.grad.tolist() == [[1, 0, 1], [0, 1, 0]]
    assert gradcheck(lambda x: ops.max(x, 1).values, (t(X[0], grad=True),))
    assert gradgradcheck(lambda x: ops.min(x, 0).values * x.sum(), (t(X[0], grad=True),))


def test_ties_split_the_gradient_evenly_like_torch():
    data = [[3.0, 1.0, 3.0], [2.0, 2.0, 2.0]]
    x = t(data, grad=True)
    ops.max(x).backward()
    np.testing.assert_allclose(x.grad.numpy(), [[0.5, 0, 0.5], [0, 0, 0]])
    x.grad = None
    ops.amin(x, 1).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [[0, 1, 0], [1 / 3, 1 / 3, 1 / 3]])
    torch = pytest.importorskip("torch")
    tx = torch.tensor(data, requires_grad=True)
    tx.amin(1).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy())


@pytest.mark.parametrize("data, dim", [
    ([2.0, 0.0, 3.0, -1.5], None),  # one zero
    ([0.0, 2.0, 0.0, -1.5], None),  # two zeros
    ([0.0, 0.0, 0.0, 1.5], None),  # three zeros
    ([[0.0, 2.0], [1.0, 3.0], [0.0, 0.0]], 1),
])
def test_prod_gradient_with_zeros(data, dim):
    x = t(data, grad=True)
    assert gradcheck(lambda x: ops.prod(x, dim), (x,))
    assert gradgradcheck(lambda x: ops.prod(x, dim), (x,))
    torch = pytest.importorskip("torch")
    tx = torch.tensor(data, requires_grad=True)
    (tx.prod() if dim is None else tx.prod(dim)).sum().backward()
    ops.prod(x, dim).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy())


def test_integer_dtypes_follow_torch():
    for dtype in ("int32", "uint8", "bool", "int64"):
        x = mg.tensor(np.ones((2, 3)), dtype=dtype)
        assert ops.sum(x).dtype == mg.int64 and ops.sum(x).item() == 6
        assert ops.sum(x, 1).dtype == mg.int64
        assert ops.prod(x).dtype == mg.int64
        assert ops.cumsum(x, 1).dtype == mg.int64
        assert ops.amax(x).dtype == x.dtype
        if dtype == "bool":  # torch refuses argmax of a bool tensor
            with pytest.raises(DTypeError, match="argmax"):
                ops.argmax(x)
        else:
            assert ops.argmax(x).dtype == mg.int64
        for name in ("mean", "var", "std"):
            with pytest.raises(DTypeError, match=name):
                getattr(ops, name)(x)
    assert ops.logsumexp(mg.tensor([1, 2]), 0).dtype == mg.get_default_dtype()


def test_float16_sums_accumulate_in_float32():
    x = mg.ones(5000, dtype=mg.float16)
    assert ops.sum(x).dtype == mg.float16 and ops.sum(x).item() == 5000  # float16 accumulation stops at 2048
    assert ops.mean(x).item() == 1.0
    assert ops.cumsum(x, 0)[-1].item() == 5000


def test_cumsum_values_and_gradient():
    np.testing.assert_allclose(ops.cumsum(t(X), 1).numpy(), np.cumsum(X, 1))
    np.testing.assert_allclose(ops.cumsum(t(X), -1).numpy(), np.cumsum(X, -1))
    assert ops.cumsum(t(2.0), 0).shape == ()
    x = t(RNG.standard_normal((3, 4)), grad=True)
    assert gradcheck(lambda x: ops.cumsum(x, 0), (x,))
    assert gradcheck(lambda x: ops.cumsum(x, -1), (x,))


def test_logsumexp_is_stable():
    x = t([[1e4, 1e4 - 1.0, -1e4], [-np.inf, -np.inf, -np.inf]], grad=True, dtype="float32")
    out = ops.logsumexp(x, 1)
    assert np.isfinite(out[0].item()) and abs(out[0].item() - (1e4 + np.log1p(np.exp(-1.0)))) < 1e-2
    assert out[1].item() == -np.inf
    out[0].backward()
    # exp(x - out) with out rounded to float32 near 1e4 (ulp 1e-3): torch's backward is the same
    np.testing.assert_allclose(x.grad.numpy()[0], [1 / (1 + np.exp(-1)), 1 / (1 + np.e), 0], atol=2e-3)
    torch = pytest.importorskip("torch")
    tx = torch.tensor(x.detach().numpy(), requires_grad=True)
    torch.logsumexp(tx, 1)[0].backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), atol=1e-6)


def test_var_with_too_large_correction_is_nan_or_inf_like_torch():
    with np.errstate(all="ignore"):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert not np.isfinite(ops.var(t([1.0])).item())


def test_empty_inputs():
    e = t(np.zeros((0, 3)))
    assert ops.sum(e, 0).tolist() == [0, 0, 0]
    assert ops.prod(e, 0).tolist() == [1, 1, 1]
    assert ops.amax(e, 1).shape == (0,)  # reducing over the nonzero dim is fine
    for call in (lambda: ops.max(e), lambda: ops.max(e, 0), lambda: ops.amax(e, 0), lambda: ops.argmin(e, 0),
                 lambda: ops.argmax(e)):
        with pytest.raises(ShapeError, match=r"size 0.*\(0, 3\)"):
            call()


@pytest.mark.parametrize("call, name", [
    (lambda x: ops.sum(x, 3), "sum"), (lambda x: ops.mean(x, (0, -4)), "mean"), (lambda x: ops.prod(x, 5), "prod"),
    (lambda x: ops.amax(x, 3), "amax"), (lambda x: ops.min(x, 3), "min"), (lambda x: ops.argmin(x, -4), "argmin"),
    (lambda x: ops.std(x, 9), "std"), (lambda x: ops.cumsum(x, 3), "cumsum"),
])
def test_bad_dim_names_the_op_and_the_shape(call, name):
    with pytest.raises(ShapeError) as info:
        call(t(X))
    assert name in str(info.value) and "(3, 4, 5)" in str(info.value)


def test_max_with_several_dims_points_to_amax():
    with pytest.raises(TypeError, match="amax"):
        ops.max(t(X), (0, 1))


@pytest.mark.parametrize("dim, keepdim", [(None, False), (0, False), (1, True), ((0, 1), False)])
def test_all_and_any_match_numpy(dim, keepdim):
    a = np.array([[0.0, 1.0, 2.0], [3.0, 0.0, 5.0]])
    x = mg.tensor(a)
    axis = dim if dim is None or isinstance(dim, int) else tuple(dim)
    np.testing.assert_array_equal(x.all(dim, keepdim).numpy(), a.all(axis=axis, keepdims=keepdim))
    np.testing.assert_array_equal(mg.any(x > 4, dim, keepdim).numpy(), (a > 4).any(axis=axis, keepdims=keepdim))
    assert x.all(dim).dtype == mg.bool


def test_equal_and_allclose():
    a = mg.tensor([1.0, 2.0, 3.0])
    assert mg.equal(a, a.clone()) and not mg.equal(a, a[:2])
    assert not mg.equal(a, a + 1e-3)
    assert mg.allclose(a, a + 1e-9) and not mg.allclose(a, a + 1e-3)
    nan = mg.tensor([float("nan")])
    assert not mg.allclose(nan, nan) and mg.allclose(nan, nan, equal_nan=True)


def test_max_and_min_of_two_tensors_are_elementwise_as_in_torch():  # pytorch/examples vae: torch.max(mask, mask)
    a, b = mg.tensor([0.2, 0.5, 0.7], requires_grad=True), mg.tensor([0.3, 0.3, 0.9], requires_grad=True)
    np.testing.assert_allclose(mg.max(a, b).detach().numpy(), [0.3, 0.5, 0.9])
    np.testing.assert_allclose(a.min(b).detach().numpy(), [0.2, 0.3, 0.7])
    mg.max(a, b).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), [0, 1, 0])
    masks = mg.max(mg.le(a, 0.49), mg.gt(a, 0.51))
    assert masks.dtype == mg.bool and masks.tolist() == [True, False, True]


def test_comparisons_are_torch_functions_too():
    a, b = mg.tensor([1, 2, 3]), mg.tensor([2, 2, 2])
    for name in ("eq", "ne", "lt", "le", "gt", "ge"):
        assert getattr(mg, name)(a, b).tolist() == getattr(a, name)(b).tolist(), name
    assert mg.logical_and(mg.gt(a, 1), mg.lt(a, 3)).tolist() == [False, True, False]
