"""Training steps of an MLP and a CNN, minigrad vs PyTorch CPU: forward, loss, backward, SGD step.

(a) MLP 784-512-512-10 with ReLU on a batch of 128; (b) CNN conv(1->32, 3x3)-ReLU-maxpool(2)-
conv(32->64, 3x3)-ReLU-maxpool(2)-linear(1600->10) on 28x28 images, batch 64. Both use
cross-entropy and SGD with momentum. The same initial weights go into both frameworks (copied
through the state dicts, whose names match), the first steps are checked to agree, and then
steps are timed in interleaved repeats. Targets: MLP <= 1.3x, CNN <= 2.5x PyTorch.

``make bench``, or ``python benchmarks/bench_train.py [--repeats R] [--steps N]``.
"""

from __future__ import annotations

import argparse

from common import blas_info, interleaved, table, torch  # first: sets BLAS threads before numpy

import numpy

import minigrad
from minigrad import nn, optim

TARGETS = {"MLP 784-512-512-10, b=128": 1.3, "CNN 28x28, b=64": 2.5}


def mlp(lib):
    return lib.nn.Sequential(lib.nn.Linear(784, 512), lib.nn.ReLU(), lib.nn.Linear(512, 512), lib.nn.ReLU(),
                             lib.nn.Linear(512, 10))


def cnn(lib):
    n = lib.nn
    return n.Sequential(n.Conv2d(1, 32, 3), n.ReLU(), n.MaxPool2d(2), n.Conv2d(32, 64, 3), n.ReLU(),
                        n.MaxPool2d(2), n.Flatten(), n.Linear(64 * 5 * 5, 10))


def make_step(lib, model, x, y):
    opt = (optim if lib is minigrad else torch.optim).SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = lib.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return step


def contenders(build, x0, y0):
    minigrad.manual_seed(0)
    model = build(minigrad)
    runs = {"minigrad": make_step(minigrad, model, minigrad.tensor(x0), minigrad.tensor(y0))}
    if torch is not None:
        twin = build(torch)
        twin.load_state_dict({k: torch.tensor(v.numpy()) for k, v in model.state_dict().items()})
        runs["torch"] = make_step(torch, twin, torch.tensor(x0), torch.tensor(y0))
        losses = [[runs[n]().item() for _ in range(3)] for n in ("minigrad", "torch")]
        numpy.testing.assert_allclose(losses[0], losses[1], rtol=1e-3)  # the same computation
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="interleaved repeats (median taken)")
    parser.add_argument("--steps", type=int, default=5, help="steps per repeat")
    args = parser.parse_args()
    rng = numpy.random.default_rng(0)
    cases = {
        "MLP 784-512-512-10, b=128": (mlp, rng.standard_normal((128, 784)).astype(numpy.float32),
                                      rng.integers(0, 10, 128)),
        "CNN 28x28, b=64": (cnn, rng.standard_normal((64, 1, 28, 28)).astype(numpy.float32),
                            rng.integers(0, 10, 64)),
    }
    rows = {}
    for name, (build, x0, y0) in cases.items():
        rows[name] = interleaved(contenders(build, x0, y0), args.repeats, args.steps)
    print("bench_train: one training step (forward, cross-entropy, backward, SGD with momentum)")
    print(f"median of {args.repeats} interleaved repeats x {args.steps} steps; {blas_info()}")
    print()
    print(table(rows, TARGETS))


if __name__ == "__main__":
    main()
