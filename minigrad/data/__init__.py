"""minigrad.data: datasets, samplers, the DataLoader (with worker processes), transforms, the
tf.data-style Pipeline and the DevicePrefetcher that overlaps host-to-GPU copies with compute.
Names follow ``torch.utils.data``; chapter 01 builds input pipelines here.

``from minigrad.data import DataLoader, TensorDataset``; transforms live in
``minigrad.data.transforms``; the shipped digits and the synthetic problems in
``minigrad.data.datasets`` (also importable from here).
"""

from minigrad.data import transforms  # noqa: F401
from minigrad.data.dataloader import DataLoader, default_collate, default_convert
from minigrad.data.dataset import (
    ChainDataset, ConcatDataset, Dataset, IterableDataset, Subset, TensorDataset, random_split,
)
from minigrad.data.datasets import (
    MNIST, Digits, IDXError, load_digits, make_blobs, make_moons, make_regression, make_spirals, read_idx,
)
from minigrad.data.input_pipeline import AUTOTUNE, Pipeline
from minigrad.data.prefetch import DevicePrefetcher
from minigrad.data.sampler import (
    BatchSampler, RandomSampler, Sampler, SequentialSampler, SubsetRandomSampler, WeightedRandomSampler,
)
from minigrad.data.workers import WorkerInfo, get_worker_info

__all__ = [
    "Dataset", "IterableDataset", "TensorDataset", "Subset", "ConcatDataset", "ChainDataset",
    "random_split", "Sampler", "SequentialSampler", "RandomSampler", "SubsetRandomSampler",
    "WeightedRandomSampler", "BatchSampler", "DataLoader", "default_collate", "default_convert",
    "get_worker_info", "WorkerInfo", "Pipeline", "AUTOTUNE", "DevicePrefetcher", "transforms", "load_digits", "Digits",
    "make_spirals", "make_moons", "make_blobs", "make_regression", "MNIST", "IDXError", "read_idx",
]
