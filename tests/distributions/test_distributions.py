"""minigrad.distributions: Normal, Categorical and Bernoulli give torch's log_prob, entropy and
gradients (finite differences in float64; torch where installed), sample from the right law, and
refuse bad parameters and values with torch's ValueErrors."""

import math

import numpy as np
import pytest

import minigrad as mg
from minigrad.autograd import gradcheck
from minigrad.distributions import Bernoulli, Categorical, Distribution, Normal


def f64(a, requires_grad=True):
    return mg.tensor(np.asarray(a, dtype="float64"), requires_grad=requires_grad)


LOC, SCALE, VALUE = [0.3, -1.2, 2.0], [0.5, 1.5, 2.5], [0.1, -0.4, 4.0]
LOGITS, CLASSES = [[0.2, -1.0, 1.5], [0.7, 0.1, -0.3]], [2, 0]
PROBS, COINS = [0.2, 0.65, 0.9], [1.0, 0.0, 1.0]

# name -> (minigrad function of float64 tensors, the inputs, the torch function of the same)
CASES = {
    "normal_log_prob": (lambda m, s, v: Normal(m, s).log_prob(v), (LOC, SCALE, VALUE),
                        lambda td, m, s, v: td.Normal(m, s).log_prob(v)),
    "normal_entropy": (lambda s: Normal(0.0, s).entropy(), (SCALE,), lambda td, s: td.Normal(0.0, s).entropy()),
    "normal_cdf": (lambda m, s, v: Normal(m, s).cdf(v), (LOC, SCALE, VALUE),
                   lambda td, m, s, v: td.Normal(m, s).cdf(v)),
    "categorical_log_prob_logits": (lambda z: Categorical(logits=z).log_prob(mg.tensor(CLASSES)), (LOGITS,),
                                    lambda td, z: td.Categorical(logits=z).log_prob(_t(CLASSES))),
    "categorical_log_prob_probs": (lambda p: Categorical(probs=p.softmax(-1)).log_prob(mg.tensor(CLASSES)), (LOGITS,),
                                   lambda td, p: td.Categorical(probs=p.softmax(-1)).log_prob(_t(CLASSES))),
    "categorical_entropy": (lambda z: Categorical(logits=z).entropy(), (LOGITS,),
                            lambda td, z: td.Categorical(logits=z).entropy()),
    "bernoulli_log_prob_probs": (lambda p: Bernoulli(probs=p).log_prob(f64(COINS, False)), (PROBS,),
                                 lambda td, p: td.Bernoulli(probs=p).log_prob(_t(COINS))),
    "bernoulli_log_prob_logits": (lambda z: Bernoulli(logits=z).log_prob(f64(COINS, False)), (LOC,),
                                  lambda td, z: td.Bernoulli(logits=z).log_prob(_t(COINS))),
    "bernoulli_entropy": (lambda p: Bernoulli(probs=p).entropy(), (PROBS,),
                          lambda td, p: td.Bernoulli(probs=p).entropy()),
}


def _t(values):
    import torch

    return torch.tensor(values, dtype=torch.float64 if isinstance(values[0], float) else torch.int64)


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradients_match_finite_differences(name):
    fn, inputs, _ = CASES[name]
    assert gradcheck(fn, [f64(a) for a in inputs])


@pytest.mark.parametrize("name", sorted(CASES))
def test_values_and_gradients_match_torch(name):
    torch = pytest.importorskip("torch")
    fn, inputs, th = CASES[name]
    ours = [f64(a) for a in inputs]
    theirs = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in inputs]
    out, ref = fn(*ours), th(torch.distributions, *theirs)
    np.testing.assert_allclose(out.detach().numpy(), ref.detach().numpy(), rtol=1e-10, atol=1e-12)
    out.sum().backward()
    ref.sum().backward()
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_normal_rsample_is_loc_plus_scale_times_noise_and_carries_gradients():
    loc, scale = f64(LOC), f64(SCALE)
    mg.manual_seed(3)
    x = Normal(loc, scale).rsample((4,))
    mg.manual_seed(3)
    eps = mg.randn(4, 3, dtype=mg.float64)
    np.testing.assert_allclose(x.detach().numpy(), (loc.detach() + eps * scale.detach()).numpy())
    x.sum().backward()
    np.testing.assert_allclose(loc.grad.numpy(), [4.0] * 3)
    np.testing.assert_allclose(scale.grad.numpy(), eps.sum(0).numpy())
    assert gradcheck(lambda m, s: (mg.manual_seed(1), Normal(m, s).rsample((2,)))[1], [f64(LOC), f64(SCALE)])
    assert not Normal(loc, scale).sample().requires_grad


