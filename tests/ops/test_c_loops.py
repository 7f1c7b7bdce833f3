"""The C loops of the gate ops and log-softmax (minigrad.ops.c_loops): equal to the numpy lines they replace in
float32 and float64, forward and backward, LSTM and GRU, on contiguous and strided inputs; the
gradients through them finite-difference checked in float64 (and again for second order), equal
to torch's, and the numpy lines run when no compiler built the loops."""

import numpy as np
import pytest

import minigrad
from minigrad.autograd import gradcheck, gradgradcheck
from minigrad.ops import c_loops
from minigrad.ops.recurrent import GRUGates, GRUGatesBackward, LSTMGates, LSTMGatesBackward, gru_gates, lstm_gates

rng = np.random.default_rng(0)
compiled = pytest.mark.skipif(not c_loops.enabled(), reason="no C compiler built the gate loops")


class _Ctx:
    """What an op's array forward reads of its ctx."""
    xp = np

    def save_for_backward(self, *arrays):
        self.saved = arrays


def _both(monkeypatch, op, *args):
    """``op``'s forward with the C loops, then with the numpy lines; each with what it saved."""
    ctx_c, ctx_np = _Ctx(), _Ctx()
    fused = op.forward(ctx_c, *args)
    monkeypatch.setattr(c_loops, "_library", [False])
    plain = op.forward(ctx_np, *args)
    monkeypatch.undo()
    as_tuple = lambda out: out if isinstance(out, tuple) else (out,)  # noqa: E731
    return as_tuple(fused) + ctx_c.saved, as_tuple(plain) + ctx_np.saved


def _arrays(dtype, *shapes, scale=2.0):
    return [(rng.standard_normal(s) * scale).astype(dtype) for s in shapes]


@compiled
@pytest.mark.parametrize("dtype, rtol", [(np.float32, 2e-6), (np.float64, 1e-14)])
@pytest.mark.parametrize("lead", [(5,), (2, 3)])
def test_lstm_loops_equal_the_numpy_lines(monkeypatch, dtype, rtol, lead):
    n = 7
    xg, hg, c, dh, dc = _arrays(dtype, lead + (4 * n,), lead + (4 * n,), lead + (n,), lead + (n,), lead + (n,))
    fused, plain = _both(monkeypatch, LSTMGates, xg, hg, c)
    for a, b in zip(fused, plain):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol)
    s, t = fused[-2:]
    for given in ((s, t), ()):  # forward's activations handed over, or recomputed
        fused, plain = _both(monkeypatch, LSTMGatesBackward, dh, dc, xg, hg, c, *given)
        for a, b in zip(fused[:2], plain[:2]):
            assert a.dtype == dtype and a.shape == b.shape
            np.testing.assert_allclose(a, b, rtol=10 * rtol, atol=10 * rtol)


@compiled
@pytest.mark.parametrize("dtype, rtol", [(np.float32, 2e-6), (np.float64, 1e-14)])
def test_gru_loops_equal_the_numpy_lines(monkeypatch, dtype, rtol):
    k = 5
    gx, gh, h, g = _arrays(dtype, (4, 3 * k), (4, 3 * k), (4, k), (4, k))
    fused, plain = _both(monkeypatch, GRUGates, gx, gh, h)
    for a, b in zip(fused, plain):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol)
    rz, n = fused[-2:]
    for given in ((rz, n), ()):
        fused, plain = _both(monkeypatch, GRUGatesBackward, g, gx, gh, h, *given)
        for a, b in zip(fused[:3], plain[:3]):
            assert a.dtype == dtype and a.shape == b.shape
            np.testing.assert_allclose(a, b, rtol=10 * rtol, atol=10 * rtol)


