"""``DistributedSampler``: each rank reads its own share of a dataset, as ``torch.utils.data``.

Every rank draws the same permutation (seeded by ``seed + epoch``, so ``set_epoch`` changes it
each epoch) and keeps every N-th index starting at its rank. When the dataset does not divide
evenly, the list is padded with its first indices so that every rank gets as many samples (and
takes as many steps: a rank with one step fewer would wait forever in DDP's all-reduce), or, with
``drop_last``, cut to a multiple of N. Chapter 04 feeds DDP with it.
"""

from __future__ import annotations

import math
from typing import Iterator, Sized

import numpy

from minigrad.data.sampler import Sampler
from minigrad.distributed import process_group

__all__ = ["DistributedSampler"]


class DistributedSampler(Sampler):
    """Indices ``rank, rank + N, rank + 2N, ...`` of a (shuffled, padded) index list.

    ``num_replicas`` and ``rank`` default to the process group's world size and rank.
    Use it as ``DataLoader(dataset, batch_size=B // N, sampler=sampler)`` and call
    ``sampler.set_epoch(epoch)`` before each epoch when shuffling.
    """

    def __init__(self, dataset: Sized, num_replicas: int | None = None, rank: int | None = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False) -> None:
        if num_replicas is None:
            num_replicas = process_group.get_world_size()
        if rank is None:
            rank = process_group.get_rank()
        if not isinstance(num_replicas, int) or num_replicas < 1:
            raise ValueError(f"DistributedSampler: num_replicas should be a positive integer, got {num_replicas!r}")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"DistributedSampler: invalid rank {rank}, rank should be in the interval "
                             f"[0, {num_replicas - 1}]")
        self.dataset, self.num_replicas, self.rank = dataset, num_replicas, rank
        self.shuffle, self.seed, self.drop_last, self.epoch = shuffle, seed, drop_last, 0
        n = len(dataset)
        if drop_last and n % num_replicas:
            self.num_samples = math.ceil((n - num_replicas) / num_replicas)
        else:
            self.num_samples = math.ceil(n / num_replicas)
        self.total_size = self.num_samples * num_replicas

    def __iter__(self) -> Iterator[int]:
        """This rank's indices: ``self.num_samples`` of them, disjoint from every other rank's.

        Start from ``range(len(dataset))``, permuted by ``numpy.random.default_rng(self.seed +
        self.epoch)`` when shuffling (so every rank draws the same permutation and
        ``set_epoch`` changes it). Without ``drop_last``, pad the list by repeating its start
        until it is ``self.total_size`` long; with it, cut it to that length. Then take every
        ``num_replicas``-th index starting at ``rank``. Together the ranks cover every index
        (each once, except the padding).
        """
        ### BEGIN SOLUTION chapter 04: DistributedSampler
        n = len(self.dataset)
        if self.shuffle:
            indices = numpy.random.default_rng(self.seed + self.epoch).permutation(n).tolist()
        else:
            indices = list(range(n))
        if not self.drop_last:
            padding = self.total_size - n
            indices += (indices * math.ceil(padding / max(n, 1)))[:padding]
        else:
            indices = indices[:self.total_size]
        return iter(indices[self.rank:self.total_size:self.num_replicas])
        ### END SOLUTION

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Shuffle differently in epoch ``epoch`` (the same way on every rank)."""
        self.epoch = epoch
