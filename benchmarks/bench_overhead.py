"""Per-op framework overhead: 200 elementwise ops on 16 float32 elements, forward + backward.

On 16 elements the arithmetic is free, so the time per step is what the framework spends per op:
building the graph node, dispatching, saving tensors, and walking the graph backwards. minigrad
and PyTorch (CPU, eager) run the same chain in the same process, in interleaved repeats, and the
median step time of each is compared. PyTorch runs on one thread, which is what it would pick for
16 elements anyway; numpy never threads elementwise ops. Target (issues 19 and 28): minigrad <= 1.15x
PyTorch. The backward rules run on raw arrays here (nobody records the backward pass: `ctx.ops` is
bound to numpy), so the backward half is the engine walk and numpy, not Tensor construction.

Run with ``make bench`` (it unsets OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE), or directly:
``python benchmarks/bench_overhead.py [--repeats R] [--steps N]``.
"""

from __future__ import annotations

import argparse

from common import conditions, interleaved, table, torch  # first: sets BLAS threads (one) before numpy

import numpy

import minigrad

N_ELEMENTS = 16
N_BLOCKS = 25
BLOCK_OPS = 8  # ops per block in chain(); 25 blocks of 8 give the 200 timed ops
TARGET = 1.15


def chain(x, w):
    """200 elementwise ops that keep every value bounded, then a sum to backpropagate from.
    Written once for both frameworks: only operators and Tensor methods they share."""
    h = x
    for _ in range(N_BLOCKS):
        h = h * w          # tensor product, |w| < 1.5
        h = h + 0.5
        h = h.tanh()       # (-1, 1)
        h = h * 1.5
        h = h.sigmoid()    # (0, 1)
        h = h.exp()        # (1, e)
        h = h - 1.0        # (0, 1.72)
        h = h * 0.5        # (0, 0.86)
    return h.sum()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15, help="interleaved repeats (median taken)")
    parser.add_argument("--steps", type=int, default=20, help="steps per repeat")
    args = parser.parse_args()

    rng = numpy.random.default_rng(0)
    x0 = rng.standard_normal(N_ELEMENTS).astype(numpy.float32)
    w0 = rng.uniform(-1.5, 1.5, N_ELEMENTS).astype(numpy.float32)
    libs = {"minigrad": minigrad} | ({"torch": torch} if torch is not None else {})
    leaves = {name: (lib.tensor(x0, requires_grad=True), lib.tensor(w0, requires_grad=True))
              for name, lib in libs.items()}

    def step(x, w):
        x.grad = w.grad = None
        chain(x, w).backward()

    runs = {name: (lambda x=x, w=w: step(x, w)) for name, (x, w) in leaves.items()}
    for run in runs.values():  # warm up caches and lazy imports
        for _ in range(3):
            run()
    if torch is not None:  # the same computation in both, or the comparison means nothing
        for m, t in zip(leaves["minigrad"], leaves["torch"]):
            numpy.testing.assert_allclose(m.grad.numpy(), t.grad.numpy(), rtol=1e-4, atol=1e-6)

    ms = interleaved(runs, args.repeats, args.steps)
    n_ops = N_BLOCKS * BLOCK_OPS
    print(f"bench_overhead: {n_ops} elementwise ops + sum on {N_ELEMENTS} float32 elements, "
          f"forward + backward")
    print(f"median of {args.repeats} interleaved repeats x {args.steps} steps; torch on 1 thread; {conditions()}")
    print()
    print(table({"forward + backward": ms}, {"forward + backward": TARGET}))
    print(f"{'us per op (fwd+bwd)':28}" + "".join(f"{t * 1e3 / n_ops:12.2f}" for t in ms.values()))


if __name__ == "__main__":
    main()
