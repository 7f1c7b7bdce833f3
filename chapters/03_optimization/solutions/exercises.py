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
# The exercises are independent; do them in any order (run the setup cell first).

# %%
import gc
import json
import math
import os
import tempfile

import numpy as np

import minigrad
import minigrad.nn.functional as F
from minigrad import memory, nn, optim
from minigrad.autograd import Function
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
got = bytes_kept_per_layer(mlp, minigrad.randn(10, 16))
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
gc.collect()
with memory.track() as mem:
    out = CheckpointedSegment.apply(segment, x2, w1, w2)
    held = mem.current - mem.start
calls[0] = 0
out.sum().backward()
assert held == 64 * 32 * 4, f"after forward only the output (8,192 bytes) should be new, got {held:,} bytes"
assert calls[0] == 1, f"backward should run the segment once, it ran {calls[0]} times"
for name, w, e in (("w1", w1, expected[0]), ("w2", w2, expected[1])):
    assert w.grad is not None, f"{name} got no gradient"
    assert np.allclose(w.grad.numpy(), e, rtol=1e-5, atol=1e-5), f"{name}: wrong gradient"
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
    fi, got = np.finfo(dtype), float_limits(*bits)
    for key in ("max", "smallest_normal", "smallest_subnormal", "eps"):
        want = float(getattr(fi, key))
        assert got[key] == want, f"{fi.dtype} {key}: expected {want}, got {got[key]}"
bf16 = float_limits(8, 7)  # bfloat16: float32's range, 3 significant digits fewer
assert bf16["max"] == 3.3895313892515355e38 and bf16["eps"] == 0.0078125, f"bfloat16: got {bf16}"
print("Check 3 passed")

# %% [markdown]
# ## Exercise 4: did any gradient overflow?
# A loss-scaled step must be skipped if any gradient holds an `inf` or a `nan`. Return whether
# that is the case for a list of gradients (Tensors, or `None` for parameters without one).

# %%
# Exercise 4: Did any gradient overflow?
def found_inf(grads: list) -> bool:
    ### BEGIN SOLUTION
    return any(not np.isfinite(g.numpy()).all() for g in grads if g is not None)
    ### END SOLUTION

# %%
# Check 4
t = minigrad.tensor
with np.errstate(over="ignore"):
    cases = [
        ([t([1.0, 2.0]), t([[3.0]])], False),
        ([t([1.0, math.inf])], True),
        ([t([1.0]), None, t([-math.inf, 0.0])], True),
        ([t([math.nan])], True),
        ([None, t([65504.0], dtype=minigrad.float16)], False),
        ([t([60000.0], dtype=minigrad.float16) * 2], True),  # float16 overflow
        ([], False),
    ]
    for grads, expected in cases:
        got = found_inf(grads)
        assert got is expected or got == expected, f"{grads}: expected {expected}, got {got}"
print("Check 4 passed")

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
def compare(flags, init_scale, **kw):
    p = nn.Parameter(minigrad.zeros(1))
    opt = optim.SGD([p], lr=0.0)
    scaler = minigrad.GradScaler(init_scale=init_scale, **kw)
    scaler.scale(minigrad.tensor(1.0))  # the first scale() starts the scaler
    scale, count = init_scale, 0
    for i, bad in enumerate(flags):
        p.grad = minigrad.tensor([math.inf if bad else 1.0])
        scaler.step(opt)
        scaler.update()
        scale, count = update_scale(scale, count, bad, **kw)
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


mine, ref = nn.Parameter(minigrad.zeros(4, 1)), nn.Parameter(minigrad.zeros(4, 1))
opt = optim.SGD([ref], lr=1e7)
scaler = minigrad.GradScaler(init_scale=2.0**16, growth_interval=10**6)
for _ in range(5):
    mine.grad = None
    assert scaled_sgd_step([mine], loss_of(mine), 2.0**16, 1e7) is True, "a finite step must be taken"
    opt.zero_grad()
    scaler.scale(loss_of(ref)).backward()
    scaler.step(opt)
    scaler.update()
