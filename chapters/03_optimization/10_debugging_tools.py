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
# # 03.10 Debugging training: TensorBoard logs and autograd leaks
#
# **Question:** a training run is going wrong, slowly: the loss drifts, or memory grows every
# step. What do we record to see it, and how do we find what keeps memory alive?
#
# Two tools. A *log* of the run: scalars, histograms, images and the model's graph, written as
# TensorBoard event files by `minigrad.utils.tensorboard.SummaryWriter` (PyTorch's interface).
# And a *leak finder*: `minigrad.memory.leaks` lists the tensors that keep autograd graphs
# alive, and measures the growth with the memory tracker of 03.2.
#
# **You will:** log a short training run, read the event file back and plot it, see what an event
# file holds; then cause the classic leak (keeping `loss` instead of `loss.item()`), measure it,
# find it, draw what it keeps, and fix it; then test the tip that cycles are the leak.
# **Time:** about 20 minutes (19 reading, 26 s running).

# %%
import tempfile
from collections import Counter
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

import minigrad
from minigrad import nn, optim
from minigrad.data import DataLoader, Digits
from minigrad.graph import draw
from minigrad.memory import leaks
from minigrad.utils.tensorboard import SummaryWriter, read_events, scalars

minigrad.manual_seed(0)
train_set, test_set = Digits(train=True), Digits(train=False)
X_test, Y_test = minigrad.tensor(test_set.data), minigrad.tensor(test_set.targets)
log_dir = Path(tempfile.mkdtemp()) / "digits_mlp"

# %% [markdown]
# ## 1. Logging a run
# A small MLP on the digits, five epochs. Each step logs the training loss; each epoch the train
# and test accuracy on one chart (`add_scalars`), the histogram of the first layer's weights and
# gradients, and once the model's traced graph and a few input images. `with` closes the writer,
# which flushes the file.

# %%
model = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def accuracy(x, y):
    with minigrad.no_grad():
        return (model(x).argmax(dim=1) == y).float().mean().item()


X_train, Y_train = minigrad.tensor(train_set.data), minigrad.tensor(train_set.targets)
with SummaryWriter(log_dir) as writer:
    writer.add_graph(model, X_test[:8])
    writer.add_image("digits", minigrad.tensor(np.hstack(test_set.data[:8, 0])), 0, dataformats="HW")
    step = 0
    for epoch in range(5):
        for x, y in DataLoader(train_set, batch_size=64, shuffle=True, generator=epoch):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            writer.add_scalar("loss/train", loss, step)  # a Tensor is fine: the writer takes its value
            step += 1
        writer.add_scalars("accuracy", {"train": accuracy(X_train, Y_train), "test": accuracy(X_test, Y_test)}, epoch)
        writer.add_histogram("fc1/weight", model[1].weight, epoch)
        writer.add_histogram("fc1/weight.grad", model[1].weight.grad, epoch)
print(f"{step} steps; test accuracy {accuracy(X_test, Y_test):.1%}")
print("runs (directories with an event file):",
      sorted(p.parent.relative_to(log_dir).as_posix() for p in log_dir.rglob("events.out.tfevents.*")))

# %% [markdown]
# `add_scalars` writes one *run* per curve (a subdirectory), which is how TensorBoard draws them on
# one chart. `tensorboard --logdir <dir>` (the `tensorboard` package, not needed here) shows them
# in a browser.
#
# ## 2. Reading the log back
# An event file is a sequence of records: an 8-byte length, a CRC of it, a serialized `Event`
# protobuf, a CRC of that. `read_events` checks both CRCs and parses each record; `scalars`
# gathers every curve of a log directory. What the main file holds, by kind:

# %%
(main_file,) = log_dir.glob("events.out.tfevents.*")
kinds = Counter()
for event in read_events(main_file):
    what = event.WhichOneof("what")
    kinds[what if what != "summary" else "summary: " + event.summary.value[0].WhichOneof("value")] += 1
