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
# # 03.1 Graph optimisation: passes, fusion and generated kernels
#
# **Question:** once a function is traced into a static graph, what can we rewrite before running
# it, and what does each rewrite buy?
#
# Eager execution sees one op at a time: it cannot know whether a value will be used, whether it
# was computed before, or whether the next five ops could run as one loop. A traced graph is the
# whole program, so a compiler can answer those questions first. Each *pass* below is a function
# `Graph -> Graph` from `minigrad.graph.passes` that returns a new, cheaper graph computing the
# same values.

# %%
import os

# One BLAS thread, so that the timings below are not disturbed by threads competing for the
# cores (set before numpy is imported).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import difflib
import math
import time

import graphviz
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import display

import minigrad
from minigrad import memory, nn
from minigrad.graph import Executor, draw, trace
from minigrad.graph.codegen import cpu, cuda
from minigrad.graph.passes import (PassManager, default_passes, eliminate_common_subexpressions, eliminate_dead_code,
                                   fold_constants, fold_conv_bn, fuse_elementwise, fusion_groups, simplify)
from minigrad.graph.trace import run_graph

minigrad.manual_seed(0)

# %% [markdown]
# ## 1. Why a static graph
# A small layer: scores plus a fixed positional bias, divided by a temperature, then a softmax
# over the last axis. It is written the way code often is: a sanity check on the input, the bias
# recomputed at every call, `exp` written twice. We trace it and read the graph as a compiler
# would.

# %%
positions = minigrad.arange(8) / 8  # fixed: not an input, not a parameter


def scores(x, temperature=1.0):
    if x.abs().max() > 100:  # a check Python evaluates once, at trace time
        print("large scores")
    bias = (positions * math.pi).sin()
    h = (x + bias) / temperature
    return h.exp() / h.exp().sum(-1, keepdim=True)


x = minigrad.randn(4, 8)
traced = trace(scores, x)
print(traced.graph)
draw(traced.graph)

# %% [markdown]
# Four wastes are visible in the graph: `Abs`, `Amax`, `Greater` compute the check, whose result
# nothing reads any more; `Mul`, `Sin` compute the bias from a constant, the same at every call;
# `Exp(%8)` appears twice; and the division by `1.0` changes nothing. Each pass below removes one
# of them. To see what a pass did, `compare` prints the lines of the listing it removed (`-`) and
# added (`+`), and draws the graph before and after with those nodes outlined in red.

# %%
def side_by_side(before, after, colours=None, marked=()):
    """Draw two graphs next to each other. `colours` maps node names to fill colours and the nodes
    named in `marked` get a red outline (a pass keeps the names of the nodes it does not replace,
    so one name serves both graphs)."""
    dot = graphviz.Digraph(node_attr={"fontname": "Helvetica", "fontsize": "10"})
    for title, graph in (("before", before), ("after", after)):
        nodes, edges = graph.dot_elements()  # ids follow the topological order
        with dot.subgraph(name=f"cluster_{title}", graph_attr={"label": title, "fontname": "Helvetica"}) as box:
            for node, (key, attrs) in zip(graph.topological_order(), nodes):
                attrs = dict(attrs, fillcolor=(colours or {}).get(node.name, attrs["fillcolor"]))
                if node.name in marked:
                    attrs.update(color="#d7301f", penwidth="3")
                box.node(f"{title}_{key}", **{k: v.replace("\n", "\\n") for k, v in attrs.items()})
            for a, b in edges:
                box.edge(f"{title}_{a}", f"{title}_{b}")
    return dot


def compare(graph, graph_pass):
    """Run one pass; print the listing's changed lines and draw before and after."""
    new = graph_pass(graph)
    old_lines, new_lines = str(graph).splitlines(), str(new).splitlines()
    print(f"{graph_pass.__name__}: {len(graph)} -> {len(new)} nodes")
    for line in difflib.unified_diff(old_lines, new_lines, n=0, lineterm=""):
        if not line.startswith(("---", "+++", "@@")):
            print(" ", line)
    changed = {n.name for n in graph if n.format() not in new_lines}
    changed |= {n.name for n in new if n.format() not in old_lines}
    display(side_by_side(graph, new, marked=changed))
    return new


