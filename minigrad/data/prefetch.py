"""DevicePrefetcher: each batch is already on the device when the training step asks for it.

A loop that does ``x = x.to("cuda")`` waits first for the loader to build the batch, then for the
copy, and the GPU idles through both. ``for x, y in DevicePrefetcher(loader, "cuda")`` overlaps
the three stages: a background thread runs the loader ahead (collating, pinning the memory), and
the next batch's host-to-device copy runs on a side CUDA stream while the step computes on the
current one. That is double buffering: two batches are on the device at a time, the one in use and
the next. On the CPU there is nothing to copy, and the prefetcher is the background thread alone.
torch has no built-in for this (its DataLoader pins, the loop copies). Chapter 01 (input
pipelines); benchmarks/bench_gpu.py measures it against synchronous copies.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

from minigrad.backend import Device
from minigrad.data.cuda_copy import AsyncCopier
from minigrad.data.workers import BackgroundIterator, map_tensors

__all__ = ["DevicePrefetcher"]

_NOTHING = object()  # no batch in flight yet


class _HostCopier:
    """The CPU side of the prefetcher: nothing to pin, and ``Tensor.to`` is a plain (usually no-op) move."""

    def __init__(self, device: Device) -> None:
        self.device = device

    def prepare(self, batch: Any) -> Any:
        return batch

    def start(self, batch: Any) -> Any:
        return map_tensors(lambda t: t.to(self.device), batch)

    def finish(self, batch: Any) -> Any:
        return batch


class DevicePrefetcher:
    """Iterate ``loader`` (a DataLoader, Pipeline or any iterable of batches) with every Tensor of
    each batch moved to ``device``, the next batch prepared and copied while the current one is used.

    ``depth``: how many host batches the background thread keeps ready beyond the two on the
    device. Other items of a batch (strings, numbers) pass through unchanged. On ``cuda`` the
    batches' host memory is pinned (unless the loader already pinned it with ``pin_memory=True``)
    and copied on a side stream; the compute stream waits for each copy on the GPU, so a batch is
    safe to use on the stream that was current when it was handed out.
    """

    def __init__(self, loader: Iterable, device: str | Device = "cuda", depth: int = 2) -> None:
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"DevicePrefetcher: depth should be a positive integer, got {depth!r}")
        self.loader, self.device, self.depth = loader, Device(device), depth
        self._copier = AsyncCopier(self.device) if self.device.type == "cuda" else _HostCopier(self.device)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator:
        # Started here, in the caller's thread: iter(loader) may fork worker processes.
        return self._batches(BackgroundIterator(map(self._copier.prepare, self.loader), self.depth))

    def _batches(self, host: BackgroundIterator) -> Iterator:
        copier, ahead, failure = self._copier, _NOTHING, None
        try:
            while True:
                try:
                    batch = next(host)
                except StopIteration:
                    break
                except Exception as e:  # raised after the batches read before it, as the loader would
                    failure = e
                    break
                # the next batch's copy is queued before the current batch is handed out, so it
                # runs while the step computes on the current one
                started = copier.start(batch)
                if ahead is not _NOTHING:
                    yield copier.finish(ahead)
                ahead = started
            if ahead is not _NOTHING:
                yield copier.finish(ahead)
            if failure is not None:
                raise failure
        finally:
            host.close()

    def __repr__(self) -> str:
        return f"DevicePrefetcher({self.loader!r}, device='{self.device}', depth={self.depth})"
