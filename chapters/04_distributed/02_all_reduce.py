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
# # 04.2 All-reduce: three algorithms and what they cost
#
# **Question:** N ranks each hold a gradient of n bytes and every rank needs their sum. How should
# the messages flow, and how long does it take?
#
# We compare three answers with a simple cost model, draw the ring all-reduce step by step, then
# time the algorithms on two real processes on this machine, and end with what changes when the
# ranks sit on different machines.
#
# **You will:** cost naive, tree and ring all-reduce with the alpha-beta model, follow the ring's
# chunks step by step, measure the three on two processes, and see how the network changes the
# answer.
# **Time:** about 19 minutes (18 reading, 11 s running).

# %%
import json
import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from minigrad.distributed import launch

# %% [markdown]
# ## The cost model
# Sending a message of n bytes costs $\alpha + n\beta$: a fixed *latency* $\alpha$ (software,
# network hops) plus n times the inverse *bandwidth* $\beta$ (seconds per byte). A rank can send
# one message and receive one message at a time. Three ways to all-reduce:
#
# - **Naive (parameter server):** every rank sends its vector to rank 0, which adds them up and
#   sends the sum back. Rank 0's link carries all $2(N-1)$ full-size messages, one after another:
#   $T = 2(N-1)(\alpha + n\beta)$.
# - **Tree:** ranks pair up and add, halving the number of partial sums each round; after
#   $\lceil\log_2 N\rceil$ rounds one rank holds the sum, and the same tree broadcasts it back:
#   $T = 2\lceil\log_2 N\rceil(\alpha + n\beta)$. Few rounds, but every round moves the whole vector.
# - **Ring:** cut the vector into N chunks; ranks stand in a ring and each passes one chunk to its
#   right neighbour per step, all at once. $N-1$ steps of *reduce-scatter* leave each rank with
#   one fully summed chunk, $N-1$ steps of *all-gather* pass the finished chunks around:
#   $T = 2(N-1)(\alpha + \frac{n}{N}\beta)$. Each rank sends $2(N-1)/N \cdot n < 2n$ bytes, whatever N.

# %%
def t_naive(n, N, alpha, beta):
    return 2 * (N - 1) * (alpha + n * beta)


def t_tree(n, N, alpha, beta):
    return 2 * math.ceil(math.log2(N)) * (alpha + n * beta)


def t_ring(n, N, alpha, beta):
    return 2 * (N - 1) * (alpha + n / N * beta)


MODELS = {"naive": t_naive, "tree": t_tree, "ring": t_ring}
ALPHA, BETA = 10e-6, 1 / 10e9  # 10 µs per message, 10 GB/s: a fast datacenter network

sizes = np.logspace(3, 9, 61)  # 1 KB .. 1 GB
ranks = np.arange(2, 65)
fig, axes = plt.subplots(1, 3, figsize=(14, 3.6))
for name, t in MODELS.items():
    axes[0].loglog(sizes, [t(n, 8, ALPHA, BETA) for n in sizes], label=name)
    axes[1].plot(ranks, [t(1e8, N, ALPHA, BETA) for N in ranks], label=name)
    axes[2].plot(ranks, [t(4e3, N, ALPHA, BETA) * 1e3 for N in ranks], label=name)
axes[0].set(xlabel="message size n (bytes)", ylabel="seconds", title="N = 8 ranks")
axes[1].set(xlabel="ranks N", ylabel="seconds", title="n = 100 MB (a large model's gradients)", yscale="log")
axes[2].set(xlabel="ranks N", ylabel="milliseconds", title="n = 4 KB (a small message)")
for ax in axes:
    ax.legend()
    ax.grid(alpha=0.3)
plt.tight_layout()
plt.show()

# %% [markdown]
# For large messages the ring's time hardly grows with N (each rank always sends just under 2n
# bytes), while the naive scheme grows linearly: rank 0 is the bottleneck. For small messages
# latency dominates, and the tree's $\log_2 N$ rounds beat the ring's $2(N-1)$. Where do they cross?

# %%
for N in (4, 8, 64):
    # 2(N-1)(a + n b / N) = 2 log2(N) (a + n b), solved for n
    L = math.ceil(math.log2(N))
    crossover = ALPHA * (2 * (N - 1) - 2 * L) / (BETA * (2 * L - 2 * (N - 1) / N))
    print(f"N = {N:2d}: the ring beats the tree above {crossover / 1e3:,.0f} KB")