# %% [markdown]
# ## 2. Dead code elimination
# A node is *live* when its value reaches the output or a side effect (an in-place write, a
# `.grad`); `eliminate_dead_code` walks back from those along the in-edges and drops everything
# else. Placeholders stay (they are the graph's signature), and so do random ops: a dropout
# nobody reads still advances the random generator.

# %%
g1 = compare(traced.graph, eliminate_dead_code)

# %% [markdown]
# ## 3. Constant folding
# A node whose inputs are all constants has the same value at every run, so `fold_constants`
# runs it once, now, and keeps the result as a `constant`. Parameters are not constants, since an
# optimizer changes them between calls; `fold_constants(graph, freeze=True)` treats them as
# constants for inference (section 10).

# %%
g2 = compare(g1, fold_constants)

# %% [markdown]
# ## 4. Common subexpression elimination
# Two nodes applying the same op to the same inputs with the same attributes compute the same
# value; `eliminate_common_subexpressions` keeps the first and points the users of the second at
# it. In traced training steps this matters more than here: backward often recomputes what
# forward had. Random ops never merge (two dropouts draw two masks).

# %%
g3 = compare(g2, eliminate_common_subexpressions)

# %% [markdown]
# ## 5. Algebraic simplification
# `simplify` applies exact identities only: `x*1`, `x+0`, `x/1`, `-(-x)`, a cast to the same
# dtype, a reshape to the same shape, two transposes that cancel. `x*0` is not among them: it is
# `NaN` when `x` is `inf` or `NaN`. An identity holds only when the op changes neither shape nor
# dtype (`x*1` with a larger `1` broadcasts `x`).

# %%
g4 = compare(g3, simplify)
x = minigrad.randn(4, 8)
np.testing.assert_allclose(run_graph(g4, [x])[0], scores(x).numpy(), rtol=1e-6)
print(f"{len(traced.graph)} nodes traced, {len(g4)} after four passes; same result")

# %% [markdown]
# `default_passes()` runs the same passes in a good order (folding first, since it makes
# constants for CSE to merge, and dead code last, to sweep up what the others left).
#
# ## 6. Fusion
# What is left is real work, but eager execution does it wastefully: every elementwise op reads
# its inputs from memory and writes a full-size result back. A chain of twenty such ops over an
# 8 MB tensor (the input of sections 8 and 9) moves hundreds of MB, while the arithmetic per
# element is a few instructions.
# Fusion merges chains of ops into one kernel that reads the inputs once and writes the result
# once, and keeps the intermediates in small buffers (on a GPU, in registers).
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
# group has its own colour, before and after; ops in no group are white:

# %%
PALETTE = ["#fdae61", "#b2abd2", "#fee08b", "#f46d43", "#a6d96a", "#66c2a5"]
colours = {n.name: "#ffffff" for n in graph if n.op not in ("placeholder", "constant", "parameter", "output")}
colours.update({n.name: PALETTE[k % len(PALETTE)] for k, group in enumerate(groups) for n in group})
fused = fuse_elementwise(graph)
print(fused)
side_by_side(graph, fused, colours)

# %% [markdown]
# ### What joins a group, and what stops it
# The rules (the docstring of `minigrad/graph/passes/fusion.py` has them in full) grow each group
# backwards from its root:
#
# - a node joins the group of its consumers only when **all** of its consumers are in that one
#   group: then every path from it meets again inside the group, and the group has one way out.
#   A value with two consumers that never meet again is a boundary;
# - **elementwise** ops join a group of their own shape; operands that broadcast (a per-column
#   `scale`) stay outside as inputs of the kernel;
# - **reductions** change the shape. The elementwise ops before one run as its prologue; on the
#   CPU, a reduction over the trailing axes of each row (`h.mean(-1, keepdim=True)`) can also sit
#   inside a group whose kernel walks blocks of whole rows;
# - a **matmul**, `Linear` or conv can start a group as the producer of an elementwise epilogue
#   (GEMM + bias + activation);
# - **movement ops** (reshape, transpose, indexing) change which element sits where, so they are
#   boundaries; so are **random ops** (a dropout's mask comes from the generator, not from the
#   inputs), **effects** (`copy_`, `set_grad`), and ops whose saved arrays a backward reads;
# - a group holds at most `max_group_size` nodes.
#
# Each rule on a small function (the lists are the ops of each group):

