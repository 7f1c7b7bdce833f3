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
# # 01.7 Build first, load lazily: the meta device and memory-mapped weights
#
# **Question:** a model's weights fill most of memory. Loading a checkpoint the usual way builds the
# model (random weights: one copy), reads the file (a second copy) and copies one into the other.
# Can we do with none of those copies?
#
# Yes, in two steps, both as in PyTorch: build the graph of modules on the **meta device**, where
# tensors have a shape and a dtype but no storage, then give them the checkpoint's arrays *mapped*
# from the file (`minigrad.load(path, mmap=True)`, `load_state_dict(..., assign=True)`): the
# operating system reads a page of weights the first time the forward pass touches it.
#
# **You will learn:**
# - what a meta tensor is, and that ops on it compute only shapes;
# - how to build a model with no memory, and `Module.to_empty`;
# - how `mmap=True` and `assign=True` load weights without copying them, and how checksums still work;
# - to move weights between PyTorch and minigrad through `.safetensors` files;
# - what lazy loading buys, measured: peak memory and time to the first forward.
#
# **Time:** about 14 minutes (13 reading, 15 s running).

# %%
import os
import sys
import tempfile

import matplotlib.pyplot as plt
import numpy as np

import minigrad
from minigrad import nn

minigrad.manual_seed(0)
tmp = tempfile.mkdtemp()

# %% [markdown]
# ## 1. Tensors without storage
# A meta tensor's array is a `MetaArray`: a shape and a dtype. Every op runs its usual code on it,
# and numpy's shape and dtype rules give the output's.

# %%
x = minigrad.randn(64, 1000, device="meta")
w = minigrad.randn(1000, 10, device="meta")
y = (x @ w).relu().sum(dim=1)
print(x, "\n", y)
print("bytes it would take:", x.nbytes, "bytes it takes: none; its array is", x.array)

# %% [markdown]
# Anything that needs a *value* is refused, with what to do about it:

# %%
try:
    y.sum().item()
except RuntimeError as e:
    print(type(e).__name__, ":", e)

# %% [markdown]
# ## 2. A model built on the meta device
# `with minigrad.device("meta"):` makes meta the default device, so layers create meta parameters
# (their `device=` argument does the same for one layer). Initialisation is skipped: there is nothing
# to write. The model still runs, on shapes:

# %%
with minigrad.device("meta"):
    big = nn.Sequential(*[nn.Linear(4096, 4096) for _ in range(16)])
n = sum(p.numel() for p in big.parameters())
print(f"{n:,} parameters, {n * 4 / 1e9:.2f} GB as float32, built in no memory")
print("output:", big(minigrad.empty(2, 4096, device="meta")))

# %% [markdown]
# `to_empty(device="cpu")` gives every tensor fresh, uninitialised storage (use it when you will
# initialise or load the weights yourself). Here we take a small model instead, and load it.

# %% [markdown]
# ## 3. Mapped weights
# `minigrad.save` writes each array raw, in an uncompressed zip member aligned to 64 bytes.
# `load(path, mmap=True)` returns arrays that are *views of the file* (private maps: writing to them
# changes memory, never the file), and `load_state_dict(sd, assign=True)` makes them the model's
# arrays instead of copying them in.

# %%
model = nn.Sequential(nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 10))
path = os.path.join(tmp, "model.ckpt")
minigrad.save(model.state_dict(), path)

with minigrad.device("meta"):
    lazy = nn.Sequential(nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 10))
lazy.load_state_dict(minigrad.load(path, mmap=True), assign=True)
print("weight's memory is a map of the file:", type(lazy[0].weight.array.base).__name__)
x = minigrad.randn(4, 256)
print("same outputs:", minigrad.equal(lazy(x), model(x)))

# %% [markdown]
# **Checksums.** A checkpoint stores a SHA-256 digest per array, and a mapped load still checks
# every one, before mapping, by reading the file once in chunks (through the page cache, not into
# the process's memory). That read is the price of safety; section 5 prints what it costs, next to
# a mapped `.safetensors` load, which has no checksum at all to check. A file changed on disk
# *after* the load shows through the map.
#
# ## 4. Weights to and from PyTorch: `.safetensors`
# `safetensors` is the ecosystem's pickle-free format: a JSON header (names, dtypes, shapes,
# offsets) and the raw bytes. `minigrad.save` / `load` on a path ending in `.safetensors` write and
# read it (writing needs the `safetensors` package, part of the course extra), mapped too with `mmap=True`.