# %% [markdown]
# So libraries switch algorithm by message size: NCCL and MPI use trees (or recursive doubling)
# for small messages and rings for large ones, and NCCL also weighs the topology (GPUs on one
# node, links between nodes) when it picks ring or tree. So DDP's all-reduce is whichever
# algorithm the library picks for each bucket: for buckets of megabytes that is usually the ring,
# where bandwidth, not latency, sets the cost; that is why DDP sends gradients in buckets of
# megabytes rather than one small tensor at a time (04.3).
#
# ## The ring, step by step
# Follow which ranks' values each copy of each chunk holds, for N = 4. Rank r starts with only
# its own values ("r"). In reduce-scatter step s, rank r sends chunk r - s to rank r + 1, which
# adds it to its own copy; in all-gather step s, rank r sends the finished chunk r + 1 - s, which
# rank r + 1 stores. Every rank sends one chunk per step.

# %%
def ring_states(N):
    """held[r][c]: the set of ranks whose values rank r's copy of chunk c holds, after each step."""
    held = [[{r} for _ in range(N)] for r in range(N)]
    states = [("start", [[set(s) for s in row] for row in held])]
    for phase, first_chunk in (("reduce-scatter", 0), ("all-gather", 1)):
        for s in range(N - 1):
            # every rank sends at the same time: read all messages before applying any
            messages = [(r, (r + first_chunk - s) % N) for r in range(N)]
            payloads = [set(held[r][c]) for r, c in messages]
            for (r, c), values in zip(messages, payloads):
                if phase == "reduce-scatter":
                    held[(r + 1) % N][c] |= values
                else:
                    held[(r + 1) % N][c] = values
            states.append((f"{phase} {s + 1}", [[set(s) for s in row] for row in held]))
    return states


N = 4
states = ring_states(N)
fig, axes = plt.subplots(1, len(states), figsize=(15, 2.9))
for ax, (title, held) in zip(axes, states):
    counts = np.array([[len(s) for s in row] for row in held])
    ax.imshow(counts, cmap="Blues", vmin=0, vmax=N + 1)
    for r in range(N):
        for c in range(N):
            ax.text(c, r, "".join(map(str, sorted(held[r][c]))), ha="center", va="center", fontsize=8,
                    color="white" if counts[r, c] == N else "black")
    ax.set_xticks(range(N), [f"c{c}" for c in range(N)], fontsize=8)
    ax.set_yticks(range(N), [f"rank {r}" for r in range(N)], fontsize=8)
    ax.set_title(title, fontsize=9)
plt.tight_layout()
plt.show()
final = states[-1][1]
print("after 2(N-1) =", len(states) - 1, "steps every rank's every chunk holds all ranks' values:",
      all(s == set(range(N)) for row in final for s in row))
print("after reduce-scatter, rank r holds the finished chunk:",
      {f"rank {r}": f"c{c}" for r, row in enumerate(states[N - 1][1]) for c, s in enumerate(row) if len(s) == N})

# %% [markdown]
# Dark cells are finished. After the N - 1 reduce-scatter steps rank r holds chunk r + 1 complete
# (this is also the `reduce_scatter` collective, up to which chunk lands where); the all-gather
# spreads the finished chunks. `minigrad.distributed.ring_all_reduce` is exactly this loop
# written with non-blocking `send`/`recv` (read `minigrad/distributed/ring.py`), and returns the
# bytes its rank sent.
#
# ## Measured on this machine
# `scripts/allreduce_bandwidth.py` times, on two ranks, float32 tensors of 1 KB to 4 MB summed
# by the naive scheme (written with `send`/`recv` in the script), by `ring_all_reduce`, and by
# MPI's own `MPI_Allreduce` (C code, shared memory between the two processes).

# %%
job = launch(Path("scripts") / "allreduce_bandwidth.py", nprocs=2, timeout=120)
assert job.returncode == 0, job.stderr
result = json.loads(job.stdout.splitlines()[-1])
rows, world = result["rows"], result["ranks"]
for size, sent in result["ring_bytes_sent"].items():
    print(f"ring_all_reduce of {int(size):>9,} bytes on {world} ranks: rank 0 sent {sent:>9,} bytes"
          f" = 2(N-1)/N x size: {sent == 2 * (world - 1) * int(size) // world}")

# %% [markdown]
# The byte counts are exact; the times depend on the machine and on what else it is doing, so
# they are not checked (the next cell's output changes from run to run).

# %%
# NBVAL_IGNORE_OUTPUT
print(f"{'bytes':>9} {'naive ms':>9} {'ring ms':>8} {'MPI ms':>8}")
for row in rows:
    print(f"{row['bytes']:9,} {row['naive']:9.3f} {row['ring']:8.3f} {row['mpi']:8.3f}")
