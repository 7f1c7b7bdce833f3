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
# # 04.3 Inside DistributedDataParallel: buckets and overlap
#
# **Question:** DDP must all-reduce every gradient every step. When should it send them, and in
# what pieces, so that the communication costs as little time as possible?
#
# Two facts decide it: backward produces the gradients one layer at a time, last layer first; and
# every all-reduce pays a latency $\alpha$ however small it is (04.2). So DDP groups the gradients
# into *buckets* of a few megabytes, in the order backward produces them, and starts each bucket's
# all-reduce as soon as its last gradient is ready, while backward carries on with the earlier
# layers.
#
# **You will:** see the order in which backward produces gradients, read the seventy lines of
# minigrad's DDP that pack them into buckets and all-reduce them, draw the buckets for three
# bucket sizes, and look at a measured timeline of one backward.
# **Time:** about 15 minutes (14 reading, 6 s running).

# %%
import inspect
import json
from pathlib import Path

import matplotlib.pyplot as plt

import minigrad
from minigrad import nn
from minigrad.distributed import DistributedDataParallel, ddp, launch

minigrad.manual_seed(0)

# %% [markdown]
# ## Backward produces gradients last layer first
# A hook on each parameter records when its gradient is computed (one process, no DDP):

# %%
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                      nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
arrivals = []
for name, p in model.named_parameters():
    p.register_hook(lambda g, name=name: arrivals.append(name))
loss = nn.CrossEntropyLoss()(model(minigrad.randn(64, 256)), minigrad.randint(0, 10, (64,)))
loss.backward()
print("registration order:", [name for name, _ in model.named_parameters()])
print("gradient order:    ", arrivals)

# %% [markdown]
# Exactly reversed. The last layer's gradients are ready while the first layers' are still being
# computed, so their all-reduce could already be under way. Three ways to send them:
#
# - **one all-reduce per parameter**, each as soon as it is ready: the most overlap, but 10
#   messages here (161 for a ResNet-50), each paying $\alpha$;
# - **one all-reduce of everything** after backward: one $\alpha$, but no overlap at all, the
#   step takes backward *plus* the whole all-reduce;
# - **buckets**: consecutive gradients, in the order backward produces them, packed into flat
#   buffers of about `bucket_cap_mb` (PyTorch's default: 25 MB). Few messages, and all but the
#   last bucket's all-reduce overlap backward.
#
# ## How minigrad's DDP does it
# `DistributedDataParallel(module, bucket_cap_mb=25)`:
#
# 1. broadcasts rank 0's parameters, so every rank starts equal;
# 2. assigns the parameters to buckets in reverse registration order, closing a bucket once it
#    holds `bucket_cap_mb`, and registers a hook on each parameter;
# 3. in backward, each hook copies its gradient, already divided by N, into its slot of the
#    bucket's flat buffer; when a bucket's last gradient arrives, it starts a non-blocking
#    `all_reduce` of the buffer (buckets start in order, the same on every rank);
# 4. the hook of the last gradient waits for every bucket and points each `.grad` at its slice of
#    the bucket, now the average over ranks. `loss.backward()` returns with averaged gradients.
#
# The code, as a student reads it: the buckets are made once, at construction, from the
# parameters in reverse registration order...

# %%
def show(obj):
    """Print ``obj``'s source without the build track's region markers (``### BEGIN SOLUTION``), so
    it reads the same in the full package and in a student's finished one."""
    print("".join(line for line in inspect.getsource(obj).splitlines(True)
                  if not line.lstrip().startswith(("### BEGIN SOLUTION", "### END SOLUTION"))))


show(ddp._make_buckets)
show(ddp._Bucket)

# %% [markdown]
# ...and the reducer is the hook each parameter calls when its gradient is ready: copy it into the
# bucket, launch every bucket that is now complete (in order, so all ranks issue the same
# all-reduces in the same order), and, at the last gradient, wait for all of them.

# %%
for method in (DistributedDataParallel._on_gradient, DistributedDataParallel._launch_ready,
               DistributedDataParallel._finish):
    show(method)

# %% [markdown]
# The buckets of the model above, drawn with that same `_make_buckets` (in one process, no
# communication needed): each parameter a bar as long as its bytes, in the order backward
# produces them, coloured by bucket.

# %%
reverse_order = list(reversed(list(model.named_parameters())))
fig, axes = plt.subplots(3, 1, figsize=(10, 2.8), sharex=True)
for ax, cap in zip(axes, (25, 2, 0.5)):
    buckets = ddp._make_buckets([p for _, p in reverse_order], cap * 1024 * 1024)
    bucket_of = {id(p): k for k, b in enumerate(buckets) for p in b.params}
    start = 0.0
    for name, p in reverse_order:
        mb = p.nbytes / 2**20
        ax.barh(0, mb, left=start, color=f"C{bucket_of[id(p)]}", edgecolor="white")
        if mb >= 0.25:
            ax.text(start + mb / 2, 0, name, ha="center", va="center", fontsize=7)
        start += mb
    ax.set_yticks([0], [f"cap {cap} MB:\n{len(buckets)} bucket(s)"])