@compiled
def test_strided_and_broadcast_inputs_are_read_as_numpy_reads_them(monkeypatch):
    """A step of a transposed sequence, a column slice and a broadcast gradient (a sum's) are
    copied to rows first: the loops read them as numpy does."""
    n = 3
    seq = rng.standard_normal((4 * n, 6, 2))  # (features, time, batch): a step is a strided view
    xg, hg = seq[:, 1, :].T, rng.standard_normal((2, 8 * n))[:, ::2]
    c = rng.standard_normal((n, 2)).T
    fused, plain = _both(monkeypatch, LSTMGates, xg, hg, c)
    for a, b in zip(fused, plain):
        np.testing.assert_allclose(a, b, rtol=1e-14, atol=1e-14)
    ones = np.broadcast_to(np.ones(1), (2, n))
    fused, plain = _both(monkeypatch, LSTMGatesBackward, ones, ones, xg, hg, c, *fused[-2:])
    for a, b in zip(fused[:2], plain[:2]):
        np.testing.assert_allclose(a, b, rtol=1e-14, atol=1e-14)


@compiled
def test_read_only_inputs_give_the_writable_ones_values():
    """A step's loop asks its arrays' buffers for their addresses, which a read-only array (a
    constant, a frozen buffer) refuses: it is read as the same values all the same."""
    n = 4
    xg, hg, c, dh, dc = _arrays(np.float32, (3, 4 * n), (3, 4 * n), (3, n), (3, n), (3, n))
    gx, gh = xg[:, :3 * n].copy(), hg[:, :3 * n].copy()
    frozen = [a.copy() for a in (xg, hg, c, dh, dc, gx, gh)]
    for a in frozen:
        a.setflags(write=False)
    fxg, fhg, fc, fdh, fdc, fgx, fgh = frozen
    h, c_next, s, t = c_loops.lstm_forward(xg, hg, c)
    for a, b in zip(c_loops.lstm_forward(fxg, fhg, fc), (h, c_next, s, t)):
        np.testing.assert_array_equal(a, b)
    s.setflags(write=False)
    for a, b in zip(c_loops.lstm_backward(fdh, fdc, fc, s, t), c_loops.lstm_backward(dh, dc, c, s.copy(), t)):
        np.testing.assert_array_equal(a, b)
    out, rz, m = c_loops.gru_forward(gx, gh, c)
    for a, b in zip(c_loops.gru_forward(fgx, fgh, fc), (out, rz, m)):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(c_loops.gru_backward(fdh, fgh, fc, rz, m), c_loops.gru_backward(dh, gh, c, rz, m)):
        np.testing.assert_array_equal(a, b)


def test_without_a_compiler_the_numpy_lines_run(monkeypatch):
    monkeypatch.setattr(c_loops, "_library", [False])
    xg, hg, c = _arrays(np.float64, (2, 8), (2, 8), (2, 2))
    assert c_loops.lstm_forward(xg, hg, c) is None and c_loops.gru_forward(xg[:, :6], hg[:, :6], c) is None
    h, c_next = lstm_gates(*(minigrad.tensor(a) for a in (xg, hg, c)))
    assert np.isfinite(h.numpy()).all() and h.shape == c_next.shape == (2, 2)


def test_other_dtypes_and_empty_steps_take_the_numpy_lines():
    half = [a.astype(np.float16) for a in _arrays(np.float64, (2, 8), (2, 8), (2, 2))]
    assert c_loops.lstm_forward(*half) is None
    assert c_loops.lstm_forward(np.zeros((0, 8)), np.zeros((0, 8)), np.zeros((0, 2))) is None
    mixed = _arrays(np.float64, (2, 8), (2, 8)) + [np.zeros((2, 2), np.float32)]
    assert c_loops.lstm_forward(*mixed) is None


def _t(*shape):
    return minigrad.tensor(rng.standard_normal(shape), dtype=minigrad.float64, requires_grad=True)


@pytest.fixture(params=["c", "numpy"])
def loops(request, monkeypatch):
    """Each test twice: with the C loops, then with the numpy lines (the loops switched off)."""
    if request.param == "numpy":
        monkeypatch.setattr(c_loops, "_library", [False])
    elif not c_loops.enabled():
        pytest.skip("no C compiler built the loops")
    return request.param


