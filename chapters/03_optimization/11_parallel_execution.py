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
# # 03.11 The graph as a plan: parallel branches and ordering edges
#
# **Question:** a traced graph says which nodes do not depend on each other. Can an executor run
# them at the same time on two cores, and when does that pay? And if the executor is free to
# reorder, what stops it from reordering a write before a read?
#
# A graph is a *partial* order: it fixes only what its edges fix. The sequential executor of
# 03.1 picks one order; `Executor(graph, parallel=...)` (`minigrad/graph/parallel.py`) instead runs
# independent branches as soon as their inputs are ready, two at a time, on two threads. Python
# threads only run at once while numpy has let go of the GIL, so first we measure which ops do that.
#
# **You will:** measure which ops gain from a second thread; read the scheduler's cost model and its
# simulated schedule; draw a multi-head attention graph's schedule on two threads as a timeline,
# simulated and measured; see the model keep a graph of small ops sequential; then break a program
# by letting the executor reorder an in-place write, and fix it with an ordering edge, the same
# edge a CUDA event draws between two streams.
# **Time:** about 27 minutes (26 reading, 5 s running).

# %%
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # one BLAS thread: the second core is the executor's

import math
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import matplotlib.pyplot as plt
import numpy as np

import minigrad
from minigrad.graph import trace
from minigrad.graph.executor import Executor
from minigrad.graph.parallel import HANDOFF_SECONDS, MIN_HANDOFF_SECONDS, node_seconds
from minigrad.graph.passes import eliminate_common_subexpressions
from minigrad.graph.streams import plan_streams

minigrad.manual_seed(0)

# %% [markdown]
# ## 1. Measured first: which ops give up the GIL
# Two independent copies of one op, run one after the other, then with the first handed to a
# pool thread while this thread runs the second. If the op spends its time inside numpy's C code
# with the GIL released (a matrix product, a ufunc over a large array), the two overlap and the
# pair takes about half as long; if it is small, it is mostly Python, and the hand-off is pure cost.

# %%
# NBVAL_IGNORE_OUTPUT
rng = np.random.default_rng(0)
pool = ThreadPoolExecutor(1)


def pair(op, a, b, repeats=15):
    """Median seconds of op(a), op(b) one after the other, and on two threads."""
    def threaded():
        f = pool.submit(op, a)
        op(b)
        f.result()
    seq, par = [], []
    for _ in range(repeats):  # interleaved, so that load on the machine hits both alike
        t0 = time.perf_counter(); op(a), op(b); seq.append(time.perf_counter() - t0)
        t0 = time.perf_counter(); threaded(); par.append(time.perf_counter() - t0)
    return statistics.median(seq), statistics.median(par)


cases = {}
for n in (64, 256, 512):
    m = rng.standard_normal((n, n))
    cases[f"matmul {n}"] = pair(lambda x: x @ x, m, m.copy())
for n in (1_000, 1_000_000):
    v = rng.standard_normal(n)
    cases[f"exp {n:,}"] = pair(np.exp, v, v.copy())
tiny = rng.standard_normal(16)
cases["10 ops on 16"] = pair(lambda x: [x * 2.0 + 1.0 for _ in range(5)], tiny, tiny.copy())
for name, (seq, par) in cases.items():
    verdict = "pays" if seq / par > 1.05 else "does not pay"
    print(f"{name:14} one after the other {seq * 1e6:9.1f} us, two threads {par * 1e6:9.1f} us: "
          f"x{seq / par:.2f}, {verdict}")
paying = [name for name, (seq, par) in cases.items() if seq / par > 1.05]
small_loss = max(par / seq for name, (seq, par) in cases.items() if name in ("matmul 64", "exp 1,000", "10 ops on 16"))
print(f"pays here, now: {', '.join(paying) or 'nothing'}; the small ops' pairs take up to x{small_loss:.1f} longer "
      f"threaded. Load average {os.getloadavg()[0]:.2f}: on 2 cores, other work takes the second core away")

# %%
fig, ax = plt.subplots(figsize=(7, 2.6))
names = list(cases)
ax.barh(names, [s / p for s, p in cases.values()], color=["#74c476" if s / p > 1.05 else "#fc9272"
                                                         for s, p in cases.values()])