# The model's constants from the ring's times: with N = 2, T = 2(alpha + n/2 beta) = 2 alpha + n beta,
# so the smallest message gives alpha and the slope to the largest gives beta
n = np.array([row["bytes"] for row in rows], dtype=float)
t = np.array([row["ring"] for row in rows]) * 1e-3
alpha_fit, beta_fit = t[0] / 2, (t[-1] - t[0]) / (n[-1] - n[0])
print(f"ring on this machine: alpha ~ {alpha_fit * 1e6:.0f} us per message, 1/beta ~ {1 / beta_fit / 1e9:.2f} GB/s")

# %%
fig, ax = plt.subplots(figsize=(6.5, 3.6))
for name in ("naive", "ring", "mpi"):
    ax.loglog(n, [row["bytes"] / (row[name] * 1e-3) / 1e9 for row in rows], "o-", label=name)
ax.set(xlabel="message size (bytes)", ylabel="GB/s (size / time)", title=f"All-reduce on {world} ranks, this machine")
ax.legend()
ax.grid(alpha=0.3, which="both")
plt.tight_layout()
plt.show()

# %% [markdown]
# Small messages are latency-bound: the bandwidth rises with the size as $\alpha$ is spread over
# more bytes. The ring pays the most per message, since every step runs a few Python calls; MPI's
# C implementation pays the least. For large messages bandwidth takes over, and the model says the
# naive scheme should fall behind: with N = 2 it moves 2n bytes through rank 0, the ring n per
# rank. Two processes sharing a busy laptop-sized machine are a noisy place to see it
# (`benchmarks/bench_allreduce.py` measures the range up to 64 MB with more repeats); the
# constants measured here are far from a network's, as the next section shows.
#
# ## Across hosts
# The scripts do not change. `mpiexec` needs the list of machines, a *hostfile* with one host per
# line and how many ranks it takes (`node1:8`), and MPICH starts the ranks over ssh:
#
# ```sh
# mpiexec -f hostfile -n 16 python train.py      # Open MPI: mpirun --hostfile hostfile -np 16 ...
# ```
#
# Every host needs passwordless ssh from the first, the same Python environment, the script at
# the same path (a shared filesystem is simplest) and open ports between the hosts. Ranks are
# numbered host by host, so ranks 0-7 share the first machine. What changes is the network, and
# with it $\alpha$ and $\beta$, by orders of magnitude:

# %%
NETWORKS = {  # orders of magnitude: latency alpha (s), bandwidth 1/beta (bytes/s)
    "shared memory, one host": (0.5e-6, 10e9),
    "10 Gb Ethernet, TCP": (30e-6, 1.2e9),
    "100 Gb Ethernet, RDMA": (3e-6, 12e9),
    "InfiniBand NDR, 400 Gb": (1.5e-6, 50e9),
    "NVLink, GPUs in one host": (3e-6, 400e9),
}
print(f"{'':26} {'alpha':>8} {'1/beta':>10}   ring all-reduce on 16 ranks of 100 MB | 4 KB")
for name, (alpha, bandwidth) in NETWORKS.items():
    big, small = t_ring(1e8, 16, alpha, 1 / bandwidth), t_ring(4e3, 16, alpha, 1 / bandwidth)
    print(f"{name:26} {alpha * 1e6:5.1f} us {bandwidth / 1e9:6.1f} GB/s   {big * 1e3:9.1f} ms | {small * 1e6:6.1f} us")

# %% [markdown]
# A ring is only as fast as its slowest link: with 8 ranks on each of 2 hosts, 2 of the ring's 16
# links cross the network and set the pace for all. Libraries therefore all-reduce
# *hierarchically* (reduce inside each host over the fast links, all-reduce across hosts, broadcast
# inside each host), and across hosts it pays to send fewer, larger messages: bigger buckets,
# gradient accumulation, or compressed gradients.

# %% [markdown]
# ## Predict, then run
# 1. In the model, ring all-reduce of 1 GB on 64 ranks against 8 ranks: how much longer?
# 2. For a 1 KB message on 64 ranks, which of the three algorithms wins?
# 3. How many bytes does each rank send in a ring all-reduce of 100 MB on 4 ranks?

# %%
print(f"1. 64 ranks / 8 ranks: {t_ring(1e9, 64, ALPHA, BETA) / t_ring(1e9, 8, ALPHA, BETA):.2f}x "
      "(each rank sends 2(N-1)/N GB: 1.97 instead of 1.75; 126 latencies of 10 µs are small next to it)")
print("2.", min(MODELS, key=lambda name: MODELS[name](1e3, 64, ALPHA, BETA)),
      "(12 rounds of latency instead of 126)")
print(f"3. {2 * (4 - 1) / 4 * 100:.0f} MB = 2(N-1)/N x 100 MB")
