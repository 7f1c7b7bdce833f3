"""pytorch/examples programs ported by changing only their import lines: each runs
through its own command line at a small size on minigrad, and where PyTorch is installed the same
file with its original imports, started from the same weights (``harness.same_draws``), must give
the same losses and gradients on the same batches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness import HAVE_MNIST, grads_of, lib_module, numbers_after, run, same_draws

needs_mnist = pytest.mark.skipif(not HAVE_MNIST, reason="the MNIST files are not in shared/data/mnist beside the repository")


def mnist_batch(n: int) -> np.ndarray:
    """The first ``n`` shipped MNIST test images as floats in [0, 1], shape (n, 1, 28, 28)."""
    from torchvision_shim import datasets, transforms

    data = datasets.MNIST("", train=True, transform=transforms.ToTensor())
    return np.stack([data[i][0].numpy() for i in range(n)])


# -- vae/main.py ------------------------------------------------------------------------------------
VAE_ARGV = ["--epochs", "1", "--batch-size", "32", "--log-interval", "2"]


@needs_mnist
def test_vae_trains_through_its_own_command_line(tmp_path):
    (tmp_path / "results").mkdir()  # the example writes its images into the results/ folder it ships with
    out = run("vae_main", argv=VAE_ARGV, cwd=tmp_path).stdout
    losses = numbers_after(out, r"Loss:")
    (test_loss,) = numbers_after(out, r"Test set loss:")
    assert len(losses) == 3 and losses[-1] < losses[0] and test_loss < losses[0], out
    assert (tmp_path / "results" / "reconstruction_1.png").stat().st_size > 0
    assert (tmp_path / "results" / "sample_1.png").stat().st_size > 0


def vae_steps(lib: str) -> dict[str, Any]:
    """Three Adam steps of the example's VAE and loss on the same 32 images and noise."""
    ns = run("vae_main", lib, argv=VAE_ARGV, main=False).namespace
    torch = lib_module(lib)
    x = torch.tensor(mnist_batch(32))
    losses, grads = [], {}
    with same_draws(torch):  # the weights and reparameterize's noise
        model = ns["VAE"]()
        optimizer = ns["optim"].Adam(model.parameters(), lr=1e-3)
        for step in range(3):
            optimizer.zero_grad()
            recon, mu, logvar = model(x)
            loss = ns["loss_function"](recon, x, mu, logvar)
            loss.backward()
            grads = grads if step else grads_of(model)
            optimizer.step()
            losses.append(loss.item())
    return {"losses": losses, "grads": grads}


# -- mnist_rnn/main.py ------------------------------------------------------------------------------
RNN_ARGV = ["--epochs", "3", "--lr", "1", "--batch-size", "32", "--test-batch-size", "64", "--log-interval", "2"]


@needs_mnist
def test_mnist_rnn_trains_through_its_own_command_line():
    ns = run("mnist_rnn_main", argv=RNN_ARGV, main=False).namespace
    out = run("mnist_rnn_main", argv=RNN_ARGV).stdout
    losses = numbers_after(out, r"Loss:")
    correct = int(numbers_after(out, r"Accuracy:")[-1])
    # three epochs of 160 images: the loss falls and the last test beats chance (10%)
    assert "Net" in ns and len(losses) == 9 and losses[-1] < losses[0] - 0.2 and correct > 64 * 0.15, out


def mnist_rnn_steps(lib: str) -> dict[str, Any]:
    """The LSTM classifier's loss and gradients (eval mode: no dropout masks) and two Adadelta steps."""
    ns = run("mnist_rnn_main", lib, main=False).namespace
    torch = lib_module(lib)
    x, target = torch.tensor(mnist_batch(16)), torch.tensor(np.arange(16) % 10)
    with same_draws(torch):
        model = ns["Net"]()
    model.eval()
    optimizer = ns["optim"].Adadelta(model.parameters(), lr=0.1)
    losses, grads = [], {}
    for step in range(2):
        optimizer.zero_grad()
        loss = ns["F"].nll_loss(model(x), target)
        loss.backward()
        grads = grads if step else grads_of(model)
        optimizer.step()
        losses.append(loss.item())
    return {"losses": losses, "grads": grads}


