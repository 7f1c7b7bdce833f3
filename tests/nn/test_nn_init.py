"""nn.init: distributions (mean and std within sampling tolerance), bounds, torch's gains and fan
computation, defaults, seeding."""

import math

import numpy as np
import pytest

import minigrad as mg
from helpers import to_numpy
from minigrad import nn
from minigrad.nn import init


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


def test_simple_fills():
    t = mg.empty(100, 100)
    v = t._version
    assert init.uniform_(t, -2, 3) is t and t._version > v
    values = to_numpy(t)
    assert values.min() >= -2 and values.max() < 3 and abs(values.mean() - 0.5) < 0.05
    np.testing.assert_allclose(values.std(), 5 / math.sqrt(12), rtol=0.02)
    values = to_numpy(init.normal_(t, 1.0, 2.0))
    assert abs(values.mean() - 1.0) < 0.05 and abs(values.std() - 2.0) < 0.05
    assert t.dtype == mg.float32
    assert (to_numpy(init.constant_(t, 0.3)) == np.float32(0.3)).all()
    assert not to_numpy(init.zeros_(t)).any() and (to_numpy(init.ones_(t)) == 1).all()


def test_trunc_normal_stays_in_bounds():
    values = to_numpy(init.trunc_normal_(mg.empty(5000), std=1.0, a=-0.5, b=1.0))
    assert values.min() >= -0.5 and values.max() <= 1.0 and values.std() > 0.3


def test_init_works_on_parameters_that_require_grad():
    p = nn.Parameter(mg.zeros(3, 4))
    init.xavier_uniform_(p)
    assert p.requires_grad and p.is_leaf and to_numpy(p).any()


@pytest.mark.parametrize("shape", [(5, 3), (8, 4, 3, 3), (2, 6, 5), (0, 3)])
def test_fan_in_and_fan_out_match_torch(torch, shape):
    expected = torch.nn.init._calculate_fan_in_and_fan_out(torch.empty(shape))
    assert init._calculate_fan_in_and_fan_out(mg.empty(shape)) == expected


def test_fan_needs_two_dims():
    with pytest.raises(ValueError, match="fewer than 2 dimensions"):
        init.xavier_uniform_(mg.empty(5))


@pytest.mark.parametrize("nonlinearity,param", [
    ("linear", None), ("conv2d", None), ("sigmoid", None), ("tanh", None), ("relu", None),
    ("leaky_relu", None), ("leaky_relu", 0.2), ("leaky_relu", math.sqrt(5)), ("selu", None),
])
def test_calculate_gain_matches_torch(torch, nonlinearity, param):
    assert init.calculate_gain(nonlinearity, param) == pytest.approx(torch.nn.init.calculate_gain(nonlinearity, param))


def test_calculate_gain_errors():
    with pytest.raises(ValueError, match="unsupported nonlinearity"):
        init.calculate_gain("swish")
    with pytest.raises(ValueError, match="not a valid number"):
        init.calculate_gain("leaky_relu", True)


def _check(t, std, bound=None):
    data = to_numpy(t)
    assert abs(data.mean()) < 4 * std / math.sqrt(data.size)  # 4 standard errors
    np.testing.assert_allclose(data.std(), std, rtol=0.03)
    if bound is not None:
        assert np.abs(data).max() <= bound


def test_xavier():
    fan_in, fan_out = 3 * 9, 64 * 9
    std = math.sqrt(2 / (fan_in + fan_out))
    _check(init.xavier_uniform_(mg.empty(64, 3, 3, 3)), std, math.sqrt(3) * std)
    _check(init.xavier_normal_(mg.empty(64, 3, 3, 3), gain=2.0), 2 * std)


def test_kaiming_defaults_match_torch_formula():
    # torch's defaults: a=0, mode='fan_in', nonlinearity='leaky_relu' -> gain sqrt(2 / (1 + 0))
    std = math.sqrt(2.0) / math.sqrt(200)
    _check(init.kaiming_uniform_(mg.empty(300, 200)), std, math.sqrt(3) * std)
    _check(init.kaiming_normal_(mg.empty(300, 200)), std)
    std_out = math.sqrt(2.0 / (1 + 0.1 ** 2)) / math.sqrt(100)
    _check(init.kaiming_normal_(mg.empty(100, 400), a=0.1, mode="fan_out"), std_out)
    _check(init.kaiming_uniform_(mg.empty(200, 300), nonlinearity="relu"), math.sqrt(2 / 300))
    with pytest.raises(ValueError, match="mode"):
        init.kaiming_uniform_(mg.empty(3, 3), mode="fan_avg")
    assert init.kaiming_uniform_(mg.empty(0, 3)).shape == (0, 3)  # empty tensors are left alone


def test_init_distributions_match_torch_samples(torch):
    torch.manual_seed(0)
    for fn, shape in [("kaiming_uniform_", (256, 128)), ("xavier_normal_", (128, 64, 3))]:
        ours = to_numpy(getattr(init, fn)(mg.empty(shape)))
        theirs = getattr(torch.nn.init, fn)(torch.empty(shape)).numpy()
        np.testing.assert_allclose(ours.std(), theirs.std(), rtol=0.03)
        # the tail through a high quantile: the maximum of normal samples moves by several percent
        # from one random stream to another (each device's generator draws its own stream)
        np.testing.assert_allclose(np.quantile(np.abs(ours), 0.99), np.quantile(np.abs(theirs), 0.99), rtol=0.05)


def test_init_is_reproducible_and_accepts_a_generator():
    mg.manual_seed(7)
    a = nn.Linear(4, 3)
    mg.manual_seed(7)
    b = nn.Linear(4, 3)
    np.testing.assert_array_equal(to_numpy(a.weight), to_numpy(b.weight))
    xp = mg.get_default_device().xp  # a generator of the tensor's device (numpy's or cupy's), as torch asks
    g1, g2 = xp.random.default_rng(1), xp.random.default_rng(1)
    np.testing.assert_array_equal(to_numpy(init.normal_(mg.empty(5), generator=g1)),
                                  to_numpy(init.normal_(mg.empty(5), generator=g2)))
