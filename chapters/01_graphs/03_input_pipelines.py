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
# # 01.3 Input pipelines: feeding the graph
#
# **Question:** where do the batches that enter the graph come from, and how do we keep the
# training step from waiting for them?
#
# An input pipeline is itself a small graph: read samples, shuffle them, transform them, group
# them into batches, hand them over. Its stages can run *ahead* of the training step, on other
# threads or processes, so that preparing batch `k + 1` overlaps computing on batch `k`.

# %%
import os

# The training step and the data preparation share the CPU: one BLAS thread for the step leaves
# the other core free (set before numpy is imported).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import time

import matplotlib.pyplot as plt
import numpy as np

import minigrad
from minigrad import nn, optim
from minigrad.data import DataLoader, Dataset, Digits, Pipeline, default_collate, load_digits
from minigrad.data import transforms

minigrad.manual_seed(0)

# %% [markdown]
# ## A dataset is an indexable collection
# Anything with `__len__` and `__getitem__` is a `Dataset`. `Digits` holds 1,437 training images
# of handwritten digits, 8x8 pixels, shipped with minigrad.

# %%
train_set = Digits(train=True)
image, label = train_set[0]
print(train_set, "| one sample:", type(image).__name__, image.shape, image.dtype, "label", label)

# %% [markdown]
# ## A DataLoader turns samples into batches
# A sampler picks the indices (a new random order each epoch with `shuffle=True`), the dataset
# returns the samples, and `collate_fn` stacks them into batch tensors.

# %%
loader = DataLoader(train_set, batch_size=32, shuffle=True, generator=0)
images, labels = next(iter(loader))
print(f"{len(loader)} batches per epoch; first batch: images {images.shape} {images.dtype}, "
      f"labels {labels.shape} {labels.dtype}")
print("first labels:", labels[:10].tolist())

# %% [markdown]
# Collating is just stacking, field by field:

# %%
batch = default_collate([train_set[0], train_set[1], train_set[2]])
print([tuple(part.shape) for part in batch], batch[1].tolist())

# %% [markdown]
# ## Augmentation: a random function of each sample
# A transform applied as samples are loaded makes every epoch see slightly different images:
# here `RandomCrop` with a one-pixel padding shifts each digit by up to one pixel.

# %%
X, Y = load_digits()
augment = transforms.RandomCrop(8, padding=1)
originals = X[:8]
shifted = np.stack([augment(x) for x in originals])
fig, axes = plt.subplots(2, 8, figsize=(8, 2.2))
for k in range(8):
    axes[0, k].imshow(originals[k, 0], cmap="gray_r")
    axes[1, k].imshow(shifted[k, 0], cmap="gray_r")
for ax in axes.flat:
    ax.set_xticks([])
    ax.set_yticks([])
axes[0, 0].set_ylabel("original")
axes[1, 0].set_ylabel("augmented")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## The same journey as a Pipeline
# `Pipeline` (the `tf.data` style) writes the stages in the order the data goes through them:
# slice the arrays into samples, shuffle, transform each sample, batch, prefetch. Nothing runs
# until we iterate.

# %%
pipeline = (Pipeline.from_tensor_slices((X, Y))
            .shuffle(buffer_size=512, seed=0)
            .map(lambda x, y: (augment(x), y))
            .batch(32)
            .prefetch(2))
print(pipeline)
print(len(pipeline), "batches;", [tuple(part.shape) for part in next(iter(pipeline))])

# %% [markdown]
# ## What a shuffle buffer does
# `shuffle(buffer_size)` never holds the whole dataset: it keeps a buffer, emits a random element
# of it, and refills the hole with the next input. A small buffer only mixes neighbours; a buffer
# as large as the data gives a uniform shuffle. Below, each dot is one element: its position in
# the input against its position in the output.

# %%
fig, axes = plt.subplots(1, 4, figsize=(10, 2.6), sharey=True)
for ax, size in zip(axes, (1, 10, 50, 300)):
    order = list(Pipeline.range(300).shuffle(size, seed=0))
    ax.plot(range(300), order, ".", markersize=2)
    ax.set_title(f"buffer_size={size}")
    ax.set_xlabel("output position")
axes[0].set_ylabel("input index")
plt.tight_layout()
plt.show()

# %% [markdown]
# With `buffer_size=10` an element leaves at most a few positions early and, by bad luck, late:
# if the data is sorted (all zeros, then all ones...), such a shuffle barely mixes the classes.
#
# ## Workers: preparing batches in other processes
# With `num_workers=2`, two worker processes each build whole batches and send them back. The
# batches come back in order, so the result is the same as without workers:

# %%
class SlowDigits(Dataset):
    """The digits, as if each image took a moment to read from a slow disk."""

    def __init__(self, n=640):
        self.images, self.labels = X[:n], Y[:n]

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        time.sleep(0.0003)  # waiting for storage: the CPU is free meanwhile
        return self.images[i], self.labels[i]


