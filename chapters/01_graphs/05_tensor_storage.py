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
# # 01.5 Tensor storage: shape, strides and views
#
# **Question:** memory is one long row of numbers. How does a 3 x 4 tensor, its transpose and a
# slice of it all live there, and why do some of them cost nothing to make?
#
# **You will learn:**
# - a tensor is a *view*: a flat storage plus shape, strides and an offset;
# - transpose, permute, expand and slicing only change strides (no copy), and how to check that;
# - when `reshape` must copy, and `view` refuses;
# - `as_strided` and `channels_last`, the tools convolutions are built on;
# - what layout costs, measured: row- vs column-wise sums, transposed matmul, NCHW vs NHWC conv.
#
# **Time:** about 20 minutes (19 reading, 13 s running).

# %%
import time

import matplotlib.pyplot as plt
import numpy as np

import minigrad
from minigrad.errors import ShapeError


# %% [markdown]
# ## One buffer, one rule
# Element `x[i, j]` of a tensor lives at position `storage_offset + i*stride[0] + j*stride[1]` of
# its storage. Strides are counted in elements (numpy's `.strides` count bytes).

# %%
x = minigrad.arange(12.0).reshape(3, 4)
print("shape", x.shape, "stride", x.stride(), "offset", x.storage_offset())
print("numpy's strides, in bytes:", x.array.strides)


# %% [markdown]
# A picture says it faster. `draw` shows the storage as a row of cells with the view's elements
# highlighted, and the view itself as a grid. `x` holds 0..11, so each value is also its position.

# %%
def positions(t):
    """Where in the storage each element of ``t`` sits: offset + sum of index * stride."""
    idx = np.indices(t.shape).reshape(t.ndim, -1).T
    return t.storage_offset() + idx @ np.array(t.stride(), dtype=int) if t.ndim else np.array([t.storage_offset()])


def draw(views, storage):
    fig, axes = plt.subplots(2, len(views), figsize=(3.2 * len(views), 3.2),
                             gridspec_kw=dict(height_ratios=[1, 3]), squeeze=False)
    flat = storage.reshape(-1).numpy()
    for k, (title, v) in enumerate(views.items()):
        top, bottom = axes[0, k], axes[1, k]
        hits = positions(v)
        top.imshow(np.isin(np.arange(flat.size), hits)[None], cmap="Blues", vmin=0, vmax=1.6, aspect="auto")
        for p, val in enumerate(flat):
            top.text(p, 0, f"{val:g}", ha="center", va="center", fontsize=7)
        top.set_title(f"{title}\nstride {v.stride()}, offset {v.storage_offset()}", fontsize=9)
        grid = v.detach().numpy().reshape(v.shape[0] if v.ndim > 1 else 1, -1)
        bottom.imshow(np.ones_like(grid), cmap="Blues", vmin=0, vmax=1.6)
        for (i, j), val in np.ndenumerate(grid):
            bottom.text(j, i, f"{val:g}", ha="center", va="center")
        bottom.set_title(f"view of shape {tuple(v.shape)}", fontsize=9)
        for ax in (top, bottom):
            ax.set_xticks([])
            ax.set_yticks([])
    plt.tight_layout()
    plt.show()


draw({"x": x, "x.T": x.T, "x[:, 1:3]": x[:, 1:3], "x[::2, ::3]": x[::2, ::3]}, x)

# %% [markdown]
# The transpose reads the same 12 cells in another order: its strides are swapped, `(1, 4)`. The
# slices read some of them: `x[:, 1:3]` starts one cell in (offset 1) and keeps the row stride 4.
#
# ## Row-major, in PyTorch too
# A common claim is that PyTorch stores tensors column-major. It does not: PyTorch, numpy and
# minigrad all default to row-major (C order): the *last* index moves fastest, so a fresh
# (2, 3) tensor has strides `(3, 1)`. Column-major (the first index fastest, strides `(1, 2)`) is
# Fortran's convention, and cuBLAS's; numpy can make such an array on request.

# %%
print("minigrad.empty(2, 3).stride():", minigrad.empty(2, 3).stride())
print("numpy C order, bytes:", np.empty((2, 3)).strides, " Fortran order:", np.empty((2, 3), order="F").strides)
print("a Fortran-ordered numpy array, wrapped by minigrad, keeps its layout:",
      minigrad.Tensor(np.asfortranarray(np.ones((2, 3)))).stride())

# %%
# NBVAL_IGNORE_OUTPUT
try:
    import torch
    print("torch.empty(2, 3).stride():", torch.empty(2, 3).stride())
except ImportError:
    torch = None
    print("torch not installed; with it, torch.empty(2, 3).stride() is (3, 1)")