# %%
def groups_of(fn, *inputs, **kwargs):
    graph = eliminate_dead_code(trace(fn, *inputs).graph)
    return [[n.op for n in group] for group in fusion_groups(graph, **kwargs)]


buffer = minigrad.zeros(4, 8)


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


def updates_buffer(x):
    y = x.exp() * 2
    buffer.add_(y)  # an in-place write: a copy_ node
    return (y + 1).tanh()


def long_chain(x):
    for _ in range(6):
        x = (x * 1.5).tanh()
    return x


x = minigrad.randn(4, 8)
for fn, kwargs in [(diamond, {}), (fork, {}), (transposed, {}), (dropped, {}), (updates_buffer, {}),
                   (long_chain, {"max_group_size": 4}), (normalise, {})]:
    print(f"{fn.__name__:15} {groups_of(fn, x, **kwargs)}")

# %% [markdown]
# ## 7. The generated kernels
# On the CPU a kernel is generated Python (`minigrad/graph/codegen/cpu.py`): a `block` function
# applies the group's numpy ufuncs with `out=` into a few scratch buffers, and the entry function
# runs it over the output block by block (about `cpu.BLOCK_SIZE` elements, whole rows when the
# group holds a row reduction), so the intermediates of a block stay in the caches and nothing is
# allocated per op. The largest kernel of the chain:

# %%
kernels = [n for n in fused if n.op == "fused"]
largest = max(kernels, key=lambda n: len(n.attrs["ops"]))
print(largest.fn.source)

# %% [markdown]
# On a GPU each eager op is a kernel launch that reads device memory and writes it back. A group
# becomes one `cupy.ElementwiseKernel` (or `ReductionKernel`) in which each thread carries its
# element through the whole chain in registers: one launch instead of one per op. This is the
# CUDA source minigrad writes for the GELU-and-gate part of the chain; cupy compiles it (NVRTC)
# on the first call on a GPU, so printing it needs none:

# %%
gate_graph = fuse_elementwise(trace(gelu_gate, *small).graph)
(gate_kernel,) = [n for n in gate_graph if n.op == "fused"]
print(cuda.generate(gate_kernel.meta["group"]).source)

# %% [markdown]
# ## 8. Memory: the executor
# `run_graph` keeps every value until the end. The `Executor` knows the whole schedule before it
# runs, so it frees each buffer right after its last reader: its *planned peak* is computed from
# shapes and dtypes alone, and `run(..., measure=True)` measures the real one with the memory
# tracker. On a 2048 x 1024 input (8 MB per float32 array), eager minigrad, the executor on the
# unfused graph and on the fused one (intermediates only: the inputs are not counted):

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
# The executor's plan matches what it measures. Freeing at last use keeps only a few 8 MB
# buffers alive however long the chain; fusion goes further, since a fused group's
# intermediates never exist at full size, only its result does.
#
# ## 9. Speed
# `minigrad.compile` traces on the first call, runs the passes of sections 2-6 and replays the
# fused graph with the executor. Timing eager against compiled on the same input, interleaved,
# best of several calls each. A call this large also splits its blocks among up to
# `cpu.NUM_THREADS` threads while eager numpy computes each op on one, so the compiled chain is
# timed on one thread as well, to separate what fusion buys from what threads buy:

# %%
compiled = minigrad.compile(chain)
result = compiled(*inputs)  # the first call traces and compiles (and runs eagerly)
result = compiled(*inputs)  # later calls replay the fused graph
difference = np.abs(result.numpy() - chain(*inputs).numpy()).max()
assert difference < 1e-5
print(f"largest difference from eager: {difference:.1e}")