for kind, n in sorted(kinds.items()):
    print(f"{n:4d}  {kind}")

# %%
curves = scalars(log_dir)
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 2.8))
steps, values = zip(*curves["loss/train"])
ax1.plot(steps, values, lw=0.8, color="#3182bd")
ax1.set(xlabel="step", ylabel="training loss", yscale="log", title="loss/train")
for name, colour in (("train", "#3182bd"), ("test", "#e6550d")):
    epochs, acc = zip(*curves[f"accuracy/{name}/accuracy"])
    ax2.plot(epochs, acc, "o-", color=colour, label=name)
ax2.set(xlabel="epoch", ylabel="accuracy", title="accuracy (add_scalars)")
ax2.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# The histograms are buckets (TensorFlow's edges, 1.1 times apart: fine near zero, coarse far
# from it), with count, sum and range. The last epoch's gradient of the first layer, read from the
# file and summed into 40 even bins. The spike is exact zeros: the last batch (29 digits) has
# pixels that are 0 in all of them, and hidden units whose ReLU is off for all of them.

# %%
last = [e for e in read_events(main_file) for v in e.summary.value if v.tag == "fc1/weight.grad"][-1]
histo = last.summary.value[0].histo
right = np.minimum(np.array(histo.bucket_limit), histo.max)
counts, edges = np.histogram(right, bins=40, range=(histo.min, histo.max), weights=np.array(histo.bucket))
fig, ax = plt.subplots(figsize=(6, 2.2))
ax.stairs(counts, edges, fill=True, color="#9ecae1")
ax.set(xlabel="gradient of fc1.weight", ylabel="count", yscale="log",
       title=f"epoch {last.step}: {int(histo.num)} values")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 3. The classic leak
# A validation loop that keeps each batch's loss *tensor* to average later. Without `no_grad`,
# every loss holds its graph, and the graph holds what its ops saved for backward: the batch and
# the activations of the whole forward pass (each step gets a fresh batch, as from a loader).
# `leaks.memory_per_step` runs a step repeatedly under the memory tracker and reports the bytes
# still alive after each step.

# %%
val_losses = []


def leaky_step():
    x, y = X_test[:128].clone(), Y_test[:128].clone()
    val_losses.append(nn.functional.cross_entropy(model(x), y))  # the tensor, and with it its graph


def fixed_step():
    x, y = X_test[:128].clone(), Y_test[:128].clone()
    val_losses.append(nn.functional.cross_entropy(model(x), y).item())  # a Python float


grow = leaks.memory_per_step(leaky_step, 20)
print(f"leaky: {grow[1] - grow[0]:,} bytes more after every step")
leaks.report(top=3)
leaks_per_step = leaks.live_graphs()[0].nodes

# %% [markdown]
# `report` lists the tensors that hold graphs, largest first: their op, how many ops their graph
# has, the bytes those ops saved (each graph's 80 kB is exactly the growth per step), and what
# refers to them. Only *roots* are listed: the logits inside each graph are not separate findings.
# The graph one of them keeps:

# %%
draw(leaks.live_graphs()[0].tensor())

# %% [markdown]
# The fix is `loss.item()` (or the whole loop under `no_grad`): the graph dies with the step. One
# graph is still found: the last training step's `loss`, a notebook variable, whose graph backward
# already emptied of saved buffers (question 1 below).

# %%
val_losses.clear()
flat = leaks.memory_per_step(fixed_step, 20)
print(f"fixed: {flat[-1]:,} bytes alive after 20 steps")
leaks.report()
fig, ax = plt.subplots(figsize=(6, 2.6))
ax.plot(range(1, 21), np.array(grow) / 1e3, "o-", color="#de2d26", label="val_losses.append(loss)")
ax.plot(range(1, 21), np.array(flat) / 1e3, "o-", color="#31a354", label="val_losses.append(loss.item())")
ax.set(xlabel="validation step", ylabel="kB alive (memory tracker)")
ax.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 4. Are cycles the leak?
# A common tip says leaks come from circular references, so hunt them with `objgraph`. Test it.
# CPython frees an object the moment nothing refers to it; an object in a *cycle* always has a
# referrer, so it waits for the cycle collector `gc`, which runs every few thousand allocations.
# Below, one validation loss goes into a cycle (a dict that holds itself), another stays in a plain
# variable, as the last step's `loss` does in a loop. We `del` every name and measure what is left,
# with automatic collection off so that only our `gc.collect()` runs it.

