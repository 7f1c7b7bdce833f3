"""DevicePrefetcher and DataLoader(pin_memory=True). Without a GPU the prefetcher is a background
thread over the loader and pin_memory warns and changes nothing (as in torch); with one, batches are
pinned and copied on a side stream. The run-ahead is shown by events the dataset sets as it is
read, never by timing."""

import contextlib
import os
import threading
import weakref
from types import SimpleNamespace

import numpy as np
import pytest

import minigrad
from minigrad import cuda
from minigrad.backend import storage_of
from minigrad.data import DataLoader, Dataset, DevicePrefetcher
from minigrad.errors import DeviceError

# A real GPU: MINIGRAD_SIMULATE_CUDA=1 (conftest.py) stands in an imitation of cupy, which has no
# streams or pinned memory.
GPU = cuda.is_available() and os.environ.get("MINIGRAD_SIMULATE_CUDA") != "1"
needs_gpu = pytest.mark.skipif(not GPU, reason="needs cupy and a CUDA GPU")
without_gpu = pytest.mark.skipif(cuda.is_available(), reason="checks the behaviour without a GPU")


class Numbered(Dataset):
    """Sample i is (three i's as float32, i, a name); reading index i sets ``fetched[i]``."""

    def __init__(self, n: int) -> None:
        self.fetched = [threading.Event() for _ in range(n)]

    def __getitem__(self, i):
        self.fetched[i].set()
        return np.full(3, i, dtype=np.float32), i, f"s{i}"

    def __len__(self) -> int:
        return len(self.fetched)


class Squares(Dataset):
    """A plain dataset for worker processes (events do not cross a fork)."""

    def __getitem__(self, i):
        return np.array([i, i * i], dtype=np.float32), i % 3

    def __len__(self) -> int:
        return 23


def contents(batches) -> list:
    return [[b.numpy().tolist() if isinstance(b, minigrad.Tensor) else b for b in batch] for batch in batches]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_prefetcher_yields_the_loaders_batches_in_the_same_order(num_workers):
    def loader():
        return DataLoader(Squares(), batch_size=4, shuffle=True, generator=7, num_workers=num_workers)

    plain = contents(loader())
    prefetched = list(DevicePrefetcher(loader(), "cpu"))
    assert contents(prefetched) == plain
    assert all(x.device == "cpu" for x, _ in prefetched)
    assert len(plain) == len(DevicePrefetcher(loader(), "cpu")) == 6


def test_prefetcher_runs_ahead_of_the_training_step():
    data = Numbered(12)
    it = iter(DevicePrefetcher(DataLoader(data, batch_size=1), "cpu", depth=2))
    x, i, name = next(it)
    assert i.tolist() == [0] and name == ["s0"]
    # While the step still holds batch 0, the background thread reads on: batch 1 waits as the
    # next one, batches 2 and 3 fill the queue of depth 2.
    assert data.fetched[3].wait(timeout=60)
    assert [int(b[1].item()) for b in it] == list(range(1, 12))


def test_prefetcher_runs_every_epoch_and_passes_other_items_through():
    prefetcher = DevicePrefetcher(DataLoader(Numbered(5), batch_size=2), "cpu")
    for _ in range(2):
        assert [names for _, _, names in prefetcher] == [["s0", "s1"], ["s2", "s3"], ["s4"]]


def test_prefetcher_reraises_the_datasets_error_after_the_batches_before_it():
    class Broken(Numbered):
        def __getitem__(self, i):
            if i == 5:
                raise KeyError(f"sample {i} is missing")
            return super().__getitem__(i)

    seen = []
    with pytest.raises(KeyError, match="sample 5 is missing"):
        for _, i, _ in DevicePrefetcher(DataLoader(Broken(8), batch_size=1), "cpu"):
            seen.append(int(i.item()))
    assert seen == [0, 1, 2, 3, 4]


def test_prefetcher_checks_its_depth():
    with pytest.raises(ValueError, match="depth"):
        DevicePrefetcher(DataLoader(Numbered(2)), "cpu", depth=0)


@without_gpu
def test_pin_memory_without_a_gpu_warns_and_changes_nothing():
    with pytest.warns(UserWarning, match="pin_memory"):
        loader = DataLoader(Numbered(5), batch_size=2, pin_memory=True)
    assert loader.pin_memory
    assert contents(loader) == contents(DataLoader(Numbered(5), batch_size=2))


