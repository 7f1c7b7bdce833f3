"""Loss modules against PyTorch for every reduction: values and input gradients, the options
(class weights, ignore_index, label smoothing, pos_weight) and numerical stability."""

import numpy as np
import pytest

import minigrad as mg
from helpers import to_numpy
from minigrad import nn

REDUCTIONS = ["mean", "sum", "none"]


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


def rng(seed=0):
    return np.random.default_rng(seed)


def compare(torch, make_m, make_t, x, target, rtol=1e-10, atol=1e-12, **arrays):
    """Run a minigrad loss and a torch loss on the same float64 data; compare loss and d/dx."""
    xm, xt = mg.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    lm = make_m(**{k: mg.tensor(v) for k, v in arrays.items()})(xm, mg.tensor(target))
    lt = make_t(**{k: torch.tensor(v) for k, v in arrays.items()})(xt, torch.tensor(target))
    np.testing.assert_allclose(to_numpy(lm), lt.detach().numpy(), rtol=rtol, atol=atol)
    w = rng(7).standard_normal(lm.shape)
    (lm * mg.tensor(w)).sum().backward()
    (lt * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(to_numpy(xm.grad), xt.grad.numpy(), rtol=rtol, atol=atol)
    return lm


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("name", ["MSELoss", "L1Loss"])
def test_regression_losses(torch, name, reduction):
    x, y = rng().standard_normal((4, 3)), rng(1).standard_normal((4, 3))
    compare(torch, lambda: getattr(nn, name)(reduction=reduction), lambda: getattr(torch.nn, name)(reduction=reduction), x, y)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("options", [
    {}, {"label_smoothing": 0.1}, {"ignore_index": 1}, {"weight": True}, {"weight": True, "ignore_index": 2},
    {"weight": True, "label_smoothing": 0.2},
])
def test_cross_entropy(torch, reduction, options):
    x = rng().standard_normal((6, 4)) * 3
    y = np.array([0, 1, 2, 3, 1, 2])
    arrays = {"weight": rng(2).random(4) + 0.5} if options.get("weight") else {}
    kw = {k: v for k, v in options.items() if k != "weight"}
    compare(torch, lambda **a: nn.CrossEntropyLoss(reduction=reduction, **kw, **a),
            lambda **a: torch.nn.CrossEntropyLoss(reduction=reduction, **kw, **a), x, y, **arrays)


def test_cross_entropy_spatial_and_probability_targets(torch):
    x = rng().standard_normal((2, 3, 4, 5))
    y = rng(1).integers(0, 3, (2, 4, 5))
    compare(torch, nn.CrossEntropyLoss, torch.nn.CrossEntropyLoss, x, y)
    p = rng(2).random((5, 3))
    p /= p.sum(1, keepdims=True)
    compare(torch, lambda: nn.CrossEntropyLoss(label_smoothing=0.1), lambda: torch.nn.CrossEntropyLoss(label_smoothing=0.1),
            rng(3).standard_normal((5, 3)), p)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_nll_loss(torch, reduction):
    x = np.log(rng().dirichlet(np.ones(4), size=5))
    y = np.array([0, 3, 3, 1, 2])
    w = rng(4).random(4) + 0.1
    compare(torch, lambda **a: nn.NLLLoss(reduction=reduction, ignore_index=3, **a),
            lambda **a: torch.nn.NLLLoss(reduction=reduction, ignore_index=3, **a), x, y, weight=w)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_bce(torch, reduction):
    p = rng().uniform(0.05, 0.95, (4, 3))
    y = rng(1).integers(0, 2, (4, 3)).astype(np.float64)
    compare(torch, lambda: nn.BCELoss(reduction=reduction), lambda: torch.nn.BCELoss(reduction=reduction), p, y)
    w = rng(2).random((4, 3))
    compare(torch, lambda **a: nn.BCELoss(reduction=reduction, **a), lambda **a: torch.nn.BCELoss(reduction=reduction, **a),
            p, y, weight=w)


@pytest.mark.filterwarnings("ignore:divide by zero")  # numpy's log(0) = -inf, before the clamp
def test_bce_clamps_log_and_checks_range(torch):
    p, y = np.array([0.0, 1.0, 0.5]), np.array([1.0, 0.0, 1.0])
    lm = nn.BCELoss(reduction="none")(mg.tensor(p), mg.tensor(y))
    lt = torch.nn.BCELoss(reduction="none")(torch.tensor(p), torch.tensor(y))
    np.testing.assert_allclose(to_numpy(lm), lt.numpy())  # log(0) clamped to -100, as in torch
    with pytest.raises(ValueError, match="between 0 and 1"):
        nn.BCELoss()(mg.tensor([1.5]), mg.tensor([1.0]))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_bce_with_logits(torch, reduction):
    x = rng().standard_normal((5, 3)) * 4
    y = rng(1).random((5, 3))
    compare(torch, lambda: nn.BCEWithLogitsLoss(reduction=reduction), lambda: torch.nn.BCEWithLogitsLoss(reduction=reduction), x, y)
    compare(torch, lambda **a: nn.BCEWithLogitsLoss(reduction=reduction, **a),
            lambda **a: torch.nn.BCEWithLogitsLoss(reduction=reduction, **a), x, y,
            weight=rng(2).random(3), pos_weight=rng(3).random(3) * 3)


def test_bce_with_logits_is_stable_for_huge_logits(torch):
    x = np.array([-1000.0, -50.0, 0.0, 50.0, 1000.0], dtype=np.float32)
    y = np.array([1.0, 0.0, 1.0, 1.0, 0.0], dtype=np.float32)
    xm = mg.tensor(x, requires_grad=True)
    lm = nn.BCEWithLogitsLoss(reduction="none", pos_weight=mg.tensor([2.0]))(xm, mg.tensor(y))
    lt = torch.nn.BCEWithLogitsLoss(reduction="none", pos_weight=torch.tensor([2.0]))(torch.tensor(x), torch.tensor(y))
    assert np.isfinite(to_numpy(lm)).all()
    np.testing.assert_allclose(to_numpy(lm), lt.numpy(), rtol=1e-6)
    lm.sum().backward()
    assert np.isfinite(to_numpy(xm.grad)).all()


def test_loss_errors():
    with pytest.raises(ValueError, match="not a valid value for reduction"):
        nn.MSELoss(reduction="avg")
    with pytest.raises(ValueError, match="target shape"):
        nn.BCEWithLogitsLoss()(mg.ones(3), mg.ones(3, 1))
    with pytest.warns(UserWarning, match="broadcast"):
        nn.MSELoss()(mg.ones(3, 1), mg.ones(3))


def test_loss_weights_are_buffers():
    loss = nn.CrossEntropyLoss(weight=mg.ones(3))
    assert list(loss.state_dict()) == ["weight"]
    loss.double()
    assert loss.weight.dtype == mg.float64
