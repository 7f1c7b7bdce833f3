"""Ops on the inputs where numpy's own behaviour differs from PyTorch's (integer and bool dtypes,
empty and 0-d tensors, out-of-range values): each gives PyTorch's result or a minigrad error that
names the op, never a numpy error, one case per row; ``test_fuzz_ops.py`` looks for more of them."""

from __future__ import annotations

import numpy as np
import pytest

import minigrad as mg
from minigrad.errors import ArgumentError, DTypeError, ShapeError

T = mg.tensor


@pytest.mark.parametrize("call, values, dtype", [
    (lambda: T(1.).transpose(0, 0), 1.0, "float32"),
    (lambda: T(1.).transpose(-1, 0), 1.0, "float32"),
    (lambda: T([True, False]).sign(), [True, False], "bool"),
    (lambda: ~T([5]), [-6], "int64"),
    (lambda: ~T([5], dtype=mg.uint8), [250], "uint8"),
    (lambda: ~T([True, False]), [False, True], "bool"),
    (lambda: T([6]) & T([3]), [2], "int64"),
    (lambda: T([6]) | T([3]), [7], "int64"),
    (lambda: 3 & T([5]), [1], "int64"),
    (lambda: T([True]) | 2, [3], "int64"),
    (lambda: T([True, False]) & T([True, True]), [True, False], "bool"),
    (lambda: 2 / T([1, 2]), [2.0, 1.0], "float32"),
    (lambda: T([1, 2]) / 2, [0.5, 1.0], "float32"),
    (lambda: T([True]) ** 2, [1], "int64"),
    (lambda: 2 ** T([True, False]), [2, 1], "int64"),
    (lambda: T([0, 2], dtype=mg.uint8).any(), 1, "uint8"),
    (lambda: T([0, 2], dtype=mg.uint8).all(0), 0, "uint8"),
    (lambda: T([0, 2], dtype=mg.int8).any(), True, "bool"),
    (lambda: T([1, 2]).clamp(0, 1.5), [1.0, 1.5], "float32"),
])
def test_results_match_pytorch(call, values, dtype):
    out = call()
    assert out.dtype.name == dtype
    np.testing.assert_array_equal(out.numpy(), np.asarray(values, dtype=dtype))


@pytest.mark.parametrize("call, error, match", [
    (lambda: T(1.).gather(0, T(0)), ShapeError, "gather"),
    (lambda: T(1.).index_select(0, T([0])), ShapeError, "index_select"),
    (lambda: T(1.).narrow(0, 0, 1), ShapeError, "narrow"),
    (lambda: T(1.).chunk(2), ShapeError, "chunk"),
    (lambda: T(1.).split(1), ShapeError, "split"),
    (lambda: T(1.).roll(1, 0), ShapeError, "roll"),
    (lambda: T([1., 2.]).narrow(0, 2, 1), ShapeError, "narrow"),
    (lambda: -T([True]), DTypeError, "neg"),
    (lambda: T([True]) - T([False]), DTypeError, "sub"),
    (lambda: T([True]) - 1, DTypeError, "sub"),
    (lambda: T([True]).abs(), DTypeError, "abs"),
    (lambda: T([True]).argmax(), DTypeError, "argmax"),
    (lambda: T([1.5]) & T([1]), DTypeError, "bitwise_and"),
    (lambda: ~T([1.5]), DTypeError, "bitwise_not"),
    (lambda: mg.allclose(mg.ones(2, 3), mg.ones(4)), ShapeError, "allclose"),
    (lambda: mg.allclose(mg.ones(2), T([1, 1])), DTypeError, "allclose"),
    (lambda: T([1], dtype=mg.uint8) + 2**40, DTypeError, "Add"),
    (lambda: T([1], dtype=mg.uint8) ** 1000, DTypeError, "Pow"),
    (lambda: T([1], dtype=mg.uint8).clamp(-1, 3), DTypeError, "clamp"),
    (lambda: T([1.]).clamp(), ArgumentError, "clamp"),
])
def test_refusals_are_documented_errors_naming_the_op(call, error, match):
    with pytest.raises(error, match=match):
        call()
