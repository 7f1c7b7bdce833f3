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
# # 03.6 Fused kernels: from a graph to C, numpy blocks and CUDA
#
# **Question:** after the passes of 03.1, what is left is real work, but eager execution still runs
# it one op at a time, each op reading its inputs from memory and writing a full-size result back.
# How does merging a chain of ops into one generated kernel change its memory and its speed?
#
# **You will:** find the fusion groups of a GELU-and-normalise chain and the rules that bound
# them, read the kernel minigrad writes for one group three ways (a C loop compiled by gcc,
# blocked numpy, CUDA), measure the executor's memory plan, time eager against both CPU kernels,
# and see a training step's backward fuse too.
# **Time:** about 24 minutes (23 reading, 4 s running).

# %%
import os

# One BLAS thread, so that the timings below are not disturbed by threads competing for the
# cores (set before numpy is imported).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import math
import time

import matplotlib.pyplot as plt
import numpy as np

import minigrad
from minigrad import memory, nn
from minigrad.graph import Executor, trace
from minigrad.backend import cc
from minigrad.graph.codegen import c, cuda, numpy_blocks
from minigrad.graph.passes import eliminate_dead_code, fuse_elementwise, fusion_groups
from minigrad.graph.viz import draw_pair

minigrad.manual_seed(0)

# %% [markdown]
# ## 1. Fusion groups
# A chain of twenty elementwise ops over an 8 MB tensor moves hundreds of MB through memory while
# the arithmetic per element is a few instructions. Fusion merges such chains into one kernel that
# reads the inputs once and writes the result once; the intermediates stay in registers or caches.
#
# The chain from `benchmarks/bench_fusion.py`: a tanh-approximation GELU, a per-column scale and
# shift, a sigmoid gate `h * sigmoid(h)`, then a LayerNorm-style normalise of each row.

# %%
def gelu_gate(x, scale, shift):
    g = 0.5 * x * (1 + minigrad.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)))
    h = g * scale + shift
    return h * minigrad.sigmoid(h)


def normalise(h):
    d = h - h.mean(-1, keepdim=True)
    return d * minigrad.rsqrt((d * d).mean(-1, keepdim=True) + 1e-5)


def chain(x, scale, shift):
    return normalise(gelu_gate(x, scale, shift))


small = [minigrad.randn(4, 8), minigrad.randn(8), minigrad.randn(8)]
graph = eliminate_dead_code(trace(chain, *small).graph)
groups = fusion_groups(graph)
for k, group in enumerate(groups):
    print(f"group {k} -> {group[-1].name}: {', '.join(n.op for n in group)}")

# %% [markdown]
# `fusion_groups` finds the groups; `fuse_elementwise` replaces each by one `fused` node named
# after its root (the node whose value leaves the group) and holding the generated kernel. Each
# group has its own colour, before and after:

# %%
PALETTE = ["#fdae61", "#b2abd2", "#fee08b", "#f46d43", "#a6d96a", "#66c2a5"]
colours = {n.name: "#ffffff" for n in graph if n.op not in ("placeholder", "constant", "parameter", "output")}
colours.update({n.name: PALETTE[k % len(PALETTE)] for k, group in enumerate(groups) for n in group})
fused = fuse_elementwise(graph)
print(fused)
draw_pair(graph, fused, colours, marked=())

# %% [markdown]
# ## 2. What joins a group, and what stops it
# Each group grows backwards from its root (`minigrad/graph/passes/fusion.py` has the rules in full):
#
# - a node joins the group of its consumers only when **all** of its consumers are in that one
#   group: then every path from it meets again inside, and the group has one way out;
# - **elementwise** ops join a group of their own shape; operands that broadcast (a per-column
#   `scale`) stay outside as inputs of the kernel;
# - a **reduction** ends its group; on the CPU one over the trailing axes of each row
#   (`h.mean(-1, keepdim=True)`) may sit inside, and the kernel then walks whole rows;
# - a **matmul**, `Linear` or conv can start a group as the producer of an elementwise epilogue;
# - **movement ops**, **random ops**, **effects** (`copy_`, `set_grad`) and ops whose saved arrays
#   a backward reads are boundaries; a group holds at most `max_group_size` nodes.

