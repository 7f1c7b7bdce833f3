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
# # Chapter 03 exercises: memory, mixed precision, profiling
#
# Nine exercises on the ideas of 03.2-03.4. Write your code where it says
# `raise NotImplementedError`, then run the check cell below it: it compares your answer with
# minigrad's own implementation or with known values, and fails with a message if it is wrong.
# Exercises 4 and 9 are "predict, then measure": write down your guess before you run anything,
# then let the measurement tell you how far off it was. The exercises are independent; do them in
# any order (run the setup cell first).

# %%
import gc
import math

import numpy as np

import minigrad
import minigrad.nn.functional as F
from minigrad import memory, nn, optim
from minigrad.autograd import Function
from minigrad.course import answer
from minigrad.profiler import Event, profile

minigrad.manual_seed(0)

# %% [markdown]
# ## Exercise 1: the bytes each layer keeps
# Run the layers of a `Sequential` one after another on `x` inside `memory.track()`, and return,
# for each layer, how many bytes of tensor data its call left alive (the tracker's `current`
# after the call minus before it). Keep every layer's output referenced until the end, as the
# graph does.

# %%
# Exercise 1: The bytes each layer keeps
def bytes_kept_per_layer(model: nn.Sequential, x: minigrad.Tensor) -> list[int]:
    gc.collect()
    ### BEGIN SOLUTION
    kept = []
    with memory.track() as mem:
        h = x
        for layer in model:
            before = mem.current
            h = layer(h)
            kept.append(mem.current - before)
    return kept
    ### END SOLUTION

# %%
# Check 1
minigrad.manual_seed(1)
mlp = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 8), nn.Tanh(), nn.Flatten(), nn.Linear(8, 4))
got = answer(bytes_kept_per_layer(mlp, minigrad.randn(10, 16)))
expected = [10 * 32 * 4, 0, 10 * 8 * 4, 0, 0, 10 * 4 * 4]  # tanh frees the Linear output it replaces
assert got == expected, f"expected {expected}, got {got}"
print("Check 1 passed")

# %% [markdown]
# ## Exercise 2: a checkpointed segment as a custom `Function`
# Write the two halves of gradient checkpointing for a segment `fn(*inputs)` that returns one
# tensor and reads no tensor other than its inputs. `forward` runs the segment without recording
# its graph (a custom `Function`'s forward already runs under `no_grad`) and keeps only the
# inputs. `backward` runs the segment again with grad enabled (`minigrad.enable_grad()`) on
# detached copies of the inputs and returns the gradients of its output with respect to them
# (`minigrad.grad`, with `grad` as the output's gradient): one per input, `None` for the
# non-tensor `fn`, and `None` for inputs that do not require grad.

# %%
# Exercise 2: A checkpointed segment
class CheckpointedSegment(Function):
    @staticmethod
    def forward(ctx, fn, *inputs):
        ### BEGIN SOLUTION
        ctx.fn = fn
        ctx.save_for_backward(*inputs)
        return fn(*inputs)
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        ### BEGIN SOLUTION
        inputs = [t.detach().requires_grad_(t.requires_grad) for t in ctx.saved_tensors]
        with minigrad.enable_grad():
            out = ctx.fn(*inputs)
        wanted = [t for t in inputs if t.requires_grad]
        grads = iter(minigrad.grad(out, wanted, grad))
        return (None, *[next(grads) if t.requires_grad else None for t in inputs])
        ### END SOLUTION

# %%
# Check 2
calls = [0]


def segment(x, w1, w2):
    calls[0] += 1
    return ((x @ w1).tanh() @ w2).tanh()


minigrad.manual_seed(2)
x2 = minigrad.randn(64, 32)
w1, w2 = minigrad.randn(32, 32, requires_grad=True), minigrad.randn(32, 32, requires_grad=True)
segment(x2, w1, w2).sum().backward()
expected = [w1.grad.numpy().copy(), w2.grad.numpy().copy()]
w1.grad = w2.grad = None


def run_checkpointed(function):
    """The bytes the forward keeps, how often backward runs the segment, and the gradients it gives."""
    gc.collect()
    with memory.track() as mem:
        out = function.apply(segment, x2, w1, w2)
        held = mem.current - mem.start
    calls[0] = 0
    out.sum().backward()
    return held, calls[0], [None if w.grad is None else w.grad.numpy() for w in (w1, w2)]


