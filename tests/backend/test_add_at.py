"""backend.add_at, the scatter-add behind indexing's and an embedding's backward: whole rows picked
by one integer array take a faster route than ``numpy.add.at`` with bit-identical sums (each row's
repeats added in their order), and every other form still goes through ``add.at``."""

import numpy as np
import pytest

import minigrad
from minigrad import backend

rng = np.random.default_rng(0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape, rows", [((20, 16), 2000), ((50,), 7), ((3, 4), 3), ((6,), 100)])
@pytest.mark.parametrize("form", [lambda i: (i,), lambda i: (i, Ellipsis), lambda i: i])
def test_rows_sum_in_add_ats_order_bit_for_bit(dtype, shape, rows, form):
    index = rng.integers(0, rows, shape)
    values = rng.standard_normal(shape + (5,)).astype(dtype)
    base = rng.standard_normal((rows, 5)).astype(dtype)
    expected, got = base.copy(), base.copy()
    np.add.at(expected, form(index), values)
    assert backend._add_rows_at(got, form(index), values)  # the row route was taken
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("index, values", [
    ((np.array([0, -1, 2, 2]),), np.ones((4, 3))),  # a negative index: -1 and 3 are one row
    ((np.array([0, 1, 1]),), np.ones((1, 3))),  # broadcast values
    ((np.array([0, 1, 1]), np.array([2, 0, 0])), np.ones(3)),  # two index arrays: elements, not rows
    ((np.array([0, 1, 1]),), np.ones((3, 3), np.float32)),  # another dtype than out's
])
def test_other_forms_go_through_add_at(index, values):
    out, expected = np.zeros((4, 3)), np.zeros((4, 3))
    assert not backend._add_rows_at(out, index, values)
    backend.add_at(np, out, index, values)
    np.add.at(expected, index, values)
    np.testing.assert_array_equal(out, expected)


def test_an_embeddings_gradient_counts_each_repeated_word(monkeypatch):
    taken = []
    rows_at = backend._add_rows_at
    monkeypatch.setattr(backend, "_add_rows_at", lambda *a: taken.append(rows_at(*a)) or taken[-1])
    weight = minigrad.randn(10, 3, requires_grad=True)
    words = minigrad.tensor([[1, 4, 1], [4, 4, 9]])
    minigrad.nn.functional.embedding(words, weight).sum().backward()
    counts = np.bincount(words.numpy().ravel(), minlength=10)
    np.testing.assert_array_equal(weight.grad.numpy(), np.repeat(counts[:, None], 3, 1).astype(np.float32))
    assert taken == [True]  # indexing's scatter-add took the row route
