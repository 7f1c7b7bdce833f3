"""Layers and nn.functional against PyTorch: forward values and gradients (weights copied over
through the state dict), BatchNorm's running statistics over several steps, init distributions of
the layers, dropout statistics, and second derivatives through the normalisations."""

import math

import numpy as np
import pytest

import minigrad as mg
from minigrad import nn
from minigrad.autograd.gradcheck import gradcheck, gradgradcheck
from minigrad.nn import functional as F


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


def rand(*shape, seed=0, scale=1.0):
    return np.random.default_rng(seed).standard_normal(shape) * scale


def copy_into_torch(torch, m, t):
    t.load_state_dict({k: torch.from_numpy(np.array(v.numpy())) for k, v in m.state_dict().items()})


def run_both(torch, m, t, x, rtol=1e-10, atol=1e-12, check_params=True):
    """Forward and backward (of a random weighting of the output) through both; compare."""
    xm = mg.tensor(x, requires_grad=x.dtype.kind == "f")
    xt = torch.tensor(x, requires_grad=x.dtype.kind == "f")
    om, ot = m(xm), t(xt)
    np.testing.assert_allclose(om.data, ot.detach().numpy(), rtol=rtol, atol=atol)
    w = rand(*om.shape, seed=9)
    (om * mg.tensor(w, dtype=om.dtype)).sum().backward()
    (ot * torch.tensor(w, dtype=ot.dtype)).sum().backward()
    if x.dtype.kind == "f":
        np.testing.assert_allclose(xm.grad.data, xt.grad.numpy(), rtol=rtol, atol=atol)
    if check_params:
        tparams = dict(t.named_parameters())
        for name, p in m.named_parameters():
            np.testing.assert_allclose(p.grad.data, tparams[name].grad.numpy(), rtol=rtol, atol=atol, err_msg=name)
    return om, ot


# -- Linear, Identity, Flatten ---------------------------------------------------------------------------
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(5, 3), (2, 4, 3), (3,)])
def test_linear_matches_torch(torch, bias, shape):
    m = nn.Linear(3, 4, bias=bias).double()
    t = torch.nn.Linear(3, 4, bias=bias).double()
    copy_into_torch(torch, m, t)
    run_both(torch, m, t, rand(*shape))


def test_linear_init_distribution():
    m = nn.Linear(400, 300)
    bound = 1 / math.sqrt(400)
    w, b = m.weight.data, m.bias.data
    assert w.dtype == np.float32 and np.abs(w).max() <= bound and np.abs(b).max() <= bound
    np.testing.assert_allclose(w.std(), bound / math.sqrt(3), rtol=0.02)
    assert abs(w.mean()) < 0.01 * bound * 10
    np.testing.assert_allclose(b.std(), bound / math.sqrt(3), rtol=0.15)


def test_linear_errors_and_repr():
    m = nn.Linear(3, 4, bias=False)
    assert m.bias is None and list(m.state_dict()) == ["weight"]
    assert repr(m) == "Linear(in_features=3, out_features=4, bias=False)"
    with pytest.raises(ValueError, match=r"5 features \(shape \(2, 5\)\).*expects 3"):
        m(mg.ones(2, 5))


def test_identity_and_flatten():
    x = mg.randn(2, 3, 4, 5)
    assert nn.Identity(54, unused=1)(x) is x
    assert nn.Flatten()(x).shape == (2, 60)
    assert nn.Flatten(0, 2)(x).shape == (24, 5)
    assert repr(nn.Flatten()) == "Flatten(start_dim=1, end_dim=-1)"


# -- activations -------------------------------------------------------------------------------------
ACTIVATIONS = [
    ("ReLU", {}), ("LeakyReLU", {"negative_slope": 0.2}), ("GELU", {}), ("GELU", {"approximate": "tanh"}),
    ("SiLU", {}), ("Tanh", {}), ("Sigmoid", {}), ("Softmax", {"dim": 1}), ("LogSoftmax", {"dim": -1}),
    ("Softmax", {"dim": 0}),
]


@pytest.mark.parametrize("name,kwargs", ACTIVATIONS)
def test_activation_layers_match_torch(torch, name, kwargs):
    m, t = getattr(nn, name)(**kwargs), getattr(torch.nn, name)(**kwargs)
    assert repr(m) == repr(t)
    run_both(torch, m, t, rand(4, 5, scale=3))


def test_inplace_activations(torch):
    x = mg.randn(3, 4)
    y = x * 1
    out = nn.ReLU(inplace=True)(y)
    assert out is y and (y.data >= 0).all()
    a = mg.randn(3, 4, requires_grad=True)
    b = a * 2
    nn.LeakyReLU(0.1, inplace=True)(b).sum().backward()
    np.testing.assert_allclose(a.grad.data, np.where(a.data > 0, 2.0, 0.2), rtol=1e-6)


