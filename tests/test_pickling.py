"""Whole-object checkpoints (``minigrad.pickling``): ``save(model, f)`` round-trips under
``weights_only=False``; the default ``weights_only=True`` refuses a pickled class unless
``safe_globals`` / ``add_safe_globals`` allow it, naming both ways out; tensors stay .npy arrays
with digests, so a modified file is refused."""

import io
import os
import pickle
import zipfile

import numpy as np
import pytest

import minigrad as mg
from minigrad import nn
from minigrad.errors import CheckpointError
from minigrad.serialization import add_safe_globals, clear_safe_globals, get_safe_globals, safe_globals


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(6, 5)
        self.decoder = nn.Linear(5, 6)
        self.decoder.weight = nn.Parameter(self.encoder.weight.detach().T.contiguous())
        self.head = self.encoder  # the same module twice: must stay one module
        self.register_buffer("steps", mg.tensor(3))

    def forward(self, x):
        return self.decoder(self.encoder(x).relu())


SAFE = [Net, nn.Linear]


@pytest.fixture(autouse=True)
def _no_leftover_safe_globals():
    clear_safe_globals()
    yield
    clear_safe_globals()


def _saved(obj) -> io.BytesIO:
    buf = io.BytesIO()
    mg.save(obj, buf)
    buf.seek(0)
    return buf


def test_a_whole_model_round_trips_with_weights_only_false(tmp_path):
    model = Net().eval()
    mg.save({"model": model, "epoch": 7, "opt": mg.optim.SGD(model.parameters(), lr=0.1).state_dict()},
            tmp_path / "ck.pt")
    ck = mg.load(tmp_path / "ck.pt", weights_only=False)
    back = ck["model"]
    assert type(back) is Net and ck["epoch"] == 7 and not back.training
    x = mg.randn(4, 6)
    np.testing.assert_array_equal(back(x).detach().numpy(), model(x).detach().numpy())
    assert back.head is back.encoder and isinstance(back.encoder.weight, nn.Parameter)
    assert back.encoder.weight.requires_grad and back.steps.tolist() == 3
    back(x).sum().backward()  # it trains: a graph is built and gradients reach the parameters
    assert back.encoder.weight.grad is not None
    assert sorted(os.listdir(tmp_path)) == ["ck.pt"]


def test_the_default_refuses_a_pickled_class_and_says_what_to_do():
    buf = _saved(Net())
    for kwargs in ({}, {"weights_only": True}, {"weights_only": None}):
        buf.seek(0)
        with pytest.raises(pickle.UnpicklingError, match="Weights only load failed.*Net.*weights_only=False.*"
                                                         "add_safe_globals.*safe_globals"):
            mg.load(buf, **kwargs)


def test_safe_globals_allow_named_classes_inside_the_block_only():
    buf = _saved(Net())
    with safe_globals(SAFE):
        assert type(mg.load(buf)) is Net
        assert get_safe_globals() == SAFE
    assert get_safe_globals() == []
    buf.seek(0)
    with pytest.raises(pickle.UnpicklingError, match="Net"):
        mg.load(buf)
    buf.seek(0)
    with safe_globals([Net]), pytest.raises(pickle.UnpicklingError, match="minigrad.nn.linear.Linear"):
        mg.load(buf)  # every class in the file must be allowed, not just the outer one


def test_add_safe_globals_persists_and_takes_module_name_pairs():
    buf = _saved(Net())
    add_safe_globals([(Net, f"{Net.__module__}.Net"), nn.Linear])
    assert type(mg.load(buf)) is Net
    with pytest.raises(TypeError, match="add_safe_globals: expected classes"):
        add_safe_globals(["Net"])
    assert mg.serialization.get_safe_globals is get_safe_globals


def _danger():
    raise AssertionError("unpickling ran code from the file")


class Payload:
    def __reduce__(self):
        return (_danger, ())


def test_a_hostile_pickle_is_refused_before_it_runs():
    buf = _saved({"w": mg.ones(2), "x": Payload()})
    with pytest.raises(pickle.UnpicklingError, match="_danger"):
        mg.load(buf)


def test_tensors_stay_arrays_with_digests_so_a_modified_file_is_refused():
    model = nn.Linear(100, 100)
    raw = _saved(model).getvalue()
    with zipfile.ZipFile(io.BytesIO(raw)) as z:
        names = z.namelist()
        pickled = z.read("data.pkl")
    assert "data.pkl" in names and {"arr_0.npy", "arr_1.npy"} <= set(names)
    assert len(pickled) < 2000  # 10,100 float32 values live in the .npy members, not in the pickle
    start = raw.index(pickled)
    tampered = raw[:start + 5] + bytes([raw[start + 5] ^ 1]) + raw[start + 6:]
    with pytest.raises(CheckpointError, match="data.pkl (is damaged|does not match its checksum)"):
        mg.load(io.BytesIO(tampered), weights_only=False)


def test_mmap_and_map_location(tmp_path):
    model = nn.Linear(3, 2)
    mg.save(model, tmp_path / "m.pt")
    back = mg.load(tmp_path / "m.pt", weights_only=False, mmap=True, map_location="cpu")
    np.testing.assert_array_equal(back.weight.detach().numpy(), model.weight.detach().numpy())


def test_what_cannot_be_pickled_is_refused_naming_where(tmp_path):
    with pytest.raises(TypeError, match=r"cannot save obj\['f'\] of type function: it is not data.*pickling it failed"):
        mg.save({"f": lambda: 0, "m": nn.Linear(2, 2)}, tmp_path / "x")
    assert not list(tmp_path.iterdir())


def test_data_checkpoints_are_still_json_and_arrays():
    buf = _saved({"w": mg.ones(2), "n": [1, 2.5, "s", None]})
    with zipfile.ZipFile(buf) as z:
        assert "data.pkl" not in z.namelist()
    buf.seek(0)
    assert mg.load(buf)["n"] == [1, 2.5, "s", None]
