"""DataLoader: batches from a dataset, in order or shuffled, optionally prepared by worker processes.

A sampler picks indices, the dataset turns them into samples, ``collate_fn`` stacks the samples
into batch Tensors. With ``num_workers > 0`` whole batches are built in worker processes (see
``workers.py``) and come back in order, numbered, so the result does not depend on which worker
was faster. Names and semantics follow ``torch.utils.data``; chapter 01 measures what the workers
buy (benchmarks/bench_dataloader.py).
"""

from __future__ import annotations

import contextlib
import itertools
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Callable, Iterator

import numpy

from minigrad import backend
from minigrad.data.cuda_copy import pin_memory
from minigrad.data.dataset import Dataset, IterableDataset
from minigrad.data.sampler import (
    BatchSampler, RandomSampler, Sampler, SequentialSampler, _stateful, as_generator,
)
from minigrad.data.workers import WorkerPool
from minigrad.errors import DeviceError, DTypeError, ShapeError
from minigrad._tensor import Tensor, _wrap

__all__ = ["DataLoader", "default_collate", "default_convert"]

_COLLATE_TYPES = "tensors, numpy arrays, numbers, strings, dicts or lists"


def _from_numpy(array: numpy.ndarray, who: str) -> Tensor:
    if array.dtype.name not in backend.DTYPES:
        if array.dtype.kind in "USO":
            raise TypeError(f"{who}: batch must contain {_COLLATE_TYPES}; found a numpy array of "
                            f"dtype {array.dtype}")
        raise DTypeError(f"{who}: numpy dtype {array.dtype} has no minigrad dtype; "
                         f"expected one of {sorted(backend.DTYPES)}")
    return _wrap(array, backend.cpu)


def _check_same_shape(shapes: list, who: str) -> None:
    for i, s in enumerate(shapes):
        if s != shapes[0]:
            raise ShapeError(f"{who}: cannot stack samples of different shapes: {tuple(shapes[0])} at "
                             f"entry 0 and {tuple(s)} at entry {i}; pad them or pass a collate_fn")


def default_collate(batch: Sequence) -> Any:
    """Stack a list of samples into a batch, keeping the samples' structure.

    Tensors and numpy arrays are stacked along a new first dimension (dtype kept: float64 arrays
    give a float64 batch); Python floats give float64, ints int64 and bools bool tensors (as
    torch); numpy scalars keep their dtype; strings stay a list; dicts, tuples and lists are
    collated field by field (a tuple sample gives a list of batches, as in torch; a namedtuple
    gives the namedtuple; ``Pipeline.batch`` turns the list back into a tuple). Samples' Tensors
    are stacked as data: the batch is a new leaf, detached from any graph.

    Errors name the function and what differs: samples of different shapes (``ShapeError``,
    ``_check_same_shape``), Tensors on different devices (``DeviceError``), sequences of
    different lengths (``ShapeError``), a type it cannot collate (``TypeError``). The helpers
    ``_from_numpy``, ``_collate_numbers``, ``_one_kind`` and ``_rebuild`` (above) do the
    conversions; recurse with ``default_collate`` for the fields of dicts and sequences.
    """
    ### BEGIN SOLUTION chapter 01: collate
    elem = batch[0]
    who = "default_collate"
    if isinstance(elem, Tensor):
        _check_same_shape([t.shape for t in batch], who)
        if any(t.device is not elem.device for t in batch):
            raise DeviceError(f"{who}: samples are on different devices: "
                              f"{sorted({str(t.device) for t in batch})}")
        return _wrap(elem.device.xp.stack([t.array for t in batch]), elem.device)
    if isinstance(elem, numpy.ndarray):
        _check_same_shape([a.shape for a in batch], who)
        return _from_numpy(numpy.stack(batch), who)
    if isinstance(elem, numpy.generic) and elem.dtype.kind in "biuf":
        _one_kind(batch, (type(elem),), who)  # numpy scalars keep their dtype, so they must share it
        return _from_numpy(numpy.array(batch), who)
    if isinstance(elem, (bool, int, float)):
        return _collate_numbers(batch, who)
    if isinstance(elem, (str, bytes)):
        return list(batch)
    if isinstance(elem, Mapping):
        out = {key: default_collate([d[key] for d in batch]) for key in elem}
        return out if type(elem) is dict else _rebuild(type(elem), out)
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):  # namedtuple
        return type(elem)(*(default_collate(list(s)) for s in zip(*batch)))
    if isinstance(elem, Sequence):
        if any(len(s) != len(elem) for s in batch):
            raise ShapeError(f"{who}: each element in the batch should have the same length, got "
                             f"lengths {sorted({len(s) for s in batch})}")
        fields = [default_collate(list(s)) for s in zip(*batch)]
        return fields if isinstance(elem, (tuple, list)) else _rebuild(type(elem), fields)
    raise TypeError(f"{who}: batch must contain {_COLLATE_TYPES}; found {type(elem).__name__}")
    ### END SOLUTION


