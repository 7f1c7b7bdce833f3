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
# # 03.5 The GPU backend: memory, copies, launches and fused kernels
#
# **Question:** what changes when the same tensor code runs on a GPU, and where does the time go
# there?
#
# A GPU has its own memory, reached from the host over a bus, and it runs each op as a *kernel*
# that the host launches. So three costs appear that a CPU run hides: copying data to the device,
# launching kernels, and moving every intermediate value through device memory. This notebook
# shows each with what can be computed or measured on any machine.
#
# **You will:** see how one op's code runs on both devices; compare the bus with device memory and
# measure the host's copy bandwidth; hide copies behind compute with a prefetcher; measure the
# fixed cost of dispatching an op; count the kernels fusion saves on a GPU and read the CUDA source
# it generates; time the fused chain against eager.
# **Time:** about 27 minutes (26 reading, 6 s running).
#
# **No GPU figures yet.** minigrad has not been run on a GPU so far. The figures this notebook
# would show from one are pending a run of `benchmarks/gpu_check.sh` on a machine with an NVIDIA
# GPU; until then, the GPU numbers below are either published hardware specs (said so where used)
# or a model computed from them, and everything measured is measured on this machine's CPU.

# %%
import os

# One BLAS thread, so that the timings below are not disturbed by threads competing for the
# cores (set before numpy is imported).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import inspect
import json
import math
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

import minigrad
import minigrad.cuda
from minigrad import backend
from minigrad.data import DataLoader, DevicePrefetcher, TensorDataset
from minigrad.errors import DeviceError
from minigrad.graph import trace
from minigrad.graph.codegen import cuda
from minigrad.graph.passes import eliminate_dead_code, fuse_elementwise
from minigrad.ops.elementwise import Exp

minigrad.manual_seed(0)

# %% [markdown]
# ## 1. One op code for both devices
# minigrad never imports numpy to compute on a tensor's data. Each device carries its *array
# module* `xp`: numpy on `cpu`, cupy (numpy's API on the GPU) on `cuda`. An op's forward asks its
# context for `xp`, so the CPU and the GPU path are the same lines:

# %%
print("cpu's array module:", backend.cpu.xp.__name__)
print(inspect.getsource(Exp.forward))

# %% [markdown]
# `minigrad.cuda` answers torch's questions: `is_available()` is true when cupy is installed and
# sees a GPU. `Tensor.to("cuda")` is an op (`ToDevice`) that copies the data with the backend's
# `to_device`; its backward copies the gradient back to where the input lives. Without a GPU the
# copy cannot happen, and the error says what is missing. (This cell's answer depends on the
# machine, so its output is not compared.)

# %%
# NBVAL_IGNORE_OUTPUT
print("minigrad.cuda.is_available():", minigrad.cuda.is_available())
print("minigrad.cuda.device_count():", minigrad.cuda.device_count())
x = minigrad.arange(4.0)
try:
    on_gpu = x.to("cuda")
    print("copied:", on_gpu.device, type(on_gpu.array).__module__)
except DeviceError as e:
    print(f"{type(e).__name__}: {e}")

# %% [markdown]
# ## 2. Host memory, device memory and the bus between them
# A GPU computes on its own memory. On an H200 that is 141 GB of HBM3e at 4.8 TB/s (NVIDIA's
# published spec). Data from the host comes over PCIe Gen5 x16, about 64 GB/s in each direction
# (published spec; NVLink, between GPUs or to a Grace CPU, is faster, but still well below HBM). The ratio decides
# what is worth doing: a value crosses the bus once, and is then read from HBM many times.

# %%
HBM = 4.8e12  # bytes/s, H200 HBM3e (published spec)
PCIE = 64e9  # bytes/s per direction, PCIe Gen5 x16 (published spec)

examples = {"batch of 256 RGB 224x224 images, float32": 256 * 3 * 224 * 224 * 4,
            "4096 x 1024 float32 activation": 4096 * 1024 * 4,
            "1B parameters in bfloat16": 10**9 * 2}
print(f"{'':44}{'MB':>9}{'over PCIe':>12}{'read from HBM':>15}")
for name, nbytes in examples.items():
    print(f"{name:44}{nbytes / 1e6:9.1f}{nbytes / PCIE * 1e3:9.2f} ms{nbytes / HBM * 1e3:12.3f} ms")
print(f"PCIe is {HBM / PCIE:.0f}x slower than HBM (published specs)")