# %% [markdown]
# ## Views copy nothing
# Transpose, permute, expand, slicing, and reshape of a contiguous tensor return views: new shape,
# strides and offset over the *same* storage. `untyped_storage().data_ptr()` is the storage's
# address, the same for every view of it; `data_ptr()` is the address of the view's first element.

# %%
base = minigrad.arange(24.0).reshape(2, 3, 4)
views = {"base": base, "transpose(0, 2)": base.transpose(0, 2), "permute(2, 0, 1)": base.permute(2, 0, 1),
         "[:, 1:, ::2]": base[:, 1:, ::2], "[1]": base[1], "reshape(6, 4)": base.reshape(6, 4),
         "[:, :1].expand(2, 5, 4)": base[:, :1].expand(2, 5, 4)}
print(f"{'view':26}{'shape':14}{'stride':14}{'offset':>7}  same storage  contiguous")
for name, v in views.items():
    same = v.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    print(f"{name:26}{str(tuple(v.shape)):14}{str(v.stride()):14}{v.storage_offset():7}  {str(same):12}  "
          f"{v.is_contiguous()}")

# %% [markdown]
# `expand` repeats a dim with stride 0: five rows that are one row of memory. Because views share
# storage, writing through one is seen by all (and autograd's version counter knows it):

# %%
row = base[0, 0]
row[1] = -1.0
print(base[0, 0], "version", base._version)
base[0, 0, 1] = 1.0

# %% [markdown]
# ## When reshape must copy
# A view needs the new shape to be expressible with strides over the old memory. Flattening the
# transpose of `x` would need to read 0, 4, 8, 1, 5, ... as one dim with a single stride: no such
# stride exists, so `reshape` copies (a new storage) and `view` refuses.

# %%
flat = x.T.reshape(12)
print("x.T.reshape(12) shares x's storage:", flat.untyped_storage().data_ptr() == x.untyped_storage().data_ptr())
try:
    x.T.view(12)
except ShapeError as e:
    print("view:", e)
print("x.T.contiguous().stride():", x.T.contiguous().stride(), " x.contiguous() is x:", x.contiguous() is x)

# %% [markdown]
# ## You write this arithmetic
# In the build track the three rules of this lesson are package regions you write
# (`python -m minigrad.course regions` lists them, `python -m minigrad.course test-chapter 1`
# tests them); each function's docstring states its contract:
#
# - `storage_index` in `minigrad/ops/layout.py` (*strided views: index to offset*): the one
#   rule above, which `as_strided` uses to check that a view stays inside its storage, and its
#   gradient to find every element's position;
# - `dense_in_order` in the same file (*strided views: is_contiguous*): are the dims packed
#   without gaps in a given order, row-major or `channels_last`, which convolution and pooling
#   ask of every input;
# - `_viewable` in `minigrad/ops/movement.py` (*strided views: when reshape must copy*): the rule
#   `view` asks before it makes a view, and that decides whether `reshape` copies.
#
# The cell below checks yours against this lesson's figures.

# %%
# Check: your strided view arithmetic (minigrad.ops.layout, minigrad.ops.movement)
from minigrad.course import answer
from minigrad.ops.layout import dense_in_order, storage_index


def views_as(t, shape):
    try:
        t.view(shape)
        return True
    except ShapeError:
        return False


elements = [((1, 2), x), ((1, 2), x.T), ((2, 1), x[:, 1:3])]
got = answer([storage_index(i, v.stride(), v.storage_offset()) for i, v in elements])
assert got == [6, 9, 10], f"x[1, 2], x.T[1, 2] and x[:, 1:3][2, 1] sit at storage positions 6, 9 and 10; got {got}"
got = answer([dense_in_order(v.shape, v.stride(), range(v.ndim)) for v in views.values()])
want = [v.is_contiguous() for v in views.values()]  # numpy's own flag, for the views of `base` above
assert got == want, f"row-major dense, for the views above: expected {want}, got {got}"
shapes = [(12,), (3, 4), (2, 2, 3), (4, 3, 1), (6, 2)]
got = answer([views_as(x.T, s) for s in shapes])
assert got == [False, False, True, True, False], (
    f"x.T, (4, 3) with strides (1, 4), views as (2, 2, 3) and (4, 3, 1) only; for {shapes} got {got}")
print("your index to offset, is_contiguous and view rules agree with the lesson")

# %% [markdown]
# ## `as_strided`: any geometry over the storage
# `as_strided(size, stride, offset)` sets the geometry by hand. With overlapping strides one
# buffer of 6 numbers becomes every window of 3 consecutive numbers, with no copy: the trick
# `minigrad.ops.conv` uses to turn a convolution into one matrix product. Its gradient adds the
# contributions of every window an element appears in.

