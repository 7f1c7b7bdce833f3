"""Datasets, samplers, random_split and default_collate (torch.utils.data semantics)."""

from collections import namedtuple

import numpy as np
import pytest

import minigrad
from minigrad.data import (
    BatchSampler, ChainDataset, ConcatDataset, Dataset, IterableDataset, RandomSampler,
    SequentialSampler, Subset, SubsetRandomSampler, TensorDataset, WeightedRandomSampler,
    default_collate, default_convert, random_split,
)
from minigrad.errors import DeviceError, DTypeError, ShapeError


class Squares(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return i * i


class Stream(IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self):
        return self.n


# -- datasets ---------------------------------------------------------------------------------
def test_tensor_dataset_indexes_every_tensor():
    x = minigrad.arange(12).reshape(6, 2)
    y = np.arange(6) * 10
    ds = TensorDataset(x, y)
    assert len(ds) == 6
    a, b = ds[4]
    assert isinstance(a, minigrad.Tensor) and isinstance(b, minigrad.Tensor)
    assert a.tolist() == [8, 9] and b.item() == 40
    assert ds[-1][1].item() == 50


def test_tensor_dataset_size_mismatch_names_shapes():
    with pytest.raises(ShapeError, match=r"\(6, 2\).*\(5,\)"):
        TensorDataset(np.zeros((6, 2)), np.zeros(5))


def test_subset_concat_and_add():
    a, b = Squares(3), Squares(4)
    sub = Subset(b, [3, 1])
    assert [sub[i] for i in range(len(sub))] == [9, 1]
    cat = a + b
    assert isinstance(cat, ConcatDataset) and len(cat) == 7
    assert [cat[i] for i in range(7)] == [0, 1, 4, 0, 1, 4, 9]
    assert cat[-1] == 9 and cat.cumulative_sizes == [3, 7]
    with pytest.raises(IndexError):
        cat[7]
    with pytest.raises(TypeError):
        ConcatDataset([a, Stream(2)])


def test_chain_dataset():
    chained = Stream(2) + Stream(3)
    assert isinstance(chained, ChainDataset)
    assert list(chained) == [0, 1, 0, 1, 2] and len(chained) == 5


def test_random_split_lengths_fractions_and_seed():
    ds = Squares(10)
    parts = random_split(ds, [3, 7], generator=0)
    assert [len(p) for p in parts] == [3, 7]
    assert sorted(parts[0].indices + parts[1].indices) == list(range(10))
    again = random_split(ds, [3, 7], generator=np.random.default_rng(0))
    assert again[0].indices == parts[0].indices
    # torch: floor each fraction, then hand the remainder out round-robin
    assert [len(p) for p in random_split(Squares(11), [0.5, 0.3, 0.2], generator=1)] == [6, 3, 2]
    with pytest.raises(ValueError, match="summing"):
        random_split(ds, [3, 3])


# -- samplers ---------------------------------------------------------------------------------
def test_sequential_and_batch_sampler():
    s = SequentialSampler(range(7))
    assert list(s) == list(range(7)) and len(s) == 7
    b = BatchSampler(s, 3, drop_last=False)
    assert list(b) == [[0, 1, 2], [3, 4, 5], [6]] and len(b) == 3
    b = BatchSampler(s, 3, drop_last=True)
    assert list(b) == [[0, 1, 2], [3, 4, 5]] and len(b) == 2
    with pytest.raises(ValueError, match="batch_size"):
        BatchSampler(s, 0, False)


def test_random_sampler_is_a_seeded_permutation_that_changes_per_epoch():
    s = RandomSampler(range(20), generator=3)
    first, second = list(s), list(s)
    assert sorted(first) == list(range(20)) and first != second
    t = RandomSampler(range(20), generator=3)
    assert list(t) == first and list(t) == second  # the sequence of epochs is reproducible


def test_samplers_draw_on_the_host_and_refuse_a_generator_of_another_device():
    with pytest.raises(DeviceError, match="generator is on meta, but the values are drawn on cpu"):
        list(RandomSampler(range(5), generator=minigrad.Generator("meta")))


def test_random_sampler_follows_manual_seed():
    minigrad.manual_seed(5)
    a = list(RandomSampler(range(10)))
    minigrad.manual_seed(5)
    assert list(RandomSampler(range(10))) == a


def test_random_sampler_num_samples_and_replacement():
    s = RandomSampler(range(4), num_samples=10, generator=0)
    out = list(s)
    assert len(out) == 10 == len(s) and sorted(out[:4]) == [0, 1, 2, 3]
    r = list(RandomSampler(range(3), replacement=True, num_samples=50, generator=0))
    assert len(r) == 50 and set(r) <= {0, 1, 2}
    with pytest.raises(ValueError):
        RandomSampler(range(3), num_samples=0)


def test_subset_random_and_weighted_samplers():
    s = SubsetRandomSampler([10, 20, 30], generator=0)
    assert sorted(s) == [10, 20, 30] and len(s) == 3
    w = WeightedRandomSampler([0.0, 1.0, 0.0], num_samples=5, generator=0)
    assert list(w) == [1] * 5
    with pytest.raises(ValueError):
        WeightedRandomSampler([0.0, 1.0], num_samples=2, replacement=False)


# -- collate ----------------------------------------------------------------------------------
def test_collate_numbers_follow_torch_dtypes():
    assert default_collate([1.5, 2.5]).dtype == minigrad.float64  # as torch: python floats -> double
    assert default_collate([1, 2]).dtype == minigrad.int64
    assert default_collate([True, False]).dtype == minigrad.bool
    assert default_collate([np.float32(1), np.float32(2)]).dtype == minigrad.float32
    assert default_collate([np.zeros(2), np.ones(2)]).dtype == minigrad.float64
    assert default_collate(["a", "b"]) == ["a", "b"]


@pytest.mark.parametrize("batch, values, dtype", [
    ([1, 2.5], [1.0, 2.5], "float32"),  # not [1, 2]: a float anywhere makes the batch float
    ([2.5, 1], [2.5, 1.0], "float64"),  # a float first: double, as in torch
    ([True, 2], [1, 2], "int64"), ([1, True], [1, 1], "int64"), ([True, 2.5], [1.0, 2.5], "float32"),
    ([1, 1e30], [1.0, 1e30], "float32"),
])
def test_collate_mixed_numbers_keep_their_values(batch, values, dtype):
    for wrap in (lambda v: v, lambda v: (v, "id"), lambda v: {"x": v}):
        out = default_collate([wrap(v) for v in batch])
        out = out["x"] if isinstance(out, dict) else out[0] if isinstance(out, list) else out
        assert out.dtype.name == dtype
        np.testing.assert_array_equal(out.numpy(), np.asarray(values, dtype=dtype))


def test_collate_refuses_what_it_cannot_keep():
    with pytest.raises(DTypeError, match="default_collate: an integer .* does not fit int64"):
        default_collate([1, 2**70])
    with pytest.raises(TypeError, match="default_collate: entry 1 is a str but entry 0 is a int"):
        default_collate([1, "a"])
    with pytest.raises(TypeError, match="entry 1 is a float32 but entry 0 is a int64"):
        default_collate([np.int64(1), np.float32(2.5)])


def test_collate_tuples_dicts_namedtuples():
    batch = [(np.full((2,), i, np.float32), i) for i in range(3)]
    x, y = default_collate(batch)  # a list of batches, as torch
    assert x.shape == (3, 2) and y.tolist() == [0, 1, 2]
    d = default_collate([{"x": np.zeros(2), "id": "a"}, {"x": np.ones(2), "id": "b"}])
    assert d["x"].shape == (2, 2) and d["id"] == ["a", "b"]
    Point = namedtuple("Point", "x y")
    p = default_collate([Point(1, 2.0), Point(3, 4.0)])
    assert isinstance(p, Point) and p.x.tolist() == [1, 3] and p.y.dtype == minigrad.float64


def test_collate_tensors_stacks_detached():
    ts = [minigrad.ones(2, requires_grad=True) * i for i in range(3)]
    out = default_collate(ts)
    assert out.shape == (3, 2) and out.grad_fn is None and not out.requires_grad


def test_collate_errors_name_the_problem():
    with pytest.raises(ShapeError, match=r"\(2,\) at entry 0 and \(3,\) at entry 1"):
        default_collate([np.zeros(2), np.zeros(3)])
    with pytest.raises(ShapeError, match="same length"):
        default_collate([(1, 2), (1,)])
    with pytest.raises(TypeError, match="found object"):
        default_collate([object(), object()])


def test_default_convert():
    out = default_convert({"a": np.arange(3), "b": [np.float32(1)], "c": "s"})
    assert isinstance(out["a"], minigrad.Tensor) and out["a"].dtype == minigrad.int64
    assert out["b"][0].dtype == minigrad.float32 and out["c"] == "s"


def test_collate_matches_torch():
    pytest.importorskip("torch")
    from torch.utils.data import default_collate as torch_collate

    batches = [
        [1.5, 2.0], [1, 2], [True, False], [np.float32(1), np.float32(2)],
        [np.zeros((2, 3)), np.ones((2, 3))], [np.zeros(2, np.uint8), np.ones(2, np.uint8)],
    ]
    for batch in batches:
        mine, theirs = default_collate(batch), torch_collate(batch)
        assert str(mine.dtype) == str(theirs.dtype).replace("torch.", "")
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())
    numbers = [0, -3, 2**40, 2**63 - 1, 2.5, 1e30, 1e300, float("nan"), True, False]
    for a in numbers:  # every pair of Python numbers, bare, in a tuple and in a dict
        for b in numbers:
            for batch in ([a, b], [(a, "x"), (b, "y")], [{"k": a}, {"k": b}]):
                mine, theirs = default_collate(batch), torch_collate(batch)
                mine = mine["k"] if isinstance(mine, dict) else mine[0] if isinstance(mine, list) else mine
                theirs = theirs["k"] if isinstance(theirs, dict) else theirs[0] if isinstance(theirs, list) else theirs
                assert str(mine.dtype) == str(theirs.dtype).replace("torch.", ""), batch
                np.testing.assert_array_equal(mine.numpy(), theirs.numpy(), err_msg=str(batch))
    mine, theirs = default_collate([(1, 2.0), (3, 4.0)]), torch_collate([(1, 2.0), (3, 4.0)])
    assert type(mine) is type(theirs) is list
    assert [m.tolist() for m in mine] == [t.tolist() for t in theirs]
