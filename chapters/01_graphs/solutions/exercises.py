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
# # 01 Exercises: graphs, pipelines, checkpoints
#
# Each exercise is a code cell with a `raise NotImplementedError` where your code goes, followed by
# a check cell that compares your answer with minigrad's own implementation or with known values.
# Exercise 8 is "predict, then measure": write down your guess before you run anything, then let
# the measurement tell you how far off it was. Run the setup cell first; the exercises are independent of each other. See your score with
# `python -m minigrad.course grade chapters/01_graphs/exercises.ipynb`.

# %%
import itertools
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

import minigrad
from minigrad import nn, optim
from minigrad.autograd import consumers, topological_order
from minigrad.course import answer
from minigrad.data import DataLoader, Digits, Pipeline, TensorDataset, make_blobs
from minigrad.graph import trace

minigrad.manual_seed(0)


def example_loss():
    """A small graph with a shared value: h feeds three ops."""
    x = minigrad.randn(4, 3)
    W = minigrad.randn(3, 5, requires_grad=True)
    b = minigrad.zeros(5, requires_grad=True)
    h = (x @ W + b).tanh()
    return (h * h).sum() + h.mean()


def two_branches(x, w):
    h = x @ w
    return h.relu().sum() + h.sigmoid().mean() * h.abs().amax()


# %% [markdown]
# ## Exercise 1: count the nodes
# Write `count_nodes(t)`: the number of distinct nodes in the autograd graph of `t`, starting at
# `t.grad_fn` and following `node.next_functions` (pairs `(node, index)`, or `None`). Count
# `AccumulateGrad` nodes too. A node reached along two paths counts once.

# %% minigrad={"forbid": ["minigrad.autograd.engine.topological_order", "minigrad.autograd.engine.consumers"]}
# Exercise 1: Count the nodes of a graph
def count_nodes(t):
    """The number of distinct nodes reachable from t.grad_fn."""
    ### BEGIN SOLUTION
    seen, stack = {t.grad_fn}, [t.grad_fn]
    while stack:
        for edge in stack.pop().next_functions:
            if edge is not None and edge[0] not in seen:
                seen.add(edge[0])
                stack.append(edge[0])
    return len(seen)
    ### END SOLUTION


# %%
# Check 1
a = minigrad.tensor(2.0, requires_grad=True)
diamond = a * a
for _ in range(12):  # 4,096 paths from the top to `a`, but only 14 distinct nodes
    diamond = diamond + diamond
for t in (example_loss(), minigrad.tensor([1.0], requires_grad=True).exp(), diamond):
    expected = len(topological_order([t.grad_fn]))
    got = answer(count_nodes(t))
    assert got == expected, f"expected {expected} nodes, got {got}"
print("count_nodes agrees with minigrad.autograd.topological_order")

# %% [markdown]
# ## Exercise 2: out-edges
# The engine stores in-edges only. Write `out_edges(t)`: a dict mapping every node of `t`'s graph
# to the list of nodes that consume its output (once per edge: `a * a` consumes `a` twice). The
# output node maps to `[]`.

# %% minigrad={"forbid": ["minigrad.autograd.engine.consumers"]}
# Exercise 2: List the consumers of each node
def out_edges(t):
    """node -> list of the nodes that read its output, for every node reachable from t.grad_fn."""
    ### BEGIN SOLUTION
    users = {t.grad_fn: []}
    stack = [t.grad_fn]
    while stack:
        node = stack.pop()
        for edge in node.next_functions:
            if edge is None:
                continue
            if edge[0] not in users:
                users[edge[0]] = []
                stack.append(edge[0])
            users[edge[0]].append(node)
    return users
    ### END SOLUTION


# %%
# Check 2
for t in (example_loss(), minigrad.tensor(3.0, requires_grad=True) ** 2):
    # each node by its name and its consumers' names: what crosses from your code to the check
    expected = sorted((node.name(), sorted(u.name() for u in users)) for node, users in consumers([t.grad_fn]).items())
    got = answer(sorted((node.name(), sorted(u.name() for u in users)) for node, users in out_edges(t).items()))
    assert len(got) == len(expected), f"expected {len(expected)} nodes, got {len(got)}"
    for (node, users), (got_node, got_users) in zip(expected, got):
        assert (node, users) == (got_node, got_users), f"{node}: expected consumers {users}, got {got_node}: {got_users}"
