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
# # 04.5 Cutting the pipeline from the graph
#
# **Question:** lesson 04.4 cut the model into stages by hand, the same number of layers per
# rank. What if the layers do not cost the same?
#
# Under GPipe every stage works at the pace of the slowest one, so a cut by layer count can leave
# one rank doing almost everything. The traced graph knows every op, its shapes and the values
# that flow between ops: enough to estimate what each op costs and what a cut would send, and to
# choose the cut.
#
# **You will:** give every node of a traced model a cost, place the cuts with a dynamic program,
# draw the partitioned graph with its stages coloured, and compare the automatic cut with the hand
# cut, on paper (stage costs and bubble) and on two real ranks.
# **Time:** about 16 minutes (15 reading, 10 s running).

# %%
import json
from pathlib import Path

import graphviz
import matplotlib.pyplot as plt
import numpy as np

import minigrad
from minigrad import nn
from minigrad.distributed import gpipe_bubble, launch, split_sequential
from minigrad.graph import trace
from minigrad.graph.partition import node_costs, partition

minigrad.manual_seed(0)

# %% [markdown]
# ## A stack of unequal layers
# Two layers of 1024 x 1024 in a stack of small ones. `split_sequential` cuts by count:

# %%
net = nn.Sequential(nn.Linear(64, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024),
                    nn.ReLU(), nn.Linear(1024, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64),
                    nn.ReLU(), nn.Linear(64, 10))
for P in (2, 4):
    print(f"{P} stages by hand:", [len(stage) for stage in split_sequential(net, P)], "layers")

# %% [markdown]
# ## What each node costs
# `trace` records the forward at the micro-batch's shape (32 samples) as a graph (chapter 01).
# `node_costs` gives every op node a cost in seconds. Without an example input it *estimates*
# from the shapes: a product's multiply-adds (its output's size times the length it sums over) at
# a rough $2 \cdot 10^{10}$ flop/s, every other op the bytes it reads and writes at $5 \cdot 10^9$
# B/s. That estimate is the same on every machine, so this page uses it; given an example,
# `node_costs` times each node instead (further down). A stage's cost counts forward and backward,
# about three forwards, since the backward of a product is two products.

# %%
micro = minigrad.randn(32, 64)
traced = trace(net, micro)
costs = node_costs(traced.graph)
for node, seconds in costs.items():
    print(f"{node.name:>4} {node.op:7} {str(tuple(node.shape)):12} {seconds * 1e3:8.4f} ms")

# %% [markdown]
# The two 1024 x 1024 layers are 90% of the model. The hand cut into two stages (7 and 6 layers)
# puts both of them on rank 0.
#
# ## What a cut sends
# Between two stages flows every value computed before the cut and read after it (here, one
# activation of 32 x 1024 or 32 x 64 floats; with skip connections, more). Its bytes travel
# forward, and as a gradient backward, so a stage's cost is its compute plus the time of its
# messages. GPipe then runs at the pace of the slowest stage $t_{max}$: the pipeline fills and
# drains once and otherwise waits for the slowest stage, a step takes
#
# $$T = \sum_s t_s + (M - 1)\, t_{max},$$
#
# and stage s is idle for the fraction $1 - M t_s / T$ of it: with equal stages, $(P-1)/(M+P-1)$
# as in 04.4.
#
# ## Placing the cuts
# The op nodes that depend on the input, in topological order, form a line; a pipeline cuts it
# into P consecutive pieces. The best cut minimises the slowest piece. A dynamic program finds it
# exactly: `best[s][j]`, the slowest stage of the best split of the first j nodes into s stages, is
# the minimum over i of max(`best[s-1][i]`, cost of nodes i..j as one stage); ties go to fewer bytes
# sent. Nodes computed from parameters alone (a transposed weight) go with the stage that reads them.

# %%
def hand_cut(P):
    """split_sequential's layer counts as cut positions (each layer is one node here)."""
    return list(np.cumsum([len(stage) for stage in split_sequential(net, P)])[:-1])


M = 4
plans = {}
for P in (2, 4):
    plans[P] = {"hand": partition(traced, P, costs=costs, cuts=hand_cut(P)), "automatic": partition(traced, P, costs=costs)}
    for how, plan in plans[P].items():
        print(f"P = {P}, {how} cut at {plan.cuts}:")
        print(plan.report(M))

# %% [markdown]
# The report lists each stage's compute, the time of its messages and their bytes, then the bubble
# with M = 4 micro-batches and what equal stages would give. Side by side:

# %%
for P in (2, 4):
    for how, plan in plans[P].items():
        slowest = max(s.total_s for s in plan.stages)
        print(f"P = {P} {how:9}: slowest stage {slowest * 1e3:6.2f} ms, step {plan.step_time(M) * 1e3:6.2f} ms, "
              f"bubble {plan.bubble(M):.3f} (equal stages {gpipe_bubble(P, M):.3f})")
hand2, auto2 = plans[2]["hand"], plans[2]["automatic"]
print(f"two stages: the automatic cut's step is {hand2.step_time(M) / auto2.step_time(M):.2f}x faster than the hand cut's")

