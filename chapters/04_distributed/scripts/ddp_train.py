"""Data-parallel training of a digits classifier: ``mpiexec -n 2 python ddp_train.py``.

Each rank reads its own half of every batch (DistributedSampler), DistributedDataParallel averages
the gradients during backward, and every rank takes the same optimizer step. At the end rank 0
checks that (1) the ranks' parameters are identical and (2) they equal those of one process
trained on the full batches.
"""

import numpy as np

import minigrad
import minigrad.distributed as dist
from minigrad import nn, optim
from minigrad.data import DataLoader, Digits

GLOBAL_BATCH, STEPS, LR = 64, 20, 0.5  # 20 steps: less than one epoch of 1,437 images


def make_model():
    minigrad.manual_seed(0)  # the same initial weights for the reference run
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 10))


def train(model, loader, on_step=None):
    opt = optim.SGD(model.parameters(), lr=LR)
    loss_fn = nn.CrossEntropyLoss()
    for step, (x, y) in enumerate(loader):
        if step == STEPS:
            break
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        if on_step:
            on_step(step, loss)
    return model


dist.init_process_group("mpi")
rank, world = dist.get_rank(), dist.get_world_size()
data = Digits(train=True)

sampler = dist.DistributedSampler(data, seed=0)  # rank r: indices r, r + N, r + 2N... of one permutation
loader = DataLoader(data, batch_size=GLOBAL_BATCH // world, sampler=sampler)
model = dist.DistributedDataParallel(make_model())
if rank == 0:
    print(f"{world} ranks, {GLOBAL_BATCH // world} samples per rank and step ({GLOBAL_BATCH} in all)")


def log(step, loss):
    loss = minigrad.tensor([loss.item()])
    dist.all_reduce(loss, dist.ReduceOp.AVG)  # the full batch's loss: the mean of the ranks' means
    if rank == 0 and (step % 5 == 0 or step == STEPS - 1):
        print(f"step {step:2d}  loss {loss.item():.4f}")


train(model, loader, log)

# (1) every rank holds the same parameters
params = minigrad.cat([p.detach().reshape(-1) for p in model.module.parameters()])
every = minigrad.zeros(world, params.numel())
dist.all_gather_into_tensor(every, params)
if rank == 0:
    print("parameters identical on every rank:", bool((every.numpy() == every.numpy()[0]).all()))
    # (2) ... and equal to one process training on the same full batches
    full = DataLoader(data, batch_size=GLOBAL_BATCH,
                      sampler=dist.DistributedSampler(data, num_replicas=1, rank=0, seed=0))
    reference = train(make_model(), full)
    ref = np.concatenate([p.detach().numpy().reshape(-1) for p in reference.parameters()])
    print("same parameters as one process with the full batches (to float32 rounding):",
          np.allclose(ref, params.numpy(), rtol=1e-4, atol=1e-5))
dist.destroy_process_group()