def test_gate_ops_gradcheck_in_float64_either_way(loops):
    lstm_in, gru_in = (_t(3, 8), _t(3, 8), _t(3, 2)), (_t(3, 6), _t(3, 6), _t(3, 2))
    assert gradcheck(lstm_gates, lstm_in) and gradgradcheck(lstm_gates, lstm_in)
    assert gradcheck(gru_gates, gru_in) and gradgradcheck(gru_gates, gru_in)
    lstm_back = (_t(3, 2), _t(3, 2), *lstm_in)
    gru_back = (_t(3, 2), *gru_in)
    assert gradcheck(LSTMGatesBackward.apply, lstm_back) and gradcheck(GRUGatesBackward.apply, gru_back)


@pytest.mark.parametrize("dtype, rtol", [(np.float32, 1e-5), (np.float64, 1e-12)])
def test_gate_ops_and_their_gradients_equal_torchs(dtype, rtol):
    torch = pytest.importorskip("torch")
    from op_table import _torch_gru_gates, _torch_lstm_gates

    for ours, theirs, shapes in ((lstm_gates, _torch_lstm_gates, ((6, 16), (6, 16), (6, 4))),
                                 (gru_gates, _torch_gru_gates, ((6, 12), (6, 12), (6, 4)))):
        arrays = _arrays(dtype, *shapes)
        ins = [minigrad.tensor(a, requires_grad=True) for a in arrays]
        tins = [torch.tensor(a, requires_grad=True) for a in arrays]
        out, tout = ours(*ins), theirs(*tins)
        out, tout = (out if isinstance(out, tuple) else (out,)), (tout if isinstance(tout, tuple) else (tout,))
        weights = _arrays(dtype, *[o.shape for o in out], scale=1.0)
        sum(((o * minigrad.tensor(w)).sum() for o, w in zip(out, weights)), minigrad.tensor(0.0, dtype=dtype)).backward()
        sum((o * torch.tensor(w)).sum() for o, w in zip(tout, weights)).backward()
        for o, to in zip(out, tout):
            np.testing.assert_allclose(o.detach().numpy(), to.detach().numpy(), rtol=rtol, atol=rtol)
        for x, tx in zip(ins, tins):
            np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=10 * rtol, atol=10 * rtol)


def _log_softmax_lines(monkeypatch, a, dim):
    """LogSoftmax's array forward with the C loop, then with the numpy lines."""
    from minigrad.ops.softmax import LogSoftmax

    fused = LogSoftmax.forward(_Ctx(), a, dim)
    monkeypatch.setattr(c_loops, "_library", [False])
    plain = LogSoftmax.forward(_Ctx(), a, dim)
    monkeypatch.undo()
    return fused, plain


@compiled
@pytest.mark.parametrize("dtype, rtol", [(np.float32, 1e-6), (np.float64, 1e-14)])
@pytest.mark.parametrize("shape", [(7, 2000), (3, 4, 5), (1, 1), (6,)])
def test_log_softmax_loop_equals_the_numpy_lines(monkeypatch, dtype, rtol, shape):
    a = (rng.standard_normal(shape) * 5).astype(dtype)
    assert c_loops.log_softmax(a, a.ndim - 1) is not None  # the loop ran
    fused, plain = _log_softmax_lines(monkeypatch, a, a.ndim - 1)
    assert fused.dtype == dtype
    np.testing.assert_allclose(fused, plain, rtol=rtol, atol=rtol * 10)


@compiled
def test_log_softmax_loop_keeps_numpys_special_values_and_large_logits(monkeypatch):
    nan, inf = np.nan, np.inf
    a = np.array([[nan, 1, 2], [1, nan, 2], [-inf, 0, 1], [inf, 0, 1], [-inf, -inf, -inf], [1e4, -1e4, 1e4]],
                 np.float32)
    with np.errstate(all="ignore"):
        fused, plain = _log_softmax_lines(monkeypatch, a, 1)
    np.testing.assert_array_equal(np.isnan(fused), np.isnan(plain))
    np.testing.assert_allclose(fused[~np.isnan(fused)], plain[~np.isnan(plain)], rtol=1e-7)  # -log 2 kept at 1e4


