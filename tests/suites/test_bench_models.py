"""benchmarks/bench_models.py at tiny sizes: each workload's model, written once for both
frameworks, trains in minigrad, and where PyTorch is installed its twin (loaded with minigrad's
initial weights) computes the same losses, the optimizer's step included. No timing is asserted."""

import sys
from pathlib import Path

import numpy
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_models as bench  # noqa: E402

import minigrad  # noqa: E402

TINY = {
    "lstm": dict(batch=3, steps=4, features=5, hidden=6, classes=4),
    "word_lm": dict(vocab=11, width=6, seq=4, batch=3),
    "dcgan": dict(nz=4, width=2, batch=2, image=32),
    "gpt": dict(vocab=7, block=4, width=8, heads=2, layers=1, batch=2),
}


def test_every_workload_has_a_tiny_size_and_a_name():
    assert set(TINY) == set(bench.WORKLOADS) == set(bench.SIZES) == set(bench.NAMES)


@pytest.mark.parametrize("name", list(bench.WORKLOADS))
def test_a_step_trains_and_matches_torch(name):
    pairs = bench.twins(name, TINY[name])
    model, step = pairs["minigrad"]
    before = [p.detach().numpy().copy() for p in model.parameters()]
    losses = {who: [float(s().item()) for _ in range(2)] for who, (_, s) in pairs.items()}
    assert all(numpy.isfinite(losses["minigrad"])) and losses["minigrad"][1] != losses["minigrad"][0]
    assert all(not numpy.array_equal(b, p.detach().numpy()) for b, p in zip(before, model.parameters())
               if p.grad is not None)
    if "torch" in losses:
        numpy.testing.assert_allclose(losses["minigrad"], losses["torch"], rtol=1e-4, atol=1e-6, err_msg=name)


def test_the_table_row_says_whether_each_target_is_met():
    line = bench.row("x", {"minigrad": 3.0, "compiled": 2.0, "torch": 2.5})
    assert "1.20x <= 1.5x met" in line and "0.80x <= 1.2x met" in line
    assert "not met" in bench.row("x", {"minigrad": 4.0, "torch": 2.0})
    assert "x <=" not in bench.row("x", {"minigrad": 4.0})  # no torch: no ratio


@pytest.mark.parametrize("name", list(bench.WORKLOADS))
def test_the_compiled_step_computes_the_eager_one(name):
    """The benchmark's compiled column times the same step: its losses equal eager minigrad's."""
    losses = []
    for compiled in (False, True):
        minigrad.manual_seed(0)
        _, step = bench.WORKLOADS[name](minigrad, **TINY[name])
        first = float(step().item())  # the eager warm-up the benchmark runs before compiling
        if compiled:
            step, why = bench.compiled_step(step)  # traces and replays once
            assert step is not None, why
            losses.append([first] + [float(step().item()) for _ in range(2)])
        else:
            losses.append([first] + [float(step().item()) for _ in range(4)][2:])
    numpy.testing.assert_allclose(losses[1], losses[0], rtol=1e-4, atol=1e-6, err_msg=name)