def test_samples_follow_the_distribution():
    n = 20000
    x = Normal(mg.tensor([1.0, -2.0]), mg.tensor([0.5, 3.0])).sample((n,))
    assert x.shape == (n, 2)
    np.testing.assert_allclose(x.numpy().mean(0), [1.0, -2.0], atol=5 * 3.0 / math.sqrt(n))
    np.testing.assert_allclose(x.numpy().std(0), [0.5, 3.0], rtol=0.05)
    probs = np.array([0.1, 0.6, 0.3])
    c = Categorical(probs=mg.tensor(probs * 7)).sample((n, 2))  # unnormalised probabilities are normalised
    assert c.shape == (n, 2) and c.dtype == mg.int64
    np.testing.assert_allclose(np.bincount(c.numpy().ravel(), minlength=3) / (2 * n), probs, atol=0.02)
    b = Bernoulli(probs=mg.tensor([0.25, 0.75])).sample((n,))
    assert set(np.unique(b.numpy())) <= {0.0, 1.0} and b.dtype == mg.float32
    np.testing.assert_allclose(b.numpy().mean(0), [0.25, 0.75], atol=0.02)


def test_shapes_means_and_support():
    c = Categorical(logits=mg.zeros(4, 5))
    assert c.batch_shape == (4,) and c.event_shape == () and c.param_shape == (4, 5)
    assert c.enumerate_support().shape == (5, 4) and c.mode.shape == (4,)
    assert np.isnan(c.mean.numpy()).all()
    np.testing.assert_allclose(c.entropy().numpy(), [math.log(5)] * 4, rtol=1e-6)
    b = Bernoulli(0.3)
    assert b.batch_shape == () and math.isclose(b.variance.item(), 0.21, rel_tol=1e-6)
    assert Normal(mg.zeros(2, 3), 1.0).batch_shape == (2, 3)
    assert Normal(0.0, 2.0).stddev.item() == 2.0 and Normal(0.0, 2.0).variance.item() == 4.0


def test_bad_parameters_and_values_raise_torchs_errors():
    with pytest.raises(ValueError, match="parameter scale .* constraint GreaterThan"):
        Normal(0.0, mg.tensor([1.0, -1.0]))
    with pytest.raises(ValueError, match="parameter probs .* constraint Interval"):
        Bernoulli(probs=1.5)
    with pytest.raises(ValueError, match="Either `probs` or `logits`"):
        Categorical(probs=mg.ones(3), logits=mg.ones(3))
    with pytest.raises(ValueError, match="Either `probs` or `logits`"):
        Bernoulli()
    with pytest.raises(ValueError, match="within the support"):
        Categorical(logits=mg.zeros(3)).log_prob(mg.tensor(3))
    with pytest.raises(ValueError, match="within the support"):
        Bernoulli(0.5).log_prob(mg.tensor(0.5))
    with pytest.raises(ValueError, match="not broadcastable"):
        Normal(mg.zeros(2), 1.0).log_prob(mg.zeros(3))
    assert Normal(0.0, -1.0, validate_args=False).scale.item() == -1.0


def test_validation_can_be_turned_off_for_new_distributions():
    try:
        Distribution.set_default_validate_args(False)
        assert Bernoulli(probs=2.0).probs.item() == 2.0
    finally:
        Distribution.set_default_validate_args(True)
    with pytest.raises(ValueError):
        Bernoulli(probs=2.0)


def test_discrete_distributions_have_no_rsample():
    assert Normal(0.0, 1.0).has_rsample and not Categorical(logits=mg.zeros(2)).has_rsample
    with pytest.raises(NotImplementedError, match="Categorical has no reparameterised sample"):
        Categorical(logits=mg.zeros(2)).rsample()


def test_reinforce_trains_a_policy_toward_the_rewarded_action():
    logits = mg.zeros(3, requires_grad=True)
    opt = mg.optim.SGD([logits], lr=0.5)
    for _ in range(50):
        dist = Categorical(logits=logits)
        action = dist.sample((16,))
        reward = (action == 2).float()
        loss = -(dist.log_prob(action) * reward).mean() - 0.01 * dist.entropy()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert Categorical(logits=logits).probs[2].item() > 0.8
