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
# # 03.2 Memory: where activations go, and gradient checkpointing
#
# **You will learn:** to measure what a training step keeps alive with the memory tracker; why
# activations, not parameters, fill memory; how gradient checkpointing trades recomputation for
# memory; how a planner picks what to keep for a given memory budget; and how far the rule of thumb
# "checkpointing saves about 75% of memory for about 30% more compute" holds.
# **Time:** about 32 minutes (31 reading, 10 s running).
#
# **Question:** a deep network runs out of memory long before its parameters fill it. What takes
# the memory during training, and how can we buy some of it back with computation?
#
# Backward needs values from the forward pass (a `Linear` needs its input to compute its weight's
# gradient, `tanh` needs its output), so the graph keeps them until backward has used them. Those
# *activations* grow with the batch and the depth; the parameters do not. Gradient checkpointing
# keeps only a few of them and recomputes the rest during backward.

# %%
import os

# One BLAS thread, so that the timings below are not disturbed by threads competing for the
# cores (set before numpy is imported).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import gc
import time

import matplotlib.pyplot as plt
import numpy as np

import minigrad
from minigrad import memory, nn

# %% [markdown]
# ## 1. The memory tracker
# `minigrad.memory.track()` counts the bytes of tensor data alive while its block runs: `current`
# now, `peak` at the worst moment, `start` on entry. It counts a buffer once, however many
# tensors share it, and takes it off when the buffer is freed:

# %%
with memory.track() as mem:
    a = minigrad.randn(256, 256)  # 256 * 256 float32 = 262,144 bytes
    print("after randn:  ", mem.current - mem.start)
    b = a.reshape(-1)  # a view of a's buffer: nothing new
    print("after reshape:", mem.current - mem.start)
    c = a * 2
    print("after a * 2:  ", mem.current - mem.start)
    del c
    print("after del c:  ", mem.current - mem.start, "  peak:", mem.peak - mem.start)
del a, b

# %% [markdown]
# The counts are bytes of tensor data, exact and the same on every run, so this notebook prints
# them.
#
# ## 2. Where activation memory goes
# An MLP of `Linear` + `tanh` blocks on a batch of 500 inputs. We run its layers one at a time
# inside the tracker and note how many bytes each one leaves alive:

# %%
minigrad.manual_seed(0)
WIDTHS = [64, 512, 512, 256, 128]
blocks = [nn.Sequential(nn.Linear(a, b), nn.Tanh()) for a, b in zip(WIDTHS, WIDTHS[1:])]
model = nn.Sequential(*blocks, nn.Linear(WIDTHS[-1], 10))
x = minigrad.randn(500, 64)

gc.collect()
with memory.track() as mem:
    h = x
    for i, block in enumerate(model):
        for layer in block if isinstance(block, nn.Sequential) else [block]:
            before = mem.current
            h = layer(h)
            print(f"block {i} {type(layer).__name__:7s} {tuple(h.shape)!s:11s} +{mem.current - before:>9,} bytes")
    print(f"kept by the graph after forward: {mem.current - mem.start:,} bytes")

# %% [markdown]
# Each `Linear` adds its output (500 rows of floats) and each `tanh` adds nothing: it makes an
# output of the same size, but the `Linear` output it read is freed at once, since nothing needs it
# any more ($\tanh' = 1 - \tanh^2$ is computed from the output, and the next `Linear` saves that
# output as its input). So each block keeps $\text{batch} \times \text{width} \times 4$ bytes, and
# `summary()` shows who holds what right now:

# %%
memory.summary(top=6)

# %% [markdown]
# Per block, against the parameters' bytes, and the whole model's activations for other batch
# sizes:

# %%
def activation_bytes_per_block(batch: int) -> list[int]:
    inputs = minigrad.randn(batch, 64)
    gc.collect()
    kept = []
    with memory.track() as mem:
        h = inputs
        for block in model:
            before = mem.current
            h = block(h)
            kept.append(mem.current - before)
    return kept


