"""Checks that run on every rank of an MPI job: ``mpiexec -n N python checks.py SECTION...``.

tests/distributed/test_distributed.py launches this script (N = 2 and 4) and reads one "ok <section>" line per
section from rank 0. A failed assertion on any rank aborts the whole job with that rank's
traceback, so a failure shows up as a non-zero exit status, never as a hang.
"""

import sys
import time

import numpy as np

import minigrad
import minigrad.distributed as dist
from minigrad import nn, optim
from minigrad.autograd import Function
from minigrad.data import DataLoader, TensorDataset
from minigrad.distributed import ReduceOp
from minigrad.errors import ShapeError

dist.init_process_group("mpi")
RANK, N = dist.get_rank(), dist.get_world_size()


def rank_values(shape, dtype, rank, seed=0):
    """What rank ``rank`` contributes: every rank can compute every other rank's values."""
    rng = np.random.default_rng(seed + 1000 * rank)
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(-5, 6, shape).astype(dtype)


def every_rank(shape, dtype, seed=0):
    return np.stack([rank_values(shape, dtype, r, seed) for r in range(N)])


def close(got, want, tol=1e-5):
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


# -- collectives ----------------------------------------------------------------------------------
def collectives():
    refs = {ReduceOp.SUM: np.sum, ReduceOp.AVG: np.mean, ReduceOp.MAX: np.max, ReduceOp.MIN: np.min,
            ReduceOp.PRODUCT: np.prod}
    for shape in [(1,), (7,), (3, 5), (2, 3, 4), (N + 1,), (1000,)]:
        for dtype in ["float32", "float64", "int64"]:
            everyone = every_rank(shape, dtype)
            for op, ref in refs.items():
                if op is ReduceOp.AVG and dtype == "int64":
                    continue
                t = minigrad.tensor(everyone[RANK])
                dist.all_reduce(t, op)
                close(t.numpy(), ref(everyone, axis=0))
                if dtype == "float32":  # the ring on the same inputs, odd sizes included
                    t = minigrad.tensor(everyone[RANK])
                    dist.ring_all_reduce(t, op)
                    close(t.numpy(), ref(everyone, axis=0), 1e-4)
    # in place: views and non-contiguous tensors get the result, and the version counter moves
    base = minigrad.tensor(every_rank((4, 6), "float32")[RANK])
    view = base.T
    v0 = base._version
    dist.all_reduce(view)
    close(base.numpy(), every_rank((4, 6), "float32").sum(0))
    assert base._version > v0
    # async all_reduce overlaps with other work, and is complete after wait()
    t = minigrad.tensor(every_rank((257,), "float32")[RANK])
    work = dist.all_reduce(t, ReduceOp.AVG, async_op=True)
    work.wait()
    assert work.is_completed()
    close(t.numpy(), every_rank((257,), "float32").mean(0))
    # broadcast from every root
    for src in range(N):
        t = minigrad.tensor(every_rank((3, 3), "float64")[RANK])
        dist.broadcast(t, src)
        close(t.numpy(), every_rank((3, 3), "float64")[src])
    # all_gather (list and flat) and reduce_scatter (list and flat)
    everyone = every_rank((5,), "float32")
    out = [minigrad.zeros(5) for _ in range(N)]
    dist.all_gather(out, minigrad.tensor(everyone[RANK]))
    for r in range(N):
        close(out[r].numpy(), everyone[r])
    flat = minigrad.zeros(N * 5)
    dist.all_gather_into_tensor(flat, minigrad.tensor(everyone[RANK]), async_op=True).wait()
    close(flat.numpy(), everyone.reshape(-1))
    blocks = every_rank((N, 3), "float32", seed=7)  # rank r's input: N blocks of 3
    out = minigrad.zeros(3)
    dist.reduce_scatter(out, [minigrad.tensor(b) for b in blocks[RANK]])
    close(out.numpy(), blocks.sum(0)[RANK])
    out = minigrad.zeros(3)
    dist.reduce_scatter_tensor(out, minigrad.tensor(blocks[RANK].reshape(-1)), ReduceOp.MAX)
    close(out.numpy(), blocks.max(0)[RANK])
    # point to point around a ring, blocking and not
    right, left = (RANK + 1) % N, (RANK - 1) % N
    send = dist.isend(minigrad.tensor(everyone[RANK]), right, tag=3)
    got = minigrad.zeros(5)
    assert dist.recv(got, left, tag=3) == left
    send.wait()
    close(got.numpy(), everyone[left])
    got = minigrad.zeros(5)
    recv = dist.irecv(got, None, tag=4)
    dist.send(minigrad.tensor(everyone[RANK]), right, tag=4)
    recv.wait()
    assert recv.source == left
    close(got.numpy(), everyone[left])
    # mismatched shapes raise on every rank, naming the shapes
    for call in (lambda t: dist.all_reduce(t), lambda t: dist.ring_all_reduce(t), lambda t: dist.broadcast(t, 0)):
        try:
            call(minigrad.zeros(3 + (RANK == N - 1)))
        except ShapeError as e:
            assert "(3,)" in str(e) and "(4,)" in str(e), e
        else:
            raise AssertionError("mismatched shapes did not raise")
    # a receive buffer of the wrong size raises instead of reading garbage
    if RANK < 2:
        try:
            if RANK == 0:
                dist.send(minigrad.ones(5), 1, tag=9)
            else:
                dist.recv(minigrad.zeros(6), 0, tag=9)
        except ShapeError as e:
            assert RANK == 1 and "24 bytes" in str(e) and "20" in str(e), e
        else:
            assert RANK == 0, "a short message did not raise"
    dist.barrier()


