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
# # 02.3 Modules, optimizers and a training loop on real images
#
# **Question:** how do the pieces of 02.1 (leaves, a forward pass, `backward`) become a model that
# learns to read handwritten digits?
#
# **You will:** see how `nn.Module` finds a model's parameters, moves them and saves them; derive
# the gradient of softmax + cross-entropy and check it against minigrad; write SGD with momentum
# and Adam by hand and check them against `minigrad.optim`; train an MLP on the 8x8 digits; grow
# a layer and freeze and unfreeze layers in the middle of training.
# **Time:** about 31 minutes (30 reading, 9 s running).

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
# ## How a Module finds its parameters
# `Module.__setattr__` looks at what is assigned: a `Parameter` goes into the module's
# `_parameters`, a `Module` into `_modules`, anything else stays a plain attribute. Nobody lists the
# weights; `named_parameters()` walks the tree and joins the names with dots.

# %%
class Affine(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(minigrad.ones(3))     # registered
        self.offset = minigrad.zeros(3)                 # a plain tensor: not a parameter
        self.register_buffer("running_mean", minigrad.zeros(3))  # saved, not trained (as in BatchNorm)

    def forward(self, x):
        return x * self.scale + self.offset


block = Affine()
print("after __init__:      ", [name for name, _ in block.named_parameters()])
block.inner = nn.Linear(3, 2)                            # a sub-module: its parameters join with a prefix
print("after block.inner = :", [name for name, _ in block.named_parameters()])
print("buffers:             ", [name for name, _ in block.named_buffers()])
print("state_dict keys:     ", list(block.state_dict()))

# %% [markdown]
# ## state_dict and load_state_dict
# `state_dict()` maps those dotted names to tensors (parameters and persistent buffers). The
# `Sequential` and the `MLP` above have the same names, so the state dict of one loads into the
# other and they compute the same function: a checkpoint stores names and arrays, not the Python
# class. A missing or unexpected name is an error unless `strict=False`.

# %%
seq.load_state_dict(model.state_dict())
probe = minigrad.rand(5, 1, 8, 8)
print("same outputs:", np.allclose(seq(probe).detach().numpy(), model(probe).detach().numpy()))
try:
    model.load_state_dict({"fc1.weight": model.fc1.weight.detach()})
except Exception as err:
    print(type(err).__name__, "->", str(err)[:110])

# %% [markdown]
# ## Module.to: the same Parameter objects, new arrays
# `model.to(device)` (and `.double()`, `.half()`) swaps each parameter's `.array` (its raw array) in place instead of
# making new Parameters, so an optimizer built before the move still holds the right tensors. On a
# machine with a GPU, `device` below is `cuda` and the arrays become cupy arrays.

# %%
device = "cuda" if minigrad.cuda.is_available() else "cpu"
net = MLP()
before = [id(p) for p in net.parameters()]
net.to(device).double()
print("same Parameter objects:", before == [id(p) for p in net.parameters()])
print("fc1.weight:", net.fc1.weight.dtype, "| on the chosen device:", net.fc1.weight.device == minigrad.device(device))

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
# ## The gradient of softmax + cross-entropy
# For one sample with logits $z \in \mathbb{R}^{C}$ and label $y$, $p = \operatorname{softmax}(z)$,
# $p_i = e^{z_i} / \sum_j e^{z_j}$, and the loss is
# $L = -\log p_y = -z_y + \log \sum_j e^{z_j}$. Differentiating the two terms:
# $\partial(-z_y)/\partial z_i = -[i = y]$ and $\partial \log\sum_j e^{z_j} / \partial z_i = e^{z_i}/\sum_j e^{z_j} = p_i$, so
#
# $$\frac{\partial L}{\partial z} = p - \operatorname{onehot}(y).$$
#
# The Jacobian of softmax on its own is a full $C \times C$ matrix
# ($\partial p_i / \partial z_k = p_i([i=k] - p_k)$); composed with $-\log p_y$ it collapses to
# this one subtraction, which is why `cross_entropy` fuses the two. Averaged over a batch of $N$,
# every row is divided by $N$.

# %%
logits = minigrad.randn(4, 10, dtype=minigrad.float64, requires_grad=True)
labels = minigrad.tensor([3, 0, 9, 3])
nn.functional.cross_entropy(logits, labels).backward()

z = logits.detach().numpy()
p = np.exp(z - z.max(1, keepdims=True))
p /= p.sum(1, keepdims=True)
by_hand = (p - np.eye(10)[labels.numpy()]) / len(z)
print("by hand == minigrad:", np.allclose(by_hand, logits.grad.numpy()))
print("every row sums to 0:", np.allclose(by_hand.sum(1), 0, atol=1e-15))

# %% [markdown]
# Each row sums to zero: raising every logit by the same amount changes no probability. The
# gradient pushes the true class's logit up by $1 - p_y$ and every other logit down by $p_i$.
#
# ## Optimizers by hand
# An optimizer keeps some state per parameter and turns `.grad` into an update. SGD with momentum
# (PyTorch's form) keeps a velocity $b$:
#
# $$b \leftarrow \mu b + g, \qquad \theta \leftarrow \theta - \eta\, b$$
#
# (the first step sets $b = g$). Adam keeps running means of $g$ and $g^2$ and corrects their bias
# towards the zero they start from, at step $t$:
#
# $$m \leftarrow \beta_1 m + (1-\beta_1) g, \quad v \leftarrow \beta_2 v + (1-\beta_2) g^2, \quad
# \theta \leftarrow \theta - \eta \frac{m / (1-\beta_1^t)}{\sqrt{v / (1-\beta_2^t)} + \epsilon}.$$
#
# Below, both are written on the parameters' raw arrays (`p.array`, `p.grad.array`: numpy on the CPU,
# cupy on a GPU) and run side by side with `minigrad.optim` on two copies of
# the same model and the same batches.

# %%
class HandSGD:
    def __init__(self, params, lr, momentum):
        self.params, self.lr, self.mu = list(params), lr, momentum
        self.buf = [None] * len(self.params)

    def step(self):
        for i, p in enumerate(self.params):
            g = p.grad.array
            self.buf[i] = g.copy() if self.buf[i] is None else self.mu * self.buf[i] + g
            p.array -= self.lr * self.buf[i]


class HandAdam:
    def __init__(self, params, lr, betas=(0.9, 0.999), eps=1e-8):
        self.params, self.lr, (self.b1, self.b2), self.eps = list(params), lr, betas, eps
        self.m = [p.array * 0 for p in self.params]
        self.v = [p.array * 0 for p in self.params]
        self.t = 0

    def step(self):
        self.t += 1
        for p, m, v in zip(self.params, self.m, self.v):
            g = p.grad.array
            m[:] = self.b1 * m + (1 - self.b1) * g
            v[:] = self.b2 * v + (1 - self.b2) * g * g
            m_hat, v_hat = m / (1 - self.b1 ** self.t), v / (1 - self.b2 ** self.t)
            p.array -= self.lr * m_hat / (v_hat ** 0.5 + self.eps)


def run_side_by_side(make_hand, make_library, steps=20):
    """Train two copies of one MLP on the same batches; return the largest parameter difference."""
    minigrad.manual_seed(1)
    a = MLP().double()
    b = MLP().double()
    b.load_state_dict(a.state_dict())
    hand, library = make_hand(a.parameters()), make_library(b.parameters())
    X = minigrad.randn(steps, 32, 1, 8, 8, dtype=minigrad.float64)
    y = minigrad.randint(0, 10, (steps, 32))
    for k in range(steps):
        for net, opt in ((a, hand), (b, library)):
            net.zero_grad()
            nn.functional.cross_entropy(net(X[k]), y[k]).backward()
            opt.step()
    return max(np.abs(pa.detach().numpy() - pb.detach().numpy()).max() for pa, pb in zip(a.parameters(), b.parameters()))


sgd_gap = run_side_by_side(lambda ps: HandSGD(ps, 0.1, 0.9), lambda ps: minigrad.optim.SGD(ps, lr=0.1, momentum=0.9))
adam_gap = run_side_by_side(lambda ps: HandAdam(ps, 1e-2), lambda ps: minigrad.optim.Adam(ps, lr=1e-2))
print("after 20 steps, hand == library to 1e-12:  SGD with momentum", sgd_gap < 1e-12, "  Adam", adam_gap < 1e-12)

# %% [markdown]
# Equal up to rounding (the library computes the same formulas in a different order). What
# `minigrad.optim` adds is bookkeeping: parameter groups with their own learning rates, weight
# decay, `state_dict()` for checkpoints (01.4), and running on any device without leaving it.
#
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

# %% [markdown]
# ## Changing the model while it trains
# minigrad records the graph anew at every forward pass, so the model may change between two
# steps: the next forward records whatever modules are there now. Here a narrow MLP trains for 3
# epochs; then we insert a hidden layer, train only it for 3 epochs with the old layers frozen
# (`requires_grad_(False)`: backward gives them no gradient, so `step` skips them), and then
# unfreeze everything. The optimizer learns of the new parameters with `add_param_group`. The new
# layer starts as the identity and follows a ReLU, so the grown network computes the same function.

# %%
def snapshot(net):
    return {name: p.detach().numpy().copy() for name, p in net.named_parameters()}


minigrad.manual_seed(1)
net = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10)).double()
opt = minigrad.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
grown_acc = []
for epoch in range(9):
    if epoch == 3:  # grow: ReLU -> new Linear(16, 16) -> ReLU -> the old head
        new = nn.Linear(16, 16).double()
        with minigrad.no_grad():
            new.weight.copy_(minigrad.eye(16, dtype=minigrad.float64))
            new.bias.zero_()
        with minigrad.no_grad():
            logits_before = net(X_test).numpy()
        head = net[3]
        net[3] = new
        net.append(nn.ReLU())
        net.append(head)
        with minigrad.no_grad():
            print("grown net, same logits:", np.array_equal(logits_before, net(X_test).numpy()))
        net[1].requires_grad_(False)
        head.requires_grad_(False)
        opt.add_param_group({"params": new.parameters()})
    if epoch == 6:  # unfreeze
        net.requires_grad_(True)
    if epoch in (3, 6):
        print(f"after epoch {epoch}: test accuracy {grown_acc[-1]:.1%}")
    before = snapshot(net)
    for images, labels in train_loader:
        loss = nn.functional.cross_entropy(net(images), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    grown_acc.append(accuracy(net, X_test, y_test))
    if epoch in (3, 6):
        after = snapshot(net)
        print(f"epoch {epoch + 1} changed:", [n for n in after if not np.array_equal(before.get(n), after[n])])
print(f"after epoch 9: test accuracy {grown_acc[-1]:.1%}")
print(f"epochs 4-6 (new layer only): {100 * (grown_acc[5] - grown_acc[2]):+.1f} points; "
      f"epochs 7-9 (all layers): {100 * (grown_acc[8] - grown_acc[5]):+.1f} points")
print(net)

fig, ax = plt.subplots(figsize=(6, 2.8))
ax.plot(np.arange(1, 10), grown_acc, "o-")
for start, what in ((3.5, "grown, old layers frozen"), (6.5, "all trained")):
    ax.axvline(start, color="gray", ls="--")
    ax.text(start + 0.1, min(grown_acc), what, fontsize=8, va="bottom")
ax.set(xlabel="epoch", ylabel="test accuracy", title="a 64-16-10 MLP grown to 64-16-16-10 after epoch 3")
plt.tight_layout()
plt.show()

# %% [markdown]
# The grown net starts from exactly the old logits, so it loses nothing at the change; while the
# old layers are frozen only the new layer's `3.weight` and `3.bias` move. Compare the two gains
# printed: alone, the new layer can only re-mix the 16 features the frozen first layer already
# computes, so it gains little or nothing; unfrozen, all layers adapt to it. A framework that
# compiles a static graph first would have to rebuild and recompile it for each change; here it
# is a Python assignment. Freezing a pretrained body and training a new head is the same move,
# the usual start of fine-tuning.

# %% [markdown]
# ## Predict, then run
# 1. A model assigns `self.layers = [nn.Linear(4, 4), nn.Linear(4, 1)]`, a plain Python list. How
#    many parameters does `named_parameters()` report?
# 2. All ten logits are equal and the label is 7. What is the gradient of the cross-entropy with
#    respect to logit 7, and to each of the others?
# 3. Adam's very first step, with $\epsilon$ ignored: how far does each weight move, whatever its gradient?

# %%
class ListModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = [nn.Linear(4, 4), nn.Linear(4, 1)]


print("1. plain list:", len(list(ListModel().named_parameters())), "parameters (use nn.ModuleList)")
equal = minigrad.zeros(1, 10, dtype=minigrad.float64, requires_grad=True)
nn.functional.cross_entropy(equal, minigrad.tensor([7])).backward()
print("2. gradient:", equal.grad.numpy().round(3), "= p - onehot, p = 0.1 everywhere")
w = nn.Parameter(minigrad.tensor([5.0, -0.001, 1e-6], dtype=minigrad.float64))
w.grad = minigrad.tensor([100.0, -3.0, 1e-3], dtype=minigrad.float64)
adam = minigrad.optim.Adam([w], lr=0.01)
adam.step()
print("3. first Adam step moves each weight by:", (np.array([5.0, -0.001, 1e-6]) - w.detach().numpy()).round(6),
      "= lr * sign(g)")