serial_loader = DataLoader(SlowDigits(), batch_size=32, shuffle=True, generator=1)
worker_loader = DataLoader(SlowDigits(), batch_size=32, shuffle=True, generator=1, num_workers=2,
                           persistent_workers=True)
serial_labels = [y.tolist() for _, y in serial_loader]
worker_labels = [y.tolist() for _, y in worker_loader]
print(f"{len(worker_labels)} batches; same batches in the same order: {serial_labels == worker_labels}")

# %% [markdown]
# ## Measuring the overlap
# A real training step (a small CNN on 8x8 digits, forward, backward, SGD) and a data stage that
# spends about as long per batch waiting for storage. We time one epoch four ways:
#
# - `Pipeline` without prefetch: read a batch, then compute on it, in turn;
# - `Pipeline` with `prefetch(2)`: a background thread reads the next batches during the step;
# - `DataLoader` without workers, reading sample by sample in the training process;
# - `DataLoader` with 2 worker processes.
#
# For the two pipelines we also log when each batch was read and each step computed.

# %%
model = nn.Sequential(
    nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
    nn.Flatten(), nn.Linear(128, 10),
)
optimizer = optim.SGD(model.parameters(), lr=0.05)
loss_fn = nn.CrossEntropyLoss()
events = []   # (what, start, end)


def read_batch(x, y):
    start = time.perf_counter()
    time.sleep(0.006)  # reading 32 images from storage
    events.append(("data", start, time.perf_counter()))
    return x, y


def train_step(x, y):
    start = time.perf_counter()
    optimizer.zero_grad()
    loss_fn(model(x), y).backward()
    optimizer.step()
    events.append(("compute", start, time.perf_counter()))


def time_epoch(batches):
    start = time.perf_counter()
    for x, y in batches:
        train_step(x, y)
    return time.perf_counter() - start


source = Pipeline.from_tensor_slices((X[:640], Y[:640])).shuffle(640, seed=0).batch(32)
configs = {
    "Pipeline": source.map(read_batch),
    "Pipeline\n+ prefetch": source.map(read_batch).prefetch(2),
    "DataLoader": serial_loader,
    "DataLoader\n+ 2 workers": worker_loader,
}
time_epoch(configs["Pipeline"])  # warm-up: first calls allocate and fill caches
epoch_seconds, timelines = {}, {}
for name, batches in configs.items():
    events.clear()
    epoch_seconds[name] = time_epoch(batches)
    timelines[name] = list(events)

# %% [markdown]
# The numbers change from run to run and machine to machine (this cell's output is not checked):

# %%
# NBVAL_IGNORE_OUTPUT
for name, seconds in epoch_seconds.items():
    print(f"{name.replace(chr(10), ' '):22s} {seconds:.3f} s per epoch ({1000 * seconds / 20:.1f} ms per batch)")

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.2), gridspec_kw={"width_ratios": [2, 1.3]})
rows = [("Pipeline", "data"), ("Pipeline", "compute"),
        ("Pipeline\n+ prefetch", "data"), ("Pipeline\n+ prefetch", "compute")]
colors = {"data": "tab:orange", "compute": "tab:blue"}
for row, (name, what) in enumerate(rows):
    t0 = timelines[name][0][1]
    spans = [(s - t0, e - s) for w, s, e in timelines[name] if w == what]
    ax1.broken_barh([(1000 * s, 1000 * d) for s, d in spans], (row - 0.35, 0.7), facecolor=colors[what],
                    edgecolor="white", linewidth=0.5)
ax1.set_yticks(range(len(rows)), [f"{n.replace(chr(10), ' ')}: {w}" for n, w in rows])
ax1.invert_yaxis()
ax1.set_xlim(0, 1000 * max(epoch_seconds["Pipeline"], epoch_seconds["Pipeline\n+ prefetch"]) / 2)
ax1.set_xlabel("ms since the start of the epoch (first half shown)")
ax1.set_title("When each batch is read and computed")
ax2.bar(range(len(epoch_seconds)), list(epoch_seconds.values()),
        color=["tab:gray", "tab:green", "tab:gray", "tab:green"])
ax2.set_xticks(range(len(epoch_seconds)), list(epoch_seconds), fontsize=8)
ax2.set_ylabel("seconds per epoch")
ax2.set_title("One epoch, 20 batches")
plt.tight_layout()
plt.show()

# %% [markdown]
# Without prefetch the two rows alternate: the step waits for the data, then the data waits for
# the step, and an epoch costs the sum of both. With prefetch the reads happen during the steps:
# the busier of the two rows is hardly ever idle, and an epoch costs about the larger of the two. Worker processes do the same for
# the `DataLoader`, and since they are processes they also run CPU-heavy transforms in parallel
# (a thread would take turns with the training step on Python's GIL);
# `benchmarks/bench_dataloader.py` measures that case.
