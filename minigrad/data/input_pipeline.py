"""Pipeline: a chainable input pipeline in the tf.data style.

``Pipeline.from_tensor_slices((x, y)).shuffle(1000).map(augment, num_parallel_calls=2)
.batch(32).prefetch(2)`` reads as the data's journey: slice, mix, transform (in worker processes),
group, run ahead. Each method returns a new Pipeline that wraps the previous one; nothing happens
until you iterate. ``map`` runs in the same ``WorkerPool`` the DataLoader uses and ``prefetch``
is the ``BackgroundIterator`` thread, so data preparation overlaps compute. Chapter 01.
"""

from __future__ import annotations

import itertools
import math
import os
from typing import Any, Callable, Iterator

import numpy

from minigrad import backend
from minigrad.data.dataloader import default_collate
from minigrad.data.workers import BackgroundIterator, WorkerPool
from minigrad.errors import ShapeError
from minigrad._tensor import Tensor, _wrap

__all__ = ["Pipeline", "AUTOTUNE"]

AUTOTUNE = -1  # num_parallel_calls / prefetch: let minigrad choose (the CPU count / 2 elements)
_INFINITE = math.inf


def _slices(structure: Any) -> tuple[list, Callable[[int], Any]]:
    """The leaves of a nested tuple/dict of arrays, and how to build element ``i`` from them.
    As in tf.data, tuples and dicts are structure while a list is data (one array)."""
    if isinstance(structure, dict):
        keys = list(structure)
        parts = [_slices(structure[k]) for k in keys]
        return [leaf for p in parts for leaf in p[0]], lambda i: {k: p[1](i) for k, p in zip(keys, parts)}
    if isinstance(structure, tuple):
        parts = [_slices(s) for s in structure]
        return [leaf for p in parts for leaf in p[0]], lambda i: tuple(p[1](i) for p in parts)
    if isinstance(structure, Tensor):
        return [structure], lambda i: _wrap(structure.array[i], structure.device)
    array = numpy.asarray(structure)
    if array.ndim == 0:
        raise ShapeError(f"Pipeline.from_tensor_slices: cannot slice a 0-d value {structure!r}")
    return [array], lambda i: array[i]


class _Apply:
    """The task a ``map`` worker runs: tf.data unpacks a tuple element into positional args."""

    def __init__(self, fn: Callable) -> None:
        self.fn = fn

    def begin_epoch(self) -> None:
        pass

    def __call__(self, element: Any) -> Any:
        return self.fn(*element) if type(element) is tuple else self.fn(element)


class _ParallelMap:
    """The iterator of a parallel ``map``: its pool starts at creation, in the caller's thread."""

    def __init__(self, source: Pipeline, fn: Callable, workers: int) -> None:
        self._pool = WorkerPool(_Apply(fn), workers, int(backend.cpu.rng.integers(0, 2**62)),
                                name="Pipeline.map")
        self._results = self._pool.imap(source, window=2 * workers)

    def __iter__(self) -> _ParallelMap:
        return self

    def __next__(self) -> Any:
        try:
            return next(self._results)
        except StopIteration:
            self.close()
            raise

    def close(self) -> None:
        self._results.close()
        self._pool.shutdown()


def _shuffle(source: Pipeline, buffer_size: int, rng: numpy.random.Generator) -> Iterator:
    """Yield the elements of ``source`` shuffled through a buffer of ``buffer_size`` (a generator).

    Fill the buffer with the first ``buffer_size`` elements, yielding nothing; then for each new
    element, yield a random element of the buffer (``int(rng.integers(buffer_size))``) and put
    the new one in its place; when ``source`` runs out, yield what is left in the buffer, in
    random order (``rng.integers(len(buffer))`` each time). Draw only from ``rng``, so that a seed
    gives one order. What is checked: the output is a permutation of the input; no element comes
    out before it could have been read (element k never before position k - buffer_size + 1);
    ``buffer_size=1`` keeps the order, a larger one changes it, and a buffer of the data set's
    size mixes it evenly; an endless ``source`` works, read only as far as needed.
    """
    ### BEGIN SOLUTION chapter 01: the shuffle buffer
    buffer: list = []
    for element in source:
        if len(buffer) < buffer_size:
            buffer.append(element)
            continue
        # The buffer is full: send out a random one of its elements and take the new one in.
        i = int(rng.integers(buffer_size))
        yield buffer[i]
        buffer[i] = element
    while buffer:
        i = int(rng.integers(len(buffer)))
        buffer[i], buffer[-1] = buffer[-1], buffer[i]
        yield buffer.pop()
    ### END SOLUTION