# %%
# NBVAL_IGNORE_OUTPUT
# (what this prints depends on whether PyTorch is installed: it is optional)
try:
    import torch
    from safetensors.torch import load_file, save_file
except ImportError:
    torch = None
    print("torch or safetensors is not installed: skipping the round trip")
if torch is not None:
    torch.manual_seed(0)
    tmodel = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Tanh(), torch.nn.Linear(256, 10))
    save_file(tmodel.state_dict(), os.path.join(tmp, "torch.safetensors"))
    with minigrad.device("meta"):
        mine = nn.Sequential(nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 10))
    mine.load_state_dict(minigrad.load(os.path.join(tmp, "torch.safetensors"), mmap=True), assign=True)
    xs = np.random.default_rng(0).standard_normal((4, 256)).astype(np.float32)
    gap = np.abs(mine(minigrad.tensor(xs)).detach().numpy() - tmodel(torch.tensor(xs)).detach().numpy()).max()
    print("torch -> minigrad, largest difference in the outputs:", gap < 1e-5)
    minigrad.save(mine.state_dict(), os.path.join(tmp, "back.safetensors"))
    back = load_file(os.path.join(tmp, "back.safetensors"))
    print("minigrad -> torch, weights identical:", all(torch.equal(back[k], v) for k, v in tmodel.state_dict().items()))

# %% [markdown]
# ## 5. What it buys, measured
# `benchmarks/bench_mmap.py` loads a model in a fresh process per case and reports the peak
# resident memory and the time from start to the first forward's output. Here a small model
# (16 x Linear(1024, 1024), 67 MB); the benchmark's default is 1.07 GB. The numbers vary with the machine.

# %%
# NBVAL_IGNORE_OUTPUT
sys.path.insert(0, os.path.join(os.path.abspath(".."), "..", "benchmarks"))
from bench_mmap import run  # noqa: E402  (one subprocess per case)

with minigrad.device("meta"):
    m = nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(16)])
m.to_empty(device="cpu")
results = {}
for fmt in ("ckpt", "safetensors"):
    p = os.path.join(tmp, f"m16.{fmt}")
    minigrad.save(m.state_dict(), p)
    results[fmt] = {case: run(1024, 16, p, lazy) for case, lazy in (("eager", False), ("meta + mmap", True))}
fig, axes = plt.subplots(1, 2, figsize=(9, 3))
for ax, key, label in zip(axes, ("peak_mib", "seconds"), ("peak resident memory (MiB)", "time to first forward (s)")):
    for i, fmt in enumerate(results):
        for j, case in enumerate(results[fmt]):
            ax.bar(i * 3 + j, results[fmt][case][key], color="tab:blue" if j == 0 else "tab:orange",
                   label=case if i == 0 else None)
    ax.set_xticks([0.5, 3.5], ["native", "safetensors"])
    ax.set_title(label)
axes[0].legend()
plt.tight_layout()
plt.show()
for fmt, cases in results.items():
    print(fmt, {case: {k: round(v, 2) for k, v in r.items()} for case, r in cases.items()})
native, plain = (results[fmt]["meta + mmap"]["seconds"] for fmt in ("ckpt", "safetensors"))
print(f"mapped load: native {native:.2f} s, safetensors (no checksums) {plain:.2f} s: checking the "
      f"digests costs about {max(native - plain, 0):.2f} s, {max(native - plain, 0) / native:.0%} of the native load "
      "(whose time also counts starting Python and importing minigrad)")

# %% [markdown]
# Eager loading holds the randomly initialised model *and* the loaded copy at once; the lazy path
# holds only the pages the forward pass touched (all of them here, since one forward uses every
# weight). It also skips the random initialisation, which for a big model is most of the time.
#
# ## Predict, then run
# 1. What is `(minigrad.empty(3, 4, device="meta") @ minigrad.empty(4, device="meta")).shape`?
# 2. A model loaded with `mmap=True, assign=True` is trained for a step. Does the file change?
# 3. `nn.Linear(4096, 4096)` on the meta device: how many bytes of parameters does it allocate?

# %%
print("1.", (minigrad.empty(3, 4, device="meta") @ minigrad.empty(4, device="meta")).shape)
opt = minigrad.optim.SGD(lazy.parameters(), lr=0.1)
lazy(x).sum().backward()
opt.step()
print("2. file unchanged:", minigrad.equal(minigrad.load(path)["0.weight"], model[0].weight.detach()),
      "(the map is private: copy-on-write)")
with minigrad.device("meta"):
    layer = nn.Linear(4096, 4096)
print("3.", sum(p.array.nbytes for p in layer.parameters()), "bytes it would hold; allocated: 0")
