"""The caching allocator (minigrad.backend.allocator), measured: a training step's allocations with and
without the pool, time and peak reserved memory side by side.

The step's allocation pattern is an MLP's: forward allocates one activation per layer and keeps
it, backward allocates a gradient per layer and frees the activation it consumed, every buffer
is written once (so fresh pages are faulted in, as an op's output is). "numpy" allocates each
buffer with ``numpy.empty``; "pool" takes it from a ``CachingAllocator``. Peak memory is, for
numpy, the most bytes live at once (what malloc must hold at least), and for the pool its peak
reserved bytes. Run with a small width (many small buffers: Python's per-call cost dominates) and
a large one (buffers of several MiB: malloc maps and the kernel zero-fills fresh pages each step).

Then the pool where minigrad uses it: im2col's columns (``ops/conv.py``), the one CPU temporary
of 256 KiB and more that an op copies into a buffer of its own choosing; a small CNN's training
step (forward, loss, backward, SGD) with ``allocator.enable(False)`` and with the pool.

``python benchmarks/bench_pool.py [--repeats R] [--steps N]``.
"""

from __future__ import annotations

import argparse

from common import interleaved  # first: sets BLAS threads before numpy

import numpy

import minigrad
from minigrad import nn
from minigrad.backend import allocator
from minigrad.backend.allocator import CachingAllocator


def step_pattern(batch: int, width: int, layers: int) -> list[tuple[str, int, int]]:
    """(``alloc``, id, bytes) and (``free``, id, 0) events of one forward and backward pass."""
    events, size = [], batch * width * 4
    for i in range(layers):
        events.append(("alloc", i, size))  # activation i
    for i in reversed(range(layers)):
        events.append(("alloc", layers + i, size))  # gradient of activation i
        events.append(("free", i, 0))
        if i + 1 < layers:
            events.append(("free", layers + i + 1, 0))
    events.append(("free", layers, 0))
    return events


def replay(events: list, empty) -> None:
    live = {}
    for kind, key, nbytes in events:
        if kind == "alloc":
            a = empty(nbytes // 4)
            a.fill(1.0)
            live[key] = a
        else:
            del live[key]


def peak_live(events: list) -> int:
    sizes, live, peak = {}, 0, 0
    for kind, key, nbytes in events:
        if kind == "alloc":
            sizes[key] = nbytes
            live += nbytes
            peak = max(peak, live)
        else:
            live -= sizes[key]
    return peak


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    print(f"{'case':34}{'numpy ms':>10}{'pool ms':>10}{'pool/numpy':>12}{'numpy peak MiB':>16}{'pool reserved MiB':>19}")
    for batch, width, layers in [(32, 64, 16), (64, 1024, 16), (256, 4096, 8)]:
        events = step_pattern(batch, width, layers)
        pool = CachingAllocator()
        times = interleaved({
            "numpy": lambda: replay(events, lambda n: numpy.empty(n, numpy.float32)),
            "pool": lambda: replay(events, lambda n: pool.empty(n, numpy.float32)),
        }, args.repeats, args.steps)
        mib = batch * width * 4 / 2**20
        case = f"batch {batch} x {width}, {layers} layers ({mib:.2f} MiB)"
        print(f"{case:34}{times['numpy']:10.3f}{times['pool']:10.3f}{times['pool'] / times['numpy']:11.2f}x"
              f"{peak_live(events) / 2**20:16.1f}{pool.memory_stats()['reserved_bytes.all.peak'] / 2**20:19.1f}")

    minigrad.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
                          nn.Flatten(), nn.Linear(32 * 32 * 32, 10))
    opt = minigrad.optim.SGD(model.parameters(), lr=0.01)
    x, y = minigrad.randn(32, 3, 32, 32), minigrad.randint(0, 10, (32,))

    def step(pooled: bool) -> None:
        allocator.enable(pooled)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    allocator.cpu_allocator.reset_stats()
    times = interleaved({"no pool": lambda: step(False), "pool": lambda: step(True)}, args.repeats, args.steps)
    allocator.enable(True)
    stats = allocator.cpu_allocator.memory_stats()
    print(f"\nCNN step (batch 32, 3->32->32 channels, 32x32): no pool {times['no pool']:.1f} ms, pool "
          f"{times['pool']:.1f} ms ({times['pool'] / times['no pool']:.2f}x); pool reserved "
          f"{stats['reserved_bytes.all.peak'] / 2**20:.1f} MiB at peak, {stats['num_cache_hits']} of "
          f"{stats['num_alloc']} allocations served from the cache")


if __name__ == "__main__":
    main()