# %%
def groups_of(fn, *inputs, **kwargs):
    graph = eliminate_dead_code(trace(fn, *inputs).graph)
    return [[n.op for n in group] for group in fusion_groups(graph, **kwargs)]


def diamond(x):  # both uses of exp(x) meet again in the product
    a = x.exp()
    return (a + 1) * (a - 1)


def fork(x):  # two outputs that never meet again
    a = x.exp()
    return (a + 1).tanh(), (a * 2).sin()


def transposed(x):
    return (x.exp() * 2).T.tanh() + 1


def dropped(x):
    return nn.functional.dropout(x.exp() * 2, 0.5).tanh() + 1


def long_chain(x):
    for _ in range(6):
        x = (x * 1.5).tanh()
    return x


x = minigrad.randn(4, 8)
for fn, kwargs in [(diamond, {}), (fork, {}), (transposed, {}), (dropped, {}), (long_chain, {"max_group_size": 4}),
                   (normalise, {})]:
    print(f"{fn.__name__:12} {groups_of(fn, x, **kwargs)}")

# %% [markdown]
# ## 3. One group, three kernels
# Each op class declares how each generator writes it (`minigrad/ops/op.py`: `c`, `cpu`/`ufunc`,
# `cuda`), so the generators keep no table of op names. For the GELU-and-gate group:
#
# **C** (`codegen/c.py`, what `minigrad.compile` uses on the CPU): one loop in which each element
# goes through the whole chain in registers. gcc vectorises it (float `tanh` as a rational
# function written into the source, `minigrad_tanhf`, within 6 ulp of the exact value and 2.4x
# faster than glibc's vector `tanhf`; `exp` and the rest through glibc's vector math library)
# and OpenMP shares it among the cores. Shapes are fixed by the trace, so the broadcast operands
# are indexed in the loop itself: `x1[i1]` is the per-column scale.

# %%
gate_graph = fuse_elementwise(trace(gelu_gate, *small).graph)
(gate,) = [n.meta["group"] for n in gate_graph if n.op == "fused"]
print(c.generate(gate).source)

# %% [markdown]
# **Blocked numpy** (`codegen/numpy_blocks.py`, the fallback where no C compiler is found): generated
# Python whose `block` applies the group's ufuncs with `out=` into a few scratch buffers, over the
# output a block of about `numpy_blocks.BLOCK_SIZE` elements at a time, so a block's intermediates stay in
# the caches. Still one numpy call per op and block, each giving up and retaking the GIL.

# %%
print(numpy_blocks.generate(gate).source)

# %% [markdown]
# In the build track you write the walk that produces `block`'s lines: the body of `_block_code`
# in `codegen/numpy_blocks.py`, the region *the numpy-block kernel's expression walk* (`python -m
# minigrad.course regions`). It visits the group's ops in order, writes each op's ufunc calls
# (its class's `ufunc` or `cpu` declaration) with its operands' block names, sends the last op's
# value into the output block `o`, and reuses a scratch buffer as soon as the last op that reads
# its value has run: the gate group's thirteen ops need only the two buffers `s0` and `s1`. Its
# docstring states the whole contract; `python -m minigrad.course test-chapter 3` tests it, and
# the cell below checks the kernel it writes for this group.

# %%
# Check: your expression walk (minigrad.graph.codegen.numpy_blocks._block_code) on the gate group
from minigrad.course import answer
from minigrad.graph.trace import run_graph

(want,) = run_graph(trace(gelu_gate, *small).graph, small)  # eager: one op at a time
got = answer(np.asarray(run_graph(gate_graph, small)[0]))  # the fused graph runs the kernel your walk wrote
assert np.array_equal(got, np.asarray(want)), "the kernel must compute what the ops compute one at a time, bit for bit"
header = numpy_blocks.generate(gate).source.split("def block(")[1].split(")")[0]
scratch = answer([name for name in header.split(", ") if name.startswith("s")])
assert scratch == ["s0", "s1"], f"the gate group's values are never more than two alive at once: s0, s1; got {scratch}"
print("your walk's kernel matches eager evaluation, with", len(scratch), "scratch buffers")

