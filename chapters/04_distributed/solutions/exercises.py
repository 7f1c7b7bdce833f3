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
# # Chapter 04 exercises: distributed training
#
# Nine exercises, one per idea of the chapter. They all run in this one process: the "ranks" are
# entries of a Python list, and a message is a copy from one entry to another, so you can see every
# step. Write your code where it says `raise NotImplementedError`, then run the check cell below
# it: it compares your answer with minigrad's own implementation or with known values, and fails
# with a message if it is wrong. The exercises are independent; do them in any order (run the
# setup cell first). See your score with
# `python -m minigrad.course grade chapters/04_distributed/exercises.ipynb`.

# %%
import math

import numpy as np

import minigrad
from minigrad import nn
from minigrad.course import answer
from minigrad.distributed import DistributedSampler, gpipe_bubble
from minigrad.distributed.ddp import _make_buckets

minigrad.manual_seed(0)


def gradients(model, x, y):
    """The gradient of the mean cross-entropy of ``model`` on (x, y): one numpy array per parameter."""
    model.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    return [p.grad.numpy().copy() for p in model.parameters()]

# %% [markdown]
# ## Exercise 1: combining the shards' gradients
# Each rank computes the gradient of its *mean* loss over its own shard of the batch (04.1). When
# the shards are not all the same size, their plain average is not the full batch's gradient.
# Given each shard's gradients and its number of samples, return the gradient of the mean loss
# over all the samples together.

# %%
# Exercise 1: Combining the shards' gradients
def combine_shard_gradients(shard_grads, shard_sizes):
    """shard_grads[k]: list of numpy arrays, shard k's gradient of its mean loss, one per parameter;
    shard_sizes[k]: the number of samples in shard k. Returns one numpy array per parameter."""
    ### BEGIN SOLUTION
    total = sum(shard_sizes)
    return [sum(n * grads[j] for grads, n in zip(shard_grads, shard_sizes)) / total
            for j in range(len(shard_grads[0]))]
    ### END SOLUTION

