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
# # 02.3 Modules and a training loop on real images
#
# **Question:** how do the pieces of 02.1 (leaves, a forward pass, `backward`) become a model that
# learns to read handwritten digits?
#
# Two pieces of bookkeeping: `nn.Module` collects the parameters of a model so nobody has to list
# `W1, b1, W2, b2` by hand, and an optimizer turns `.grad` into an update.

# %%
from collections import OrderedDict

import matplotlib.pyplot as plt
import numpy as np

import minigrad
from minigrad import nn
from minigrad.data import DataLoader, Digits

minigrad.manual_seed(0)

# %% [markdown]
# ## Two ways to write a model
# `nn.Sequential` chains layers; subclassing `nn.Module` lets `forward` be any Python code. Both
# register every `Parameter` assigned to them, and their sub-modules' parameters, by name.

# %%
seq = nn.Sequential(OrderedDict([
    ("flatten", nn.Flatten()), ("fc1", nn.Linear(64, 32)), ("act", nn.ReLU()), ("fc2", nn.Linear(32, 10)),
]))


class MLP(nn.Module):
    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, hidden)
        self.fc2 = nn.Linear(hidden, 10)

    def forward(self, x):
        return self.fc2(self.fc1(x.flatten(1)).relu())


model = MLP()
print(seq)
print(model)
for name, p in model.named_parameters():
    print(f"{name:11s} {tuple(p.shape)}")
print("parameters:", sum(p.numel() for p in model.parameters()))

# %% [markdown]
# Same parameter names, so the state dict of one loads into the other and they compute the same
# function: the checkpoint stores names and arrays, not the Python class.

# %%
seq.load_state_dict(model.state_dict())
probe = minigrad.rand(5, 1, 8, 8)
print("same outputs:", np.allclose(seq(probe).detach().numpy(), model(probe).detach().numpy()))

# %% [markdown]
# ## The data
# The UCI handwritten digits ship with minigrad: 1,797 grey images of 8x8 pixels, split into
# 1,437 for training and 360 for testing (stratified, fixed). We compute in float64: float32
# trains just as well, but its rounding differs between CPUs, and over hundreds of steps such
# differences grow until they change the last digit of the accuracy printed below.

# %%
def to_float64(image):
    return image.astype(np.float64)


train_set, test_set = Digits(train=True, transform=to_float64), Digits(train=False, transform=to_float64)
print(train_set, test_set)
fig, axes = plt.subplots(1, 10, figsize=(8, 1.2))
for ax, (img, label) in zip(axes, (train_set[i] for i in range(10))):
    ax.imshow(img[0], cmap="gray_r")
    ax.set_title(str(label))
    ax.axis("off")
plt.show()

# %% [markdown]
# ## The training loop
# Every step is the same five lines: forward, loss, `zero_grad`, `backward`, `step`. The
# `DataLoader` shuffles (seeded by `minigrad.manual_seed`) and stacks 64 samples into a batch.

# %%
train_loader = DataLoader(train_set, batch_size=64, shuffle=True)
X_test = minigrad.tensor(test_set.data, dtype=minigrad.float64)
y_test = minigrad.tensor(test_set.targets)
model = model.double()
optimizer = minigrad.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def accuracy(model, X, y):
    with minigrad.no_grad():
        return (model(X).argmax(1) == y).float().mean().item()


losses, test_acc = [], []
for epoch in range(15):
    model.train()
    for images, labels in train_loader:
        loss = nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    test_acc.append(accuracy(model, X_test, y_test))
print(f"{len(losses)} steps; last-epoch mean loss {np.mean(losses[-len(train_loader):]):.2f}; test accuracy {test_acc[-1]:.1%}")

# %%
steps_per_epoch = len(train_loader)
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3))
ax1.plot(losses, lw=0.8, alpha=0.6, label="per step")
epoch_mean = np.array(losses).reshape(-1, steps_per_epoch).mean(1)
ax1.plot(np.arange(1, 16) * steps_per_epoch, epoch_mean, "o-", label="epoch mean")
ax1.set_yscale("log")
ax1.set_xlabel("step")
ax1.set_title("training loss (cross-entropy)")
ax1.legend()
ax2.plot(np.arange(1, 16), test_acc, "o-")
ax2.set_xlabel("epoch")
ax2.set_title("test accuracy")
plt.tight_layout()
plt.show()

# %% [markdown]
# The loss falls fast in the first epochs and keeps falling; test accuracy levels off around 95-97%
# after a handful of epochs while the training loss goes on down: from there the model mostly
# memorises the training set.
#
# ## Which digits does it confuse?
# A confusion matrix counts, for every true class (row), how often each class was predicted (column).

# %%
with minigrad.no_grad():
    predicted = model(X_test).argmax(1).numpy()
confusion = np.zeros((10, 10), dtype=int)
np.add.at(confusion, (test_set.targets, predicted), 1)

fig, ax = plt.subplots(figsize=(4.5, 4.5))
ax.imshow(confusion, cmap="Blues")
for i in range(10):
    for j in range(10):
        if confusion[i, j]:
            ax.text(j, i, confusion[i, j], ha="center", va="center",
                    color="white" if confusion[i, j] > 20 else "black", fontsize=8)
ax.set_xticks(range(10))
ax.set_yticks(range(10))
ax.set_xlabel("predicted")
ax.set_ylabel("true")
ax.set_title("test confusion matrix")
plt.show()
print(f"test accuracy: {np.trace(confusion)}/{confusion.sum()} = {np.trace(confusion) / confusion.sum():.1%}")
mistakes = [f"{i}->{j} ({confusion[i, j]})" for i in range(10) for j in range(10) if i != j and confusion[i, j]]
print("mistakes, true->predicted (count):", ", ".join(mistakes))