held, ran, grads = answer(run_checkpointed(CheckpointedSegment))
assert held == 64 * 32 * 4, f"after forward only the output (8,192 bytes) should be new, got {held:,} bytes"
assert ran == 1, f"backward should run the segment once, it ran {ran} times"
for name, g, e in (("w1", grads[0], expected[0]), ("w2", grads[1], expected[1])):
    assert g is not None, f"{name} got no gradient"
    assert np.allclose(g, e, rtol=1e-5, atol=1e-5), f"{name}: wrong gradient"
print("Check 2 passed")

# %% [markdown]
# ## Exercise 3: a float format from its bits
# A binary floating-point format with `e` exponent bits and `f` fraction bits (IEEE 754 style:
# exponent bias $2^{e-1} - 1$, the largest exponent value reserved for inf and nan, subnormal
# numbers below the smallest normal one) has a largest finite value, a smallest normal value, a
# smallest subnormal value and a spacing between 1 and the next number. Compute all four.

# %%
# Exercise 3: A float format from its bits
def float_limits(e: int, f: int) -> dict[str, float]:
    """Keys: "max", "smallest_normal", "smallest_subnormal", "eps"."""
    ### BEGIN SOLUTION
    bias = 2 ** (e - 1) - 1
    return {
        "max": (2 - 2.0**-f) * 2.0**bias,
        "smallest_normal": 2.0 ** (1 - bias),
        "smallest_subnormal": 2.0 ** (1 - bias - f),
        "eps": 2.0**-f,
    }
    ### END SOLUTION

# %%
# Check 3
for dtype, bits in ((np.float16, (5, 10)), (np.float32, (8, 23)), (np.float64, (11, 52))):
    fi, got = np.finfo(dtype), answer(float_limits(*bits))
    for key in ("max", "smallest_normal", "smallest_subnormal", "eps"):
        want = float(getattr(fi, key))
        assert got[key] == want, f"{fi.dtype} {key}: expected {want}, got {got[key]}"
bf16 = answer(float_limits(8, 7))  # bfloat16: float32's range, 3 significant digits fewer
assert bf16["max"] == 3.3895313892515355e38 and bf16["eps"] == 0.0078125, f"bfloat16: got {bf16}"
print("Check 3 passed")

# %% [markdown]
# ## Exercise 4: predict, then measure the loss scale the first layer needs
# Lesson 03.3 (section 3) found that under autocast most gradients at the first `Linear`'s output
# of a 6-layer tanh MLP fall below float16's smallest normal number, $2^{-14}$, and that scaling
# the loss by $2^{10}$ rescued nearly all of them. **Predict first:** the smallest power of two
# $2^k$ for which fewer than 1% of those gradient entries are zero or subnormal. Write your $k$
# in `PREDICTED_K`, then write `underflow_share(scale)`: run `mlp4_forward()` under
# `minigrad.autocast()`, multiply the loss by `scale`, run backward, and return the share of the
# entries of `z1.grad` whose absolute value is below $2^{-14}$ (zeros included). The check prints
# the measured curve.

# %%
minigrad.manual_seed(4)
MLP4 = [nn.Linear(64, 64) for _ in range(5)] + [nn.Linear(64, 10)]
X4, Y4 = minigrad.randn(256, 64), minigrad.randint(0, 10, (256,))


def mlp4_forward() -> tuple[minigrad.Tensor, minigrad.Tensor]:
    """``(z1, loss)``: the first Linear's output (its gradient kept by ``retain_grad``) and the loss."""
    z1 = MLP4[0](X4)
    z1.retain_grad()
    h = z1
    for layer in MLP4[1:]:
        h = layer(h.tanh())
    return z1, F.cross_entropy(h, Y4)

# %%
# Exercise 4: Predict, then measure the loss scale the first layer needs
PREDICTED_K = None  # your guess, an int, written before you measure


def underflow_share(scale: float) -> float:
    ### BEGIN SOLUTION
    with minigrad.autocast():
        z1, loss = mlp4_forward()
    (loss * scale).backward()
    return float(np.mean(np.abs(z1.grad.numpy().astype(np.float64)) < 2.0**-14))
    ### END SOLUTION

