"""conv2d autotuning, measured: a small CNN's training step and inference with
``minigrad.backends.autotune`` off (im2col for every conv) and on (each conv's algorithm timed on
first use: im2col, channels-last im2col or Winograd F(2x2, 3x3)), beside PyTorch on the CPU with
the same thread count (one unless OPENBLAS_NUM_THREADS says otherwise).

The CNN: 3 -> 32 -> 64 -> 128 -> 128 channels of 3x3 convs with ReLU, max-pooling after the
first two, on a batch of 16 32x32 images, then global average pooling and a linear layer. The
three contenders are timed in turn within every repeat (medians), after a warm-up that also does
the tuning, whose one-time cost is printed apart. Printed: ms per step, autotune on / off, and
each minigrad figure / torch; then what the tuner chose per conv shape and every algorithm's ms.
``python benchmarks/bench_autotune.py [--repeats R] [--steps N] [--batch B]``.
"""

from __future__ import annotations

import argparse
import time

from common import conditions, interleaved_cases, machine, torch  # first: sets BLAS threads before numpy

import numpy as np

import minigrad
import minigrad.backends
from minigrad import nn, optim
from minigrad.ops import conv_algorithms as algos


def cnn(lib):
    return lib.nn.Sequential(
        lib.nn.Conv2d(3, 32, 3, padding=1), lib.nn.ReLU(), lib.nn.MaxPool2d(2),
        lib.nn.Conv2d(32, 64, 3, padding=1), lib.nn.ReLU(), lib.nn.MaxPool2d(2),
        lib.nn.Conv2d(64, 128, 3, padding=1), lib.nn.ReLU(),
        lib.nn.Conv2d(128, 128, 3, padding=1), lib.nn.ReLU(),
        lib.nn.AdaptiveAvgPool2d(1), lib.nn.Flatten(), lib.nn.Linear(128, 10))


def cases(batch: int) -> tuple[dict[str, dict], float]:
    """case -> {contender: fn}, and the seconds the first (tuning) step took."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 3, 32, 32), dtype=np.float32)
    y = rng.integers(0, 10, batch)
    minigrad.manual_seed(0)
    model = cnn(minigrad)
    opt = optim.SGD(model.parameters(), lr=0.01)
    mx, my = minigrad.tensor(x), minigrad.tensor(y)

    def step(tuned: bool) -> None:
        minigrad.backends.autotune = tuned
        opt.zero_grad()
        nn.functional.cross_entropy(model(mx), my).backward()
        opt.step()

    def infer(tuned: bool) -> None:
        minigrad.backends.autotune = tuned
        with minigrad.no_grad():
            model(mx)

    algos.clear_autotune_cache()
    t0 = time.perf_counter()
    step(True)
    infer(True)
    tuning = time.perf_counter() - t0
    grads = []
    for tuned in (False, True):  # whatever the tuner chose computes the same step
        minigrad.backends.autotune = tuned
        model.zero_grad()
        nn.functional.cross_entropy(model(mx), my).backward()
        grads.append([p.grad.numpy().copy() for p in model.parameters()])
    for off, on in zip(*grads):
        np.testing.assert_allclose(on, off, rtol=1e-4, atol=1e-5)
    runs = {"CNN training step": {"autotune off": lambda: step(False), "autotune on": lambda: step(True)},
            "CNN inference (no_grad)": {"autotune off": lambda: infer(False), "autotune on": lambda: infer(True)}}
    if torch is not None:
        tmodel = cnn(torch)
        topt = torch.optim.SGD(tmodel.parameters(), lr=0.01)
        tx, ty = torch.from_numpy(x), torch.from_numpy(y)

        def tstep() -> None:
            topt.zero_grad()
            torch.nn.functional.cross_entropy(tmodel(tx), ty).backward()
            topt.step()

        def tinfer() -> None:
            with torch.no_grad():
                tmodel(tx)

        runs["CNN training step"]["torch"] = tstep
        runs["CNN inference (no_grad)"]["torch"] = tinfer
    return runs, tuning


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    print(f"conv2d autotuning on {machine()}")
    runs, tuning = cases(args.batch)
    ms = interleaved_cases(runs, args.repeats, args.steps)
    names = list(next(iter(runs.values())))
    print(f"{'ms per call':26}" + "".join(f"{n:>14}" for n in names) + "    on/off" +
          ("   off/torch    on/torch" if torch is not None else ""))
    for case, t in ms.items():
        line = f"{case:26}" + "".join(f"{t[n]:14.2f}" for n in names) + f"{t['autotune on'] / t['autotune off']:9.2f}x"
        if torch is not None:
            line += f"{t['autotune off'] / t['torch']:11.2f}x{t['autotune on'] / t['torch']:11.2f}x"
        print(line)
    if torch is None:
        print("torch is not installed: minigrad's figures only (make torch installs it)")
    print(f"tuning (the first step and inference, every algorithm timed per conv shape): {tuning * 1e3:.0f} ms")
    print("what the tuner chose (ms of each algorithm; inf: does not apply):")
    for e in algos.autotune_cache():
        times = "  ".join(f"{k} {v:.2f}" for k, v in e.times_ms.items())
        print(f"  {str(e.input):18} x {str(e.weight):18} {'train' if e.with_grad else 'infer'}: {e.algorithm:12} ({times})")
    print(conditions())


if __name__ == "__main__":
    main()
