"""Datasets to learn on: the UCI handwritten digits shipped inside minigrad, seeded synthetic
problems (spirals, moons, blobs, regression) and a reader for MNIST's IDX files.

The digits (1,797 8x8 images, ``_data/README.md`` gives their origin and licence) are small enough
that a CNN trains on them in seconds on a CPU, so the chapters can train real models. Nothing here
downloads: ``MNIST`` reads IDX files you already have, and checks them, so a damaged file is
reported by name instead of surfacing as a strange shape. Chapter 01 and 02 train on these.
"""

from __future__ import annotations

import gzip
import math
import struct
import zlib
from importlib import resources
from pathlib import Path
from typing import Any, Callable

import numpy

from minigrad.data.dataset import Dataset
from minigrad.data.sampler import as_generator

__all__ = ["load_digits", "Digits", "make_spirals", "make_moons", "make_blobs", "make_regression",
           "IDXError", "read_idx", "MNIST"]


def load_digits() -> tuple[numpy.ndarray, numpy.ndarray]:
    """All 1,797 digits: images float32 of shape (1797, 1, 8, 8) scaled to [0, 1], labels int64."""
    with resources.files("minigrad.data").joinpath("_data", "digits.npz").open("rb") as f:
        with numpy.load(f, allow_pickle=False) as z:
            images, labels = z["images"], z["labels"]
    return (images[:, None] / numpy.float32(16)).astype(numpy.float32), labels.astype(numpy.int64)


class _LabelledImages(Dataset):
    """Images in ``data`` with integer labels in ``targets``; sample ``i`` is ``(image, label)``
    after the optional ``transform`` and ``target_transform``."""

    data: numpy.ndarray
    targets: numpy.ndarray
    transform: Callable | None
    target_transform: Callable | None

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        image, label = self.data[index].copy(), int(self.targets[index])  # transforms may work in place
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            label = self.target_transform(label)
        return image, label


class Digits(_LabelledImages):
    """The shipped digits with a fixed, class-stratified train/test split (1,437 / 360 by default).

    Sample ``i`` is ``(image, label)``: a float32 (1, 8, 8) numpy array in [0, 1] (after
    ``transform``) and an int (after ``target_transform``). ``split_seed`` fixes which images are
    held out; the same seed always gives the same split.
    """

    def __init__(self, train: bool = True, transform: Callable | None = None,
                 target_transform: Callable | None = None, split_seed: int = 0, test_size: int = 360) -> None:
        images, labels = load_digits()
        n = len(labels)
        if not 0 < test_size < n:
            raise ValueError(f"Digits: test_size should be between 1 and {n - 1}, got {test_size}")
        # Stratified: rank each image within its class in a seeded random order, then hold out
        # the test_size images of lowest relative rank, so every class keeps its share.
        perm = numpy.random.default_rng(split_seed).permutation(n)
        by_class = perm[numpy.argsort(labels[perm], kind="stable")]
        counts = numpy.bincount(labels)
        first = numpy.concatenate([[0], numpy.cumsum(counts)[:-1]])
        rank = (numpy.arange(n) - first[labels[by_class]] + 0.5) / counts[labels[by_class]]
        order = by_class[numpy.argsort(rank, kind="stable")]
        keep = numpy.sort(order[test_size:] if train else order[:test_size])
        self.data, self.targets = images[keep], labels[keep]
        self.train, self.transform, self.target_transform = train, transform, target_transform

    def __repr__(self) -> str:
        return f"Digits(split={'train' if self.train else 'test'}, samples={len(self)})"


# ---------------------------------------------------------------------------------------------
# Synthetic problems. ``seed`` is an int or a numpy Generator; None draws from minigrad's global
# generator, so ``minigrad.manual_seed`` makes them reproducible too. X is float32, labels int64.
def _finish(x: numpy.ndarray, y: numpy.ndarray, rng: numpy.random.Generator, shuffle: bool):
    if shuffle:
        p = rng.permutation(len(y))
        x, y = x[p], y[p]
    return x.astype(numpy.float32), y