# %%
# Check 4
z1_reference, loss_reference = mlp4_forward()  # float32, no autocast
loss_reference.backward()
r4 = np.abs(z1_reference.grad.numpy().astype(np.float64))
ks = list(range(17))
shares = answer([underflow_share(2.0**k) for k in ks])
for k, share in zip(ks, shares):
    expected = np.mean(r4 * 2.0**k < 2.0**-14)  # what float32's values would give, cast to float16
    assert abs(share - expected) < 0.05, f"scale 2**{k}: measured {share:.1%}, expected about {expected:.1%}"
    print(f"loss x 2**{k:2d}: {share:6.1%} of the first layer's gradients zero or subnormal")
assert all(a >= b for a, b in zip(shares, shares[1:])), f"a larger scale cannot underflow more: {shares}"
needed = next(k for k, share in zip(ks, shares) if share < 0.01)
print(f"measured: 2**{needed} is the smallest scale under 1%; you predicted 2**{answer(PREDICTED_K)}")

# %% [markdown]
# ## Exercise 5: the scaler's update rule
# After each step, `GradScaler.update()` changes the scale: if the step found an inf or nan, the
# scale is multiplied by `backoff_factor` and the count of clean steps restarts at 0; otherwise the
# count goes up by one, and when it reaches `growth_interval` the scale is multiplied by
# `growth_factor` and the count restarts at 0. The scale is kept in float32, so it never grows
# past float32's largest value (if the grown scale would be inf in float32, keep the old one).
# Return the new `(scale, count)`.

# %%
# Exercise 5: The scaler's update rule
def update_scale(scale: float, count: int, found_inf: bool, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000) -> tuple[float, int]:
    ### BEGIN SOLUTION
    if found_inf:
        return scale * backoff_factor, 0
    if count + 1 == growth_interval:
        grown = scale * growth_factor
        return (grown if grown <= float(np.finfo(np.float32).max) else scale), 0
    return scale, count + 1
    ### END SOLUTION

# %%
# Check 5
def scales(update, flags, init_scale, **kw):
    """The scale after each step, by the rule ``update``."""
    scale, count, out = init_scale, 0, []
    for bad in flags:
        scale, count = update(scale, count, bad, **kw)
        out.append(scale)
    return out


def compare(flags, init_scale, **kw):
    p = nn.Parameter(minigrad.zeros(1))
    opt = optim.SGD([p], lr=0.0)
    scaler = minigrad.GradScaler(init_scale=init_scale, **kw)
    scaler.scale(minigrad.tensor(1.0))  # the first scale() starts the scaler
    got = answer(scales(update_scale, flags, init_scale, **kw))
    assert len(got) == len(flags), f"expected {len(flags)} scales, got {len(got)}"
    for i, (bad, scale) in enumerate(zip(flags, got)):
        p.grad = minigrad.tensor([math.inf if bad else 1.0])
        scaler.step(opt)
        scaler.update()
        want = scaler.get_scale()
        assert scale == want, f"after flags {flags[:i + 1]}: expected scale {want}, got {scale}"


compare([False] * 7 + [True] + [False] * 4 + [True, True] + [False] * 6, 2.0**16, growth_interval=3)
compare([False, True, False, False, False], 1024.0, growth_factor=4.0, backoff_factor=0.25, growth_interval=2)
compare([False] * 4, 2.0**127, growth_interval=2)  # 2**128 would be inf in float32
print("Check 5 passed")

# %% [markdown]
# ## Exercise 6: a loss-scaled step by hand
# Do what `scaler.scale(loss).backward(); scaler.step(opt)` does for plain SGD with a fixed
# `scale`: backpropagate `loss * scale`, divide the gradients by `scale`, and update each
# parameter `p -= lr * grad` in place (under `minigrad.no_grad()`), unless a gradient is inf or nan,
# in which case leave the parameters alone. Return whether the step was taken. The parameters'
# `.grad` are `None` on entry.

# %%
# Exercise 6: A loss-scaled step by hand
def scaled_sgd_step(params: list, loss: minigrad.Tensor, scale: float, lr: float) -> bool:
    ### BEGIN SOLUTION
    (loss * scale).backward()
    grads = [p.grad / scale for p in params]
    if any(not np.isfinite(g.numpy()).all() for g in grads):
        return False
    with minigrad.no_grad():
        for p, g in zip(params, grads):
            p.sub_(g, alpha=lr)
    return True
    ### END SOLUTION

# %%
# Check 6
rng = np.random.default_rng(6)
x6 = minigrad.tensor(rng.standard_normal((32, 4)).astype(np.float32))
t6 = x6 @ minigrad.tensor(rng.standard_normal((4, 1)).astype(np.float32))


