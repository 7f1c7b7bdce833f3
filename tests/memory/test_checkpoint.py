"""Gradient checkpointing: the same gradients as without it (bitwise), less activation memory, and
the awkward cases: dropout, BatchNorm, nesting, keyword arguments, minigrad.grad, create_graph,
the reentrant variant and its limits (chapter 03)."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest

import minigrad
from minigrad import nn
from minigrad.errors import AutogradError
from minigrad.memory import checkpoint, checkpoint_sequential, track
from minigrad.memory.checkpoint import checkpoint_modules


def mlp(depth: int = 6, width: int = 16) -> nn.Sequential:
    layers = [nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(depth)]
    return nn.Sequential(*layers, nn.Linear(width, 3))


def cnn() -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Conv2d(4, 6, 3), nn.ReLU(), nn.Flatten(), nn.Linear(6 * 2 * 2, 3))


def with_dropout() -> nn.Sequential:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 16), nn.Tanh(),
                         nn.Dropout(0.2), nn.Linear(16, 3))


def with_batchnorm() -> nn.Sequential:
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 16),
                         nn.BatchNorm1d(16, momentum=None), nn.ReLU(), nn.Linear(16, 3))


def step(model: nn.Module, x: minigrad.Tensor, run) -> list[np.ndarray]:
    """One forward and backward from seed 1: every parameter's and the input's gradient, the
    buffers, and the next random number (the random stream must go on as without checkpointing)."""
    minigrad.manual_seed(1)
    model.zero_grad()
    x.grad = None
    y = run(model, x)
    (y * y).mean().backward()
    grads = [p.grad.numpy().copy() for p in model.parameters()]
    grads += [x.grad.numpy().copy()] if x.requires_grad else []
    return grads + [b.numpy().copy() for b in model.buffers()] + [minigrad.rand(3).numpy()]


def plain(model, x):
    return model(x)


def assert_same_step(build, x, runs):
    model = build()
    start = copy.deepcopy(model.state_dict())
    expected = step(model, x, plain)
    for run in runs:
        model.load_state_dict(start)
        for a, b in zip(expected, step(model, x, run), strict=True):
            np.testing.assert_array_equal(a, b)


def sequential_runs(n: int) -> list:
    return [lambda m, x, s=s, r=r: checkpoint_sequential(m, s, x, use_reentrant=r)
            for s in (1, 2, 3, n) for r in (False, True)]


# -- the same gradients, bitwise ------------------------------------------------------------------
def test_mlp_gradients_are_identical():
    runs = sequential_runs(7) + [lambda m, x: checkpoint(m, x), lambda m, x: checkpoint(m.forward, x)]
    assert_same_step(mlp, minigrad.randn(5, 16, requires_grad=True), runs)


def test_cnn_gradients_are_identical():
    assert_same_step(cnn, minigrad.randn(3, 2, 8, 8, requires_grad=True), sequential_runs(9))


def test_dropout_draws_the_same_masks_in_the_recomputation():
    assert_same_step(with_dropout, minigrad.randn(6, 8, requires_grad=True), sequential_runs(7))


def test_without_preserved_rng_state_the_masks_differ():
    model, x = with_dropout(), minigrad.randn(6, 8, requires_grad=True)
    expected = step(model, x, plain)
    changed = step(model, x, lambda m, x: checkpoint(m, x, preserve_rng_state=False))
    assert not np.array_equal(expected[0], changed[0])


def test_batchnorm_gradients_and_running_statistics_are_identical():
    # the recomputation runs BatchNorm in training mode again; its buffers are put back, so the
    # running statistics (and num_batches_tracked) change once, as without checkpointing
    assert_same_step(with_batchnorm, minigrad.randn(6, 8, requires_grad=True), sequential_runs(7))


def test_input_that_does_not_require_grad():
    assert_same_step(mlp, minigrad.randn(5, 16), [lambda m, x: checkpoint_sequential(m, 3, x)])


# -- composition ----------------------------------------------------------------------------------
def test_nested_checkpoints_with_keyword_arguments_under_minigrad_grad():
    a, b, c = nn.Linear(4, 8), nn.Linear(8, 8), nn.Linear(8, 2)
    x = minigrad.randn(5, 4, requires_grad=True)
    wanted = [*a.parameters(), *b.parameters(), *c.parameters(), x]

    def inner(h, *, scale):
        return b(h).tanh() * scale

    def outer(h, scale=1.0):
        return c(checkpoint(inner, h, scale=scale))

    expected = minigrad.grad(c(inner(a(x).relu(), scale=0.5)).sum(), wanted)
    got = minigrad.grad(checkpoint(outer, a(x).relu(), scale=0.5).sum(), wanted)
    for e, g in zip(expected, got, strict=True):
        np.testing.assert_array_equal(e.numpy(), g.numpy())


def test_several_outputs_one_unused():
    lin = nn.Linear(4, 4)
    x = minigrad.randn(3, 4, requires_grad=True)

    def two(h):
        y = lin(h)
        return y.relu(), y.exp()

    expected = minigrad.grad(two(x)[1].sum(), [x, lin.weight])
    got = minigrad.grad(checkpoint(two, x)[1].sum(), [x, lin.weight])
    for e, g in zip(expected, got, strict=True):
        np.testing.assert_array_equal(e.numpy(), g.numpy())


def test_create_graph_gives_second_derivatives():
    w = minigrad.randn(5, 5, dtype="float64", requires_grad=True)
    x = minigrad.randn(3, 5, dtype="float64", requires_grad=True)

    def segment(h):
        return (h @ w).tanh()

    def hvp(run):
        out = run(segment, x * 1.5)  # a computed input: its second derivative must flow through it
        gx, gw = minigrad.grad((out ** 2).sum(), [x, w], create_graph=True)
        return minigrad.grad(gx.sum() + gw.sum(), [x, w])

    for e, g in zip(hvp(lambda f, h: f(h)), hvp(checkpoint), strict=True):
        np.testing.assert_allclose(e.numpy(), g.numpy(), rtol=1e-12, atol=1e-12)


def test_leaf_hooks_on_parameters_still_run():
    lin = nn.Linear(3, 3)
    seen = []
    lin.weight.register_hook(lambda g: seen.append(g.shape))
    checkpoint(lin, minigrad.randn(2, 3)).sum().backward()
    assert seen == [(3, 3)]


@pytest.mark.parametrize("reentrant", [False, True])
def test_gradients_handed_to_leaves_alias_nothing(reentrant):
    """The checkpoint hands its gradients to the engine as its own (no copy into .grad), so one
    that is its output's gradient passed through (a segment ``t + b``), or returned twice, is
    copied: changing one .grad in place changes no other tensor, nor what a hook kept."""
    x, b = minigrad.randn(4, 8, requires_grad=True), minigrad.randn(4, 8, requires_grad=True)
    y = checkpoint(lambda t, u: t + u, x, b, use_reentrant=reentrant)
    kept = []
    y.register_hook(lambda g: kept.append(g))
    (y * 3).sum().backward()
    b.grad.add_(1)
    np.testing.assert_array_equal(x.grad.numpy(), np.full((4, 8), 3.0, dtype=np.float32))
    np.testing.assert_array_equal(kept[0].numpy(), np.full((4, 8), 3.0, dtype=np.float32))
    np.testing.assert_array_equal(b.grad.numpy(), np.full((4, 8), 4.0, dtype=np.float32))


def test_no_grad_just_runs_the_function():
    with minigrad.no_grad():
        y = checkpoint(nn.Linear(3, 3), minigrad.randn(2, 3))
    assert y.grad_fn is None


# -- memory ---------------------------------------------------------------------------------------
def test_checkpointing_lowers_peak_activation_memory():
    model, x = mlp(depth=16, width=64), minigrad.randn(256, 64)
    peaks = {}
    for segments in (None, 4):
        with track(minigrad.get_default_device()) as mem:  # activations count on every device
            y = model(x) if segments is None else checkpoint_sequential(model, segments, x)
            y.sum().backward()
        peaks[segments] = mem.activation_peak
    layer = 256 * 64 * 4  # one layer's saved activation
    assert peaks[None] >= 16 * layer
    assert peaks[4] <= 9 * layer  # three boundaries, the last segment's five layers, one in flight


def test_the_recomputation_counts_as_activation_memory():
    model, x = mlp(depth=16, width=64), minigrad.randn(256, 64)
    with track(minigrad.get_default_device()) as mem:
        y = checkpoint(model, x)
        held = mem.activations  # the output only
        y.sum().backward()
    assert held == 256 * 3 * 4
    assert mem.activation_peak >= 16 * 256 * 64 * 4  # backward rebuilt every layer's activation


# -- the reentrant variant and misuse ---------------------------------------------------------------
def test_reentrant_warns_when_no_input_requires_grad():
    lin = nn.Linear(3, 3)
    with pytest.warns(UserWarning, match="no input requires grad"):
        y = checkpoint(lin, minigrad.randn(2, 3), use_reentrant=True)
    assert y.grad_fn is None  # as in PyTorch: the parameters get no gradient


def test_reentrant_under_minigrad_grad_sends_parameter_gradients_to_grad():
    lin = nn.Linear(3, 3)
    x = minigrad.randn(2, 3, requires_grad=True)
    (gx,) = minigrad.grad(checkpoint(lin, x, use_reentrant=True).sum(), [x])
    np.testing.assert_allclose(gx.numpy(), lin.weight.detach().numpy().sum(0)[None].repeat(2, 0), rtol=1e-6)
    assert lin.weight.grad is not None  # filled as a side effect, unlike use_reentrant=False


def test_reentrant_refuses_create_graph():
    x = minigrad.randn(2, 3, requires_grad=True)
    y = checkpoint(lambda h: h.tanh(), x, use_reentrant=True).sum()
    with pytest.raises(AutogradError, match="create_graph"):
        minigrad.grad(y, [x], create_graph=True)


def test_a_computed_tensor_read_from_outside_is_an_error():
    x = minigrad.randn(2, 3, requires_grad=True)
    outside = x.exp()
    y = checkpoint(lambda h: h * outside, minigrad.randn(2, 3, requires_grad=True)).sum()
    with pytest.raises(AutogradError, match="computed outside"):
        y.backward()


def test_an_input_changed_in_place_after_forward_is_an_error():
    x = minigrad.randn(2, 3, requires_grad=True)
    h = x * 1.0
    y = checkpoint(lambda t: t.tanh(), h).sum()
    with minigrad.no_grad():
        h.add_(1.0)
    with pytest.raises(AutogradError, match="modified by an in-place operation"):
        y.backward()


def test_bad_arguments():
    with pytest.raises(TypeError, match="Tensor or a tuple of Tensors"):
        checkpoint(lambda h: [h], minigrad.randn(2, requires_grad=True))
    with pytest.raises(ValueError, match="segments must be between 1 and"):
        checkpoint_sequential(mlp(depth=2), 4, minigrad.randn(2, 16))
    with pytest.raises(ValueError, match="unexpected keyword"):
        checkpoint_sequential(mlp(depth=2), 2, minigrad.randn(2, 16), scale=2)


# -- PyTorch ----------------------------------------------------------------------------------------
def twin(model: nn.Module):
    torch = pytest.importorskip("torch")
    mods = [torch.nn.Linear(m.in_features, m.out_features) if isinstance(m, nn.Linear)
            else torch.nn.BatchNorm1d(m.num_features) if isinstance(m, nn.BatchNorm1d) else torch.nn.ReLU()
            for m in model]
    t = torch.nn.Sequential(*mods)
    t.load_state_dict({k: torch.tensor(v.numpy()) for k, v in model.state_dict().items()})
    return torch, t


def test_matches_torch_checkpoint_sequential():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))
    torch, t = twin(model)
    x0 = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    checkpoint_sequential(model, 2, minigrad.tensor(x0)).sum().backward()
    from torch.utils.checkpoint import checkpoint_sequential as torch_checkpoint_sequential

    torch_checkpoint_sequential(t, 2, torch.tensor(x0), use_reentrant=False).sum().backward()
    for p, q in zip(model.parameters(), t.parameters(), strict=True):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_batchnorm_statistics_unlike_torch_count_the_batch_once():
    model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    torch, t = twin(model)
    x0 = np.random.default_rng(0).standard_normal((6, 8)).astype(np.float32)
    from torch.utils.checkpoint import checkpoint as torch_checkpoint

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch_checkpoint(t, torch.tensor(x0), use_reentrant=False).sum().backward()
    checkpoint(model, minigrad.tensor(x0)).sum().backward()
    assert int(t[1].num_batches_tracked) == 2  # PyTorch's recomputation updates them again
    assert int(model[1].num_batches_tracked.item()) == 1
    np.testing.assert_allclose(model[0].weight.grad.numpy(), t[0].weight.grad.numpy(), rtol=1e-4, atol=1e-5)


# -- checkpoint_modules: the parameters known, the first run without a graph ----------------------------
def modules_runs() -> list:
    """The whole model as one segment, and its first layer as a segment nested in one of the whole."""
    return [lambda m, x: checkpoint_modules(m, x, [m]),
            lambda m, x: checkpoint_modules(lambda h: m[1:](checkpoint_modules(m[0], h, [m[0]])), x, [m])]


@pytest.mark.parametrize("build", [mlp, with_dropout, with_batchnorm])
@pytest.mark.parametrize("requires_grad", [True, False])
def test_checkpoint_modules_gradients_are_identical(build, requires_grad):
    assert_same_step(build, minigrad.randn(6, 16 if build is mlp else 8, requires_grad=requires_grad),
                     modules_runs())


def test_checkpoint_modules_first_run_records_no_graph():
    model, x = mlp(depth=8, width=64), minigrad.randn(256, 64)
    with track(minigrad.get_default_device()) as mem:
        y = checkpoint_modules(model, x, [model])
        assert mem.activations == 256 * 3 * 4  # the output only
        assert mem.activation_peak <= 3 * 256 * 64 * 4  # a layer's input, output and ReLU mask at most
    _segment, _input, *params = y.grad_fn.next_functions  # the parameters are the node's inputs
    assert [e[0].variable for e in params] == list(model.parameters())


def test_checkpoint_modules_refuses_a_tensor_it_was_not_given():
    lin, extra = nn.Linear(3, 3), minigrad.randn(3, requires_grad=True)
    y = checkpoint_modules(lambda h: lin(h) * extra, minigrad.randn(2, 3), [lin]).sum()
    with pytest.raises(AutogradError, match=r"shape \(3,\) that requires grad and is neither"):
        y.backward()


def test_checkpoint_modules_gives_second_derivatives():
    lin = nn.Linear(5, 5, dtype="float64")
    x = minigrad.randn(3, 5, dtype="float64", requires_grad=True)

    def hvp(run):
        out = run(x * 1.5)  # a computed input: its second derivative must flow through it
        gx, gw = minigrad.grad((out ** 2).sum(), [x, lin.weight], create_graph=True)
        return minigrad.grad(gx.sum() + gw.sum(), [x, lin.weight])

    segment = nn.Sequential(lin, nn.Tanh())
    for e, g in zip(hvp(segment), hvp(lambda h: checkpoint_modules(segment, h, [segment])), strict=True):
        np.testing.assert_allclose(e.numpy(), g.numpy(), rtol=1e-12, atol=1e-12)