def test_softmax_implicit_dim_warns():
    with pytest.warns(UserWarning, match="Implicit dimension"):
        out = F.softmax(mg.randn(2, 3))
    np.testing.assert_allclose(out.data.sum(1), 1, rtol=1e-6)


# -- Embedding ---------------------------------------------------------------------------------------
def test_embedding_matches_torch(torch):
    m = nn.Embedding(10, 4, padding_idx=2).double()
    t = torch.nn.Embedding(10, 4, padding_idx=2).double()
    assert not m.weight.data[2].any()
    copy_into_torch(torch, m, t)
    idx = np.array([[1, 2, 3], [2, 2, 9]])
    run_both(torch, m, t, idx)
    assert not m.weight.grad.data[2].any()
    np.testing.assert_allclose(m.weight.data.std(), 1.0, atol=0.35)  # N(0, 1) init


def test_embedding_max_norm_matches_torch(torch):
    m = nn.Embedding(6, 3, max_norm=1.0).double()
    t = torch.nn.Embedding(6, 3, max_norm=1.0).double()
    copy_into_torch(torch, m, t)
    idx = np.array([0, 3, 3, 5])
    run_both(torch, m, t, idx)
    np.testing.assert_allclose(m.weight.data, t.weight.detach().numpy(), rtol=1e-6)


def test_embedding_errors_and_pretrained():
    m = nn.Embedding(5, 2)
    with pytest.raises(IndexError, match="5 rows"):
        m(mg.tensor([0, 5]))
    with pytest.raises(TypeError, match="integer"):
        m(mg.tensor([0.0, 1.0]))
    e = nn.Embedding.from_pretrained(mg.eye(3))
    assert not e.weight.requires_grad
    np.testing.assert_array_equal(e(mg.tensor([2])).data, [[0, 0, 1]])


# -- Dropout ---------------------------------------------------------------------------------------
def test_dropout_statistics_and_modes():
    d = nn.Dropout(0.25)
    x = mg.ones(200, 500, requires_grad=True)
    y = d(x)
    kept = y.data != 0
    assert abs(kept.mean() - 0.75) < 0.01
    np.testing.assert_allclose(y.data[kept], 1 / 0.75, rtol=1e-6)
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.data, y.data)  # gradient is the same mask and scale
    d.eval()
    assert d(x) is x
    assert not nn.Dropout(1.0)(x).data.any()
    assert nn.Dropout(0.0)(x) is x
    with pytest.raises(ValueError, match="between 0 and 1"):
        nn.Dropout(1.5)


def test_dropout_is_reproducible_with_manual_seed():
    x = mg.ones(50)
    mg.manual_seed(3)
    a = F.dropout(x, 0.5).data.copy()
    mg.manual_seed(3)
    np.testing.assert_array_equal(F.dropout(x, 0.5).data, a)


# -- BatchNorm ---------------------------------------------------------------------------------------
BN_CASES = [
    ("BatchNorm1d", (8, 3), {}),
    ("BatchNorm1d", (6, 3, 5), {"momentum": 0.3}),
    ("BatchNorm2d", (4, 3, 5, 5), {}),
    ("BatchNorm2d", (4, 3, 2, 3), {"momentum": None}),
    ("BatchNorm2d", (4, 3, 2, 3), {"affine": False}),
    ("BatchNorm1d", (8, 3), {"bias": False}),
]


@pytest.mark.parametrize("name,shape,kwargs", BN_CASES)
def test_batchnorm_train_and_eval_match_torch(torch, name, shape, kwargs):
    m, t = getattr(nn, name)(3, **kwargs).double(), getattr(torch.nn, name)(3, **kwargs).double()
    if m.weight is not None:  # non-trivial affine parameters
        m.weight.data[...] = rand(3, seed=5)
        if m.bias is not None:
            m.bias.data[...] = rand(3, seed=6)
    copy_into_torch(torch, m, t)
    for step in range(3):
        run_both(torch, m, t, rand(*shape, seed=step, scale=2) + step)
        for k, v in t.state_dict().items():
            np.testing.assert_allclose(m.state_dict()[k].data, v.numpy(), rtol=1e-10, atol=1e-12, err_msg=k)
    assert m.num_batches_tracked.item() == 3
    m.eval(), t.eval()
    for p in list(m.parameters()) + list(t.parameters()):
        p.grad = None
    run_both(torch, m, t, rand(*shape, seed=11))


def test_batchnorm_without_running_stats_uses_batch_stats_in_eval(torch):
    m = nn.BatchNorm1d(3, track_running_stats=False).double()
    t = torch.nn.BatchNorm1d(3, track_running_stats=False).double()
    assert m.running_mean is None and list(m.state_dict()) == ["weight", "bias"]
    m.eval(), t.eval()
    run_both(torch, m, t, rand(5, 3))


