"""Fuzzing ``load`` with damaged and hostile files (``checkpoint_mutants.py``): each one either loads
as the original checkpoint or raises ``CheckpointError``, never another exception, a wrong result,
or an allocation larger than the file."""

import json
import tracemalloc

import numpy as np
import pytest

import minigrad as mg
from checkpoint_mutants import bombs, members, mutants
from minigrad.serialization import CheckpointError


def _checkpoint():
    return {
        "epoch": 3,
        "w": mg.arange(12, dtype=mg.float32).reshape(3, 4).requires_grad_(True),
        "state": {0: {"step": 2, "m": mg.ones(4, dtype=mg.float64)}, (1, "b"): [None, True, 1.5]},
        "betas": (0.9, 0.999),
        "raw": np.arange(5, dtype=np.int16),
    }


def same(a, b) -> bool:
    if isinstance(a, mg.Tensor):
        return (isinstance(b, mg.Tensor) and a.dtype == b.dtype and a.requires_grad == b.requires_grad
                and a.shape == b.shape and np.array_equal(a.detach().numpy(), b.detach().numpy()))
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return (type(b) is dict and list(a) == list(b) and all(type(k) is type(j) for k, j in zip(a, b))
                and all(same(a[k], b[k]) for k in a))
    return type(a) is type(b) and a == b


def outcome(path, original) -> str | None:
    """None when ``load`` behaved; otherwise what it did wrong."""
    try:
        back = mg.load(path)
    except CheckpointError as e:
        return None if str(path) in str(e) else f"CheckpointError without the file name: {e}"
    except Exception as e:  # anything else is a failure to report, whatever its type
        return f"{type(e).__name__}: {str(e)[:120]}"
    return None if same(original, back) else "loaded a different checkpoint"


def test_every_mutant_is_refused_or_loads_unchanged(tmp_path):
    original = _checkpoint()
    mg.save(original, tmp_path / "valid.mg")
    valid = (tmp_path / "valid.mg").read_bytes()
    failures = []
    for i, (what, data) in enumerate(mutants(valid, seed=0)):
        path = tmp_path / f"m{i}.mg"
        path.write_bytes(data)
        wrong = outcome(path, original)
        if wrong:
            failures.append(f"{what}: {wrong}")
        path.unlink()
    assert not failures, f"{len(failures)} mutants mishandled:\n" + "\n".join(failures)


@pytest.mark.parametrize("which", [0, 1])
def test_zip_bombs_are_refused_without_expanding(tmp_path, which):
    mg.save(_checkpoint(), tmp_path / "valid.mg")
    entries = members((tmp_path / "valid.mg").read_bytes())
    what, data = list(bombs(entries, json.loads(entries["metadata.json"])))[which]
    path = tmp_path / "bomb.mg"
    path.write_bytes(data)
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError, match="bomb.mg"):
            mg.load(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * len(data) + (1 << 20), f"{what}: {peak} bytes allocated for a {len(data)}-byte file"