print("out_edges agrees with minigrad.autograd.consumers")

# %% [markdown]
# ## Exercise 3: topological sort (Kahn's algorithm)
# Kahn's algorithm repeatedly takes a node that no remaining node points to. Write
# `kahn_order(t)` over the autograd graph: the output node first, and every node before the
# nodes it reads from (the order `minigrad.autograd.topological_order` gives, maybe with ties
# broken differently). Count, for each node, how many edges arrive at it from its consumers; start
# from the nodes with none.

# %% minigrad={"forbid": ["minigrad.autograd.engine.topological_order"]}
# Exercise 3: Topological sort with Kahn's algorithm
def kahn_order(t):
    """Every node reachable from t.grad_fn, each before the nodes in its next_functions."""
    ### BEGIN SOLUTION
    waiting = Counter()  # node -> number of consumer edges not yet processed
    stack, seen = [t.grad_fn], {t.grad_fn}
    while stack:
        for edge in stack.pop().next_functions:
            if edge is not None:
                waiting[edge[0]] += 1
                if edge[0] not in seen:
                    seen.add(edge[0])
                    stack.append(edge[0])
    ready, order = [t.grad_fn], []
    while ready:
        node = ready.pop()
        order.append(node)
        for edge in node.next_functions:
            if edge is not None:
                waiting[edge[0]] -= 1
                if waiting[edge[0]] == 0:
                    ready.append(edge[0])
    return order
    ### END SOLUTION


# %%
# Check 3
def order_as_data(order):
    """Each node of an order as (its name, the positions of its inputs in the order; -1 if absent)."""
    position = {node: i for i, node in enumerate(order)}
    return [(node.name(), [position.get(e[0], -1) for e in node.next_functions if e is not None]) for node in order]


for t in (minigrad.tensor(3.0, requires_grad=True) ** 2, example_loss()):
    expected = topological_order([t.grad_fn])
    got = answer(order_as_data(kahn_order(t)))
    assert len(got) == len(expected) and sorted(n for n, _ in got) == sorted(n.name() for n in expected), \
        f"expected the {len(expected)} nodes of the graph once each, got {len(got)} entries"
    for i, (name, inputs) in enumerate(got):
        for j in inputs:
            assert i < j, f"{name} (position {i}) must come before its input at position {j}" if j >= 0 else \
                f"{name} (position {i}) has an input missing from the order"
print("kahn_order is a topological order of the", len(got), "nodes")

# %%
# Hidden check 3
_chain = minigrad.tensor(1.5, requires_grad=True)
for _ in range(6):
    _chain = (_chain * _chain).tanh() + _chain
_order = answer(order_as_data(kahn_order(_chain)))
assert sorted(n for n, _ in _order) == sorted(n.name() for n in topological_order([_chain.grad_fn]))
assert all(i < j for i, (_, inputs) in enumerate(_order) for j in inputs)


# %% [markdown]
# ## Exercise 4: levels
# In a traced IR graph (`trace(fn, ...).graph`), a node's *level* is 0 if it has no inputs and
# otherwise one more than the deepest of its `node.inputs`. Nodes of one level do not depend on
# each other: they could run in parallel. Write `levels(graph)`: a list whose entry `k` is the
# list of nodes at level `k`. Visit nodes in `graph.topological_order()`.

# %% minigrad={"forbid": ["minigrad.graph.ir.Graph.levels"]}
# Exercise 4: Group a graph's nodes by level
def levels(graph):
    """[[nodes at level 0], [nodes at level 1], ...]"""
    ### BEGIN SOLUTION
    depth, groups = {}, []
    for node in graph.topological_order():
        d = 1 + max((depth[i] for i in node.inputs), default=-1)
        depth[node] = d
        if d == len(groups):
            groups.append([])
        groups[d].append(node)
    return groups
    ### END SOLUTION


