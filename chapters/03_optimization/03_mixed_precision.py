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
# # 03.3 Mixed precision and loss scaling
#
# **Question:** float16 stores a number in 2 bytes instead of 4. What does it give up in range
# and precision, and how do `autocast` and loss scaling train a network with it anyway?
#
# On a GPU float16 matrix products run several times faster than float32 ones and every
# activation kept for backward takes half the memory. On a CPU with numpy only the memory half of
# that is true (section 2 says why), so this notebook keeps its float16 work tiny.
#
# **You will:** read float16's range and precision off its bits and see each limit break
# arithmetic; set bfloat16 beside it; see which ops `autocast` runs in float16 and which in float32, and measure the memory
# it saves; watch small gradients underflow and a loss scale rescue them; follow `GradScaler`'s
# scale through a training run.
# **Time:** about 34 minutes (33 reading, 19 s running).

# %%
import os

# One BLAS thread: the float32 products below give the same bits on every run (set before numpy).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import gc
import time

import matplotlib.pyplot as plt
import numpy as np

import minigrad
import minigrad.nn.functional as F
from minigrad import amp, memory, nn, optim
from minigrad.data import Digits

f16, f32 = minigrad.float16, minigrad.float32
train = Digits(train=True)
X_all = minigrad.tensor(train.data.reshape(len(train), -1))  # 1,437 images of 8x8 pixels, float32
Y_all = minigrad.tensor(train.targets)

# %% [markdown]
# ## 1. What float16 can represent
# A float16 has 1 sign bit, 5 exponent bits and 10 fraction bits; a float32 has 1, 8 and 23. The
# exponent bits set the range, the fraction bits the precision:

# %%
for name, dtype in (("float16", np.float16), ("float32", np.float32)):
    fi = np.finfo(dtype)
    print(f"{name}: largest {float(fi.max):.6g}   smallest normal {float(fi.smallest_normal):.3g}   "
          f"smallest subnormal {float(fi.smallest_subnormal):.3g}   spacing at 1.0 {float(fi.eps):.3g}")

# %% [markdown]
# Each of these limits shows up as arithmetic that silently goes wrong (numpy warns about the
# overflow; the warning is switched off here since the overflow is the point):

# %%
with np.errstate(over="ignore"):
    examples = {
        "1 + 0.0004 (below half the spacing at 1)": minigrad.tensor([1.0], dtype=f16) + 0.0004,
        "2049 (integers above 2048 are not all there)": minigrad.tensor([2049.0], dtype=f16),
        "60000 * 2 (past 65504)": minigrad.tensor([60000.0], dtype=f16) * 2,
        "1e-8 (below the smallest subnormal)": minigrad.tensor([1e-8], dtype=f16),
        "1e-6 (subnormal: the nearest is 17 * 2**-24)": minigrad.tensor([1e-6], dtype=f16),
    }
for what, t in examples.items():
    print(f"{what:46s} -> {t.item()!r}")

# %% [markdown]
# Between two powers of two a float has a fixed number of evenly spaced values (1,024 for
# float16), so the gap between neighbours grows with the magnitude and the *relative* precision is
# constant, about $10^{-3}$ for float16. Below the smallest normal number the exponent cannot get
# smaller: the subnormal numbers keep the gap fixed at $2^{-24} \approx 6 \times 10^{-8}$, so they
# lose relative precision until nothing is left.

# %%
mags = np.logspace(-9, 5, 600)
fig, ax = plt.subplots(figsize=(8, 3.4))
for dtype, color in ((np.float16, "tab:red"), (np.float32, "tab:blue")):
    fi = np.finfo(dtype)
    m = mags[(mags >= float(fi.smallest_subnormal)) & (mags <= float(fi.max))]
    gap = np.spacing(m.astype(dtype)).astype(np.float64)
    ax.loglog(m, gap / m, color=color, label=np.dtype(dtype).name)
fi = np.finfo(np.float16)
ax.axvspan(1e-9, float(fi.smallest_subnormal), color="tab:red", alpha=0.12, label="float16: rounds to 0")
ax.axvspan(float(fi.smallest_subnormal), float(fi.smallest_normal), color="tab:orange", alpha=0.12,
           label="float16: subnormal")
ax.axvspan(float(fi.max), 1e5, color="tab:gray", alpha=0.2, label="float16: overflows to inf")
ax.set_xlabel("magnitude |x|")
ax.set_ylabel("gap to the next float / |x|")
ax.set_title("Relative precision")
ax.legend(fontsize=8, loc="upper right")
plt.tight_layout()
plt.show()

