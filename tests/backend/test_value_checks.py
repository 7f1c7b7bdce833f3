"""Checks of values queued on a GPU (``minigrad.backend.value_checks``): raised at the next host read, on
whichever thread reads, as CUDA's device-side asserts are; and none is lost when one thread queues
checks while another reads them. A stand-in array module plays the GPU here; the cuda stand-in's
tests (``test_cuda_stand_in.py``) run the real ops' checks."""

import sys
import threading

import numpy
import pytest

from minigrad.backend import value_checks


class Gpu:
    """The device a flag lives on (``with flag.device:`` selects it)."""

    id = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


class Flag:
    """A device boolean: what a check leaves on the GPU, true when it failed."""

    device = Gpu()

    def __init__(self, failed: bool = False) -> None:
        self.failed = failed

    def reshape(self, shape):
        return self

    def __bool__(self) -> bool:
        return self.failed


class Xp:
    """An array module whose ``stack`` writes down the flags it reads (numpy's list is atomic)."""

    def __init__(self) -> None:
        self.read: list = []

    def stack(self, flags):
        self.read.extend(flags)
        return numpy.array([f.failed for f in flags])


@pytest.fixture(autouse=True)
def empty_queue():
    value_checks._pending.clear()
    yield
    value_checks._pending.clear()


def test_a_check_a_worker_thread_queued_raises_at_the_next_read_on_this_thread():
    xp = Xp()
    worker = threading.Thread(target=lambda: value_checks.check(xp, Flag(failed=True), IndexError,
                                                                lambda: "index 7 is out of range for size 5"))
    worker.start()
    worker.join()
    with pytest.raises(IndexError, match="index 7"):
        value_checks.raise_pending()
    value_checks.raise_pending()  # read once: the queue is empty now


def test_no_check_is_lost_while_another_thread_reads_the_queue():
    xp, flags = Xp(), [Flag() for _ in range(20000)]
    stop = threading.Event()

    def read():
        while not stop.is_set():
            value_checks.raise_pending()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as Python can, so a read meets every queueing
    try:
        reader = threading.Thread(target=read)
        reader.start()
        for f in flags:
            value_checks.check(xp, f, ValueError, lambda: "no check here fails")
        stop.set()
        reader.join()
    finally:
        sys.setswitchinterval(interval)
    value_checks.raise_pending()
    assert len(xp.read) == len(flags) and {id(f) for f in xp.read} == {id(f) for f in flags}
