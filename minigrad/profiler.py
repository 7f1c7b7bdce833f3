"""Profiling: which ops take the time and the memory of a training step (chapter 03).

``profile()`` is a ``Mode`` (``minigrad.autograd.mode``): while it is on the thread's stack it
reads the clock before each op runs and, after it, records an ``Event`` with the op's name, its
input shapes and dtypes, its wall time, the bytes its outputs allocated, whether it ran in forward
or in a backward pass, and the op it ran inside (a user Function's forward is made of ops too).
``table()`` sums the events per op as ``torch.profiler``'s ``key_averages().table()`` does, and
``export_chrome_trace`` writes them as a timeline for chrome://tracing or ui.perfetto.dev.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
from dataclasses import dataclass
from time import perf_counter_ns
from typing import Any

from minigrad.autograd.mode import Mode, active, is_backward_running
from minigrad.backend import storage_of
from minigrad._tensor import Tensor

__all__ = ["Event", "EventAverage", "KeyAverages", "profile", "record_function"]


@dataclass
class Event:
    """One op call (or one ``record_function`` range). Times are nanoseconds from the profile's start."""

    id: int
    name: str
    phase: str  # "forward", or "backward" for ops run by the engine's backward rules
    start_ns: int
    duration_ns: int
    self_ns: int  # the duration less that of the events directly inside it
    bytes: int  # bytes of the outputs this call allocated (0 for a view of an input)
    input_shapes: list
    input_dtypes: list
    parent: int | None  # the id of the event this one ran inside
    depth: int
    thread: int


class _Frame:
    """An event being timed: opened by ``before_op``, closed by ``stop``. ``caller`` is the Python
    frame that opened it (``Function.apply``, or the block of a ``record_function``)."""

    __slots__ = ("id", "name", "parent", "depth", "caller", "thread", "start", "child_ns")

    def __init__(self, id: int, name: str, parent: int | None, depth: int, caller: Any, thread: int) -> None:
        self.id, self.name, self.parent, self.depth, self.caller, self.thread = id, name, parent, depth, caller, thread
        self.child_ns = 0
        self.start = perf_counter_ns()  # last, so the bookkeeping above is not timed


class profile(Mode):
    """``with minigrad.profiler.profile() as prof: step()``, then ``print(prof.table())``.

    ``record_shapes=False`` and ``profile_memory=False`` skip the input shapes and the bytes,
    which makes each recorded op a little cheaper. The events are ready when the block ends. An
    inner profile takes the events while it is active.
    """

    def __init__(self, record_shapes: bool = True, profile_memory: bool = True) -> None:
        self.record_shapes, self.profile_memory = record_shapes, profile_memory
        self.events: list[Event] = []
        self._records: list[tuple] = []  # what stop() measured, made into Events on exit
        self._stacks: dict[int, list[_Frame]] = {}  # per thread: the events open there
        self._ids = 0
        self._origin = 0
        self._paused = False  # an inner profile is active

    def __enter__(self) -> profile:
        self._outer = active(profile)
        if self._outer is not None:
            self._outer._paused = True
        self._origin = perf_counter_ns()
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        super().__exit__()
        if self._outer is not None:
            self._outer._paused = False
        self.events += [
            Event(f.id, f.name, "backward" if backward else "forward", f.start - self._origin, duration,
                  duration - f.child_ns, nbytes, [s for s, _ in meta], [_name(d) for _, d in meta],
                  f.parent, f.depth, f.thread)
            for f, duration, backward, nbytes, meta in self._records
        ]
        self.events.sort(key=lambda e: e.id)  # recorded as they finish; listed as they started
        self._records.clear()

    # -- the mode's hooks: keep them lean, they run on every op -------------------------------------
    def before_op(self, cls: type, args: tuple) -> tuple:
        if not self._paused:
            self._open(cls.__name__, sys._getframe(1))  # the caller is the op's Function.apply
        return args

    def after_op(self, ctx: Any, args: tuple, kwargs: dict, outputs: Any) -> None:
        if self._paused:
            return
        caller = sys._getframe(1)
        for frame in reversed(self._stacks.get(threading.get_native_id(), ())):
            if frame.caller is caller:
                self.stop(frame, args, outputs)
                return

    def _open(self, name: str, caller: Any) -> _Frame:
        thread = threading.get_native_id()
        stack = self._stacks.setdefault(thread, [])
        # an op that raised was never stopped: its frame is open but no longer calling anything
        while stack and not _calls(stack[-1].caller, caller):
            stack.pop()
        self._ids += 1
        frame = _Frame(self._ids, name, stack[-1].id if stack else None, len(stack), caller, thread)
        stack.append(frame)
        return frame

    def stop(self, frame: _Frame, args: tuple, outputs: Any) -> None:
        duration = perf_counter_ns() - frame.start
        stack = self._stacks[frame.thread]
        while stack and stack.pop() is not frame:  # frames of ops inside it that raised
            pass
        if stack:
            stack[-1].child_ns += duration
        frame.caller = None  # let the Python frame go
        meta = [(a.array.shape, a.array.dtype) for a in args if isinstance(a, Tensor)] if self.record_shapes else ()
        nbytes = _allocated(outputs, args) if self.profile_memory else 0
        self._records.append((frame, duration, is_backward_running(), nbytes, meta))

    # -- reading the results --------------------------------------------------------------------
    def key_averages(self, group_by_input_shape: bool = False) -> KeyAverages:
        """The events summed per (name, phase), and per input shapes if asked; by total time."""
        groups: dict[tuple, EventAverage] = {}
        for e in self.events:
            shapes = tuple(e.input_shapes) if group_by_input_shape else None
            key = (e.name, e.phase, shapes)
            avg = groups.get(key)
            if avg is None:
                avg = groups[key] = EventAverage(e.name, e.phase, list(shapes) if shapes is not None else None)
            avg.count += 1
            avg.total_ns += e.duration_ns
            avg.self_ns += e.self_ns
            avg.bytes += e.bytes
        return KeyAverages(sorted(groups.values(), key=lambda a: -a.total_ns))

    def table(self, sort_by: str = "total_time", row_limit: int = 20, group_by_input_shape: bool = False) -> str:
        """A text table of the top ``row_limit`` ops by ``sort_by`` (``total_time``, ``self_time``,
        ``mean_time``, ``count`` or ``bytes``; torch's ``cpu_time_total`` and friends work too)."""
        return self.key_averages(group_by_input_shape).table(sort_by, row_limit)

    def export_chrome_trace(self, path: str) -> None:
        """Write the events as Chrome trace-event JSON ("X" events, microseconds)."""
        pid = os.getpid()
        events = [{
            "name": e.name, "cat": e.phase, "ph": "X", "ts": e.start_ns / 1e3, "dur": e.duration_ns / 1e3,
            "pid": pid, "tid": e.thread,
            "args": {"input_shapes": [list(s) for s in e.input_shapes], "input_dtypes": e.input_dtypes,
                     "bytes": e.bytes},
        } for e in self.events]
        with open(path, "w") as f:
            json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)


