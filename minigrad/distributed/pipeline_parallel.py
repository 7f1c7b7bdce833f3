"""Pipeline parallelism with the GPipe schedule: a model too big for one process is cut into
consecutive stages, one per rank, and a batch flows through them in micro-batches (chapter 04).

Stage s receives activations from stage s-1, runs its layers and sends its output to stage s+1;
in backward the gradients of those activations travel the other way. With one batch, only one
stage works at a time. GPipe splits the batch into M micro-batches and runs all their forwards,
then all their backwards, so stages work on different micro-batches at once. What remains idle is
the *bubble*: with P stages of equal cost, a fraction (P-1)/(M+P-1) of each stage's time.
``ScheduleGPipe`` records when each stage computes, so the measured bubble can sit next to that.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from minigrad import backend as _backend
from minigrad.distributed.process_group import Backend, Work, group
from minigrad.errors import ShapeError
from minigrad.nn.containers import Sequential
from minigrad.nn.module import Module
from minigrad.ops import cat
from minigrad._tensor import Tensor, _wrap

__all__ = ["PipelineStage", "ScheduleGPipe", "gpipe_bubble", "split_sequential"]

ACTIVATION_TAG, GRADIENT_TAG = 31_100, 31_200
_MAX_DIMS = 8


def gpipe_bubble(num_stages: int, n_microbatches: int) -> float:
    """The idle fraction of each stage under GPipe with equal stages: (P-1)/(M+P-1)."""
    return (num_stages - 1) / (n_microbatches + num_stages - 1)


def split_sequential(model: Sequential, num_stages: int, balance: list[int] | None = None) -> list[Sequential]:
    """Cut ``model`` into ``num_stages`` consecutive Sequentials, of ``balance[i]`` layers each
    (by default as equal in layer count as possible)."""
    layers = list(model)
    if balance is None:
        balance = [len(layers) // num_stages + (i < len(layers) % num_stages) for i in range(num_stages)]
    if len(balance) != num_stages or sum(balance) != len(layers) or min(balance) < 1:
        raise ValueError(f"split_sequential: balance {balance} must give {num_stages} stages of at least "
                         f"one layer each, {len(layers)} layers in all")
    stages, start = [], 0
    for n in balance:
        stages.append(Sequential(*layers[start:start + n]))
        start += n
    return stages


class PipelineStage:
    """The part of the model this rank runs: stage ``stage_index`` (its rank) of ``num_stages``
    (the world size)."""

    def __init__(self, submodule: Module, stage_index: int | None = None, num_stages: int | None = None) -> None:
        pg = group()
        self.submodule = submodule
        self.stage_index = pg.rank() if stage_index is None else stage_index
        self.num_stages = pg.size() if num_stages is None else num_stages
        if self.num_stages != pg.size() or self.stage_index != pg.rank():
            raise ValueError(f"PipelineStage: stage i runs on rank i; got stage {self.stage_index} of "
                             f"{self.num_stages} on rank {pg.rank()} of {pg.size()}")
        self.is_first, self.is_last = self.stage_index == 0, self.stage_index == self.num_stages - 1
        self.backend: Backend = pg.backend
        self.device = next((p.device for p in submodule.parameters()), _backend.cpu)


def _send(be: Backend, t: Tensor, dst: int, tag: int) -> list[Work]:
    """Send a tensor whose shape the receiver does not know: a fixed-size header, then the data."""
    if t.ndim > _MAX_DIMS:
        raise ShapeError(f"pipeline: activations of at most {_MAX_DIMS} dims can be sent, got shape {tuple(t.shape)}")
    xp = t.device.xp
    header = xp.asarray([list(_backend.DTYPES).index(t.dtype.name), t.ndim] + list(t.shape)
                        + [0] * (_MAX_DIMS - t.ndim), dtype=xp.int64)
    return [be.send(header, dst, tag, async_op=True),
            be.send(xp.ascontiguousarray(t.array), dst, tag, async_op=True)]


def _recv(be: Backend, src: int, tag: int, device: Any) -> Tensor:
    xp = device.xp
    header = xp.empty(2 + _MAX_DIMS, dtype=xp.int64)
    be.recv(header, src, tag, async_op=False)
    code, ndim, *shape = (int(v) for v in _backend.to_device(header, _backend.cpu))
    data = xp.empty(tuple(shape[:ndim]), dtype=list(_backend.DTYPES.values())[code])
    be.recv(data, src, tag, async_op=False)
    return _wrap(data, device)


class ScheduleGPipe:
    """Run one training step of a pipeline: the forwards of all ``n_microbatches`` micro-batches,
    then all their backwards, accumulating the stage's parameter gradients.

    Every rank calls ``step``: the first stage with the batch, the last with ``target`` (and a
    ``losses`` list to receive each micro-batch's loss), the others with nothing. With
    ``scale_grads`` each micro-batch's loss is divided by M, so a mean loss gives the full batch's
    gradients. The last stage returns the batch's output; ``bubble_fraction()`` says how much of
    the step this rank spent waiting.
    """

    def __init__(self, stage: PipelineStage, n_microbatches: int,
                 loss_fn: Callable[[Tensor, Tensor], Tensor] | None = None, scale_grads: bool = True) -> None:
        if n_microbatches < 1:
            raise ValueError(f"ScheduleGPipe: n_microbatches should be at least 1, got {n_microbatches}")
        if stage.is_last and loss_fn is None:
            raise ValueError("ScheduleGPipe: the last stage needs a loss_fn to start backward")
        self.stage, self.n_microbatches, self.loss_fn, self.scale_grads = stage, n_microbatches, loss_fn, scale_grads
        self.events: list[tuple[str, int, float, float]] = []  # (F or B, micro-batch, start, end), seconds
        self.step_time = 0.0

    def _split(self, t: Tensor, what: str) -> list[Tensor]:
        m = self.n_microbatches
        if t.shape[0] % m:
            raise ShapeError(f"ScheduleGPipe: the {what}'s batch of {t.shape[0]} does not split into "
                             f"{m} equal micro-batches")
        return list(t.split(t.shape[0] // m))

    def step(self, *args: Tensor, target: Tensor | None = None, losses: list | None = None) -> Tensor | None:
        """One GPipe step on this stage: the forwards of all micro-batches, then all backwards.

        The first stage takes the batch (``args[0]``), the last ``target=``; each is split into
        ``m`` micro-batches (``inputs``, ``targets``). The region fills what the code after it
        reads: ``sends`` (the ``Work`` of every ``_send``, waited for after), ``results`` (the last
        stage's detached outputs, concatenated and returned) and ``events`` (``("F" or "B", i,
        start, end)`` in seconds since ``t0``, one per micro-batch and direction). Forward i: the
        first stage reads ``inputs[i]``, the others ``_recv`` an activation from ``prev``
        (``ACTIVATION_TAG``) and make it require grad; run ``st.submodule``; the last stage
        computes ``self.loss_fn(out, targets[i])``, the others ``_send`` the detached output to
        ``nxt``. Backward i, in the same order: the last stage backpropagates its loss, times
        1/m when ``self.scale_grads`` (appending the detached loss to ``losses`` when given);
        the others ``_recv`` the output's gradient (``GRADIENT_TAG``) and call
        ``out.backward(grad)``; every stage but the first sends its input's ``.grad`` back to
        ``prev``. Drop each micro-batch's graph when its backward is done.
        """
        st, be, m = self.stage, self.stage.backend, self.n_microbatches
        if st.is_first and len(args) != 1:
            raise ValueError(f"ScheduleGPipe.step: the first stage takes the batch, got {len(args)} arguments")
        if st.is_last and target is None:
            raise ValueError("ScheduleGPipe.step: the last stage needs target=")
        inputs = self._split(args[0], "input") if st.is_first else None
        targets = self._split(target, "target") if st.is_last else None
        prev, nxt = st.stage_index - 1, st.stage_index + 1
        sends: list[Work] = []
        xs, outs, results, events = [], [], [], []
        be.barrier()  # start together, so that the timelines of the stages line up
        t0 = time.perf_counter()

        ### BEGIN SOLUTION chapter 04: the GPipe schedule
        for i in range(m):  # all forwards
            if st.is_first:
                x = inputs[i]
            else:
                x = _recv(be, prev, ACTIVATION_TAG, st.device)
                if x.dtype.kind == "f":
                    x.requires_grad_(True)
            start = time.perf_counter()
            out = st.submodule(x)
            loss = self.loss_fn(out, targets[i]) if st.is_last else None
            events.append(("F", i, start - t0, time.perf_counter() - t0))
            if st.is_last:
                results.append(out.detach())
            else:
                sends += _send(be, out.detach(), nxt, ACTIVATION_TAG)
            xs.append(x)
            outs.append((out, loss))

        for i in range(m):  # all backwards
            out, loss = outs[i]
            grad = None if st.is_last else _recv(be, nxt, GRADIENT_TAG, out.device)
            start = time.perf_counter()
            if st.is_last:
                (loss * (1.0 / m) if self.scale_grads else loss).backward()
                if losses is not None:
                    losses.append(loss.detach())
            else:
                out.backward(grad)
            events.append(("B", i, start - t0, time.perf_counter() - t0))
            if not st.is_first:
                sends += _send(be, xs[i].grad, prev, GRADIENT_TAG)
            outs[i] = xs[i] = None  # free this micro-batch's graph
        ### END SOLUTION

        for w in sends:
            w.wait()
        be.barrier()
        self.step_time, self.events = time.perf_counter() - t0, events
        return cat(results) if st.is_last else None

    def bubble_fraction(self) -> float:
        """The fraction of the last step this rank spent not computing (waiting for other stages)."""
        busy = sum(end - start for _, _, start, end in self.events)
        return 1.0 - busy / self.step_time if self.step_time else 0.0