# %%
# NBVAL_IGNORE_OUTPUT
def on_threads(n):
    def run():
        saved, cpu.NUM_THREADS = cpu.NUM_THREADS, n
        try:
            compiled(*inputs)
        finally:
            cpu.NUM_THREADS = saved
    return run


contenders = {"eager": lambda: chain(*inputs), "compiled, 1 thread": on_threads(1),
              f"compiled, {cpu.NUM_THREADS} threads": on_threads(cpu.NUM_THREADS)}
times = {name: [] for name in contenders}
for _ in range(7):
    for name, run in contenders.items():
        start = time.perf_counter()
        run()
        times[name].append(time.perf_counter() - start)
best = {name: min(t) * 1e3 for name, t in times.items()}
for name, ms in best.items():
    print(f"{name:22} {ms:7.2f} ms   {best['eager'] / ms:4.1f}x")
fig, ax = plt.subplots(figsize=(6, 2.4))
ax.barh(list(best)[::-1], list(best.values())[::-1], color=["#74c476", "#74c476", "#9ecae1"])
ax.set_xlabel(f"ms per call, {SHAPE[0]} x {SHAPE[1]} float32 (best of 7)")
plt.tight_layout()
plt.show()

# %% [markdown]
# The same values with much less memory traffic. How much faster that makes the chain depends on
# the size: when every intermediate fits in the caches, eager numpy's round trips are cheap, and
# the gain grows as the arrays outgrow them (try `SHAPE = (64, 1024)`).
#
# ## 10. Folding Conv + BatchNorm for inference
# In evaluation mode BatchNorm is an affine map per channel, `y * s + t` with
# $s = \gamma / \sqrt{\sigma^2_{\text{running}} + \epsilon}$ and $t = \beta - \mu_{\text{running}}\, s$.
# Applied to a convolution's output $y = W * x + b$ it gives $(W s) * x + (b s + t)$: the same
# convolution with each output channel's filter scaled, and a new bias. `fold_conv_bn(model)`
# does this on the modules:

# %%
model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
for _ in range(5):  # a few training batches, so the running statistics are not 0 and 1
    model(minigrad.randn(16, 3, 8, 8) * 2 + 1)
model.eval()
folded_model = fold_conv_bn(model)
print(folded_model)
images = minigrad.randn(2, 3, 8, 8)
with minigrad.no_grad():
    np.testing.assert_allclose(folded_model(images).numpy(), model(images).numpy(), rtol=1e-5, atol=1e-5)
print("outputs match")

# %% [markdown]
# On a traced graph the same happens in passes: `default_passes(freeze=True)` folds the
# parameters into constants, so BatchNorm's scale and shift become one array each, and
# `fold_batch_norm` merges them into the convolution. With `verbose=True` the `PassManager`
# prints what each pass changed:

# %%
with minigrad.no_grad():
    traced_cnn = trace(lambda x: model(x), images)
inference = PassManager(default_passes(freeze=True), verbose=True)(traced_cnn.graph)

# %%
print(inference)
with minigrad.no_grad():
    np.testing.assert_allclose(run_graph(inference, [images])[0], model(images).numpy(), rtol=1e-5, atol=1e-5)
side_by_side(traced_cnn.graph, inference)

# %% [markdown]
# ## What fusion saves, and what stops it
# - **Memory traffic.** An eager chain reads and writes a full-size array per op; a fused kernel
#   reads its inputs once and writes its result once. Elementwise ops do little arithmetic per
#   byte, so this traffic, not the arithmetic, sets their speed.
# - **Memory.** The intermediates of a group never exist at full size, so the executor's peak
#   drops (section 8).
# - **Launches.** On a GPU, one kernel launch instead of one per op; each launch has a fixed
#   cost, as large as a small op's whole work. (minigrad's CPU kernels still call one
#   numpy ufunc per op and block, so there the saving is the traffic, not the calls.)
# - **What stops it:** a value used by consumers that never meet again (it must be written out),
#   movement ops, random ops, side effects, values that a backward needs saved, shapes that do
#   not match the group's, and the cap on a group's size. Every boundary writes a full array to
#   memory and reads it back, so the fewer the boundaries, the more fusion saves.
