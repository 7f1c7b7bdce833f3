"""benchmarks/bench_transformer.py at a tiny size: the GPT's minigrad step learns (the loss falls),
the compiled step's losses equal eager ones, the model matches PyTorch's where installed, and a
checkpoint plan over its blocks gives the same gradients. No timing is asserted."""

import sys
from pathlib import Path

import numpy
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_transformer as bench  # noqa: E402

import minigrad  # noqa: E402
from minigrad import memory  # noqa: E402

LAYERS, BATCH = 2, 2


@pytest.fixture(scope="module")
def data():
    return bench.batch(BATCH)


def test_the_batch_is_next_characters_of_the_shipped_text(data):
    idx, targets, vocab = data
    assert idx.shape == targets.shape == (BATCH, bench.CONTEXT)
    numpy.testing.assert_array_equal(idx[:, 1:], targets[:, :-1])
    assert 0 <= idx.min() and idx.max() < vocab and targets.max() < vocab


def test_the_loss_falls_and_the_compiled_step_equals_eager(data):
    idx, targets, vocab = data
    _, eager, losses = bench.minigrad_steps(LAYERS, idx, targets, vocab, compiled=False)
    _, compiled, compiled_losses = bench.minigrad_steps(LAYERS, idx, targets, vocab, compiled=True)
    assert compiled.graphs and all(g is not None for g in compiled.graphs.values())  # it did not fall back
    losses += [eager().item() for _ in range(3)]
    compiled_losses.append(compiled().item())  # the first replay
    numpy.testing.assert_allclose(compiled_losses, losses[:3], rtol=1e-4)
    assert losses[-1] < losses[0] - 0.1
    assert abs(losses[0] - numpy.log(vocab)) < 0.5  # an untrained model guesses about uniformly


def test_a_checkpoint_plan_over_the_blocks_gives_the_same_gradients(data):
    idx, targets, vocab = data
    minigrad.manual_seed(0)
    model = bench.gpt(minigrad, vocab, LAYERS)
    idx, targets = minigrad.tensor(idx), minigrad.tensor(targets)
    with minigrad.no_grad():
        h = model[0](idx)
    plan = memory.plan(model[1], h, 0.5)
    assert any(plan.recompute_counts())
    grads = []
    for forward in (model, bench.with_blocks(model, plan)):
        model.zero_grad()
        bench.loss_of(minigrad, forward, idx, targets).backward()
        grads.append([p.grad.numpy().copy() for p in model.parameters()])
    for kept, planned in zip(*grads):
        numpy.testing.assert_allclose(planned, kept, rtol=1e-5, atol=1e-6)


def test_the_model_matches_pytorch(data):
    torch = pytest.importorskip("torch")
    idx, targets, vocab = data
    minigrad.manual_seed(0)
    model = bench.gpt(minigrad, vocab, LAYERS)
    twin = bench.gpt(torch, vocab, LAYERS)
    twin.load_state_dict({k: torch.tensor(v.numpy()) for k, v in model.state_dict().items()})
    losses = [bench.loss_of(lib, m, lib.tensor(idx), lib.tensor(targets)).item()
              for lib, m in ((minigrad, model), (torch, twin))]
    numpy.testing.assert_allclose(losses[0], losses[1], rtol=1e-4)
