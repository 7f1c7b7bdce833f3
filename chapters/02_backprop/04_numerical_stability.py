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
# # 02.4 Numerical stability
#
# **Question:** backpropagation multiplies many local derivatives together. When does that
# product vanish, explode, or turn into `nan`, and what do frameworks do about it?
#
# Four cases, each reproduced and fixed: initialisation scale, gradient clipping, the `eps` in
# normalisation layers, and the log-sum-exp trick; then hooks, to watch every layer of a run.
#
# **You will:** measure gradients layer by layer for four initialisations, rescue a diverging run
# with clipping, see why LayerNorm needs its `eps` and softmax its shift, and record activation and
# gradient statistics of a training run with forward and backward hooks.
# **Time:** about 24 minutes (23 reading, 13 s running).

# %%
import matplotlib.pyplot as plt
import numpy as np

import minigrad
from minigrad import nn
from minigrad.errors import AnomalyError

# %% [markdown]
# ## 1. Vanishing and exploding gradients
# A deep MLP of 20 layers of width 64. In the backward pass the gradient is multiplied by
# $W_k^\top$ and by the activation's derivative once per layer, so its size changes by roughly the
# same factor at every layer: a factor of 0.5 gives $0.5^{20} \approx 10^{-6}$, a factor of 2 gives
# $10^{6}$. The initial weight scale sets that factor. For every layer $k$ we measure the gradient
# arriving at its output $z_k = W_k h_{k-1} + b_k$ (kept with `retain_grad`) and the gradient of
# its weight, $\partial L/\partial W_k = (\partial L/\partial z_k)\, h_{k-1}^\top$, in float64 so
# that nothing overflows before we can look at it.

# %%
DEPTH, WIDTH = 20, 64

INITS = {
    "N(0, 1)": lambda w, act: nn.init.normal_(w, 0.0, 1.0),
    "N(0, 0.01)": lambda w, act: nn.init.normal_(w, 0.0, 0.01),
    "Xavier": lambda w, act: nn.init.xavier_normal_(w),
    "Kaiming": lambda w, act: nn.init.kaiming_normal_(w, nonlinearity=act),
}


def layer_grad_norms(act: str, init) -> tuple[list[float], list[float]]:
    """Norms of dL/dz_k and of dL/dW_k for k = 1..DEPTH."""
    minigrad.manual_seed(0)
    linears = [nn.Linear(WIDTH, WIDTH).double() for _ in range(DEPTH)]
    for linear in linears:
        init(linear.weight, act)
        nn.init.zeros_(linear.bias)
    h = minigrad.randn(128, WIDTH, dtype=minigrad.float64)
    zs = []
    for linear in linears:
        z = linear(h)
        z.retain_grad()
        zs.append(z)
        h = z.tanh() if act == "tanh" else z.relu()
    readout = minigrad.randn(WIDTH, dtype=minigrad.float64)
    (h @ readout).mean().backward()  # a fixed random linear loss on the last layer
    return ([np.linalg.norm(z.grad.numpy()) for z in zs],
            [np.linalg.norm(linear.weight.grad.numpy()) for linear in linears])


norms = {(act, name): layer_grad_norms(act, init) for act in ("tanh", "relu") for name, init in INITS.items()}

fig, axes = plt.subplots(1, 2, figsize=(10, 3.5), sharey=True)
for ax, act in zip(axes, ("tanh", "relu")):
    for name in INITS:
        ax.semilogy(range(1, DEPTH + 1), np.maximum(norms[act, name][0], 1e-300), "o-", ms=3, label=name)
    ax.set_title(f"{act} MLP, {DEPTH} layers")
    ax.set_xlabel("layer k (1 = input side)")
axes[0].set_ylabel("norm of dL/dz_k")
axes[1].legend()
plt.show()

# %%
layers = (1, 10, 20)
print(f"{'':16s}" + "".join(f"{'|dL/dz_' + str(k) + '|':>11s}" for k in layers)
      + "".join(f"{'|dL/dW_' + str(k) + '|':>11s}" for k in layers))
