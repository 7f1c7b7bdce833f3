"""Property tests: broadcasting binary ops and basic indexing against numpy, on shapes and index
expressions that hypothesis draws (``mutually_broadcastable_shapes``, ``basic_indices``).

The gradient of a broadcast input is the sum of the broadcast gradient over the axes it was
stretched along, so its shape is always the input's shape (chapter 02's broadcasting lesson).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import minigrad
from minigrad.errors import ShapeError

SETTINGS = settings(max_examples=50, deadline=None)

# op name -> (minigrad op, numpy forward, d out / d a, d out / d b), all elementwise on broadcast arrays.
BINARY = {
    "add": (lambda a, b: a + b, np.add, lambda a, b: np.ones_like(a * b), lambda a, b: np.ones_like(a * b)),
    "sub": (lambda a, b: a - b, np.subtract, lambda a, b: np.ones_like(a * b), lambda a, b: -np.ones_like(a * b)),
    "mul": (lambda a, b: a * b, np.multiply, lambda a, b: b + 0 * a, lambda a, b: a + 0 * b),
    "div": (lambda a, b: a / b, np.divide, lambda a, b: 1 / b + 0 * a, lambda a, b: -a / (b * b)),
    "pow": (lambda a, b: a ** b, np.power, lambda a, b: b * a ** (b - 1), lambda a, b: a ** b * np.log(a)),
    "maximum": (minigrad.ops.maximum, np.maximum, lambda a, b: (a > b) * 1.0, lambda a, b: (a < b) * 1.0),
    "minimum": (minigrad.ops.minimum, np.minimum, lambda a, b: (a < b) * 1.0, lambda a, b: (a > b) * 1.0),
}


def unbroadcast(g: np.ndarray, shape: tuple) -> np.ndarray:
    """Sum ``g`` over the axes that broadcasting added or stretched to reach it from ``shape``."""
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape) if n == 1 and g.shape[lead + i] != 1)
    return g.sum(axis=axes, keepdims=True).reshape(shape)


def _values(rng: np.random.Generator, shape: tuple, offset: float) -> np.ndarray:
    """Positive (for pow and div), and no ties between the two operands (for maximum/minimum)."""
    return np.asarray(rng.uniform(0.5, 2.0, size=shape) + offset)


@SETTINGS
@given(
    name=st.sampled_from(sorted(BINARY)),
    shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=4, max_side=4),
    seed=st.integers(0, 2**16),
)
def test_binary_op_broadcasts_like_numpy(name, shapes, seed):
    op, np_op, da, db = BINARY[name]
    (sa, sb), out_shape = shapes.input_shapes, shapes.result_shape
    rng = np.random.default_rng(seed)
    a_np, b_np = _values(rng, sa, 0.0), _values(rng, sb, 0.013)
    a = minigrad.tensor(a_np, dtype=minigrad.float64, requires_grad=True)
    b = minigrad.tensor(b_np, dtype=minigrad.float64, requires_grad=True)

    out = op(a, b)
    assert out.shape == out_shape
    np.testing.assert_allclose(out.detach().numpy(), np_op(a_np, b_np), rtol=1e-12)

    g = rng.standard_normal(out_shape)
    out.backward(minigrad.tensor(g, dtype=minigrad.float64))
    assert a.grad.shape == sa and b.grad.shape == sb
    np.testing.assert_allclose(a.grad.numpy(), unbroadcast(g * da(a_np, b_np), sa), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(b.grad.numpy(), unbroadcast(g * db(a_np, b_np), sb), rtol=1e-10, atol=1e-12)


@SETTINGS
@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=3, max_dims=3, max_side=3), seed=st.integers(0, 2**16))
def test_where_broadcasts_three_ways(shapes, seed):
    sc, sa, sb = shapes.input_shapes
    rng = np.random.default_rng(seed)
    cond = np.asarray(rng.random(sc) > 0.5)
    a_np, b_np = np.asarray(rng.standard_normal(sa)), np.asarray(rng.standard_normal(sb))
    a = minigrad.tensor(a_np, requires_grad=True)
    b = minigrad.tensor(b_np, requires_grad=True)
    out = minigrad.ops.where(minigrad.tensor(cond), a, b)
    np.testing.assert_allclose(out.detach().numpy(), np.where(cond, a_np, b_np).astype(np.float32))
    out.sum().backward()
    full = np.broadcast_to(cond, shapes.result_shape)
    assert a.grad.shape == sa and b.grad.shape == sb
    np.testing.assert_allclose(a.grad.numpy(), unbroadcast(full * 1.0, sa))
    np.testing.assert_allclose(b.grad.numpy(), unbroadcast(~full * 1.0, sb))


@SETTINGS
@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3, max_side=3))
def test_broadcast_to_and_expand_match_numpy(shapes):
    (sa, _), out_shape = shapes.input_shapes, shapes.result_shape
    x_np = np.arange(float(np.prod(sa))).reshape(sa)
    x = minigrad.tensor(x_np, requires_grad=True)
    y = x.broadcast_to(out_shape)
    np.testing.assert_array_equal(y.detach().numpy(), np.broadcast_to(x_np, out_shape))
    (y * 2.0).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), unbroadcast(np.full(out_shape, 2.0), sa))


# -- indexing -----------------------------------------------------------------------------------
@st.composite
def array_and_basic_index(draw):
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=4, min_side=1, max_side=5))
    index = draw(hnp.basic_indices(shape, allow_newaxis=True, allow_ellipsis=True))
    return shape, index


def _positive_steps(index) -> bool:
    """PyTorch (and so minigrad) has no negative slice steps; flip() does that job."""
    parts = index if isinstance(index, tuple) else (index,)
    return all(not isinstance(p, slice) or p.step is None or p.step > 0 for p in parts)


@SETTINGS
@given(case=array_and_basic_index(), seed=st.integers(0, 2**16))
def test_basic_getitem_matches_numpy(case, seed):
    shape, index = case
    assume(_positive_steps(index))
    rng = np.random.default_rng(seed)
    x_np = np.asarray(rng.standard_normal(shape))
    x = minigrad.tensor(x_np, dtype=minigrad.float64, requires_grad=True)
    y = x[index]
    expected = x_np[index]
    assert y.shape == np.shape(expected)
    np.testing.assert_array_equal(y.detach().numpy(), expected)

    g = np.asarray(rng.standard_normal(np.shape(expected)))
    y.backward(minigrad.tensor(g, dtype=minigrad.float64))
    grad = np.zeros(shape)
    grad[index] = g  # basic indices never repeat an element
    np.testing.assert_array_equal(x.grad.numpy(), grad)


@SETTINGS
@given(
    shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4),
    data=st.data(),
)
def test_integer_array_index_accumulates_repeats(shape, data):
    idx = data.draw(st.lists(st.integers(-shape[0], shape[0] - 1), min_size=1, max_size=6))
    x_np = np.arange(float(np.prod(shape))).reshape(shape)
    x = minigrad.tensor(x_np, requires_grad=True)
    y = x[minigrad.tensor(idx)]
    np.testing.assert_array_equal(y.detach().numpy(), x_np[idx])
    y.sum().backward()
    grad = np.zeros(shape)
    np.add.at(grad, idx, 1.0)
    np.testing.assert_array_equal(x.grad.numpy(), grad)


@SETTINGS
@given(shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4), seed=st.integers(0, 2**16))
def test_bool_mask_index_matches_numpy(shape, seed):
    rng = np.random.default_rng(seed)
    x_np = np.asarray(rng.standard_normal(shape))
    mask = rng.random(shape) > 0.5
    x = minigrad.tensor(x_np, requires_grad=True)
    y = x[minigrad.tensor(mask)]
    np.testing.assert_allclose(y.detach().numpy(), x_np[mask].astype(np.float32))
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), mask.astype(np.float32))


@pytest.mark.parametrize("shape_a, shape_b", [((2, 3), (4,)), ((2, 1, 3), (2, 4)), ((5,), (0,))])
def test_incompatible_shapes_raise_shape_error(shape_a, shape_b):
    with pytest.raises(ShapeError):
        minigrad.ones(*shape_a) + minigrad.ones(*shape_b)
