"""Storage, strides and memory formats (minigrad.ops.layout): strides, offsets, contiguity and
``as_strided`` against PyTorch, views found by ``data_ptr``, channels_last through conv, batch
norm and pooling, and the errors. The op table checks as_strided's gradients row by row."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minigrad as mg
import minigrad.nn as nn
from minigrad.autograd.gradcheck import gradcheck
from minigrad.errors import ArgumentError, ShapeError


def arange(*shape):
    return mg.tensor(np.arange(int(np.prod(shape)), dtype="float64").reshape(shape))


VIEWS = {  # minigrad and torch spell these the same way
    "contiguous": lambda x: x,
    "transpose": lambda x: x.transpose(0, 2),
    "permute": lambda x: x.permute(2, 0, 1),
    "T_of_2d": lambda x: x[0].T,
    "expand": lambda x: x[:, :1].expand(2, 5, 4),
    "expand_new_dim": lambda x: x[0].expand(3, 3, 4),
    "slice": lambda x: x[:, 1:, 2:],
    "step_slice": lambda x: x[:, ::2, 1::3],
    "int_index": lambda x: x[1, :, 2],
    "reshape_view": lambda x: x.reshape(6, 4),
    "reshape_copy": lambda x: x.transpose(0, 1).reshape(6, 4),
    "view": lambda x: x.view(2, 12),
    "unsqueeze": lambda x: x.unsqueeze(1),
    "narrow": lambda x: x.narrow(2, 1, 2),
    "squeeze": lambda x: x[:, :1].squeeze(1),
}


@pytest.mark.parametrize("name", list(VIEWS))
def test_strides_offsets_and_contiguity_match_torch(name):
    torch = pytest.importorskip("torch")
    x, tx = arange(2, 3, 4), torch.arange(24, dtype=torch.float64).reshape(2, 3, 4)
    y, ty = VIEWS[name](x), VIEWS[name](tx)
    assert y.stride() == ty.stride()
    assert y.storage_offset() == ty.storage_offset()
    assert y.is_contiguous() == ty.is_contiguous()
    shared = y.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert shared == (ty.untyped_storage().data_ptr() == tx.untyped_storage().data_ptr())
    if shared:
        assert y.data_ptr() - x.data_ptr() == ty.data_ptr() - tx.data_ptr()


def test_row_major_by_default_as_in_torch_and_numpy():
    assert mg.empty(2, 3).stride() == (3, 1)
    assert mg.empty(2, 3).stride(-2) == 3
    assert mg.zeros(4, 5, 6).stride() == (30, 6, 1)


def test_views_share_storage_and_copies_do_not():
    x = arange(3, 4)
    same = x.untyped_storage().data_ptr()
    for v in (x.T, x[1:], x.reshape(12), x.expand(2, 3, 4), x.as_strided((2,), (5,))):
        assert v.untyped_storage().data_ptr() == same
    assert x.T.reshape(12).untyped_storage().data_ptr() != same  # a transposed tensor must be copied
    assert x.T.contiguous().untyped_storage().data_ptr() != same
    assert x.contiguous() is x
    assert x.untyped_storage().nbytes() == 96


def test_storage_of_finds_the_array_that_owns_the_memory(tmp_path):
    from numpy.lib.stride_tricks import as_strided

    from minigrad.backend.allocator import CachingAllocator
    from minigrad.backend import storage_of

    owner = np.zeros((4, 6))
    windows = as_strided(owner, (3, 2, 2), (48, 8, 48))  # a wrapper object sits between it and owner
    for view in (owner, owner.T[1:], owner[1:].reshape(-1)[::2], windows, windows[1:].T):
        assert storage_of(view) is owner
    mapped = np.memmap(tmp_path / "m", "float32", "w+", shape=(8,))  # its base is the file's mmap
    assert storage_of(np.asarray(mapped)[2:]) is mapped
    block = CachingAllocator().empty((4, 4), "float32")  # a view of a frombuffer array over a pool block
    assert storage_of(block[1:]) is block.base and block.base.nbytes == 64


def test_channels_last_strides_and_formats_match_torch():
    torch = pytest.importorskip("torch")
    x, tx = mg.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 5)
    y, ty = x.to(memory_format=mg.channels_last), tx.to(memory_format=torch.channels_last)
    assert y.stride() == ty.stride() == (60, 1, 15, 3)
    for fmt, tfmt in ((mg.contiguous_format, torch.contiguous_format), (mg.channels_last, torch.channels_last)):
        for a, ta in ((x, tx), (y, ty), (x[:, :1], tx[:, :1]), (y[:, :, 1:], ty[:, :, 1:])):
            assert a.is_contiguous(memory_format=fmt) == ta.is_contiguous(memory_format=tfmt)
    assert np.array_equal(y.numpy(), x.numpy())
    assert y.contiguous().stride() == (60, 20, 5, 1)
    assert y.contiguous(memory_format=mg.channels_last) is y


def test_channels_last_gradient_is_identity():
    x = mg.randn(1, 2, 3, 3, dtype=mg.float64, requires_grad=True)
    assert gradcheck(lambda a: a.contiguous(memory_format=mg.channels_last) * a, [x])


def test_conv_bn_pool_on_channels_last_match_torch_and_keep_the_format():
    torch = pytest.importorskip("torch")
    mg.manual_seed(0)
    conv, bn, pool = nn.Conv2d(3, 4, 3, padding=1).double(), nn.BatchNorm2d(4).double(), nn.MaxPool2d(2)
    tconv, tbn = torch.nn.Conv2d(3, 4, 3, padding=1).double(), torch.nn.BatchNorm2d(4).double()
    with torch.no_grad():
        tconv.weight.copy_(torch.from_numpy(conv.weight.array))
        tconv.bias.copy_(torch.from_numpy(conv.bias.array))
    data = np.random.default_rng(0).standard_normal((2, 3, 6, 6))
    x = mg.tensor(data).to(memory_format=mg.channels_last).requires_grad_()
    tx = torch.from_numpy(data).to(memory_format=torch.channels_last).requires_grad_()
    h, th = conv(x), tconv(tx)
    for y, ty in ((h, th), (bn(h), tbn(th)), (pool(bn(h)), torch.nn.functional.max_pool2d(tbn(th), 2)),
                  (mg.nn.functional.avg_pool2d(h, 2), torch.nn.functional.avg_pool2d(th, 2))):
        np.testing.assert_allclose(y.detach().numpy(), ty.detach().numpy(), atol=1e-12)
        assert y.is_contiguous(memory_format=mg.channels_last)
        assert ty.is_contiguous(memory_format=torch.channels_last)
    (pool(bn(h)) ** 2).sum().backward()
    (torch.nn.functional.max_pool2d(tbn(th), 2) ** 2).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), atol=1e-10)
    np.testing.assert_allclose(conv.weight.grad.numpy(), tconv.weight.grad.numpy(), atol=1e-10)


def test_module_to_channels_last_converts_its_4d_parameters_only():
    torch = pytest.importorskip("torch")
    conv = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8)).to(memory_format=mg.channels_last)
    tconv = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8)).to(memory_format=torch.channels_last)
    for (name, p), tp in zip(conv.named_parameters(), tconv.parameters()):
        assert p.stride() == tp.stride(), name
        assert p.is_leaf and p.requires_grad


# -- as_strided ----------------------------------------------------------------------------------------
def test_as_strided_is_a_view_of_the_storage_not_of_the_tensor():
    torch = pytest.importorskip("torch")
    x, tx = arange(3, 4), torch.arange(12.0, dtype=torch.float64).reshape(3, 4)
    for args in (((2, 2), (1, 4)), ((2, 2), (1, 4), 5), ((3,), (0,)), ((0, 2), (3, 1), 11)):
        y, ty = x[1:].as_strided(*args), tx[1:].as_strided(*args)
        assert np.array_equal(y.numpy(), ty.numpy()) and y.stride() == ty.stride()
        assert y.storage_offset() == ty.storage_offset()
    y = x.as_strided((2,), (1,), 3)
    y.array[0] = -1.0  # writes through to x's storage
    assert x[0, 3].item() == -1.0


def test_as_strided_gradient_accumulates_where_views_overlap():
    torch = pytest.importorskip("torch")
    x = mg.tensor(np.arange(6.0), requires_grad=True)
    tx = torch.arange(6.0, dtype=torch.float64, requires_grad=True)
    w = np.random.default_rng(1).standard_normal((3, 3))
    (x.as_strided((3, 3), (1, 1)) * mg.tensor(w)).sum().backward()
    (tx.as_strided((3, 3), (1, 1)) * torch.from_numpy(w)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy())


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_as_strided_reads_the_positions_its_geometry_names(data):
    ndim = data.draw(st.integers(1, 3))
    size = data.draw(st.lists(st.integers(0, 3), min_size=ndim, max_size=ndim))
    stride = data.draw(st.lists(st.integers(0, 4), min_size=ndim, max_size=ndim))
    offset = data.draw(st.integers(0, 3))
    x = mg.tensor(np.arange(offset + sum((n - 1) * s for n, s in zip(size, stride) if n) + 1.0))
    y = x.as_strided(size, stride, offset)
    want = np.full(size, float(offset)) + sum(
        (np.arange(n) * s).reshape([1] * d + [n] + [1] * (ndim - d - 1)) for d, (n, s) in enumerate(zip(size, stride)))
    assert np.array_equal(y.numpy(), want)
    xg = mg.tensor(np.random.default_rng(0).standard_normal(x.shape), requires_grad=True)
    assert gradcheck(lambda a: a.as_strided(size, stride, offset), [xg])


def test_as_strided_errors_name_the_geometry():
    x = arange(2, 3)
    with pytest.raises(ShapeError, match="storage of 6 elements"):
        x.as_strided((2, 3), (3, 2))
    with pytest.raises(ShapeError, match=">= 0"):
        x.as_strided((2,), (-1,), 2)
    with pytest.raises(ShapeError, match="same length"):
        x.as_strided((2, 3), (1,))
    with pytest.raises(ShapeError, match="4-D"):
        x.contiguous(memory_format=mg.channels_last)
    with pytest.raises(ArgumentError, match="memory_format"):
        x.is_contiguous(memory_format=mg.preserve_format)
