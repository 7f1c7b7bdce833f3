"""Real public PyTorch programs, ported by changing only their import lines, run unchanged on minigrad.
Each program file names its source; here each runs at a small size chosen through its
own arguments or constants, and where PyTorch is installed the same file with its original import
lines runs on torch from minigrad's weights, and the two must agree."""

import contextlib
import io
import re
import runpy
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import minigrad
from harness import HAVE_MNIST

HERE = Path(__file__).resolve().parent
TORCH_IMPORT = re.compile(r"^.*  # ((?:import|from) torch(?!vision)\b.*)$", re.M)


@pytest.fixture(autouse=True)
def _importable(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))  # the programs import torchvision_shim


def load(name: str, lib: str = "minigrad") -> types.ModuleType:
    """The program as a module; ``lib="torch"`` puts its original torch import lines back."""
    source = (HERE / f"{name}.py").read_text()
    if lib == "torch":
        pytest.importorskip("torch")
        source = TORCH_IMPORT.sub(lambda m: m.group(1), source)
    module = types.ModuleType(f"ported_{name}_{lib}")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(source, str(HERE / f"{name}.py"), "exec"), module.__dict__)
    finally:
        del sys.modules[module.__name__]
    return module


def to_torch(state: dict) -> dict:
    import torch

    return {k: torch.tensor(v.numpy()) for k, v in state.items()}


# -- pytorch/tutorials: beginner_source/examples_nn/polynomial_nn.py ------------------------------
def _run_polynomial() -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(str(HERE / "polynomial_nn.py"), run_name="__main__")
    return out.getvalue()


@pytest.mark.filterwarnings("ignore:invalid escape sequence:DeprecationWarning")  # the tutorial's docstring
def test_polynomial_tutorial_fits_sin_as_the_tutorial_says():
    minigrad.manual_seed(0)
    lines = _run_polynomial().splitlines()
    losses = [float(line.split()[1]) for line in lines[:-1]]
    assert len(losses) == 20 and losses[-1] < losses[0] and losses[-1] < 20
    a, b, c, d = (float(term.split()[0]) for term in lines[-1].split(" = ")[1].split(" + "))
    assert abs(b - 0.85) < 0.03 and abs(d + 0.092) < 0.005 and abs(a) < 0.1 and abs(c) < 0.05


# -- karpathy/nanoGPT: model.py, with a small train and sample loop ------------------------------
CONFIG = dict(block_size=16, vocab_size=32, n_layer=2, n_head=2, n_embd=16, dropout=0.0, bias=True)
TEXT = "the quick brown fox jumps over the lazy dog; " * 20


def _batches(lib, n, batch_size=4, block_size=16, seed=0):
    chars = sorted(set(TEXT))
    data = np.array([chars.index(ch) for ch in TEXT], dtype=np.int64)
    rng = np.random.default_rng(seed)
    for _ in range(n):
        starts = rng.integers(0, len(data) - block_size - 1, batch_size)
        x = np.stack([data[s:s + block_size] for s in starts])
        y = np.stack([data[s + 1:s + 1 + block_size] for s in starts])
        yield lib.tensor(x), lib.tensor(y)


def test_nanogpt_trains_and_samples_on_minigrad():
    gpt = load("nanogpt_model")
    minigrad.manual_seed(0)
    with contextlib.redirect_stdout(io.StringIO()):
        model = gpt.GPT(gpt.GPTConfig(**CONFIG))
        optimizer = model.configure_optimizers(weight_decay=0.1, learning_rate=3e-3, betas=(0.9, 0.95),
                                               device_type="cpu")
    assert len(set(TEXT)) <= CONFIG["vocab_size"]
    losses = []
    for x, y in _batches(minigrad, 60):
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        minigrad.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
    assert np.mean(losses[-5:]) < 0.6 * np.mean(losses[:5])
    model.eval()
    start = minigrad.zeros((2, 1), dtype=minigrad.long)
    out = model.generate(start, max_new_tokens=20, temperature=0.8, top_k=5)
    assert out.shape == (2, 21) and out.dtype == minigrad.int64 and int(out.max()) < CONFIG["vocab_size"]
    model.crop_block_size(8)
    assert model.generate(start, max_new_tokens=10).shape == (2, 11)


