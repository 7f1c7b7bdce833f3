"""The array-level erf (minigrad/ops/special.py) against ``math.erf`` on a dense grid: float64
to 1e-15 absolute, tiny arguments to relative rounding, special values, dtypes and shapes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from minigrad.ops.special import erf


def reference(x: np.ndarray) -> np.ndarray:
    return np.array([math.erf(v) for v in x.ravel().tolist()]).reshape(x.shape)


def test_float64_matches_math_erf_on_a_dense_grid():
    x = np.linspace(-7.0, 7.0, 140_001)  # step 1e-4, through both branch points (|x| = 1, 6)
    assert np.abs(erf(np, x) - reference(x)).max() < 1e-15


def test_near_the_branch_points_and_tiny_arguments():
    edges = np.concatenate([np.nextafter(1.0, 0.0) + np.arange(-50, 50) * 1e-16,
                            6.0 + np.arange(-50, 50) * 1e-15, [1.0, -1.0, 6.0]])
    assert np.abs(erf(np, edges) - reference(edges)).max() < 1e-15
    tiny = np.concatenate([np.logspace(-300, -1, 300), -np.logspace(-20, -5, 50), [5e-324]])
    np.testing.assert_allclose(erf(np, tiny), reference(tiny), rtol=1e-15, atol=0)


def test_special_values():
    out = erf(np, np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 40.0, -1e300]))
    assert out[0] == 0 and not np.signbit(out[0]) and out[1] == 0 and np.signbit(out[1])
    assert out[2] == 1 and out[3] == -1 and np.isnan(out[4]) and out[5] == 1 and out[6] == -1


def test_odd_symmetry():
    x = np.random.default_rng(0).uniform(-8, 8, 1000)
    np.testing.assert_array_equal(erf(np, -x), -erf(np, x))


@pytest.mark.parametrize("dtype, tol", [("float16", 1e-3), ("float32", 1e-7)])
def test_lower_precisions_keep_their_dtype(dtype, tol):
    x = np.linspace(-4, 4, 2001).astype(dtype)
    out = erf(np, x)
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_allclose(out.astype("float64"), reference(x.astype("float64")), atol=tol)


def test_shapes_are_kept():
    assert erf(np, np.zeros((2, 0, 3))).shape == (2, 0, 3)
    assert np.shape(erf(np, np.array(0.5))) == ()
    x = np.random.default_rng(1).standard_normal((3, 4, 5))
    np.testing.assert_allclose(erf(np, x), reference(x), atol=1e-15)
    np.testing.assert_allclose(erf(np, x.T), reference(x.T), atol=1e-15)  # non-contiguous input


def test_against_torch():
    torch = pytest.importorskip("torch")
    x = np.linspace(-6, 6, 10_001)
    np.testing.assert_allclose(erf(np, x), torch.erf(torch.tensor(x)).numpy(), atol=1e-15)
    x32 = x.astype("float32")
    np.testing.assert_allclose(erf(np, x32), torch.erf(torch.tensor(x32)).numpy(), atol=2e-7)
