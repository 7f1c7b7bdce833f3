"""Tensor basics with PyTorch's defaults: creation functions, metadata, conversion, repr, dtype
casts and promotion, memory shared by views, and seeded randomness (chapter 01)."""

from __future__ import annotations

import numpy as np
import pytest

import minigrad
from helpers import shares_memory


# -- creation -------------------------------------------------------------------------------------
@pytest.mark.parametrize("data, dtype", [
    ([1.0, 2.0], minigrad.float32),
    ([1, 2], minigrad.int64),
    ([True, False], minigrad.bool_),
    (3.5, minigrad.float32),
    (7, minigrad.int64),
    ([[1, 2], [3, 4]], minigrad.int64),
    (np.array([1.0, 2.0]), minigrad.float64),  # an array keeps its dtype, as torch.tensor(ndarray)
    (np.array([1, 2], dtype=np.int32), minigrad.int32),
])
def test_tensor_infers_dtype_like_torch(data, dtype):
    t = minigrad.tensor(data)
    assert t.dtype == dtype
    np.testing.assert_array_equal(t.numpy(), np.asarray(data))


def test_tensor_copies_its_data():
    a = np.zeros(3)
    t = minigrad.tensor(a)
    a[0] = 1.0
    assert t.numpy()[0] == 0.0


def test_tensor_with_explicit_dtype():
    assert minigrad.tensor([1, 2], dtype=minigrad.float64).dtype == minigrad.float64
    assert minigrad.tensor([1.7], dtype=minigrad.int32).dtype == minigrad.int32
    assert minigrad.tensor([1], dtype="float16").dtype == minigrad.float16


@pytest.mark.parametrize("fn", [minigrad.zeros, minigrad.ones, minigrad.empty, minigrad.rand, minigrad.randn])
def test_shape_functions_take_varargs_or_a_tuple(fn):
    for t in (fn(2, 3), fn((2, 3)), fn([2, 3])):
        assert t.shape == (2, 3) and t.dtype == minigrad.float32 and not t.requires_grad
    assert fn(()).shape == ()
    assert fn(4, dtype=minigrad.float64).dtype == minigrad.float64
    assert fn(2, requires_grad=True).requires_grad


def test_zeros_ones_full_values():
    np.testing.assert_array_equal(minigrad.zeros(2, 2).numpy(), np.zeros((2, 2)))
    np.testing.assert_array_equal(minigrad.ones(3).numpy(), np.ones(3))
    f = minigrad.full((2, 3), 1.5)
    assert f.dtype == minigrad.float32 and f.shape == (2, 3) and (f.numpy() == 1.5).all()
    assert minigrad.full((2,), 3).dtype == minigrad.int64
    assert minigrad.full((2,), True).dtype == minigrad.bool_
    assert minigrad.full((2,), 3, dtype=minigrad.float64).dtype == minigrad.float64


def test_arange_like_torch():
    a = minigrad.arange(5)
    assert a.dtype == minigrad.int64 and a.tolist() == [0, 1, 2, 3, 4]
    assert minigrad.arange(1, 4).tolist() == [1, 2, 3]
    assert minigrad.arange(0, 10, 3).tolist() == [0, 3, 6, 9]
    f = minigrad.arange(0, 1, 0.25)
    assert f.dtype == minigrad.float32 and f.tolist() == [0.0, 0.25, 0.5, 0.75]
    assert minigrad.arange(3.0).dtype == minigrad.float32
    assert minigrad.arange(3, dtype=minigrad.float64).dtype == minigrad.float64


def test_linspace_and_eye():
    lin = minigrad.linspace(0, 1, 5)
    assert lin.dtype == minigrad.float32
    np.testing.assert_allclose(lin.numpy(), [0, 0.25, 0.5, 0.75, 1.0])
    np.testing.assert_array_equal(minigrad.eye(3).numpy(), np.eye(3))
    e = minigrad.eye(2, 3)
    assert e.shape == (2, 3) and e.dtype == minigrad.float32


def test_random_creation_ranges_and_dtypes():
    r = minigrad.rand(1000)
    assert 0.0 <= r.numpy().min() and r.numpy().max() < 1.0
    n = minigrad.randn(2000)
    assert abs(float(n.mean().item())) < 0.1 and 0.9 < float(n.std().item()) < 1.1
    i = minigrad.randint(0, 10, (3, 4))
    assert i.dtype == minigrad.int64 and i.shape == (3, 4)
    assert 0 <= i.numpy().min() and i.numpy().max() < 10
    p = minigrad.randperm(6)
    assert p.dtype == minigrad.int64 and sorted(p.tolist()) == list(range(6))


