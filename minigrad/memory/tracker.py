"""Memory tracking: how many bytes of tensor data are alive, now and at the worst moment (chapter 03).

The high-water mark is the figure that activation checkpointing lowers. ``track()`` is a
``Mode`` (``minigrad.autograd.mode``): while it is on the thread's stack, every new Tensor (and
every array an op keeps for backward, such as ReLU's mask) hands it its array, whose buffer it
counts once until a weak reference says it was freed. ``summary()`` lists what is alive right now,
largest first, with the op that made each tensor.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any, Iterator, NamedTuple

from minigrad import backend
from minigrad.backend import cuda
from minigrad.autograd.function import SAVED_ARRAY, SAVED_OUTPUT, Function, saved_entries
from minigrad.autograd.mode import Mode, in_forward, recomputation  # recomputation: re-exported
from minigrad.backend import Device
from minigrad.errors import DeviceError
from minigrad.protocols import is_parameter
from minigrad._tensor import Tensor

__all__ = ["LiveTensor", "MemoryTracker", "recomputation", "snapshot", "summary", "track"]


class MemoryTracker(Mode):
    """Bytes of tensor data on a device while a ``with track():`` block runs.

    A buffer counts once: a view's bytes belong to the array that owns the memory, and several
    Tensors may wrap one array. On a GPU the current and peak bytes are CuPy's memory pool instead
    (``minigrad.cuda.memory_allocated``), which also sees an op's temporaries; activations are
    counted from the tensors as on the cpu.

    ``start``: bytes alive on entry; ``current``: alive now; ``peak``: the most alive at once since
    entry or the last ``reset_peak()``. ``activations``: bytes alive now of tensors that forward
    computation made inside the block (including the ones checkpointing recomputes during
    backward, not the gradients that backward rules make); ``activation_peak``: their most at once.
    After the block, the figures stay as they were at its end.
    """

    def __init__(self, device: str | Device = "cpu") -> None:
        self.device = Device(device)
        if self.device.type not in _COUNTERS:
            raise DeviceError(f"memory tracking on {self.device} is not supported (devices: {sorted(_COUNTERS)})")
        self.start = self.peak = self.activation_peak = self.activations = 0
        self._current = 0
        self._counter: _HostCounter | None = None

    @property
    def current(self) -> int:
        return self._counter.in_use(self.device) if self._counter is not None else self._current

    def reset_peak(self) -> None:
        """Start measuring peaks again from what is alive now."""
        self.peak, self.activation_peak = self.current, self.activations

    def __enter__(self) -> MemoryTracker:
        self._counter = _COUNTERS[self.device.type]
        self._counter.add(self)
        self.start = self.peak = self.current
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        super().__exit__()
        self._current = self._counter.in_use(self.device)
        self._counter.remove(self)
        self._counter = None

    # the mode's events: a new tensor's array, or an array an op keeps for backward
    def new_array(self, array: Any) -> None:
        self._counter.count(array)

    def saved_array(self, ctx: Any, index: int, array: Any) -> None:
        self._counter.count(array)

    def __repr__(self) -> str:
        return (f"MemoryTracker({self.device}: current {_fmt(self.current)}, peak {_fmt(self.peak)}, "
                f"activation peak {_fmt(self.activation_peak)})")


def track(device: str | Device = "cpu") -> MemoryTracker:
    """``with minigrad.memory.track() as mem: ...`` then read ``mem.peak`` (bytes)."""
    return MemoryTracker(device)


class _HostCounter:
    """Counts the numpy buffers behind live tensors: how the cpu device knows its memory.

    Buffers already alive when counting starts are found by asking the garbage collector for every
    Tensor and graph node. A buffer made while trackers are active also remembers the trackers that
    counted it as an activation, so each tracker's ``activations`` covers its own block only.
    """

    def __init__(self) -> None:
        self.array_type: Any = backend.numpy.ndarray
        self.live: dict[int, tuple[int, tuple, weakref.ref]] = {}  # id(buffer) -> (bytes, trackers, ref)
        self.current = 0
        self.trackers: list[MemoryTracker] = []

    def in_use(self, device: Device) -> int:
        """Bytes in use on ``device`` now."""
        return self.current

    def add(self, tracker: MemoryTracker) -> None:
        if not self.trackers:
            for array, _ in _live_arrays():
                self.count(array, activation=False)
        self.trackers.append(tracker)

    def remove(self, tracker: MemoryTracker) -> None:
        self.trackers.remove(tracker)
        if not self.trackers:  # nothing is watching: stop counting and drop the weak references
            self.live.clear()
            self.current = 0

    def count(self, array: Any, activation: bool | None = None) -> None:
        """Count ``array``'s buffer unless it is already counted."""
        if not isinstance(array, self.array_type):
            return  # a numpy scalar (a few bytes) or an array of another device
        array = backend.storage_of(array)
        key = id(array)
        if key in self.live:
            return
        if activation is None:
            activation = in_forward()
        nbytes = array.nbytes
        trackers = tuple(self.trackers) if activation else ()
        self.live[key] = (nbytes, trackers, weakref.ref(array, lambda _, key=key: self.release(key)))
        self.grow(nbytes)
        for t in trackers:
            t.activations += nbytes
            if t.activations > t.activation_peak:
                t.activation_peak = t.activations

    def grow(self, nbytes: int) -> None:
        """Add ``nbytes`` (negative when a buffer is freed) to the total, noting new peaks.

        ``self.current`` is the live total; every tracker open now (``self.trackers``) keeps its
        own ``peak``, the largest total seen while it was open, which a freeing never lowers.
        """
        ### BEGIN SOLUTION chapter 03: the memory tracker's peak
        self.current += nbytes
        for t in self.trackers:
            if self.current > t.peak:
                t.peak = self.current
        ### END SOLUTION

    def release(self, key: int) -> None:
        """Called when a counted buffer is freed."""
        nbytes, trackers, _ = self.live.pop(key, (0, (), None))
        self.grow(-nbytes)
        for t in trackers:
            t.activations -= nbytes