for (act, name), (dz, dw) in norms.items():
    print(f"{act:5s} {name:10s}" + "".join(f"{dz[k - 1]:11.1e}" for k in layers)
          + "".join(f"{dw[k - 1]:11.1e}" for k in layers))

# %% [markdown]
# What to notice, in the gradient flowing down (the plot): with $\mathcal N(0, 0.01)$ it shrinks
# by a constant factor per layer until it is gone (vanishing); with $\mathcal N(0, 1)$ it grows by
# about $\sqrt{64/2} \approx 5.7$ per ReLU layer to $10^{14}$ (exploding), while with tanh it grows more
# slowly because saturated units pass little gradient. Xavier
# ($\mathrm{Var}\,W = 2/(\text{fan}_\text{in} + \text{fan}_\text{out})$) keeps tanh steady but loses
# ReLU's signal by $\sqrt 2$ per layer, since ReLU zeroes half the units; Kaiming
# ($\mathrm{Var}\,W = \text{gain}^2/\text{fan}_\text{in}$, gain $\sqrt 2$ for ReLU) compensates.
# The weight gradients (table, right) multiply that signal by the forward activations $h_{k-1}$,
# which move the other way: with ReLU a bad scale makes every layer's weight gradient absurd,
# $10^{15}$ or $10^{-23}$ where Kaiming gives values between 1 and 30; with tanh and
# $\mathcal N(0, 1)$ the first layer gets a million times the gradient of the last.
#
# ## 2. Gradient clipping
# Even with a good initialisation one bad step can blow training up: a large gradient times the
# learning rate throws the weights to a region with still larger gradients. Clipping rescales all
# gradients together when their joint norm exceeds a threshold; the direction is kept, only
# the step length is bounded. Here is a 10-layer ReLU net (Kaiming init) trained with SGD and
# momentum at a learning rate that is slightly too large, with and without
# `nn.utils.clip_grad_norm_(params, 1.0)`.

# %%
minigrad.manual_seed(1)
X = minigrad.randn(256, 32, dtype=minigrad.float64)  # float64: the runs print the same on every CPU
Y = (X[:, :1] * X[:, 1:2]).sin()


def train(clip: float | None, steps: int = 100, watch=None) -> tuple[list[float], list[float]]:
    """Train the net; ``watch(net)``, if given, is called before the first step (section 5)."""
    minigrad.manual_seed(0)
    layers = []
    for _ in range(10):
        linear = nn.Linear(32, 32)
        nn.init.kaiming_normal_(linear.weight, nonlinearity="relu")
        layers += [linear, nn.ReLU()]
    net = nn.Sequential(*layers, nn.Linear(32, 1)).double()
    if watch is not None:
        watch(net)
    opt = minigrad.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    losses, grad_norms = [], []
    with np.errstate(all="ignore"):  # the unclipped run overflows, on purpose
        for _ in range(steps):
            loss = nn.functional.mse_loss(net(X), Y)
            opt.zero_grad()
            loss.backward()
            if clip is not None:
                grad_norms.append(nn.utils.clip_grad_norm_(net.parameters(), clip).item())
            losses.append(loss.item())
            opt.step()
    return losses, grad_norms


plain, _ = train(None)
clipped, grad_norms = train(1.0)
print(f"gradient norm before clipping: {grad_norms[0]:.1f} at step 0, median {np.median(grad_norms):.2f}")
print(f"without clipping: the loss is not finite from step {int(np.argmax(~np.isfinite(plain)))} on; "
      f"with clipping: final loss {clipped[-1]:.3f}")

fig, ax = plt.subplots(figsize=(6, 3.2))
ax.semilogy(plain, label="no clipping")
ax.semilogy(clipped, label="clip_grad_norm_(1.0)")
ax.set_xlabel("step")
ax.set_ylabel("MSE loss")
ax.legend()
plt.show()

# %% [markdown]
# Without clipping the loss jumps by orders of magnitude, overflows to `inf` and then `nan` (the line stops);
# with clipping the same model, data and learning rate train smoothly.
#
# ## 3. The `eps` in LayerNorm
# LayerNorm divides by the standard deviation of each row: $\hat x = (x - \mu)/\sqrt{\sigma^2 + \varepsilon}$.
# A constant row (a padding token, a dead feature vector) has $\sigma^2 = 0$. With $\varepsilon = 0$:

# %%
x = minigrad.tensor([[1.0, 2.0, 3.0, 4.0],
                     [5.0, 5.0, 5.0, 5.0]])     # the second row is constant
no_eps = nn.LayerNorm(4, eps=0.0)
with np.errstate(all="ignore"):
    out = no_eps(x)
    (out * minigrad.tensor([1.0, 2.0, 3.0, 4.0])).sum().backward()
print(out)
print("weight.grad:", no_eps.weight.grad)

# %% [markdown]
# The constant row gives $0/0 = $ `nan`, and the `nan` does not stay in its row: the weight's
# gradient sums over the batch, so one bad row poisons the update of the whole layer. After one
# optimizer step even the healthy row comes out as `nan`:

# %%
minigrad.optim.SGD(no_eps.parameters(), lr=0.1).step()
print("first row after one SGD step:", no_eps(x[:1]))

# %% [markdown]
# Anomaly mode finds the op that made the first `nan`:

# %%
with np.errstate(all="ignore"), minigrad.autograd.detect_anomaly():
    try:
        no_eps(x)
    except AnomalyError as e:
        print(str(e).split(" at ")[0])

# %% [markdown]
# The default $\varepsilon = 10^{-5}$ fixes it: the constant row normalises to zeros and the
# gradients are finite.

# %%
with_eps = nn.LayerNorm(4)                           # eps=1e-5
out = with_eps(x)
(out * minigrad.tensor([1.0, 2.0, 3.0, 4.0])).sum().backward()
print(out)
print("weight.grad:", with_eps.weight.grad)

# %% [markdown]
# ## 4. Log-sum-exp
# Softmax is $e^{z_i} / \sum_j e^{z_j}$. In float32, $e^{z}$ overflows to `inf` for $z > 88.7$,
# and logits of a few hundred are ordinary in a badly scaled network:

# %%
z = minigrad.tensor([1000.0, 999.0, 998.0])
with np.errstate(all="ignore"):
    naive_softmax = z.exp() / z.exp().sum()
    naive_logsumexp = z.exp().sum().log()
print("naive softmax:        ", naive_softmax)
print("naive log(sum(exp)):  ", naive_logsumexp)

# %% [markdown]
# The fix is an identity: for any constant $m$,
# $\log \sum_j e^{z_j} = m + \log \sum_j e^{z_j - m}$ and $\operatorname{softmax}(z) = \operatorname{softmax}(z - m)$.
# With $m = \max_j z_j$ every exponent is $\le 0$, so nothing overflows, and the largest term is
# exactly 1, so the sum cannot underflow to 0 either.

# %%
m = z.max()
print("shifted by the max:   ", (z - m).exp() / (z - m).exp().sum(), " ", m + (z - m).exp().sum().log())
print("minigrad softmax:     ", nn.functional.softmax(z, dim=0))
print("minigrad logsumexp:   ", minigrad.ops.logsumexp(z, dim=0))
print("minigrad log_softmax: ", nn.functional.log_softmax(z, dim=0))

# %% [markdown]
# This is why `cross_entropy` takes logits and computes `log_softmax` internally, never
# `log(softmax(z))`: the log of a probability that underflowed to 0 is `-inf`, while log-softmax
# is just $z_i - \operatorname{logsumexp}(z)$ and stays finite.

# %%
far = minigrad.tensor([0.0, -200.0])
with np.errstate(divide="ignore"):
    print("log(softmax):", nn.functional.softmax(far, dim=0).log(), "  log_softmax:", nn.functional.log_softmax(far, dim=0))

# %% [markdown]
# ## 5. Watching a run with hooks
# The loss curve says *that* a run went wrong, not *where*. Hooks see inside without changing the
# model: a **forward hook** on a module, `hook(module, args, output)`, runs after each forward and
# can record statistics of the output; a **tensor hook**, `output.register_hook(fn)`, runs when that
# tensor's gradient is computed in backward. Registered on every `Linear`, they record, at every
# step, the spread of each layer's output $z_k$ and the norm of $\partial L/\partial z_k$. Here are the
# two runs of section 2 again, watched.

