"""``DistributedDataParallel``: the same model on every rank, each on its share of the batch, with
gradients averaged during backward so every rank takes the same optimizer step (chapter 04).

The mean loss over a batch of B is the mean of the N ranks' mean losses over B/N each, so the
average of the ranks' gradients is the full batch's gradient. Averaging parameter by parameter would
send many small messages; DDP packs gradients into *buckets* of about ``bucket_cap_mb``, in reverse
registration order (the order backward produces them), and starts a non-blocking all-reduce of a
bucket as soon as its last gradient arrives, so communication overlaps the rest of backward.

How the end of backward is found: a leaf's hook runs just before the engine adds the gradient into
``.grad``. Each hook copies (old ``.grad`` + new gradient) / N into the bucket; the hook of the last
parameter to get its gradient waits for every bucket, points each ``.grad`` at its averaged slice
of the bucket, and hands the engine that averaged gradient for its own parameter. So when
``loss.backward()`` returns, ``.grad`` holds the average, as in PyTorch.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from typing import Any, Iterator

from minigrad.autograd import grad_mode
from minigrad.distributed.collectives import _buffer
from minigrad.distributed.process_group import ReduceOp, Work, group
from minigrad.errors import ShapeError
from minigrad.nn.module import Module, Parameter
from minigrad._tensor import Tensor, _wrap

__all__ = ["DistributedDataParallel"]


class _Bucket:
    """Gradients of a few parameters, packed into one flat buffer and all-reduced together."""

    def __init__(self, params: list[Parameter]) -> None:
        self.params = params
        self.offsets = [0]
        for p in params:
            self.offsets.append(self.offsets[-1] + p.numel())
        self.buffer = params[0].device.xp.empty(self.offsets[-1], dtype=params[0].dtype)
        self.pending = len(params)
        self.work: Work | None = None

    def slot(self, i: int) -> Any:
        p = self.params[i]
        return self.buffer[self.offsets[i]:self.offsets[i + 1]].reshape(p.shape)


def _make_buckets(params: list[Parameter], cap_bytes: float) -> list[_Bucket]:
    """Consecutive runs of ``params`` of one dtype, each closed once it holds ``cap_bytes``."""
    buckets, current, size = [], [], 0
    for p in params:
        if current and (size >= cap_bytes or p.dtype != current[0].dtype or p.device is not current[0].device):
            buckets.append(_Bucket(current))
            current, size = [], 0
        current.append(p)
        size += p.nbytes
    if current:
        buckets.append(_Bucket(current))
    return buckets


class DistributedDataParallel(Module):
    """Wrap ``module`` so that its gradients are averaged over all ranks during ``backward``.

    Rank 0's parameters (and buffers) are broadcast at construction, so every rank starts equal.
    ``broadcast_buffers`` also broadcasts buffers (BatchNorm's running statistics) at every forward.
    After ``backward``, ``p.grad`` of a parameter is a view into its bucket (PyTorch's
    ``gradient_as_bucket_view``): it is rewritten by the next synchronised backward.
    """

    def __init__(self, module: Module, *, broadcast_buffers: bool = True, bucket_cap_mb: float = 25.0) -> None:
        super().__init__()
        pg = group()
        self.module = module
        self.broadcast_buffers = broadcast_buffers
        self.require_backward_grad_sync = True
        self._pg = pg
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        _check_same_model(pg, named)
        _broadcast_from_rank0(pg, list(module.parameters()) + list(module.buffers()))
        params = [p for _, p in reversed(named)]  # backward produces the last layer's gradients first
        self._buckets = _make_buckets(params, bucket_cap_mb * 1024 * 1024)
        self._where = {id(p): (b, i) for b in self._buckets for i, p in enumerate(b.params)}
        self._arrived: set[int] = set()  # ids of the parameters whose gradient this backward produced
        self._launched = 0  # buckets whose all-reduce has started, always a prefix (same order on every rank)
        self._sync = True
        # (event, bucket, time.perf_counter()) of the last backward: when each bucket's all-reduce
        # was launched and when it was seen done (MPI progresses it only inside MPI calls)
        self.timeline: list[tuple[str, int, float]] = []
        me = weakref.ref(self)
        handles = [p.register_hook(_hook(me, p)) for p in params]
        weakref.finalize(self, _remove, handles)

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        if 0 < len(self._arrived) < len(self._where):
            missing = [n for n, p in self.module.named_parameters()
                       if p.requires_grad and id(p) not in self._arrived]
            raise RuntimeError(
                "DistributedDataParallel: the previous backward did not produce gradients for "
                f"{', '.join(missing)}; every parameter must take part in the loss (DDP waits for "
                "all of them before averaging)")
        if self.broadcast_buffers:
            _broadcast_from_rank0(self._pg, list(self.module.buffers()))
        self._sync = grad_mode.is_grad_enabled() and self.require_backward_grad_sync
        return self.module(*inputs, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Forward/backward inside the block accumulate gradients locally, with no communication;
        the first synchronised backward after it averages the accumulated gradients."""
        old, self.require_backward_grad_sync = self.require_backward_grad_sync, False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    def bucket_names(self) -> list[list[str]]:
        """The parameters' names, bucket by bucket, in the order their all-reduces start."""
        names = {id(p): n for n, p in self.module.named_parameters()}
        return [[names[id(p)] for p in b.params] for b in self._buckets]

    # -- the reducer ----------------------------------------------------------------------------
    def _on_gradient(self, p: Parameter, g: Tensor) -> Tensor | None:
        """The hook on parameter ``p``'s gradient ``g``, called by the engine before ``p.grad`` is set.

        Outside synchronised backward (``not self._sync``: ``no_sync``), return ``None``: the
        engine accumulates as usual. Otherwise copy ``(p.grad + g) / world_size`` (just ``g``
        when ``p.grad`` is None) into p's slot of its bucket (``bucket, i = self._where[id(p)]``,
        ``bucket.slot(i)``), count it (``bucket.pending``, ``self._arrived``), and start every
        bucket that is now full (``self._launch_ready()``: an asynchronous all-reduce, in bucket
        order). The first gradient of a step starts ``self.timeline``. Until the last gradient,
        return ``None`` after giving MPI a chance to progress (``work.is_completed()`` on the
        launched buckets). At the last one, ``self._finish()`` waits and writes the averages into
        every ``.grad``; return p's average (taking it out of ``p.grad``), which the engine then
        stores.
        """
        ### BEGIN SOLUTION chapter 04: DDP's bucket hooks
        if not self._sync:
            return None  # inside no_sync: the engine accumulates into .grad as usual
        if not self._arrived:
            self.timeline = [("start", -1, time.perf_counter())]
        bucket, i = self._where[id(p)]
        xp, slot = p.device.xp, bucket.slot(i)
        # pre-divide by N, so that the all-reduce's sum is already the average
        if p.grad is None:
            xp.multiply(g.array, 1.0 / self._pg.size(), out=slot)
        else:
            xp.add(p.grad.array, g.array, out=slot)
            xp.multiply(slot, 1.0 / self._pg.size(), out=slot)
        bucket.pending -= 1
        self._arrived.add(id(p))
        self._launch_ready()
        if len(self._arrived) < len(self._where):
            for b in self._buckets[:self._launched]:  # MPI makes progress only inside its calls
                b.work.is_completed()
            return None
        self._finish()
        # The engine stores this last gradient just after this hook returns: give it the average.
        grad, p.grad = p.grad, None
        return grad
        ### END SOLUTION

    def _launch_ready(self) -> None:
        while self._launched < len(self._buckets) and self._buckets[self._launched].pending == 0:
            b = self._buckets[self._launched]
            k = self._launched
            b.work = self._pg.backend.all_reduce(b.buffer, ReduceOp.SUM, async_op=True)
            self.timeline.append(("launch", k, time.perf_counter()))
            b.work.then(lambda k=k: self.timeline.append(("done", k, time.perf_counter())))
            self._launched += 1

    def _finish(self) -> None:
        for b in self._buckets:
            b.work.wait()
            for i, p in enumerate(b.params):
                p.grad = _wrap(b.slot(i), p.device)
            b.pending, b.work = len(b.params), None
        self._arrived.clear()
        self._launched = 0


def _hook(ddp: weakref.ref, p: Parameter) -> Any:
    def hook(g: Tensor) -> Tensor | None:
        me = ddp()
        return None if me is None else me._on_gradient(p, g)
    return hook


def _broadcast_from_rank0(pg: Any, tensors: list[Tensor]) -> None:
    for t in tensors:
        buf, done = _buffer(t)
        pg.backend.broadcast(buf, 0, False).then(done).wait()


def _remove(handles: list) -> None:
    for h in handles:
        h.remove()


def _check_same_model(pg: Any, named: list[tuple[str, Parameter]]) -> None:
    """Every rank must wrap the same architecture: compare the parameters' sizes across ranks."""
    xp = named[0][1].device.xp if named else None
    if xp is None:
        raise ValueError("DistributedDataParallel: the module has no parameters that require grad")
    count = xp.asarray([len(named)], dtype=xp.int64)
    counts = xp.empty(pg.size(), dtype=xp.int64)
    pg.backend.all_gather(counts, count, False).wait()
    if (counts != counts[0]).any():
        raise ShapeError(f"DistributedDataParallel: the ranks' models differ: parameter counts "
                         f"{[int(c) for c in counts]} by rank")
    sizes = xp.asarray([p.numel() for _, p in named], dtype=xp.int64)
    every = xp.empty((pg.size(), len(named)), dtype=xp.int64)
    pg.backend.all_gather(every, sizes, False).wait()
    for k, (name, p) in enumerate(named):
        if (every[:, k] != every[0, k]).any():
            raise ShapeError(f"DistributedDataParallel: parameter '{name}' has "
                             f"{[int(c) for c in every[:, k]]} elements by rank; every rank must wrap "
                             "the same model")
