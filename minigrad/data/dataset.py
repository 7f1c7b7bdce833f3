"""Datasets with torch.utils.data's names: what a sample is and how to get one.

A map-style ``Dataset`` answers ``len(ds)`` and ``ds[i]``, so a sampler can visit it in any order;
an ``IterableDataset`` is a stream that is only iterated. ``Subset``, ``ConcatDataset`` and
``random_split`` compose datasets by index arithmetic, without copying data. Chapter 01 builds
its input pipelines on them.
"""

from __future__ import annotations

import bisect
import itertools
import math
from typing import Any, Iterable, Iterator, Sequence

import numpy

from minigrad.data.sampler import as_generator
from minigrad.errors import ShapeError
from minigrad._tensor import Tensor, _wrap

__all__ = ["Dataset", "IterableDataset", "TensorDataset", "Subset", "ConcatDataset",
           "ChainDataset", "random_split"]


class Dataset:
    """A map-style dataset: subclasses define ``__getitem__(index)`` and ``__len__()``."""

    def __getitem__(self, index: int) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define __getitem__")

    def __add__(self, other: Dataset) -> ConcatDataset:
        return ConcatDataset([self, other])


class IterableDataset(Dataset):
    """A dataset that is a stream: subclasses define ``__iter__``. With ``num_workers > 0`` each
    worker iterates its own copy, so shard the stream with ``get_worker_info()`` or every worker
    yields every sample."""

    def __iter__(self) -> Iterator:
        raise NotImplementedError(f"{type(self).__name__} must define __iter__")

    def __add__(self, other: IterableDataset) -> ChainDataset:
        return ChainDataset([self, other])


class TensorDataset(Dataset):
    """Sample ``i`` is ``(t[i] for t in tensors)``; all tensors share their first dimension.

    Numpy arrays are copied into Tensors once; samples are views of them (no copy, no graph).
    """

    def __init__(self, *tensors: Tensor | numpy.ndarray) -> None:
        if not tensors:
            raise ValueError("TensorDataset: needs at least one tensor")
        self.tensors = tuple(t if isinstance(t, Tensor) else Tensor(t) for t in tensors)
        sizes = [t.shape[0] if t.ndim else None for t in self.tensors]
        if None in sizes or len(set(sizes)) != 1:
            shapes = ", ".join(str(tuple(t.shape)) for t in self.tensors)
            raise ShapeError(f"TensorDataset: size mismatch between tensors: every tensor needs the "
                             f"same first dimension, got shapes {shapes}")

    def __getitem__(self, index: int) -> tuple[Tensor, ...]:
        return tuple(_wrap(t.array[index], t.device) for t in self.tensors)

    def __len__(self) -> int:
        return self.tensors[0].shape[0]


class Subset(Dataset):
    """The samples of ``dataset`` at ``indices``, in that order."""

    def __init__(self, dataset: Dataset, indices: Sequence[int]) -> None:
        self.dataset, self.indices = dataset, indices

    def __getitem__(self, index: int) -> Any:
        return self.dataset[self.indices[index]]

    def __len__(self) -> int:
        return len(self.indices)


class ConcatDataset(Dataset):
    """Several map-style datasets one after another: index ``i`` finds its dataset by bisection."""

    def __init__(self, datasets: Iterable[Dataset]) -> None:
        self.datasets = list(datasets)
        if not self.datasets:
            raise ValueError("ConcatDataset: datasets should not be an empty iterable")
        for d in self.datasets:
            if isinstance(d, IterableDataset):
                raise TypeError("ConcatDataset: does not support IterableDataset (use ChainDataset)")
        self.cumulative_sizes = list(itertools.accumulate(len(d) for d in self.datasets))

    def __len__(self) -> int:
        return self.cumulative_sizes[-1]

    def __getitem__(self, index: int) -> Any:
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"ConcatDataset: index {index} is out of range for length {n}")
        index %= n
        which = bisect.bisect_right(self.cumulative_sizes, index)
        start = self.cumulative_sizes[which - 1] if which else 0
        return self.datasets[which][index - start]


class ChainDataset(IterableDataset):
    """Several iterable datasets chained: their streams one after another."""

    def __init__(self, datasets: Iterable[Dataset]) -> None:
        self.datasets = list(datasets)

    def __iter__(self) -> Iterator:
        for d in self.datasets:
            yield from d

    def __len__(self) -> int:
        return sum(len(d) for d in self.datasets)


def random_split(dataset: Dataset, lengths: Sequence[int | float],
                 generator: Any = None) -> list[Subset]:
    """Split ``dataset`` into non-overlapping random ``Subset``s of the given lengths.

    ``lengths`` may be fractions summing to 1 (``[0.8, 0.2]``); the samples that rounding down
    leaves over go one each to the first subsets, as in torch. ``generator`` is a numpy Generator
    or an int seed (default: minigrad's global generator, seeded by ``manual_seed``).
    """
    n = len(dataset)
    if math.isclose(sum(lengths), 1) and sum(lengths) <= 1 and all(0 <= f <= 1 for f in lengths):
        sizes = [int(math.floor(n * f)) for f in lengths]
        for i in range(n - sum(sizes)):
            sizes[i % len(sizes)] += 1
        lengths = sizes
    if any(int(k) != k or k < 0 for k in lengths) or sum(lengths) != n:
        raise ValueError(f"random_split: lengths {list(lengths)} must be non-negative integers "
                         f"summing to the dataset's length {n}, or fractions summing to 1")
    perm = as_generator(generator).permutation(n).tolist()
    ends = list(itertools.accumulate(int(k) for k in lengths))
    return [Subset(dataset, perm[end - int(k):end]) for k, end in zip(lengths, ends)]