# %% [markdown]
# Host memory is either *pageable* (what numpy allocates: the OS may move or swap it) or *pinned*
# (page-locked). The GPU's copy engine reads pinned memory directly, so a copy from it can run in
# the background; from pageable memory the driver first copies into a pinned staging buffer of its
# own while the CPU waits. On the host side, a copy is bounded by memory bandwidth, which we can
# measure here: `np.copyto` between two arrays, small to large (this cell's times change from run
# to run; its output is not compared).

# %%
# NBVAL_IGNORE_OUTPUT
def copy_bandwidth(nbytes: int, repeats: int = 5) -> float:
    """Best host-memory copy rate in bytes/s (read + write of nbytes counted once, as memcpy is)."""
    src, dst = np.ones(nbytes // 4, np.float32), np.empty(nbytes // 4, np.float32)
    loops = max(1, 2**24 // nbytes)
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(loops):
            np.copyto(dst, src)
        best = min(best, (time.perf_counter() - start) / loops)
    return nbytes / best


sizes = [2**k for k in range(12, 27, 2)]  # 4 KB to 64 MB
host = [copy_bandwidth(n) for n in sizes]
for n, rate in zip(sizes, host):
    print(f"{n / 1e6:10.3f} MB  {rate / 1e9:6.1f} GB/s")

fig, ax = plt.subplots(figsize=(6.5, 3.2))
ax.plot([n / 1e6 for n in sizes], [r / 1e9 for r in host], "o-", label="host memcpy, measured here")
for rate, label, style in ((HBM, "H200 HBM3e, published spec", "--"), (PCIE, "PCIe Gen5 x16, published spec", ":")):
    ax.axhline(rate / 1e9, color="grey", ls=style, label=label)
ax.set_xscale("log")
ax.set_yscale("log")
ax.set_xlabel("MB copied")
ax.set_ylabel("GB/s")
ax.legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# Small copies are slower per byte (a fixed cost per call); large ones settle at the host's memory
# bandwidth, once the arrays no longer fit in the caches. Whatever the host reaches, the bus sits
# far below HBM: every byte moved to the device should be used many times there.
#
# ## 3. Hiding the copy: prefetching on a side stream
# A GPU runs work queued on *streams*; work on different streams may overlap. A training loop that
# does `x.to("cuda")` at the top of each step leaves the GPU idle during the copy.
# `minigrad.data.DevicePrefetcher` wraps any loader: a background thread builds and pins the next
# batches, and each batch's copy is queued on a side stream while the step computes on the
# current one; the compute stream waits for the copy on the GPU, not on the CPU. On the CPU there
# is nothing to copy, and it is the background thread alone:

# %%
data = TensorDataset(minigrad.arange(12.0).reshape(6, 2), minigrad.arange(6))
prefetcher = DevicePrefetcher(DataLoader(data, batch_size=4), device="cpu")
print(prefetcher)
for xb, yb in prefetcher:
    print(f"batch {tuple(xb.shape)} on {xb.device}, labels {yb.tolist()}")

# %% [markdown]
# With `device="cuda"` the loop is the same; only the batches arrive on the GPU, already copied.
#
# ## 4. What a kernel launch costs
# On a GPU each eager op is at least one kernel launch: the host prepares the arguments and queues
# the kernel, a few microseconds each (5 µs is the usual order of magnitude). The CPU analogue is
# the framework's per-op dispatch: checking dtypes and devices, recording the graph, allocating
# the result. On 16-element tensors the arithmetic is nothing, so the time per op is all overhead
# (times vary; output not compared):

# %%
# NBVAL_IGNORE_OUTPUT
def us_per_op(op, repeats: int = 7, loops: int = 2000) -> float:
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(loops):
            op()
        best = min(best, (time.perf_counter() - start) / loops)
    return best * 1e6


a_np, b_np = np.ones(16, np.float32), np.ones(16, np.float32)
a, b = minigrad.tensor(a_np), minigrad.tensor(b_np)
a_grad = minigrad.tensor(a_np, requires_grad=True)
overhead = {"numpy a + b": us_per_op(lambda: a_np + b_np),
            "minigrad a + b": us_per_op(lambda: a + b),
            "minigrad a + b, recording the graph": us_per_op(lambda: a_grad + b)}
for name, us in overhead.items():
    print(f"{name:38} {us:6.2f} µs per op")
plain, recording = (overhead[k] / overhead["numpy a + b"] for k in list(overhead)[1:])
print(f"minigrad's call costs {plain:.1f}x numpy's, {recording:.1f}x when it records the graph")

# %% [markdown]
# numpy's own call costs on the order of a microsecond (the first line above: checking its
# arguments, resolving the loop for the dtypes, allocating the result). minigrad's call is a
# multiple of that, the ratio printed above:
# around numpy's call it looks up the modes in force, checks that the inputs share a device, wraps
# the result in a Tensor, and when an input requires grad it records the graph node that backward
# will walk. On a GPU the launch adds its microseconds to that dispatch, and every op of a chain
# pays both.
#
# ## 5. Why fusion matters more on a GPU
# Each eager op also reads its inputs from memory and writes its result back. On a GPU that is a
# round trip through HBM per op, plus a launch. Fusion (lesson 03.6) turns a chain of elementwise
# ops into one kernel that reads the inputs once and writes one result. We trace the benchmark's
# chain (`benchmarks/bench_fusion.py`: tanh-GELU, a per-column scale and shift, a sigmoid gate, a
# LayerNorm-style normalise of each row) at its size, 4096 x 1024 float32.
#
# The fusion pass groups by the device in each node's `meta['device']`, and it groups differently
# for a GPU: a CUDA kernel gives each thread one element, so a row reduction (the two `mean`s) ends
# its group instead of running inside it, as it does on the CPU. The pass reads only the device's
# type, so a stand-in with `type == "cuda"` makes it group, and write kernels, as it would on a
# GPU, on a machine without one:

# %%
def chain(x, scale, shift):
    g = 0.5 * x * (1 + minigrad.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)))
    h = g * scale + shift
    h = h * minigrad.sigmoid(h)
    d = h - h.mean(-1, keepdim=True)
    return d * minigrad.rsqrt((d * d).mean(-1, keepdim=True) + 1e-5)