def test_batchnorm_errors_and_float32():
    bn = nn.BatchNorm2d(3)
    with pytest.raises(ValueError, match="expected 4D input"):
        bn(mg.ones(2, 3))
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        nn.BatchNorm1d(3)(mg.ones(1, 3))
    with pytest.raises(ValueError, match="3 channels"):
        bn(mg.ones(2, 4, 2, 2))
    y = bn(mg.randn(4, 3, 2, 2))
    assert y.dtype == mg.float32 and bn.running_var.dtype == mg.float32


# -- LayerNorm ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,normalized,kwargs", [
    ((4, 6), 6, {}),
    ((2, 3, 4, 5), (4, 5), {"eps": 1e-3}),
    ((3, 5), 5, {"elementwise_affine": False}),
    ((3, 5), (5,), {"bias": False}),
])
def test_layernorm_matches_torch(torch, shape, normalized, kwargs):
    m, t = nn.LayerNorm(normalized, **kwargs).double(), torch.nn.LayerNorm(normalized, **kwargs).double()
    assert repr(m) == repr(t)
    if m.weight is not None:
        m.weight.data[...] = rand(*m.weight.shape, seed=3)
    copy_into_torch(torch, m, t)
    run_both(torch, m, t, rand(*shape, scale=2) + 1)


def test_layernorm_shape_error():
    with pytest.raises(ValueError, match=r"normalized_shape \(4,\)"):
        nn.LayerNorm(4)(mg.ones(2, 5))


# -- second derivatives ------------------------------------------------------------------------------
def test_norms_have_second_derivatives():
    x = mg.tensor(rand(4, 3, 2), requires_grad=True)
    w = mg.tensor(rand(3, seed=1), requires_grad=True)
    b = mg.tensor(rand(3, seed=2), requires_grad=True)
    bn = lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True)  # noqa: E731
    assert gradcheck(bn, (x, w, b))
    assert gradgradcheck(bn, (x, w, b))
    w2 = mg.tensor(rand(2, seed=3), requires_grad=True)
    b2 = mg.tensor(rand(2, seed=4), requires_grad=True)
    ln = lambda x, w, b: F.layer_norm(x, (2,), w, b)  # noqa: E731
    assert gradcheck(ln, (x, w2, b2))
    assert gradgradcheck(ln, (x, w2, b2))


# -- functional helpers ------------------------------------------------------------------------------
def test_one_hot_and_pad(torch):
    idx = np.array([[0, 3], [2, 1]])
    np.testing.assert_array_equal(F.one_hot(mg.tensor(idx)).data, torch.nn.functional.one_hot(torch.tensor(idx)).numpy())
    assert F.one_hot(mg.tensor([1]), 5).shape == (1, 5) and F.one_hot(mg.tensor([1])).dtype == mg.int64
    with pytest.raises(ValueError, match="class values"):
        F.one_hot(mg.tensor([5]), 3)
    x = rand(2, 3, 4)
    out = F.pad(mg.tensor(x), (1, 2, 0, 1), value=0.5)
    np.testing.assert_array_equal(out.data, torch.nn.functional.pad(torch.tensor(x), (1, 2, 0, 1), value=0.5).numpy())


def test_functional_reexports_conv():
    for name in ("conv2d", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d"):
        assert callable(getattr(F, name))


def test_standardize_gradients_through_all_outputs():
    # batch_norm's fused op also returns the mean and variance; gradients through them must be right
    x = mg.tensor(rand(4, 3, 2) + 2, requires_grad=True)
    fn = lambda x: F.Standardize.apply(x, (0, 2), 1e-5)  # noqa: E731
    assert gradcheck(fn, (x,))
    assert gradgradcheck(fn, (x,))


def test_hessian_vector_product_through_a_model_matches_torch(torch):
    m = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Tanh(), nn.LayerNorm(4), nn.Linear(4, 2)).double()
    t = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Tanh(), torch.nn.LayerNorm(4),
                            torch.nn.Linear(4, 2)).double()
    copy_into_torch(torch, m, t)
    x, y = rand(6, 3), np.array([0, 1, 1, 0, 1, 0])
    vs = [rand(*p.shape, seed=20 + i) for i, p in enumerate(m.parameters())]
    ps = list(m.parameters())
    g = mg.grad(F.mse_loss(m(mg.tensor(x)).tanh(), F.one_hot(mg.tensor(y), 2).double()), ps, create_graph=True)
    hv = mg.grad(sum((gi * mg.tensor(v)).sum() for gi, v in zip(g, vs)), ps)
    tps = list(t.parameters())
    tloss = torch.nn.functional.mse_loss(t(torch.tensor(x)).tanh(), torch.nn.functional.one_hot(torch.tensor(y), 2).double())
    tg = torch.autograd.grad(tloss, tps, create_graph=True)
    thv = torch.autograd.grad(sum((gi * torch.tensor(v)).sum() for gi, v in zip(tg, vs)), tps)
    for a, b in zip(hv, thv):
        np.testing.assert_allclose(a.data, b.numpy(), rtol=1e-8, atol=1e-10)
