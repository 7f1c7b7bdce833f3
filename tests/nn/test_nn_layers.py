"""Layers and nn.functional against PyTorch: forward values and gradients (weights copied over
through the state dict), BatchNorm's running statistics over several steps, init distributions of
the layers, dropout statistics, and second derivatives through the normalisations. Every layer and
loss also runs in float32 on each device (the ``device`` fixture: cpu, and cuda where a GPU is
present) against the same module in float64 on the cpu."""

import copy
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


def host(t):
    """A tensor's values as a numpy array, wherever the tensor lives."""
    return np.array(t.detach().cpu().numpy())  # a copy: on the cpu numpy() shares memory


def set_values(t, values):
    """Overwrite a parameter's values (from a numpy array) on its own device."""
    with mg.no_grad():
        t.copy_(mg.tensor(values, dtype=t.dtype))


def copy_into_torch(torch, m, t):
    t.load_state_dict({k: torch.from_numpy(np.array(v.numpy())) for k, v in m.state_dict().items()})


def run_both(torch, m, t, x, rtol=1e-10, atol=1e-12, check_params=True):
    """Forward and backward (of a random weighting of the output) through both; compare."""
    xm = mg.tensor(x, requires_grad=x.dtype.kind == "f")
    xt = torch.tensor(x, requires_grad=x.dtype.kind == "f")
    om, ot = m(xm), t(xt)
    np.testing.assert_allclose(host(om), ot.detach().numpy(), rtol=rtol, atol=atol)
    w = rand(*om.shape, seed=9)
    (om * mg.tensor(w, dtype=om.dtype)).sum().backward()
    (ot * torch.tensor(w, dtype=ot.dtype)).sum().backward()
    if x.dtype.kind == "f":
        np.testing.assert_allclose(host(xm.grad), xt.grad.numpy(), rtol=rtol, atol=atol)
    if check_params:
        tparams = dict(t.named_parameters())
        for name, p in m.named_parameters():
            np.testing.assert_allclose(host(p.grad), tparams[name].grad.numpy(), rtol=rtol, atol=atol, err_msg=name)
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
    w, b = host(m.weight), host(m.bias)
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
    assert out is y and (host(y) >= 0).all()
    a = mg.randn(3, 4, requires_grad=True)
    b = a * 2
    nn.LeakyReLU(0.1, inplace=True)(b).sum().backward()
    np.testing.assert_allclose(host(a.grad), np.where(host(a) > 0, 2.0, 0.2), rtol=1e-6)


def test_softmax_implicit_dim_warns():
    with pytest.warns(UserWarning, match="Implicit dimension"):
        out = F.softmax(mg.randn(2, 3))
    np.testing.assert_allclose(host(out).sum(1), 1, rtol=1e-6)


# -- Embedding ---------------------------------------------------------------------------------------
def test_embedding_matches_torch(torch):
    m = nn.Embedding(10, 4, padding_idx=2).double()
    t = torch.nn.Embedding(10, 4, padding_idx=2).double()
    assert not host(m.weight)[2].any()
    copy_into_torch(torch, m, t)
    idx = np.array([[1, 2, 3], [2, 2, 9]])
    run_both(torch, m, t, idx)
    assert not host(m.weight.grad)[2].any()
    np.testing.assert_allclose(host(m.weight).std(), 1.0, atol=0.35)  # N(0, 1) init


def test_embedding_max_norm_matches_torch(torch):
    m = nn.Embedding(6, 3, max_norm=1.0).double()
    t = torch.nn.Embedding(6, 3, max_norm=1.0).double()
    copy_into_torch(torch, m, t)
    idx = np.array([0, 3, 3, 5])
    run_both(torch, m, t, idx)
    np.testing.assert_allclose(host(m.weight), t.weight.detach().numpy(), rtol=1e-6)


def test_embedding_errors_and_pretrained():
    m = nn.Embedding(5, 2)
    with pytest.raises(IndexError, match=r"embedding: index 5 is out of range for dimension 0 of size 5"):
        m(mg.tensor([0, 5]))
    with pytest.raises(TypeError, match="integer"):
        m(mg.tensor([0.0, 1.0]))
    e = nn.Embedding.from_pretrained(mg.eye(3))
    assert not e.weight.requires_grad
    np.testing.assert_array_equal(host(e(mg.tensor([2]))), [[0, 0, 1]])


