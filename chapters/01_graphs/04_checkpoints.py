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
# # 01.4 Outputs: checkpoints you can resume from
#
# **Question:** what must be written to disk so that a training run can stop (a crash, a time
# limit, a preempted machine) and continue later *exactly* as if it had never stopped?
#
# The graph is rebuilt at every step, so it is not what we save. What persists between steps is
# state: the model's parameters, the optimizer's state, and the position in the data.
#
# **You will:** save and resume a training run bit for bit, see what goes wrong when one piece of
# state is left out, look inside a checkpoint file, and watch damaged files being refused.
# **Time:** about 18 minutes (17 reading, 10 s running).

# %%
import json
import os
import tempfile
import zipfile

import matplotlib.pyplot as plt
import numpy as np

import minigrad
from minigrad import nn, optim
from minigrad.data import DataLoader, Digits
from minigrad.serialization import CheckpointError

here, scratch = os.getcwd(), tempfile.TemporaryDirectory()
os.chdir(scratch.name)  # checkpoints go to a scratch directory, removed at the end
train_set = Digits(train=True)
loss_fn = nn.CrossEntropyLoss()

# %% [markdown]
# ## A training run with every source of state in sight
# The model starts from a seeded initialisation, Adam keeps two running averages and a step count
# per parameter (a 0-d tensor, as in PyTorch), and each epoch shuffles with a generator seeded by
# `(seed, epoch)`, so the epoch number alone says which batches come next.

# %%
def make_model_and_optimizer(seed=0):
    minigrad.manual_seed(seed)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    return model, optim.Adam(model.parameters(), lr=0.01)


def run_epoch(model, optimizer, epoch, seed=0):
    """One epoch; returns the loss of every step."""
    losses = []
    for x, y in DataLoader(train_set, batch_size=64, shuffle=True, generator=1000 * seed + epoch):
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def epoch_means(epochs):
    return [round(float(np.mean(losses)), 3) for losses in epochs]


EPOCHS = 4
model, optimizer = make_model_and_optimizer()
straight = [run_epoch(model, optimizer, epoch) for epoch in range(EPOCHS)]
print("uninterrupted, mean loss per epoch:", epoch_means(straight))
reference = {k: v.numpy().copy() for k, v in model.state_dict().items()}

# %% [markdown]
# What the optimizer keeps, per parameter (by index), besides its hyper-parameters:

# %%
state = optimizer.state_dict()
for index, entry in state["state"].items():
    print(index, {k: (v.item() if v.ndim == 0 else tuple(v.shape)) for k, v in entry.items()})
print(state["param_groups"])

# %% [markdown]
# ## Stop after two epochs, save, resume
# A checkpoint is one `minigrad.save` of a dictionary: the last finished epoch, the model's
# `state_dict()` and the optimizer's `state_dict()`.

# %%
model, optimizer = make_model_and_optimizer()
first_half = [run_epoch(model, optimizer, epoch) for epoch in range(2)]
minigrad.save({"epoch": 1, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, "run.ckpt")
del model, optimizer  # the "crash"

# %% [markdown]
# Later, in a new process: build the same model and optimizer (the initial values do not matter,
# we pass a different seed to prove it), load the state, continue with the next epoch.

# %%
model, optimizer = make_model_and_optimizer(seed=123)
checkpoint = minigrad.load("run.ckpt")
model.load_state_dict(checkpoint["model"])
optimizer.load_state_dict(checkpoint["optimizer"])
second_half = [run_epoch(model, optimizer, epoch) for epoch in range(checkpoint["epoch"] + 1, EPOCHS)]

print("uninterrupted:", epoch_means(straight))
print("resumed:      ", epoch_means(first_half + second_half))
print("final weights bit for bit equal:",
      all(np.array_equal(reference[k], v.numpy()) for k, v in model.state_dict().items()))

# %% [markdown]
# Not close: *equal*. Leave out one piece of state and that is lost. Resuming with the weights but
# a fresh Adam (its averages back at zero, its step count at 0) trains a different model:

# %%
model, optimizer = make_model_and_optimizer(seed=123)
model.load_state_dict(checkpoint["model"])
fresh_adam = [run_epoch(model, optimizer, epoch) for epoch in range(2, EPOCHS)]
gap = max(np.abs(reference[k] - v.numpy()).max() for k, v in model.state_dict().items())
print(f"without the optimizer state, the largest weight differs by {gap:.2f}")

# %% [markdown]
# The three runs step by step. The resumed run lies exactly on the uninterrupted one. The run that
# lost Adam's state leaves it from the second step after the checkpoint (the first loss is computed
# before any update) and never finds it again: with $m = v = 0$ and $t = 1$, Adam's first step
# moves every weight by the full learning rate, whatever its gradient (02.3).

# %%
steps = np.concatenate(straight)
resume_at = sum(len(e) for e in first_half)
after = np.arange(resume_at, len(steps))
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.2))
ax1.plot(steps, color="0.6", lw=3, label="uninterrupted")
ax1.plot(after, np.concatenate(second_half), "C0.", ms=3, label="resumed from the checkpoint")
ax1.plot(after, np.concatenate(fresh_adam), "C3-", lw=1, label="resumed, optimizer state lost")
ax1.set(yscale="log", xlabel="step", ylabel="training loss", title="loss per step")
ax2.plot(after, np.abs(np.concatenate(fresh_adam) - steps[resume_at:]), "C3-", lw=1,
         label="optimizer state lost")
