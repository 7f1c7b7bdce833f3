"""Pinned host memory and asynchronous host-to-device copies: the CUDA half of ``DevicePrefetcher``.

From ordinary (pageable) host memory the driver copies through a page-locked staging buffer of
its own, and the CPU waits for it. From page-locked ("pinned") memory the GPU's copy engine reads
the data directly, so a copy queued on a stream of its own returns at once and runs while the
compute stream's kernels run; an event recorded after it lets the compute stream wait for the copy
on the GPU, without the CPU blocking. Chapter 03 (the GPU backend); benchmarks/bench_gpu.py
measures what it buys.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy

from minigrad import backend
from minigrad.backend import Device
from minigrad.data.workers import map_tensors
from minigrad._tensor import Tensor, _wrap

__all__ = ["AsyncCopier", "is_pinned", "pin_memory"]


def _cupy() -> Any:
    # Through the device, so that a machine without cupy or without a GPU gets backend's DeviceError.
    return Device("cuda").xp


def is_pinned(array: Any) -> bool:
    """Whether a numpy array lives in page-locked memory allocated by cupy (as ``pin_memory`` makes)."""
    owner = backend.storage_of(array).base  # the buffer the array that owns the memory was made over
    if isinstance(owner, memoryview):  # numpy.frombuffer keeps the buffer's exporter behind a memoryview
        owner = owner.obj
    return isinstance(owner, _cupy().cuda.PinnedMemoryPointer)


def _pinned_copy(array: numpy.ndarray, cupy: Any) -> numpy.ndarray:
    memory = cupy.cuda.alloc_pinned_memory(array.nbytes)
    out = numpy.frombuffer(memory, array.dtype, array.size).reshape(array.shape)
    out[...] = array
    return out


def pin_memory(batch: Any) -> Any:
    """``batch`` with every CPU tensor copied into pinned memory, as torch's ``Tensor.pin_memory``
    (tensors already pinned, empty or on a GPU are kept). ``DataLoader(pin_memory=True)`` calls it."""
    cupy = _cupy()

    def pin(t: Tensor) -> Tensor:
        if t.device.type != "cpu" or t.array.size == 0 or is_pinned(t.array):
            return t
        return _wrap(_pinned_copy(t.array, cupy), backend.cpu)

    return map_tensors(pin, batch)


class _InFlight:
    """One batch on its way to the GPU: the device batch, the event recorded after its copies, and
    the host arrays the copies read (which must outlive them)."""

    __slots__ = ("batch", "event", "sources")

    def __init__(self, batch: Any, event: Any, sources: list) -> None:
        self.batch, self.event, self.sources = batch, event, sources


class AsyncCopier:
    """Copies batches to one GPU on a side stream of its own.

    ``prepare`` pins a batch (the prefetcher's background thread runs it), ``start`` queues its
    copies and returns at once, ``finish`` hands the device batch to the compute stream (the
    stream current when it is called), which waits for the copies on the GPU.
    """

    def __init__(self, device: Device) -> None:
        self.device = device
        cupy = device.xp
        with cupy.cuda.Device(device.index):
            # non_blocking: a plain stream synchronises with the legacy default stream, the one
            # minigrad's kernels run on unless told otherwise, and the copies would wait for them.
            self.stream = cupy.cuda.Stream(non_blocking=True)
        self._retired: deque = deque()  # (event, host arrays) of batches handed out

    def prepare(self, batch: Any) -> Any:
        return pin_memory(batch)

    def start(self, batch: Any) -> _InFlight:
        cupy, sources = self.device.xp, []

        def copy(t: Tensor) -> Tensor:
            if t.device is self.device:
                return t
            if t.device.type != "cpu":  # another GPU: an ordinary device-to-device copy
                return t.to(self.device)
            host = numpy.ascontiguousarray(t.array)
            out = cupy.empty(host.shape, host.dtype)
            out.set(host, stream=self.stream)
            sources.append(host)
            return _wrap(out, self.device)

        with cupy.cuda.Device(self.device.index):
            # The device memory comes from the compute stream's pool, where a tensor may have
            # freed it a moment ago while kernels that read it are still queued. So the copies
            # first wait for everything queued on the compute stream so far; the step that will
            # use the batch handed out next is queued after this point, and overlaps them.
            self.stream.wait_event(cupy.cuda.get_current_stream().record())
            on_device = map_tensors(copy, batch)
            event = self.stream.record()
        while self._retired and self._retired[0][0].done:  # those copies are over: free their sources
            self._retired.popleft()
        return _InFlight(on_device, event, sources)

    def finish(self, copy: _InFlight) -> Any:
        cupy = self.device.xp
        with cupy.cuda.Device(self.device.index):
            cupy.cuda.get_current_stream().wait_event(copy.event)
        self._retired.append((copy.event, copy.sources))
        return copy.batch
