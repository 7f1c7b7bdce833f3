"""Sparse gradients, measured: an embedding model with a 1M-row table, dense vs sparse gradients.

The model looks up a batch of 256 bags of 8 token ids in an ``Embedding(1_000_000, 32)`` table
(float32, 128 MB), averages each bag, and scores it with ``Linear(32, 1)`` under a mean-square
loss. A step is zero_grad, forward, backward and the optimizer's update. With a dense gradient the
table's gradient is a second 128 MB array that backward fills and the optimizer reads whole;
with ``sparse=True`` it holds the 2048 looked-up rows (and their ids), and SGD / SparseAdam touch
only them. Printed: the table gradient's bytes, and the median step time, minigrad and PyTorch
side by side (same run, interleaved), with the ratio. ``python benchmarks/bench_sparse.py``.
"""

from __future__ import annotations

import argparse

from common import interleaved_cases, machine, table, torch  # first: sets BLAS threads before numpy

import numpy as np

import minigrad
from minigrad import nn

ROWS, DIM, BAGS, BAG = 1_000_000, 32, 256, 8
OPTIMIZERS = {  # case -> (sparse gradients?, optimizer name, its arguments)
    "dense grad, SGD": (False, "SGD", dict(lr=0.1)),
    "sparse grad, SGD": (True, "SGD", dict(lr=0.1)),
    "dense grad, Adam": (False, "Adam", dict(lr=1e-3)),
    "sparse grad, SparseAdam": (True, "SparseAdam", dict(lr=1e-3)),
}


def grad_bytes(g) -> int:
    """Bytes a (dense or COO) gradient holds, minigrad's or torch's."""
    if g.is_sparse:
        idx, val = (g.indices(), g.values()) if isinstance(g, minigrad.sparse.SparseTensor) else (g._indices(), g._values())
        return idx.numel() * idx.element_size() + val.numel() * val.element_size()
    return g.numel() * g.element_size()


def training_step(emb, head, opts, x, y):
    """One step of the model, written once for both frameworks (they share these names)."""
    def step():
        for o in opts:
            o.zero_grad()
        ((head(emb(x).mean(1)) - y) ** 2).mean().backward()
        for o in opts:
            o.step()
    return step


def steps(rows: int = ROWS) -> tuple[dict[str, dict], dict[str, dict[str, int]]]:
    """case -> {"minigrad": step, "torch": step}, and the gradient bytes after one step of each."""
    ids = np.random.default_rng(0).integers(0, rows, (BAGS, BAG))
    target = np.random.default_rng(1).standard_normal((BAGS, 1), dtype=np.float32)
    runs: dict[str, dict] = {}
    memory: dict[str, dict[str, int]] = {}
    for case, (sparse, opt, kw) in OPTIMIZERS.items():
        minigrad.manual_seed(0)
        emb, head = nn.Embedding(rows, DIM, sparse=sparse), nn.Linear(DIM, 1)
        opts = [getattr(minigrad.optim, opt)(emb.parameters(), **kw), minigrad.optim.SGD(head.parameters(), lr=0.1)]
        step = training_step(emb, head, opts, minigrad.tensor(ids), minigrad.tensor(target))
        step()
        runs[case] = {"minigrad": step}
        memory[case] = {"minigrad": grad_bytes(emb.weight.grad)}
        if torch is not None:
            temb, thead = torch.nn.Embedding(rows, DIM, sparse=sparse), torch.nn.Linear(DIM, 1)
            topts = [getattr(torch.optim, opt)(temb.parameters(), **kw), torch.optim.SGD(thead.parameters(), lr=0.1)]
            tstep = training_step(temb, thead, topts, torch.from_numpy(ids), torch.from_numpy(target))
            tstep()
            runs[case]["torch"] = tstep
            memory[case]["torch"] = grad_bytes(temb.weight.grad)
    return runs, memory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    print(f"embedding {ROWS:,} x {DIM} float32, batch {BAGS} bags of {BAG}, on {machine()}")
    runs, memory = steps()
    ms = interleaved_cases(runs, args.repeats, args.steps)
    print("table gradient, MB" + "".join(f"{w:>12}" for w in next(iter(memory.values()))))
    for case, b in memory.items():
        print(f"{case:28}" + "".join(f"{v / 2**20:12.3f}" for v in b.values()))
    print(table(ms))


if __name__ == "__main__":
    main()