# %% [markdown]
# So float16 is fine for values between about $10^{-4}$ and $10^{4}$ that tolerate a relative
# error of $10^{-3}$, such as activations and weights in a matrix product. It is not fine for a
# sum of thousands of terms (each addition loses $10^{-3}$), for `exp` (which overflows past
# $e^{11}$), or for small gradients, as section 3 shows.
#
# ### bfloat16: float32's range, less precision
# bfloat16 ("brain float", TPUs, and GPUs since NVIDIA's A100) splits the same 16 bits the other
# way: 1 sign, 8 exponent and 7 fraction bits. It is the top half of a float32, so converting is
# dropping the low 16 bits, rounded to nearest even. numpy has no bfloat16; that is enough to
# emulate it (the `ml_dtypes` package, where installed, implements the real type and agrees).

# %%
def to_bfloat16(x):
    """Round float32 values to the nearest bfloat16 (ties to even), returned as float32."""
    bits = np.atleast_1d(np.asarray(x, dtype=np.float32)).view(np.uint32)
    bits = bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))  # round the 16 bits we drop
    return (bits & np.uint32(0xFFFF0000)).view(np.float32)


def bf16_from_bits(b):
    return float(np.array([b << 16], dtype=np.uint32).view(np.float32)[0])


samples = np.float32([1.0, 1.0 + 2**-8, 257.0, 1e-8, 120000.0, 3e38, -0.1])
try:  # a check only where the real type exists; it adds no dependency
    import ml_dtypes
    assert np.array_equal(to_bfloat16(samples), samples.astype(ml_dtypes.bfloat16).astype(np.float32))
except ImportError:
    pass
limits = {"float16": (float(np.finfo(np.float16).max), float(np.finfo(np.float16).smallest_normal),
                      float(np.finfo(np.float16).eps)),
          "bfloat16": (bf16_from_bits(0x7F7F), bf16_from_bits(0x0080), bf16_from_bits(0x3F81) - 1.0),
          "float32": (float(np.finfo(np.float32).max), float(np.finfo(np.float32).smallest_normal),
                      float(np.finfo(np.float32).eps))}
print(f"{'':9} {'largest':>9} {'smallest normal':>16} {'spacing at 1.0':>15}")
for name, (big, tiny, eps) in limits.items():
    print(f"{name:9} {big:9.3g} {tiny:16.3g} {eps:15.3g}")
with np.errstate(over="ignore"):
    for what, x in (("1 + 2**-8", 1.0 + 2**-8), ("257", 257.0), ("60000 * 2", 120000.0), ("1e-8", 1e-8)):
        print(f"{what:10} float16 {np.float16(x).item()!r:12} bfloat16 {to_bfloat16(x)[0].item()!r}")

# %% [markdown]
# bfloat16 reaches $3 \times 10^{38}$ and down to $10^{-38}$, as float32 does, but its spacing at
# 1.0 is $2^{-7}$, eight times float16's: about 2 significant digits, and integers are exact only
# up to 256. So it trades precision for range. That is why it needs no loss scaling: the
# gradients that fall below float16's $6 \times 10^{-8}$ in section 3 are ordinary bfloat16
# numbers, and nothing overflows that would not overflow in float32. Its coarse spacing still
# needs float32 master weights (an update of $10^{-3}$ to a weight of 1 is lost), and float32
# sums. minigrad's autocast and `GradScaler` work in float16, since numpy has no bfloat16.
#
# ## 2. autocast: each op in the precision it tolerates
# Inside `minigrad.autocast()` matrix products and convolutions get float16 inputs, while
# reductions, `exp`, `log`, softmax, the losses and the normalisations get float32 inputs; any
# other op runs in the widest dtype among its inputs. Each op's class declares which (`autocast = "low"`
# or `"fp32"`, beside its forward):

# %%
print("float16:", sorted(op.__name__ for op in minigrad.ops.all_ops() if op.autocast == "low"))
print("float32:", sorted(op.__name__ for op in minigrad.ops.all_ops() if op.autocast == "fp32"))

# %% [markdown]
# The parameters stay float32 (the "master weights"): autocast casts them to float16 on the way
# into a `Linear`, and because the cast is an ordinary differentiable op, the gradient comes back
# through it and arrives at the parameter in float32.

