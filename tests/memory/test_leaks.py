"""The leak finder: tensors kept with their autograd graphs are found (roots only, with what they
keep and what holds them), and the memory tracker sees the growth step after step (chapter 03)."""

import numpy as np

import minigrad as mg
from helpers import cpu_only
from minigrad import nn
from minigrad.memory import leaks

STEP_BYTES = 100 * 20 * 4 + 4  # exp's saved (100, 20) float32 output, and the scalar loss itself


def setup():
    mg.manual_seed(0)
    return mg.randn(100, 50), nn.Parameter(mg.randn(50, 20))


def ours(found, tensors):
    return [g for g in found if any(g.tensor() is t for t in tensors)]


@cpu_only("the host counter's byte-exact figures")
def test_keeping_losses_grows_memory_by_each_steps_graph():
    x, w = setup()
    kept, items = [], []

    def leaky():  # evaluation without no_grad, keeping the loss tensor
        kept.append((x @ w).exp().sum())

    def fixed():
        items.append((x @ w).exp().sum().item())

    growth = leaks.memory_per_step(leaky, 4)
    assert np.diff(growth).tolist() == [STEP_BYTES] * 3
    found = ours(leaks.live_graphs(), kept)
    assert len(found) == 4
    for g in found:
        assert (g.op, g.nodes, g.shape) == ("Sum", 4, ())
        assert g.nbytes == 100 * 50 * 4 + 100 * 20 * 4  # x, saved by the matmul, and exp's output; w is a Parameter
        assert g.held_by == ("a list of 4 items",)
    kept.clear()
    assert leaks.memory_per_step(fixed, 4) == [0, 0, 0, 0]
    assert len(items) == 4


def test_after_backward_the_graph_is_kept_without_its_buffers():
    x, w = setup()
    losses = []
    for _ in range(3):
        loss = (x @ w).exp().sum()
        loss.backward()
        losses.append(loss)
    del loss
    found = ours(leaks.live_graphs(), losses)
    assert [(g.nodes, g.nbytes) for g in found] == [(4, 0)] * 3  # backward freed what it saved


def test_summing_losses_chains_every_step_into_one_graph():
    x, w = setup()
    total = mg.tensor(0.0)
    for step in range(1, 4):
        total = total + (x @ w).exp().sum()
        (g,) = ours(leaks.live_graphs(), [total])
        assert g.nodes == 4 * step + 1  # each step's 4 ops and its Add
        assert g.held_by == ()  # a running function's local variable: gc cannot see who refers


def test_a_tensor_inside_another_ones_graph_is_not_a_root():
    x, w = setup()
    h = (x @ w).exp()
    loss = h.sum()
    found = ours(leaks.live_graphs(), [h, loss])
    assert [g.tensor() is loss for g in found] == [True]
    del h, loss
    assert ours(leaks.live_graphs(), [x]) == []


def test_report_lists_what_holds_each_graph(capsys):
    x, w = setup()
    kept = [(x @ w).sum() for _ in range(2)]
    leaks.report()
    out = capsys.readouterr().out
    assert "hold autograd graphs" in out and "a list of 2 items" in out
    assert len(kept) == 2