# -- time_sequence_prediction: generate_sine_wave.py, train.py --------------------------------------
def test_time_sequence_example_generates_its_data_and_trains_with_lbfgs(tmp_path):
    import minigrad

    run("time_sequence_generate_sine_wave", cwd=tmp_path)
    data = minigrad.load(tmp_path / "traindata.pt", weights_only=False)
    assert data.shape == (100, 1000) and data.dtype == np.float64
    # training on all 100 waves of 1000 steps takes minutes; the first 5 waves' first 60 steps
    # (2 to train on, 3 to test) exercise the same program
    minigrad.save(data[:5, :60].copy(), tmp_path / "traindata.pt")
    out = run("time_sequence_train", argv=["--steps", "1", "--device", "cpu"], cwd=tmp_path).stdout
    losses, (test_loss,) = numbers_after(out, r"\nloss:"), numbers_after(out, r"test loss:")
    assert len(losses) == 20 and losses[-1] < 0.05 * losses[0] and test_loss < 0.05 * losses[0], out
    assert (tmp_path / "predict0.pdf").stat().st_size > 0


def time_sequence_steps(lib: str) -> dict[str, Any]:
    """One LBFGS step (its 20 closure evaluations) of the two-LSTMCell model, in float64."""
    ns = run("time_sequence_train", lib, main=False).namespace
    torch = lib_module(lib)
    x = np.arange(60) + np.array([[-40], [10], [35]])
    data = torch.tensor(np.sin(x / 20.0))
    with same_draws(torch):
        seq = ns["Sequence"]().double()
    optimizer, losses = ns["optim"].LBFGS(seq.parameters(), lr=0.8), []

    def closure():
        optimizer.zero_grad()
        loss = ns["nn"].MSELoss()(seq(data[:, :-1]), data[:, 1:])
        loss.backward()
        losses.append(loss.item())
        return loss

    optimizer.step(closure)
    with torch.no_grad():
        losses.append(ns["nn"].MSELoss()(seq(data[:, :-1], future=20)[:, :-20], data[:, 1:]).item())
    return {"losses": losses}


# -- pytorch/tutorials beginner_source/basics/quickstart_tutorial.py (data from torchvision) -------------
@needs_mnist
def test_quickstart_tutorial_trains_saves_loads_and_predicts(tmp_path):
    out = run("quickstart_tutorial", cwd=tmp_path).stdout
    losses, test_losses = numbers_after(out, r"(?m)^loss:"), numbers_after(out, r"Avg loss:")
    assert len(losses) == 5 and losses[-1] < losses[0] and test_losses[-1] < test_losses[0], out[-800:]
    assert "Shape of X [N, C, H, W]:  minigrad.Size([64, 1, 28, 28])" in out and "Done!" in out
    assert (tmp_path / "model.pth").stat().st_size > 0 and 'Predicted: "' in out


def quickstart_steps(lib: str) -> dict[str, Any]:
    """Three SGD steps of the tutorial's MLP with its CrossEntropyLoss, on the first 64 images."""
    ns = run("quickstart_tutorial", lib, main=False, cwd=Path(__import__("tempfile").mkdtemp())).namespace
    torch = lib_module(lib)
    x, y = torch.tensor(mnist_batch(64)), torch.tensor(np.arange(64) % 10)
    with same_draws(torch):
        model = ns["NeuralNetwork"]()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses, grads = [], {}
    for step in range(3):
        loss = ns["loss_fn"](model(x), y)
        optimizer.zero_grad()
        loss.backward()
        grads = grads if step else grads_of(model)
        optimizer.step()
        losses.append(loss.item())
    return {"losses": losses, "grads": grads}


# -- word_language_model/model.py, driven as its main.py drives it -------------------------------------
WORDS = ("the cat sat on the mat and the dog sat on the log while the bird sang in the tree " * 8).split()