def test_randint_with_only_high_like_torch():
    i = minigrad.randint(5, (3,))  # torch.randint(high, size)
    assert i.shape == (3,) and 0 <= i.numpy().min() and i.numpy().max() < 5


def test_like_functions_keep_shape_and_dtype():
    x = minigrad.ones(2, 3, dtype=minigrad.float64)
    for fn in (minigrad.zeros_like, minigrad.ones_like, minigrad.empty_like, minigrad.rand_like, minigrad.randn_like):
        y = fn(x)
        assert y.shape == (2, 3) and y.dtype == minigrad.float64
    assert minigrad.zeros_like(minigrad.tensor([1, 2])).dtype == minigrad.int64
    assert minigrad.zeros_like(x, dtype=minigrad.float32).dtype == minigrad.float32
    f = minigrad.full_like(x, 7.0)
    assert f.dtype == minigrad.float64 and (f.numpy() == 7.0).all()


def test_manual_seed_makes_randomness_reproducible():
    minigrad.manual_seed(123)
    a, ia = minigrad.randn(5), minigrad.randint(0, 100, (5,))
    b = minigrad.randn(5)
    minigrad.manual_seed(123)
    np.testing.assert_array_equal(minigrad.randn(5).numpy(), a.numpy())
    np.testing.assert_array_equal(minigrad.randint(0, 100, (5,)).numpy(), ia.numpy())
    assert not np.array_equal(a.numpy(), b.numpy())


# -- metadata and conversion ---------------------------------------------------------------------
def test_metadata():
    x = minigrad.zeros(2, 3)
    assert x.shape == (2, 3) and x.ndim == 2 and x.dim() == 2
    assert x.dtype == minigrad.float32
    assert x.device == minigrad.get_default_device()  # cpu, unless the suite runs on cuda
    assert x.size() == (2, 3) and x.size(1) == 3 and x.size(-1) == 3
    assert x.numel() == 6 and len(x) == 2
    assert x.is_leaf and not x.requires_grad and x.grad is None and x.grad_fn is None


def test_item_numpy_tolist():
    assert minigrad.tensor(2.5).item() == 2.5
    assert minigrad.tensor([[7]]).item() == 7 and isinstance(minigrad.tensor([[7]]).item(), int)
    x = minigrad.tensor([[1.0, 2.0], [3.0, 4.0]])
    arr = x.numpy()
    assert isinstance(arr, np.ndarray) and arr.dtype == np.float32
    np.testing.assert_array_equal(arr, [[1, 2], [3, 4]])
    assert x.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert minigrad.tensor(3).tolist() == 3
    assert float(minigrad.tensor(1.5)) == 1.5 and int(minigrad.tensor(4)) == 4


def test_repr_shows_values_dtype_and_grad_fn():
    assert "1.5" in repr(minigrad.tensor([1.5, 2.0]))
    r64 = repr(minigrad.tensor([1.0], dtype=minigrad.float64))
    assert "float64" in r64
    x = minigrad.tensor([1.0, 2.0], requires_grad=True)
    assert "requires_grad=True" in repr(x)
    assert "grad_fn=<MulBackward" in repr(x * 2)
    assert repr(x * 2).startswith("tensor(")


# -- dtypes --------------------------------------------------------------------------------------
def test_dtype_objects_and_aliases():
    assert minigrad.float64 == minigrad.double and minigrad.float32 == minigrad.float
    assert minigrad.int64 == minigrad.long and minigrad.float16 == minigrad.half
    assert minigrad.tensor([1.0], dtype=minigrad.double).dtype == minigrad.float64


def test_to_dtype_and_astype():
    x = minigrad.tensor([1.5, -2.5])
    assert x.to(minigrad.float64).dtype == minigrad.float64
    assert x.to(dtype=minigrad.float16).dtype == minigrad.float16
    assert x.astype(minigrad.float64).dtype == minigrad.float64
    assert x.double().dtype == minigrad.float64 and x.half().dtype == minigrad.float16
    assert x.long().tolist() == [1, -2] and x.long().dtype == minigrad.int64
    assert x.int().dtype == minigrad.int32 and x.bool().dtype == minigrad.bool_
    assert x.to(minigrad.float32) is x  # no-op casts return the tensor itself, as torch does
    other = minigrad.zeros(1, dtype=minigrad.float64)
    assert x.to(other).dtype == minigrad.float64