# -- Dropout ---------------------------------------------------------------------------------------
def test_dropout_statistics_and_modes():
    d = nn.Dropout(0.25)
    x = mg.ones(200, 500, requires_grad=True)
    y = d(x)
    kept = host(y) != 0
    assert abs(kept.mean() - 0.75) < 0.01
    np.testing.assert_allclose(host(y)[kept], 1 / 0.75, rtol=1e-6)
    y.sum().backward()
    np.testing.assert_array_equal(host(x.grad), host(y))  # gradient is the same mask and scale
    d.eval()
    assert d(x) is x
    assert not host(nn.Dropout(1.0)(x)).any()
    assert nn.Dropout(0.0)(x) is x
    with pytest.raises(ValueError, match="between 0 and 1"):
        nn.Dropout(1.5)


def test_dropout_is_reproducible_with_manual_seed():
    x = mg.ones(50)
    mg.manual_seed(3)
    a = host(F.dropout(x, 0.5))
    mg.manual_seed(3)
    np.testing.assert_array_equal(host(F.dropout(x, 0.5)), a)


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
        set_values(m.weight, rand(3, seed=5))
        if m.bias is not None:
            set_values(m.bias, rand(3, seed=6))
    copy_into_torch(torch, m, t)
    for step in range(3):
        run_both(torch, m, t, rand(*shape, seed=step, scale=2) + step)
        for k, v in t.state_dict().items():
            np.testing.assert_allclose(host(m.state_dict()[k]), v.numpy(), rtol=1e-10, atol=1e-12, err_msg=k)
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
        set_values(m.weight, rand(*m.weight.shape, seed=3))
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
    expected = torch.nn.functional.one_hot(torch.tensor(idx)).numpy()
    np.testing.assert_array_equal(host(F.one_hot(mg.tensor(idx))), expected)
    assert F.one_hot(mg.tensor([1]), 5).shape == (1, 5) and F.one_hot(mg.tensor([1])).dtype == mg.int64
    with pytest.raises(ValueError, match="class values"):
        F.one_hot(mg.tensor([5]), 3)
    x = rand(2, 3, 4)
    out = F.pad(mg.tensor(x), (1, 2, 0, 1), value=0.5)
    np.testing.assert_array_equal(host(out), torch.nn.functional.pad(torch.tensor(x), (1, 2, 0, 1), value=0.5).numpy())


def test_functional_reexports_conv():
    for name in ("conv2d", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d"):
        assert callable(getattr(F, name))


def test_standardize_gradients_through_all_outputs():
    # batch_norm's fused op also returns the mean and variance; gradients through them must be right
    x = mg.tensor(rand(4, 3, 2) + 2, requires_grad=True)
    fn = lambda x: F.Standardize.apply(x, (0, 2), 1e-5)  # noqa: E731
    assert gradcheck(fn, (x,))
    assert gradgradcheck(fn, (x,))


def test_batch_norm_op_gradients_through_all_outputs():
    # batch norm's training op (Standardize and the affine map in one) returns the mean and the
    # variance too; gradients through every output, and of gradients, must be right
    x = mg.tensor(rand(4, 3, 2) + 2, requires_grad=True)
    w, b = mg.tensor(rand(3, seed=1), requires_grad=True), mg.tensor(rand(3, seed=2), requires_grad=True)
    fn = lambda x, w, b: F.BatchNorm.apply(x, w, b, (0, 2), 1e-5)  # noqa: E731
    assert gradcheck(fn, (x, w, b))
    assert gradgradcheck(fn, (x, w, b))


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
        np.testing.assert_allclose(host(a), b.numpy(), rtol=1e-8, atol=1e-10)


# -- every layer and loss on each device (cuda skipped without a GPU) ---------------------------------
def _ints(*values):
    return np.array(values, dtype=np.int64)


# (id, module factory, inputs): float inputs are differentiated, int inputs (indices, classes) not
LAYER_CASES = [
    ("Linear", lambda: nn.Linear(4, 3), [rand(5, 4)]),
    ("Conv2d", lambda: nn.Conv2d(3, 4, 3, stride=2, padding=1), [rand(2, 3, 7, 6)]),
    ("Conv2d_groups_dilation", lambda: nn.Conv2d(4, 6, 3, dilation=2, groups=2, bias=False), [rand(2, 4, 7, 7)]),
    ("MaxPool2d", lambda: nn.MaxPool2d(2), [rand(2, 3, 6, 4)]),
    ("AvgPool2d", lambda: nn.AvgPool2d(3, stride=2, padding=1), [rand(2, 3, 5, 5)]),
    ("AdaptiveAvgPool2d", lambda: nn.AdaptiveAvgPool2d((2, 3)), [rand(2, 3, 5, 7)]),
    ("BatchNorm1d", lambda: nn.BatchNorm1d(3), [rand(8, 3, scale=2) + 1]),
    ("BatchNorm2d", lambda: nn.BatchNorm2d(3), [rand(4, 3, 3, 2, scale=2) + 1]),
    ("LayerNorm", lambda: nn.LayerNorm((4, 5)), [rand(3, 4, 5, scale=2) + 1]),
    ("Embedding", lambda: nn.Embedding(10, 4, padding_idx=2), [_ints(1, 2, 3, 2, 9, 1)]),
    ("LSTM", lambda: nn.LSTM(4, 5, num_layers=2), [rand(3, 2, 4)]),
    ("MultiheadAttention", lambda: nn.MultiheadAttention(8, 2, batch_first=True),
     [rand(2, 3, 8), rand(2, 4, 8, seed=1), rand(2, 4, 8, seed=2)]),
    ("TransformerEncoderLayer", lambda: nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0),
     [rand(3, 2, 8)]),
    ("MLP", lambda: nn.Sequential(nn.Flatten(), nn.Linear(12, 6), nn.GELU(), nn.Linear(6, 3), nn.LogSoftmax(-1)),
     [rand(4, 3, 4)]),
    ("CrossEntropyLoss", lambda: nn.CrossEntropyLoss(weight=mg.tensor([1.0, 2.0, 0.5]), label_smoothing=0.1),
     [rand(4, 3), _ints(0, 2, 1, 2)]),
    ("NLLLoss", lambda: nn.NLLLoss(ignore_index=1), [rand(4, 3), _ints(0, 1, 2, 2)]),
    ("MSELoss", lambda: nn.MSELoss(), [rand(3, 4), rand(3, 4, seed=1)]),
    ("L1Loss", lambda: nn.L1Loss(reduction="sum"), [rand(3, 4), rand(3, 4, seed=1)]),
    ("BCELoss", lambda: nn.BCELoss(), [1 / (1 + np.exp(-rand(3, 4))), np.random.default_rng(1).uniform(size=(3, 4))]),
    ("BCEWithLogitsLoss", lambda: nn.BCEWithLogitsLoss(pos_weight=mg.tensor([1.0, 2.0, 3.0, 0.5])),
     [rand(3, 4), np.random.default_rng(1).uniform(size=(3, 4))]),
]