def word_lm_steps(lib: str, kind: str = "LSTM", steps: int = 3, lr: float = 2.0) -> dict[str, Any]:
    """main.py's train(): batchify, bptt windows of 8, detach the hidden state between windows
    (its repackage_hidden),
    clip_grad_norm_(0.25) and the hand-written SGD step p.data.add_(p.grad, alpha=-lr) (--lr 2: the
    default 20 suits its Penn Treebank run, not 13 words)."""
    ns = run("word_language_model", lib, main=False).namespace
    torch = lib_module(lib)
    vocab = sorted(set(WORDS))
    ids = torch.tensor([vocab.index(w) for w in WORDS])
    data = ids[: ids.size(0) // 4 * 4].view(4, -1).t().contiguous()  # main.py's batchify(bsz=4)
    with same_draws(torch):
        if kind == "Transformer":
            model = ns["TransformerModel"](len(vocab), 16, 2, 32, 1, dropout=0.0)
        else:
            model = ns["RNNModel"](kind, len(vocab), 16, 16, 2, dropout=0.0)
    hidden = model.init_hidden(4) if kind != "Transformer" else None
    losses, grads = [], {}
    for i in range(steps):
        j = i % 4  # 36 rows of 4 streams: four windows of 8, then an epoch over again
        source, targets = data[j * 8:(j + 1) * 8], data[j * 8 + 1:(j + 1) * 8 + 1].reshape(-1)
        model.zero_grad()
        if kind == "Transformer":
            output = model(source).view(-1, len(vocab))
        else:
            hidden = hidden.detach() if isinstance(hidden, torch.Tensor) else tuple(h.detach() for h in hidden)
            output, hidden = model(source, hidden)
        loss = ns["nn"].NLLLoss()(output, targets)
        loss.backward()
        ns["torch"].nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        grads = grads if i else grads_of(model)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
        losses.append(loss.item())
    return {"losses": losses, "grads": grads}


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN_TANH", "Transformer"])
def test_word_language_model_learns_its_corpus(kind):
    losses = word_lm_steps("minigrad", kind, steps=20)["losses"]
    assert np.mean(losses[-4:]) < np.mean(losses[:4]) - 0.1, losses  # one epoch is four windows


@pytest.mark.parametrize("kind", ["GRU", "RNN_TANH"])
def test_word_language_model_recurrences_match_pytorch(kind):
    pytest.importorskip("torch")
    from harness import compare

    compare(word_lm_steps("minigrad", kind), word_lm_steps("torch", kind), rtol=1e-4)


PAIRS = {
    "vae_main": ("Linear VAE, randn_like, binary_cross_entropy(sum), torch.where/max/le/gt, Adam", vae_steps),
    "mnist_rnn_main": ("LSTM(batch_first), BatchNorm1d, Dropout2d, nll_loss, Adadelta, StepLR", mnist_rnn_steps),
    "time_sequence_train": ("LSTMCell x2 in float64, split, cat, LBFGS with a closure, torch.load", time_sequence_steps),
    "quickstart_tutorial": ("DataLoader over a torchvision dataset, Flatten, Sequential MLP, CrossEntropyLoss, SGD, "
                            "save/load state_dict, argmax", quickstart_steps),
    "word_language_model": ("RNNModel (Embedding, 2-layer LSTM, new_zeros hidden), TransformerModel(nn.Transformer), "
                            "detach, clip_grad_norm_, p.data.add_(alpha=)", word_lm_steps),
}
NEEDS_MNIST = {"vae_main", "mnist_rnn_main", "quickstart_tutorial"}


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_example_matches_pytorch_from_the_same_weights(name):
    pytest.importorskip("torch")
    from harness import compare

    if name in NEEDS_MNIST and not HAVE_MNIST:
        pytest.skip("the MNIST files are not in shared/data/mnist beside the repository")
    steps = PAIRS[name][1]
    compare(steps("minigrad"), steps("torch"), rtol=1e-4)
