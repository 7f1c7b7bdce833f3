"""A 3-layer MLP written with raw tensor ops, forward + backward: where the time is in the matmuls.

784-512-512-10 on a batch of 128, float32: ``relu(x @ W1 + b1)``, ``relu(. @ W2 + b2)``,
``. @ W3 + b3``, loss ``(out**2).mean()``. Nine matmuls per step (three forward, six backward)
dominate, so the ratio shows what minigrad adds around numpy's BLAS: extra copies, transposes and
the graph. minigrad and PyTorch (CPU, eager) run the same weights in the same process, in
interleaved repeats, and the median step time of each is compared. Both get the same number of
threads: OPENBLAS_NUM_THREADS, one unless set (on a small machine shared with other work a second
thread mostly waits for a busy core). Target: minigrad <= 1.3x PyTorch.

Run with ``make bench`` (it unsets OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE), or directly:
``[OPENBLAS_NUM_THREADS=2] python benchmarks/bench_matmul_chain.py [--repeats R] [--steps N]``.
"""

from __future__ import annotations

import argparse

from common import blas_info, interleaved, table, torch  # first: sets BLAS threads before numpy

import numpy

import minigrad

BATCH, SIZES = 128, (784, 512, 512, 10)
TARGET = 1.3


def loss_fn(x, params):
    """The MLP and its loss, written once for both frameworks with the operators they share."""
    w1, b1, w2, b2, w3, b3 = params
    h = (x @ w1 + b1).relu()
    h = (h @ w2 + b2).relu()
    out = h @ w3 + b3
    return (out**2).mean()


def step(x, params) -> None:
    for p in params:
        p.grad = None
    loss_fn(x, params).backward()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9, help="interleaved repeats (median taken)")
    parser.add_argument("--steps", type=int, default=5, help="steps per repeat")
    args = parser.parse_args()

    rng = numpy.random.default_rng(0)
    x0 = rng.standard_normal((BATCH, SIZES[0])).astype(numpy.float32)
    arrays = []
    for n_in, n_out in zip(SIZES, SIZES[1:]):
        bound = 1 / numpy.sqrt(n_in)  # nn.Linear's default range
        arrays.append(rng.uniform(-bound, bound, (n_in, n_out)).astype(numpy.float32))
        arrays.append(rng.uniform(-bound, bound, n_out).astype(numpy.float32))
    libs = {"minigrad": minigrad} | ({"torch": torch} if torch is not None else {})
    contenders = {name: (lib.tensor(x0), [lib.tensor(a, requires_grad=True) for a in arrays])
                  for name, lib in libs.items()}
    runs = {name: (lambda x=x, params=params: step(x, params)) for name, (x, params) in contenders.items()}
    for run in runs.values():  # warm up caches, BLAS threads and lazy imports
        for _ in range(2):
            run()
    if torch is not None:  # the same computation in both, or the comparison means nothing
        for m, t in zip(contenders["minigrad"][1], contenders["torch"][1]):
            numpy.testing.assert_allclose(m.grad.numpy(), t.grad.numpy(), rtol=1e-3, atol=1e-6)

    ms = interleaved(runs, args.repeats, args.steps)
    print(f"bench_matmul_chain: MLP {'-'.join(map(str, SIZES))}, batch {BATCH}, float32, "
          "forward + backward")
    print(f"median of {args.repeats} interleaved repeats x {args.steps} steps; {blas_info()}")
    print()
    print(table({"forward + backward": ms}, {"forward + backward": TARGET}))


if __name__ == "__main__":
    main()