ax2.set(yscale="log", xlabel="step", ylabel="|loss - uninterrupted loss|")
ax2.set_title("resumed with the full state: 0 at every step", loc="right", fontsize=8, y=0.9)
for ax in (ax1, ax2):
    ax.axvline(resume_at, color="k", ls=":", lw=1)
ax1.legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# The same goes for anything else that decides what happens next: a learning-rate scheduler
# (`scheduler.state_dict()`), and the random generator if the model uses dropout or the data
# random augmentation.
#
# ## What is in the file
# A checkpoint is a zip archive: one `.npy` file per array and a JSON description of the
# structure, with a SHA-256 digest of every array. There is no pickle in it, so loading a file
# from someone else cannot run their code.

# %%
with zipfile.ZipFile("run.ckpt") as archive:
    print([(info.filename, info.file_size) for info in archive.infolist()])
    meta = json.loads(archive.read("metadata.json"))
print(meta["format"], "version", meta["version"])
print(json.dumps(meta["tree"])[:200], "...")

# %% [markdown]
# ## Damaged checkpoints
# Files get truncated by a full disk, corrupted in transfer, or mixed up. Loading checks
# everything and raises `CheckpointError` naming the file and what is wrong, instead of
# returning wrong numbers. (Saving writes a temporary file and renames it when complete, so a
# crash during `save` leaves the previous checkpoint intact.)

# %%
good = open("run.ckpt", "rb").read()
flipped = bytearray(good)
flipped[200] ^= 0xFF                       # one damaged byte, inside the first array
damaged = {"truncated.ckpt": good[: len(good) // 2], "flipped.ckpt": bytes(flipped),
           "notes.ckpt": b"epoch 3, loss 0.12\n"}
for name, data in damaged.items():
    with open(name, "wb") as f:
        f.write(data)
    try:
        minigrad.load(name)
    except CheckpointError as err:
        print(f"{type(err).__name__}: {err}")

# %% [markdown]
# An array changed on purpose (the archive rewritten, so its own checksums are valid) is caught
# by the digests:

# %%
with zipfile.ZipFile("run.ckpt") as src, zipfile.ZipFile("edited.ckpt", "w") as dst:
    for info in src.infolist():
        data = src.read(info)
        if info.filename == "arr_0.npy":
            data = data[:-4] + b"\x00\x00\x80\x3f"   # set the last weight to 1.0
        dst.writestr(info, data)
try:
    minigrad.load("edited.ckpt")
except CheckpointError as err:
    print(f"{type(err).__name__}: {err}")

# %% [markdown]
# And a sound checkpoint loaded into the wrong model fails in `load_state_dict`, listing every
# parameter that does not fit:

# %%
wider = nn.Sequential(nn.Flatten(), nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 10))
try:
    wider.load_state_dict(checkpoint["model"])
except RuntimeError as err:
    print(err)

# %% [markdown]
# ## Predict, then run
# 1. The checkpoint keeps the weights and Adam's state but the epoch number is lost, so the resumed
#    run restarts its epoch count at 0 (it shuffles epochs 2 and 3 like epochs 0 and 1). Are the
#    final weights bit for bit equal to the uninterrupted run's?
# 2. With plain SGD (no momentum), does resuming with a fresh optimizer change anything?
# 3. How many arrays does `run.ckpt` hold for this 2-layer model and Adam?

# %%
model, optimizer = make_model_and_optimizer(seed=123)
model.load_state_dict(checkpoint["model"])
optimizer.load_state_dict(checkpoint["optimizer"])
for epoch in range(0, EPOCHS - 2):
    run_epoch(model, optimizer, epoch)
print("1. epoch number lost, weights equal:",
      all(np.array_equal(reference[k], v.numpy()) for k, v in model.state_dict().items()))


def sgd_run(fresh_optimizer_at=None):
    minigrad.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    sgd = optim.SGD(net.parameters(), lr=0.1)
    for epoch in range(EPOCHS):
        if epoch == fresh_optimizer_at:
            sgd = optim.SGD(net.parameters(), lr=0.1)  # what a resumed process would build
        run_epoch(net, sgd, epoch)
    return net


print("2. plain SGD, fresh optimizer at epoch 2, weights equal:", all(
    np.array_equal(a.numpy(), b.numpy())
    for a, b in zip(sgd_run().state_dict().values(), sgd_run(fresh_optimizer_at=2).state_dict().values())))
with zipfile.ZipFile("run.ckpt") as archive:
    arrays = [info.filename for info in archive.infolist() if info.filename.endswith(".npy")]
print(f"3. {len(arrays)} arrays: 4 parameters, and Adam's step, exp_avg and exp_avg_sq for each of the 4")

# %%
os.chdir(here)
scratch.cleanup()
