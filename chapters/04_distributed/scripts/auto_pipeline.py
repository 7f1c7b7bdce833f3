"""A pipeline cut by hand and cut from the graph, on every rank: ``mpiexec -n 2 python auto_pipeline.py``.

The model is a stack of linear layers of very unequal widths. The hand cut gives each rank the
same number of layers (``split_sequential``'s default); the automatic cut comes from the traced
graph, with the costs rank 0 measures (``auto_pipeline_stage``). Each runs three GPipe steps of M
= 4 micro-batches; after each step the stage's gradients are checked against one process's
full-batch step (to 1e-5). Rank 0 prints the checks, then one JSON line: per cut, the cut
positions, every stage's step time, bubble fraction and (F/B, micro-batch, start, end) events in
milliseconds of the last step.
"""

import json

import numpy as np

import minigrad
import minigrad.distributed as dist
from minigrad import nn
from minigrad.graph import trace
from minigrad.graph.partition import partition

dist.init_process_group("mpi")
rank, world = dist.get_rank(), dist.get_world_size()
BATCH, M = 128, 4


def build():
    minigrad.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024),
                         nn.ReLU(), nn.Linear(1024, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64),
                         nn.ReLU(), nn.Linear(64, 10))


rng = np.random.default_rng(0)
x = minigrad.tensor(rng.standard_normal((BATCH, 64)).astype(np.float32))
y = minigrad.tensor(rng.standard_normal((BATCH, 10)).astype(np.float32))
reference = build()
nn.MSELoss()(reference(x), y).backward()
want = {name: p.grad.numpy() for name, p in reference.named_parameters()}

report = {}
for how in ("hand", "automatic"):
    model = build()
    micro = x[:BATCH // M]
    traced = trace(model, micro)
    if how == "hand":  # split_sequential's layer counts: one graph node per layer here
        counts = [len(s) for s in dist.split_sequential(model, world)]
        plan = partition(traced, world, cuts=list(np.cumsum(counts)[:-1]))
        stage = dist.PipelineStage(plan.stage_module(rank))
    else:
        stage, plan = dist.auto_pipeline_stage(traced, [micro])
    schedule = dist.ScheduleGPipe(stage, M, loss_fn=nn.MSELoss())
    names = {id(p): name for name, p in model.named_parameters()}
    equal = True
    for step in range(3):
        model.zero_grad()
        if rank == 0:
            schedule.step(x)
        elif rank == world - 1:
            schedule.step(target=y)
        else:
            schedule.step()
        equal &= all(np.allclose(p.grad.numpy(), want[names[id(p)]], rtol=1e-5, atol=1e-5)
                     for p in stage.submodule.parameters())
    mine = minigrad.tensor([float(equal), schedule.step_time, schedule.bubble_fraction()], dtype="float64")
    every = minigrad.zeros(world, 3, dtype="float64")
    dist.all_gather_into_tensor(every, mine.reshape(1, 3))
    events = [None] * world
    for r in range(world):  # each stage's events of the last step, to rank 0
        if r == rank and r != 0:
            dist.send(minigrad.tensor([[i, s, e] for _, i, s, e in schedule.events], dtype="float64"), 0)
        elif rank == 0:
            got = minigrad.zeros(2 * M, 3, dtype="float64")
            if r == 0:
                got = minigrad.tensor([[i, s, e] for _, i, s, e in schedule.events], dtype="float64")
            else:
                dist.recv(got, r)
            events[r] = [("F" if k < M else "B", int(i), s * 1e3, e * 1e3) for k, (i, s, e) in enumerate(got.tolist())]
    if rank == 0:
        print(f"{how} cut: {world} stages, gradients equal one process's to 1e-5 on every rank:",
              bool(every[:, 0].min().item()))
        report[how] = {"cuts": [int(c) for c in plan.cuts], "step_ms": every[:, 1].max().item() * 1e3,
                       "bubble": every[:, 2].tolist(), "events": events}
if rank == 0:
    print("JSON " + json.dumps(report))
dist.destroy_process_group()
