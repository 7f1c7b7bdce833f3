"""The memory tracker: exact byte counts of live tensor buffers, peaks, nesting, and the summary
of what is alive (chapter 03)."""

from __future__ import annotations

import gc

import pytest

import minigrad
from helpers import cpu_only
from minigrad.autograd import mode
from minigrad.errors import DeviceError
from minigrad.memory import snapshot, summary, track

MB4 = 1000 * 1000 * 4  # one (1000, 1000) float32 activation


@pytest.fixture(autouse=True)
def _collect_garbage_of_earlier_tests():
    """An array that only a reference cycle of an earlier test keeps alive is freed whenever the
    cycle collector runs, possibly inside a measurement: collect it before each test."""
    gc.collect()
EXACT_HOST_BYTES = cpu_only("byte-exact current and peak figures are the host counter's; a GPU's come from "
                            "CuPy's pool, which rounds blocks up to 512 bytes (test_cuda checks those)")


def big(requires_grad: bool = False) -> minigrad.Tensor:
    return minigrad.randn(1000, 1000, requires_grad=requires_grad)


@EXACT_HOST_BYTES
def test_keeping_one_activation_shows_4_mb_more():
    # exp saves its output for backward; x * 2 saves nothing: the graphs differ by one activation
    x = big(requires_grad=True)
    figures = []
    for step in (lambda: x.exp().sum(), lambda: (x * 2).sum()):
        with track() as mem:
            loss = step()
            held = mem.current - mem.start
            loss.backward()
        figures.append((held, mem.peak - mem.start))
        x.grad = None
        del loss  # its graph must not outlive the step it belongs to
    (held_exp, peak_exp), (held_mul, peak_mul) = figures
    assert held_exp - held_mul == MB4
    assert peak_exp - peak_mul == MB4


@EXACT_HOST_BYTES
def test_a_buffer_is_counted_once_whatever_wraps_it_and_released_when_freed():
    with track() as mem:
        a = big()
        views = [a.detach(), a.T, a.reshape(-1), a[::2], a.as_strided((999, 2), (1, 1000)),
                 minigrad.nn.Parameter(a)]
        assert mem.current - mem.start == MB4
        del a, views
        assert mem.current == mem.start
    assert mem.peak - mem.start == MB4


@EXACT_HOST_BYTES
def test_memory_alive_before_tracking_is_known_and_released():
    # the graph (and its saved exp output) exists before the tracker starts; backward frees the
    # saved output and allocates the gradient: the count goes up and down by the right amounts
    x = big(requires_grad=True)
    loss = x.exp().sum()
    with track() as mem:
        loss.backward()
    assert MB4 <= mem.peak - mem.start <= MB4 + 4  # + the scalar loss's gradient, 1.0
    assert mem.current == mem.start


def test_activation_peak_leaves_out_gradients():
    x = big(requires_grad=True)
    with track(minigrad.get_default_device()) as mem:  # activations are counted from tensors on every device
        (x.exp() * 2).sum().backward()
    assert 2 * MB4 <= mem.activation_peak < 2 * MB4 + 100  # exp's output and x.exp() * 2, at once
    assert mem.peak - mem.start >= 3 * MB4  # ... and during backward, the gradients as well


@EXACT_HOST_BYTES
def test_nested_trackers_and_reset_peak():
    with track() as outer:
        a = big()
        with track() as inner:
            assert inner.start == outer.current
            b = big()
            del b
            assert inner.peak - inner.start == MB4
            assert inner.activations == 0
        assert inner.current == outer.current  # frozen at exit
        c = big()
        assert outer.peak - outer.start == 2 * MB4
        del a, c
        outer.reset_peak()
        assert outer.peak == outer.current == outer.start
    assert mode.current_modes() == ()


def test_the_tracker_is_a_mode_only_while_tracking():
    assert mode.current_modes() == ()
    with track() as mem:
        assert mode.current_modes() == (mem,)
    assert mode.current_modes() == ()


def test_an_error_inside_the_block_still_stops_counting():
    with pytest.raises(RuntimeError), track():
        raise RuntimeError("boom")
    assert mode.current_modes() == ()


@pytest.mark.skipif(minigrad.cuda.is_available(), reason="a CUDA GPU is present: its pool has a counter")
def test_tracking_cuda_without_a_gpu_is_refused():
    with pytest.raises(DeviceError, match="cuda"):
        track("cuda")


def test_snapshot_names_the_op_that_made_each_buffer():
    x = big(requires_grad=True)
    h = x.exp()
    y = h.relu()  # keeps a bool mask for backward

    def alive(op: str, nbytes: int) -> bool:  # other tests' leftovers may be alive too
        live = snapshot(minigrad.get_default_device())
        return any(t.op == op and t.nbytes == nbytes and t.shape == (1000, 1000) for t in live)

    assert alive("leaf", MB4) and alive("Exp", MB4) and alive("Relu", MB4)
    assert alive("Relu (saved)", MB4 // 4)  # the bool mask
    y.sum().backward()
    assert alive("grad", MB4) and not alive("Relu (saved)", MB4 // 4)  # backward freed the mask


def test_summary_prints_largest_first(capsys):
    x = big(requires_grad=True)
    h = x.exp()  # noqa: F841  (kept alive for the summary)
    small = minigrad.ones(10)  # noqa: F841
    summary(minigrad.get_default_device(), top=3)
    out = capsys.readouterr().out
    assert f"live tensor memory on {minigrad.get_default_device()}" in out
    assert out.index("Exp") < out.index("by op:")
    first_row = out.splitlines()[2]
    assert "4.00 MB" in first_row
    assert "by op:" in out
