"""Shipped digits, synthetic generators, IDX parsing and MNIST (damaged files give clear errors)."""

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest

import minigrad
from minigrad.data import (
    MNIST, DataLoader, Digits, IDXError, load_digits, make_blobs, make_moons, make_regression,
    make_spirals, read_idx,
)
from minigrad.data import transforms as T

SHARED_MNIST = Path(__file__).resolve().parents[3] / "shared" / "data" / "mnist"


# -- digits -----------------------------------------------------------------------------------
def test_load_digits():
    x, y = load_digits()
    assert x.shape == (1797, 1, 8, 8) and x.dtype == np.float32
    assert y.shape == (1797,) and y.dtype == np.int64
    assert x.min() == 0.0 and x.max() == 1.0 and set(y.tolist()) == set(range(10))
    assert np.bincount(y).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
    assert np.allclose(x * 16, np.round(x * 16))  # the 0..16 counts, scaled


def test_digits_split_is_fixed_disjoint_and_stratified():
    train, test = Digits(train=True), Digits(train=False)
    assert len(train) == 1437 and len(test) == 360
    x, _ = load_digits()
    rows = {a.tobytes() for a in x}
    assert len({a.tobytes() for a in train.data} | {a.tobytes() for a in test.data}) == len(rows)
    assert np.array_equal(Digits(train=False).targets, test.targets)
    counts = np.bincount(test.targets)
    assert counts.min() >= 34 and counts.max() <= 38
    other = Digits(train=False, split_seed=1)
    assert not np.array_equal(other.data, test.data)
    image, label = test[0]
    assert image.shape == (1, 8, 8) and isinstance(label, int)


def test_digits_transforms_and_loader():
    ds = Digits(train=False, transform=T.Normalize([0.5], [0.5]), target_transform=lambda t: t % 2)
    x, y = next(iter(DataLoader(ds, batch_size=32)))
    assert x.shape == (32, 1, 8, 8) and x.dtype == minigrad.float32 and y.dtype == minigrad.int64
    assert x.numpy().min() >= -1 and set(y.tolist()) <= {0, 1}


# -- synthetic --------------------------------------------------------------------------------
@pytest.mark.parametrize("make, classes", [
    (lambda seed: make_spirals(90, 3, seed=seed), 3),
    (lambda seed: make_moons(90, seed=seed), 2),
    (lambda seed: make_blobs(90, centers=4, n_features=3, seed=seed), 4),
])
def test_classification_generators(make, classes):
    x, y = make(0)
    assert x.dtype == np.float32 and y.dtype == np.int64 and len(x) == len(y) == 90
    assert sorted(set(y.tolist())) == list(range(classes))
    x2, y2 = make(0)
    assert np.array_equal(x, x2) and np.array_equal(y, y2)
    assert not np.array_equal(make(1)[0], x)


def test_generators_follow_manual_seed_and_shapes():
    minigrad.manual_seed(4)
    a = make_moons(10)[0]
    minigrad.manual_seed(4)
    assert np.array_equal(make_moons(10)[0], a)
    x, y = make_spirals(10, 3, seed=0, shuffle=False)
    assert y.tolist() == [0] * 4 + [1] * 3 + [2] * 3
    centers = np.array([[0.0, 0.0], [100.0, 100.0]])
    x, y = make_blobs(20, centers=centers, cluster_std=0.1, seed=0)
    assert np.all(np.abs(x - centers[y]) < 1)


def test_make_regression():
    x, y, w = make_regression(200, n_features=3, noise=0.0, bias=2.0, coef=True, seed=0)
    assert x.shape == (200, 3) and y.shape == (200,) and w.shape == (3,)
    np.testing.assert_allclose(y, x @ w + 2.0, rtol=1e-4, atol=1e-4)
    assert len(make_regression(5, seed=0)) == 2


