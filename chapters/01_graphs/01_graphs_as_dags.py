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
# # 01.1 Computational graphs are DAGs
#
# **Question:** when Python runs `e = (a + b) * (b + 1)` on tensors, what does minigrad remember,
# and in which order could that computation be replayed?
#
# A **computational graph** has two kinds of nodes, *variables* (tensors: inputs, weights,
# intermediate values) and *operations* (add, multiply, ...), and an edge wherever a value flows
# into an operation. Values are computed from values that already exist, so the edges never loop
# back: the graph is a **directed acyclic graph** (DAG).
#
# **You will:** record a graph by running code, draw it, read its in-edges and out-edges as
# adjacency lists, order it topologically, replay it in that order, and find the branches that
# could run in parallel.
# **Time:** about 14 minutes (13 reading, 2 s running).

# %%
import minigrad
from minigrad.autograd import consumers, topological_order
from minigrad.graph import draw, trace
from minigrad.graph.trace import run_node

# %% [markdown]
# ## Building a graph by running code
# There is no separate "define the graph" step: every operation on a tensor that requires a
# gradient records one node as it runs.

# %%
a = minigrad.tensor(2.0, requires_grad=True)
b = minigrad.tensor(1.0, requires_grad=True)
c = a + b
d = b + 1
e = c * d
print("e =", e)
print("e.grad_fn =", e.grad_fn)

# %% [markdown]
# ## Drawing it
# `minigrad.graph.draw` walks back from `e` and draws what was recorded: ellipses are variables
# (blue: leaves we created, green: the result), boxes are operations, edges carry the shape of the
# value that flows along them.

# %%
draw(e, names={"a": a, "b": b, "e": e})

# %% [markdown]
# Notice that `b` has two out-edges (it feeds both additions), and that the constant `1` is not a
# node: it is an argument of its `Add`, like a dimension or a shape.
#
# ## The graph as data: in-edges
# Each op node keeps its in-edges in `next_functions`: one `(node, output_index)` pair per input,
# pointing at the node that produced it (`None` for an input that needs no gradient, such as the
# `1`). A leaf's node is an `AccumulateGrad`, which will store the gradient in `.grad`.
# Numbering the nodes, we can print the whole graph as an **adjacency list**.

# %%
nodes = topological_order([e.grad_fn])
leaf_names = {id(a): "a", id(b): "b"}
made = {c.grad_fn: "c", d.grad_fn: "d", e.grad_fn: "e"}  # the op node that produced each value


def label(node):
    if hasattr(node, "variable"):  # an AccumulateGrad stands for a leaf tensor
        return f"leaf {leaf_names[id(node.variable)]}"
    return f"{made[node]}={node.name()}"


for node in nodes:
    ins = [label(edge[0]) if edge is not None else "None" for edge in node.next_functions]
    print(f"{label(node):8s} <- {ins}")

# %% [markdown]
# ## Out-edges
# The engine stores only in-edges, because backward travels from a node to its inputs. The
# out-edges (who *consumes* each value) are the same edges read the other way;
# `minigrad.autograd.consumers` inverts the lists.

# %%
for node, users in consumers([e.grad_fn]).items():
    print(f"{label(node):8s} -> {[label(u) for u in users]}")

# %% [markdown]
# `b` is consumed twice; `e`'s `Mul` by nobody (it is the output).
#
# ## Topological order
# A **topological order** lists the nodes so that every edge goes one way along the list.
# `minigrad.autograd.topological_order` puts each node *before* the nodes it reads from: the
# order backward needs (a node's gradient is complete once all its consumers have run). Read
# backwards, the same list is an order in which the forward pass can run.

# %%
print("backward order:", [label(n) for n in nodes])
print("forward order: ", [label(n) for n in reversed(nodes)])
position = {n: i for i, n in enumerate(nodes)}
print("every node before its inputs:",
      all(position[n] < position[edge[0]] for n in nodes for edge in n.next_functions if edge is not None))

