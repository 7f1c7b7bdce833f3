"""The lessons' sliders (``minigrad.examples.controls``) re-run their measurement: each callback,
called for two values of its slider without a kernel, draws a figure whose numbers follow the value,
and ``control`` calls its callback again when the slider moves."""

from pathlib import Path

import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from minigrad.distributed import is_available  # noqa: E402
from minigrad.distributed.launcher import find_mpiexec  # noqa: E402
from minigrad.examples import controls  # noqa: E402

SCRIPT = Path(__file__).resolve().parent.parent / "chapters" / "04_distributed" / "scripts" / "parallel_model.py"


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def test_shuffle_buffer_mixes_more_with_a_larger_buffer():
    in_order = controls.shuffle_buffer(1)
    assert in_order.axes[0].get_title().startswith("buffer_size=1: an element moves 0.0 places")
    mixed = controls.shuffle_buffer(300)
    order = mixed.axes[0].lines[0].get_ydata()
    assert sorted(order) == list(range(300)) and list(order) != list(range(300))
    assert "moves 0.0" not in mixed.axes[0].get_title()


def test_checkpoint_segments_trade_peak_for_forwards():
    one = controls.checkpoint_segments(1).axes[0].get_title()
    assert one == "1 segments: peak 1.00x, 0 extra block forwards of 16", one
    four = controls.checkpoint_segments(4).axes[0].get_title()
    assert four.startswith("4 segments: peak 0.") and four.endswith("12 extra block forwards of 16"), four
    with pytest.raises(ValueError, match="between 1 and n_blocks=16, got 17"):
        controls.checkpoint_segments(17)


def test_loss_scale_rescues_small_gradients_and_overflows_when_too_large():
    def layer1(log2_scale):  # (share off by > 1%, share not finite) of the first layer's gradient
        lines = controls.loss_scale(log2_scale).axes[1].lines
        return lines[0].get_ydata()[0], lines[2].get_ydata()[0]

    unscaled, scaled, too_large = layer1(0), layer1(10), layer1(28)
    assert unscaled[0] > 0.2 and scaled[0] < 0.1, (unscaled, scaled)
    assert unscaled[1] == scaled[1] == 0 and too_large[1] == 1, (unscaled, scaled, too_large)


@pytest.mark.skipif(not is_available() or find_mpiexec() is None, reason="needs mpi4py and mpiexec")
def test_pipeline_microbatches_runs_the_job_for_each_value():
    for m in (1, 4):
        ax = controls.pipeline_microbatches(m, SCRIPT).axes[0]
        assert f"P = 2, M = {m}: bubble" in ax.get_title()
        assert sum(len(bars.get_paths()) for bars in ax.collections) == 2 * 2 * m  # F and B per stage
    with pytest.raises(ChildProcessError, match="M=3 exited with 1, expected 0"):
        controls.pipeline_microbatches(3, SCRIPT)


def test_control_redraws_when_the_slider_moves():
    pytest.importorskip("ipywidgets")
    drawn = []

    def draw(value):
        drawn.append(value)
        return plt.figure()

    box = controls.control(draw, "value", [1, 2, 4], 2)
    slider = box.children[0]
    assert list(slider.options) == [1, 2, 4] and drawn == [2]
    slider.value = 4
    assert drawn == [2, 4]
    with pytest.raises(ValueError, match=r"one of \[1, 2, 4\], got 3"):
        controls.control(draw, "value", [1, 2, 4], 3)