def _batches(source: Pipeline, batch_size: int, drop_remainder: bool) -> Iterator:
    """Yield batches of ``batch_size`` consecutive elements of ``source`` (a generator).

    Read ``source`` lazily, ``batch_size`` elements at a time (``itertools.islice``), and stack
    each group with ``default_collate``. The last batch may be smaller, unless
    ``drop_remainder``: then it is dropped. A Pipeline keeps its elements' structure: when the
    elements are tuples (``from_tensor_slices((x, y))``), each batch is a **tuple** of batched
    Tensors, although ``default_collate`` returns a list for tuple samples (as torch's
    DataLoader does): convert it. Other elements (a Tensor, a dict) give what
    ``default_collate`` gives. An endless source must still yield batches.
    """
    ### BEGIN SOLUTION chapter 01: batching
    it = iter(source)
    while True:
        items = list(itertools.islice(it, batch_size))
        if not items or (drop_remainder and len(items) < batch_size):
            return
        batch = default_collate(items)
        yield tuple(batch) if type(items[0]) is tuple else batch
    ### END SOLUTION


class Pipeline:
    """A re-iterable sequence of elements, built stage by stage (see the module docstring)."""

    def __init__(self, make_iterator: Callable[[], Iterator], length: float | None, description: str) -> None:
        self._make_iterator, self._length, self._description = make_iterator, length, description

    # -- sources ----------------------------------------------------------------------------
    @staticmethod
    def from_tensor_slices(tensors: Any) -> Pipeline:
        """Element ``i`` is ``tensors`` with every array/Tensor in it indexed at ``i`` along its
        first dimension: ``from_tensor_slices((x, y))`` yields ``(x[i], y[i])``."""
        leaves, element = _slices(tensors)
        sizes = sorted({len(leaf) for leaf in leaves})
        if len(sizes) != 1:
            shapes = ", ".join(str(tuple(leaf.shape)) for leaf in leaves)
            raise ShapeError(f"Pipeline.from_tensor_slices: every component needs the same first "
                             f"dimension, got shapes {shapes}")
        n = sizes[0]
        return Pipeline(lambda: map(element, range(n)), n, "from_tensor_slices")

    @staticmethod
    def range(*args: int) -> Pipeline:
        """The integers of ``range(*args)``, as Python ints."""
        r = range(*args)
        return Pipeline(lambda: iter(r), len(r), f"range({', '.join(map(str, args))})")

    # -- stages -----------------------------------------------------------------------------
    def shuffle(self, buffer_size: int, seed: int | None = None,
                reshuffle_each_iteration: bool = True) -> Pipeline:
        """Shuffle through a buffer of ``buffer_size`` elements: each output is drawn at random
        from the buffer and replaced by the next input. A buffer as large as the data gives a
        uniform shuffle; ``buffer_size=1`` changes nothing. A new order each iteration, the
        sequence of orders fixed by ``seed`` (else by minigrad's global generator)."""
        if not isinstance(buffer_size, int) or buffer_size < 1:
            raise ValueError(f"Pipeline.shuffle: buffer_size should be a positive integer, "
                             f"got {buffer_size!r}")
        epochs = itertools.count()

        def make() -> Iterator:
            epoch = next(epochs) if reshuffle_each_iteration else 0
            entropy = [seed, epoch] if seed is not None else int(backend.cpu.rng.integers(0, 2**62))
            return _shuffle(self, buffer_size, numpy.random.default_rng(entropy))

        return self._then(make, self._length, f"shuffle({buffer_size})")

    def map(self, fn: Callable, num_parallel_calls: int | None = None) -> Pipeline:
        """Apply ``fn`` to every element (a tuple element is unpacked: ``fn(x, y)``). With
        ``num_parallel_calls > 1`` (or ``AUTOTUNE``), ``fn`` runs in that many worker processes;
        the order of elements is kept."""
        workers = num_parallel_calls
        if workers == AUTOTUNE:
            workers = os.cpu_count() or 1
        if workers is not None and (not isinstance(workers, int) or workers < 1):
            raise ValueError(f"Pipeline.map: num_parallel_calls should be None, AUTOTUNE or a "
                             f"positive integer, got {num_parallel_calls!r}")
        if workers is not None and workers > 1:
            return self._then(lambda: _ParallelMap(self, fn, workers), self._length,
                              f"map(parallel={workers})")
        apply = _Apply(fn)
        return self._then(lambda: map(apply, self), self._length, "map")

    def batch(self, batch_size: int, drop_remainder: bool = False) -> Pipeline:
        """Group ``batch_size`` consecutive elements, stacked with ``default_collate`` into
        Tensors (a tuple element gives a tuple of batches)."""
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"Pipeline.batch: batch_size should be a positive integer, got {batch_size!r}")
        n = self._length
        if n is None or n == _INFINITE:
            length = n
        else:
            length = n // batch_size if drop_remainder else -(-n // batch_size)
        return self._then(lambda: _batches(self, batch_size, drop_remainder), length, f"batch({batch_size})")

    def prefetch(self, buffer_size: int) -> Pipeline:
        """Prepare up to ``buffer_size`` elements ahead in a background thread, so the next batch
        is being made while the training step computes on this one."""
        size = 2 if buffer_size == AUTOTUNE else buffer_size
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"Pipeline.prefetch: buffer_size should be a positive integer or "
                             f"AUTOTUNE, got {buffer_size!r}")
        return self._then(lambda: BackgroundIterator(self, size), self._length, f"prefetch({size})")

    def take(self, count: int) -> Pipeline:
        """The first ``count`` elements (``-1``: all of them)."""
        if count == -1:
            return self
        if not isinstance(count, int) or count < 0:
            raise ValueError(f"Pipeline.take: count should be a non-negative integer or -1, got {count!r}")
        n = self._length
        length = count if n == _INFINITE else (None if n is None else min(n, count))
        return self._then(lambda: itertools.islice(self, count), length, f"take({count})")

    def repeat(self, count: int | None = None) -> Pipeline:
        """Iterate the pipeline ``count`` times (``None`` or ``-1``: forever); each pass is a new
        iteration, so a shuffle reshuffles."""
        if count is not None and count != -1 and (not isinstance(count, int) or count < 0):
            raise ValueError(f"Pipeline.repeat: count should be None, -1 or a non-negative "
                             f"integer, got {count!r}")
        forever = count is None or count == -1
        n = self._length
        length = n if n is None or n == 0 else (_INFINITE if forever else n * count)

        def make() -> Iterator:
            passes = itertools.repeat(self) if forever else itertools.repeat(self, count)
            return itertools.chain.from_iterable(passes)

        return self._then(make, length, f"repeat({'' if forever else count})")

    # -- iteration --------------------------------------------------------------------------
    def _then(self, make_iterator: Callable[[], Iterator], length: float | None,
              description: str) -> Pipeline:
        return Pipeline(make_iterator, length, f"{self._description} -> {description}")

    def __iter__(self) -> Iterator:
        return iter(self._make_iterator())

    def __len__(self) -> int:
        if self._length is None:
            raise TypeError("Pipeline: the length is unknown")
        if self._length == _INFINITE:
            raise TypeError("Pipeline: the pipeline is infinite (repeat() without a count)")
        return int(self._length)

    def __repr__(self) -> str:
        return f"Pipeline({self._description})"