# %%
# Check 1
model1 = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
x1, y1 = minigrad.randn(50, 6), minigrad.randint(0, 3, (50,))
full1 = gradients(model1, x1, y1)
for sizes in ([25, 25], [20, 20, 10], [1, 30, 19], [50]):
    bounds = np.cumsum([0] + sizes)
    shards = [gradients(model1, x1[a:b], y1[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    got = answer(combine_shard_gradients(shards, sizes))
    assert len(got) == len(full1), f"expected {len(full1)} gradients (one per parameter), got {len(got)}"
    for j, (g, f) in enumerate(zip(got, full1)):
        assert np.allclose(g, f, atol=1e-6), f"shards {sizes}, parameter {j}: expected\n{f}\ngot\n{g}"
print("Check 1 passed")

# %% [markdown]
# ## Exercise 2: each rank's share of the data
# Reproduce `DistributedSampler`: the indices of a dataset of `n` samples that rank `rank` of
# `num_replicas` reads in epoch `epoch`.
#
# 1. Start from `np.random.default_rng(seed + epoch).permutation(n)` if `shuffle`, else
#    `0, 1, ..., n - 1`.
# 2. Without `drop_last`, pad the list to the next multiple of `num_replicas` by repeating it from
#    its start (as often as needed). With `drop_last`, cut it to the largest multiple of
#    `num_replicas` instead.
# 3. Rank r takes positions r, r + num_replicas, r + 2 num_replicas, ... of that list.
#
# Return a list of Python ints.

# %%
# Exercise 2: Each rank's share of the data
def shard_indices(n, num_replicas, rank, shuffle=True, seed=0, epoch=0, drop_last=False):
    ### BEGIN SOLUTION
    indices = [int(i) for i in np.random.default_rng(seed + epoch).permutation(n)] if shuffle else list(range(n))
    if drop_last:
        total = n // num_replicas * num_replicas
        indices = indices[:total]
    else:
        total = math.ceil(n / num_replicas) * num_replicas
        while len(indices) < total:
            indices += indices[:total - len(indices)]
    return indices[rank:total:num_replicas]
    ### END SOLUTION

# %%
# Check 2
for n in (10, 11, 16, 7, 2):
    for replicas in (1, 2, 3, 4):
        for shuffle in (False, True):
            for drop_last in (False, True):
                for epoch in (0, 1):
                    for rank in range(replicas):
                        sampler = DistributedSampler(range(n), num_replicas=replicas, rank=rank, shuffle=shuffle,
                                                     seed=3, drop_last=drop_last)
                        sampler.set_epoch(epoch)
                        want = list(sampler)
                        got = answer(list(shard_indices(n, replicas, rank, shuffle=shuffle, seed=3, epoch=epoch,
                                                        drop_last=drop_last)))
                        assert list(got) == want, (f"n={n}, num_replicas={replicas}, rank={rank}, shuffle={shuffle}, "
                                                   f"drop_last={drop_last}, epoch={epoch}: expected {want}, got {got}")
print("Check 2 passed")

# %% [markdown]
# ## Exercise 3: a tree all-reduce
# Plan the messages of an all-reduce over N ranks along a *binomial tree* (04.2): in round 1 rank 1
# sends its vector to rank 0, rank 3 to rank 2, rank 5 to rank 4, ..., and each receiver adds it to
# its own; in round 2 rank 2 sends to rank 0, rank 6 to rank 4, ...; the distance doubles each round
# until rank 0 holds the sum, after $\lceil\log_2 N\rceil$ rounds. Then the same tree, in reverse
# order of rounds and with every message reversed, copies the sum back to everyone.
#
# Return the rounds: a list, each round a list of messages `(op, src, dst)` with `op` either
# `"add"` (dst adds src's vector to its own) or `"copy"` (dst replaces its vector by src's). The
# check *replays* your plan on real vectors: the messages of a round are all sent at once (each
# carries the sender's vector from before the round), and a rank may send at most one and receive
# at most one message per round.

# %%
# Exercise 3: A tree all-reduce
def tree_all_reduce_schedule(N):
    ### BEGIN SOLUTION
    reduce_rounds, distance = [], 1
    while distance < N:
        reduce_rounds.append([("add", r + distance, r) for r in range(0, N, 2 * distance) if r + distance < N])
        distance *= 2
    broadcast_rounds = [[("copy", dst, src) for _, src, dst in messages] for messages in reversed(reduce_rounds)]
    return reduce_rounds + broadcast_rounds
    ### END SOLUTION

# %%
# Check 3
def replay(rounds, vectors):
    vectors = [v.copy() for v in vectors]
    for k, messages in enumerate(rounds):
        senders, receivers = [m[1] for m in messages], [m[2] for m in messages]
        assert len(set(senders)) == len(senders) and len(set(receivers)) == len(receivers), \
            f"round {k}: a rank sends or receives more than one message: {messages}"
        sent = {src: vectors[src].copy() for src in senders}  # every message leaves at once
        for op, src, dst in messages:
            assert op in ("add", "copy") and src != dst, f"round {k}: bad message {(op, src, dst)}"
            vectors[dst] = vectors[dst] + sent[src] if op == "add" else sent[src]
    return vectors


rng3 = np.random.default_rng(3)
for N in range(1, 10):
    vectors = [rng3.standard_normal(5) for _ in range(N)]
    rounds = answer(tree_all_reduce_schedule(N))
    want_rounds = 2 * math.ceil(math.log2(N))
    assert len(rounds) == want_rounds, f"N={N}: expected 2 ceil(log2 N) = {want_rounds} rounds, got {len(rounds)}"
    half = replay(rounds[:want_rounds // 2], vectors)
    assert np.allclose(half[0], sum(vectors)), f"N={N}: after the reduce rounds rank 0 should hold the sum"
    for r, v in enumerate(replay(rounds, vectors)):
        assert np.allclose(v, sum(vectors)), f"N={N}: rank {r} ends with {v}, expected the sum {sum(vectors)}"
print("Check 3 passed")

# %% [markdown]
# ## Exercise 4: the ring's reduce-scatter
# The first phase of `ring_all_reduce` (04.2). Every rank's vector of n elements is cut into N
# chunks, chunk c being `v[c * n // N : (c + 1) * n // N]`. At step s = 0, 1, ..., N - 2, every
# rank r sends its chunk (r - s) mod N to rank (r + 1) mod N, which adds it into its own copy of
# that chunk. All the sends of a step happen at once: a message carries the chunk as it was before
# the step. Afterwards rank r's chunk (r + 1) mod N holds the sum over all ranks.
#
# Return the N vectors as they are after the N - 1 steps (new arrays: leave the inputs unchanged).

# %%
# Exercise 4: The ring's reduce-scatter
def ring_reduce_scatter(vectors):
    """vectors[r]: rank r's 1-D numpy array; all have the same length."""
    ### BEGIN SOLUTION
    N = len(vectors)
    out = [v.copy() for v in vectors]
    edges = [c * out[0].size // N for c in range(N + 1)]
    for s in range(N - 1):
        messages = [(r, (r - s) % N) for r in range(N)]
        payloads = [out[r][edges[c]:edges[c + 1]].copy() for r, c in messages]
        for (r, c), data in zip(messages, payloads):
            out[(r + 1) % N][edges[c]:edges[c + 1]] += data
    return out
    ### END SOLUTION

# %%
# Check 4
rng4 = np.random.default_rng(4)
for N, n in [(1, 5), (2, 6), (3, 7), (4, 4), (4, 10), (5, 23), (3, 2)]:
    vectors = [rng4.standard_normal(n) for _ in range(N)]
    before = [v.copy() for v in vectors]
    got, kept = answer((ring_reduce_scatter(vectors), [np.array_equal(a, b) for a, b in zip(vectors, before)]))
    assert all(kept), "the input vectors were changed"
    assert len(got) == N and all(g.shape == (n,) for g in got), f"expected {N} vectors of {n} elements"
    edges = [c * n // N for c in range(N + 1)]
    for r in range(N):
        for k in range(N):
            # after reduce-scatter, rank r's chunk r - k holds the values of ranks r, r - 1, ..., r - k
            c = (r - k) % N
            want = sum(vectors[(r - j) % N][edges[c]:edges[c + 1]] for j in range(k + 1))
            assert np.allclose(got[r][edges[c]:edges[c + 1]], want), \
                f"N={N}, n={n}: rank {r}'s chunk {c} should hold the sum of ranks {[(r - j) % N for j in range(k + 1)]}"
print("Check 4 passed")

# %% [markdown]
# ## Exercise 5: the ring's all-gather
# The second phase. After reduce-scatter, rank r's chunk (r + 1) mod N is finished and its other
# chunks are stale (here they hold NaN). At step s = 0, 1, ..., N - 2, every rank r sends its
# chunk (r + 1 - s) mod N to rank (r + 1) mod N, which *stores* it in place of its own copy
# (again, all at once). Return the N vectors afterwards, all finished (new arrays).

# %%
# Exercise 5: The ring's all-gather
def ring_all_gather(vectors):
    """vectors[r]: rank r's 1-D numpy array, whose chunk (r + 1) mod N is finished."""
    ### BEGIN SOLUTION
    N = len(vectors)
    out = [v.copy() for v in vectors]
    edges = [c * out[0].size // N for c in range(N + 1)]
    for s in range(N - 1):
        messages = [(r, (r + 1 - s) % N) for r in range(N)]
        payloads = [out[r][edges[c]:edges[c + 1]].copy() for r, c in messages]
        for (r, c), data in zip(messages, payloads):
            out[(r + 1) % N][edges[c]:edges[c + 1]] = data
    return out
    ### END SOLUTION

# %%
# Check 5
rng5 = np.random.default_rng(5)
for N, n in [(1, 5), (2, 6), (3, 7), (4, 10), (5, 23), (6, 6)]:
    total = rng5.standard_normal(n)
    edges = [c * n // N for c in range(N + 1)]
    stale = []
    for r in range(N):
        v = np.full(n, np.nan)
        c = (r + 1) % N
        v[edges[c]:edges[c + 1]] = total[edges[c]:edges[c + 1]]
        stale.append(v)
    got = answer(ring_all_gather(stale))
    assert len(got) == N, f"expected {N} vectors, got {len(got)}"
    for r, v in enumerate(got):
        assert np.allclose(v, total), f"N={N}, n={n}: rank {r} ends with\n{v}\nexpected\n{total}"
print("Check 5 passed")

# %% [markdown]
# ## Exercise 6: the bytes each rank sends
# In `ring_all_reduce` of a tensor of `numel` elements of `itemsize` bytes on `world_size` ranks,
# how many bytes does each rank send? Use the chunks and the steps of exercises 4 and 5 (rank r
# sends chunk (r - s) mod N in reduce-scatter step s, chunk (r + 1 - s) mod N in all-gather step s);
# when N does not divide `numel`, the chunks differ in size and so do the ranks' totals. Return
# a list with one int per rank (this is what `ring_all_reduce` returns on each rank).

# %%
# Exercise 6: The bytes each rank sends
def ring_bytes_sent(numel, world_size, itemsize=4):
    ### BEGIN SOLUTION
    N = world_size
    size = [(c + 1) * numel // N - c * numel // N for c in range(N)]
    return [itemsize * sum(size[(r - s) % N] + size[(r + 1 - s) % N] for s in range(N - 1)) for r in range(N)]
    ### END SOLUTION

# %%
# Check 6
known = {(7, 3, 4): [36, 36, 40], (2**20, 2, 4): [2**22, 2**22], (4000, 4, 4): [24000] * 4, (10, 4, 8): [120] * 4,
         (1000, 1, 4): [0], (5, 2, 4): [20, 20]}
for (numel, N, itemsize), want in known.items():
    got = answer(ring_bytes_sent(numel, N, itemsize))
    assert list(got) == want, f"numel={numel}, world_size={N}, itemsize={itemsize}: expected {want}, got {got}"
for numel, N in [(1001, 3), (17, 5), (2**16 + 1, 8)]:
    got = answer(ring_bytes_sent(numel, N))
    assert sum(got) == 2 * (N - 1) * numel * 4, \
        f"numel={numel}, N={N}: the ranks together send 2(N-1) x the tensor, {2 * (N - 1) * numel * 4} bytes; got {sum(got)}"
print("Check 6 passed")

# %% [markdown]
# ## Exercise 7: DDP's buckets
# Given a model's parameters as `(name, nbytes)` pairs in registration order, return the buckets
# `DistributedDataParallel` makes (04.3): walk the parameters in *reverse* registration order,
# adding each to the current bucket; once the current bucket holds at least `cap_bytes`, the next
# parameter starts a new bucket. Return the buckets as lists of names, in the order their
# all-reduces start.

# %%
# Exercise 7: DDP's buckets
def assign_buckets(params, cap_bytes):
    ### BEGIN SOLUTION
    buckets, current, size = [], [], 0
    for name, nbytes in reversed(params):
        if current and size >= cap_bytes:
            buckets.append(current)
            current, size = [], 0
        current.append(name)
        size += nbytes
    if current:
        buckets.append(current)
    return buckets
    ### END SOLUTION

# %%
# Check 7
models7 = [nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)),
           nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 64), nn.Linear(64, 10)),
           nn.LSTM(16, 32)]
for model in models7:
    named = list(model.named_parameters())
    names = {id(p): n for n, p in named}
    for cap in (25 * 2**20, 2**20, 2**16, 1000, 1):
        want = [[names[id(p)] for p in b.params] for b in _make_buckets([p for _, p in reversed(named)], cap)]
        got = answer(assign_buckets([(n, p.nbytes) for n, p in named], cap))
        assert got == want, f"cap {cap} bytes: expected {want}, got {got}"
print("Check 7 passed")

# %% [markdown]
# ## Exercise 8: a GPipe schedule with unequal stages
# 04.4 drew the GPipe schedule for stages of equal cost. Compute it for any costs: stage s takes
# `t_f[s]` for the forward of one micro-batch and `t_b[s]` for its backward. Each stage runs F of
# micro-batches 0, 1, ..., M - 1, then B of 0, 1, ..., M - 1, in that order, one at a time. F of
# micro-batch i on stage s also needs F of i on stage s - 1 finished; B of i on stage s needs B of
# i on stage s + 1 finished. Messages take no time, and every op starts as soon as it can.
#
# Return a dict mapping `(stage, kind, microbatch)` (kind `"F"` or `"B"`) to `(start, end)`.

# %%
# Exercise 8: A GPipe schedule with unequal stages
def gpipe_schedule(t_f, t_b, M):
    P = len(t_f)
    ### BEGIN SOLUTION
    times, free = {}, [0.0] * P
    for kind, stages, durations, neighbour in (("F", range(P), t_f, -1), ("B", range(P - 1, -1, -1), t_b, 1)):
        for i in range(M):
            for s in stages:
                upstream = times.get((s + neighbour, kind, i), (0.0, 0.0))[1]
                start = max(free[s], upstream)
                times[(s, kind, i)] = (start, start + durations[s])
                free[s] = start + durations[s]
    return times
    ### END SOLUTION

# %%
# Check 8
def bubble_of(times, P, M):
    """Each stage's idle fraction of the step, averaged over the stages."""
    makespan = max(end for _, end in times.values())
    busy = [sum(end - start for (s, _, _), (start, end) in times.items() if s == stage) for stage in range(P)]
    return 1 - sum(busy) / (P * makespan)


for P, M in [(1, 3), (2, 1), (2, 4), (4, 4), (3, 5), (4, 8)]:
    times = answer(gpipe_schedule([1.0] * P, [2.0] * P, M))
    assert len(times) == 2 * P * M, f"P={P}, M={M}: expected {2 * P * M} ops, got {len(times)}"
    assert times[(P - 1, "F", 0)] == (P - 1, P), f"P={P}: F0 reaches the last stage at {P - 1}, got {times[(P - 1, 'F', 0)]}"
    got = bubble_of(times, P, M)
    assert math.isclose(got, gpipe_bubble(P, M)), f"P={P}, M={M}: bubble {got}, expected {gpipe_bubble(P, M)}"
unequal = answer(gpipe_schedule([1.0, 2.0], [2.0, 4.0], 2))
want = {(0, "F", 0): (0, 1), (0, "F", 1): (1, 2), (1, "F", 0): (1, 3), (1, "F", 1): (3, 5),
        (1, "B", 0): (5, 9), (1, "B", 1): (9, 13), (0, "B", 0): (9, 11), (0, "B", 1): (13, 15)}
for key, value in want.items():
    assert unequal[key] == value, f"t_f=[1, 2], t_b=[2, 4], M=2: {key} should run {value}, got {unequal[key]}"
print(f"stages of unequal cost: bubble {bubble_of(unequal, 2, 2):.2f}, against {gpipe_bubble(2, 2):.2f} "
      "for equal stages: the slowest stage sets the pace")
print("Check 8 passed")

# %% [markdown]
# ## Exercise 9: a row-parallel linear layer
# Simulate `RowParallelLinear` (04.4) on `world_size` ranks in one process: rank r holds columns
# `r*k : (r+1)*k` of `weight` (k = in_features / world_size) and multiplies them with the same
# columns of `x`; the partial products are summed (the all-reduce) and the bias is added once.
# Use minigrad ops, so that gradients flow back to `x`, `weight` and `bias`. Return the list of
# partial products and the output.

# %%
# Exercise 9: A row-parallel linear layer
def row_parallel_linear(x, weight, bias, world_size):
    """x: (batch, in_features), weight: (out_features, in_features), bias: (out_features,) Tensors."""
    k = x.shape[1] // world_size
    ### BEGIN SOLUTION
    partials = [x[:, r * k:(r + 1) * k] @ weight[:, r * k:(r + 1) * k].T for r in range(world_size)]
    y = partials[0]
    for p in partials[1:]:
        y = y + p
    return partials, y + bias
    ### END SOLUTION

# %%
# Check 9
layer = nn.Linear(12, 5)
x9 = minigrad.randn(4, 12, requires_grad=True)
nn.functional.linear(x9, layer.weight, layer.bias).pow(2).sum().backward()
want_grads = [t.grad.numpy().copy() for t in (x9, layer.weight, layer.bias)]
for t in (x9, layer.weight, layer.bias):
    t.grad = None


def run_row_parallel(fn):
    """fn's partial products and output, and the gradients that flow back from the output's squares."""
    partials, y = fn(x9, layer.weight, layer.bias, 3)
    y.pow(2).sum().backward()
    return ([p.detach().numpy() for p in partials], y.detach().numpy(),
            [None if t.grad is None else t.grad.numpy() for t in (x9, layer.weight, layer.bias)])


partials, y9, grads = answer(run_row_parallel(row_parallel_linear))
assert len(partials) == 3, f"expected 3 partial products, got {len(partials)}"
X, Wn = x9.detach().numpy(), layer.weight.detach().numpy()
for r, p in enumerate(partials):
    assert tuple(p.shape) == (4, 5), f"partial {r}: expected shape (4, 5), got {tuple(p.shape)}"
    assert np.allclose(p, X[:, 4 * r:4 * r + 4] @ Wn[:, 4 * r:4 * r + 4].T, atol=1e-5), \
        f"partial {r} is not x[:, {4 * r}:{4 * r + 4}] @ weight[:, {4 * r}:{4 * r + 4}].T"
assert np.allclose(y9, layer(x9).detach().numpy(), atol=1e-5), "the output differs from the full layer's"
for name, grad, want in zip(("x", "weight", "bias"), grads, want_grads):
    assert grad is not None and np.allclose(grad, want, atol=1e-4), \
        f"the gradient of {name} differs from the full layer's: use minigrad ops so that it flows back"
print("Check 9 passed")