def test_cast_is_differentiable():
    x = minigrad.tensor([1.0, 2.0], requires_grad=True)
    (x.to(minigrad.float64) * 3).sum().backward()
    assert x.grad.dtype == minigrad.float32
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 3.0])


@pytest.mark.parametrize("a, b, expected", [
    (minigrad.tensor([1, 2]), minigrad.tensor([0.5, 0.5]), minigrad.float32),  # int + float -> float
    (minigrad.tensor([1, 2], dtype=minigrad.int32), minigrad.tensor([0.5, 0.5]), minigrad.float32),
    (minigrad.tensor([1.0, 2.0]), minigrad.tensor(0.5, dtype=minigrad.float64), minigrad.float32),  # 0-D
    (minigrad.tensor([1.0, 2.0]), minigrad.tensor([0.5, 0.5], dtype=minigrad.float64), minigrad.float64),
    (minigrad.tensor([1, 2], dtype=minigrad.int32), minigrad.tensor([1, 1]), minigrad.int64),
    (minigrad.tensor([1, 2]), minigrad.tensor(1.5, dtype=minigrad.float64), minigrad.float64),  # higher kind wins
    (minigrad.tensor([True]), minigrad.tensor([2]), minigrad.int64),
])
def test_promotion_follows_torch(a, b, expected):
    assert (a + b).dtype == expected
    assert (b * a).dtype == expected


def test_scalar_promotion_follows_torch():
    i = minigrad.tensor([1, 2])
    assert (i + 1).dtype == minigrad.int64
    assert (i + 1.5).dtype == minigrad.float32
    assert (i / 2).dtype == minigrad.float32  # true division of ints gives float
    assert (minigrad.tensor([1.0], dtype=minigrad.float64) * 2).dtype == minigrad.float64


# -- memory sharing ------------------------------------------------------------------------------
def test_reshape_and_view_share_memory_with_the_base():
    x = minigrad.arange(6.0)
    v = x.view(2, 3)
    r = x.reshape(3, 2)
    assert shares_memory(v, x) and shares_memory(r, x)
    v.add_(1.0)
    np.testing.assert_array_equal(x.numpy(), np.arange(6.0) + 1)
    np.testing.assert_array_equal(r.numpy().ravel(), np.arange(6.0) + 1)


def test_transpose_and_slices_are_views():
    x = minigrad.zeros(3, 4)
    t = x.transpose(0, 1)
    s = x[1:, ::2]
    assert shares_memory(t, x) and shares_memory(s, x)
    s.fill_(5.0)
    assert x.numpy()[1, 0] == 5.0 and x.numpy()[0, 0] == 0.0


def test_clone_does_not_share_memory():
    x = minigrad.zeros(3)
    c = x.clone()
    assert not shares_memory(c, x)


def test_data_is_a_detached_tensor_sharing_memory_as_in_torch():
    w = minigrad.ones(2, 3, requires_grad=True)
    d = w.data
    assert isinstance(d, minigrad.Tensor) and not d.requires_grad and d.grad_fn is None
    assert d.size(0) == 2 and shares_memory(d, w)
    y = (w * w).sum()
    d.mul_(3.0)  # through .data autograd does not see the write: no version error in backward
    y.backward()
    assert w.detach().numpy().tolist() == [[3.0] * 3] * 2 and w.grad.numpy().tolist() == [[6.0] * 3] * 2
    minigrad.nn.init.xavier_uniform_(w.data)
    assert w.shape == (2, 3) and float(w.detach().abs().max()) <= (6 / 5) ** 0.5
    w.data = minigrad.zeros(4)  # assigning replaces the storage, shape included, as torch does
    assert w.shape == (4,) and w.requires_grad
    with pytest.raises(TypeError, match="expected a Tensor"):
        w.data = np.zeros(4)


def test_the_tensor_class_called_on_python_data_is_a_float_tensor_as_in_torch():
    # torch.Tensor([0]) is a FloatTensor (the tutorials' `total_loss = torch.Tensor([0])`); tensor() infers
    assert minigrad.Tensor([0]).dtype == minigrad.float32 and minigrad.Tensor([[1, 2]]).dtype == minigrad.float32
    assert minigrad.tensor([0]).dtype == minigrad.int64 and minigrad.tensor([True]).dtype == minigrad.bool
    total = minigrad.Tensor([0])
    total += minigrad.tensor(1.5)
    assert total.tolist() == [1.5]