# %% [markdown]
# **CUDA** (`codegen/cuda.py`): one `cupy.ElementwiseKernel`, each GPU thread carrying one element
# through the chain: one launch instead of one per op. cupy compiles it on the first call on a
# GPU, so printing it needs none.

# %%
print(cuda.generate(gate).source)

# %% [markdown]
# A group with row reductions, the normalise, becomes in C a loop over rows, and in each row one
# loop over its columns per stretch between reductions; the sums accumulate in `double`, and a
# value a later stretch reads waits in a row buffer that stays in L1:

# %%
norm_graph = fuse_elementwise(trace(normalise, small[0]).graph)
print(c.generate(next(n.meta["group"] for n in norm_graph if n.op == "fused")).source)

# %% [markdown]
# `cc.build` compiles a kernel's source into a shared library, cached by a hash of source,
# compiler and flags in `MINIGRAD_CACHE_DIR` (default `~/.cache/minigrad`), and loads it with
# ctypes. The flags keep eager's answers: `-ffast-math` would make `relu(nan)` 0, and without
# `-ffp-contract=off`, `a * b + c` becomes one FMA, rounded once where numpy rounds twice.

# %%
print(cc.compiler(), " ".join(cc.FLAGS), " ".join(cc.LIBS))

# %% [markdown]
# ## 4. Memory: the executor
# `run_graph` keeps every value until the end. The `Executor` knows the whole schedule before it
# runs, so it frees each buffer right after its last reader: its *planned peak* comes from shapes
# and dtypes alone, and `run(..., measure=True)` measures the real one. On a 2048 x 1024 input
# (8 MB per float32 array), intermediates only:

# %%
SHAPE = (2048, 1024)
inputs = [minigrad.randn(*SHAPE), minigrad.randn(SHAPE[1]), minigrad.randn(SHAPE[1])]
unfused = eliminate_dead_code(trace(chain, *inputs).graph)
executors = {"unfused graph": Executor(unfused), "fused graph": Executor(fuse_elementwise(unfused))}
for name, ex in executors.items():
    ex.run(inputs, measure=True)
    print(f"{name:14} {ex.report()}")
with memory.track() as mem:
    chain(*inputs)
eager_peak = mem.peak - mem.start
print(f"{'eager':14} measured peak {eager_peak / 1e6:.2f} MB")

MB = 1e6
fig, ax = plt.subplots(figsize=(6.5, 3.2))
ax.axhline(executors["unfused graph"].planned_total / MB, color="grey", ls="--",
           label="run_graph on the unfused graph (keeps every value)")
ax.bar([0.8, 1.8], [ex.planned_peak / MB for ex in executors.values()], 0.4, label="planned peak")
ax.bar([0.0, 1.2, 2.2], [eager_peak / MB] + [ex.measured_peak / MB for ex in executors.values()], 0.4,
       label="measured peak")
ax.set_xticks([0, 1, 2], ["eager", "executor,\nunfused graph", "executor,\nfused graph"])
ax.set_ylabel("MB of intermediate values")
ax.legend(fontsize=8, loc="center right")
plt.tight_layout()
plt.show()

# %% [markdown]
# Freeing at last use keeps a few 8 MB buffers alive however long the chain; a fused group's
# intermediates never exist at full size at all.
#
# ## 5. Speed
# `minigrad.compile` traces on the first call, runs the passes of 03.1 and fusion, and replays
# the fused graph; `backend="c"` (the default) or `"numpy"` chooses the CPU kernels. Both agree
# with eager:

# %%
compiled = {backend: minigrad.compile(chain, backend=backend) for backend in ("c", "numpy")}
expected = chain(*inputs).numpy()
for backend, fn in compiled.items():
    fn(*inputs)  # traces (and runs eagerly)
    difference = np.abs(fn(*inputs).numpy() - expected).max()  # replays; the C library is built here
    assert difference < 1e-4
    print(f"{backend:6} largest difference from eager: {difference:.1e}")