# %%
minigrad.manual_seed(0)
mlp = nn.Sequential(nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 10))
x, y = X_all[:8], Y_all[:8]
with minigrad.autocast():
    h = mlp[0](x)
    a = mlp[1](h)
    logits = mlp[2](a)
    loss = F.cross_entropy(logits, y)
loss.backward()
for name, t in (("input", x), ("Linear output", h), ("Tanh output", a), ("logits", logits), ("loss", loss),
                ("weight", mlp[0].weight), ("weight.grad", mlp[0].weight.grad)):
    print(f"{name:14s} {str(t.dtype):16s} {tuple(t.shape)}")

# %% [markdown]
# What that buys on a CPU is memory. The tracker (03.2) counts the bytes the graph holds after the
# forward pass of a tanh MLP, beyond the parameters and data that were alive before:

# %%
def graph_bytes(mixed: bool, width: int = 64, depth: int = 8, batch: int = 1024) -> int:
    minigrad.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.Tanh()]
    model = nn.Sequential(*layers, nn.Linear(width, 10))
    x = minigrad.randn(batch, width)
    gc.collect()
    with memory.track() as mem:
        with minigrad.autocast(enabled=mixed):
            loss = F.cross_entropy(model(x), Y_all[:batch])
        held = mem.current - mem.start
    return held


full, mixed = graph_bytes(False), graph_bytes(True)
print(f"float32 graph: {full:,} bytes; autocast graph: {mixed:,} bytes ({mixed / full:.1%})")

# %% [markdown]
# A little more than half: the activations are exactly half as large, but backward also needs
# float16 copies of the weights and of the input batch (PyTorch keeps the same copies). The
# benchmark `benchmarks/bench_amp.py` measures this for larger models.
#
# And time? numpy has no optimised (BLAS) kernel for float16 matrix products: it runs a plain
# loop that converts every operand, so on a CPU a float16 product is about a hundred times
# *slower* than a float32 one. GPUs have float16 units (tensor cores) that make it several times
# faster. The measurement changes from machine to machine, so this cell's output is not checked:

# %%
# NBVAL_IGNORE_OUTPUT
a32 = np.random.default_rng(0).standard_normal((128, 128)).astype(np.float32)
a16 = a32.astype(np.float16)
for a in (a32, a16):
    start = time.perf_counter()
    for _ in range(5):
        a @ a
    print(f"128 x 128 matmul in {a.dtype}: {(time.perf_counter() - start) / 5 * 1e3:.2f} ms")

# %% [markdown]
# ## 3. Small gradients fall off the bottom
# Backward rules run in the dtypes their forward used, so the gradient flowing back through a
# float16 activation is float16 too. How small are those gradients? A 6-layer tanh MLP on 1,024
# digits, its cross-entropy averaged over the batch: we keep the gradient at the output of every
# `Linear` (with `retain_grad`), once in float32 as the reference and once under autocast.

# %%
minigrad.manual_seed(0)
LAYERS = [nn.Linear(64, 64) for _ in range(5)] + [nn.Linear(64, 10)]
xb, yb = X_all[:1024], Y_all[:1024]


def linear_output_grads(mixed: bool, loss_scale: float = 1.0) -> list[np.ndarray]:
    """The gradient of the loss at each Linear's output, divided by ``loss_scale`` again."""
    outputs = []
    with minigrad.autocast(enabled=mixed):
        h = xb
        for i, layer in enumerate(LAYERS):
            z = layer(h)
            z.retain_grad()
            outputs.append(z)
            h = z.tanh() if i < len(LAYERS) - 1 else z
        loss = F.cross_entropy(h, yb)
    for layer in LAYERS:
        layer.zero_grad()
    (loss * loss_scale).backward()
    return [z.grad.numpy().astype(np.float64) / loss_scale for z in outputs]


reference = linear_output_grads(False)
print("median |gradient| at each Linear's output (float32):",
      "  ".join(f"{np.median(np.abs(g)):.1e}" for g in reference))

# %% [markdown]
# The gradients shrink on their way back, and near the input most of them are below float16's
# smallest *normal* number, $6 \times 10^{-5}$. The histogram of the first layer's gradients
# shows where they land in float16, before and after multiplying the loss by $2^{10}$ (the
# gradients scale with it: backward is linear in the incoming gradient).

