"""The digits examples: the single-process one trains, checkpoints, and resumes to exactly the weights
of a straight run; the data-parallel one trains on two MPI ranks that end with the same weights."""

from pathlib import Path

import numpy as np
import pytest

import minigrad
import minigrad.distributed as dist
from minigrad.distributed.launcher import find_mpiexec
from minigrad.examples import train_digits, train_digits_ddp


def _weights(path):
    return {k: v.numpy() for k, v in minigrad.load(path)["model_state_dict"].items()}


def test_resume_gives_the_same_weights_as_a_straight_run(tmp_path, monkeypatch, capsys):
    straight, interrupted = tmp_path / "straight.ckpt", tmp_path / "interrupted.ckpt"
    accuracy = train_digits.train(epochs=2, checkpoint=straight, progress=False)
    assert accuracy > 0.9

    saves, real_save = [], minigrad.save

    def save_then_die(obj, path):
        if saves:
            raise KeyboardInterrupt("killed during epoch 2")
        saves.append(obj["epoch"])
        real_save(obj, path)

    monkeypatch.setattr(train_digits.minigrad, "save", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        train_digits.train(epochs=2, checkpoint=interrupted, progress=False)
    monkeypatch.undo()
    assert minigrad.load(interrupted)["epoch"] == 0

    train_digits.main(["--epochs", "2", "--checkpoint", str(interrupted), "--resume", "--no-progress"])
    assert "resumed from" in capsys.readouterr().out
    for key, value in _weights(straight).items():
        np.testing.assert_array_equal(value, _weights(interrupted)[key])


@pytest.mark.skipif(not dist.is_available() or find_mpiexec() is None,
                    reason="needs mpi4py and mpiexec: pip install 'minigrad[mpi]'")
def test_ddp_example_trains_on_two_ranks_with_identical_weights(tmp_path):
    ckpt = tmp_path / "ddp.ckpt"
    result = dist.launch(Path(train_digits_ddp.__file__), 2, ["--epochs", "1", "--checkpoint", ckpt], timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "2 ranks x 16 images per step" in result.stdout
    assert "every rank holds the same weights" in result.stdout
    accuracy = float(result.stdout.split("final test accuracy ")[1].split("%")[0])
    assert accuracy > 80
    assert minigrad.load(ckpt)["epoch"] == 0
