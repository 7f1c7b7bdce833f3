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
# # 01.2 Dynamic graphs and static graphs
#
# **Question:** if the graph is recorded while Python runs, what happens to an `if` or a loop,
# and what do we gain or lose by recording the graph once and replaying it?
#
# minigrad, like PyTorch, builds a **dynamic** graph (define-by-run): a new graph on every call,
# shaped by whatever path Python took. A **static** graph (TensorFlow 1, `torch.jit.trace`,
# `jax.jit`) is built once and then executed many times, with no Python in the loop.
#
# **You will:** watch `if` and loops reshape the graph, trace a function into a static graph and
# replay it, find what tracing freezes, measure what a static graph saves by caching its
# execution order, and see how version counters catch in-place writes to saved values.
# **Time:** about 23 minutes (22 reading, 7 s running).

# %%
from collections import Counter

import time

import matplotlib.pyplot as plt
import numpy as np

import minigrad
from minigrad import nn, optim
from minigrad.autograd import topological_order
from minigrad.autograd.function import SAVED_OUTPUT, SAVED_TENSOR, saved_entries
from minigrad.graph import draw, trace

minigrad.manual_seed(0)

# %% [markdown]
# ## Python control flow shapes the graph
# A loop whose number of steps depends on the data: halve `x` until every entry is at most 1.

# %%
def halve_until_small(x):
    while x.abs().max() > 1:
        x = x / 2
    return x


for value in (3.0, 40.0):
    x = minigrad.tensor([value], requires_grad=True)
    y = halve_until_small(x)
    print(f"x = {value:4}: y = {y.item()}, graph of {len(topological_order([y.grad_fn]))} nodes")

# %%
x = minigrad.tensor([3.0], requires_grad=True)
draw(halve_until_small(x), rankdir="LR")

# %%
x = minigrad.tensor([40.0], requires_grad=True)
draw(halve_until_small(x), rankdir="LR")

# %% [markdown]
# Two inputs, two different graphs. The comparisons `x.abs().max() > 1` are not in them: they
# produced Python booleans for the `while`, not values that flow into `y`.
#
# ## An LSTM over sequences of different lengths
# A recurrent network is a Python loop over time steps (`minigrad/nn/rnn.py`): each step applies
# the same `LSTMCell` to the next input and the previous state. One step is this graph (orange:
# the cell's parameters; grey: the input `x` and the previous state `h`, `c`, which need no
# gradient here; `LSTMGates` takes the two products and computes the four gates i, f, g, o and
# the new state in one op):

# %%
cell = nn.LSTMCell(input_size=2, hidden_size=3)
h, c = cell(minigrad.randn(1, 2))
draw(h, names=dict(cell.named_parameters()))

# %% [markdown]
# A sequence of length `T` repeats it `T` times, so the graph grows with every sequence:

# %%
lstm = nn.LSTM(input_size=2, hidden_size=3)
for length in (2, 5):
    output, (h_n, c_n) = lstm(minigrad.randn(length, 1, 2))  # (time, batch, features)
    ops = Counter(node.name() for node in topological_order([output.grad_fn]))
    print(f"T = {length}: {sum(ops.values())} nodes, {dict(sorted(ops.items()))}")

# %%
lengths = list(range(1, 13))
sizes = [len(topological_order([lstm(minigrad.randn(t, 1, 2))[0].grad_fn])) for t in lengths]
fig, ax = plt.subplots(figsize=(5, 2.6))
ax.plot(lengths, sizes, "o-")
ax.set_xlabel("sequence length T")
ax.set_ylabel("nodes in the graph")
ax.set_title("An LSTM's graph is rebuilt for each sequence")
plt.tight_layout()
plt.show()

# %% [markdown]
# The count grows by the same number of nodes per time step: the loop is *unrolled* into the
# graph. A dynamic graph handles every length (and every batch of mixed lengths) with no extra
# code; backpropagation through time is just `backward()` on the unrolled graph.
#
# ## A static graph: trace once, replay
# `minigrad.graph.trace(fn, *example_inputs)` runs `fn` once, records every op into an IR
# `Graph`, and returns a function that replays the graph on new inputs: no Python control flow,
# no autograd bookkeeping, only the recorded ops in topological order.

# %%
def neuron(x, w):
    return (x @ w).tanh()


traced = trace(neuron, minigrad.randn(4, 3), minigrad.randn(3, 2))
print(traced.graph)

