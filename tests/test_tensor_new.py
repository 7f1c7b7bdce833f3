"""Tensor.t(), the new_* constructors and the device flags, as torch has them: ``t`` is checked
with every op in ``op_table.py``; here, the dtype, device, copy and gradient rules of ``new_*``."""

import numpy as np
import pytest

import minigrad as mg
from minigrad.errors import ShapeError


@pytest.mark.parametrize("make", ["new_zeros", "new_ones", "new_empty"])
def test_new_filled_tensors_take_this_tensors_dtype_unless_told(make):
    x = mg.ones(2, dtype=mg.float64)
    a, b = getattr(x, make)(2, 3), getattr(x, make)((2, 3), dtype=mg.int64, requires_grad=False)
    assert a.shape == b.shape == (2, 3) and a.dtype == mg.float64 and b.dtype == mg.int64
    assert a.device == x.device and not a.requires_grad
    assert getattr(x, make)(4, requires_grad=True).requires_grad
    assert np.all(a.numpy() == (1.0 if make == "new_ones" else 0.0))


def test_new_full_and_new_tensor():
    x = mg.zeros(1, dtype=mg.float64)
    assert x.new_full((2,), 7).tolist() == [7.0, 7.0] and x.new_full((2,), 7).dtype == mg.float64
    src = mg.tensor([1.0, 2.0], requires_grad=True)
    y = x.new_tensor(src)
    assert y.dtype == mg.float64 and not y.requires_grad and y.grad_fn is None
    y.add_(1.0)
    assert src.tolist() == [1.0, 2.0]  # a copy, never a view
    assert x.new_tensor([1, 2]).dtype == mg.float64 and x.new_tensor([1, 2], dtype=mg.int64).dtype == mg.int64


def test_matches_torch_dtypes():
    torch = pytest.importorskip("torch")
    for dtype, tdtype in ((mg.float32, torch.float32), (mg.int64, torch.int64)):
        x, tx = mg.zeros(2, dtype=dtype), torch.zeros(2, dtype=tdtype)
        for make in ("new_zeros", "new_ones", "new_empty"):
            assert str(getattr(x, make)(3).dtype) == str(getattr(tx, make)(3).dtype).replace("torch.", "")
        assert x.new_full((2,), 1.5).tolist() == tx.new_full((2,), 1.5).tolist()
        assert x.new_tensor([1.7]).tolist() == tx.new_tensor([1.7]).tolist()


def test_t_transposes_up_to_two_dims_and_refuses_more():
    x = mg.arange(6).reshape(2, 3)
    assert x.t().tolist() == [[0, 3], [1, 4], [2, 5]]
    assert mg.arange(3).t().tolist() == [0, 1, 2]
    with pytest.raises(ShapeError, match="t\\(\\) expects a tensor with <= 2 dimensions, but self is 3D"):
        mg.zeros(1, 2, 3).t()


def test_device_flags():
    x = mg.zeros(1)
    assert x.is_cpu and not x.is_cuda and not x.is_xpu