SHAPE = (4096, 1024)
inputs = [minigrad.randn(*SHAPE), minigrad.randn(SHAPE[1]), minigrad.randn(SHAPE[1])]
graph = eliminate_dead_code(trace(chain, *inputs).graph)

gpu = type("Device", (), {"type": "cuda"})()  # the pass and codegen read only .type
for n in graph:
    n.meta["device"] = gpu
gpu_graph = fuse_elementwise(graph)
launches = [n for n in gpu_graph if n.fn is not None or n.op == "fused"]
for n in launches:
    print("fused: " + " ".join(n.attrs["ops"]) if n.op == "fused" else n.op)
print(f"{len(launches)} kernel launches instead of {len([n for n in graph if n.fn is not None])}")

# %% [markdown]
# ## 6. The fused kernel's CUDA source
# `minigrad.graph.codegen.cuda.generate(group)` writes each group as a `cupy.ElementwiseKernel` or
# `ReductionKernel`; cupy compiles it (NVRTC) the first time it runs on a GPU, so the source is
# plain text here. First the GELU-and-gate group, thirteen ops in one kernel: each thread keeps
# its element in registers (`v3` ... `v14`) and writes only `y`. Then the variance, whose `d * d`
# folds into its mean as a `ReductionKernel` that squares each element before the sum.

# %%
fused = [n for n in gpu_graph if n.op == "fused"]
gelu_gate = max(fused, key=lambda n: len(n.attrs["ops"]))
variance = next(n for n in fused if n.attrs["ops"][-1] == "Mean")
for group in (gelu_gate, variance):
    print(cuda.generate(group.meta["group"]).source)

# %% [markdown]
# What this saves can be counted from the graphs: every launch reads its inputs and writes its
# output once through device memory. With the published HBM bandwidth and 5 µs per launch, a
# simple model (not a measurement) estimates the time each version would spend:

# %%
def traffic(g) -> tuple[int, int]:
    """(launches, bytes read and written through device memory) of a graph's ops."""
    ops = [n for n in g if n.fn is not None or n.op == "fused"]
    nbytes = sum(math.prod(v.shape) * v.dtype.itemsize for n in ops for v in (*n.inputs, n))
    return len(ops), nbytes


LAUNCH = 5e-6  # seconds per launch, order of magnitude
print(f"{'':9}{'launches':>9}{'MB moved':>10}{'modelled µs':>13}   (H200 published HBM bandwidth)")
for name, g in (("eager", graph), ("fused", gpu_graph)):
    n, nbytes = traffic(g)
    print(f"{name:9}{n:9d}{nbytes / 1e6:10.1f}{(n * LAUNCH + nbytes / HBM) * 1e6:13.0f}")