@without_gpu
def test_prefetching_to_cuda_without_a_gpu_says_what_is_missing():
    with pytest.raises(DeviceError, match="cuda"):
        DevicePrefetcher(DataLoader(Numbered(2)), "cuda")


@needs_gpu
def test_pin_memory_pins_the_cpu_batches():
    from minigrad.data.cuda_copy import is_pinned

    batches = list(DataLoader(Numbered(5), batch_size=2, pin_memory=True))
    assert contents(batches) == contents(DataLoader(Numbered(5), batch_size=2))
    for x, i, _ in batches:
        assert x.device == "cpu" and is_pinned(x.array) and is_pinned(i.array)
    assert not is_pinned(np.zeros(3))


@needs_gpu
@pytest.mark.parametrize("pin_memory", [False, True])
def test_prefetcher_copies_each_batch_to_the_gpu(pin_memory):
    def loader():
        return DataLoader(Squares(), batch_size=4, shuffle=True, generator=3, pin_memory=pin_memory)

    got = []
    for x, y in DevicePrefetcher(loader(), "cuda"):
        assert x.device == "cuda:0" and y.device == "cuda:0"
        got.append([(x * 2).numpy().tolist(), y.numpy().tolist()])  # computed on the compute stream
    want = [[(2 * x.numpy()).tolist(), y.numpy().tolist()] for x, y in loader()]
    assert got == want
    cuda.synchronize()


# -- the CUDA copier's stream and event order, against a recording stand-in for cupy ----------------
class Pinned(bytearray):
    """Page-locked memory as the stand-in allocates it (numpy arrays can view it)."""


class Stream:
    def __init__(self, name, log):
        self.name, self.log, self.events = name, log, []

    def record(self):
        event = SimpleNamespace(name=f"{self.name}#{len(self.events) + 1}", done=False)
        self.events.append(event)
        self.log.append(("record", event.name))
        return event

    def wait_event(self, event):
        self.log.append(("wait", self.name, event.name))


def fake_cupy(log):
    compute = Stream("compute", log)

    class DeviceArray(np.ndarray):
        def set(self, host, stream):
            assert host.flags.c_contiguous
            log.append(("copy", stream.name, host.tolist()))
            self[...] = host

    return SimpleNamespace(
        empty=lambda shape, dtype: np.empty(shape, dtype).view(DeviceArray),
        cuda=SimpleNamespace(Device=lambda index: contextlib.nullcontext(), PinnedMemoryPointer=Pinned,
                             alloc_pinned_memory=Pinned, get_current_stream=lambda: compute,
                             Stream=lambda non_blocking: Stream("copy" if non_blocking else "blocking", log)))


def test_async_copier_queues_copies_between_the_compute_streams_waits(monkeypatch):
    from minigrad.data import cuda_copy

    log = []
    cupy = fake_cupy(log)
    monkeypatch.setattr(cuda_copy, "_cupy", lambda: cupy)
    gpu = SimpleNamespace(type="cuda", index=0, xp=cupy)
    copier = cuda_copy.AsyncCopier(gpu)
    batch = [minigrad.tensor(np.arange(4.0).reshape(2, 2), device="cpu"),
             minigrad.tensor([7, 8], device="cpu"), ["a", "b"]]
    prepared = copier.prepare(batch)  # pinned copies, in the background thread of the prefetcher
    assert all(cuda_copy.is_pinned(t.array) for t in prepared[:2]) and prepared[2] == ["a", "b"]
    assert not cuda_copy.is_pinned(batch[0].array)
    memory = weakref.ref(storage_of(prepared[0].array).base.obj)
    flight = copier.start(prepared)
    assert log == [("record", "compute#1"), ("wait", "copy", "compute#1"),  # after the queued kernels
                   ("copy", "copy", [[0.0, 1.0], [2.0, 3.0]]), ("copy", "copy", [7, 8]), ("record", "copy#1")]
    log.clear()
    x, y, names = copier.finish(flight)
    assert log == [("wait", "compute", "copy#1")]  # on the GPU: the CPU does not block
    assert x.device is gpu and x.array.tolist() == [[0.0, 1.0], [2.0, 3.0]] and names == ["a", "b"]
    del prepared, flight, batch
    assert memory() is not None  # the copy may still be reading it
    copier.stream.events[0].done = True
    copier.start([minigrad.tensor([1.0], device="cpu")])
    assert memory() is None  # copied: the pinned buffer is free again
