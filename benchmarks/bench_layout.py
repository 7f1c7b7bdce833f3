"""The cost of memory layout, measured: the same arithmetic on the same values, laid out two ways.

(a) Reductions over a (2048, 2048) float32 matrix: along rows (the last, contiguous dim: each sum
    reads consecutive memory) and along columns (each sum strides 2048 elements apart).
(b) A (1024, 1024) float32 matmul with the right operand as stored, and as a transposed view
    ``b.T`` (no copy: BLAS is told the operand is transposed).
(c) Conv2d(32, 32, 3, padding=1) forward and backward on a batch of 8 32x32 images in NCHW
    (contiguous) and NHWC (``channels_last``) layout.

Each case runs in minigrad and in PyTorch (when installed) in the same run, interleaved, with the
ratio minigrad / torch. There is no target: the point is the spread between layouts, which chapter
01's lesson 05 plots. ``python benchmarks/bench_layout.py [--repeats R] [--steps N]``.
"""

from __future__ import annotations

import argparse

from common import interleaved_cases, machine, table, torch  # first: sets BLAS threads before numpy

import numpy as np

import minigrad
from minigrad import nn


def cases(n: int = 2048, m: int = 1024, batch: int = 8) -> dict[str, dict]:
    """case -> {"minigrad": fn, "torch": fn}; each fn runs the case once."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, n), dtype=np.float32)
    a, b = rng.standard_normal((m, m), dtype=np.float32), rng.standard_normal((m, m), dtype=np.float32)
    img = rng.standard_normal((batch, 32, 32, 32), dtype=np.float32)
    mx, ma, mb = minigrad.tensor(x), minigrad.tensor(a), minigrad.tensor(b)
    minigrad.manual_seed(0)
    conv = nn.Conv2d(32, 32, 3, padding=1)
    nchw = minigrad.tensor(img, requires_grad=True)
    nhwc = minigrad.tensor(img).to(memory_format=minigrad.channels_last).requires_grad_()

    def conv_step(z):
        conv(z).sum().backward()

    runs = {
        "sum along rows (dim=1)": {"minigrad": lambda: mx.sum(1)},
        "sum along columns (dim=0)": {"minigrad": lambda: mx.sum(0)},
        "matmul a @ b": {"minigrad": lambda: ma @ mb},
        "matmul a @ b.T (view)": {"minigrad": lambda: ma @ mb.T},
        "conv fwd+bwd NCHW": {"minigrad": lambda: conv_step(nchw)},
        "conv fwd+bwd NHWC": {"minigrad": lambda: conv_step(nhwc)},
    }
    if torch is not None:
        tx, ta, tb = torch.from_numpy(x), torch.from_numpy(a), torch.from_numpy(b)
        tconv = torch.nn.Conv2d(32, 32, 3, padding=1)
        tnchw = torch.from_numpy(img).requires_grad_()
        tnhwc = torch.from_numpy(img).to(memory_format=torch.channels_last).requires_grad_()
        tconv_nhwc = torch.nn.Conv2d(32, 32, 3, padding=1).to(memory_format=torch.channels_last)

        def tconv_step(c, z):
            c(z).sum().backward()

        for case, fn in (("sum along rows (dim=1)", lambda: tx.sum(1)), ("sum along columns (dim=0)", lambda: tx.sum(0)),
                         ("matmul a @ b", lambda: ta @ tb), ("matmul a @ b.T (view)", lambda: ta @ tb.T),
                         ("conv fwd+bwd NCHW", lambda: tconv_step(tconv, tnchw)),
                         ("conv fwd+bwd NHWC", lambda: tconv_step(tconv_nhwc, tnhwc))):
            runs[case]["torch"] = fn
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    print(f"layout costs on {machine()}")
    print(table(interleaved_cases(cases(), args.repeats, args.steps)))


if __name__ == "__main__":
    main()
