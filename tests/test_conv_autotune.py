"""conv2d autotuning (minigrad.ops.conv_algorithms): every algorithm gives im2col's values and
gradients within float tolerance, in both layouts; the choice is the fastest in the cache, ties to
the first listed, so injected timings decide it; a shape is timed once; the cache lists it."""

import numpy as np
import pytest

import minigrad
import minigrad.backends
import minigrad.nn.functional as F
from minigrad.autograd.gradcheck import gradcheck
from minigrad.ops import conv_algorithms as algos
from minigrad.ops.conv import Geometry


@pytest.fixture(autouse=True)
def fresh_cache(monkeypatch):
    monkeypatch.setattr(minigrad.backends, "autotune", False)
    monkeypatch.setattr(minigrad.backends.cudnn, "benchmark", False)
    algos.clear_autotune_cache()
    yield
    algos.clear_autotune_cache()


# (x shape, weight shape, conv2d keywords)
CASES = [
    ((2, 3, 7, 9), (5, 3, 3, 3), dict(padding=1)),
    ((2, 4, 8, 8), (6, 4, 3, 3), dict()),
    ((1, 2, 3, 3), (2, 2, 3, 3), dict()),  # one output pixel: a single, cropped Winograd tile
    ((2, 4, 9, 7), (4, 4, 3, 3), dict(stride=2, padding=1)),
    ((2, 4, 6, 6), (6, 2, 3, 3), dict(padding=2, dilation=2, groups=2)),
    ((2, 3, 5, 6), (4, 3, 1, 1), dict()),
    ((2, 3, 6, 5), (4, 3, 2, 3), dict(padding=(1, 0))),
]


def geometry(ws, kw):
    k = ws[2:]
    s, d = (kw.get("stride", 1),) * 2, (kw.get("dilation", 1),) * 2
    p = kw.get("padding", 0)
    ph, pw = (p, p) if isinstance(p, int) else p
    return Geometry(k, s, (ph, ph, pw, pw), d)


def force(name, x, w, kw):
    """Timings that make ``name`` the fastest for this conv, with and without a weight gradient."""
    for keep in (False, True):
        algos.remember(x.array, w.array, geometry(tuple(w.shape), kw), kw.get("groups", 1), keep, {name: 1.0})


def applicable(x, w, kw):
    g = geometry(tuple(w.shape), kw)
    return [n for n, (_, ok) in algos.ALGORITHMS.items() if ok(x.array, w.array, g, kw.get("groups", 1))]


def inputs(xs, ws, dtype, channels_last, seed=0):
    rng = np.random.default_rng(seed)
    x = minigrad.tensor(rng.standard_normal(xs).astype(dtype))
    if channels_last:
        x = x.to(memory_format=minigrad.channels_last)
    w = minigrad.tensor(rng.standard_normal(ws).astype(dtype))
    b = minigrad.tensor(rng.standard_normal(ws[0]).astype(dtype))
    return x, w, b


def run(x, w, b, kw):
    """Output and the gradients of x, w and b for a fixed random output gradient."""
    xg, wg, bg = (t.detach().requires_grad_() for t in (x, w, b))
    y = F.conv2d(xg, wg, bg, **kw)
    gy = minigrad.tensor(np.random.default_rng(9).standard_normal(y.shape).astype(y.dtype.name))
    (y * gy).sum().backward()
    return y, [y.detach().numpy(), xg.grad.numpy(), wg.grad.numpy(), bg.grad.numpy()]


@pytest.mark.parametrize("xs, ws, kw", CASES)
@pytest.mark.parametrize("channels_last", [False, True])
def test_every_algorithm_gives_im2cols_values_and_gradients(xs, ws, kw, channels_last):
    x, w, b = inputs(xs, ws, "float32", channels_last)
    want_y, want = run(x, w, b, kw)
    assert want_y.is_contiguous(memory_format=minigrad.channels_last) == (channels_last or want_y.shape[2:] == (1, 1))
    names = applicable(x, w, kw)
    assert "im2col" in names and (("winograd" in names) == (ws[2:] == (3, 3) and kw.get("stride", 1) == 1
                                                           and kw.get("groups", 1) == 1 and "dilation" not in kw))
    minigrad.backends.autotune = True
    for name in names:
        algos.clear_autotune_cache()
        force(name, x, w, kw)
        y, got = run(x, w, b, kw)
        assert [e.algorithm for e in algos.autotune_cache()] == [name, name]
        assert y.shape == want_y.shape
        for layout in (minigrad.channels_last, minigrad.contiguous_format):  # the input's layout kept, as im2col
            assert y.is_contiguous(memory_format=layout) == want_y.is_contiguous(memory_format=layout), name
        for g, e, what in zip(got, want, ["y", "x.grad", "w.grad", "b.grad"]):
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5, err_msg=f"{name}: {what}")