assert mine.detach().numpy().any(), "the weights did not move: were the gradients scaled?"
got, expected = mine.detach().numpy(), ref.detach().numpy()
assert np.allclose(got, expected, rtol=1e-6), f"expected\n{expected}\ngot\n{got}"
before = mine.detach().numpy().copy()
mine.grad = None
with np.errstate(over="ignore", invalid="ignore"):
    taken = scaled_sgd_step([mine], loss_of(mine) * 1e12, 2.0**16, 1e7)  # overflows in float16
assert taken is False and np.array_equal(mine.detach().numpy(), before), "an overflowing step must be skipped"
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
got = most_expensive(made_up)
assert got == ("Matmul", "backward", 65), f"expected ('Matmul', 'backward', 65), got {got}"
minigrad.manual_seed(7)
model7 = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
with profile() as prof:
    F.cross_entropy(model7(minigrad.randn(128, 64)), minigrad.randint(0, 10, (128,))).backward()
top = max(prof.key_averages(), key=lambda a: a.self_ns)
got = most_expensive(prof.events)
assert got == (top.key, top.phase, top.self_ns), f"expected {(top.key, top.phase, top.self_ns)}, got {got}"
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
with profile() as prof:
    got = pairwise_sq_dists(a8, b8)
expected = pairwise_sq_dists_loop(a8, b8)
assert tuple(got.shape) == (50, 20), f"expected shape (50, 20), got {tuple(got.shape)}"
assert np.allclose(got.detach().numpy(), expected.detach().numpy(), atol=1e-5), "wrong distances"
n_ops = len([e for e in prof.events if e.depth == 0])
assert n_ops <= 6, f"expected at most 6 ops, the profiler counted {n_ops}"
(g_got,) = minigrad.grad(got.sum(), a8)
(g_expected,) = minigrad.grad(expected.sum(), a8)
assert np.allclose(g_got.numpy(), g_expected.numpy(), atol=1e-4), "wrong gradient"
print("Check 8 passed")

# %% [markdown]
# ## Exercise 9: a Chrome trace
# The trace-event format that chrome://tracing and Perfetto read is a JSON object
# `{"traceEvents": [...], "displayTimeUnit": "ms"}` with one "complete" event per op:
# `{"name", "cat", "ph": "X", "ts", "dur", "pid", "tid", "args"}`, where `cat` is the phase, `ts`
# and `dur` are microseconds (floats), `pid` is the given process id, `tid` the event's thread
# and `args` holds `{"input_shapes": [...as lists], "input_dtypes": [...], "bytes": ...}`. Build
# it from a profile's events.

# %%
# Exercise 9: A Chrome trace
def chrome_trace(events: list[Event], pid: int) -> dict:
    ### BEGIN SOLUTION
    return {"traceEvents": [{
        "name": e.name, "cat": e.phase, "ph": "X", "ts": e.start_ns / 1e3, "dur": e.duration_ns / 1e3,
        "pid": pid, "tid": e.thread,
        "args": {"input_shapes": [list(s) for s in e.input_shapes], "input_dtypes": e.input_dtypes,
                 "bytes": e.bytes},
    } for e in events], "displayTimeUnit": "ms"}
    ### END SOLUTION

# %%
# Check 9
minigrad.manual_seed(9)
w9 = minigrad.randn(8, 4, requires_grad=True)
with profile() as prof:
    ((minigrad.randn(16, 8) @ w9).relu() ** 2).mean().backward()
with tempfile.TemporaryDirectory() as folder:
    path = os.path.join(folder, "trace.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        expected = json.load(f)
got = json.loads(json.dumps(chrome_trace(prof.events, os.getpid())))  # as a file would give it back
assert got.keys() == expected.keys(), f"expected keys {sorted(expected)}, got {sorted(got)}"
assert len(got["traceEvents"]) == len(expected["traceEvents"]), "one event per profiled op"
for g, e in zip(got["traceEvents"], expected["traceEvents"]):
    assert g == e, f"expected\n{e}\ngot\n{g}"
print("Check 9 passed")
