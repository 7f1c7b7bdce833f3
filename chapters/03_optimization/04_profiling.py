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
# # 03.4 Profiling a training step
#
# **Question:** a training step is slower than it should be. Which op is to blame, and how do we
# find out before changing any code?
#
# Guessing is unreliable: the line that looks expensive often is not. A profiler measures instead.
# `minigrad.profiler.profile()` records every op that runs inside it (its name, input shapes,
# wall time, the bytes its outputs allocated, forward or backward), sums them per op in a table,
# and writes a timeline that chrome://tracing or ui.perfetto.dev can open.
#
# **You will:** profile a training step and read the profiler's table (calls, total and self
# time, bytes, phase); find a per-sample Python loop from the call counts and input shapes; fix it
# and check the fix changes no result; measure the speed-up and the profiler's own cost; time
# one matrix product spelled as `@` and as `einsum`; read the step's timeline from its Chrome trace.
# **Time:** about 27 minutes (26 reading, 15 s running).

# %%
import os

# One BLAS thread, so that the timings are not disturbed by threads competing for the cores
# (set before numpy is imported).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import json
import subprocess
import sys
import tempfile
import time

import matplotlib.pyplot as plt
import numpy as np

import minigrad
import minigrad.nn.functional as F
from minigrad import nn, optim
from minigrad.data import Digits
from minigrad.profiler import profile, record_function

train = Digits(train=True)
X = minigrad.tensor(train.data.reshape(len(train), -1)[:128])  # a batch of 128 digits, 64 pixels each
Y = minigrad.tensor(train.targets[:128])

# %% [markdown]
# ## 1. A step with a hidden bottleneck
# A two-layer MLP whose first layer was written for one image at a time and is applied to the
# batch in a Python loop. It computes the right thing; the question is what it costs. The step
# labels its three phases with `record_function`, so they show up in the profile as regions.

# %%
class PerSampleMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        hidden = [self.fc1(x[i]).relu() for i in range(len(x))]  # one image at a time
        return self.fc2(minigrad.stack(hidden))


def make_step(model: nn.Module):
    opt = optim.SGD(model.parameters(), lr=0.1)

    def step() -> minigrad.Tensor:
        opt.zero_grad()
        with record_function("forward"):
            loss = F.cross_entropy(model(X), Y)
        with record_function("backward"):
            loss.backward()
        with record_function("optimizer"):
            opt.step()
        return loss

    return step


minigrad.manual_seed(0)
slow_model = PerSampleMLP()
slow_step = make_step(slow_model)
slow_step()  # a first step outside the profile: first calls fill caches
with profile() as slow_prof:
    slow_step()

# %% [markdown]
# ## 2. Reading the table
# `prof.table()` sums the events per op and phase and sorts them by total time. The times
# change from run to run, so this cell's output is not checked:

# %%
# NBVAL_IGNORE_OUTPUT
print(slow_prof.table(row_limit=12))

# %% [markdown]
# The columns:
#
# - **Calls**: how many times the op ran. **Total**: the time inside those calls, including
#   the ops nested inside them; **Self**: the same without the nested ops, so the Self column adds
#   up to the step. **Mean**: Total / Calls. **Self %**: the share of the step's self time.
# - **Bytes**: what the op's outputs allocated (a view such as `reshape` allocates nothing).
# - **Phase**: `backward` for the ops that the engine's backward rules ran, `forward` for every
#   other event: the ops the model's code called, and the regions too, whatever their name (the
#   `backward` region is a span of time around `loss.backward()`, not an op a backward rule ran).
# - The `forward`, `backward` and `optimizer` rows are our `record_function` regions. Their self
#   time is everything inside them that is not an op: Python running `forward`, building the list,
#   the engine walking the graph and adding up gradients.
#
# Times are noisy, but two columns are exact and tell the story on their own: the number of calls
# and the bytes. Counted, for this two-layer model:

# %%
def counts(prof: profile, top: int = 8) -> None:
    ops = [e for e in prof.events if e.parent is not None]  # not the record_function regions
    print(f"{len(ops)} op calls, {sum(e.bytes for e in ops) / 1e6:.2f} MB allocated")
    for a in sorted(prof.key_averages(), key=lambda a: (-a.count, a.key, a.phase))[:top]:
        print(f"  {a.key:10s} {a.phase:9s} {a.count:5d} calls {a.bytes / 1e3:9.1f} kB")


counts(slow_prof)

# %% [markdown]
# Nearly two thousand ops for two linear layers: something runs per sample. Grouping the events
# by input shape as well says which:

# %%
for a in slow_prof.key_averages(group_by_input_shape=True):
    if a.key == "Linear":
        print(f"Linear called {a.count:3d} times with input shapes {a.input_shapes}")

# %% [markdown]
# 128 calls with a single image of 64 pixels. Each op call costs a fixed few microseconds of
# Python and numpy overhead, whatever its size, and so does each node the backward pass visits;
# at 64 numbers per call that overhead is nearly all the work. The backward pass also adds up
# 128 separate gradients for `fc1`'s weight (the `Add` calls in backward, and their megabytes).
#
# ## 3. The fix: one op for the whole batch
# `Linear` already works on a batch; the loop only has to go. Same parameters, same loss:

# %%
class BatchedMLP(PerSampleMLP):
    def forward(self, x):
        return self.fc2(self.fc1(x).relu())


fast_model = BatchedMLP()
fast_model.load_state_dict(slow_model.state_dict())  # the slow model's current weights
slow_model.zero_grad()
loss_slow, loss_fast = F.cross_entropy(slow_model(X), Y), F.cross_entropy(fast_model(X), Y)
loss_slow.backward()
loss_fast.backward()
print("same loss:", np.allclose(loss_slow.item(), loss_fast.item()))
print("same gradients:", all(np.allclose(a.grad.numpy(), b.grad.numpy(), atol=1e-6)
                             for a, b in zip(slow_model.parameters(), fast_model.parameters())))

fast_step = make_step(fast_model)
fast_step()
with profile() as fast_prof:
    fast_step()
counts(fast_prof)

# %%
# NBVAL_IGNORE_OUTPUT
print(fast_prof.table(row_limit=12))

# %% [markdown]
# About forty ops instead of two thousand, and twenty times less memory allocated. How much
# faster is the step? We time 20 steps of each, with and without the profiler, since recording
# every op costs time too:

# %%
def ms_per_step(step, profiled: bool, n: int = 20) -> float:
    start = time.perf_counter()
    for _ in range(n):
        if profiled:
            with profile():
                step()
        else:
            step()
    return (time.perf_counter() - start) / n * 1e3


timings = {(name, profiled): ms_per_step(step, profiled)
           for name, step in (("per-sample loop", slow_step), ("batched", fast_step))
           for profiled in (False, True)}
fig, ax = plt.subplots(figsize=(6, 2.6))
labels = [f"{name}{', profiled' if profiled else ''}" for name, profiled in timings]
ax.barh(labels, list(timings.values()), color=["tab:red", "salmon", "tab:green", "lightgreen"])
ax.set_xscale("log")
ax.set_xlabel("ms per training step (log scale)")
ax.invert_yaxis()
plt.tight_layout()
plt.show()

# %% [markdown]
# The batched step is one to two orders of magnitude faster (the exact factor depends on the
# machine). The profiled bars are slower than the plain ones: the profiler adds a little time to
# every op, which inflates the small ops most, so use its table to find *where* the time goes,
# and a plain timer to measure *how much* a fix gained.
#
# ### One product, two spellings: einsum and matmul
# The batched layer is a matrix product, and `einsum("ij,jk->ik", a, b)` writes the same product.
# Are the two spellings the same cost? We time numpy's `a @ b`, numpy's `einsum` as it runs by
# default and with `optimize=True` (which is what `minigrad.einsum` passes it), and minigrad's
# `@` and `einsum`, on 256 x 256 float32 matrices, best of 5.

# %%
rng = np.random.default_rng(0)
a, b = rng.standard_normal((256, 256), dtype=np.float32), rng.standard_normal((256, 256), dtype=np.float32)
A, B = minigrad.tensor(a), minigrad.tensor(b)
print("same product:", np.allclose(minigrad.einsum("ij,jk->ik", A, B).numpy(), (A @ B).numpy(), atol=1e-3))


def best_ms(f, n: int = 5) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


# %%
# NBVAL_IGNORE_OUTPUT
spellings = {
    "numpy a @ b": lambda: a @ b,
    "numpy einsum": lambda: np.einsum("ij,jk->ik", a, b),
    "numpy einsum, optimize=True": lambda: np.einsum("ij,jk->ik", a, b, optimize=True),
    "minigrad A @ B": lambda: A @ B,
    "minigrad.einsum": lambda: minigrad.einsum("ij,jk->ik", A, B),
}
product_ms = {name: best_ms(f) for name, f in spellings.items()}
base = product_ms["numpy a @ b"]
print(f"{'numpy a @ b':28s} {base:6.2f} ms  (the reference)")
for name, t in list(product_ms.items())[1:]:
    ratio = t / base
    verdict = "about the same as" if ratio < 1.5 else f"{ratio:.1f}x slower than"
    print(f"{name:28s} {t:6.2f} ms  {verdict} a @ b")

# The same ratio in a fresh process whose OpenBLAS is told to use its old SSE3 (Prescott) kernel.
probe = """
import time
import numpy as np
a = np.random.default_rng(0).standard_normal((256, 256), dtype=np.float32)
def best(f):
    times = []
    for _ in range(5):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return min(times)
print(best(lambda: np.einsum("ij,jk->ik", a, a)) / best(lambda: a @ a))
"""
old_kernel = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                            env={**os.environ, "OPENBLAS_CORETYPE": "Prescott", "OPENBLAS_NUM_THREADS": "1"})
print(f"numpy einsum / a @ b with OpenBLAS's SSE3 kernel: {float(old_kernel.stdout):.1f}x")

