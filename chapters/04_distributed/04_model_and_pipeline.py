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
# # 04.4 Model and pipeline parallelism
#
# **Question:** data parallelism keeps a whole copy of the model on every rank. What if the model
# does not fit on one?
#
# Then the model itself is split. *Model (tensor) parallelism* splits one layer's weight across
# ranks, which then compute parts of the same matrix product. *Pipeline parallelism* gives each
# rank a few consecutive layers and passes the activations along; with one batch only one rank
# works at a time, so the batch is cut into micro-batches, and the idle time left over is the
# *bubble*.
#
# **You will:** split a linear layer by columns and by rows, cut a layer stack into pipeline
# stages, draw the GPipe schedule, and compare the measured bubble with $(P-1)/(M+P-1)$.
# **Time:** about 16 minutes (15 reading, 11 s running).

# %%
import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

import minigrad
from minigrad import nn
from minigrad.distributed import gpipe_bubble, launch, split_sequential

minigrad.manual_seed(0)
rng = np.random.default_rng(0)

# %% [markdown]
# ## Splitting one layer
# A linear layer computes $y = x W^\top + b$ with $W$ of shape (out, in). Its weight splits two
# ways across N ranks, shown here on N = 2 "ranks" in one process:
#
# - **column-parallel**: rank r holds a block of W's *rows* (output features) and computes that
#   block of y; concatenating the blocks (an all-gather) gives y;
# - **row-parallel**: rank r holds a block of W's *columns* (input features) and multiplies it with
#   the matching block of x; the partial products add up to y (an all-reduce).

# %%
x, W, b = rng.standard_normal((5, 8)), rng.standard_normal((16, 8)), rng.standard_normal(16)
y = x @ W.T + b
N = 2
col_blocks = [x @ W_r.T + b_r for W_r, b_r in zip(np.split(W, N, axis=0), np.split(b, N))]
print("column-parallel: concatenated blocks == y:", np.allclose(np.concatenate(col_blocks, axis=1), y))
row_partials = [x_r @ W_r.T for x_r, W_r in zip(np.split(x, N, axis=1), np.split(W, N, axis=1))]
print("row-parallel:    sum of partials + b  == y:", np.allclose(sum(row_partials) + b, y))

# %% [markdown]
# Megatron-LM chains the two in an MLP: the first layer column-parallel, so each rank holds a
# block of the hidden features (the activation function works element by element, so it needs no
# communication), the second row-parallel on exactly that block. One all-reduce in forward, one in
# backward, for the whole MLP. `ColumnParallelLinear` and `RowParallelLinear` do this on real
# ranks (their backward passes send the matching gradients). `scripts/parallel_model.py` checks
# them against the unsplit layers on two ranks, then runs the pipeline of the next sections:

# %%
job = launch(Path("scripts") / "parallel_model.py", nprocs=2, timeout=120)
assert job.returncode == 0, job.stderr
*lines, record = job.stdout.splitlines()
measured = json.loads(record.removeprefix("JSON "))
print("\n".join(line for line in lines if not line.startswith("M=")))

# %% [markdown]
# Model parallelism communicates inside every layer, activations rather than gradients, so it
# needs the fastest links: in practice the GPUs of one host.
#
# ## Splitting the layer stack: pipeline stages
# `split_sequential` cuts a `Sequential` into consecutive stages, one per rank:

# %%
net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                    nn.Linear(32, 10))
for P in (2, 4):
    print(f"{P} stages:", [" -> ".join(type(m).__name__ for m in stage) for stage in split_sequential(net, P)])

# %% [markdown]
# Stage s receives its input from stage s - 1 and sends its output to stage s + 1; in backward the
# gradients of those activations travel the other way. With one batch the stages wait for each
# other: stage 1 cannot start before stage 0 is done.
#
# ## The GPipe schedule
# GPipe cuts the batch into M micro-batches, runs all their forwards (F), then all their backwards
# (B), and accumulates the gradients of the M micro-batches before the optimizer step. Stage s runs
# F of micro-batch i as soon as stage s - 1 has finished it, so the stages work on different
# micro-batches at once. With P stages of equal cost, a forward taking $t_f$ and a backward $t_b$
# per micro-batch, stage s runs F of micro-batch i from $(i + s)\,t_f$ and B of micro-batch i from
# $(M + P - 1)\,t_f + (i + P - 1 - s)\,t_b$:

# %%
def gpipe_theory(P, M, t_f=1.0, t_b=2.0):
    """events[s]: (kind, micro-batch, start, end) of stage s under GPipe with equal stages."""
    return [[("F", i, (i + s) * t_f, (i + s + 1) * t_f) for i in range(M)]
            + [("B", i, (M + P - 1) * t_f + (i + P - 1 - s) * t_b, (M + P - 1) * t_f + (i + P - s) * t_b)
               for i in range(M)]
            for s in range(P)]


def draw_schedule(ax, events, title, unit=""):
    for s, stage in enumerate(events):
        for kind, i, start, end in stage:
            ax.broken_barh([(start, end - start)], (s - 0.4, 0.8), edgecolor="white",
                           facecolor="tab:blue" if kind == "F" else "tab:orange")
            ax.text((start + end) / 2, s, f"{kind}{i}", ha="center", va="center", color="white", fontsize=7)
    ax.set_yticks(range(len(events)), [f"stage {s}" for s in range(len(events))])
    ax.set_ylim(len(events) - 0.5, -0.5)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(f"time{unit}")


