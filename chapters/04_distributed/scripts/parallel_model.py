"""Model parallelism and a GPipe pipeline on two ranks: ``mpiexec -n 2 python parallel_model.py``.

1. A Megatron-style MLP: a ColumnParallelLinear (each rank holds a block of the first layer's
   output features) feeding a RowParallelLinear (each holds the matching block of the second
   layer's input features), checked against the unsplit layers.
2. A pipeline: a Sequential cut into one stage per rank, trained one step with the GPipe schedule
   for M = 1, 2, 4, 8 micro-batches (or the values of M given as arguments, as 04.4's slider does);
   its gradients are checked against the unsplit model's.
   Each stage ends in a layer that takes a fixed time per sample (forward 0.5 ms, backward 1 ms),
   so the stages cost the same whatever else the machine is doing.
Rank 0 prints the checks, then one JSON line: every stage's (F/B, micro-batch, start, end) events
in milliseconds and the measured bubble for each M.
"""

import json
import sys
import time

import numpy as np

import minigrad
import minigrad.distributed as dist
from minigrad import nn
from minigrad.autograd import Function

dist.init_process_group("mpi")
rank, world = dist.get_rank(), dist.get_world_size()


def on_rank0(*args):
    if rank == 0:
        print(*args)


def all_ranks_agree(flag):
    """True when ``flag`` holds on every rank."""
    t = minigrad.tensor([float(flag)])
    dist.all_reduce(t, dist.ReduceOp.MIN)
    return bool(t.item())


# 1. Model parallelism ---------------------------------------------------------------------------
minigrad.manual_seed(0)
first, second = nn.Linear(8, 16), nn.Linear(16, 4)  # every rank builds the same full layers
x = minigrad.randn(5, 8)
col = dist.ColumnParallelLinear.from_linear(first, gather_output=False)  # rows of W1: 16/N outputs
row = dist.RowParallelLinear.from_linear(second, input_is_parallel=True)  # columns of W2: 16/N inputs
shapes = minigrad.tensor([list(col.weight.shape) + list(row.weight.shape)])
every = minigrad.zeros(world, 4, dtype=shapes.dtype)
dist.all_gather_into_tensor(every, shapes)
for r in range(world):
    on_rank0(f"rank {r} holds W1 rows {r * 16 // world}:{(r + 1) * 16 // world} {tuple(every[r, :2].tolist())}"
             f" and W2 columns {r * 16 // world}:{(r + 1) * 16 // world} {tuple(every[r, 2:].tolist())}")
out = row(col(x).relu())  # one all-reduce, inside row
ok = np.allclose(out.detach().numpy(), second(first(x).relu()).detach().numpy(), atol=1e-6)
on_rank0("column-parallel then row-parallel equals the full MLP on every rank:", all_ranks_agree(ok))


# 2. Pipeline parallelism with GPipe ---------------------------------------------------------------
class FixedCost(Function):
    """Identity that takes a fixed time per sample, forward and (twice as long) backward."""

    @staticmethod
    def forward(ctx, x):
        ctx.rows = x.shape[0]
        time.sleep(0.5e-3 * ctx.rows)
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        time.sleep(1e-3 * ctx.rows)
        return g


class FixedCostLayer(nn.Module):
    def forward(self, x):
        return FixedCost.apply(x)


def build():
    minigrad.manual_seed(1)
    layers = []
    for _ in range(world):
        layers += [nn.Linear(16, 16), nn.Tanh(), FixedCostLayer()]
    return nn.Sequential(*layers)


rng = np.random.default_rng(2)
X = minigrad.tensor(rng.standard_normal((32, 16)).astype(np.float32))
Y = minigrad.tensor(rng.standard_normal((32, 16)).astype(np.float32))
full = build()
nn.MSELoss()(full(X), Y).backward()
full_grads = [p.grad.numpy() for p in full.parameters()]
per_stage = len(full_grads) // world

events, bubbles = {}, {}
for m in [int(arg) for arg in sys.argv[1:]] or [1, 2, 4, 8]:
    stage = dist.PipelineStage(dist.split_sequential(build(), world)[rank])
    schedule = dist.ScheduleGPipe(stage, n_microbatches=m, loss_fn=nn.MSELoss())
    for _ in range(2):  # a warm-up step, then the recorded one
        stage.submodule.zero_grad()
        if stage.is_first:
            schedule.step(X)
        elif stage.is_last:
            schedule.step(target=Y)
        else:
            schedule.step()
    mine = full_grads[rank * per_stage:(rank + 1) * per_stage]
    ok = all(np.allclose(p.grad.numpy(), g, atol=1e-6) for p, g in zip(stage.submodule.parameters(), mine))
    on_rank0(f"M={m}: GPipe gradients equal the unsplit model's on every stage:", all_ranks_agree(ok))
    # every rank's events, in its order: F of micro-batches 0..M-1, then B of 0..M-1
    spans = minigrad.tensor([[s * 1e3, e * 1e3] for _, _, s, e in schedule.events], dtype=minigrad.float64)
    every = minigrad.zeros(world, 2 * m, 2, dtype=minigrad.float64)
    dist.all_gather_into_tensor(every, spans)
    bubble = minigrad.tensor([schedule.bubble_fraction()], dtype=minigrad.float64)
    dist.all_reduce(bubble, dist.ReduceOp.AVG)
    kinds = [(kind, i) for kind, i, _, _ in schedule.events]
    events[m] = [[(k, i, s, e) for (k, i), (s, e) in zip(kinds, every[r].tolist())] for r in range(world)]
    bubbles[m] = bubble.item()
on_rank0("JSON", json.dumps({"stages": world, "events": events, "bubble": bubbles}))
dist.destroy_process_group()