# %%
class Monitor:
    """Per-layer statistics, one value per step: std of each Linear's output and the norm of its gradient."""

    def __init__(self) -> None:
        self.activation_std, self.gradient_norm = {}, {}

    def __call__(self, net: nn.Module) -> None:
        for name, module in net.named_modules():
            if isinstance(module, nn.Linear):
                self.activation_std[name], self.gradient_norm[name] = [], []
                module.register_forward_hook(self.forward_hook(name))

    def forward_hook(self, name):
        def hook(module, args, output):
            self.activation_std[name].append(float(output.detach().numpy().std()))
            output.register_hook(lambda grad: self.gradient_norm[name].append(float(np.linalg.norm(grad.numpy()))))
        return hook


watched = {"no clipping": Monitor(), "clip_grad_norm_(1.0)": Monitor()}
with np.errstate(all="ignore"):
    train(None, steps=15, watch=watched["no clipping"])
    train(1.0, steps=15, watch=watched["clip_grad_norm_(1.0)"])

fig, axes = plt.subplots(2, 2, figsize=(10, 5), sharex=True, sharey=True)
for col, (title, monitor) in enumerate(watched.items()):
    for row, (what, stats) in enumerate((("std of z_k", monitor.activation_std),
                                         ("norm of dL/dz_k", monitor.gradient_norm))):
        with np.errstate(all="ignore"):
            image = np.log10(np.array(list(stats.values())))
        image[~np.isfinite(image)] = np.nan  # overflowed: drawn blank
        shown = axes[row, col].imshow(image, aspect="auto", cmap="viridis", vmin=-1, vmax=15)
        axes[row, col].set_title(f"{title}: log10 {what}", fontsize=10)
    axes[1, col].set_xlabel("step")
for ax in axes[:, 0]:
    ax.set_ylabel("layer (0 = input side)")
fig.colorbar(shown, ax=axes, shrink=0.8)
plt.show()

# %% [markdown]
# Without clipping, the damage is done in three updates. At step 2 the outputs of the deeper layers
# are already ten to forty times wider than at the start; at step 3 the gradient is $10^{13}$ at the
# output and $10^{26}$ at the input side, and the activations grow by an order of magnitude per
# layer, from 3 to $10^{14}$; from step 4 on everything overflows (blank). With clipping, no
# statistic of any layer changes by more than a factor of twenty over the run (the colour scale is clipped at
# $10^{15}$). Per-layer statistics like these show which layer goes first and when, which the loss
# cannot. In a long run one would log them (or histograms) every few hundred steps rather than
# every step, and remove the hooks afterwards: `register_forward_hook` returns a handle whose
# `remove()` does that.
#
# ## Predict, then run
# 1. A 20-layer ReLU MLP with weights from $\mathcal N(0, 2/64)$ (width 64): does the gradient vanish,
#    explode, or stay roughly constant?
# 2. `clip_grad_norm_(params, 1.0)` on gradients whose joint norm is 0.5: what changes?
# 3. In float32, $\operatorname{softmax}([100, 0])$ computed naively: what comes out?

# %%
kaiming_by_hand = layer_grad_norms("relu", lambda w, act: nn.init.normal_(w, 0.0, np.sqrt(2 / WIDTH)))[0]
print(f"1. |dL/dz_1| / |dL/dz_20| = {kaiming_by_hand[0] / kaiming_by_hand[-1]:.1f}: roughly constant (this is Kaiming)")
w = nn.Parameter(minigrad.ones(4, dtype=minigrad.float64))
w.grad = minigrad.full((4,), 0.25, dtype=minigrad.float64)
nn.utils.clip_grad_norm_([w], 1.0)
print("2. gradient after clipping:", w.grad.numpy(), "(unchanged: clipping only ever shrinks)")
big = minigrad.tensor([100.0, 0.0])
with np.errstate(all="ignore"):
    print("3. naive float32 softmax:", big.exp() / big.exp().sum(), " shifted:", nn.functional.softmax(big, dim=0))
