"""save/load: round trips, no pickle, atomic writes, clear errors for damaged files."""

import json
import os
import stat
import subprocess
import sys
import zipfile

import numpy as np
import pytest

import minigrad as mg
from minigrad.serialization import CheckpointError


def _checkpoint():
    return {
        "epoch": 7,
        "model_state_dict": {"0.weight": mg.randn(3, 2), "0.bias": mg.zeros(3, dtype=mg.float64)},
        "optimizer_state_dict": {"state": {0: {"step": 4, "exp_avg": mg.ones(3, 2)}},
                                 "param_groups": [{"lr": 0.1, "betas": (0.9, 0.999), "params": [0, 1]}]},
        "history": [0.5, float("inf"), None, "done", True],
        "raw": np.arange(6, dtype=np.int32).reshape(2, 3),
        "flag": mg.tensor([1, 2], requires_grad=False),
    }


@pytest.mark.parametrize("mmap", [False, True])
def test_zero_dimensional_tensors_come_back_zero_dimensional(tmp_path, mmap):
    """Optimizer step counts are 0-d tensors: a round trip must not make them shape (1,)."""
    mg.save({"step": mg.tensor(3.0, dtype=mg.float64), "raw": np.array(5, dtype=np.int32)}, tmp_path / "ck")
    back = mg.load(tmp_path / "ck", mmap=mmap)
    assert back["step"].shape == () and back["step"].item() == 3.0
    assert back["raw"].shape == () and back["raw"] == 5


def test_round_trip(tmp_path):
    ck = _checkpoint()
    mg.save(ck, tmp_path / "ck.mg")
    back = mg.load(tmp_path / "ck.mg")
    assert back["epoch"] == 7 and back["history"] == ck["history"]
    assert back["optimizer_state_dict"]["param_groups"][0]["betas"] == (0.9, 0.999)
    assert list(back["optimizer_state_dict"]["state"]) == [0]
    for key in ("0.weight", "0.bias"):
        t = back["model_state_dict"][key]
        assert isinstance(t, mg.Tensor) and t.dtype == ck["model_state_dict"][key].dtype
        np.testing.assert_array_equal(t.numpy(), ck["model_state_dict"][key].numpy())
    np.testing.assert_array_equal(back["raw"], ck["raw"])
    assert back["flag"].dtype == mg.int64


def test_requires_grad_is_kept(tmp_path):
    mg.save({"p": mg.ones(2, requires_grad=True)}, tmp_path / "p")
    assert mg.load(tmp_path / "p")["p"].requires_grad


def test_file_is_an_npz_readable_without_pickle(tmp_path):
    mg.save(_checkpoint(), tmp_path / "ck.npz")
    with np.load(tmp_path / "ck.npz", allow_pickle=False) as z:
        assert "metadata.json" in z.files
        arrays = [z[name] for name in z.files if name.startswith("arr_")]
    assert len(arrays) == 5
    with zipfile.ZipFile(tmp_path / "ck.npz") as z:
        assert all(b"pickle" not in z.read(n) for n in z.namelist())


def test_unsaveable_objects_are_refused(tmp_path):
    with pytest.raises(TypeError, match="cannot save obj\\['f'\\] of type function"):
        mg.save({"f": lambda: 0}, tmp_path / "x")
    with pytest.raises(TypeError, match="object array"):
        mg.save({"a": np.array([object()])}, tmp_path / "x")
    assert not list(tmp_path.iterdir())


def test_crash_mid_save_leaves_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "ck.mg"
    mg.save({"epoch": 1}, path)

    def boom(*args, **kwargs):
        raise KeyboardInterrupt("killed mid-save")

    monkeypatch.setattr(zipfile.ZipFile, "writestr", boom)
    with pytest.raises(KeyboardInterrupt):
        mg.save({"epoch": 2, "w": mg.ones(1000)}, path)
    monkeypatch.undo()
    assert mg.load(path) == {"epoch": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["ck.mg"]  # no temporary file left behind


def test_truncated_file(tmp_path):
    path = tmp_path / "ck.mg"
    mg.save(_checkpoint(), path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="ck.mg: damaged or truncated"):
        mg.load(path)


def test_tampered_array_is_detected(tmp_path):
    path = tmp_path / "ck.mg"
    mg.save({"w": mg.zeros(64)}, path)
    with zipfile.ZipFile(path) as z:
        entries = {n: z.read(n) for n in z.namelist()}
    raw = bytearray(entries["arr_0.npy"])
    raw[-1] ^= 0xFF
    entries["arr_0.npy"] = bytes(raw)
    with zipfile.ZipFile(path, "w") as z:  # rewritten with valid CRCs: only the digest can tell
        for n, b in entries.items():
            z.writestr(n, b)
    with pytest.raises(CheckpointError, match="array 0 does not match its checksum"):
        mg.load(path)


def test_not_a_checkpoint(tmp_path):
    np.savez(tmp_path / "plain.npz", a=np.ones(2))
    with pytest.raises(CheckpointError, match="not a minigrad checkpoint"):
        mg.load(tmp_path / "plain.npz")
    (tmp_path / "text").write_text("hello")
    with pytest.raises(CheckpointError, match="text: damaged or truncated"):
        mg.load(tmp_path / "text")
    with pytest.raises(FileNotFoundError):
        mg.load(tmp_path / "missing")


def test_wrong_version(tmp_path):
    path = tmp_path / "ck"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("metadata.json", json.dumps({"format": "minigrad-checkpoint", "version": 99}))
    with pytest.raises(CheckpointError, match="version 99"):
        mg.load(path)


def test_next_save_removes_temporaries_of_killed_saves(tmp_path):
    path = tmp_path / "ck.mg"
    killed = "import os, minigrad as mg; os.replace = lambda *a: os._exit(9); mg.save({'w': mg.ones(1000)}, %r)"
    left = set()
    for _ in range(2):  # saves killed after writing their temporary file, before the rename
        assert subprocess.run([sys.executable, "-c", killed % str(path)]).returncode == 9
        now = set(tmp_path.glob("ck.mg.*.tmp"))
        assert len(now) == 1 and now != left and not path.exists()  # each removed the one before
        left = now
    other = tmp_path / "other.mg.tmp"
    other.write_bytes(b"not ours")
    mg.save({"epoch": 1}, path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck.mg", "other.mg.tmp"]
    assert mg.load(path) == {"epoch": 1}


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_file_mode_follows_the_umask(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        mg.save({"epoch": 1}, tmp_path / "ck.mg")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "ck.mg").stat().st_mode) == mode
