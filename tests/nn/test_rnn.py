"""LSTMCell and LSTM (minigrad.nn.rnn): torch's parameter names and init, and outputs and
gradients equal to torch's with the weights copied over (float64)."""

import math

import numpy as np
import pytest

import minigrad
from minigrad import nn
from minigrad.autograd import gradcheck, gradgradcheck
from minigrad.errors import ShapeError

rng = np.random.default_rng(0)


def _twins(mg_module, torch_module):
    """Copy torch's float64 weights into the minigrad module (also checks the names match)."""
    torch_module.double()
    mg_module.double()
    mg_module.load_state_dict({k: minigrad.tensor(v.numpy()) for k, v in torch_module.state_dict().items()})
    return mg_module, torch_module


def _assert_grads_match(mg_module, torch_module, atol=1e-10):
    mg_params = dict(mg_module.named_parameters())
    for name, p in torch_module.named_parameters():
        np.testing.assert_allclose(mg_params[name].grad.numpy(), p.grad.numpy(), atol=atol, err_msg=name)


def test_lstm_parameter_names_shapes_and_init_match_torch():
    torch = pytest.importorskip("torch")
    mine = nn.LSTM(5, 7, num_layers=2, bidirectional=True)
    ref = torch.nn.LSTM(5, 7, num_layers=2, bidirectional=True)
    assert [(k, tuple(v.shape)) for k, v in mine.state_dict().items()] == \
           [(k, tuple(v.shape)) for k, v in ref.state_dict().items()]
    bound = 1 / math.sqrt(7)
    for p in mine.parameters():
        a = p.detach().numpy()
        assert p.requires_grad and np.abs(a).max() <= bound and a.std() > bound / 4
    assert list(dict(nn.LSTMCell(3, 4, bias=False).named_parameters())) == ["weight_ih", "weight_hh"]
    assert repr(mine) == repr(ref)


def test_lstm_cell_matches_torch():
    torch = pytest.importorskip("torch")
    mine, ref = _twins(nn.LSTMCell(4, 6), torch.nn.LSTMCell(4, 6))
    x, h, c = rng.standard_normal((3, 4)), rng.standard_normal((3, 6)), rng.standard_normal((3, 6))
    mx, mh, mc = (minigrad.tensor(a, requires_grad=True) for a in (x, h, c))
    tx, th, tc = (torch.tensor(a, requires_grad=True) for a in (x, h, c))
    (h1, c1), (th1, tc1) = mine(mx, (mh, mc)), ref(tx, (th, tc))
    np.testing.assert_allclose(h1.detach().numpy(), th1.detach().numpy(), atol=1e-12)
    np.testing.assert_allclose(c1.detach().numpy(), tc1.detach().numpy(), atol=1e-12)
    (h1.sum() * 2 + (c1 * c1).sum()).backward()
    (th1.sum() * 2 + (tc1 * tc1).sum()).backward()
    for m, t in ((mx, tx), (mh, th), (mc, tc)):
        np.testing.assert_allclose(m.grad.numpy(), t.grad.numpy(), atol=1e-10)
    _assert_grads_match(mine, ref)
    h0, _ = mine(minigrad.tensor(x[0]))  # unbatched input, zero initial state
    assert h0.shape == (6,)


@pytest.mark.parametrize("kw, batch_first, with_state", [
    (dict(num_layers=1), False, False),
    (dict(num_layers=2, bias=False), False, True),
    (dict(num_layers=2, bidirectional=True, batch_first=True), True, True),
])
def test_lstm_matches_torch(kw, batch_first, with_state):
    torch = pytest.importorskip("torch")
    mine, ref = _twins(nn.LSTM(3, 5, **kw), torch.nn.LSTM(3, 5, **kw))
    layers = kw.get("num_layers", 1) * (2 if kw.get("bidirectional") else 1)
    x = rng.standard_normal((2, 6, 3) if batch_first else (6, 2, 3))
    state = [rng.standard_normal((layers, 2, 5)) for _ in range(2)] if with_state else []
    mx, *ms = (minigrad.tensor(a, requires_grad=True) for a in [x, *state])
    tx, *ts = (torch.tensor(a, requires_grad=True) for a in [x, *state])
    out, (h, c) = mine(mx, tuple(ms) if ms else None)
    tout, (th, tc) = ref(tx, tuple(ts) if ts else None)
    for a, b in ((out, tout), (h, th), (c, tc)):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), atol=1e-12)
    w = rng.standard_normal(tout.shape)
    ((out * minigrad.tensor(w)).sum() + h.sum() + (c * c).sum()).backward()
    ((tout * torch.tensor(w)).sum() + th.sum() + (tc * tc).sum()).backward()
    for m, t in zip([mx, *ms], [tx, *ts]):
        np.testing.assert_allclose(m.grad.numpy(), t.grad.numpy(), atol=1e-10)
    _assert_grads_match(mine, ref)


