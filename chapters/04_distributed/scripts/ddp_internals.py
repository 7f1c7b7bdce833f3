"""Inside DistributedDataParallel: buckets, the overlap of all-reduces with backward, and no_sync.
``mpiexec -n 2 python ddp_internals.py``.

Rank 0 prints the buckets for a few bucket sizes, checks that gradient accumulation with
``no_sync`` averages like one big batch, and, as its last line, a JSON record of one backward
with small buckets and one with a single bucket: when each gradient arrived and when each
bucket's all-reduce started and was seen done (milliseconds from the start of backward).
"""

import json
import time

import numpy as np

import minigrad
import minigrad.distributed as dist
from minigrad import nn

dist.init_process_group("mpi")
rank, world = dist.get_rank(), dist.get_world_size()
loss_fn = nn.CrossEntropyLoss()
rng = np.random.default_rng(rank)  # each rank its own data
x = minigrad.tensor(rng.standard_normal((64, 256)).astype(np.float32))
y = minigrad.tensor(rng.integers(0, 10, 64))


def mlp():
    minigrad.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                         nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))


# 1. Buckets: gradients in reverse registration order, a new bucket once one holds bucket_cap_mb
for cap in (25, 2, 0.5):
    names = dist.DistributedDataParallel(mlp(), bucket_cap_mb=cap).bucket_names()
    if rank == 0:
        print(f"bucket_cap_mb={cap}: {len(names)} bucket(s), launched in this order:")
        for k, bucket in enumerate(names):
            print(f"  bucket {k}: {', '.join(bucket)}")

# 2. no_sync: accumulate two half-batches locally, average once, as one full batch would
model = dist.DistributedDataParallel(mlp())
with model.no_sync():
    (loss_fn(model(x[:32]), y[:32]) / 2).backward()
launched_inside = sum(event == "launch" for event, _, _ in model.timeline)
(loss_fn(model(x[32:]), y[32:]) / 2).backward()
accumulated = [p.grad.numpy().copy() for p in model.parameters()]
model.zero_grad()
loss_fn(model(x), y).backward()
same = all(np.allclose(a, p.grad.numpy(), rtol=1e-4, atol=1e-6) for a, p in zip(accumulated, model.parameters()))
if rank == 0:
    print(f"all-reduces started during the no_sync backward: {launched_inside}")
    print(f"two accumulated half-batches give the full batch's averaged gradients: {same}")


# 3. One backward, timed: when each gradient arrives, when each bucket's all-reduce runs
def timed_backward(cap):
    net = mlp()
    names = {id(p): n for n, p in net.named_parameters()}
    arrived = []
    for p in net.parameters():  # registered before DDP's hooks, so they run first
        p.register_hook(lambda g, n=names[id(p)]: arrived.append((n, time.perf_counter())))
    model = dist.DistributedDataParallel(net, bucket_cap_mb=cap)
    for _ in range(3):  # warm-up, then the last backward is the one recorded
        model.zero_grad()
        loss = loss_fn(model(x), y)
        arrived.clear()
        dist.barrier()
        start = time.perf_counter()
        loss.backward()
        end = time.perf_counter()
    ms = lambda t: (t - start) * 1e3  # noqa: E731
    return {"arrived": [(n, ms(t)) for n, t in arrived],
            "buckets": [(event, k, ms(t)) for event, k, t in model.timeline if event != "start"],
            "backward_ms": ms(end)}


record = {"small buckets": timed_backward(0.5), "one bucket": timed_backward(25)}
if rank == 0:
    print("JSON", json.dumps(record))
dist.destroy_process_group()