class _PoolCounter(_HostCounter):
    """How a GPU knows its memory: current and peak bytes come from CuPy's pool through
    ``minigrad.cuda``'s allocator (so an op's temporaries count too); the tensors' buffers are
    still counted as on the cpu, for the activation figures."""

    def in_use(self, device: Device) -> int:
        return cuda.memory_allocated(device)

    def add(self, tracker: MemoryTracker) -> None:
        if not self.trackers:
            self.array_type = tracker.device.xp.ndarray
            self.allocator = cuda.watch_memory_pool(tracker.device.xp)
            self.allocator.watchers.append(self.allocated)
        super().add(tracker)

    def remove(self, tracker: MemoryTracker) -> None:
        super().remove(tracker)
        if not self.trackers:
            self.allocator.watchers.remove(self.allocated)

    def allocated(self, index: int, used: int) -> None:
        """The allocator's callback: ``used`` bytes are in use on GPU ``index`` after an allocation."""
        for t in self.trackers:
            if t.device.index == index and used > t.peak:
                t.peak = used

    def grow(self, nbytes: int) -> None:
        pass  # the pool keeps the total, and the allocator reports its peaks


# One counter per kind of device, shared by the trackers of that kind.
_COUNTERS: dict[str, _HostCounter] = {"cpu": _HostCounter(), "cuda": _PoolCounter()}


# ---------------------------------------------------------------------------------------------
class LiveTensor(NamedTuple):
    """One live buffer: its size in bytes, shape and dtype, and what made it."""

    nbytes: int
    shape: tuple
    dtype: Any
    op: str


def _live_arrays() -> Iterator[tuple[Any, tuple[int, str]]]:
    """Every array that a live Tensor wraps or a graph node keeps for backward, with a label:
    (rank, text), where a lower rank is the better description of what made it."""
    for obj in gc.get_objects():
        if issubclass(type(obj), Tensor):  # type(): isinstance would read __class__, which some objects warn about
            if obj.grad_fn is not None:
                yield obj.array, (0, obj.grad_fn.name())
            else:
                yield obj.array, (3, "Parameter") if is_parameter(obj) else (4, "leaf")
            if obj.grad is not None:
                yield obj.grad.array, (2, "grad")
        elif issubclass(type(obj), Function):
            for array, is_output in saved_arrays(obj):
                yield array, (0, obj.name()) if is_output else (1, f"{obj.name()} (saved)")


def saved_arrays(fn: Function) -> Iterator[tuple[Any, bool]]:
    """The arrays a graph node keeps for backward that no Tensor wraps: its outputs' (True) and
    other arrays (False). Saved input Tensors are Tensors, found as such."""
    for kind, value in saved_entries(fn):
        if kind == SAVED_OUTPUT:
            yield value[0], True  # (data, output number, weak reference)
        elif kind == SAVED_ARRAY:
            yield value, False


def snapshot(device: str | Device = "cpu") -> list[LiveTensor]:
    """The tensor buffers alive on ``device`` now, largest first, each counted once."""
    dev = Device(device)
    found: dict[int, tuple[Any, tuple[int, str]]] = {}
    for array, label in _live_arrays():
        if not hasattr(array, "nbytes") or backend.device_of(array) is not dev:
            continue
        array = backend.storage_of(array)
        known = found.get(id(array))
        if known is None or label < known[1]:
            found[id(array)] = (array, label)
    live = [LiveTensor(a.nbytes, tuple(a.shape), a.dtype, label[1]) for a, label in found.values()]
    return sorted(live, key=lambda t: -t.nbytes)


def summary(device: str | Device = "cpu", top: int = 20) -> None:
    """Print the live tensors on ``device`` by size, and the bytes per creating op."""
    live = snapshot(device)
    total = sum(t.nbytes for t in live)
    lines = [f"live tensor memory on {Device(device)}: {_fmt(total)} in {len(live)} buffer(s)",
             f"{'bytes':>11}  {'shape':<22}{'dtype':<10}made by"]
    for t in live[:top]:
        lines.append(f"{_fmt(t.nbytes):>11}  {str(t.shape):<22}{str(t.dtype):<10}{t.op}")
    if len(live) > top:
        lines.append(f"{_fmt(sum(t.nbytes for t in live[top:])):>11}  ({len(live) - top} smaller buffers)")
    by_op: dict[str, int] = {}
    for t in live:
        by_op[t.op] = by_op.get(t.op, 0) + t.nbytes
    lines.append("by op: " + ", ".join(f"{op} {_fmt(n)}" for op, n in sorted(by_op.items(), key=lambda kv: -kv[1])))
    print("\n".join(lines))


def _fmt(nbytes: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(nbytes) >= size:
            return f"{nbytes / size:.2f} {unit}"
    return f"{nbytes} B"
