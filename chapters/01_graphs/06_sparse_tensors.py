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
# # 01.6 Sparse tensors: store only what is there
#
# **Question:** an embedding table has a million rows and a batch looks up two thousand of them.
# Why should its gradient be a million rows of mostly zeros, and what does it cost if it is?
#
# **You will learn:**
# - the COO format: a list of positions (`indices`) and what sits there (`values`);
# - duplicates and `coalesce()`, and multiplying a sparse matrix by a dense one;
# - sparse gradients from `nn.Embedding(sparse=True)`, applied by `SGD` and `SparseAdam`;
# - what they save, measured: gradient memory and step time, sparse vs dense.
#
# **Time:** about 14 minutes (13 reading, 6 s running).

# %%
import time

import matplotlib.pyplot as plt
import numpy as np

import minigrad
from minigrad import nn, optim

# %% [markdown]
# ## COO: coordinates and values
# A sparse tensor in COO ("coordinate") format keeps, for every non-zero entry, its position
# (one column of `indices`) and its value. Everything not listed is zero.

# %%
dense = minigrad.tensor([[0.0, 2.0, 0.0, 0.0, 0.0],
                         [1.0, 0.0, 0.0, 0.0, -4.0],
                         [0.0, 0.0, 0.0, 3.0, 0.0]])
s = dense.to_sparse()
print("indices (row; column):\n", s.indices())
print("values:", s.values())
print("nnz", s._nnz(), "of", dense.numel(), "entries; back to dense equal:",
      bool((s.to_dense() == dense).all()))

# %%
fig, ax = plt.subplots(figsize=(5, 2.4))
ax.imshow(dense.numpy() != 0, cmap="Blues", vmin=0, vmax=1.5)
for (i, j), v in np.ndenumerate(dense.numpy()):
    ax.text(j, i, f"{v:g}", ha="center", va="center", color="black" if v else "lightgray")
for k, (i, j) in enumerate(s.indices().numpy().T):
    ax.annotate(f"entry {k}: ({i}, {j})", (j, i), (j + 0.25, i - 0.3), fontsize=7)
ax.set_xticks(range(5))
ax.set_yticks(range(3))
ax.set_title("only the highlighted entries are stored")
plt.tight_layout()
plt.show()

# %% [markdown]
# Storing an entry costs its value plus one int64 per dim of its position: 4 + 16 bytes for a
# float32 matrix, against 4 for a dense one, so COO pays off below one non-zero in five. In an
# embedding gradient a whole row of values shares one index, so there the index is nearly free.
#
# ## Duplicates and coalescing
# A position may be listed twice; the entries add up. `coalesce()` sorts the positions (row-major)
# and sums the repeats, as PyTorch does; until then the tensor reports `is_coalesced() == False`.

# %%
u = minigrad.sparse_coo_tensor([[2, 0, 2], [1, 3, 1]], [1.0, 2.0, 5.0], (3, 4))
print("coalesced?", u.is_coalesced(), " indices", u.indices().tolist())
c = u.coalesce()
print("coalesced: indices", c.indices().tolist(), "values", c.values().tolist())

# %% [markdown]
# ## Sparse times dense
# Chapter 01 drew graphs as adjacency lists. An adjacency *matrix* is mostly zeros, and
# multiplying it by a matrix of node features sums each node's neighbours' features, the step of
# a graph neural network. `minigrad.sparse.mm` does it in time proportional to the number of
# edges, and is differentiable in the dense features (and the sparse values).

# %%
edges = [[0, 0, 1, 2, 3], [1, 2, 2, 3, 0]]  # 0->1, 0->2, 1->2, 2->3, 3->0
adjacency = minigrad.sparse_coo_tensor(edges, [1.0] * 5, (4, 4))
features = minigrad.tensor(np.eye(4) * [1.0, 10.0, 100.0, 1000.0], requires_grad=True)
summed = minigrad.sparse.mm(adjacency, features)
print(summed)
summed.sum().backward()
print("d(sum)/d(features) row by row = how many edges point at each node:", features.grad[:, 0])

# %% [markdown]
# ## Sparse gradients
# `nn.Embedding(sparse=True)` returns a COO gradient with one row per looked-up id (repeats kept,
# uncoalesced, as PyTorch). Here a 100,000-row table sees a batch of 512 ids:

