"""The meta device (minigrad.backend.meta): shapes and dtypes without storage, as torch's; Module.to_empty;
load_state_dict(assign=True)."""

import numpy
import pytest

import minigrad as mg
from minigrad import nn
from minigrad.errors import DeviceError, ShapeError
from minigrad.backend.meta import MetaArray


def test_creation_and_ops_compute_shapes_and_dtypes_only():
    x = mg.randn(4, 3, device="meta")
    w = mg.ones(3, 5, device="meta", dtype=mg.float64)
    y = (x * 2 + 1).exp() @ w
    assert (y.shape, y.dtype, y.device) == ((4, 5), mg.float64, mg.device("meta"))
    assert y.sum(1).shape == (4,) and y.mean().shape == () and y.reshape(-1).shape == (20,)
    assert y.T.shape == (5, 4) and y[1:, None].shape == (3, 1, 5) and mg.cat([y, y]).shape == (8, 5)
    assert (x > 0).dtype == mg.bool_ and mg.arange(5, device="meta").dtype == mg.int64
    assert repr(x) == "tensor(..., device='meta', size=(4, 3))"
    assert x.array.nbytes == 48 and isinstance(x.array, MetaArray)


def test_matches_torch_on_meta():
    torch = pytest.importorskip("torch")
    cases = [((4, 3), (3,)), ((2, 4, 3), (3, 5)), ((3,), (2, 3, 7)), ((5, 1, 3), (4, 1))]
    for sa, sb in cases:
        op = "add" if len(sa) >= 2 and sb == (4, 1) else "matmul"
        a, b = mg.empty(*sa, device="meta"), mg.empty(*sb, device="meta")
        ta, tb = torch.empty(*sa, device="meta"), torch.empty(*sb, device="meta")
        assert getattr(mg, op)(a, b).shape == tuple(getattr(torch, op)(ta, tb).shape)
    lin = nn.Linear(3, 8, device="meta")
    tlin = torch.nn.Linear(3, 8, device="meta")
    assert lin.weight.shape == tuple(tlin.weight.shape) and lin.weight.device.type == tlin.weight.device.type


def test_indexing_by_a_meta_index_tensor_gives_the_shape():
    x = mg.empty(3, 4, device="meta")
    assert x[mg.zeros(2, 5, dtype=mg.int64, device="meta")].shape == (2, 5, 4)  # no values to range-check


def test_shape_errors_and_values_are_refused_clearly():
    a, b = mg.empty(2, 3, device="meta"), mg.empty(4, 5, device="meta")
    with pytest.raises(ShapeError):
        a @ b
    with pytest.raises(ShapeError):
        a + b
    for needs_values in (lambda: a.sum().item(), lambda: a.cpu(), lambda: a.tolist(), lambda: a[a > 0],
                         lambda: bool(a.sum())):
        with pytest.raises(DeviceError, match="meta tensor"):
            needs_values()


def test_a_model_built_on_meta_allocates_nothing_then_gets_storage():
    with mg.device("meta"):
        model = nn.Sequential(nn.Linear(1000, 1000), nn.ReLU(), nn.Linear(1000, 10), nn.LayerNorm(10))
    assert all(p.device.type == "meta" for p in model.parameters())
    assert model(mg.empty(2, 1000, device="meta")).shape == (2, 10)
    model.to_empty(device="cpu")
    assert all(isinstance(p.array, numpy.ndarray) for p in model.parameters())
    assert model(mg.randn(2, 1000)).shape == (2, 10)


def test_load_state_dict_assign_shares_the_state_dicts_memory():
    source = nn.Linear(4, 3)
    with mg.device("meta"):
        target = nn.Linear(4, 3)
    params = list(target.parameters())
    target.load_state_dict(source.state_dict(), assign=True)
    assert list(target.parameters()) == params  # the same Parameter objects, now with storage
    assert target.weight.array is source.weight.array and target.weight.requires_grad
    x = mg.randn(2, 4)
    assert mg.allclose(target(x), source(x))
    with pytest.raises(RuntimeError, match="size mismatch"):
        target.load_state_dict(nn.Linear(5, 3).state_dict(), assign=True)


def test_load_state_dict_assign_as_torch():
    torch = pytest.importorskip("torch")
    src = torch.nn.Linear(4, 3)
    with torch.device("meta"):
        dst = torch.nn.Linear(4, 3)
    dst.load_state_dict(src.state_dict(), assign=True)
    with mg.device("meta"):
        mine = nn.Linear(4, 3)
    mine.load_state_dict({k: mg.tensor(v.detach().numpy()) for k, v in src.state_dict().items()}, assign=True)
    x = numpy.random.default_rng(0).standard_normal((2, 4)).astype(numpy.float32)
    numpy.testing.assert_allclose(mine(mg.tensor(x)).detach().numpy(), dst(torch.tensor(x)).detach().numpy(),
                                  rtol=1e-5, atol=1e-6)
    assert mine.weight.requires_grad == dst.weight.requires_grad