# %% [markdown]
# Read the verdicts the cell computed on your machine. Where plain `einsum` is the slow one, the
# reason is the kernel, not the equation: `@` hands the product to BLAS, whose matrix multiply for
# this CPU is tiled for the caches and written for its widest vector units, while `einsum` by
# default runs numpy's own generic loop over every index of the equation, which works for any
# equation but knows nothing of caches. The last line tests that: with OpenBLAS forced back to its
# old SSE3 kernel, compare the ratio with the second line's. With `optimize=True`, `einsum`
# first plans the contraction and, for a pair of operands that is a product, calls `tensordot`,
# that is BLAS again, paying only for parsing the equation. So spell a matrix product as `@`, and
# keep `einsum` (optimised) for contractions that are awkward to write with transposes and reshapes.
#
# ## 4. The trace
# `export_chrome_trace(path)` writes every event as JSON in the Chrome trace-event format: one
# complete event (`"ph": "X"`) per op, with its start `ts` and duration `dur` in microseconds.

# %%
with tempfile.TemporaryDirectory() as folder:
    path = os.path.join(folder, "trace.json")
    fast_prof.export_chrome_trace(path)
    with open(path) as f:
        trace = json.load(f)
events = trace["traceEvents"]
print(len(events), "events; the fields of one:", sorted(events[1]))
for e in events[:6]:
    print(f"  {e['name']:10s} {e['cat']:9s} {e['ph']}  {e['args']}")

# %% [markdown]
# Open such a file in chrome://tracing (or drag it onto ui.perfetto.dev) to zoom through it. It is
# only intervals on a time line, so matplotlib can draw it too. An event that starts inside
# another one ran inside it (an op inside a `record_function` region), and goes one row lower:

# %%
def draw_trace(ax, events: list[dict], title: str) -> None:
    open_ends: list[float] = []
    t0 = min(e["ts"] for e in events)
    colors = {"forward": "tab:blue", "backward": "tab:orange"}
    for e in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
        while open_ends and e["ts"] >= open_ends[-1]:
            open_ends.pop()
        row = len(open_ends)
        open_ends.append(e["ts"] + e["dur"])
        start, width = (e["ts"] - t0) / 1e3, e["dur"] / 1e3
        color = "lightgray" if row == 0 else colors[e["cat"]]
        ax.broken_barh([(start, width)], (row - 0.4, 0.8), facecolor=color, edgecolor="white", linewidth=0.3)
        if row == 0 or width > 0.035 * ax.get_xlim()[1]:
            ax.text(start + width / 2, row, e["name"], ha="center", va="center", fontsize=7, clip_on=True,
                    rotation=0 if row == 0 else 90)
    ax.set_yticks([0, 1], ["region", "op"])
    ax.invert_yaxis()
    ax.set_xlabel("ms since the step started")
    ax.set_title(title)


with tempfile.TemporaryDirectory() as folder:
    path = os.path.join(folder, "trace.json")
    slow_prof.export_chrome_trace(path)
    with open(path) as f:
        slow_events = json.load(f)["traceEvents"]
fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(11, 4.6))
for ax, evs, title in ((ax1, slow_events, "per-sample loop"), (ax2, events, "batched")):
    ax.set_xlim(0, (max(e["ts"] + e["dur"] for e in evs) - min(e["ts"] for e in evs)) / 1e3)
    draw_trace(ax, evs, f"{title}: {len(evs)} events (blue forward, orange backward)")
plt.tight_layout()
plt.show()

# %% [markdown]
# In the per-sample step the op row is a dense comb of tiny calls with gaps between them: the
# gaps are Python (and the profiler's own bookkeeping), not computation. In the batched step a
# handful of ops fill the regions.
#
# **What to remember:** profile before optimising. The call counts and the input shapes find a
# Python loop of tiny ops; the bytes column finds needless allocations; self time finds the op
# (or the gap between ops) that dominates. Then fix, check the results are unchanged, and time
# again without the profiler.

# %% [markdown]
# ## Predict, then run
# Counts and bytes are exact, so these answers do not depend on the machine.
# 1. How many times does `Linear` run in the per-sample model's forward pass on a batch of 64?
# 2. How many bytes does the batched model's first `Linear` allocate in forward, at a batch of
#    128 float32 images?
# 3. How many bytes does `X.reshape(128, 8, 8)` allocate?

# %%
def forward_profile(model: nn.Module, x: minigrad.Tensor) -> profile:
    with minigrad.no_grad(), profile() as prof:
        model(x)
    return prof


linear_calls = sum(a.count for a in forward_profile(slow_model, X[:64]).key_averages() if a.key == "Linear")
print("1. Linear calls on 64 images:", linear_calls, "(64 for fc1, one image each, and 1 for fc2)")
first = [a for a in forward_profile(fast_model, X).key_averages(group_by_input_shape=True)
         if a.key == "Linear" and tuple(a.input_shapes[0]) == (128, 64)][0]
print(f"2. Linear with inputs {first.input_shapes} allocates {first.bytes:,} bytes = 128 x 128 x 4")
with profile() as prof:
    X.reshape(128, 8, 8)
print("3. reshape allocates:", sum(e.bytes for e in prof.events), "bytes: a view shares X's memory")