# %%
minigrad.manual_seed(0)
table = nn.Embedding(100_000, 16, sparse=True)
ids = minigrad.tensor(np.random.default_rng(0).integers(0, 100_000, 512))
table(ids).sum().backward()
g = table.weight.grad
sparse_bytes = g.indices().nbytes + g.values().nbytes
print(f"gradient: sparse {g.is_sparse}, {g._nnz()} rows, {sparse_bytes / 2**10:.0f} KiB; "
      f"the dense gradient would be {table.weight.nbytes / 2**20:.1f} MiB")

# %% [markdown]
# `optim.SGD` applies it by adding `-lr * values` at those rows only (with momentum the buffer is
# sparse too; weight decay would touch every row, so, as PyTorch, SGD refuses it). `SparseAdam`
# keeps Adam's two moments but updates them only at the rows in the gradient: a row that is not
# looked up keeps its moments instead of decaying them, the one difference from `Adam`.

# %%
before = table.weight.detach().numpy().copy()
optim.SGD(table.parameters(), lr=0.1).step()
changed = np.flatnonzero((table.weight.detach().numpy() != before).any(1))
print("rows changed by the step:", len(changed), "= distinct ids in the batch:", len(np.unique(ids.numpy())))

# %% [markdown]
# ## What it saves, measured
# `benchmarks/bench_sparse.py` trains an `Embedding(1_000_000, 32)` table (float32, 122 MiB)
# on batches of 256 bags of 8 ids, dense vs sparse gradients, in minigrad and PyTorch. One run on
# the course machine (an AMD EPYC, one BLAS thread, shared with other work, so timings carry
# 10-20% noise):

# %%
BENCH = {  # case: (gradient MiB, minigrad ms per step, torch ms per step), torch 2.13
    "dense grad, SGD": (122.07, 300.5, 222.7),
    "sparse grad, SGD": (0.266, 8.04, 8.29),
    "dense grad, Adam": (122.07, 2099.4, 1623.6),
    "sparse grad, SparseAdam": (0.266, 17.8, 16.1),
}
names = list(BENCH)
fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3))
y = np.arange(len(names))
left.barh(y, [BENCH[n][0] for n in names], color="tab:gray")
left.set_xscale("log")
left.set_xlabel("table gradient, MiB (log)")
left.set_yticks(y, names)
left.invert_yaxis()
right.barh(y - 0.2, [BENCH[n][1] for n in names], 0.4, label="minigrad")
right.barh(y + 0.2, [BENCH[n][2] for n in names], 0.4, label="PyTorch")
right.set_xscale("log")
right.set_xlabel("ms per training step (log)")
right.set_yticks(y, [])
right.invert_yaxis()
right.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# The sparse gradient is 460x smaller (2048 rows of 32 floats plus their ids, against a million
# rows), and a step is 37x faster with SGD and over 100x with SparseAdam against Adam, whose
# dense update reads and writes three 122 MiB arrays every step. minigrad and PyTorch land within
# noise of each other on the sparse path. A live check at a smaller size (timings vary):

# %%
# NBVAL_IGNORE_OUTPUT
for sparse in (False, True):
    minigrad.manual_seed(0)
    emb = nn.Embedding(200_000, 16, sparse=sparse)
    sgd = optim.SGD(emb.parameters(), lr=0.1)
    start = time.perf_counter()
    for _ in range(5):
        sgd.zero_grad()
        emb(ids).sum().backward()
        sgd.step()
    print(f"sparse={sparse}: {(time.perf_counter() - start) / 5 * 1e3:.1f} ms per step")

# %% [markdown]
# ## Predict, then run
# 1. A batch looks up id 7 three times. How many rows does the (uncoalesced) gradient hold for
#    id 7, and after `coalesce()`?
# 2. After one `SparseAdam` step on ids [1, 2] and one on ids [2, 3], which rows' `exp_avg` are
#    still exactly zero?
# 3. `sparse.mm(A, X)` for a 4 x 4 `A` with 5 entries: how many multiply-adds of feature rows?

# %%
e = nn.Embedding(10, 2, sparse=True)
e(minigrad.tensor([7, 7, 7, 1])).sum().backward()
grad = e.weight.grad
print("1.", int((grad.indices()[0] == 7).sum()), "rows for id 7; coalesced:",
      int((grad.coalesce().indices()[0] == 7).sum()))
adam = optim.SparseAdam(e.parameters(), lr=0.1)
for batch in ([1, 2], [2, 3]):
    adam.zero_grad()
    e(minigrad.tensor(batch)).sum().backward()
    adam.step()
print("2. rows with zero exp_avg:", np.flatnonzero((adam.state[e.weight]["exp_avg"].numpy() == 0).all(1)).tolist())
print("3.", adjacency._nnz(), "(one per entry: an entry (i, j, v) adds v * X[j] into row i)")
