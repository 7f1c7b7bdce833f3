"""Mixed precision and the profiler, measured: what autocast + GradScaler buy an MLP training step
over float32, and what ``profile()`` costs one.

(a) Activation memory: tanh MLPs (width x depth) on a batch of b, cross-entropy. The tracker
    (``minigrad.memory.track``) reads the bytes alive after forward + loss beyond those alive before
    (parameters, data): what the graph keeps for backward. Under autocast the activations are
    float16, exactly half, but backward also needs float16 copies of the input batch and of the
    weights (PyTorch keeps the same copies), which add 1/(2 depth) + width/(2 b) to the ratio; the
    table shows them apart. Target: at most 55% of float32's. (tanh keeps its output, which the
    next layer keeps anyway; ReLU keeps a bool mask as a bare array, which the tracker does not see.)
(b) Step time: MLP 784-256-256-10 with ReLU, batch 128, float32 vs autocast + GradScaler. numpy has
    no BLAS kernel for float16, so its matrix products run about a hundred times slower than
    float32's: on CPU mixed precision saves memory, not time (the GPU issue measures the speed-up).
(c) Profiler overhead: bench_train's MLP step (784-512-512-10, batch 128) and bench_overhead's
    200 tiny elementwise ops, with and without ``profile()`` active.

``make bench``, or ``python benchmarks/bench_amp.py [--repeats R] [--steps N]``.
"""

from __future__ import annotations

import argparse
import gc
import os

from common import blas_info, interleaved  # first: sets BLAS threads before numpy

import numpy

import minigrad
import minigrad.nn.functional as F
from minigrad import memory, nn, optim
from minigrad.profiler import profile

MEMORY_TARGET = 0.55


def mlp(widths: list[int], act: type[nn.Module]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        layers += [nn.Linear(a, b)] + ([act()] if i < len(widths) - 2 else [])
    return nn.Sequential(*layers)


def make_step(model: nn.Module, x: minigrad.Tensor, y: minigrad.Tensor, mixed: bool):
    opt = optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = minigrad.GradScaler(enabled=mixed)

    def step():
        opt.zero_grad()
        with minigrad.autocast(enabled=mixed):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss

    return step


def activation_bytes(width: int, depth: int, batch: int, mixed: bool) -> int:
    """Bytes the graph of a tanh MLP holds after forward + loss, beyond what was alive before."""
    rng = numpy.random.default_rng(0)
    x = minigrad.tensor(rng.standard_normal((batch, width)).astype(numpy.float32))
    y = minigrad.tensor(rng.integers(0, 10, batch))
    minigrad.manual_seed(0)
    model = mlp([width] * (depth + 1) + [10], nn.Tanh)
    gc.collect()
    with memory.track() as mem:
        with minigrad.autocast(enabled=mixed):
            loss = F.cross_entropy(model(x), y)
        held = mem.current - mem.start
    del loss
    return held


def float16_copies(width: int, depth: int, batch: int) -> int:
    """The float16 copies autocast keeps for backward: the input batch (for the first weight's
    gradient) and every weight after the first (for the input gradients)."""
    return 2 * (batch * width + (depth - 1) * width * width + 10 * width)


def ratio_table(title: str, rows: dict[str, tuple[float, float]], names: tuple[str, str]) -> str:
    """One line per case: baseline ms, contender ms, contender / baseline."""
    lines = [f"{title:32}{names[0]:>10}{names[1]:>11}{'ratio':>8}"]
    for case, (base, other) in rows.items():
        lines.append(f"{case:32}{base:10.3f}{other:11.3f}{other / base:7.2f}x")
    return "\n".join(lines)


def tiny_chain(x, w):
    """bench_overhead's chain: 200 elementwise ops on 16 elements, then a sum."""
    h = x
    for _ in range(25):
        h = ((((((h * w + 0.5).tanh() * 1.5).sigmoid()).exp()) - 1.0) * 0.5)
    return h.sum()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repeats (median taken)")
    parser.add_argument("--steps", type=int, default=2, help="steps per repeat (mixed precision is slow)")
    args = parser.parse_args()
    print("bench_amp: mixed precision (autocast + GradScaler) vs float32, and the profiler's overhead")
    print(f"{blas_info()}; load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}")

    print()
    print("(a) activation memory after forward + loss, MB beyond parameters and data (tracker)")
    print(f"{'tanh MLP width x depth, batch':32}{'float32':>10}{'autocast':>10}{'ratio':>8}   {'target':19}"
          f"{'f16 copies':>11}{'ratio without':>15}")
    for width, depth, batch in [(128, 8, 256), (128, 8, 1024), (128, 8, 4096), (64, 16, 4096)]:
        full, mixed = (activation_bytes(width, depth, batch, m) for m in (False, True))
        copies = float16_copies(width, depth, batch)
        ratio = mixed / full
        verdict = f"<= {MEMORY_TARGET}x ({'met' if ratio <= MEMORY_TARGET else 'not met'})"
        print(f"{f'{width} x {depth}, b={batch}':32}{full / 2**20:10.2f}{mixed / 2**20:10.2f}{ratio:7.2f}x   "
              f"{verdict:19}{copies / 2**20:11.2f}{(mixed - copies) / full:14.2f}x")

    rng = numpy.random.default_rng(0)
    x = minigrad.tensor(rng.standard_normal((128, 784)).astype(numpy.float32))
    y = minigrad.tensor(rng.integers(0, 10, 128))
    minigrad.manual_seed(0)
    runs = {"float32": make_step(mlp([784, 256, 256, 10], nn.ReLU), x, y, False)}
    minigrad.manual_seed(0)
    runs["autocast"] = make_step(mlp([784, 256, 256, 10], nn.ReLU), x, y, True)
    for run in runs.values():
        run()
    ms = interleaved(runs, args.repeats, args.steps)
    print()
    print(f"(b) step time, MLP 784-256-256-10, batch 128 (median of {args.repeats} x {args.steps} steps)")
    print(ratio_table("ms per step", {"training step": (ms["float32"], ms["autocast"])},
                      ("float32", "autocast")))

    minigrad.manual_seed(0)
    step = make_step(mlp([784, 512, 512, 10], nn.ReLU), x, y, False)
    leaves = [minigrad.tensor(rng.standard_normal(16).astype(numpy.float32), requires_grad=True) for _ in range(2)]

    def tiny():
        for leaf in leaves:
            leaf.grad = None
        tiny_chain(*leaves).backward()

    def profiled(fn):
        def run():
            with profile():
                fn()
        return run

    cases = {"MLP 784-512-512-10 step": step, "200 tiny ops fwd+bwd": tiny}
    prof_rows = {}
    for name, fn in cases.items():
        fn()
        t = interleaved({"off": fn, "on": profiled(fn)}, 3 * args.repeats, 5 * args.steps)
        prof_rows[name] = (t["off"], t["on"])
    with profile() as prof:
        step()
    n_ops = len(prof.events)
    print()
    print(f"(c) profiler overhead (median of {3 * args.repeats} x {5 * args.steps} steps; the MLP step "
          f"records {n_ops} op events)")
    print(ratio_table("ms per step", prof_rows, ("off", "profile()")))
    print()
    print("where the MLP step's time goes (profile of one step):")
    print(prof.table(row_limit=6))


if __name__ == "__main__":
    main()
