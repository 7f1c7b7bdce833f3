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
# # 03.7 A caching memory pool
#
# **Question:** a training step allocates the same buffers, of the same sizes, every step. Why ask
# the system for memory each time?
#
# A *caching allocator* keeps freed blocks and hands them out again. PyTorch's CUDA allocator does
# it because `cudaMalloc` stalls the GPU; on a CPU a large `malloc` maps fresh pages that the kernel
# zero-fills on first touch. `minigrad.allocator` implements the same design for the CPU; on a GPU
# minigrad uses CuPy's pool, which is this design too.
#
# **You will learn:**
# - what a pool does: size rounding, segments, best fit, splitting and merging blocks;
# - what it costs and when it pays, measured;
# - what *fragmentation* is, and to see it in a picture of a segment;
# - how to read `minigrad.memory_stats()` / `memory_summary()` (torch: `torch.cuda.memory_stats`).
#
# **Time:** about 13 minutes (12 reading, 3 s running).

# %%
import time

import matplotlib.pyplot as plt
import numpy as np

import minigrad
from minigrad import allocator
from minigrad.allocator import CachingAllocator

# %% [markdown]
# ## 1. Fresh memory is not free
# Fill a 4 MiB buffer: once into a new array each time, once into the same array again. Memory
# the process has never touched costs a page fault per 4 KiB page, which the kernel zero-fills.
# How much of that a new array pays depends on malloc: glibc's maps a large buffer afresh from the
# kernel, but once one such buffer has been freed it raises its mapping threshold and serves the
# next ones from its heap, pages already faulted in, so in a loop the gap is small or nothing
# (the ratio below is this machine's; the numbers vary). Run the notebook with
# `MALLOC_MMAP_THRESHOLD_=131072` in the environment, which fixes glibc's threshold, and every new
# buffer is faulted afresh: the gap grows to several times.

# %%
# NBVAL_IGNORE_OUTPUT
n = 1 << 20  # 4 MiB of float32
reused = np.empty(n, np.float32)


def per_call(fn, reps=50):
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps * 1e6


fresh_us = per_call(lambda: np.empty(n, np.float32).fill(1.0))
reused_us = per_call(lambda: reused.fill(1.0))
print(f"new buffer each time: {fresh_us:.0f} us, same buffer: {reused_us:.0f} us: "
      f"a new buffer costs {fresh_us / reused_us:.2f}x here")

# %% [markdown]
# ## 2. Segments and blocks
# The pool reserves *segments* (2 MiB for requests up to 1 MiB, 20 MiB up to 10 MiB, else the request
# rounded to 2 MiB) and cuts *blocks* out of them, every size rounded up to 512 bytes. A request takes
# the smallest free block that fits and splits off the rest; a freed block merges with free
# neighbours. `reserve=` lets us watch the bookkeeping without memory behind it.

# %%
pool = CachingAllocator(reserve=lambda n: None)
a, b, c = pool.malloc(1000), pool.malloc(300_000), pool.malloc(1)
for name, block in zip("abc", (a, b, c)):
    print(f"{name}: asked {block.requested:>7} bytes, got {block.size:>7} at offset {block.offset}")
print("segments:", len(pool.segments), "of", pool.segments[0].size, "bytes")
pool.free(b)
print("after freeing b, blocks:", [(blk.offset, blk.size, blk.allocated) for blk in pool.blocks()])

# %% [markdown]
# ## 3. Fragmentation, seen
# Fill a 2 MiB segment with eight 256 KiB blocks and free every other one: 1 MiB is free, but in
# four pieces. A 512 KiB request fits in none of them, so the pool reserves a second segment.

# %%
pool = CachingAllocator(reserve=lambda n: None)
blocks = [pool.malloc(256 << 10) for _ in range(8)]
for blk in blocks[::2]:
    pool.free(blk)
before = pool.memory_stats()
big = pool.malloc(512 << 10)