def _split(n: int, k: int) -> list[int]:
    return [n // k + (i < n % k) for i in range(k)]


def make_spirals(n_samples: int = 300, n_classes: int = 3, noise: float = 0.2, seed: Any = None,
                 shuffle: bool = True) -> tuple[numpy.ndarray, numpy.ndarray]:
    """``n_classes`` interleaved spiral arms in 2-D (not linearly separable: a classic MLP demo)."""
    rng = as_generator(seed)
    xs, ys = [], []
    for k, m in enumerate(_split(n_samples, n_classes)):
        r = numpy.linspace(0.0, 1.0, m)
        t = numpy.linspace(k * 4.0, (k + 1) * 4.0, m) + rng.standard_normal(m) * noise
        xs.append(numpy.stack([r * numpy.sin(t), r * numpy.cos(t)], axis=1))
        ys.append(numpy.full(m, k, dtype=numpy.int64))
    return _finish(numpy.concatenate(xs), numpy.concatenate(ys), rng, shuffle)


def make_moons(n_samples: int = 200, noise: float = 0.1, seed: Any = None,
               shuffle: bool = True) -> tuple[numpy.ndarray, numpy.ndarray]:
    """Two interleaving half circles, label 0 (upper) and 1 (lower), as scikit-learn's."""
    rng = as_generator(seed)
    n_out, n_in = n_samples // 2, n_samples - n_samples // 2
    t_out, t_in = numpy.linspace(0, math.pi, n_out), numpy.linspace(0, math.pi, n_in)
    x = numpy.concatenate([numpy.stack([numpy.cos(t_out), numpy.sin(t_out)], axis=1),
                           numpy.stack([1 - numpy.cos(t_in), 0.5 - numpy.sin(t_in)], axis=1)])
    x = x + rng.standard_normal(x.shape) * noise
    y = numpy.concatenate([numpy.zeros(n_out, numpy.int64), numpy.ones(n_in, numpy.int64)])
    return _finish(x, y, rng, shuffle)


def make_blobs(n_samples: int = 300, centers: int | numpy.ndarray = 3, n_features: int = 2,
               cluster_std: float = 1.0, center_box: tuple[float, float] = (-10.0, 10.0),
               seed: Any = None, shuffle: bool = True) -> tuple[numpy.ndarray, numpy.ndarray]:
    """Gaussian clusters around ``centers`` (a count, placed uniformly in ``center_box``, or an
    array of shape (k, n_features)); label = the cluster."""
    rng = as_generator(seed)
    if isinstance(centers, int):
        centers = rng.uniform(*center_box, size=(centers, n_features))
    centers = numpy.asarray(centers, dtype=numpy.float64)
    if centers.ndim != 2:
        raise ValueError(f"make_blobs: centers should be an int or a 2-D array, got shape {tuple(centers.shape)}")
    sizes = _split(n_samples, len(centers))
    x = numpy.concatenate([c + cluster_std * rng.standard_normal((m, centers.shape[1]))
                           for c, m in zip(centers, sizes)])
    y = numpy.repeat(numpy.arange(len(centers), dtype=numpy.int64), sizes)
    return _finish(x, y, rng, shuffle)


def make_regression(n_samples: int = 100, n_features: int = 1, noise: float = 0.1, bias: float = 0.0,
                    coef: bool = False, seed: Any = None):
    """A linear problem ``y = X @ w + bias + noise * N(0, 1)`` with X and w standard normal.

    Returns ``(X, y)`` float32 with y of shape (n_samples,), or ``(X, y, w)`` when ``coef``.
    """
    rng = as_generator(seed)
    x = rng.standard_normal((n_samples, n_features))
    w = rng.standard_normal(n_features)
    y = (x @ w + bias + noise * rng.standard_normal(n_samples)).astype(numpy.float32)
    out = (x.astype(numpy.float32), y)
    return out + (w.astype(numpy.float32),) if coef else out


# ---------------------------------------------------------------------------------------------
class IDXError(ValueError):
    """An IDX file that is damaged, truncated or not what was expected; the message names it."""


_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str | Path) -> numpy.ndarray:
    """Read an IDX file (optionally gzip-compressed, by its ``.gz`` suffix) into a numpy array.

    The format is a 4-byte magic number ``00 00 TT NN`` (TT the element type, NN the number of
    dimensions), NN big-endian uint32 sizes, then the data. Anything that does not add up raises
    ``IDXError`` naming the file and the problem.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"read_idx: no such file: {path}")
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise IDXError(f"{path}: damaged or truncated gzip data ({e})") from None
    if len(raw) < 4:
        raise IDXError(f"{path}: only {len(raw)} byte(s), too short for an IDX header")
    if raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise IDXError(f"{path}: bad magic number 0x{raw[:4].hex()}: an IDX file starts with 00 00, "
                       f"then a type byte out of {', '.join(f'{t:02x}' for t in _IDX_DTYPES)}")
    ndim, start = raw[3], 4 + 4 * raw[3]
    if len(raw) < start:
        raise IDXError(f"{path}: truncated header: {ndim} dimension sizes need {start} bytes, "
                       f"the file has {len(raw)}")
    shape = struct.unpack(f">{ndim}I", raw[4:start])
    dtype = numpy.dtype(_IDX_DTYPES[raw[2]])
    expected, found = math.prod(shape) * dtype.itemsize, len(raw) - start
    if found != expected:
        what = "truncated" if found < expected else "has trailing bytes"
        raise IDXError(f"{path}: {what}: the header announces shape {shape} of {dtype.name} "
                       f"({expected} bytes of data) but {found} bytes follow it")
    array = numpy.frombuffer(raw, dtype=dtype, offset=start).reshape(shape)
    return array.astype(dtype.newbyteorder("="))


def _find_idx(root: Path, stem: str) -> Path:
    candidates = [d / name for d in (root, root / "MNIST" / "raw") for name in (stem, stem + ".gz")]
    for path in candidates:
        if path.is_file():
            return path
    raise FileNotFoundError(f"MNIST: {stem}[.gz] not found in {root} (looked for "
                            f"{', '.join(str(p) for p in candidates)}); nothing is downloaded, "
                            "point root at a folder holding the IDX files")


class MNIST(_LabelledImages):
    """MNIST from its IDX files in ``root`` (``t10k-*`` for ``train=False``, ``train-*`` for
    ``train=True``, each optionally ``.gz``; ``root/MNIST/raw`` as torchvision lays it out also
    works). Sample ``i`` is ``(image, label)``: a uint8 (28, 28) numpy array (``ToTensor`` makes
    it a (1, 28, 28) float32 Tensor) and an int, after the optional transforms."""

    def __init__(self, root: str | Path, train: bool = False, transform: Callable | None = None,
                 target_transform: Callable | None = None, download: bool = False) -> None:
        # download: torchvision's flag, accepted; minigrad never downloads (missing files raise)
        root, prefix = Path(root), "train" if train else "t10k"
        images_path = _find_idx(root, f"{prefix}-images-idx3-ubyte")
        labels_path = _find_idx(root, f"{prefix}-labels-idx1-ubyte")
        images, labels = read_idx(images_path), read_idx(labels_path)
        if images.dtype != numpy.uint8 or images.ndim != 3:
            raise IDXError(f"{images_path}: expected uint8 images of shape (N, H, W), got "
                           f"{images.dtype} of shape {tuple(images.shape)}")
        if labels.dtype != numpy.uint8 or labels.ndim != 1:
            raise IDXError(f"{labels_path}: expected uint8 labels of shape (N,), got "
                           f"{labels.dtype} of shape {tuple(labels.shape)}")
        if len(images) != len(labels):
            raise IDXError(f"MNIST: {images_path} holds {len(images)} images but {labels_path} "
                           f"holds {len(labels)} labels")
        if len(labels) and labels.max() > 9:
            raise IDXError(f"{labels_path}: labels should be digits 0-9, found {int(labels.max())}")
        self.root, self.train = root, train
        self.transform, self.target_transform = transform, target_transform
        self.data, self.targets = images, labels.astype(numpy.int64)

    def __repr__(self) -> str:
        split = "train" if self.train else "test"
        return f"MNIST(root={str(self.root)!r}, split={split}, samples={len(self)})"