_name = functools.lru_cache(maxsize=None)(str)  # numpy builds a dtype's name in Python, slowly


def _calls(outer: Any, frame: Any) -> bool:
    """Whether the Python frame ``outer`` is ``frame`` or one of its callers."""
    while frame is not None:
        if frame is outer:
            return True
        frame = frame.f_back
    return False


def _allocated(outputs: Any, args: tuple) -> int:
    """Bytes of the outputs, except those that are views of an input (a reshape allocates nothing)."""
    if outputs is None:
        return 0
    owners = {id(storage_of(a.array)) for a in args if isinstance(a, Tensor)}
    total = 0
    for o in outputs if type(outputs) is tuple else (outputs,):
        if isinstance(o, Tensor) and id(storage_of(o.array)) not in owners:
            total += o.array.nbytes
    return total


class record_function:
    """Label a region (``with record_function("optimizer"):``) so it shows as one event in the
    table and the trace, with the ops inside it nested under it. Free when not profiling."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> record_function:
        self._prof = active(profile)
        self._frame = self._prof._open(self.name, sys._getframe(1)) if self._prof is not None else None
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._frame is not None:
            self._prof.stop(self._frame, (), None)


# -- aggregates ---------------------------------------------------------------------------------
@dataclass
class EventAverage:
    """All the calls of one op in one phase: how many, and their summed time and bytes."""

    key: str
    phase: str
    input_shapes: list | None
    count: int = 0
    total_ns: int = 0
    self_ns: int = 0
    bytes: int = 0

    @property
    def mean_ns(self) -> float:
        return self.total_ns / self.count if self.count else 0.0


_SORT_KEYS = {
    "total_time": "total_ns", "self_time": "self_ns", "mean_time": "mean_ns", "count": "count", "bytes": "bytes",
    "cpu_time_total": "total_ns", "self_cpu_time_total": "self_ns", "cpu_time": "mean_ns",
    "cpu_memory_usage": "bytes", "self_cpu_memory_usage": "bytes",
}


class KeyAverages(list):
    """A list of ``EventAverage``; ``table()`` formats it."""

    def table(self, sort_by: str = "total_time", row_limit: int = 20) -> str:
        field = _SORT_KEYS.get(sort_by)
        if field is None:
            raise ValueError(f"table: sort_by must be one of {sorted(_SORT_KEYS)}, got {sort_by!r}")
        rows = sorted(self, key=lambda a: getattr(a, field), reverse=True)
        if row_limit is not None and row_limit >= 0:
            rows = rows[:row_limit]
        all_self = sum(a.self_ns for a in self) or 1
        shapes = any(a.input_shapes is not None for a in rows)
        width = max([len(a.key) for a in rows] + [4]) + 2
        head = (f"{'Name':<{width}}{'Phase':<10}{'Calls':>7}{'Total':>11}{'Self':>11}{'Mean':>11}"
                f"{'Self %':>8}{'Bytes':>11}" + ("  Input shapes" if shapes else ""))
        lines = [head, "-" * len(head)]
        for a in rows:
            lines.append(
                f"{a.key:<{width}}{a.phase:<10}{a.count:>7}{_time(a.total_ns):>11}{_time(a.self_ns):>11}"
                f"{_time(a.mean_ns):>11}{100 * a.self_ns / all_self:>7.1f}%{_size(a.bytes):>11}"
                + (f"  {a.input_shapes}" if shapes else "")
            )
        lines.append("-" * len(head))
        lines.append(f"Self time total: {_time(sum(a.self_ns for a in self))}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _time(ns: float) -> str:
    if ns >= 1e9:
        return f"{ns / 1e9:.3f}s"
    if ns >= 1e6:
        return f"{ns / 1e6:.3f}ms"
    return f"{ns / 1e3:.3f}us"


def _size(n: int) -> str:
    for unit, div in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n} B"