per_block = activation_bytes_per_block(500)
param_bytes = [sum(p.numel() * 4 for p in block.parameters()) for block in model]
names = [f"{WIDTHS[i]}->{WIDTHS[i + 1]}" for i in range(len(blocks))] + [f"{WIDTHS[-1]}->10"]
batches = [32, 64, 128, 256, 512, 1024]
totals = [sum(activation_bytes_per_block(b)) for b in batches]

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.3))
pos = np.arange(len(names))
ax1.bar(pos - 0.2, np.array(per_block) / 1e6, 0.4, label="activations kept (batch 500)")
ax1.bar(pos + 0.2, np.array(param_bytes) / 1e6, 0.4, label="parameters")
ax1.set_xticks(pos, names)
ax1.set_xlabel("block (Linear in -> out)")
ax1.set_ylabel("MB")
ax1.legend()
ax2.plot(batches, np.array(totals) / 1e6, "o-", label="activations kept")
ax2.axhline(sum(param_bytes) / 1e6, color="tab:orange", label="parameters")
ax2.set_xlabel("batch size")
ax2.set_ylabel("MB")
ax2.legend()
plt.tight_layout()
plt.show()
print("activations per block, batch 500:", per_block)
print("parameter bytes per block:       ", param_bytes)

# %% [markdown]
# The first block holds almost eight times its parameters' bytes, and the total grows in
# proportion to the batch: past a batch of about 300, this model's activations outweigh its
# parameters. With
# depth they grow the same way, one block's worth per block.
#
# The tracker counts more than tensors: some ops keep a bare array for backward, such as ReLU's
# boolean mask (1 byte per element) or the convolution's unfolded input (im2col). Those count too,
# and `snapshot()`/`summary()` list them as "(saved)":

# %%
relu_block = nn.Sequential(nn.Linear(64, 256), nn.ReLU())
with memory.track() as mem:
    out = relu_block(x)
print("tracked:", mem.current - mem.start, "bytes")
for live in memory.snapshot():
    if live.op.startswith("Relu"):
        print(live)
del out, h

# %% [markdown]
# ## 3. Memory during a training step
# Forward piles activations up; backward uses them in reverse order and frees each once its
# gradient has gone through. We sample the tracker's `activations` (bytes of tensors the forward
# computation made) after every block's forward and whenever a block's output receives its
# gradient, on a deeper model: 16 blocks of `Linear(256, 256)` + `tanh`, batch 128.

# %%
minigrad.manual_seed(0)
N_BLOCKS = 16
deep = nn.Sequential(*[nn.Sequential(nn.Linear(256, 256), nn.Tanh()) for _ in range(N_BLOCKS)])
xd = minigrad.randn(128, 256)
samples: list[int] = []
block_calls = [0]
tracker = None


def watch(module, inputs, output):
    block_calls[0] += 1
    samples.append(tracker.activations)
    if output.requires_grad:
        output.register_hook(lambda grad: samples.append(tracker.activations))


for block in deep:
    block.register_forward_hook(watch)


def step(segments: int | memory.Plan | None) -> None:
    """Forward, a mean-square loss, backward; with checkpoint_sequential when segments is a number,
    and by a plan (section 6) when it is one."""
    deep.zero_grad()
    if isinstance(segments, memory.Plan):
        out = segments(xd)
    else:
        out = deep(xd) if segments is None else memory.checkpoint_sequential(deep, segments, xd)
    (out * out).mean().backward()


def measure(segments: int | None) -> dict:
    global tracker
    deep.zero_grad()
    gc.collect()
    samples.clear()
    block_calls[0] = 0
    with memory.track() as tracker:
        step(segments)
    return {"peak": tracker.activation_peak, "calls": block_calls[0], "timeline": list(samples),
            "grads": [p.grad.numpy().copy() for p in deep.parameters()]}