# %% [markdown]
# A DAG always has a topological order (repeatedly take a node nothing else points to); a graph
# with a cycle has none, which is why the graph of a computation must be acyclic.
#
# ## The same graph as a static IR
# `minigrad.graph.trace` runs a function once and records it in a `Graph` of `Node`s with both
# kinds of edges stored: `node.inputs` (in-edges) and `node.users` (out-edges). Printed, it is an
# SSA listing: every value is assigned exactly once, in topological (forward) order.

# %%
def f(a, b):
    c = a + b
    d = b + 1
    return c * d


traced = trace(f, a, b)
graph = traced.graph
print(graph)

# %%
for node in graph.nodes:
    print(f"{node.name:7s} op={node.op:12s} inputs={[i.name for i in node.inputs]!s:16s} "
          f"users={[u.name for u in node.users]}")

# %%
draw(graph)

# %% [markdown]
# ## Why topological order *is* the execution order
# An interpreter for this graph is a loop: for each node, look up the values of its inputs, run
# its op, store the result. It works exactly when every node comes after its inputs.

# %%
def run(order, inputs):
    values = {}
    for node in order:
        missing = [i.name for i in node.inputs if i not in values]
        if missing:
            raise RuntimeError(f"{node.name} ({node.op}) needs {missing}, which have not run yet")
        if node.op == "placeholder":
            values[node] = inputs[node.name]
        elif node.op == "output":
            return values[node.inputs[0]]
        else:
            values[node], _ = run_node(node, [values[i] for i in node.inputs])


x = {"%a": minigrad.tensor(3.0).numpy(), "%b": minigrad.tensor(4.0).numpy()}
print("topological order:", run(graph.topological_order(), x), "  ((3 + 4) * (4 + 1) = 35)")
try:
    run(list(reversed(graph.topological_order())), x)
except RuntimeError as err:
    print("reversed order:   ", err)

# %% [markdown]
# ## Independent branches
# `c = a + b` and `d = b + 1` do not depend on each other: either could run first, or both at
# once. `Graph.levels()` groups the nodes by depth (a node sits one level below its deepest
# input), so no node depends on another of its own level: each level could run in parallel, and
# the number of levels is the length of the longest path, the **critical path**.

# %%
for depth, level in enumerate(graph.levels()):
    print(depth, [f"{n.name} {n.op}" for n in level])

# %% [markdown]
# A wider example: four independent functions of `x`, summed pairwise.

# %%
def wide(x):
    return (x.sin() + x.cos()) + (x.exp() + x * x)


wide_graph = trace(wide, minigrad.ones(3)).graph
levels = wide_graph.levels()
for depth, level in enumerate(levels):
    print(depth, [f"{n.name} {n.op}" for n in level])
print(f"{len(wide_graph)} nodes in {len(levels)} levels: at most "
      f"{max(len(level) for level in levels)} nodes could run at the same time")

# %%
draw(wide_graph, rankdir="LR")

# %% [markdown]
# Notice the shape of the picture: the wider a level, the more work could overlap; the number of
# levels bounds how fast the graph could run however many processors we had. Chapter 03 rewrites
# these graphs to make them cheaper, and chapter 04 spreads them over several devices.

# %% [markdown]
# ## Predict, then run
# 1. `y = x * x` for a tensor `x`: how many edges go from `x`'s node into the multiplication?
# 2. A chain `x.sin().cos().exp()` of three ops: how many levels does its traced graph have, and
#    what is the most nodes any level holds?
# 3. In the topological order of `wide`'s graph, must `sin` come before `exp`?

# %%
x_leaf = minigrad.tensor(2.0, requires_grad=True)
square = x_leaf * x_leaf
print("1. in-edges of Mul:", [type(fn).__name__ for fn, _ in square.grad_fn.next_functions],
      "(x enters twice, once per argument)")
chain = trace(lambda x: x.sin().cos().exp(), minigrad.ones(3)).graph
print("2.", len(chain.levels()), "levels, at most", max(len(level) for level in chain.levels()),
      "node per level: a chain has no parallelism")
ops = [n.op for n in wide_graph.topological_order()]
print("3. sin before exp in this order:", ops.index("Sin") < ops.index("Exp"),
      "but not necessarily: neither reads the other, so a valid order may put either first")