# %%
fi = np.finfo(np.float16)
bins = np.arange(-36, 4, 0.5)
fig, axes = plt.subplots(1, 2, figsize=(10, 3.2), sharey=True)
for ax, scale in zip(axes, (1.0, 2.0**10)):
    g = np.abs(reference[0]) * scale
    ax.hist(np.log2(g[g > 0]), bins=bins, color="tab:blue")
    ax.axvspan(bins[0], np.log2(float(fi.smallest_subnormal)), color="tab:red", alpha=0.15, label="rounds to 0")
    ax.axvspan(np.log2(float(fi.smallest_subnormal)), np.log2(float(fi.smallest_normal)), color="tab:orange",
               alpha=0.15, label="subnormal")
    ax.set_xlabel("log2 |gradient|")
    ax.set_title("loss as is" if scale == 1 else "loss x 2**10")
axes[0].set_ylabel("entries of dL/dz_1")
axes[0].legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# What actually happens to them, per layer, comparing autocast's float16 gradients with the
# float32 reference: the share flushed to zero, the share left subnormal, and the share off by
# more than 1%.

# %%
def damage(loss_scale: float) -> None:
    grads = linear_output_grads(True, loss_scale)
    print(f"loss x {loss_scale:g}:")
    for k, (g, r) in enumerate(zip(grads, reference), start=1):
        zero = np.mean((g == 0) & (r != 0))
        subnormal = np.mean((np.abs(g * loss_scale) < float(fi.smallest_normal)) & (g != 0))
        off = np.mean(np.abs(g - r) > 0.01 * np.abs(r))
        print(f"  layer {k}: {zero:6.1%} zero  {subnormal:6.1%} subnormal  {off:6.1%} off by >1%")


damage(1.0)
damage(2.0**10)

# %% [markdown]
# Without scaling, a third of the first layer's gradients are more than 1% wrong and some are
# zero; multiplying the loss by 1,024 moves them (nearly) all into the normal range. The few
# percent that remain off come from float16's rounding in the forward and backward products,
# which no scale changes.
#
# With a kernel, the slider re-runs this backward with the loss multiplied by the power of two you
# pick: watch the first layer's errors fall as the scale grows, and every gradient turn to `inf`
# once the largest passes 65504 (from $2^{27}$ on, here).

# %%
# NBVAL_IGNORE_OUTPUT
from minigrad.examples.controls import control, loss_scale

control(loss_scale, "log2(scale)", list(range(0, 31)), 10)

# %% [markdown]
#
# When the gradients are smaller still, all of them vanish and training stops. A linear
# regression whose loss carries a weight of $10^{-8}$, as a small auxiliary term might: the
# gradient reaching the float16 product is about $10^{-9}$, below the smallest subnormal. Three
# runs of 30 SGD steps: float32, autocast alone, autocast with a `GradScaler`.

# %%
rng = np.random.default_rng(0)
xr = minigrad.tensor(rng.standard_normal((64, 8)).astype(np.float32))
target = xr @ minigrad.tensor(rng.standard_normal((8, 1)).astype(np.float32))


def regression(mixed: bool, scaled: bool, steps: int = 30) -> tuple[list[float], nn.Parameter]:
    w = nn.Parameter(minigrad.zeros(8, 1))
    opt = optim.SGD([w], lr=1e7)  # a step of 0.1 on the unweighted loss
    scaler = minigrad.GradScaler(enabled=scaled)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        with minigrad.autocast(enabled=mixed):
            loss = F.mse_loss((xr @ w).float(), target)
        losses.append(loss.item())
        scaler.scale(loss * 1e-8).backward()
        scaler.step(opt)
        scaler.update()
    return losses, w


runs = {"float32": regression(False, False), "autocast": regression(True, False),
        "autocast + GradScaler": regression(True, True)}
fig, ax = plt.subplots(figsize=(6, 3))
for (name, (losses, _)), style in zip(runs.items(), ("k--", "tab:orange", "tab:green")):
    ax.semilogy(losses, style, label=name, zorder=3 if name == "float32" else 2)
ax.set_xlabel("step")
ax.set_ylabel("loss (unweighted)")
ax.legend()
plt.tight_layout()
plt.show()
for name, (losses, w) in runs.items():
    print(f"{name:22s} loss fell {losses[0] / losses[-1]:7.0e}x; weight gradient all zero: {not w.grad.numpy().any()}")