plain = measure(None)
fig, ax = plt.subplots(figsize=(7, 3))
ax.step(range(len(plain["timeline"])), np.array(plain["timeline"]) / 1e6, where="post")
ax.axvline(N_BLOCKS - 0.5, color="gray", linestyle=":")
ax.text(N_BLOCKS / 2, 0.1, "forward", ha="center")
ax.text(1.5 * N_BLOCKS, 0.1, "backward", ha="center")
ax.set_xlabel("event (a block's forward, or its gradient arriving)")
ax.set_ylabel("activations alive (MB)")
plt.tight_layout()
plt.show()
print(f"activation peak: {plain['peak']:,} bytes = {plain['peak'] / (128 * 256 * 4):.2f} blocks' outputs")

# %% [markdown]
# The peak comes at the turn from forward to backward, when every block's output is alive at once
# (plus the loss's square): 17 outputs of 131,072 bytes.
#
# ## 4. Gradient checkpointing
# `memory.checkpoint(fn, *args)` runs `fn` and keeps only its inputs; in backward it runs `fn`
# again, this time recording the graph, and backpropagates through that. The gradients are the
# same, bit for bit; the price is a second forward pass of the segment:

# %%
block = deep[0]
xs = minigrad.randn(4, 256, requires_grad=True)
block_calls[0] = 0
memory.checkpoint(block, xs).sum().backward()
checkpointed = xs.grad.numpy().copy()
print("block forward calls with checkpointing:", block_calls[0])
xs.grad = None
block_calls[0] = 0
block(xs).sum().backward()
print("block forward calls without:           ", block_calls[0])
print("same input gradient:", np.array_equal(checkpointed, xs.grad.numpy()))

# %% [markdown]
# `checkpoint_sequential(model, segments, x)` cuts a sequence of layers into `segments` pieces and
# checkpoints every piece but the last (its activations are needed right away by backward, so
# recomputing them would buy nothing). After the forward pass only the segment boundaries and the
# last segment's activations are alive; backward recomputes one segment at a time. With $n$
# blocks and $s$ segments the peak is about $s + n/s$ block outputs instead of $n$, smallest at
# $s = \sqrt{n}$, and the recomputation costs $n - n/s$ extra block evaluations.

# %%
results = {s: measure(s) for s in (None, 2, 4, 8, 16)}
print(f"{'segments':>8} {'activation peak':>16} {'':6} {'block forwards':>15}  same gradients")
for s, r in results.items():
    same = all(np.array_equal(a, b) for a, b in zip(r["grads"], plain["grads"]))
    print(f"{s or 'none':>8} {r['peak']:>16,} {r['peak'] / plain['peak']:5.2f}x {r['calls']:>15}  {same}")

# %% [markdown]
# Exact numbers, since both are counted. Step times are measured (5 steps each) and only plotted:

# %%
def ms_per_step(segments: int | None, n: int = 5) -> float:
    step(segments)
    start = time.perf_counter()
    for _ in range(n):
        step(segments)
    return (time.perf_counter() - start) / n * 1e3


times = {s: ms_per_step(s) for s in results}
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.4))
for s in (None, 4):
    t = np.array(results[s]["timeline"]) / 1e6
    ax1.step(range(len(t)), t, where="post", label="no checkpointing" if s is None else f"{s} segments")
ax1.set_xlabel("event (a block's forward, or its gradient arriving)")
ax1.set_ylabel("activations alive (MB)")
ax1.legend()
ax1.set_title("One step, 16 blocks")
peaks = np.array([r["peak"] for r in results.values()]) / plain["peak"]
evals = np.array([r["calls"] for r in results.values()]) / N_BLOCKS
slow = np.array(list(times.values())) / times[None]
ax2.plot(evals, peaks, "o-", label="activation peak (counted)")
ax2.plot(evals, slow, "s--", label="step time (measured)")
for s, px, py in zip(results, evals, peaks):
    ax2.annotate(f"s={s or 'none'}", (px, py), textcoords="offset points", xytext=(4, 6), fontsize=8)