def test_lstm_unbatched_and_any_length():
    torch = pytest.importorskip("torch")
    mine, ref = _twins(nn.LSTM(2, 3), torch.nn.LSTM(2, 3))
    for length in (1, 4, 9):  # each length unrolls its own graph
        x = rng.standard_normal((length, 2))
        out, (h, c) = mine(minigrad.tensor(x))
        tout, (th, _) = ref(torch.tensor(x))
        assert out.shape == (length, 3) and h.shape == (1, 3)
        np.testing.assert_allclose(out.detach().numpy(), tout.detach().numpy(), atol=1e-12)


def test_lstm_gradcheck_and_dropout_between_layers():
    cell = nn.LSTMCell(2, 3).double()
    x, h, c = (minigrad.tensor(rng.standard_normal(shape), requires_grad=True) for shape in ((2, 2), (2, 3), (2, 3)))
    assert gradcheck(lambda x, h, c, w: nn.rnn.lstm_cell(x, h, c, w, cell.weight_hh, cell.bias_ih, cell.bias_hh),
                     (x, h, c, cell.weight_ih))
    lstm = nn.LSTM(2, 3, num_layers=2, dropout=0.5)
    x = minigrad.randn(4, 1, 2)
    a, b = lstm(x)[0], lstm(x)[0]
    assert not np.allclose(a.detach().numpy(), b.detach().numpy())  # dropout differs per call in training
    lstm.eval()
    np.testing.assert_array_equal(lstm(x)[0].detach().numpy(), lstm(x)[0].detach().numpy())
    with pytest.warns(UserWarning, match="num_layers=1"):
        nn.LSTM(2, 3, dropout=0.5)


def test_lstm_bad_inputs_name_expected_and_actual():
    lstm = nn.LSTM(4, 3, num_layers=2)
    with pytest.raises(ShapeError, match=r"input_size=4, got \(5, 2, 6\)"):
        lstm(minigrad.randn(5, 2, 6))
    with pytest.raises(ShapeError, match=r"h_0 of shape \(2, 2, 3\), got \(1, 2, 3\)"):
        lstm(minigrad.randn(5, 2, 4), (minigrad.zeros(1, 2, 3), minigrad.zeros(1, 2, 3)))
    with pytest.raises(ShapeError, match=r"LSTMCell: expected input of shape \(batch, 4\).*got \(2, 5\)"):
        nn.LSTMCell(4, 3)(minigrad.randn(2, 5))


def test_lstm_through_time_is_twice_differentiable():
    minigrad.manual_seed(0)
    lstm = nn.LSTM(2, 3, num_layers=2, bidirectional=True).double()
    x = minigrad.tensor(rng.standard_normal((4, 2, 2)), requires_grad=True)
    state = tuple(minigrad.tensor(rng.standard_normal((4, 2, 3)), requires_grad=True) for _ in range(2))
    assert gradcheck(lambda x, h, c: lstm(x, (h, c))[0], (x, *state))
    assert gradgradcheck(lambda x, h, c: lstm(x, (h, c))[1][1], (x, *state))


@pytest.mark.parametrize("make", [lambda: nn.LSTM(3, 4), lambda: nn.GRU(3, 4), lambda: nn.RNN(3, 4)])
def test_a_step_of_the_sequence_loop_records_a_few_nodes(make):
    """Each time step adds its product with weight_hh and its gate op (an RNN: the add and the
    tanh) to the graph, not a node per gate: the input's projection, its split into steps and the
    joined outputs are one node each for the whole sequence."""
    def nodes(length):
        out, _ = make()(minigrad.randn(length, 2, 3))
        seen, todo = set(), [out.grad_fn]
        while todo:
            fn = todo.pop()
            if fn is not None and fn not in seen:
                seen.add(fn)
                todo.extend(e[0] for e in fn.next_functions if e is not None)
        return len(seen)

    assert nodes(9) - nodes(5) <= 4 * 3


def test_lstm_gates_backward_uses_forwards_activations_and_differentiates_again():
    """LSTMGates hands its activations to its backward op; given or recomputed, the gradients
    are the same, and the backward op's own backward is right (third derivatives of a step)."""
    from minigrad.ops.recurrent import LSTMGates, LSTMGatesBackward
    shapes = ((2, 3), (2, 3), (2, 12), (2, 12), (2, 3))  # dh, dc, xg, hg, c
    t = [minigrad.tensor(rng.standard_normal(s), requires_grad=True) for s in shapes]
    h, c = LSTMGates.apply(*t[2:])
    given = minigrad.grad((h * t[0]).sum() + (c * t[1]).sum(), t[2:])
    recomputed = LSTMGatesBackward.apply(*t)
    np.testing.assert_allclose(given[0].numpy(), recomputed[0].detach().numpy(), rtol=1e-14)
    np.testing.assert_allclose(given[2].numpy(), recomputed[1].detach().numpy(), rtol=1e-14)
    assert gradcheck(LSTMGatesBackward.apply, t) and gradgradcheck(LSTMGatesBackward.apply, t)