# %%
# Check 4
graph = trace(two_branches, minigrad.randn(4, 3), minigrad.randn(3, 2)).graph
expected = [sorted(n.name for n in level) for level in graph.levels()]
got = answer([sorted(n.name for n in level) for level in levels(graph)])
assert got == expected, f"expected levels {expected}, got {got}"
print(len(got), "levels, widest:", max(map(len, got)), "nodes")

# %% [markdown]
# ## Exercise 5: the critical path
# However many processors run a graph, its longest chain of dependent nodes must run one after
# another. Write `critical_path(graph)`: a longest path of an IR graph as a list of nodes, from a
# node without inputs to `graph.output_node`. Hint: for each node in topological order, remember
# its deepest input.

# %% minigrad={"forbid": ["minigrad.graph.ir.Graph.levels"]}
# Exercise 5: Find the critical path
def critical_path(graph):
    """A longest chain source -> ... -> graph.output_node, as a list of nodes."""
    ### BEGIN SOLUTION
    depth, parent = {}, {}
    for node in graph.topological_order():
        deepest = max(node.inputs, key=lambda i: depth[i], default=None)
        depth[node] = 0 if deepest is None else depth[deepest] + 1
        parent[node] = deepest
    path, node = [], graph.output_node
    while node is not None:
        path.append(node)
        node = parent[node]
    return path[::-1]
    ### END SOLUTION


# %%
# Check 5
def lopsided(x):
    a = x.exp()
    return (x + a.sin().cos().tanh()) * (a + x)


for graph in (trace(two_branches, minigrad.randn(4, 3), minigrad.randn(3, 2)).graph,
              trace(lopsided, minigrad.randn(3)).graph):
    by_name = {node.name: node for node in graph.topological_order()}
    path = [by_name[name] for name in answer([node.name for node in critical_path(graph)])]
    assert len(path) == len(graph.levels()), f"expected a path of {len(graph.levels())} nodes, got {len(path)}"
    assert not path[0].inputs, f"the path should start at a node without inputs, not at {path[0].format()}"
    assert path[-1] is graph.output_node, f"the path should end at the output node, not at {path[-1].format()}"
    for before, after in zip(path, path[1:]):
        assert before in after.inputs, f"{after.name} does not read {before.name}: not a path"
    print(" -> ".join(f"{n.name} {n.op}" for n in path))

# %% [markdown]
# ## Exercise 6: a branch that survives tracing
# `leaky_scale` decides with a Python `if`, so a traced copy freezes the branch it saw. Write
# `leaky_scale_op(x)`, the same function written so that the choice is an op of the graph
# (`minigrad.where(condition, a, b)` picks `a` where the condition holds, `b` elsewhere;
# a 0-d condition picks for the whole tensor).

# %%
def leaky_scale(x):
    if x.mean() > 0:
        return x * 2
    return x * 0.1


# %%
# Exercise 6: Make a data-dependent branch traceable
def leaky_scale_op(x):
    """leaky_scale(x), with the branch inside the graph."""
    ### BEGIN SOLUTION
    return minigrad.where(x.mean() > 0, x * 2, x * 0.1)
    ### END SOLUTION


# %%
# Check 6
positive, negative = minigrad.tensor([1.0, 2.0, -0.5]), minigrad.tensor([-1.0, -2.0, 0.5])
for x in (positive, negative):
    expected, got = leaky_scale(x).numpy(), answer(trace(leaky_scale_op, positive)(x).numpy())
    assert np.allclose(got, expected), f"replay on {x.tolist()}: expected {expected.tolist()}, got {got.tolist()}"
print("the traced graph takes the right branch for both signs")

# %% [markdown]
# ## Exercise 7: a shuffle buffer
# Write the generator behind `Pipeline.shuffle`: keep a buffer of up to `buffer_size` elements;
# once it is full, for each new input emit a random element of the buffer (drawn with
# `rng.integers`) and put the new input in its place; when the input runs out, emit what is left
# in random order. It must work on an endless input, reading only as far as it needs.