def _collate_numbers(batch: Sequence, who: str) -> Tensor:
    """Python numbers by PyTorch's rules: a batch that starts with a float is float64; otherwise
    the values decide, as in ``tensor(batch)`` (a float anywhere: the default float dtype; ints
    and bools: int64; bools only: bool). A value the dtype cannot hold is an error, never cut."""
    _one_kind(batch, (bool, int, float), who)
    if isinstance(batch[0], float):
        dtype = numpy.float64
    elif any(isinstance(v, float) for v in batch):
        dtype = backend.get_default_dtype()
    elif all(isinstance(v, bool) for v in batch):
        dtype = numpy.bool_
    else:
        dtype = numpy.int64
    try:
        with numpy.errstate(over="ignore"):  # 1e300 in float32 is inf, as in PyTorch
            return _wrap(numpy.array(batch, dtype=dtype), backend.cpu)
    except OverflowError:
        raise DTypeError(f"{who}: an integer in {list(batch)[:8]} does not fit {numpy.dtype(dtype)}") from None


def _one_kind(batch: Sequence, kinds: tuple, who: str) -> None:
    for i, v in enumerate(batch):
        if not isinstance(v, kinds):
            raise TypeError(f"{who}: entry {i} is a {type(v).__name__} but entry 0 is a "
                            f"{type(batch[0]).__name__}; a batch field must hold one kind of value")


def _rebuild(kind: type, value: Any) -> Any:
    try:
        return kind(value)
    except TypeError:  # a container type that cannot be built from its items
        return value


def default_convert(data: Any) -> Any:
    """Without batching (``batch_size=None``): numpy arrays become Tensors, containers are
    converted item by item, everything else is returned as is."""
    if isinstance(data, numpy.ndarray) and data.dtype.kind not in "USO":
        return _from_numpy(data, "default_convert")
    if isinstance(data, numpy.generic) and data.dtype.kind in "biuf":
        return _from_numpy(numpy.asarray(data), "default_convert")
    if isinstance(data, Mapping):
        out = {k: default_convert(v) for k, v in data.items()}
        return out if type(data) is dict else _rebuild(type(data), out)
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(default_convert(d) for d in data))
    if isinstance(data, (tuple, list)):
        return [default_convert(d) for d in data]
    return data


def _gpu_present() -> bool:
    """Whether pinning pays: there is a CUDA GPU to copy to. torch warns and ignores the flag otherwise."""
    from minigrad.backend import cuda  # here, not at import: it asks the driver

    if cuda.is_available():
        return True
    warnings.warn("DataLoader: 'pin_memory' argument is set as true but no CUDA GPU is available, "
                  "so pinned memory won't be used", UserWarning, stacklevel=3)
    return False


class _Fetcher:
    """Turns one sampler output into one batch: the task a worker (or the main process) runs."""

    def __init__(self, dataset: Any, auto_collation: bool, collate_fn: Callable,
                 batch_size: int | None, drop_last: bool) -> None:
        self.dataset, self.auto_collation, self.collate_fn = dataset, auto_collation, collate_fn
        self.batch_size, self.drop_last = batch_size, drop_last
        self.iterable = isinstance(dataset, IterableDataset)
        self._it: Iterator | None = None

    def begin_epoch(self) -> None:
        if self.iterable:
            self._it = iter(self.dataset)

    def __call__(self, index: Any) -> Any:
        if self.iterable:
            if not self.auto_collation:
                return self.collate_fn(next(self._it))
            samples = list(itertools.islice(self._it, self.batch_size))
            if not samples or (self.drop_last and len(samples) < self.batch_size):
                raise StopIteration
            return self.collate_fn(samples)
        if not self.auto_collation:
            return self.collate_fn(self.dataset[index])
        getitems = getattr(self.dataset, "__getitems__", None)
        samples = getitems(index) if getitems is not None else [self.dataset[i] for i in index]
        return self.collate_fn(samples)