# %%
x, w = minigrad.randn(4, 3), minigrad.randn(3, 2)
print("replay equals eager:", np.array_equal(traced(x, w).numpy(), neuron(x, w).numpy()))

# %% [markdown]
# ## What tracing cannot capture
# The tracer sees ops, not Python. Tracing `halve_until_small` at `x = 40` records the six
# divisions that input needed, and the `while` disappears:

# %%
halve_traced = trace(halve_until_small, minigrad.tensor([40.0]))
print(halve_traced.graph)

# %% [markdown]
# The comparisons were recorded (`Abs`, `Amax`, `Greater`) but nothing uses their values: the
# decision was taken once, in Python, and frozen. A replay divides by 64 whatever the input:

# %%
for value in (50.0, 3.0):
    x = minigrad.tensor([value])
    print(f"x = {value}: eager {halve_until_small(x).item():.6f}   replay {halve_traced(x).item():.6f}")

# %% [markdown]
# Right for 50 (it also needs six halvings), silently wrong for 3. The same goes for every value
# Python reads out of a tensor (`if loss.item() > 1`, `range(int(n))`). Shapes are frozen too: an
# LSTM traced on sequences of length 5 refuses length 7.

# %%
lstm_traced = trace(lambda seq: lstm(seq)[0], minigrad.randn(5, 1, 2))
print(f"{len(lstm_traced.graph)} nodes for T = 5")
try:
    lstm_traced(minigrad.randn(7, 1, 2))
except minigrad.errors.ShapeError as err:
    print(f"{type(err).__name__}: {err}")

# %% [markdown]
# A branch survives tracing when it is written as an op instead of a Python `if`: `where` computes
# both sides and selects, so the choice is an edge of the graph.

# %%
def double_or_negate(x):
    if x.sum() > 0:           # Python decides, once
        return x * 2
    return -x


def double_or_negate_op(x):
    return minigrad.where(x.sum() > 0, x * 2, -x)   # the graph decides, every time


example, other = minigrad.tensor([1.0, 2.0]), minigrad.tensor([-1.0, -2.0])
for fn in (double_or_negate, double_or_negate_op):
    replay = trace(fn, example)
    print(f"{fn.__name__:20s} eager {fn(other).tolist()}  replay {replay(other).tolist()}")

# %% [markdown]
# Loops with a data-dependent trip count need more than `where`: static frameworks add control
# flow ops (`tf.while_loop`, `jax.lax.while_loop`) whose body is a graph of its own.
#
# ## A whole training step as one static graph
# Because minigrad's backward is written with minigrad ops, tracing a training step records the
# forward pass, the backward pass and the optimizer update: the updates are `copy_` nodes that
# write into the parameters, the new gradients `set_grad` nodes. (One eager step first, so that
# every piece of optimizer state already exists.)

# %%
model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
optimizer = optim.SGD(model.parameters(), lr=0.1)


def train_step(x, target):
    optimizer.zero_grad()
    loss = ((model(x) - target) ** 2).mean()
    loss.backward()
    optimizer.step()
    return loss


x, target = minigrad.randn(16, 4), minigrad.randn(16, 1)
train_step(x, target)
step_traced = trace(train_step, x, target)
print(step_traced.graph)

# %% [markdown]
# Replaying it trains the same model as running it eagerly, step for step:

# %%
start = {k: v.clone() for k, v in model.state_dict().items()}
eager = [train_step(x, target).item() for _ in range(5)]
model.load_state_dict(start)
replayed = [step_traced(x, target).item() for _ in range(5)]
print("eager losses: ", [round(v, 3) for v in eager])
print("replay losses:", [round(v, 3) for v in replayed])
print("identical:", eager == replayed)

# %% [markdown]
# **The trade-off.** Dynamic graphs follow Python anywhere (variable lengths, data-dependent
# branches, debugging with `print`) but pay Python's cost at every op and see one op at a time.
# A static graph is frozen at trace time (shapes, branches, loop counts), but it is a complete
# program that can be inspected, optimised and run without Python: chapter 03 fuses and prunes
# exactly these traced graphs.

# %% [markdown]
# ## What the static graph saves: the order, computed once
# Every `backward` on a dynamic graph must first sort the graph it is given (a depth-first search
# over all its nodes), because the graph is new at every call. A `graph.ir.Graph` sorts once:
# `topological_order()` caches the order, and any change to the graph (adding, erasing or
# rewiring a node) drops the cache, so a pass that rewrites the graph gets a fresh order next time.
# We time the three cases on the graph of a 100-layer MLP (about 400 nodes).

