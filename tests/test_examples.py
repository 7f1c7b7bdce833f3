"""The digits example: trains, checkpoints, and resumes to exactly the weights of a straight run."""

import numpy as np
import pytest

import minigrad
from minigrad.examples import train_digits


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
