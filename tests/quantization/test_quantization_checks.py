"""Quantization refuses what would give a meaningless grid: a NaN or infinity in calibration data
(every observer, swept by hypothesis), a NaN weight under ``quantize_dynamic``, a non-finite or
non-positive scale in ``fake_quantize``, and an integer range with ``quant_min`` not below
``quant_max``. Each raises ``ArgumentError`` naming the value and where it is, or the range."""

import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import minigrad
import minigrad.quantization as Q
from minigrad import nn
from minigrad.errors import ArgumentError

OBSERVERS = [Q.MinMaxObserver, Q.MovingAverageMinMaxObserver, Q.PerChannelMinMaxObserver,
             lambda: Q.HistogramObserver(bins=64)]


@settings(max_examples=60, deadline=None)
@given(which=st.sampled_from(range(len(OBSERVERS))),
       data=arrays(np.float32, st.tuples(st.integers(1, 4), st.integers(1, 5)),
                   elements=st.floats(-100, 100, width=32)),
       bad=st.sampled_from([math.nan, math.inf, -math.inf]), where=st.integers(0, 19), first=st.booleans())
def test_observers_refuse_non_finite_values_and_keep_their_range(which, data, bad, where, first):
    observer = OBSERVERS[which]()
    if first:  # a good batch first: the bad one must leave its range as it was
        observer(minigrad.tensor(data))
    before = (observer.min_val.numpy().copy(), observer.max_val.numpy().copy())
    poisoned = data.copy()
    index = tuple(int(i) for i in np.unravel_index(where % data.size, data.shape))
    poisoned[index] = bad
    with pytest.raises(ArgumentError, match=re.escape(f"holds {float(bad)} at index {index}")):
        observer(minigrad.tensor(poisoned))
    np.testing.assert_array_equal(observer.min_val.numpy(), before[0])
    np.testing.assert_array_equal(observer.max_val.numpy(), before[1])
    if first:
        assert np.isfinite(observer.calculate_qparams().scale).all()
    else:
        with pytest.raises(RuntimeError, match="no values observed yet"):
            observer.calculate_qparams()


def test_a_nan_range_loaded_into_an_observer_is_named():
    observer = Q.MinMaxObserver()
    observer(minigrad.tensor([1.0, 2.0]))
    observer.load_state_dict({"min_val": minigrad.tensor(math.nan), "max_val": minigrad.tensor(2.0)})
    with pytest.raises(ArgumentError, match=r"MinMaxObserver: min_val holds nan"):
        observer.calculate_qparams()


def test_calculate_qparams_refuses_an_infinite_range():
    with pytest.raises(ArgumentError, match=r"the range's high end holds inf"):
        Q.calculate_qparams(np, np.float32(-1.0), np.float32(np.inf))


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_quantize_dynamic_names_the_layer_whose_weight_is_not_finite(bad):
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    with minigrad.no_grad():
        model[2].weight[1, 3] = bad
    with pytest.raises(ArgumentError, match=re.escape(f"quantize_dynamic: 2.weight holds {bad} at index (1, 3)")):
        Q.quantize_dynamic(model)
    lstm = nn.LSTM(3, 2)
    with minigrad.no_grad():
        lstm.weight_hh_l0[0, 1] = bad
    with pytest.raises(ArgumentError, match=re.escape(f"LSTM.weight_hh_l0 holds {bad} at index (0, 1)")):
        Q.quantize_dynamic(lstm)


def test_a_dynamically_quantized_layer_names_a_non_finite_input():
    model = Q.quantize_dynamic(nn.Sequential(nn.Linear(3, 2)))
    x = minigrad.randn(2, 3)
    x[1, 2] = math.inf
    with pytest.raises(ArgumentError, match=re.escape("DynamicInt8Linear: the input holds inf at index (1, 2)")):
        model(x)


@pytest.mark.parametrize("scale, says", [(math.nan, "scale holds nan"), (math.inf, "scale holds inf"),
                                         ([0.1, math.nan], "scale holds nan at index (1,)"),
                                         (0.0, "scale must be positive, got 0.0"),
                                         (-0.5, "scale must be positive, got -0.5")])
def test_fake_quantize_refuses_a_scale_that_is_not_a_positive_number(scale, says):
    x = minigrad.randn(2, 3)
    axis = 0 if isinstance(scale, list) else None
    with pytest.raises(ArgumentError, match=re.escape(says)):
        Q.fake_quantize(x, scale, [0, 0] if axis == 0 else 0, 0, 255, axis)


def test_a_range_with_quant_min_above_quant_max_is_refused():
    with pytest.raises(ArgumentError, match=r"fake_quantize: expected quant_min <= quant_max, got quant_min=10, quant_max=5"):
        Q.fake_quantize(minigrad.randn(3), 0.1, 0, 10, 5)
    for qmin, qmax in [(10, 5), (7, 7)]:
        with pytest.raises(ArgumentError, match=rf"MinMaxObserver: expected quant_min < quant_max, got quant_min={qmin}"):
            Q.MinMaxObserver(quant_min=qmin, quant_max=qmax)
    with pytest.raises(ArgumentError, match=r"calculate_qparams: expected quant_min < quant_max"):
        Q.calculate_qparams(np, np.float32(-1), np.float32(1), quant_min=200, quant_max=100)


def test_fake_quantize_on_a_good_grid_is_unchanged():
    x = minigrad.tensor([-1.0, 0.26, 3.0])
    np.testing.assert_allclose(Q.fake_quantize(x, 0.1, 10, 0, 20).numpy(), [-1.0, 0.3, 1.0], atol=1e-6)