ax.axvline(1.0, color="k", lw=0.8)
ax.axvline(2.0, color="k", lw=0.8, ls=":")
ax.set_xlabel("speed-up of two threads over one (2 = perfect)")
ax.invert_yaxis()
plt.tight_layout()
plt.show()

# %% [markdown]
# Read the verdicts above with the load average beside them. Only a product or a ufunc big
# enough to outlast the hand-off can gain, and only when the second core is free; a small op
# loses (the last line says by how much here), since handing work to a thread and collecting it
# costs tens of microseconds (`HANDOFF_SECONDS` below), more than the op itself. So a scheduler has to know the sizes, and
# has to check what it gains: that is what its cost model and its trial are for.
#
# ## 2. The cost model and the ready set
# `node_seconds(node)` estimates a node's time from what the graph knows before anything runs:
# a fixed Python overhead, plus multiply-adds for a product or a conv, plus elements read and
# written for anything else. A node worth a thread is one above `MIN_HANDOFF_SECONDS`. Take
# multi-head self-attention with each head written as its own branch:

# %%
T, D, H = 256, 256, 4


def attention(x, *weights):
    """Self-attention with H heads as independent branches, summed through their output projections."""
    out = None
    for h in range(H):
        wq, wk, wv, wo = weights[4 * h:4 * h + 4]
        a = ((x @ wq) @ (x @ wk).T * (1 / math.sqrt(D // H))).softmax(-1)
        head = (a @ (x @ wv)) @ wo
        out = head if out is None else out + head
    return out


inputs = [minigrad.randn(T, D)] + [minigrad.randn(*s) * D ** -0.5 for _ in range(H)
                                   for s in ((D, D // H),) * 3 + ((D // H, D),)]
with minigrad.no_grad():
    graph = trace(attention, *inputs).graph
ops = [n for n in graph.topological_order() if n.op not in ("placeholder", "output")]
print(f"{len(ops)} ops in {len(graph.levels())} levels; the widest level holds "
      f"{max(len(level) for level in graph.levels())} nodes")
print(f"hand-off {HANDOFF_SECONDS * 1e6:.0f} us; a node is worth a thread from {MIN_HANDOFF_SECONDS * 1e6:.0f} us")
for n in ops[:7]:
    print(f"  {n.name:5} {n.op:9} {str(n.shape):11} model: {node_seconds(n) * 1e6:7.1f} us")

# %% [markdown]
# Handing single nodes to a thread would make the two threads meet (a lock, a wake-up) once per
# node, and each meeting costs about the hand-off, more than a small node's work. So the unit a
# thread takes is a *branch* (`branches`): a node whose value only one op reads joins that op's
# tree, so a head is the tree of its output projection (three products, a transpose, a scale, a
# softmax, two more products); walking down from the output, the first node with two or more
# inputs whose trees are worth a thread is a *fork* (here each `+` of the sum), and each of its
# inputs becomes a branch of its own. The scheduler keeps a *ready set* of branches whose inputs
# are all done; each thread, when free, takes the ready branch with the longest estimated path to
# the end first (what list schedulers do: start the critical path early), the helper only those
# the model finds worth a thread. `plan_parallel` plays that schedule through with the model's
# times before anything runs; when the simulated time is not clearly below the sequential one,
# the executor stays sequential.

# %%
ex = Executor(graph, parallel="auto")
print(ex.parallel_plan.report())
for task in [t for t in ex.parallel_plan.tasks if t[0].op != "placeholder"][:3]:
    print(f"  a branch of {len(task):2} nodes: {' '.join(n.op for n in task)}")

# %% [markdown]
# ## 3. The schedule as a timeline
# Left: the simulated schedule. Right: a real run on two threads (`run(..., timeline=True)`
# records each node's thread, start and end). Each bar is a node; products are dark. A head runs
# whole on one thread; the threads meet between heads, at the sums.

# %%
def draw_timeline(ax, slots, title):
    for s in slots:
        dark = s.node.op == "Matmul"
        ax.barh(s.thread, (s.end - s.start) * 1e3, left=s.start * 1e3, height=0.6,
                color="#6a51a3" if dark else "#bcbddc", edgecolor="white", linewidth=0.3)
    ax.set_yticks([0, 1], ["main thread", "helper"])
    ax.set_xlabel("ms")
    ax.set_title(title)
    ax.invert_yaxis()


ex = Executor(graph, parallel=True)  # the threaded run, whatever the trial would choose
for _ in range(3):
    ex.run(inputs)  # warm up
ex.run(inputs, timeline=True)
fig, axes = plt.subplots(1, 2, figsize=(11, 2.4))
draw_timeline(axes[0], ex.parallel_plan.simulated, "simulated (the cost model)")
draw_timeline(axes[1], ex.timeline, "measured, this run")
plt.tight_layout()
plt.show()

# %%
# NBVAL_IGNORE_OUTPUT
sequential, threaded = Executor(graph), Executor(graph, parallel=True)
np.testing.assert_allclose(threaded.run(inputs)[0], sequential.run(inputs)[0], rtol=1e-5, atol=1e-6)
times = {"sequential": [], "threaded": []}
for _ in range(15):
    for name, e in (("sequential", sequential), ("threaded", threaded)):
        t0 = time.perf_counter()
        e.run(inputs)
        times[name].append(time.perf_counter() - t0)
seq, par = (statistics.median(times[k]) for k in ("sequential", "threaded"))
print(f"sequential {seq * 1e3:.2f} ms, two threads {par * 1e3:.2f} ms: "
      f"{'faster' if par < seq else 'slower'} by x{max(seq, par) / min(seq, par):.2f} "
      f"(load average {os.getloadavg()[0]:.2f})")

# %% [markdown]
# The verdict printed above is this run's: the heads' products can only overlap when the second
# core is free, and when other work holds it the helper thread waits and the threaded run loses.
# That is why `parallel="auto"` does not trust the model alone: its first calls time both ways in
# turn and keep the faster (`measured_choice`), so turning it on costs no more than noise.
# `benchmarks/bench_parallel.py` prints the same comparison for an Inception-style block and two
# narrow graphs, beside PyTorch's `torch.jit.fork`.
#
# ## 4. Where it loses: small ops
# Four branches of elementwise ops on a 32x32 array: plenty of independence, nothing big. No
# branch comes near the hand-off's cost, so there is no fork worth cutting: the whole graph is one
# branch, nothing can run beside it, and the executor runs it one node after another, as fast as
# before.

# %%
def small(x):
    outs = [((x * 2.0 + 1.0).exp() - x.sin()) * x.cos() for _ in range(4)]
    return outs[0] + outs[1] + outs[2] + outs[3]


small_graph = trace(small, minigrad.randn(32, 32)).graph
small_ex = Executor(small_graph, parallel="auto")
print(small_ex.parallel_plan.report())
print("runs threaded:", small_ex.parallel)

# %% [markdown]
# ## 5. What the executor may reorder, and what an ordering edge prevents
# The graph promises only what its edges say. Here is a program with a write in place: a product
# reads `w`, and *after it in the program* `w += d` updates `w` (an optimizer step, a weight sync
# after an all-reduce). As a graph, the write is a `call` node reading `w` and `d`; nothing connects
# it to the product, which reads `w` through a long chain on its other input.

# %%
def forward(x, w, d):
    return x.tanh().tanh().tanh() @ w


def update(w, d):  # the side effect: w += d, in w's own memory
    w += d


def program(with_edge):
    g = trace(forward, *[minigrad.randn(4, 4) for _ in range(3)]).graph
    x, w, d = g.placeholders
    product = next(n for n in g if n.op == "Matmul")
    g.add_node("call", [w, d], {"fn": update}, name="%write", after=[product] if with_edge else ())
    return g


def check(graph, parallel):
    x, w, d = (minigrad.tensor(np.full((4, 4), v)) for v in (0.5, 1.0, 1.0))
    want = np.tanh(np.tanh(np.tanh(0.5))) * 4 * 1.0  # every entry of tanh^3(x) @ w with the old w = 1
    e = Executor(graph, parallel=parallel)
    got = e.run([x, w, d], timeline=True)[0]
    order = [s.node.name for s in sorted(e.timeline, key=lambda s: s.start) if s.node.op in ("Matmul", "call")]
    print(f"parallel={parallel!s:5}  ran {' then '.join(order):20}  y[0,0] = {got[0, 0]:.3f} "
          f"({'right' if np.isclose(got[0, 0], want) else 'WRONG: the product read the new w'})")


print(program(with_edge=False))
check(program(with_edge=False), parallel=False)
check(program(with_edge=False), parallel=True)

# %% [markdown]
# One after the other, the executor follows the program's order, and the product reads the old
# `w`. Threaded, the write is ready at once (it reads only inputs), while the product waits for
# its three `tanh`s; so the main thread runs the write first and the product reads the new `w`.
# Both orders are valid for this graph: the wrong result is the graph's fault, not the executor's.
# (`parallel=True` forces the threaded scheduler: the cost model alone would keep a 4x4 graph
# sequential, but a bigger graph, or a GPU stream, reorders the same way.)
#
# An *ordering edge* (`Node.after`, `Graph.add_ordering(first, then)`: TensorFlow's
# `tf.control_dependencies`) says "run after", without passing a value. Every order and every
# executor honours it:

# %%
fixed = program(with_edge=True)
print(fixed)
check(fixed, parallel=False)
check(fixed, parallel=True)

# %% [markdown]
# The passes honour it too. `w * 2` before the write and `w * 2` after it look like one common
# subexpression; with the second ordered after the write, CSE keeps them apart (without the edge
# it would merge them, which is right for a graph that promises nothing about the write). Dead
# code elimination keeps a `call` and the nodes it waits for; constant folding and fusion leave an
# ordered node where it is (`tests/graph/test_parallel.py` checks each pass).

# %%
g = trace(lambda w, d: (w * 2, w * 2), minigrad.randn(3), minigrad.randn(3)).graph
w, d = g.placeholders
first, second = [n for n in g if n.op == "Mul"]
write = g.add_node("call", [w, d], {"fn": update}, name="%write", after=[first])
g.add_ordering(write, second)
merged = eliminate_common_subexpressions(g)
print(merged)
before, after = Executor(merged).run([minigrad.ones(3), minigrad.ones(3)])
print("w * 2 before the write:", before, " after it:", after)

# %% [markdown]
# On a GPU the same question has the same answer. CuPy (and CUDA) run the kernels of one
# *stream* in order, and kernels of two streams in any order, overlapped; independent branches go
# on separate streams for exactly the reason they go on separate threads here. An edge between
# branches becomes an *event*: `e = cupy.cuda.Event(); e.record(stream_a); stream_b.wait_event(e)`
# makes everything later on `stream_b` wait for what `stream_a` had queued, the GPU's ordering
# edge. Forget it, and a kernel on `stream_b` reads a buffer before the write on `stream_a` lands,
# or (as above) after. On cuda, `Executor(graph, parallel=True)` queues the graph this way; its
# plan (`minigrad.graph.streams.plan_streams`) needs no GPU to read. For the attention graph: each
# node continues the stream of the input it extends, new branches go to the stream with less work,
# and every edge between streams becomes an event.

# %%
schedule = [n for n in graph.topological_order() if n.op != "output"]
streams = plan_streams(schedule, streams=2)
for s in range(2):
    on = [n for n in schedule if streams.stream_of.get(n) == s]
    print(f"stream {s}: {len(on)} nodes, {sum(n.op == 'Matmul' for n in on)} products")
print(f"{sum(len(w) for w in streams.waits.values())} events; the first three:")
for n, waits in list(streams.waits.items())[:3]:
    for p in waits:
        print(f"  record after {p.name} ({p.op}) on stream {streams.stream_of[p]}, "
              f"wait before {n.name} ({n.op}) on stream {streams.stream_of[n]}")
print(f"{len(streams.crossing)} values read across streams: kept to the end of the run")

# %% [markdown]
# The crossing values stay to the end because CuPy's pool gives a freed buffer to the next
# allocation on the stream that made it, and that allocation would not wait for the reader on
# the other stream.
#
# ## Summary
# - A graph is a partial order: nodes with no path between them may run in any order, or at once.
# - On a CPU, two threads pay only for ops that release the GIL long enough (big products, ufuncs
#   over large arrays); the cost model estimates that from node sizes, simulates the schedule,
#   and stays sequential where it does not pay; `parallel="auto"` then checks by timing.
# - The threads take whole branches (a head), so they meet once per branch, not once per node.
# - Buffers are freed by counting readers, so they go whenever their last reader finishes,
#   whichever thread ran it; running branches at once keeps more alive (`planned_parallel_peak`).
# - Side effects are not values: an in-place write needs an ordering edge after the reads of the
#   old value (a print, after what it reports), or a reordering executor is free to break it.
