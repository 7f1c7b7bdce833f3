"""Memory-mapped loading (minigrad.mapped): native checkpoints with mmap=True, .safetensors both ways
with PyTorch, and damaged files refused as eager loads refuse them."""

import mmap
import struct

import numpy
import pytest
from hypothesis import given, settings, strategies as st

import minigrad as mg
from minigrad import nn
from minigrad.serialization import CheckpointError


def test_mmap_load_maps_aligned_private_arrays(tmp_path):
    model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 2))
    path = tmp_path / "m.ckpt"
    mg.save({"model": model.state_dict(), "empty": mg.zeros(0, 3), "step": 7}, path)
    loaded = mg.load(path, mmap=True)
    for key, value in model.state_dict().items():
        array = loaded["model"][key].array
        assert isinstance(array.base, mmap.mmap) and array.ctypes.data % 64 == 0
        numpy.testing.assert_array_equal(array, value.array)
    assert loaded["step"] == 7 and loaded["empty"].shape == (0, 3)
    loaded["model"]["0.weight"].array[...] = 0  # copy-on-write: the file keeps its values
    numpy.testing.assert_array_equal(mg.load(path)["model"]["0.weight"].array, model[0].weight.array)


def test_meta_model_plus_mmap_checkpoint_runs_like_the_original(tmp_path):
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    mg.save(model.state_dict(), tmp_path / "m.ckpt")
    with mg.device("meta"):
        lazy = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    lazy.load_state_dict(mg.load(tmp_path / "m.ckpt", mmap=True), assign=True)
    x = mg.randn(3, 8)
    assert mg.equal(lazy(x), model(x))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10**6), st.integers(0, 255))
def test_mmap_load_refuses_any_modified_byte(tmp_path_factory, position, byte):
    path = tmp_path_factory.mktemp("ck") / "m.ckpt"
    mg.save({"w": mg.arange(64).float()}, path)
    data = bytearray(path.read_bytes())
    position %= len(data)
    if data[position] == byte:
        return
    data[position] = byte
    path.write_bytes(bytes(data))
    try:
        loaded = mg.load(path, mmap=True)
    except CheckpointError:
        return
    # a byte outside what is checked (zip bookkeeping, padding) may change; the values may not
    numpy.testing.assert_array_equal(loaded["w"].array, numpy.arange(64, dtype=numpy.float32))


def test_safetensors_round_trip_and_mmap(tmp_path):
    pytest.importorskip("safetensors")
    model = nn.Linear(5, 3)
    path = tmp_path / "m.safetensors"
    mg.save(model.state_dict(), path)
    for mapped in (True, False):
        sd = mg.load(path, mmap=mapped)
        assert isinstance(sd["weight"].array.base, mmap.mmap) == mapped
        numpy.testing.assert_array_equal(sd["weight"].array, model.weight.array)
    mg.save({"step": mg.tensor(3.0)}, path)  # a 0-d tensor stays 0-d
    assert mg.load(path)["step"].shape == ()


def test_safetensors_moves_weights_both_ways_with_torch(tmp_path):
    torch = pytest.importorskip("torch")
    st_torch = pytest.importorskip("safetensors.torch")
    tmodel = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    st_torch.save_file(tmodel.state_dict(), str(tmp_path / "t.safetensors"))
    with mg.device("meta"):
        model = nn.Sequential(nn.Linear(6, 4), nn.Tanh(), nn.Linear(4, 2))
    model.load_state_dict(mg.load(tmp_path / "t.safetensors", mmap=True), assign=True)
    x = numpy.random.default_rng(0).standard_normal((3, 6)).astype(numpy.float32)
    numpy.testing.assert_allclose(model(mg.tensor(x)).detach().numpy(), tmodel(torch.tensor(x)).detach().numpy(),
                                  rtol=1e-6, atol=1e-6)
    mg.save(model.state_dict(), tmp_path / "m.safetensors")
    back = st_torch.load_file(str(tmp_path / "m.safetensors"))
    for key, value in tmodel.state_dict().items():
        assert torch.equal(back[key], value)


def _safetensors_file(header: bytes, data: bytes) -> bytes:
    return struct.pack("<Q", len(header)) + header + data


@pytest.mark.parametrize("header, data, match", [
    (b'{"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]}}', bytes(8), "the tensors take"),
    (b'{"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 12]}}', bytes(12), "does not match"),
    (b'{"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}', bytes(8), "gap"),
    (b'{"w": {"dtype": "F32", "shape": [1]}}', bytes(4), "malformed"),
    (b'[1, 2]', b"", "not a JSON object"),
    (b'{"w": ', b"", "not valid JSON"),
])
def test_damaged_safetensors_files_are_refused(tmp_path, header, data, match):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(_safetensors_file(header, data))
    with pytest.raises(CheckpointError, match=match):
        mg.load(path)


def test_safetensors_dtypes_minigrad_cannot_hold_are_named(tmp_path):
    path = tmp_path / "bf16.safetensors"
    path.write_bytes(_safetensors_file(b'{"w": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}', bytes(4)))
    with pytest.raises(TypeError, match="BF16"):
        mg.load(path)