def ring_bytes():
    for numel in [N * 1000, N * 1000 + 3, 5]:
        t = minigrad.ones(numel)
        sent = dist.ring_all_reduce(t)
        close(t.numpy(), np.full(numel, N))
        every = minigrad.zeros(N, dtype=minigrad.int64)
        dist.all_gather_into_tensor(every, minigrad.tensor([sent]))
        total = int(every.sum())
        assert total == 2 * (N - 1) * t.nbytes, (total, t.nbytes)  # 2(N-1)/N of the size per rank, on average
        if numel % N == 0:
            assert sent == 2 * (N - 1) * t.nbytes // N, (sent, t.nbytes)


# -- DDP ------------------------------------------------------------------------------------------
def mlp():
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3))


def ddp():
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((64, 6)).astype(np.float32), rng.integers(0, 3, 64)
    data = TensorDataset(x, y)
    B, steps = 16, 4
    loss_fn = nn.CrossEntropyLoss()

    def reference(accumulate):
        minigrad.manual_seed(0)
        model = mlp()
        opt = optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
        loader = DataLoader(data, batch_size=B // accumulate,
                            sampler=dist.DistributedSampler(data, num_replicas=1, rank=0, seed=3))
        for i, (xb, yb) in enumerate(loader):
            (loss_fn(model(xb), yb) / accumulate).backward()
            if (i + 1) % accumulate == 0:
                opt.step()
                opt.zero_grad()
            if i + 1 == steps * accumulate:
                break
        return model

    for cap, accumulate in [(25, 1), (1e-6, 1), (25, 2), (1e-6, 2)]:
        minigrad.manual_seed(RANK)  # different initial weights: DDP must broadcast rank 0's
        model = mlp()
        minigrad.manual_seed(0)
        assert RANK == 0 or not np.allclose(model[0].weight.detach().numpy(), mlp()[0].weight.detach().numpy())
        minigrad.manual_seed(0)
        want = reference(accumulate)
        model = dist.DistributedDataParallel(model, bucket_cap_mb=cap)
        assert len(model.bucket_names()) == (1 if cap == 25 else 6), model.bucket_names()
        assert model.bucket_names()[-1][-1] == "0.weight"  # reverse registration order
        opt = optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
        sampler = dist.DistributedSampler(data, seed=3)
        loader = DataLoader(data, batch_size=B // N // accumulate, sampler=sampler)
        for i, (xb, yb) in enumerate(loader):
            if (i + 1) % accumulate:
                with model.no_sync():
                    (loss_fn(model(xb), yb) / accumulate).backward()
            else:
                (loss_fn(model(xb), yb) / accumulate).backward()
                opt.step()
                opt.zero_grad()
                for p in model.parameters():  # same parameters on every rank after every step
                    every = minigrad.zeros((N,) + p.shape)
                    dist.all_gather_into_tensor(every, p.detach())
                    assert np.array_equal(every.numpy().min(0), every.numpy().max(0))
            if i + 1 == steps * accumulate:
                break
        for (name, got), ref in zip(model.module.named_parameters(), want.parameters()):
            close(got.detach().numpy(), ref.detach().numpy())

    # a parameter that got no gradient is reported at the next forward, not waited for forever
    model = dist.DistributedDataParallel(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)))
    model.module[0](minigrad.ones(1, 2)).sum().backward()
    try:
        model(minigrad.ones(1, 2))
    except RuntimeError as e:
        assert "1.weight" in str(e) and "1.bias" in str(e), e
    else:
        raise AssertionError("DDP did not report the unused parameters")