# %%
signal = minigrad.arange(6.0, requires_grad=True)
windows = signal.as_strided((4, 3), (1, 1))
print(windows)
windows.sum().backward()
print("d(sum of windows)/d(signal):", signal.grad, "(how many windows hold each element)")

# %%
draw({"as_strided((4, 3), (1, 1))": windows.detach()}, signal.detach())

# %% [markdown]
# ## channels_last: the same shape, another layout
# Images are (N, C, H, W). `to(memory_format=minigrad.channels_last)` keeps that shape but stores
# the channels of each pixel next to each other, (N, H, W, C) in memory, as PyTorch does. Many
# convolution kernels prefer it; minigrad's `Conv2d`, `BatchNorm2d` and pooling take it and keep it.

# %%
img = minigrad.arange(12.0).reshape(1, 3, 2, 2)
nhwc = img.to(memory_format=minigrad.channels_last)
print("NCHW stride", img.stride(), " channels_last stride", nhwc.stride())
print("storage order NCHW:", img.array.ravel(order="K"))
print("storage order NHWC:", nhwc.array.ravel(order="K"))
conv = minigrad.nn.Conv2d(3, 2, 1)
print("conv keeps channels_last:", conv(nhwc).is_contiguous(memory_format=minigrad.channels_last),
      " same values:", np.allclose(conv(nhwc).detach().numpy(), conv(img).detach().numpy()))

# %% [markdown]
# ## What layout costs
# The same arithmetic on the same values can run at different speeds depending on the order it
# walks memory. `benchmarks/bench_layout.py` times three pairs in minigrad and PyTorch; these are
# the figures of one run on the course machine (an AMD EPYC, one BLAS thread, shared with other
# work, so expect noise of 10-20%).

# %%
BENCH = {  # ms per call, from `python benchmarks/bench_layout.py` (minigrad, torch 2.13)
    "sum along rows (dim=1)": (9.77, 11.29), "sum along columns (dim=0)": (14.94, 17.42),
    "matmul a @ b": (370.8, 388.7), "matmul a @ b.T (view)": (374.0, 427.9),
    "conv fwd+bwd NCHW": (217.3, 124.7), "conv fwd+bwd NHWC": (155.3, 94.5),
}
names = list(BENCH)
fig, ax = plt.subplots(figsize=(8, 3.2))
ypos = np.arange(len(names))
ax.barh(ypos - 0.2, [BENCH[n][0] for n in names], 0.4, label="minigrad")
ax.barh(ypos + 0.2, [BENCH[n][1] for n in names], 0.4, label="PyTorch")
ax.set_yticks(ypos, names)
ax.set_xscale("log")
ax.set_xlabel("ms per call (log scale)")
ax.invert_yaxis()
ax.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# What to notice: in this run, summing down the columns of a 2048 x 2048 matrix was about 1.5x
# slower than summing along its rows, in both frameworks. It is not the 10x a naive double loop
# would pay: numpy and PyTorch reorder their loops to walk memory in order where they can (adding
# whole rows into a row of partial sums), so the gap depends on size and cache, and at other sizes
# it can even reverse. A transposed operand costs matmul little: BLAS is told the operand is
# transposed and reads it in blocks. NHWC made minigrad's conv faster, because its im2col copy
# then reads each pixel's channels together. A small live check (timings vary with the machine):

# %%
# NBVAL_IGNORE_OUTPUT
m = minigrad.randn(1024, 1024)
for dim in (1, 0):
    start = time.perf_counter()
    for _ in range(20):
        m.sum(dim)
    print(f"sum(dim={dim}) of 1024 x 1024: {(time.perf_counter() - start) / 20 * 1e3:.2f} ms")

# %% [markdown]
# ## Predict, then run
# 1. What is `x.T.contiguous().stride()` for `x` of shape (3, 4), and does it share `x`'s storage?
# 2. `y = x[:, ::2]` has shape (3, 2). Can `y.view(6)` work without a copy?
# 3. `minigrad.ones(1, 4).expand(1000, 4)` has 4000 elements. How many bytes does its storage hold?

# %%
c = x.T.contiguous()
print("1.", c.stride(), c.untyped_storage().data_ptr() == x.untyped_storage().data_ptr())
y = x[:, ::2]
try:
    print("2. yes: strides", y.stride(), "are one run of stride 2, so the view has stride", y.view(6).stride())
except ShapeError:
    print("2. no: strides", y.stride(), "cannot be merged into one")
e = minigrad.ones(1, 4).expand(1000, 4)
print("3.", e.untyped_storage().nbytes(), "bytes; stride", e.stride())