def loss_of(w):
    with minigrad.autocast():  # float16 product: unscaled, these gradients would underflow
        return F.mse_loss((x6 @ w).float(), t6) * 1e-8


def run_steps(step):
    """Five finite steps, then one that overflows: whether each was taken, the weights after 5 and after 6."""
    mine = nn.Parameter(minigrad.zeros(4, 1))
    taken = []
    for _ in range(5):
        mine.grad = None
        taken.append(step([mine], loss_of(mine), 2.0**16, 1e7))
    after = mine.detach().numpy().copy()
    mine.grad = None
    with np.errstate(over="ignore", invalid="ignore"):
        taken.append(step([mine], loss_of(mine) * 1e12, 2.0**16, 1e7))  # overflows in float16
    return taken, after, mine.detach().numpy()


taken, got, final = answer(run_steps(scaled_sgd_step))
ref = nn.Parameter(minigrad.zeros(4, 1))
opt = optim.SGD([ref], lr=1e7)
scaler = minigrad.GradScaler(init_scale=2.0**16, growth_interval=10**6)
for step in range(5):
    assert taken[step] is True, "a finite step must be taken"
    opt.zero_grad()
    scaler.scale(loss_of(ref)).backward()
    scaler.step(opt)
    scaler.update()
assert got.any(), "the weights did not move: were the gradients scaled?"
expected = ref.detach().numpy()
assert np.allclose(got, expected, rtol=1e-6), f"expected\n{expected}\ngot\n{got}"
assert taken[5] is False and np.array_equal(final, got), "an overflowing step must be skipped"
print("Check 6 passed")

# %% [markdown]
# ## Exercise 7: the most expensive op
# A profile's `events` are `Event` records with a `name`, a `phase` ("forward" or "backward") and
# a `self_ns` (time in the op itself, without the ops nested inside it). Sum the self time per
# `(name, phase)` and return the most expensive as `(name, phase, total self ns)`.

# %%
# Exercise 7: The most expensive op
def most_expensive(events: list[Event]) -> tuple[str, str, int]:
    ### BEGIN SOLUTION
    totals: dict[tuple[str, str], int] = {}
    for e in events:
        totals[e.name, e.phase] = totals.get((e.name, e.phase), 0) + e.self_ns
    (name, phase), ns = max(totals.items(), key=lambda kv: kv[1])
    return name, phase, ns
    ### END SOLUTION

# %%
# Check 7
def event(i, name, phase, self_ns, duration_ns=None, parent=1):
    return Event(i, name, phase, 0, duration_ns or self_ns, self_ns, 0, [], [], parent, int(parent is not None), 0)


made_up = [event(1, "step", "forward", 10, duration_ns=205, parent=None),  # contains the others
           event(2, "Matmul", "forward", 50), event(3, "Add", "forward", 30), event(4, "Add", "forward", 30),
           event(5, "Matmul", "backward", 40), event(6, "Add", "backward", 20), event(7, "Matmul", "backward", 25)]
got = answer(most_expensive(made_up))
assert got == ("Matmul", "backward", 65), f"expected ('Matmul', 'backward', 65), got {got}"
minigrad.manual_seed(7)
model7 = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
with profile() as prof:
    F.cross_entropy(model7(minigrad.randn(128, 64)), minigrad.randint(0, 10, (128,))).backward()
# the profile is measured where your code runs: its events cross with your answer, and the check sums them
events = answer([(e.name, e.phase, e.self_ns) for e in prof.events])
got = answer(most_expensive(prof.events))
totals = {}
for name, phase, ns in events:
    totals[name, phase] = totals.get((name, phase), 0) + ns
top = max(totals.items(), key=lambda kv: kv[1])
assert len(totals) > 3, f"a profile of a two-layer model's step records more than 3 kinds of op, got {totals}"
assert tuple(got) == (*top[0], top[1]), f"expected {(*top[0], top[1])}, got {got}"
print("Check 7 passed")

# %% [markdown]
# ## Exercise 8: one op instead of a loop
# `pairwise_sq_dists_loop` computes the squared distance between every row of `a` and every row
# of `b` with a Python loop, three ops per row of `a`. Write it without a loop, with broadcasting
# (index with `None` to add a dimension), so that the profiler counts at most 6 ops.