# %% [markdown]
# With two stages the automatic cut puts one big layer on each rank, and its bubble is close to
# equal stages'. With four stages no cut can balance them: each big layer is one node, so two
# stages hold one big layer each and the other two wait. The graph's granularity bounds the
# balance (splitting a product itself is tensor parallelism, 04.4).
#
# ## The partitioned graph
# `plan.to_dot()` draws the traced graph with each stage a dashed box in its own colour, parameters
# with the stage that reads them, and the edges that cross a cut in red: those become a send and a
# receive. Node names in the DOT text follow the topological order (`n0`, `n1`...), never
# `id()`, so the drawing is the same at every run. The hand cut, then the automatic one:

# %%
graphviz.Source(hand2.to_dot(rankdir="LR"))

# %%
graphviz.Source(auto2.to_dot(rankdir="LR"))

# %% [markdown]
# ## Values that pass through
# With a skip connection, more than one value crosses a cut, and a value read by a later stage
# must travel through the stages in between. `plan.live[s]` lists what stage s receives; here the
# input itself is read by the last layer:

# %%
class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.a, self.b, self.out = nn.Linear(8, 32), nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 8)

    def forward(self, x):
        h = self.inp(x).tanh()
        h = self.b(self.a(h).relu()) + h
        return self.out(h) + x


res_plan = partition(trace(Residual(), minigrad.randn(4, 8)), 3)
for s in range(1, res_plan.num_stages):
    print(f"stage {s} receives:", ", ".join(f"{n.name} ({n.op}, {tuple(n.shape)})" for n in res_plan.live[s]),
          f"= {res_plan.stages[s].recv_bytes} bytes")

# %% [markdown]
# `GraphStage` (what `plan.stage_module(s)` returns) runs a stage's nodes as a `Module`: it
# unpacks the values it receives from one flat tensor, applies each node's `Function` with
# autograd on, and packs what the later stages need into one flat tensor again, so
# `ScheduleGPipe` from 04.4 runs it unchanged.
#
# ## Measured: both cuts on two ranks
# `scripts/auto_pipeline.py` runs the model above on two ranks with M = 4 micro-batches of 32: once
# cut by hand, once with `auto_pipeline_stage`, where rank 0 *times* each node (`node_costs` with
# an example), broadcasts the times, and every rank computes the same plan from them. Both runs
# check every stage's gradients against one process's full-batch step:

# %%
job = launch(Path("scripts") / "auto_pipeline.py", nprocs=2, timeout=180)
assert job.returncode == 0, job.stderr
*lines, record = job.stdout.splitlines()
measured = json.loads(record.removeprefix("JSON "))
print("\n".join(lines))

# %% [markdown]
# The measured cut, step time and each rank's bubble (they change from run to run, with the load
# of the machine):

# %%
# NBVAL_IGNORE_OUTPUT
for how, r in measured.items():
    print(f"{how:9}: cut at {r['cuts']}, step {r['step_ms']:.1f} ms, bubble per rank "
          + ", ".join(f"{b:.2f}" for b in r["bubble"]))
ratio = measured["hand"]["step_ms"] / measured["automatic"]["step_ms"]
print(f"the automatic cut's step took {1 / ratio:.2f}x the hand cut's:", "faster" if ratio > 1 else "no faster")

# %%
def draw_schedule(ax, events, title):
    for s, stage in enumerate(events):
        for kind, i, start, end in stage:
            ax.broken_barh([(start, end - start)], (s - 0.4, 0.8), edgecolor="white",
                           facecolor="tab:blue" if kind == "F" else "tab:orange")
    ax.set_yticks(range(len(events)), [f"stage {s}" for s in range(len(events))])
    ax.set_ylim(len(events) - 0.5, -0.5)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("time (ms)")


fig, axes = plt.subplots(2, 1, figsize=(10, 3.6), sharex=True)
for ax, (how, r) in zip(axes, measured.items()):
    draw_schedule(ax, r["events"], f"{how} cut, measured (blue: forward, orange: backward)")
plt.tight_layout()
plt.show()

# %% [markdown]
# Cut by hand, rank 1 idles through most of the step while rank 0 computes both big layers; cut
# from the graph, the two ranks share the work. The measured cut may differ from the estimated one
# by a node or two: the measured times are what this machine does, the estimate a rough CPU.
# Sharing the work pays only when each rank has a core of its own: on a machine whose cores are
# busy with other jobs the two ranks wait for a free core, and the step may come out no faster
# (the line above says which happened in this run).
#
# ## Predict, then run
# 1. With the costs above, what is the automatic cut's bubble for M = 16 micro-batches, and the
#    hand cut's?
# 2. Three stages: where does the automatic cut go, and which stage is the slowest?

# %%
print("1.", {how: round(plan.bubble(16), 3) for how, plan in plans[2].items()})
three = partition(traced, 3, costs=costs)
print("2. cuts", three.cuts, "| slowest stage:", max(range(3), key=lambda s: three.stages[s].total_s))
