# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 04.1 Data parallelism: one model, many processes
#
# **Question:** how can N processes train *one* model together, and why do they average their
# gradients?
#
# Data parallelism gives every process (a *rank*) a full copy of the model and a different share
# of each batch. Each rank computes the gradient on its share; the ranks then average their
# gradients, so that every rank holds the gradient of the whole batch and takes the same optimizer
# step. The copies never drift apart, and each step costs each rank only B/N samples of compute,
# plus one exchange of gradients. This notebook shows why the average is the right answer, runs it
# on two real processes, and leaves the cost of the exchange to 04.2.
#
# **You will:** check that averaging the shards' gradients gives the full batch's, see how
# `DistributedSampler` splits the data, run collectives and a DDP training loop on two MPI processes,
# and learn why `DistributedDataParallel` replaced `nn.DataParallel`.
# **Time:** about 16 minutes (15 reading, 6 s running).

# %%
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

import minigrad
from minigrad import nn
from minigrad.data import Digits, default_collate
from minigrad.distributed import DistributedSampler, launch

minigrad.manual_seed(0)

# %% [markdown]
# ## The gradient of a mean is the mean of the gradients
# A loss that is the mean over a batch of B samples splits into N shards of B/N:
#
# $$L = \frac1B \sum_{i=1}^{B} \ell_i = \frac1N \sum_{k=1}^{N} \Big(\frac{1}{B/N} \sum_{i \in \text{shard } k} \ell_i\Big) = \frac1N \sum_{k=1}^{N} L_k ,$$
#
# and since the gradient is linear, $\nabla L = \frac1N \sum_k \nabla L_k$. We check it in one
# process on a batch of 64 digits: the full batch's gradient against the average of two shards'.

# %%
data = Digits(train=True)
x, y = default_collate([data[i] for i in range(64)])
model = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 10))
loss_fn = nn.CrossEntropyLoss()


def gradients(x, y):
    """The gradient of the mean loss on (x, y), parameter by parameter, as numpy arrays."""
    model.zero_grad()
    loss_fn(model(x), y).backward()
    return [p.grad.numpy().copy() for p in model.parameters()]


full = gradients(x, y)
shards = [gradients(x[:32], y[:32]), gradients(x[32:], y[32:])]
average = [(g0 + g1) / 2 for g0, g1 in zip(*shards)]
total = [g0 + g1 for g0, g1 in zip(*shards)]
print("average of the shards' gradients == full batch's:",
      all(np.allclose(a, f, atol=1e-7) for a, f in zip(average, full)))
print("sum of the shards' gradients / full batch's:",
      {round(float(np.linalg.norm(t) / np.linalg.norm(f)), 4) for t, f in zip(total, full)})

# %% [markdown]
# The same check, drawn: each rank sees half of the batch and computes a gradient that differs
# from the full batch's (here the last layer's weight gradient, 10 x 32); their average is the full
# batch's gradient.

# %%
fig = plt.figure(figsize=(11, 3.6))
grid = fig.add_gridspec(2, 5, height_ratios=[1, 1.2])
for k in range(2):
    ax = fig.add_subplot(grid[0, 2 * k:2 * k + 2])
    images = x[32 * k:32 * (k + 1)].numpy()[:, 0]
    ax.imshow(np.block([[images[8 * r + c] for c in range(8)] for r in range(4)]), cmap="gray_r")
    ax.set_title(f"rank {k}: samples {32 * k}..{32 * k + 31}", fontsize=9)
    ax.axis("off")
panels = [("rank 0's gradient", shards[0][2]), ("rank 1's gradient", shards[1][2]),
          ("(rank 0 + rank 1) / 2", average[2]), ("full batch's gradient", full[2]),
          ("difference x 10^6", 1e6 * (average[2] - full[2]))]
limit = np.abs(full[2]).max()
for col, (title, g) in enumerate(panels):
    ax = fig.add_subplot(grid[1, col])
    ax.imshow(g, cmap="RdBu", vmin=-limit, vmax=limit)
    ax.set_title(title, fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])
plt.tight_layout()
plt.show()

# %% [markdown]
# The average is exact (to float32 rounding: the last panel, magnified a million times, is still
# nearly blank). A sum would be N times too large, as if the learning
# rate had been multiplied by N, which is why DDP averages.
#
# The argument needs **equal shards**: with shards of 40 and 24 samples, the plain average weighs
# each of the 24 samples more than each of the 40.

# %%
uneven = [gradients(x[:40], y[:40]), gradients(x[40:], y[40:])]
plain = [(g0 + g1) / 2 for g0, g1 in zip(*uneven)]
weighted = [(40 * g0 + 24 * g1) / 64 for g0, g1 in zip(*uneven)]
print("plain average of unequal shards == full batch's:", all(np.allclose(a, f, atol=1e-7) for a, f in zip(plain, full)))
print("average weighted by shard size == full batch's: ", all(np.allclose(a, f, atol=1e-7) for a, f in zip(weighted, full)))

# %% [markdown]
# ## Giving each rank its share: `DistributedSampler`
# Every rank draws the *same* random permutation of the dataset (same seed), and rank r keeps
# positions r, r + N, r + 2N, ... So the shares never overlap and together cover the data. When N
# does not divide the dataset, the list is padded with its first indices, so that every rank gets
# as many samples and takes as many steps (a rank with one step fewer would leave the others
# waiting for its gradients forever). Here a dataset of 10 samples on 3 ranks, without shuffling
# to make the pattern plain, then shuffled:

# %%
ten = range(10)
for shuffle in (False, True):
    print(f"shuffle={shuffle}")
    for r in range(3):
        print(f"  rank {r}: {list(DistributedSampler(ten, num_replicas=3, rank=r, shuffle=shuffle, seed=0))}")
sampler = DistributedSampler(ten, num_replicas=3, rank=0, seed=0)
sampler.set_epoch(1)
print("rank 0 after set_epoch(1):", list(sampler), "(a new permutation each epoch, the same on every rank)")

# %% [markdown]
# Sample 0 appears twice with `shuffle=False` (the padding): 12 slots for 10 samples.
# `drop_last=True` drops the tail instead.
#
# ## Real processes: MPI
# Distributed jobs start N copies of one script. The standard launcher is MPI's:
#
# ```sh
# mpiexec -n 2 python train.py
# ```
#
# In the script, `minigrad.distributed.init_process_group("mpi")` joins the copies into a group in
# which each learns its rank (`get_rank()`) and the world size (`get_world_size()`), and
# *collectives* move tensors between them. From a notebook, `launch(script, nprocs, timeout=...)`
# runs that command and returns its exit status and output; the timeout kills the whole job
# if it hangs. Every rank runs the same code; prints from several ranks would interleave at
# random, so our scripts gather results to rank 0 and print them there, in rank order.
#
# `scripts/collectives_tour.py` starts each rank with its own tensor and applies the collectives
# one after the other:

# %%
SCRIPTS = Path("scripts")


def run(script, nprocs=2):
    """Run ``mpiexec -n nprocs python scripts/<script>`` and return what rank 0 printed."""
    job = launch(SCRIPTS / script, nprocs=nprocs, timeout=60)
    if job.returncode != 0:
        raise RuntimeError(f"{script} failed with status {job.returncode}:\n{job.stderr}")
    return job.stdout


print(run("collectives_tour.py"), end="")

# %% [markdown]
# `all_reduce` is the collective data parallelism needs: with `ReduceOp.AVG` every rank ends up
# with the average of the ranks' tensors. `ring_all_reduce` computes the same sum from
# point-to-point messages; 04.2 takes it apart.
#
# ## Data-parallel training
# `DistributedDataParallel` wraps the model. At construction it broadcasts rank 0's parameters, so
# every rank starts from the same weights; during `loss.backward()` it averages the gradients with
# `all_reduce`, so that when `backward` returns, every rank's `.grad` holds the full batch's
# gradient. The training loop itself does not change. The whole script:

# %%
print((SCRIPTS / "ddp_train.py").read_text())

# %% [markdown]
# Two ranks, 32 digits each per step, 20 steps. The loss printed is the full batch's (the average
# of the ranks' losses):

# %%
print(run("ddp_train.py"), end="")

# %% [markdown]
# Both ranks end with identical parameters, and with the parameters of one process that trained
# on the full batches of 64: data parallelism changes where the work is done, not what is computed.
#
# ## Why not `nn.DataParallel`?
# PyTorch's older `nn.DataParallel` does data parallelism in *one* process with one thread per GPU.
# Every step it copies the model from GPU 0 to every GPU, scatters the batch from GPU 0, gathers
# every output back to GPU 0 to compute the loss there, and sums the gradients onto GPU 0, which
# alone runs the optimizer. GPU 0 does more work and holds more memory than the others, the
# threads contend for Python's global interpreter lock, and it cannot span machines.
# `DistributedDataParallel` runs one process per device: each keeps its own replica and optimizer
# for the whole run (only the initial weights are broadcast), nothing goes through one device, and
# the only exchange per step is the gradients' all-reduce, overlapped with backward (04.3). It
# works the same on one machine or many, which is why PyTorch recommends it even on a single node.
#
# What it costs: every step, every rank sends and receives a model's worth of gradients
# (here 2,410 numbers; for a large model, gigabytes). How fast that can go is the subject of
# 04.2, and how DDP hides it behind backward the subject of 04.3.

# %% [markdown]
# ## Predict, then run
# 1. Four ranks, each with a shard of 16 of the 64 samples, all-reduce with `SUM` instead of `AVG`.
#    By what factor is the step larger than the single-process step?
# 2. `DistributedSampler` over 10 samples on 4 ranks: how many samples does each rank get, and how
#    many of them are padding?
# 3. A rank forgets `sampler.set_epoch(epoch)`. What goes wrong?

# %%
four = [gradients(x[16 * k:16 * (k + 1)], y[16 * k:16 * (k + 1)]) for k in range(4)]
summed = [sum(g) for g in zip(*four)]
print("1. |sum| / |full batch's|:", {round(float(np.linalg.norm(t) / np.linalg.norm(f)), 4) for t, f in zip(summed, full)})
shares = [list(DistributedSampler(ten, num_replicas=4, rank=r, seed=0)) for r in range(4)]
print("2.", [len(share) for share in shares], "samples per rank,", sum(map(len, shares)) - 10, "of them padding")
a, b = DistributedSampler(ten, num_replicas=2, rank=0, seed=0), DistributedSampler(ten, num_replicas=2, rank=1, seed=0)
a.set_epoch(1)  # rank 0 moves on to epoch 1, rank 1 forgot
print("3. ranks' shares overlap:", sorted(set(a) & set(b)), "and", sorted(set(ten) - set(a) - set(b)), "are never seen this epoch")