ax2.set_xlabel("block forward evaluations per step / 16")
ax2.set_ylabel("relative to no checkpointing")
ax2.set_title("Memory against recomputation")
ax2.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# On the left, the checkpointed step never holds more than a few blocks' outputs: during
# backward each segment is recomputed (the small climbs) and consumed again. On the right, the
# peak falls to about half with $s = 4 = \sqrt{16}$ and rises again on both sides: with few
# segments each recomputed segment is long, with many the boundaries themselves add up. The
# forward work grows towards twice the original, and the step time with it; how much depends on
# how much of the step is backward (about two forward passes' worth for a `Linear`) and on the
# machine, so the measured curve moves from run to run. `benchmarks/bench_memory.py` measures a
# 32-block MLP of width 1024 and a deep CNN the same way.
#
# With a kernel, the slider re-runs one step with the number of segments you pick and redraws its
# timeline beside the plain step's, with the counted peak and the extra forwards in the title.

# %%
# NBVAL_IGNORE_OUTPUT
from minigrad.examples.controls import checkpoint_segments, control

control(checkpoint_segments, "segments", list(range(1, N_BLOCKS + 1)), 4)

# %% [markdown]
#
# ## 5. Randomness and state inside a checkpoint
# A segment with dropout draws new random masks each time it runs, so a plain recomputation would
# differ from the forward pass. `checkpoint` saves the random state at forward and restores it for
# the recomputation (`preserve_rng_state=True`), so the masks and the gradients are the same:

# %%
noisy = nn.Sequential(nn.Linear(256, 256), nn.Dropout(0.5), nn.Tanh())
grads = []
for use_checkpoint in (False, True):
    minigrad.manual_seed(1)
    inputs = minigrad.randn(8, 256, requires_grad=True)
    out = memory.checkpoint(noisy, inputs) if use_checkpoint else noisy(inputs)
    out.sum().backward()
    grads.append(inputs.grad.numpy())
print("same gradient with dropout inside the checkpoint:", np.array_equal(*grads))

# %% [markdown]
# BatchNorm is the other trap: recomputing it in training mode would update its running
# statistics twice. minigrad restores the buffers of the modules a checkpoint runs after the
# recomputation, so a checkpointed step updates them once.
#
# ## 6. Checkpointing to a memory budget
# Equal segments ignore what layers cost. `memory.plan(model, x, budget)` is given a budget instead
# (bytes, or a fraction of the chain's all-kept peak) and chooses what to keep and what to recompute. It
# measures each layer alone with the tracker (what it keeps, its peak, its output) and, by
# dynamic programming over the chain (Chen et al. 2016; Griewank's *revolve*), finds the plan
# with the least recomputation whose peak fits. A recomputed range may recompute inside itself
# again, which is how a small budget is met at all. Here the costs of time are FLOPs (a `Linear`
# of width 256 on 128 rows; `tanh` about one operation per element), so that the plan does not
# depend on this machine's timing noise. The budgets are fractions of the whole step's peak, less
# what the loss's own tensors take:

# %%
layers = memory.planner.layers_of(deep)
costs = [c._replace(time=2 * 128 * 256 * 256 if isinstance(layer, nn.Linear) else 128 * 256)
         for c, layer in zip(memory.planner.measure(layers, xd), layers)]
forward_flops = sum(c.time for c in costs)
loss_bytes = plain["peak"] - memory.planner.kept_peak(costs)
linear_calls = [0]  # a plan runs the layers, not the blocks: count the Linear forwards instead
for block in deep:  # before planning: backward recomputes a hooked Linear, and the planner counts it so
    block[0].register_forward_hook(lambda *args: linear_calls.__setitem__(0, linear_calls[0] + 1))
plans = {f: memory.plan(deep, xd, int(f * plain["peak"]) - loss_bytes, costs) for f in (0.5, 0.4)}