# %%
import gc
import weakref

from minigrad.memory import track


def held_loss(cycle):
    """Bytes alive after dropping every name of a loss: after `del`, and after `gc.collect()`."""
    gc.collect()
    gc.disable()  # the collector runs only where we call it
    with track() as mem:
        loss = nn.functional.cross_entropy(model(X_test[:128].clone()), Y_test[:128].clone())
        alive, box = weakref.ref(loss), {"loss": loss}
        if cycle:
            box["self"] = box  # box -> box: its count never reaches zero
        del loss, box
        after_del, dead_after_del = mem.current - mem.start, alive() is None
        found = gc.collect()
        after_gc = mem.current - mem.start
    gc.enable()
    return after_del, dead_after_del, found, after_gc, alive() is None


for cycle in (False, True):
    after_del, dead, found, after_gc, dead_gc = held_loss(cycle)
    print(f"{'in a cycle' if cycle else 'no cycle  '}: after del {after_del:>6,} bytes, loss freed {dead!s:5} | "
          f"gc.collect() found {'some' if found else 'no'} garbage: {after_gc:,} bytes, loss freed {dead_gc}")

# %% [markdown]
# Without a cycle the graph's 80 kB go at `del`; in a cycle they stay until `gc.collect()`
# finds it, and then go too (the weak reference to `loss` dies). A cycle only *delays* freeing;
# the leaks of section 3 are graphs something still refers to: a list of losses, a running
# `total`, the last step's `loss` kept in a variable. No collector can free those. What finds
# them is what refers to the tensor, which `objgraph.show_backrefs` draws and `leaks.report`
# prints (both read `gc.get_referrers`); and what measures them is memory per step.

# %% [markdown]
# ## Predict, then run
# 1. In a *training* loop, `losses.append(loss)` after `loss.backward()`: does memory grow as fast
#    as in the validation loop above?
# 2. `total = total + loss` in a validation loop: after 5 steps, how many ops does the graph of
#    `total` hold, against one step's?
# 3. How many events does the writer add to the main file for one `add_scalars` call with two
#    curves?

# %%
val_losses.clear()


def train_step():
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(X_train[:128]), Y_train[:128])
    loss.backward()
    val_losses.append(loss)


growth = leaks.memory_per_step(train_step, 5)
print("1. per step:", np.diff(growth).tolist(), "bytes; held graphs keep",
      sum(g.nbytes for g in leaks.live_graphs()), "bytes: backward freed what they saved, only the ops stay")
val_losses.clear()
total = minigrad.tensor(0.0)
for _ in range(5):
    total = total + nn.functional.cross_entropy(model(X_test[:128]), Y_test[:128])
(chain,) = [g for g in leaks.live_graphs() if g.tensor() is total]
print(f"2. {chain.nodes} ops, keeping {chain.nbytes:,} bytes, against {leaks_per_step} ops for one step: "
      "every step is chained into one graph")
del total, chain
with SummaryWriter(log_dir / "q3") as w:
    w.add_scalars("acc", {"a": 1.0, "b": 2.0}, 0)
main = [p for p in (log_dir / "q3").glob("events.out.tfevents.*")]
print("3. main file:", [e.WhichOneof("what") for e in read_events(main[0])],
      "- the values went to", sorted(p.parent.relative_to(log_dir / "q3").as_posix()
                                      for p in (log_dir / "q3").rglob("events.out.tfevents.*") if p not in main))