print(f"a float32 elementwise op (4 bytes read, 4 written per element) spends as long in HBM as in "
      f"its launch at {LAUNCH * HBM / 8 / 1e6:.1f}M elements")

# %% [markdown]
# Memory traffic drops fivefold and launches more than threefold. Below a few million
# elements an elementwise op spends less time moving its data than being launched, so on a GPU
# small eager ops are mostly launch overhead, and fusing them removes it.
#
# ## 7. The speed-ups, measured
# `benchmarks/gpu_check.sh` stores the tables of a GPU run in `benchmarks/results/gpu.json`
# (`bench_gpu.py --json`). This cell shows them when that file exists:

# %%
RESULTS = Path("../../benchmarks/results/gpu.json")
if RESULTS.exists():
    results = json.loads(RESULTS.read_text())
    print(results["header"], results["timing"], sep="\n")
    for title, figures in results["sections"].items():
        print(f"\n{title}\n{figures}")
else:
    print("no GPU run recorded yet: run benchmarks/gpu_check.sh on a machine with an NVIDIA GPU")

# %% [markdown]
# Here, the same chain eager and compiled (`minigrad.compile` traces, fuses and replays the graph)
# on this machine's device: the CPU unless a GPU is present, where the timer waits for the queued
# kernels (`minigrad.cuda.synchronize`) before it stops. Interleaved, best of 7 calls each (times
# vary; output not compared):

# %%
# NBVAL_IGNORE_OUTPUT
device = minigrad.device("cuda" if minigrad.cuda.is_available() else "cpu")
x_dev = [t.to(device) for t in inputs]
compiled = minigrad.compile(chain)
compiled(*x_dev)  # the first call traces and compiles
print("largest difference from eager:", float((compiled(*x_dev) - chain(*x_dev)).abs().max().item()))

runs = {"eager": lambda: chain(*x_dev), "compiled": lambda: compiled(*x_dev)}
times = {name: math.inf for name in runs}
for _ in range(7):
    for name, run in runs.items():
        start = time.perf_counter()
        run()
        if device.type == "cuda":
            minigrad.cuda.synchronize()
        times[name] = min(times[name], time.perf_counter() - start)
for name, t in times.items():
    print(f"{name:9} {t * 1e3:8.2f} ms  on {device}")
print(f"compiled is {times['eager'] / times['compiled']:.1f}x faster than eager")

# %% [markdown]
# On the CPU the fused kernels win by keeping each block of the chain in the caches, by
# allocating nothing per op, and by splitting the blocks among threads (lesson 03.6 separates
# the two). On a GPU the same graph also saves fourteen launches and most of the
# HBM traffic; how much that buys there is the figure `gpu_check.sh` will record.
#
# **What to remember:** on a GPU, data crosses the bus once and is reused (PCIe is some 75x slower
# than HBM); copies hide behind compute when they come from pinned memory on a side stream; and
# each eager op costs a launch plus a round trip through HBM, which is why fusing a chain into one
# kernel matters even more there than on a CPU.

# %% [markdown]
# ## Predict, then run
# These answers come from the published specs and the pass, not from a clock.
# 1. One eager elementwise op on a 4096 x 1024 float32 tensor reads it from HBM and writes a
#    result back. Which takes longer on an H200: that memory traffic, or a 5 µs launch?
# 2. How much longer does the same tensor take to cross PCIe once than to make that round trip
#    through HBM?
# 3. On the CPU the fusion pass keeps the row means inside their groups. Does the chain then need
#    more groups than the GPU's, or fewer?

# %%
LAUNCH = 5e-6  # seconds, the usual order of magnitude (not measured)
round_trip = 2 * 4096 * 1024 * 4 / HBM
print(f"1. HBM round trip {round_trip * 1e6:.1f} µs vs launch {LAUNCH * 1e6:.0f} µs: the traffic, slightly; the same order, "
      "so a launch nearly doubles the cost of each eager op")
print(f"2. PCIe once / HBM round trip = {4096 * 1024 * 4 / PCIE / round_trip:.0f}x")
cpu_graph = fuse_elementwise(eliminate_dead_code(trace(chain, *inputs).graph))
cpu_groups = [n for n in cpu_graph if n.fn is not None or n.op == "fused"]
print(f"3. groups on the CPU: {len(cpu_groups)}, on the GPU: {len(launches)}; fewer, since a reduction need not end a group")