def measure_plan(p: memory.Plan) -> dict:
    linear_calls[0] = 0
    r = measure(p)  # measure() runs step(p)
    r["calls"] = linear_calls[0]
    return r


print(f"{'budget':>7} {'predicted peak':>15} {'measured peak':>14} {'extra forward':>14}  same gradients")
for f, p in plans.items():
    r = measure_plan(p)
    same = all(np.array_equal(a, b) for a, b in zip(r["grads"], plain["grads"]))
    print(f"{f:>7.0%} {(p.peak + loss_bytes) / plain['peak']:>14.2f}x {r['peak'] / plain['peak']:>13.2f}x "
          f"{p.extra_time / forward_flops:>13.2f}x  {same}")

# %% [markdown]
# The cost model's peak is the tracker's (both count bytes), and the gradients are bit for bit
# those of the plain step. The plan for 40%, drawn: each
# layer coloured by how often backward recomputes it (green: kept, orange: once, red: twice),
# each recomputed range a dashed box, nested where the plan recomputes inside a recomputation.

# %%
from minigrad.graph.viz import draw_plan

draw_plan(plans[0.4])

# %% [markdown]
# ## 7. "About 75% of memory for about 30% more compute"?
# A common rule of thumb. Both halves can be checked here, one counted, one measured:

# %%
def extra_forwards(r: dict) -> float:
    return r["calls"] / N_BLOCKS - 1


plan_25 = memory.plan(deep, xd, int(0.25 * plain["peak"]) - loss_bytes, costs)
rows = {"4 segments (sqrt n)": results[4], "plan 40%": measure_plan(plans[0.4]),
        "plan 25%": measure_plan(plan_25)}
for name, r in rows.items():
    print(f"{name:20} memory saved {1 - r['peak'] / plain['peak']:4.0%}, extra block forwards "
          f"{extra_forwards(r):4.0%} of a forward pass, about {extra_forwards(r) / 3:4.0%} of a step")

# %% [markdown]
# *Compute.* One extra forward pass is about a third of a step when backward costs two forward
# passes (a `Linear`'s backward does two matmuls), so $\sqrt{n}$ segments cost about
# $(1 - 1/\sqrt{n})/3$: 25% here, 33% for large $n$. The "30%" agrees.
#
# *Memory.* $\sqrt{n}$ segments keep about $2\sqrt{n}$ of $n$ block outputs: 50% saved for
# $n = 16$, 75% only from $n = 64$ on. So "75%" holds for deep chains of equal blocks, not for
# this one: the planner, recomputing some layers twice, gets to 65% saved for about a third more
# compute, and to 76% for two and a half extra forward passes, recomputing some layers four times:
# the last savings are the dearest. On the 32-block MLP of `bench_memory.py` the plan for 25%
# recomputes about one forward pass (measured 1.3-1.4x the step time on a loaded 2-core machine).
# No plan can do much better there: 25% is room for 10 of its 32 block outputs (1 MiB each), and
# even were the ReLU masks free, reversing 32 steps with 10 slots takes at least 25 recomputed
# blocks, 0.78 of a forward pass (the binomial bound of Griewank's *revolve*).
#
# **What to remember:** activations, not parameters, fill memory in training; they grow with batch
# and depth. Measure them (`track`, `summary`) before trading: checkpointing with about
# $\sqrt{n}$ segments keeps the peak near $2\sqrt{n}$ block outputs for one extra forward pass,
# and a planner given a budget finds the cheapest recomputation that fits it.
#
# ## Predict, then run
# 1. With 8 segments on the 16 blocks, how many block forward calls does one step make?
# 2. The plan for 50% and the plan for 40%: which one recomputes some layers twice? Predict from
#    the drawing above, then count.

# %%
print("1. block forwards with 8 segments:", results[8]["calls"], "= 16 + 14 (every segment but the last)")
twice = {f: sum(1 for n in p.recompute_counts() if n >= 2) for f, p in plans.items()}
print("2. layers recomputed at least twice:", twice)