# -- IDX and MNIST ----------------------------------------------------------------------------
def _idx_bytes(array: np.ndarray, type_code: int = 0x08) -> bytes:
    header = bytes([0, 0, type_code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(array.dtype.newbyteorder(">")).tobytes()


def _write_mnist(folder: Path, n: int = 5, prefix: str = "t10k", compress: bool = True):
    images = np.arange(n * 28 * 28, dtype=np.uint8).reshape(n, 28, 28)
    labels = (np.arange(n) % 10).astype(np.uint8)
    for name, array, code in ((f"{prefix}-images-idx3-ubyte", images, 0x08),
                              (f"{prefix}-labels-idx1-ubyte", labels, 0x08)):
        data = _idx_bytes(array, code)
        if compress:
            (folder / (name + ".gz")).write_bytes(gzip.compress(data))
        else:
            (folder / name).write_bytes(data)
    return images, labels


@pytest.mark.parametrize("dtype, code", [(np.uint8, 0x08), (np.int8, 0x09), (np.int16, 0x0B),
                                         (np.int32, 0x0C), (np.float32, 0x0D), (np.float64, 0x0E)])
def test_read_idx_round_trip(tmp_path, dtype, code):
    array = (np.arange(24) - 5).astype(dtype).reshape(2, 3, 4)
    (tmp_path / "a.idx").write_bytes(_idx_bytes(array, code))
    (tmp_path / "a.idx.gz").write_bytes(gzip.compress(_idx_bytes(array, code)))
    for name in ("a.idx", "a.idx.gz"):
        out = read_idx(tmp_path / name)
        assert out.dtype == dtype and out.dtype.isnative and np.array_equal(out, array)


@pytest.mark.parametrize("compress", [True, False])
def test_mnist_reads_idx_files(tmp_path, compress):
    images, labels = _write_mnist(tmp_path, compress=compress)
    ds = MNIST(tmp_path, transform=T.ToTensor())
    assert len(ds) == 5 and ds.data.shape == (5, 28, 28) and ds.targets.dtype == np.int64
    image, label = ds[3]
    assert image.shape == (1, 28, 28) and image.dtype == minigrad.float32 and label == 3
    np.testing.assert_allclose(image.numpy()[0], images[3] / 255, rtol=1e-6)
    with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte.*nothing is downloaded"):
        MNIST(tmp_path, train=True)


def test_mnist_torchvision_layout(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    _write_mnist(raw, prefix="train")
    assert len(MNIST(tmp_path, train=True)) == 5


def _damage(path: Path, how: str):
    data = gzip.decompress(path.read_bytes())
    if how == "magic":
        data = b"\x00\x01" + data[2:]
    elif how == "type":
        data = data[:2] + b"\x07" + data[3:]
    elif how == "truncated":
        data = data[:-10]
    elif how == "trailing":
        data = data + b"\x00\x00"
    elif how == "header":
        data = data[:9]
    path.write_bytes(gzip.compress(data))


@pytest.mark.parametrize("how, message", [
    ("magic", "bad magic number 0x0001"), ("type", "bad magic number 0x00000703"),
    ("truncated", r"truncated: the header announces shape \(5, 28, 28\) of uint8 \(3920 bytes"),
    ("trailing", "has trailing bytes"), ("header", "truncated header"),
])
def test_damaged_idx_files_name_the_file_and_the_problem(tmp_path, how, message):
    _write_mnist(tmp_path)
    path = tmp_path / "t10k-images-idx3-ubyte.gz"
    _damage(path, how)
    with pytest.raises(IDXError, match=message) as info:
        MNIST(tmp_path)
    assert str(path) in str(info.value)


def test_damaged_gzip_streams(tmp_path):
    _write_mnist(tmp_path)
    path = tmp_path / "t10k-labels-idx1-ubyte.gz"
    full = path.read_bytes()
    path.write_bytes(full[: len(full) // 2])
    with pytest.raises(IDXError, match="damaged or truncated gzip") as info:
        MNIST(tmp_path)
    assert str(path) in str(info.value)
    path.write_bytes(b"not gzip at all")
    with pytest.raises(IDXError, match="damaged or truncated gzip"):
        read_idx(path)
    with pytest.raises(FileNotFoundError):
        read_idx(tmp_path / "missing.gz")


def test_mnist_consistency_checks(tmp_path):
    _write_mnist(tmp_path)
    labels = tmp_path / "t10k-labels-idx1-ubyte.gz"
    labels.write_bytes(gzip.compress(_idx_bytes(np.arange(4, dtype=np.uint8))))
    with pytest.raises(IDXError, match="5 images but .* 4 labels"):
        MNIST(tmp_path)
    labels.write_bytes(gzip.compress(_idx_bytes(np.array([0, 1, 2, 3, 12], np.uint8))))
    with pytest.raises(IDXError, match="found 12"):
        MNIST(tmp_path)
    labels.write_bytes(gzip.compress(_idx_bytes(np.zeros((5, 2), np.uint8))))
    with pytest.raises(IDXError, match=r"shape \(N,\)"):
        MNIST(tmp_path)


@pytest.mark.skipif(not SHARED_MNIST.is_dir(), reason="the shared MNIST test split is not present")
def test_real_mnist_test_split():
    ds = MNIST(SHARED_MNIST)
    assert len(ds) == 10000 and ds.data.shape == (10000, 28, 28) and ds.data.dtype == np.uint8
    assert np.bincount(ds.targets).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    image, label = ds[0]
    assert label == 7 and image.max() == 255