# %% [markdown]
# Under autocast alone the weight gradient is exactly zero at every step and the weights never
# move. The scaler multiplies the loss by $2^{16}$ before backward, which lifts the gradient into
# float16's range, and divides the float32 gradients at the parameters by the same factor before
# the step: the update is the float32 one (the green curve lies under the dashed float32 one).
#
# ## 4. The scale, over a training run
# Too small a scale lets gradients underflow; too large a scale makes them overflow to `inf`.
# The right value changes as training goes, so `GradScaler` adapts it: a step whose gradients hold
# an `inf` or `nan` is skipped and the scale halved; after `growth_interval` clean steps in a row
# the scale doubles. (PyTorch's defaults, which minigrad copies, are a start at $2^{16}$ and
# 2,000 clean steps before growing; here we start too high at $2^{24}$ and grow after 10 steps to
# see several cycles in 200 steps.) A small MLP on the digits, batches of 64:

# %%
def train_digits(mixed: bool, steps: int = 200) -> dict[str, list]:
    minigrad.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 10))
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = minigrad.GradScaler(init_scale=2.0**24, growth_interval=10, enabled=mixed)
    order = np.random.default_rng(0)
    log = {"loss": [], "scale": [], "skipped": []}
    for _ in range(steps):
        idx = minigrad.tensor(order.integers(0, len(train), 64))
        opt.zero_grad()
        with minigrad.autocast(enabled=mixed):
            loss = F.cross_entropy(model(X_all[idx]), Y_all[idx])
        log["scale"].append(scaler.get_scale())
        scaler.scale(loss).backward()
        before = model[0].weight.detach().numpy().copy()
        scaler.step(opt)
        log["skipped"].append(np.array_equal(before, model[0].weight.detach().numpy()))
        scaler.update()
        log["loss"].append(loss.item())
    return log


with np.errstate(over="ignore", invalid="ignore"):  # the overflows are expected: the scaler sees them
    logs = {"float32": train_digits(False), "autocast + GradScaler": train_digits(True)}

mixed_log = logs["autocast + GradScaler"]
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.3))
steps = np.arange(len(mixed_log["scale"]))
skipped = np.array(mixed_log["skipped"])
ax1.step(steps, np.log2(mixed_log["scale"]), where="post")
ax1.plot(steps[skipped], np.log2(mixed_log["scale"])[skipped], "rx", label="step skipped (inf/nan)")
ax1.set_xlabel("step")
ax1.set_ylabel("log2(scale)")
ax1.set_title("GradScaler's scale")
ax1.legend()
for name, log in logs.items():
    ax2.plot(np.convolve(log["loss"], np.ones(10) / 10, mode="valid"), label=name)
ax2.set_xlabel("step")
ax2.set_ylabel("loss (moving average of 10)")
ax2.set_title("Training loss")
ax2.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# The first steps overflow and halve the scale until the gradients fit; after that the scale
# climbs one doubling per 10 clean steps until a step overflows, and falls back: a saw-tooth just
# under the largest scale the gradients tolerate. The skipped steps cost a little progress, and
# the loss follows the float32 run closely.
#
# **What to remember:** float16 keeps about 3 significant digits between $6 \times 10^{-5}$ and
# 65504. `autocast` uses it where rounding averages out (matrix products) and float32 where it
# would not (sums, exponentials, losses), with float32 master weights; `GradScaler` shifts the
# gradients into float16's range and adapts the shift as training goes. On a CPU it saves memory
# only; `benchmarks/bench_amp.py` measures both sides.

# %% [markdown]
# ## Predict, then run
# 1. Near 1,000 the float16 values are 0.5 apart. What is `1000 + 0.3` in float16?
# 2. The largest gradient of a model is 3.0 with the loss unscaled. What is the largest power of
#    two the loss can be multiplied by before that gradient overflows in float16?
# 3. Section 2's autocast graph held a little more than half the float32 graph's bytes at a
#    batch of 1,024. At a batch of 256, is the ratio nearer to one half, or farther from it?

# %%
print("1. float16 1000 + 0.3 =", (minigrad.tensor([1000.0], dtype=f16) + 0.3).item(),
      "(the nearest float16 to 1000.3)")
with np.errstate(over="ignore"):
    fits = [k for k in range(24) if np.isfinite((minigrad.tensor([3.0], dtype=f16) * 2.0**k).item())]
print(f"2. largest scale: 2**{max(fits)} (3 * 2**{max(fits)} = {3 * 2**max(fits)} <= 65504 < {3 * 2**(max(fits) + 1)})")
for batch in (256, 1024):
    print(f"3. batch {batch}: autocast graph / float32 graph = "
          f"{graph_bytes(True, batch=batch) / graph_bytes(False, batch=batch):.1%}")
print("   farther at 256: the float16 copies of the weights are the same size at any batch, so they weigh more",
      "against smaller activations")