def draw(pool, ax):
    for row, segment in enumerate(pool.segments.values()):
        blk = segment.head
        while blk is not None:
            ax.barh(row, blk.size / 2**10, left=blk.offset / 2**10, color="tab:red" if blk.allocated else "lightgrey",
                    edgecolor="black")
            blk = blk.next
    ax.set_yticks(range(len(pool.segments)), [f"segment {i}" for i in range(len(pool.segments))])
    ax.set_xlabel("offset in the segment (KiB)")


fig, ax = plt.subplots(figsize=(8, 2))
draw(pool, ax)
ax.set_title("red: live blocks, grey: cached free blocks")
plt.show()
print(f"before the 512 KiB request: {before['cached_bytes'] >> 10} KiB free in {before['cached_blocks']} blocks, "
      f"fragmentation {before['fragmentation']:.0%}")
print("segments now:", pool.memory_stats()["segment.all.current"])

# %% [markdown]
# `fragmentation` is `1 - largest free block / free bytes`; `inactive_split_bytes` (torch's name)
# is the free memory inside segments that also hold live blocks: it cannot be given back.
# `empty_cache()` returns only segments with no live block at all:

# %%
pool.free(big)
pool.empty_cache()
print("segments after empty_cache:", pool.memory_stats()["segment.all.current"])
print(pool.memory_summary())

# %% [markdown]
# ## 4. When it pays, and where minigrad uses it
# The pool's bookkeeping is Python: about 20 µs per allocation, several times `numpy.empty` for a
# small array. So minigrad takes only large temporaries from it: the im2col columns of a
# convolution (`ops/conv.py`), tens of MiB per step for a small CNN. What it saves there is what
# malloc does not already save: with glibc, whose heap keeps large freed buffers once its threshold
# has grown (section 1), little or nothing, and a training step's time is mostly its matrix
# products, so the two timings below differ by about their noise. The pool pays where getting
# memory is expensive: with a malloc that returns each large buffer to the system (the page faults
# of section 1 on every step, which `benchmarks/bench_pool.py` measures), and on a GPU, where
# `cudaMalloc` synchronises the device, stalling the work queued on it.

# %%
# NBVAL_IGNORE_OUTPUT
minigrad.manual_seed(0)
conv = minigrad.nn.Conv2d(3, 32, 3, padding=1)
x = minigrad.randn(16, 3, 32, 32)
step_ms = {False: [], True: []}
for on in (False, True, False, True):
    allocator.enable(on)
    t0 = time.perf_counter()
    for _ in range(5):
        conv(x).sum().backward()
    step_ms[on].append((time.perf_counter() - t0) / 5 * 1e3)
    print(f"pool {'on ' if on else 'off'}: {step_ms[on][-1]:.1f} ms per step")
ratio = min(step_ms[False]) / min(step_ms[True])
verdict = "within 10%: noise" if abs(ratio - 1) < 0.1 else "faster" if ratio > 1 else "slower"
print(f"best step with the pool: {ratio:.2f}x the speed of the best without ({verdict})")
allocator.enable(True)
stats = minigrad.memory_stats()
print(f"cpu pool: {stats['num_cache_hits']} of {stats['num_alloc']} allocations served from the cache")

# %% [markdown]
# On a GPU the same names read CuPy's pool: `minigrad.cuda.memory_stats()`, `minigrad.cuda.memory_summary()`,
# `minigrad.cuda.empty_cache()` (or `minigrad.memory_stats("cuda")`).
#
# ## Predict, then run
# 1. A pool serves a 700-byte request. How many bytes does the block hold?
# 2. Allocate eight 256 KiB blocks in a fresh pool and free them all. How many free blocks are cached?
# 3. After that, `empty_cache()`: how many bytes stay reserved?

# %%
p = CachingAllocator(reserve=lambda n: None)
print("1.", p.malloc(700).size, "bytes (rounded up to a multiple of 512)")
p = CachingAllocator(reserve=lambda n: None)
for blk in [p.malloc(256 << 10) for _ in range(8)]:
    p.free(blk)
print("2.", p.memory_stats()["cached_blocks"], "block: the neighbours merged back into the whole segment")
p.empty_cache()
print("3.", p.memory_stats()["reserved_bytes.all.current"], "bytes: the segment went back")