def test_log_softmax_loop_leaves_other_layouts_to_numpy():
    a = rng.standard_normal((4, 5))
    assert c_loops.log_softmax(a, 0) is None  # not the last axis
    assert c_loops.log_softmax(a.T, 1) is None  # not C-contiguous
    assert c_loops.log_softmax(a.astype(np.float16), 1) is None


def test_log_softmax_and_cross_entropy_gradcheck_either_way(loops):
    x = _t(4, 6)
    target = minigrad.tensor([0, 5, 2, 2])
    assert gradcheck(lambda x: minigrad.log_softmax(x, -1), (x,)) and gradgradcheck(lambda x: minigrad.log_softmax(x, -1), (x,))
    assert gradcheck(lambda x: minigrad.nn.functional.cross_entropy(x, target), (x,))


@pytest.mark.parametrize("dtype, rtol", [(np.float32, 1e-5), (np.float64, 1e-12)])
def test_log_softmax_and_its_gradient_equal_torchs(dtype, rtol):
    torch = pytest.importorskip("torch")
    a = (rng.standard_normal((5, 300)) * 3).astype(dtype)
    w = rng.standard_normal((5, 300)).astype(dtype)
    x, tx = minigrad.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
    y, ty = minigrad.log_softmax(x, 1), torch.log_softmax(tx, 1)
    (y * minigrad.tensor(w)).sum().backward()
    (ty * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(y.detach().numpy(), ty.detach().numpy(), rtol=rtol, atol=rtol)
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=10 * rtol, atol=10 * rtol)


@compiled
@pytest.mark.parametrize("dtype, rtol", [(np.float32, 1e-5), (np.float64, 1e-13)])
@pytest.mark.parametrize("shape", [(4, 3, 5, 6), (6, 3, 7), (8, 3), (1, 2, 1, 1)])
def test_batch_norm_loop_equals_the_numpy_lines(monkeypatch, dtype, rtol, shape):
    from minigrad.ops.normalize import BatchNorm

    x, w, b = _arrays(dtype, shape, shape[1:2], shape[1:2])
    x = x + 3  # a mean far from zero: the variance is taken about it
    dims = (0,) + tuple(range(2, len(shape)))
    fused, plain = _both(monkeypatch, BatchNorm, x, w, b, dims, 1e-5)
    for a, p in zip(fused, plain):
        assert a.dtype == dtype and a.shape == p.shape
        np.testing.assert_allclose(a, p, rtol=rtol, atol=rtol)


@compiled
@pytest.mark.parametrize("slope", [0.2, 0.0, 1.5, -0.3])
def test_leaky_relu_loop_gives_the_numpy_lines_bits(monkeypatch, slope):
    from minigrad.ops.activation import LeakyRelu

    for dtype in (np.float32, np.float64):
        x = _arrays(dtype, (3, 4, 5))[0]
        x[0, 0, :3] = (0.0, -0.0, np.nan)
        for given in (x, x[:, ::2]):  # contiguous (the loop) and strided (numpy's lines, which keep the layout)
            fused, plain = _both(monkeypatch, LeakyRelu, given, slope)
            for a, p in zip(fused, plain):
                assert a.dtype == dtype and a.tobytes() == p.tobytes() and a.strides == p.strides


def test_batch_norm_and_leaky_relu_gradcheck_either_way(loops):
    import minigrad.nn.functional as F

    x, w, b = _t(4, 3, 2, 3), _t(3), _t(3)
    bn = lambda x, w, b: F.leaky_relu(F.batch_norm(x, None, None, w, b, training=True), 0.1)  # noqa: E731
    assert gradcheck(bn, (x, w, b)) and gradgradcheck(bn, (x, w, b))