# %% minigrad={"forbid": ["minigrad.data.input_pipeline._shuffle"]}
# Exercise 7: A shuffle buffer
def shuffle_buffer(iterable, buffer_size, rng):
    """Yield the elements of iterable in an order shuffled through a buffer of buffer_size."""
    ### BEGIN SOLUTION
    buffer = []
    for element in iterable:
        if len(buffer) < buffer_size:
            buffer.append(element)
            continue
        i = int(rng.integers(buffer_size))
        yield buffer[i]
        buffer[i] = element
    while buffer:
        yield buffer.pop(int(rng.integers(len(buffer))))
    ### END SOLUTION


# %%
# Check 7
rng = np.random.default_rng(0)
for size in (1, 7, 100, 500):
    out = answer(list(shuffle_buffer(range(100), size, rng)))
    assert sorted(out) == list(range(100)), f"buffer_size={size}: the output is not a permutation of range(100)"
    early = [(position, x) for position, x in enumerate(out) if position < x - size + 1]
    assert not early, f"buffer_size={size}: element {early[0][1]} came out at position {early[0][0]}, " \
                      "before it could have been read"
    if size == 1:
        assert out == list(range(100)), "buffer_size=1 should keep the order"
    else:
        assert out != list(range(100)), f"buffer_size={size} did not shuffle"
first = answer(list(itertools.islice(shuffle_buffer(itertools.count(), 5, rng), 10)))
assert len(set(first)) == 10 and max(first) < 15, f"on an endless input, got {first}"
reference = list(Pipeline.range(100).shuffle(7, seed=0))
print("a permutation, never early, lazy; Pipeline.shuffle(7) starts", reference[:8])

# %% [markdown]
# ## Exercise 8: predict, then measure how well a shuffle buffer mixes sorted data
# Lesson 01.3 showed that a small shuffle buffer only mixes neighbours. Files are often written in
# order, one class after another: here the 1,437 training digits sorted by label. **Predict
# first:** how many of the ten digits appear in the first batch of 32 with a buffer of 32, of 256,
# and of the whole data set? Write your guesses in `PREDICTED_LABELS`, then write
# `labels_in_first_batch(buffer_size, seed)`: run `(X8, Y8)` through a `Pipeline` that shuffles
# with that buffer and seed and batches by 32, and return how many distinct labels the first batch
# holds.

# %%
train8 = Digits(train=True)
order8 = np.argsort(train8.targets, kind="stable")
X8, Y8 = train8.data[order8], train8.targets[order8]  # all the 0s, then all the 1s, ...

# %%
# Exercise 8: Predict, then measure how well a shuffle buffer mixes sorted data
PREDICTED_LABELS = {32: None, 256: None, 1437: None}  # your guesses, before you measure


def labels_in_first_batch(buffer_size: int, seed: int = 0) -> int:
    ### BEGIN SOLUTION
    _, labels = next(iter(Pipeline.from_tensor_slices((X8, Y8)).shuffle(buffer_size, seed=seed).batch(32)))
    return len(np.unique(labels.numpy()))
    ### END SOLUTION


# %%
# Check 8
def first_labels(buffer_size, seed):
    return next(iter(Pipeline.from_tensor_slices((X8, Y8)).shuffle(buffer_size, seed=seed).batch(32)))[1].numpy()


predicted = answer(PREDICTED_LABELS)
for size in (1, 32, 256, 1437):
    got = answer(labels_in_first_batch(size))
    expected = len(set(first_labels(size, 0).tolist()))
    assert got == expected, f"buffer_size={size}: the first batch holds {expected} labels, got {got}"
    seen = sorted(set(first_labels(size, 0).tolist()))
    print(f"buffer {size:4d}: {got:2d} labels {seen} (you predicted {predicted.get(size)})")
assert answer(labels_in_first_batch(1)) == 1, "with a buffer of 1 nothing is shuffled: only 0s come first"
print("a buffer smaller than a class (about 144 images) keeps the first batch to the first class or two")

# %%
# Hidden check 8
for _seed in (1, 2):
    assert answer(labels_in_first_batch(256, _seed)) == len(set(first_labels(256, _seed).tolist()))