# %%
deep = nn.Sequential(*[layer for _ in range(100) for layer in (nn.Linear(8, 8), nn.Tanh())])
probe = minigrad.randn(4, 8)
deep_graph = trace(deep, probe).graph


def microseconds(fn, repeat=200):
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return 1e6 * (time.perf_counter() - start) / repeat


def mutate_then_sort():
    node = deep_graph.add_node("constant", attrs={"value": np.zeros(1)})  # any change drops the cache
    deep_graph.erase(node)
    return deep_graph.topological_order()


loss_fn = deep(probe).sum().grad_fn
costs = {"autograd graph:\nsorted at every backward": microseconds(lambda: topological_order([loss_fn])),
         "graph.ir after a change:\nsorted again": microseconds(mutate_then_sort),
         "graph.ir unchanged:\ncached": microseconds(deep_graph.topological_order)}
print(len(deep_graph), "nodes in the traced graph;", len(topological_order([loss_fn])), "in the autograd graph")

# %%
# NBVAL_IGNORE_OUTPUT
for name, us in costs.items():
    print(f"{name.replace(chr(10), ' '):45s} {us:8.1f} µs per call")

# %%
fig, ax = plt.subplots(figsize=(6.5, 2.6))
ax.barh(range(3), list(costs.values()), color=["tab:gray", "tab:orange", "tab:green"])
ax.set_yticks(range(3), list(costs))
ax.invert_yaxis()
ax.set_xscale("log")
ax.set_xlabel("microseconds per topological order (log scale)")
plt.tight_layout()
plt.show()

# %% [markdown]
# Sorting the IR (Kahn's algorithm with a heap, so that ties keep insertion order and the order is
# the same on every run) is slower than the engine's depth-first search; cached, the order costs a
# list copy, hundreds of times less than either. A static graph is replayed thousands of times and
# asked for its order by every pass of chapter 03, so it sorts once; the eager engine cannot cache,
# since the next step's graph is a new object.
#
# ## Versions: the graph's saved values must not change
# A graph node keeps some of its inputs or outputs for backward (`sigmoid` keeps its output). If
# Python then changes that tensor in place, backward would use the wrong numbers. Copying every
# saved tensor would be safe but costs memory and time at every op; instead, every tensor carries
# a **version counter** that each in-place op bumps, the node records the version it saved, and
# backward compares the two: one integer comparison per saved tensor.

# %%
w = minigrad.randn(3, requires_grad=True)
s_out = w.sigmoid()
print("version when saved:", s_out._version)
s_out.mul_(2)  # changes the saved output in place
print("version now:       ", s_out._version)
try:
    s_out.sum().backward()
except Exception as err:
    print(type(err).__name__ + ":", err)

# %% [markdown]
# What the counters save, for the 100-layer MLP above at batch 256: the tensors its nodes keep for
# backward, which defensive copies would duplicate at every step.

# %%
big_batch = minigrad.randn(256, 8)
saved_bytes = 0
h = big_batch
for layer in deep:
    saved_bytes += h.nbytes  # Linear keeps its input, Tanh its output: one activation each
    h = layer(h)
# One comparison per tensor a node keeps (a Linear its input and weight, a Tanh its output): count
# them on the graph, walking the in-edges from the output.
compared, seen, todo = 0, set(), [h.grad_fn]
while todo:
    fn = todo.pop()
    if id(fn) not in seen:
        seen.add(id(fn))
        compared += sum(kind in (SAVED_TENSOR, SAVED_OUTPUT) for kind, _ in saved_entries(fn))
        todo += [edge[0] for edge in fn.next_functions if edge is not None]
print(f"defensive copies would add {saved_bytes / 1024:.0f} KiB per forward; the versions cost "
      f"{compared} integer comparisons")

# %% [markdown]
# ## Predict, then run
# 1. After a node is added and erased again, is the recomputed order the same list as the cached one?
# 2. The traced 100-layer MLP (100 `Linear`, 100 `Tanh`): how many nodes of each op does its graph have?
# 3. After `t.add_(1)` twice and `t.zero_()`, what is `t._version` of a fresh tensor?

# %%
cached = deep_graph.topological_order()
print("1. same order after a change:", mutate_then_sort() == cached, "(ties go to the earlier-added node)")
print("2.", dict(Counter(node.op for node in deep_graph)), "(weight and bias are parameter nodes)")
t = minigrad.zeros(3)
t.add_(1)
t.add_(1)
t.zero_()
print("3. version:", t._version)