# %%
# NBVAL_IGNORE_OUTPUT
contenders = {"eager": lambda: chain(*inputs), "compiled, numpy blocks": lambda: compiled["numpy"](*inputs),
              "compiled, C": lambda: compiled["c"](*inputs)}
times = {name: [] for name in contenders}
for _ in range(7):
    for name, run in contenders.items():
        start = time.perf_counter()
        run()
        times[name].append(time.perf_counter() - start)
best = {name: min(t) * 1e3 for name, t in times.items()}
for name, ms in best.items():
    print(f"{name:24} {ms:7.2f} ms   {best['eager'] / ms:5.1f}x")
fig, ax = plt.subplots(figsize=(6, 2.4))
ax.barh(list(best)[::-1], list(best.values())[::-1], color=["#74c476", "#a1d99b", "#9ecae1"])
ax.set_xlabel(f"ms per call, {SHAPE[0]} x {SHAPE[1]} float32 (best of 7)")
plt.tight_layout()
plt.show()

# %% [markdown]
# The blocked numpy kernel saves the memory traffic but still makes a numpy call per op and block;
# the C loop makes none, and keeps each element in registers through the whole chain. The gain
# grows with the size: when every intermediate fits in the caches, eager's round trips are cheap.
#
# ## 6. Training steps fuse too
# Backward rules are minigrad ops (chapter 02), so a traced training step holds the backward's
# elementwise chains, and fusion treats them like any other: the gradient of GELU (an `erf`, an
# `exp` and eight arithmetic ops) becomes the epilogue of the matmul that computes the incoming
# gradient, and so do `TanhBackward` and `SigmoidBackward`:

# %%
model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 128), nn.Tanh(), nn.Linear(128, 10))
opt = minigrad.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
data, target = minigrad.randn(32, 64), minigrad.randint(0, 10, (32,))


def step(x, t):
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), t)
    loss.backward()
    opt.step()
    return loss


step(data, target)  # a warm-up step, so the momentum buffers exist before the trace
compiled_step = minigrad.compile(step)
compiled_step(data, target)
(step_graph,) = compiled_step.graphs.values()
for n in step_graph:
    if n.op == "fused" and "Matmul" in n.attrs["ops"]:
        print(f"{type(n.fn).__name__:8} {', '.join(n.attrs['ops'])}")

# %% [markdown]
# ## What fusion saves, and what stops it
# - **Memory traffic.** An eager chain reads and writes a full-size array per op; a fused kernel
#   reads its inputs once and writes its result once. Elementwise ops do little arithmetic per
#   byte, so this traffic, not the arithmetic, sets their speed.
# - **Memory.** A group's intermediates never exist at full size (section 4).
# - **Calls.** One C call, or one GPU launch, instead of one per op; the blocked numpy kernel
#   still calls numpy once per op and block.
# - **What stops it:** a value whose consumers never meet again, movement ops, random ops, side
#   effects, values a backward needs saved, shapes that do not match, and the cap on a group's
#   size. Every boundary writes a full array to memory and reads it back.
#
# ## Predict, then run
# 1. `long_chain` is twelve ops. How many groups does it make with `max_group_size=4`, and with
#    the default of 32?
# 2. `(x * 2).relu()` compiled to C, with a `NaN` in `x`: what comes out in its place?
# 3. `minigrad.compile(chain)` again, on the same shapes, in a new process: does gcc run again?

# %%
print("1.", len(groups_of(long_chain, x, max_group_size=4)), "groups of 4;",
      len(groups_of(long_chain, x)), "group of 12")
relu2 = minigrad.compile(lambda a: (a * 2).relu(), backend="c")
with minigrad.no_grad():
    nan_in = minigrad.tensor([1.0, float("nan"), -1.0])
    relu2(nan_in)
    print("2.", relu2(nan_in).numpy(), "as eager:", (nan_in * 2).relu().numpy())
(chain_graph,) = compiled["c"].graphs.values()
library = cc.library_path(next(n.fn for n in chain_graph if n.op == "fused").source)
print("3. no: section 5's kernel is in the cache:", library.exists(), "(gcc runs only for a new source or flags)")
