"""Checks of backend='nccl' on every rank of a job with one process per GPU:
``mpiexec -n N python nccl_checks.py`` (N = the GPUs; one rank also runs as plain ``python``).

tests/distributed/test_nccl.py runs it where a GPU is present and reads "ok nccl" from rank 0. The collectives
are compared with numpy on values every rank can compute for every other rank; DDP, fed by a
DevicePrefetcher, is compared with full-batch training on one GPU. A failure on any rank aborts
the whole job with that rank's traceback.
"""

import numpy as np

import minigrad
import minigrad.distributed as dist
from minigrad import nn, optim
from minigrad.data import DataLoader, DevicePrefetcher, TensorDataset
from minigrad.distributed import ReduceOp
from minigrad.distributed.process_group import group
from minigrad.errors import ShapeError

dist.init_process_group("nccl")
RANK, N = dist.get_rank(), dist.get_world_size()
DEV = group().backend.device


def values(rank, dtype, shape=(5, 3)):
    rng = np.random.default_rng(rank)
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(-5, 6, shape).astype(dtype)


def every(dtype, shape=(5, 3)):
    return np.stack([values(r, dtype, shape) for r in range(N)])


def on_gpu(array):
    return minigrad.tensor(array, device=DEV)


def close(got, want, tol=1e-5):
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def collectives():
    refs = {ReduceOp.SUM: np.sum, ReduceOp.AVG: np.mean, ReduceOp.MAX: np.max, ReduceOp.MIN: np.min,
            ReduceOp.PRODUCT: np.prod}
    for dtype, tol in [("float16", 1e-2), ("float32", 1e-5), ("float64", 1e-12), ("int32", 0), ("int64", 0)]:
        for op, ref in refs.items():
            if op is ReduceOp.AVG and dtype.startswith("int"):
                continue
            t = on_gpu(every(dtype)[RANK])
            dist.all_reduce(t, op)
            assert t.device == DEV and t.dtype == dtype
            close(t.numpy().astype(np.float64), ref(every(dtype).astype(np.float64), axis=0), tol)
    flags = np.arange(N * 3).reshape(N, 3) % (N + 1) == 0
    t = on_gpu(flags[RANK])
    dist.all_reduce(t, ReduceOp.SUM)
    assert t.numpy().tolist() == flags.any(0).tolist()
    # async, into a non-contiguous view, and the version counter moves
    base = on_gpu(every("float32", (4, 6))[RANK])
    view, version = base.T, base._version
    work = dist.all_reduce(view, async_op=True)
    work.wait()
    close(base.numpy(), every("float32", (4, 6)).sum(0))
    assert base._version > version
    # broadcast from the last rank, the gathers and reduce-scatter
    t = on_gpu(values(RANK, "float32"))
    dist.broadcast(t, N - 1)
    close(t.numpy(), values(N - 1, "float32"))
    out = minigrad.zeros((N, 5, 3), device=DEV)
    dist.all_gather_into_tensor(out, on_gpu(values(RANK, "float32")))
    close(out.numpy(), every("float32"))
    parts = [minigrad.zeros(5, 3, device=DEV) for _ in range(N)]
    dist.all_gather(parts, on_gpu(values(RANK, "float32")))
    close(np.stack([p.numpy() for p in parts]), every("float32"))
    out = minigrad.zeros(2, 3, device=DEV)
    dist.reduce_scatter_tensor(out, on_gpu(every("float32", (N * 2, 3))[RANK]))
    close(out.numpy(), every("float32", (N * 2, 3)).sum(0)[RANK * 2:RANK * 2 + 2])
    if N > 1:
        # messages around the ring, and the ring all-reduce built from them
        right, left = (RANK + 1) % N, (RANK - 1) % N
        got = minigrad.zeros(5, 3, device=DEV)
        receiving = dist.irecv(got, left)
        dist.isend(on_gpu(values(RANK, "float32")), right).wait()
        receiving.wait()
        close(got.numpy(), values(left, "float32"))
        t = on_gpu(every("float32", (1001,))[RANK])
        dist.ring_all_reduce(t)
        close(t.numpy(), every("float32", (1001,)).sum(0), 1e-4)
        try:
            dist.all_reduce(on_gpu(np.zeros(3 + RANK, np.float32)))
            raise AssertionError("mismatched shapes were not caught")
        except ShapeError as e:
            assert "same shape" in str(e)


def mlp():
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def ddp():
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((64, 6)).astype(np.float32), rng.integers(0, 3, 64)
    data, batch = TensorDataset(x, y), 16
    loss_fn = nn.CrossEntropyLoss()
    minigrad.manual_seed(0)
    want = mlp().to(DEV)
    opt = optim.SGD(want.parameters(), lr=0.2, momentum=0.9)
    for xb, yb in DevicePrefetcher(DataLoader(data, batch_size=batch), DEV):
        opt.zero_grad()
        loss_fn(want(xb), yb).backward()
        opt.step()
    minigrad.manual_seed(RANK)  # different initial weights: DDP broadcasts rank 0's
    model = dist.DistributedDataParallel(mlp().to(DEV))
    opt = optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    # rank r reads samples r, r + N, ...: the ranks' k-th batches make up the reference's k-th
    shard = dist.DistributedSampler(data, shuffle=False)
    for xb, yb in DevicePrefetcher(DataLoader(data, batch_size=batch // N, sampler=shard), DEV):
        opt.zero_grad()
        loss_fn(model(xb), yb).backward()
        opt.step()
    for got, ref in zip(model.module.parameters(), want.parameters()):
        assert got.device == DEV
        close(got.detach().numpy(), ref.detach().numpy(), 1e-4)


collectives()
ddp()
dist.barrier()
if RANK == 0:
    print("ok nccl", flush=True)
dist.destroy_process_group()
