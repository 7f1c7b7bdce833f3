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
import gc
import os
import statistics
import time

# numpy's OpenBLAS reads this once, when numpy is first imported; torch is told the same below.
THREADS = int(os.environ.setdefault("OPENBLAS_NUM_THREADS", "1"))

import numpy  # noqa: E402

import minigrad  # noqa: E402

try:
    import torch
except ImportError:
    torch = None

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


def time_steps(x, params, steps: int) -> float:
    """Milliseconds per forward + backward step, averaged over ``steps`` consecutive steps."""
    t0 = time.perf_counter()
    for _ in range(steps):
        step(x, params)
    return (time.perf_counter() - t0) * 1e3 / steps


def blas_info() -> str:
    """numpy's BLAS, its kernel and its threads, when threadpoolctl is there to ask."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return f"numpy BLAS x{THREADS} (pip install threadpoolctl to see which kernel)"
    blas = [i for i in threadpool_info() if i["user_api"] == "blas"]
    return "numpy BLAS " + ", ".join(
        f"{i['internal_api']} {i.get('architecture', '')} x{i['num_threads']}" for i in blas)


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
    contenders = {"minigrad": (minigrad.tensor(x0),
                               [minigrad.tensor(a, requires_grad=True) for a in arrays])}
    if torch is not None:
        torch.set_num_threads(THREADS)
        contenders["torch"] = (torch.tensor(x0),
                               [torch.tensor(a, requires_grad=True) for a in arrays])

    for x, params in contenders.values():  # warm up caches, BLAS threads and lazy imports
        for _ in range(2):
            step(x, params)
    if torch is not None:  # the same computation in both, or the comparison means nothing
        for m, t in zip(contenders["minigrad"][1], contenders["torch"][1]):
            numpy.testing.assert_allclose(m.grad.numpy(), t.grad.numpy(), rtol=1e-3, atol=1e-6)

    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(args.repeats):
        for name, (x, params) in contenders.items():
            gc.collect()
            times[name].append(time_steps(x, params, args.steps))
    ms = {name: statistics.median(t) for name, t in times.items()}

    print(f"bench_matmul_chain: MLP {'-'.join(map(str, SIZES))}, batch {BATCH}, float32, "
          "forward + backward")
    print(f"median of {args.repeats} interleaved repeats x {args.steps} steps; {blas_info()}"
          + (f"; torch threads x{torch.get_num_threads()}" if torch is not None else ""))
    print()
    header = f"{'':22}" + "".join(f"{name:>12}" for name in ms)
    row = f"{'ms per step':22}" + "".join(f"{t:12.3f}" for t in ms.values())
    if torch is not None:
        ratio = ms["minigrad"] / ms["torch"]
        header += "     ratio   target"
        row += f"{ratio:9.2f}x   <= {TARGET}x ({'met' if ratio <= TARGET else 'not met'})"
    print(header, row, sep="\n")
    if torch is None:
        print("\ntorch is not installed: minigrad's figures only (make torch installs it)")


if __name__ == "__main__":
    main()