# -- pipeline and model parallelism ---------------------------------------------------------------
class Slow(Function):
    """Identity that takes a fixed time: the stage costs do not depend on how busy the CPUs are."""

    @staticmethod
    def forward(ctx, x):
        time.sleep(0.004)
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        time.sleep(0.008)
        return g


class SlowLayer(nn.Module):
    def forward(self, x):
        return Slow.apply(x)


def pipeline(timed):
    def build():
        minigrad.manual_seed(1)
        layers = []
        for _ in range(N):
            layers += [nn.Linear(8, 8), nn.Tanh(), SlowLayer()]
        return nn.Sequential(*layers)

    rng = np.random.default_rng(2)
    x, y = (minigrad.tensor(rng.standard_normal((16, 8)).astype(np.float32)) for _ in range(2))
    full = build()
    nn.MSELoss()(full(x), y).backward()
    want = [p.grad.numpy() for p in full.parameters()]
    per_stage = len(want) // N
    bubbles = {}
    for m in ([1, 8] if timed else [4]):
        stage = dist.PipelineStage(dist.split_sequential(build(), N)[RANK])
        schedule = dist.ScheduleGPipe(stage, m, loss_fn=nn.MSELoss())
        losses = []
        if RANK == 0:
            out = schedule.step(x)
        else:
            out = schedule.step(target=y, losses=losses) if RANK == N - 1 else schedule.step()
        for p, w in zip(stage.submodule.parameters(), want[RANK * per_stage:(RANK + 1) * per_stage]):
            close(p.grad.numpy(), w)
        if RANK == N - 1:
            assert out.shape == (16, 8) and len(losses) == m
            close(out.numpy(), full(x).detach().numpy())
        every = minigrad.zeros(N, dtype=minigrad.float64)
        dist.all_gather_into_tensor(every, minigrad.tensor([schedule.bubble_fraction()], dtype=minigrad.float64))
        bubbles[m] = float(every.mean())
    if timed:
        if RANK == 0:
            for m, b in bubbles.items():
                print(f"bubble P={N} M={m}: measured {b:.3f}, theory {dist.gpipe_bubble(N, m):.3f}")
        assert bubbles[8] < bubbles[1] - 0.15, bubbles
        assert abs(bubbles[1] - dist.gpipe_bubble(N, 1)) < 0.15, bubbles


def model_parallel():
    minigrad.manual_seed(4)
    first, second = nn.Linear(6, 4 * N), nn.Linear(4 * N, 3)
    x = minigrad.randn(5, 6).requires_grad_()
    nn.MSELoss()(second(first(x).relu()), minigrad.zeros(5, 3)).backward()
    # column-parallel then row-parallel (Megatron's MLP), and each on its own with full-width in/out
    for gather in (False, True):
        col = dist.ColumnParallelLinear.from_linear(first, gather_output=gather)
        row = dist.RowParallelLinear.from_linear(second, input_is_parallel=not gather)
        xi = x.detach().requires_grad_()
        out = row(col(xi).relu())
        close(out.detach().numpy(), second(first(x).relu()).detach().numpy())
        nn.MSELoss()(out, minigrad.zeros(5, 3)).backward()
        k = 4
        close(col.weight.grad.numpy(), first.weight.grad.numpy()[RANK * k:(RANK + 1) * k])
        close(col.bias.grad.numpy(), first.bias.grad.numpy()[RANK * k:(RANK + 1) * k])
        close(row.weight.grad.numpy(), second.weight.grad.numpy()[:, RANK * k:(RANK + 1) * k])
        close(row.bias.grad.numpy(), second.bias.grad.numpy())
        close(xi.grad.numpy(), x.grad.numpy())


SECTIONS = {"collectives": collectives, "ring_bytes": ring_bytes, "ddp": ddp,
            "pipeline": lambda: pipeline(timed=False), "bubble": lambda: pipeline(timed=True),
            "model_parallel": model_parallel}

for name in sys.argv[1:]:
    SECTIONS[name]()
    dist.barrier()
    if RANK == 0:
        print("ok", name, flush=True)
dist.destroy_process_group()