axes[-1].set_xlabel("MB of gradients, in the order backward produces them (last layer first)")
plt.tight_layout()
plt.show()

# %% [markdown]
# Inside `with model.no_sync():` the hooks do nothing and gradients accumulate locally; the next
# synchronised backward averages the accumulated sum (gradient accumulation without an all-reduce
# per micro-batch). `scripts/ddp_internals.py` shows the buckets of this model for three bucket
# sizes on two ranks, checks `no_sync`, and records one backward:

# %%
job = launch(Path("scripts") / "ddp_internals.py", nprocs=2, timeout=120)
assert job.returncode == 0, job.stderr
*lines, record = job.stdout.splitlines()
print("\n".join(lines))
timelines = json.loads(record.removeprefix("JSON "))

# %% [markdown]
# Each 512 x 512 weight is 1 MB of float32, so with 0.5 MB buckets every layer gets its own
# bucket (the small last layer shares one with the layer before); with 2 MB, the first bucket
# closes only once it holds layers 8, 6 and 4 (just over 2 MB), and a bucket may exceed the cap by
# its last parameter.
#
# ## The overlap, drawn
# The script timed one backward on rank 0 with 0.5 MB buckets and one with a single bucket. Top
# row of each panel: when each layer's gradients arrived; below: each bucket's all-reduce, from
# its launch to the moment DDP saw it finished.

# %%
fig, axes = plt.subplots(2, 1, figsize=(10, 4.6), sharex=True)
for ax, (title, t) in zip(axes, timelines.items()):
    layers = sorted({name.split(".")[0] for name, _ in t["arrived"]}, key=int, reverse=True)
    for name, ms in t["arrived"]:
        ax.plot([ms, ms], [-0.35, 0.35], color="tab:blue", linewidth=2)
    for layer in layers:
        ms = max(m for n, m in t["arrived"] if n.startswith(layer + "."))
        ax.annotate(layer, (ms, -0.4), fontsize=8, ha="center", va="bottom")
    launched = {k: ms for event, k, ms in t["buckets"] if event == "launch"}
    done = {k: ms for event, k, ms in t["buckets"] if event == "done"}
    for k in launched:
        ax.broken_barh([(launched[k], done[k] - launched[k])], (k + 1 - 0.35, 0.7), facecolor="tab:orange")
    ax.axvline(t["backward_ms"], color="black", linestyle="--", linewidth=1)
    ax.set_yticks(range(len(launched) + 1), ["gradients\nof layer"] + [f"bucket {k}" for k in launched])
    ax.set_ylim(len(launched) + 0.6, -0.9)
    ax.set_title(f"{title}: backward returned at the dashed line", fontsize=10)
axes[-1].set_xlabel("ms since the start of backward (rank 0 of 2)")
plt.tight_layout()
plt.show()

# %% [markdown]
# With small buckets the first all-reduces start while the earlier layers are still computing their
# gradients; with one bucket nothing is sent until the last gradient exists, and the whole
# all-reduce comes after backward. Two things blur the picture on this machine, and the drawing
# changes from run to run. MPI moves a message forward only while some MPI call runs, so a
# bucket is seen "done" at the next gradient hook or at the final wait (the orange bars end late),
# and real overlap needs a transport that progresses on its own (NCCL on GPUs, or an MPI progress
# thread). And two ranks sharing two busy cores have no idle hardware to overlap with: overlap
# pays when the network does the work while the cores compute. `benchmarks/bench_ddp.py` times
# whole steps with buckets, with one bucket, and without communication.

# %% [markdown]
# ## Predict, then run
# 1. With `bucket_cap_mb=1`, how many buckets does this model get, and which layers share one?
# 2. A model whose parameters are float32 and float16 (mixed): can one bucket hold both?
# 3. With one bucket, does its all-reduce start before or after the last gradient has arrived? And
#    the first of the small buckets?

# %%
print("1.", [[name for name, p in reverse_order if any(p is q for q in b.params)]
             for b in ddp._make_buckets([p for _, p in reverse_order], 1 * 1024 * 1024)])
mixed = [nn.Parameter(minigrad.zeros(4)), nn.Parameter(minigrad.zeros(4, dtype=minigrad.float16)),
         nn.Parameter(minigrad.zeros(4))]
print("2. dtypes per bucket:", [[str(p.dtype) for p in b.params] for b in ddp._make_buckets(mixed, 2**20)],
      "(one dtype per flat buffer)")
for title, t in timelines.items():
    first_launch = min(ms for event, _, ms in t["buckets"] if event == "launch")
    print(f"3. {title}: first all-reduce launched after the last gradient arrived:",
          first_launch >= max(ms for _, ms in t["arrived"]))