class DataLoader:
    """Iterate over ``dataset`` in batches, as ``torch.utils.data.DataLoader``.

    ``shuffle=True`` draws a new order each epoch from ``generator`` (a numpy Generator or an int
    seed; default minigrad's global generator, seeded by ``manual_seed``). ``num_workers > 0``
    builds batches in that many worker processes, ``prefetch_factor`` batches ahead per worker;
    worker ``i`` is seeded with a per-epoch base seed (drawn from the same generator) plus ``i``,
    so augmentations are reproducible. ``persistent_workers`` keeps the processes across epochs.
    ``timeout`` (seconds, 0 = wait forever) bounds the wait for one batch. ``pin_memory=True``
    copies each batch's CPU tensors into page-locked memory, from which a GPU copies without the
    CPU waiting (``cuda_copy.py``); without a CUDA GPU it warns and changes nothing, as in torch.
    ``DevicePrefetcher(loader, "cuda")`` then overlaps those copies with the training step.
    ``multiprocessing_context`` picks the start method (default: fork on Linux, see workers.py).
    """

    def __init__(self, dataset: Dataset, batch_size: int | None = 1, shuffle: bool | None = None,
                 sampler: Sampler | None = None, batch_sampler: Sampler | None = None,
                 num_workers: int = 0, collate_fn: Callable | None = None, pin_memory: bool = False,
                 drop_last: bool = False, timeout: float = 0, worker_init_fn: Callable | None = None,
                 multiprocessing_context: Any = None, generator: Any = None, *,
                 prefetch_factor: int = 2, persistent_workers: bool = False) -> None:
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"DataLoader: num_workers should be a non-negative integer, got {num_workers!r}")
        if timeout < 0:
            raise ValueError(f"DataLoader: timeout should be non-negative, got {timeout}")
        if not isinstance(prefetch_factor, int) or prefetch_factor < 1:
            raise ValueError(f"DataLoader: prefetch_factor should be a positive integer, "
                             f"got {prefetch_factor!r}")
        if persistent_workers and num_workers == 0:
            raise ValueError("DataLoader: persistent_workers option needs num_workers > 0")
        if isinstance(dataset, IterableDataset):
            if shuffle:
                raise ValueError("DataLoader with IterableDataset: expected unspecified shuffle "
                                 "option, got shuffle=True")
            if sampler is not None or batch_sampler is not None:
                raise ValueError("DataLoader with IterableDataset: expected unspecified sampler "
                                 "and batch_sampler")
        if sampler is not None and shuffle:
            raise ValueError("DataLoader: sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None and (batch_size != 1 or shuffle or sampler is not None or drop_last):
            raise ValueError("DataLoader: batch_sampler option is mutually exclusive with batch_size, "
                             "shuffle, sampler, and drop_last")
        if batch_size is None and drop_last:
            raise ValueError("DataLoader: batch_size=None option disables auto-batching and is "
                             "mutually exclusive with drop_last")

        self.dataset, self.num_workers, self.pin_memory = dataset, num_workers, pin_memory
        self._pin = pin_memory and _gpu_present()
        self.drop_last, self.timeout, self.worker_init_fn = drop_last, timeout, worker_init_fn
        self.multiprocessing_context, self.prefetch_factor = multiprocessing_context, prefetch_factor
        self.persistent_workers = persistent_workers
        self.generator = _stateful(generator)  # shared with the RandomSampler, as in torch
        if batch_sampler is not None:
            batch_size, drop_last = None, False
        elif sampler is None and not isinstance(dataset, IterableDataset):
            sampler = (RandomSampler(dataset, generator=self.generator) if shuffle
                       else SequentialSampler(dataset))
        if batch_size is not None and sampler is not None:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        self.batch_size, self.sampler, self.batch_sampler = batch_size, sampler, batch_sampler
        self._auto_collation = batch_sampler is not None or (
            isinstance(dataset, IterableDataset) and batch_size is not None)
        self.collate_fn = collate_fn or (default_collate if self._auto_collation else default_convert)
        self._pool: WorkerPool | None = None

    def __len__(self) -> int:
        if isinstance(self.dataset, IterableDataset):
            n = len(self.dataset)  # TypeError when the stream has no length, as in torch
            if self.batch_size is None:
                return n
            return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
        return len(self.batch_sampler if self._auto_collation else self.sampler)

    def __iter__(self) -> Iterator:
        # Drawn every epoch whatever num_workers is, so shuffling gives the same order with or
        # without workers.
        base_seed = int(as_generator(self.generator).integers(0, 2**62))
        fetch = _Fetcher(self.dataset, self._auto_collation, self.collate_fn,
                         self.batch_size, self.drop_last)
        indices = self.batch_sampler if self._auto_collation else self.sampler
        if isinstance(self.dataset, IterableDataset):
            indices = itertools.repeat(None)
        if self.num_workers == 0:
            batches = self._serial(fetch, indices)
        else:
            pool = self._pool
            if pool is None or not pool.alive:
                # Started here, not at the first next(), so the workers fork from the caller's thread.
                pool = WorkerPool(fetch, self.num_workers, base_seed, self.worker_init_fn, self.dataset,
                                  self.multiprocessing_context, self.timeout)
                if self.persistent_workers:
                    self._pool = pool
            batches = self._parallel(pool, indices)
        return self._pinned(batches) if self._pin else batches

    @staticmethod
    def _pinned(batches: Iterator) -> Iterator:
        # Here, after the workers: page-locked memory belongs to the process that allocated it.
        with contextlib.closing(batches):
            for batch in batches:
                yield pin_memory(batch)

    @staticmethod
    def _serial(fetch: _Fetcher, indices: Any) -> Iterator:
        fetch.begin_epoch()
        for index in indices:
            if not fetch.iterable:
                yield fetch(index)
                continue
            try:
                batch = fetch(index)
            except StopIteration:  # the stream ran out
                return
            yield batch

    def _parallel(self, pool: WorkerPool, indices: Any) -> Iterator:
        try:
            yield from pool.imap(indices, self.prefetch_factor * self.num_workers)
        finally:
            if not self.persistent_workers:
                pool.shutdown()

    def __repr__(self) -> str:
        return (f"DataLoader(dataset={type(self.dataset).__name__}, batch_size={self.batch_size}, "
                f"num_workers={self.num_workers})")