def test_nanogpt_matches_pytorch_on_logits_loss_gradients_and_an_adamw_step():
    gpt_mg, gpt_th = load("nanogpt_model"), load("nanogpt_model", "torch")
    import torch

    minigrad.manual_seed(1)
    with contextlib.redirect_stdout(io.StringIO()):
        mg_model, th_model = gpt_mg.GPT(gpt_mg.GPTConfig(**CONFIG)), gpt_th.GPT(gpt_th.GPTConfig(**CONFIG))
        th_model.load_state_dict(to_torch(mg_model.state_dict()))
        opts = [m.configure_optimizers(0.1, 1e-2, (0.9, 0.95), "cpu") for m in (mg_model, th_model)]
    (xm, ym), (xt, yt) = next(_batches(minigrad, 1, seed=3)), next(_batches(torch, 1, seed=3))
    (lm, loss_m), (lt, loss_t) = mg_model(xm, ym), th_model(xt, yt)
    np.testing.assert_allclose(lm.detach().numpy(), lt.detach().numpy(), rtol=1e-5, atol=1e-5)
    assert abs(loss_m.item() - loss_t.item()) < 1e-5
    loss_m.backward()
    loss_t.backward()
    grads_t = dict(th_model.named_parameters())
    for name, p in mg_model.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), grads_t[name].grad.numpy(), rtol=1e-4, atol=1e-6, err_msg=name)
    for opt in opts:
        opt.step()
    after_t = th_model.state_dict()
    for name, v in mg_model.state_dict().items():  # atol: the key bias's gradient is 0 up to rounding, which
        # AdamW's first step (g / (|g| + eps)) turns into steps of up to lr * 1e-3 either way
        np.testing.assert_allclose(v.numpy(), after_t[name].numpy(), rtol=1e-5, atol=2e-5, err_msg=name)
    mg_model.eval()
    th_model.eval()
    np.testing.assert_allclose(mg_model(xm)[0].detach().numpy(), th_model(xt)[0].detach().numpy(), atol=1e-5)


# -- pytorch/examples: mnist/main.py --------------------------------------------------------------
needs_mnist = pytest.mark.skipif(not HAVE_MNIST, reason="the MNIST files are not in shared/data/mnist beside the repository")


@needs_mnist
def test_mnist_example_trains_through_its_own_command_line(monkeypatch):
    mnist = load("mnist_main")
    monkeypatch.setattr(sys, "argv", ["main.py", "--epochs", "1", "--batch-size", "16", "--test-batch-size", "64",
                                      "--log-interval", "3"])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        mnist.main()
    (accuracy,) = [int(a) for a in re.findall(r"Accuracy: (\d+)/64", out.getvalue())]
    losses = [float(v) for v in re.findall(r"Loss: ([\d.]+)", out.getvalue())]
    assert len(losses) == 4 and losses[-1] < losses[0] and accuracy > 0.25 * 64, out.getvalue()  # chance: 10%


def test_mnist_net_matches_pytorch_with_copied_weights():
    mnist_mg, mnist_th = load("mnist_main"), load("mnist_main", "torch")
    import torch

    minigrad.manual_seed(2)
    net_m, net_t = mnist_mg.Net(), mnist_th.Net()
    net_t.load_state_dict(to_torch(net_m.state_dict()))
    x = np.random.default_rng(0).standard_normal((4, 1, 28, 28)).astype(np.float32)
    target = np.array([3, 1, 4, 1])
    for net in (net_m, net_t):
        net.eval()  # dropout off: the two libraries draw different masks
    out_m, out_t = net_m(minigrad.tensor(x)), net_t(torch.tensor(x))
    np.testing.assert_allclose(out_m.detach().numpy(), out_t.detach().numpy(), rtol=1e-4, atol=1e-5)
    mnist_mg.F.nll_loss(out_m, minigrad.tensor(target)).backward()
    mnist_th.F.nll_loss(out_t, torch.tensor(target)).backward()
    opt_m, opt_t = mnist_mg.optim.Adadelta(net_m.parameters()), mnist_th.optim.Adadelta(net_t.parameters())
    opt_m.step()
    opt_t.step()
    after_t = net_t.state_dict()
    for name, v in net_m.state_dict().items():
        np.testing.assert_allclose(v.numpy(), after_t[name].numpy(), rtol=1e-4, atol=1e-5, err_msg=name)