def _flat(out):
    return [t for o in out for t in _flat(o)] if isinstance(out, (tuple, list)) else [out]


def _train_step(module, arrays, dtype, device):
    """Forward ``arrays`` through ``module`` on ``device`` and backward a fixed weighting of every
    floating output; everything that came out, as numpy arrays."""
    with mg.device(device):
        xs = [mg.tensor(a, dtype=dtype if a.dtype.kind == "f" else None, requires_grad=a.dtype.kind == "f")
              for a in arrays]
        outs = [o for o in _flat(module(*xs)) if o is not None and o.dtype.kind == "f"]
        rng = np.random.default_rng(7)
        sum((o * mg.tensor(rng.standard_normal(o.shape), dtype=o.dtype)).sum() for o in outs).backward()
    tensors = outs + [x.grad for x in xs if x.requires_grad]
    tensors += [p.grad for p in module.parameters()] + [b for b in module.buffers() if b.dtype.kind == "f"]
    for t in tensors:
        assert t.device == mg.device(device), f"a result is on {t.device}, not on {device}"
    return [host(t) for t in tensors]


@pytest.mark.parametrize("name,make,arrays", LAYER_CASES, ids=[c[0] for c in LAYER_CASES])
def test_layer_in_float32_on_device_matches_float64_on_cpu(name, make, arrays, device):
    """Outputs, input and parameter gradients and running statistics, after ``Module.to(device)``."""
    with mg.device("cpu"):
        reference = make().double()
    moved = copy.deepcopy(reference).to(device, mg.float32)
    expected = _train_step(reference, arrays, "float64", "cpu")
    actual = _train_step(moved, arrays, "float32", device)
    for k, (a, e) in enumerate(zip(actual, expected)):
        assert a.dtype == np.float32, f"{name}: result {k} is {a.dtype}"
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-5, err_msg=f"{name}: result {k}")


def test_dropout_on_device(device):
    x = mg.ones(100, 200, device=device, requires_grad=True)
    y = F.dropout(x, 0.25)
    y.sum().backward()
    assert y.device == x.grad.device == mg.device(device)
    kept = host(y) != 0
    assert abs(kept.mean() - 0.75) < 0.02
    np.testing.assert_array_equal(host(x.grad), host(y))