fig, axes = plt.subplots(1, 2, figsize=(13, 2.8), gridspec_kw={"width_ratios": [1, 1.4]})
for ax, M in zip(axes, (1, 4)):
    draw_schedule(ax, gpipe_theory(4, M), f"P = 4 stages, M = {M}: bubble {gpipe_bubble(4, M):.2f}",
                  " (t_f = 1, t_b = 2)")
plt.tight_layout()
plt.show()

# %% [markdown]
# Each stage is busy for $M(t_f + t_b)$ of a step that lasts $(M + P - 1)(t_f + t_b)$: the white
# triangles are the bubble, a fraction
#
# $$\text{bubble} = \frac{P - 1}{M + P - 1}$$
#
# of every stage's time (`gpipe_bubble(P, M)`). More micro-batches shrink it:

# %%
for P in (2, 4, 8):
    print(f"P = {P}: " + "  ".join(f"M={M}: {gpipe_bubble(P, M):.3f}" for M in (1, 2, 4, 8, 32)))

# %% [markdown]
# The price: every stage keeps the activations of all M micro-batches until their backward, and
# very small micro-batches use the hardware poorly. (The *1F1B* schedule interleaves forwards and
# backwards once the pipeline is full, with the same bubble but activations for at most P
# micro-batches in flight.)
#
# ## Measured: two stages on two ranks
# The script's model has, per stage, a linear layer, a tanh and a layer that takes a fixed time
# per sample (0.5 ms forward, 1 ms backward), so that both stages cost the same whatever else
# the machine does. It ran one GPipe step on a batch of 32 for M = 1, 2, 4 and 8; the gradients
# equal those of the unsplit model every time:

# %%
print("\n".join(line for line in lines if line.startswith("M=")))

# %% [markdown]
# `ScheduleGPipe` records when each stage computes (`.events`); the script gathered both stages'
# events. The measured schedules, drawn like the theory above (they change a little from run to
# run):

# %%
fig, axes = plt.subplots(1, 2, figsize=(13, 2.2), gridspec_kw={"width_ratios": [1, 1.4]})
for ax, M in zip(axes, ("1", "4")):
    draw_schedule(ax, measured["events"][M], f"measured, P = 2, M = {M}", " (ms)")
plt.tight_layout()
plt.show()

# %% [markdown]
# The measured bubble (the fraction of the step each stage spent not computing, averaged over the
# two stages) next to $(P-1)/(M+P-1)$:

# %%
# NBVAL_IGNORE_OUTPUT
Ms = [int(M) for M in measured["bubble"]]
for M in Ms:
    print(f"M = {M}: measured bubble {measured['bubble'][str(M)]:.3f}, theory {gpipe_bubble(2, M):.3f}")
bubble = [measured["bubble"][str(M)] for M in Ms]
margin = [b - gpipe_bubble(2, M) for b, M in zip(bubble, Ms)]
print("falls as M grows:", all(a > b for a, b in zip(bubble, bubble[1:])),
      "| above theory at every M:", all(m > 0 for m in margin),
      "| margin grows with M:", all(a < b for a, b in zip(margin, margin[1:])),
      "(margins " + ", ".join(f"{m:.3f}" for m in margin) + ")")

# %%
fig, ax = plt.subplots(figsize=(5.5, 3.3))
Mgrid = np.arange(1, 9)
ax.plot(Mgrid, [gpipe_bubble(2, M) for M in Mgrid], label="theory (P-1)/(M+P-1)")
ax.plot(Ms, [measured["bubble"][str(M)] for M in Ms], "o", label="measured")
ax.set(xlabel="micro-batches M", ylabel="bubble fraction", title="GPipe, P = 2 stages", ylim=(0, 0.6))
ax.legend()
ax.grid(alpha=0.3)
plt.tight_layout()
plt.show()

# %% [markdown]
# The formula's bubble falls as M grows; whether the measured one fell at every step in this run,
# stayed above the formula and drew away from it is printed above. It should stay above: each
# micro-batch also pays fixed costs the formula leaves out (sending activations and gradients,
# Python calls, a sleeping process waking up late), which count as idle time and weigh more as the
# micro-batches get smaller, so the margin tends to grow with M. On a busy machine, waiting for a
# free core adds a noise of its own to each figure (the gaps in the measured schedule above),
# enough to undo the fall between two neighbouring values of M.
#
# With a kernel, the slider runs the two-rank job again for the number of micro-batches you pick
# (a divisor of the batch of 32) and draws its schedule, its measured bubble beside the formula's.

# %%
# NBVAL_IGNORE_OUTPUT
from minigrad.examples.controls import control, pipeline_microbatches

control(lambda M: pipeline_microbatches(M, Path("scripts") / "parallel_model.py"), "micro-batches M",
        [1, 2, 4, 8, 16, 32], 4)

# %% [markdown]
#
# Large models combine all three kinds: tensor parallelism inside a host, pipeline stages across
# hosts, and data parallelism over copies of the whole pipeline ("3D parallelism").

# %% [markdown]
# ## Predict, then run
# 1. With P = 4 stages, how many micro-batches bring the bubble below 10%?
# 2. `split_sequential` of a 7-module `Sequential` into 3 stages: how many modules does each stage get?
# 3. Column-parallel on 4 ranks of a layer with 16 outputs: what shape is each rank's output block
#    for a batch of 5?

# %%
print("1. M =", next(M for M in range(1, 100) if gpipe_bubble(4, M) < 0.1), "(3 / (M + 3) < 0.1 needs M > 27)")
print("2.", [len(stage) for stage in split_sequential(net, 3)])
print("3.", [block.shape for block in (x @ W_r.T for W_r in np.split(W, 4, axis=0))])