# %% [markdown]
# ## Exercise 9: checkpoint and resume
# `run_epoch` trains a softmax classifier on the blobs for one epoch, by SGD with momentum. Its
# gradient is written out by hand (chapter 02 builds the engine that finds it for you). Everything
# that carries over from one epoch to the next is in two dicts of tensors: `weights` (`"W"`, `"b"`)
# and the optimizer's `momentum` (one buffer per weight, same keys). Write
# `train(epochs, path, resume=False)`: run epochs `0 .. epochs-1` with `run_epoch`, saving after
# each epoch a checkpoint with keys `"epoch"` (the epoch just finished), `"weights"` and
# `"momentum"` to `path` with `minigrad.save`. With `resume=True`, first load `path` (`minigrad.load`)
# and continue after the saved epoch. A resumed run must end with exactly the weights of an
# uninterrupted one.

# %%
X, Y = make_blobs(n_samples=120, centers=3, seed=0)
blobs = TensorDataset(X.astype(np.float32), Y)
epochs_run = []


def make_state():
    """A softmax classifier's weights and its optimizer's momentum buffers, freshly initialised."""
    minigrad.manual_seed(0)
    weights = {"W": minigrad.randn(2, 3) * 0.1, "b": minigrad.zeros(3)}
    return weights, {name: minigrad.zeros_like(w) for name, w in weights.items()}


def run_epoch(weights, momentum, epoch, lr=0.1, beta=0.9):
    """One epoch of SGD with momentum on the cross-entropy; replaces the entries of both dicts."""
    epochs_run.append(epoch)
    for x, y in DataLoader(blobs, batch_size=16, shuffle=True, generator=epoch):
        p = (x @ weights["W"] + weights["b"]).softmax(-1)
        error = (p - minigrad.tensor(np.eye(3, dtype=np.float32)[y.numpy()])) / len(y)  # d loss / d logits
        for name, grad in (("W", x.T @ error), ("b", error.sum(0))):
            momentum[name] = beta * momentum[name] + grad
            weights[name] = weights[name] - lr * momentum[name]


# %%
# Exercise 9: Checkpoint and resume
def train(epochs, path, resume=False):
    """Train for `epochs` epochs, checkpointing to `path`; returns the weights."""
    weights, momentum = make_state()
    ### BEGIN SOLUTION
    start = 0
    if resume:
        checkpoint = minigrad.load(path)
        weights, momentum = checkpoint["weights"], checkpoint["momentum"]
        start = checkpoint["epoch"] + 1
    for epoch in range(start, epochs):
        run_epoch(weights, momentum, epoch)
        minigrad.save({"epoch": epoch, "weights": weights, "momentum": momentum}, path)
    ### END SOLUTION
    return weights


# %%
# Check 9
def as_arrays(weights):
    return {name: w.numpy() for name, w in weights.items()}


with tempfile.TemporaryDirectory() as scratch:
    straight = answer(as_arrays(train(4, Path(scratch) / "straight.ckpt")))
    epochs_run.clear()
    answer(len(train(2, Path(scratch) / "run.ckpt")))
    ran = answer(list(epochs_run))
    assert ran == [0, 1], f"train(2, ...) should run epochs [0, 1], ran {ran}"
    saved = answer({key: value for key, value in minigrad.load(Path(scratch) / "run.ckpt").items() if key == "epoch"})
    keys = answer(sorted(minigrad.load(Path(scratch) / "run.ckpt")))
    assert saved.get("epoch") == 1, f"after 2 epochs the checkpoint should say epoch 1, says {saved.get('epoch')}"
    assert "weights" in keys and "momentum" in keys, f"checkpoint keys: {keys}"
    epochs_run.clear()
    resumed = answer(as_arrays(train(4, Path(scratch) / "run.ckpt", resume=True)))
    ran = answer(list(epochs_run))
    assert ran == [2, 3], f"the resumed run should run epochs [2, 3], ran {ran}"
for name in straight:
    assert np.array_equal(straight[name], resumed[name]), f"{name} differs between the uninterrupted and the resumed run"
accuracy = float(((X @ straight["W"] + straight["b"]).argmax(-1) == Y).mean())
assert accuracy > 0.9, f"4 epochs should separate the blobs (accuracy above 90%), got {accuracy:.0%}"
print("the resumed run ends with exactly the uninterrupted run's weights; training accuracy above 90%")
