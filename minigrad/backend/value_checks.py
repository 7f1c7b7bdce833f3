"""Checks of values without waiting for the GPU: raised at once on the CPU, at the next host read on a GPU (chapter 03).

An op that checks its input's values (an index in range, a probability in [0, 1]) must read them
on the host. On the CPU that is free; on a GPU reading a value waits until every kernel queued
before it has run, so a check inside each embedding or loss would stall the GPU several times a
step. CUDA's own answer is the device-side assert, reported at the next synchronisation, and that
is what ``check`` does: on a GPU it keeps the condition as a device boolean, computed where the
data is, and ``raise_pending`` raises the first failed check's error when the host next reads a
tensor (``.item()``, ``.cpu()``, ``.numpy()``) or calls ``minigrad.cuda.synchronize``. The error
is the same, only later, as on a GPU in PyTorch. As there, a failed check belongs to the process,
not to the thread that queued it: the executor's worker threads run ops whose checks the main
thread's next read must raise. So the queue is shared, and taking it loses none that another
thread adds meanwhile.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable

import numpy

__all__ = ["check", "raise_pending"]

MAX_PENDING = 256  # past this many unread checks they are read now: one wait per 256, never unbounded memory
# (xp, bad, error, message); a deque because its append and popleft are atomic between threads
_pending: deque[tuple[Any, Any, type[Exception], Callable[[], str]]] = deque()


def check(xp: Any, bad: Any, error: type[Exception], message: Callable[[], str]) -> None:
    """Raise ``error(message())`` when ``bad`` (a boolean computed by ``xp``) is true: now on the
    CPU; on a GPU at the next host read. ``message`` is called only then, so it may read values."""
    if xp is numpy:
        if bad:
            raise error(message())
        return
    if isinstance(getattr(bad, "device", None), str):  # a meta array: shapes only, no values to check
        return
    _pending.append((xp, bad, error, message))
    if len(_pending) >= MAX_PENDING:
        raise_pending()


def raise_pending() -> None:
    """Read the checks queued on GPUs (one small copy per GPU when all passed) and raise the
    first failed one's error. The host reads data here anyway, so this adds no wait of its own."""
    if not _pending:
        return
    pending = []
    for _ in range(len(_pending)):  # taken one by one: a check queued meanwhile stays for the next read
        try:
            pending.append(_pending.popleft())
        except IndexError:  # another thread took the rest
            break
    by_gpu: dict[int, list] = {}
    for entry in pending:
        by_gpu.setdefault(entry[1].device.id, []).append(entry)
    for entries in by_gpu.values():
        xp = entries[0][0]
        with entries[0][1].device:  # the flags live on that GPU: gather them there
            if not bool(xp.stack([bad.reshape(()) for _, bad, _, _ in entries]).any()):
                continue
        for _, bad, error, message in entries:
            if bool(bad):
                raise error(message())