@pytest.mark.parametrize("name", ["im2col_nhwc", "winograd"])
def test_gradcheck_and_gradgradcheck_through_each_algorithm(name):
    x, w, b = inputs((1, 2, 5, 4), (3, 2, 3, 3), "float64", False, seed=3)
    kw = dict(padding=1)
    minigrad.backends.autotune = True
    for keep in (False, True):  # x alone needing a gradient makes no columns; w needing one does
        algos.remember(x.array, w.array, geometry((3, 2, 3, 3), kw), 1, keep, {name: 1.0})
    xs, ws, bs = (t.requires_grad_() for t in (x, w, b))
    assert gradcheck(lambda a, c, d: F.conv2d(a, c, d, **kw), (xs, ws, bs))
    assert {e.algorithm for e in algos.autotune_cache()} == {name}
    y64, _ = run(x, w, b, kw)
    minigrad.backends.autotune = False
    np.testing.assert_allclose(y64.detach().numpy(), F.conv2d(x, w, b, **kw).detach().numpy(), rtol=1e-12, atol=1e-12)


def test_the_choice_is_the_fastest_in_the_cache_ties_to_the_first_listed():
    x, w, _ = inputs((2, 4, 8, 8), (6, 4, 3, 3), "float32", False)
    g = geometry((6, 4, 3, 3), {})
    pick = lambda times: algos.remember(x.array, w.array, g, 1, False, times).algorithm
    assert pick({"im2col": 3.0, "im2col_nhwc": 2.0, "winograd": 1.0}) == "winograd"
    assert pick({"im2col": 1.0, "im2col_nhwc": 2.0, "winograd": 3.0}) == "im2col"
    assert pick({"im2col": 2.0, "im2col_nhwc": 1.0, "winograd": 1.0}) == "im2col_nhwc"  # a tie: listed first
    assert pick({"im2col": 1.0, "im2col_nhwc": 1.0, "winograd": 1.0}) == "im2col"
    assert pick({"im2col": 1.0, "im2col_nhwc": 0.95}) == "im2col"  # within the margin: the default stays
    assert pick({"im2col": 1.0, "im2col_nhwc": 0.89, "winograd": 0.95}) == "im2col_nhwc"
    strided = geometry((6, 4, 3, 3), dict(stride=2))  # winograd does not apply: its time does not count
    entry = algos.remember(x.array, w.array, strided, 1, False, {"im2col": 2.0, "winograd": 0.5})
    assert entry.algorithm == "im2col" and entry.times_ms["winograd"] == float("inf")
    assert len(algos.autotune_cache()) == 2  # the same key was overwritten, the strided one added


def test_a_shape_is_timed_once_on_first_use_and_the_fastest_kept(monkeypatch):
    calls = []

    def fake_measure(runs, repeats=5):
        calls.append(sorted(runs))
        return {"im2col": 5e-3, "im2col_nhwc": 2e-3, "winograd": 9e-3}

    monkeypatch.setattr(algos, "measure", fake_measure)
    x, w, b = inputs((2, 4, 8, 8), (6, 4, 3, 3), "float32", False)
    assert F.conv2d(x, w, b, padding=1) is not None and algos.autotune_cache() == []  # off: nothing timed
    minigrad.backends.cudnn.benchmark = True  # torch's switch turns it on too
    want = F.conv2d(x, w, b, padding=1)
    assert calls == [["im2col", "im2col_nhwc", "winograd"]]  # every algorithm that applies, timed together
    (entry,) = algos.autotune_cache()
    assert entry.algorithm == "im2col_nhwc" and entry.times_ms == {"im2col": 5.0, "im2col_nhwc": 2.0, "winograd": 9.0}
    assert (entry.input, entry.weight, entry.padding, entry.with_grad) == ((2, 4, 8, 8), (6, 4, 3, 3), (1, 1, 1, 1), False)
    again = F.conv2d(x, w, b, padding=1)
    assert len(calls) == 1  # cached: not timed again
    np.testing.assert_array_equal(again.numpy(), want.numpy())
    algos.clear_autotune_cache()
    assert algos.autotune_cache() == []


def test_half_precision_is_not_given_to_winograd():
    x, w, _ = inputs((1, 2, 6, 6), (2, 2, 3, 3), "float16", False)
    assert "winograd" not in applicable(x, w, {})
