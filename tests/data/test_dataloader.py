"""DataLoader: ordering, shuffling, batching, and worker processes (seeding, errors, death, shutdown).

Every test that starts workers gives the loader a timeout or relies on the liveness check, so a
bug makes a test fail within seconds instead of hanging.
"""

import gc
import multiprocessing
import os
import signal
import time

import numpy as np
import pytest

import minigrad
from minigrad.data import (
    BatchSampler, DataLoader, Dataset, Digits, IterableDataset, SequentialSampler, TensorDataset,
    get_worker_info,
)
from minigrad.data import transforms as T


class Range(Dataset):
    """Sample i: (float32 array full of i, i); fails or dies at chosen indices, in workers only."""

    def __init__(self, n, fail_at=None, die_at=None, sleep_at=None):
        self.n, self.fail_at, self.die_at, self.sleep_at = n, fail_at, die_at, sleep_at

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.fail_at:
            raise ValueError(f"bad sample {i}")
        if i == self.die_at and get_worker_info() is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        if i == self.sleep_at:
            time.sleep(3)
        return np.full((2,), i, np.float32), i


class RandomDraws(Dataset):
    """Samples drawn from the generators a worker reseeds: numpy's, minigrad's, and the pid."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return np.random.random(), minigrad.rand(1).item(), os.getpid()


class Shards(IterableDataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __iter__(self):
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(start, self.n, step))


def _children():
    return {p.pid for p in multiprocessing.active_children()}


def _batches(loader):
    return [(x.numpy().copy(), y.tolist()) for x, y in loader]


def _same(a, b):
    return len(a) == len(b) and all((x1 == x2).all() and y1 == y2 for (x1, y1), (x2, y2) in zip(a, b))


# -- single process ---------------------------------------------------------------------------
def test_sequential_batches_in_order():
    loader = DataLoader(Range(10), batch_size=4)
    batches = list(loader)
    assert len(loader) == 3 == len(batches)
    x, y = batches[0]
    assert x.shape == (4, 2) and x.dtype == minigrad.float32 and y.dtype == minigrad.int64
    assert [b[1].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_drop_last():
    loader = DataLoader(Range(10), batch_size=4, drop_last=True)
    assert len(loader) == 2 and [b[1].tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_batch_size_none_yields_samples():
    loader = DataLoader(Range(3), batch_size=None)
    x, y = next(iter(loader))
    assert isinstance(x, minigrad.Tensor) and x.shape == (2,) and y == 0 and len(loader) == 3


def test_shuffle_is_reproducible_with_a_generator():
    a = [b[1].tolist() for b in DataLoader(Range(20), batch_size=5, shuffle=True, generator=7)]
    b = [b[1].tolist() for b in DataLoader(Range(20), batch_size=5, shuffle=True, generator=7)]
    c = [b[1].tolist() for b in DataLoader(Range(20), batch_size=5, shuffle=True, generator=8)]
    assert a == b != c and sorted(sum(a, [])) == list(range(20))
    loader = DataLoader(Range(20), batch_size=5, shuffle=True, generator=np.random.default_rng(7))
    assert [b[1].tolist() for b in loader] == a
    assert [b[1].tolist() for b in loader] != a  # the next epoch is a new order


def test_shuffle_follows_manual_seed():
    minigrad.manual_seed(1)
    a = [b[1].tolist() for b in DataLoader(Range(20), batch_size=5, shuffle=True)]
    minigrad.manual_seed(1)
    assert [b[1].tolist() for b in DataLoader(Range(20), batch_size=5, shuffle=True)] == a


def test_batch_sampler_and_sampler():
    loader = DataLoader(Range(6), batch_sampler=[[5, 0], [2, 3, 4]])
    assert [b[1].tolist() for b in loader] == [[5, 0], [2, 3, 4]] and len(loader) == 2
    loader = DataLoader(Range(6), batch_sampler=BatchSampler(SequentialSampler(range(6)), 4, False))
    assert [b[1].tolist() for b in loader] == [[0, 1, 2, 3], [4, 5]]
    loader = DataLoader(Range(6), sampler=[3, 1], batch_size=2)
    assert [b[1].tolist() for b in loader] == [[3, 1]]


def test_argument_errors():
    with pytest.raises(ValueError, match="mutually exclusive with shuffle"):
        DataLoader(Range(4), sampler=[0], shuffle=True)
    with pytest.raises(ValueError, match="batch_sampler"):
        DataLoader(Range(4), batch_sampler=[[0]], batch_size=2)
    with pytest.raises(ValueError, match="persistent_workers"):
        DataLoader(Range(4), persistent_workers=True)
    with pytest.raises(ValueError, match="num_workers"):
        DataLoader(Range(4), num_workers=-1)
    with pytest.raises(ValueError, match="shuffle"):
        DataLoader(Shards(4), shuffle=True)


def test_iterable_dataset_batches():
    loader = DataLoader(Shards(7), batch_size=3)
    assert [b.tolist() for b in loader] == [[0, 1, 2], [3, 4, 5], [6]] and len(loader) == 3


def test_tensor_dataset_loader():
    x, y = minigrad.randn(10, 3), minigrad.arange(10)
    xb, yb = next(iter(DataLoader(TensorDataset(x, y), batch_size=4)))
    np.testing.assert_array_equal(xb.numpy(), x.numpy()[:4])
    assert yb.tolist() == [0, 1, 2, 3]


# -- worker processes -------------------------------------------------------------------------
@pytest.mark.parametrize("num_workers", [1, 2])
def test_workers_give_the_same_batches_as_the_main_process(num_workers):
    serial = _batches(DataLoader(Range(23), batch_size=4, shuffle=True, generator=3))
    parallel = _batches(DataLoader(Range(23), batch_size=4, shuffle=True, generator=3,
                                   num_workers=num_workers, timeout=10))
    assert _same(serial, parallel)


def test_worker_seeding_is_reproducible_and_per_worker():
    def run(seed):
        loader = DataLoader(RandomDraws(), batch_size=2, num_workers=2, generator=seed, timeout=10)
        return [(a.tolist(), b.tolist(), p.tolist()) for a, b, p in loader]

    first, again, other = run(0), run(0), run(1)
    assert [r[:2] for r in first] == [r[:2] for r in again]
    assert [r[:2] for r in first] != [r[:2] for r in other]
    # batch i is built by worker i % 2; the two workers draw different numbers
    assert first[0][2][0] != first[1][2][0] and first[0][2][0] == first[2][2][0]
    assert first[0][0] != first[1][0] and first[0][1] != first[1][1]


def test_worker_init_fn_and_worker_info():
    class Info(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            info = get_worker_info()
            return info.id, info.num_workers, info.seed, int(os.environ["MG_TEST_INIT"])

    def init(worker_id):
        os.environ["MG_TEST_INIT"] = str(100 + worker_id)

    out = [list(b) for b in DataLoader(Info(), batch_size=None, num_workers=2,
                                          worker_init_fn=init, generator=0, timeout=10)]
    assert [o[0] for o in out] == [0, 1, 0, 1] and all(o[1] == 2 for o in out)
    assert out[1][2] == out[0][2] + 1 and [o[3] for o in out] == [100, 101, 100, 101]
    assert get_worker_info() is None


def test_augmented_digits_are_reproducible_with_workers():
    ds = Digits(transform=T.Compose([T.RandomCrop(8, padding=1), T.RandomHorizontalFlip()]))
    ds.data, ds.targets = ds.data[:48], ds.targets[:48]

    def run():
        return _batches(DataLoader(ds, batch_size=16, shuffle=True, generator=5, num_workers=2, timeout=10))

    assert _same(run(), run())


def test_iterable_dataset_with_workers_shards():
    loader = DataLoader(Shards(10), batch_size=2, num_workers=2, timeout=10)
    out = [b.tolist() for b in loader]
    assert out == [[0, 2], [1, 3], [4, 6], [5, 7], [8], [9]]
    assert out == [b.tolist() for b in loader]


def test_tensors_cross_processes_as_arrays():
    class Grads(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return minigrad.ones(3, requires_grad=True) * i

    batch = next(iter(DataLoader(Grads(), batch_size=4, num_workers=1, timeout=10)))
    assert isinstance(batch, minigrad.Tensor) and batch.grad_fn is None
    assert batch[:, 0].tolist() == [0, 1, 2, 3]


def test_worker_exception_is_reraised_with_its_traceback():
    before = _children()
    loader = DataLoader(Range(16, fail_at=9), batch_size=2, num_workers=2, timeout=10)
    with pytest.raises(ValueError) as info:
        list(loader)
    text = str(info.value)
    assert "Caught ValueError in DataLoader worker process 0" in text
    assert "__getitem__" in text and "bad sample 9" in text and "Traceback" in text
    assert _children() <= before  # the workers were shut down


class NeedsCode(Exception):
    def __init__(self, code, detail):
        super().__init__(f"code {code}: {detail}")


def test_exceptions_keep_their_type_name_and_message():
    class Local(KeyError):
        pass

    for error, base in [(Local("oops"), KeyError), (NeedsCode(7, "disk full"), NeedsCode)]:
        class Fails(Dataset):
            def __len__(self):
                return 2

            def __getitem__(self, i):
                raise error

        with pytest.raises(base) as info:
            list(DataLoader(Fails(), num_workers=1, timeout=10))
        assert type(info.value).__name__ == type(error).__name__
        assert f"Caught {type(error).__name__} in DataLoader worker process 0" in str(info.value)
        assert f"{type(error).__name__}: {str(error)}" in str(info.value)


def test_dead_worker_raises_instead_of_hanging():
    before = _children()
    loader = DataLoader(Range(16, die_at=5), batch_size=2, num_workers=2)
    with pytest.raises(RuntimeError, match=r"exited unexpectedly.*SIGKILL"):
        list(loader)
    assert _children() <= before


def test_timeout_raises():
    loader = DataLoader(Range(4, sleep_at=1), batch_size=1, num_workers=1, timeout=0.3)
    with pytest.raises(RuntimeError, match="timed out after 0.3 s"):
        list(loader)


def test_breaking_out_shuts_workers_down():
    before = _children()
    it = iter(DataLoader(Range(64), batch_size=2, num_workers=2, timeout=10))
    next(it)
    assert len(_children() - before) == 2
    del it
    gc.collect()
    deadline = time.monotonic() + 5
    while _children() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _children() - before


def test_persistent_workers_survive_epochs():
    class Pid(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return os.getpid()

    def pids(loader):
        return {p for b in loader for p in b.tolist()}

    before = _children()
    loader = DataLoader(Pid(), batch_size=1, num_workers=2, persistent_workers=True, timeout=10)
    first = pids(loader)
    it = iter(loader)
    next(it)
    del it  # an abandoned epoch: its leftover results must not leak into the next one
    assert pids(loader) == first and len(first) == 2
    assert [b.tolist() for b in loader] != []
    fresh = DataLoader(Pid(), batch_size=1, num_workers=2, timeout=10)
    assert pids(fresh) != pids(fresh)  # without persistence each epoch starts new processes
    del loader, fresh
    gc.collect()
    deadline = time.monotonic() + 5
    while _children() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _children() - before


def test_spawn_context_pickles_what_the_workers_need():
    # host tensors, as worker processes are given in torch: a spawned process starts without the
    # parent's GPU context (and without the test suite's simulated cupy)
    ds = TensorDataset(minigrad.tensor(np.arange(12.0).reshape(6, 2), device="cpu"),
                       minigrad.tensor(np.arange(6), device="cpu"))
    loader = DataLoader(ds, batch_size=4, num_workers=1, multiprocessing_context="spawn", timeout=30)
    assert [b[1].tolist() for b in loader] == [[0, 1, 2, 3], [4, 5]]


def test_a_superseded_persistent_iterator_raises_instead_of_hanging():
    loader = DataLoader(Range(8), batch_size=2, num_workers=2, persistent_workers=True, timeout=10)
    first = iter(loader)
    next(first)
    assert [b[1].tolist() for b in loader][0] == [0, 1]
    with pytest.raises(RuntimeError, match="superseded"):
        next(first)


def test_unpicklable_dataset_with_spawn_says_why():
    class Local(Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return i

    before = _children()
    with pytest.raises(Exception) as info:
        list(DataLoader(Local(), num_workers=1, multiprocessing_context="spawn", timeout=10))
    assert "define them at module level" in "".join(getattr(info.value, "__notes__", []))
    assert _children() <= before