# %%
def pairwise_sq_dists_loop(a: minigrad.Tensor, b: minigrad.Tensor) -> minigrad.Tensor:
    return minigrad.stack([((a[i] - b) ** 2).sum(1) for i in range(a.shape[0])])


# %%
# Exercise 8: One op instead of a loop
def pairwise_sq_dists(a: minigrad.Tensor, b: minigrad.Tensor) -> minigrad.Tensor:
    ### BEGIN SOLUTION
    return ((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)
    ### END SOLUTION

# %%
# Check 8
minigrad.manual_seed(8)
a8, b8 = minigrad.randn(50, 3, requires_grad=True), minigrad.randn(20, 3)
def measured(fn):
    """fn(a8, b8), the ops the profiler counts in it, and the gradient of its sum with respect to a8."""
    with profile() as prof:
        out = fn(a8, b8)
    (grad,) = minigrad.grad(out.sum(), a8)
    return out.detach().numpy(), len([e for e in prof.events if e.depth == 0]), grad.numpy()


got, n_ops, g_got = answer(measured(pairwise_sq_dists))
expected = pairwise_sq_dists_loop(a8, b8)
assert tuple(got.shape) == (50, 20), f"expected shape (50, 20), got {tuple(got.shape)}"
assert np.allclose(got, expected.detach().numpy(), atol=1e-5), "wrong distances"
assert n_ops <= 6, f"expected at most 6 ops, the profiler counted {n_ops}"
(g_expected,) = minigrad.grad(expected.sum(), a8)
assert np.allclose(g_got, g_expected.numpy(), atol=1e-4), "wrong gradient"
print("Check 8 passed")

# %% [markdown]
# ## Exercise 9: predict, then measure what a per-sample loop costs
# Lesson 03.4 found a model whose first layer runs once per image: the profiler counted nearly two
# thousand op calls for a step of 128 images. **Predict first:** how many op calls does each extra
# image add to one forward and backward pass of `PerSampleMLP9` below, and how many does it add
# to `BatchedMLP9`'s? Write both in `PREDICTED_PER_IMAGE`, then write `op_calls(model, batch)`:
# reset the model's gradients to None (`model.zero_grad()`), then return how many op calls the
# profiler records for the cross-entropy of `model(X9[:batch])` with `Y9[:batch]` and its
# backward. The check fits the counts at several batch sizes.

# %%
class PerSampleMLP9(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        return self.fc2(minigrad.stack([self.fc1(x[i]).relu() for i in range(len(x))]))


class BatchedMLP9(PerSampleMLP9):
    def forward(self, x):
        return self.fc2(self.fc1(x).relu())


minigrad.manual_seed(9)
X9, Y9 = minigrad.randn(64, 64), minigrad.randint(0, 10, (64,))

# %%
# Exercise 9: Predict, then measure what a per-sample loop costs
PREDICTED_PER_IMAGE = {"PerSampleMLP9": None, "BatchedMLP9": None}  # your guesses, before you measure


def op_calls(model: nn.Module, batch: int) -> int:
    ### BEGIN SOLUTION
    model.zero_grad()
    with profile() as prof:
        F.cross_entropy(model(X9[:batch]), Y9[:batch]).backward()
    return len(prof.events)
    ### END SOLUTION

# %%
# Check 9
batches = [4, 8, 16, 32]


def counts(fn, model):
    """fn's count at each batch size, then once more at batch 8."""
    return [fn(model, b) for b in batches], fn(model, 8)


predicted = answer(PREDICTED_PER_IMAGE)
for model in (PerSampleMLP9(), BatchedMLP9()):
    calls, again = answer(counts(op_calls, model))
    model.zero_grad()
    with profile() as prof:
        F.cross_entropy(model(X9[:8]), Y9[:8]).backward()
    assert calls[1] == len(prof.events), f"batch 8: the profiler records {len(prof.events)} calls, got {calls[1]}"
    assert again == calls[1], "the count must not depend on earlier calls: reset the gradients"
    slopes = {(cb - ca) / (b - a) for a, b, ca, cb in zip(batches, batches[1:], calls, calls[1:])}
    assert len(slopes) == 1, f"{type(model).__name__}: the counts {calls} should grow by the same amount per image"
    name = type(model).__name__
    print(f"{name:14s} op calls at batch {batches}: {calls}; {slopes.pop():g} per extra image "
          f"(you predicted {predicted[name]})")
