"""Samplers: the order in which a DataLoader visits a map-style dataset, with torch's names.

A sampler yields indices; ``BatchSampler`` groups them into lists, one per batch. Shuffling is a
sampler (``RandomSampler``), so it is seeded like everything else random: by the ``generator``
given (a numpy Generator or an int seed) or else by minigrad's global generator, which
``minigrad.manual_seed`` resets. Chapter 01 uses them in its input pipelines.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Sequence, Sized

import numpy

from minigrad import backend
from minigrad._tensor import Tensor

__all__ = ["Sampler", "SequentialSampler", "RandomSampler", "SubsetRandomSampler",
           "WeightedRandomSampler", "BatchSampler", "as_generator"]


_CHUNK = 32  # RandomSampler(replacement=True) draws this many indices at a time


def as_generator(generator: Any) -> numpy.random.Generator:
    """``None`` -> minigrad's global CPU generator; an int -> a new generator seeded with it;
    a CPU ``minigrad.Generator`` -> its stream (indices are drawn on the host); a
    ``numpy.random.Generator`` -> itself."""
    if generator is None or isinstance(generator, backend.Generator):
        return backend.rng_of(backend.cpu, generator)
    if isinstance(generator, numpy.random.Generator):
        return generator
    if isinstance(generator, (int, numpy.integer)) and not isinstance(generator, bool):
        return numpy.random.default_rng(int(generator))
    raise TypeError(f"generator: expected None, an int seed, a minigrad.Generator or a numpy.random.Generator, "
                    f"got {type(generator).__name__}")


def _stateful(generator: Any) -> Any:
    # An int seed becomes one generator kept for the sampler's life, so every epoch differs
    # while the run as a whole stays reproducible; None stays None (global generator, looked
    # up at each epoch because manual_seed replaces it).
    return None if generator is None else as_generator(generator)


class Sampler:
    """Base class: subclasses define ``__iter__`` (yielding indices) and usually ``__len__``."""

    def __init__(self, data_source: Sized | None = None) -> None:
        pass

    def __iter__(self) -> Iterator:
        raise NotImplementedError(f"{type(self).__name__} must define __iter__")


class SequentialSampler(Sampler):
    """0, 1, ..., len(data_source) - 1."""

    def __init__(self, data_source: Sized) -> None:
        self.data_source = data_source

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self.data_source)))

    def __len__(self) -> int:
        return len(self.data_source)


class RandomSampler(Sampler):
    """A fresh random permutation each epoch; with ``replacement=True``, ``num_samples``
    independent uniform draws. Without replacement, ``num_samples > len`` chains permutations."""

    def __init__(self, data_source: Sized, replacement: bool = False, num_samples: int | None = None,
                 generator: Any = None) -> None:
        self.data_source, self.replacement = data_source, bool(replacement)
        self._num_samples, self.generator = num_samples, _stateful(generator)
        if not isinstance(self.num_samples, int) or self.num_samples <= 0:
            raise ValueError(f"RandomSampler: num_samples should be a positive integer, "
                             f"got {self.num_samples}")

    @property
    def num_samples(self) -> int:
        return len(self.data_source) if self._num_samples is None else self._num_samples

    def __iter__(self) -> Iterator[int]:
        rng, n, k = as_generator(self.generator), len(self.data_source), self.num_samples
        if self.replacement:  # drawn in chunks, as torch: num_samples may be far beyond memory
            for start in range(0, k, _CHUNK):
                yield from rng.integers(0, n, size=min(_CHUNK, k - start)).tolist()
            return
        for _ in range(k // n):
            yield from rng.permutation(n).tolist()
        yield from rng.permutation(n)[: k % n].tolist()

    def __len__(self) -> int:
        return self.num_samples


class SubsetRandomSampler(Sampler):
    """The given indices in a fresh random order each epoch (e.g. a validation split)."""

    def __init__(self, indices: Sequence[int], generator: Any = None) -> None:
        self.indices, self.generator = indices, _stateful(generator)

    def __iter__(self) -> Iterator[int]:
        for i in as_generator(self.generator).permutation(len(self.indices)).tolist():
            yield self.indices[i]

    def __len__(self) -> int:
        return len(self.indices)


class WeightedRandomSampler(Sampler):
    """``num_samples`` indices drawn with probability proportional to ``weights`` (class balancing)."""

    def __init__(self, weights: Sequence[float], num_samples: int, replacement: bool = True,
                 generator: Any = None) -> None:
        if isinstance(weights, Tensor):
            weights = weights.detach().numpy()
        w = numpy.asarray(weights, dtype=numpy.float64)
        if w.ndim != 1 or (w < 0).any() or not w.sum() > 0:
            raise ValueError("WeightedRandomSampler: weights must be a 1-D sequence of non-negative "
                             "numbers with a positive sum")
        if not isinstance(num_samples, int) or num_samples <= 0:
            raise ValueError(f"WeightedRandomSampler: num_samples should be a positive integer, "
                             f"got {num_samples}")
        if not replacement and num_samples > (w > 0).sum():
            raise ValueError(f"WeightedRandomSampler: cannot draw {num_samples} samples without "
                             f"replacement from {(w > 0).sum()} with non-zero weight")
        self.weights, self.num_samples, self.replacement = w, num_samples, replacement
        self.generator = _stateful(generator)

    def __iter__(self) -> Iterator[int]:
        p = self.weights / self.weights.sum()
        rng = as_generator(self.generator)
        yield from rng.choice(len(p), size=self.num_samples, replace=self.replacement, p=p).tolist()

    def __len__(self) -> int:
        return self.num_samples


class BatchSampler(Sampler):
    """Group another sampler's indices into lists of ``batch_size``; the last one may be short
    unless ``drop_last``."""

    def __init__(self, sampler: Iterable[int], batch_size: int, drop_last: bool) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise ValueError(f"BatchSampler: batch_size should be a positive integer, got {batch_size!r}")
        if not isinstance(drop_last, bool):
            raise ValueError(f"BatchSampler: drop_last should be a bool, got {drop_last!r}")
        self.sampler, self.batch_size, self.drop_last = sampler, batch_size, drop_last

    def __iter__(self) -> Iterator[list[int]]:
        batch: list[int] = []
        for index in self.sampler:
            batch.append(index)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    def __len__(self) -> int:
        n = len(self.sampler)  # type: ignore[arg-type]
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
