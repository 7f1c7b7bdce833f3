"""RNN, GRU, RNNCell and GRUCell (minigrad.nn.recurrent): gradients checked in float64, torch's
parameter names and shapes, outputs and gradients equal to torch's with the weights copied over,
and errors that name what was expected (the RNN_TANH and GRU models of PyTorch's word_language_model run)."""

import numpy as np
import pytest

import minigrad
from minigrad import nn
from minigrad.autograd import gradcheck, gradgradcheck
from minigrad.errors import ShapeError

rng = np.random.default_rng(0)


def _x(*shape):
    return minigrad.tensor(rng.standard_normal(shape), dtype=minigrad.float64, requires_grad=True)


@pytest.mark.parametrize("make", [
    lambda: nn.RNN(3, 4, num_layers=2, nonlinearity="tanh", bidirectional=True),
    lambda: nn.RNN(3, 4, nonlinearity="relu", batch_first=True),
    lambda: nn.GRU(3, 4, num_layers=2),
    lambda: nn.GRU(3, 4, bias=False, bidirectional=True),
])
def test_rnn_and_gru_gradcheck_through_time(make):
    minigrad.manual_seed(0)
    model = make().double()
    weights = list(model.parameters())
    x = _x(2, 5, 3) if model.batch_first else _x(5, 2, 3)
    h0 = _x(model.num_layers * (2 if model.bidirectional else 1), 2, 4)
    assert gradcheck(lambda x, h0: sum(t.sum() for t in model(x, h0)), (x, h0))
    out, h_n = model(x, h0)
    (out.pow(2).sum() + h_n.sum()).backward()
    assert all(p.grad is not None and np.isfinite(p.grad.numpy()).all() for p in weights)


@pytest.mark.parametrize("cell", [nn.RNNCell(3, 4), nn.RNNCell(3, 4, nonlinearity="relu"), nn.GRUCell(3, 4)])
def test_cells_gradcheck_and_take_unbatched_input(cell):
    cell.double()
    x, h = _x(2, 3), _x(2, 4)
    assert gradcheck(lambda x, h: cell(x, h), (x, h))
    assert tuple(cell(x[0].detach()).shape) == (4,)


@pytest.mark.parametrize("step, gates", [(nn.recurrent.rnn_cell, 1), (nn.recurrent.gru_cell, 3)])
def test_one_step_gradcheck_in_its_weights(step, gates):
    x, h = _x(2, 3), _x(2, 4)
    w_ih, w_hh, b_ih, b_hh = _x(gates * 4, 3), _x(gates * 4, 4), _x(gates * 4), _x(gates * 4)
    assert gradcheck(step, (x, h, w_ih, w_hh, b_ih, b_hh))


def test_names_and_shapes_are_torchs():
    gru = nn.GRU(3, 5, num_layers=2, bidirectional=True)
    shapes = {k: tuple(v.shape) for k, v in gru.state_dict().items()}
    assert shapes["weight_ih_l0"] == (15, 3) and shapes["weight_hh_l1_reverse"] == (15, 5)
    assert shapes["weight_ih_l1"] == (15, 10) and shapes["bias_hh_l0"] == (15,)
    assert set(nn.RNNCell(3, 4).state_dict()) == {"weight_ih", "weight_hh", "bias_ih", "bias_hh"}
    bound = 1 / np.sqrt(5)
    assert all(np.abs(p.detach().numpy()).max() <= bound for p in gru.parameters())


@pytest.mark.parametrize("name, kw", [
    ("RNN", dict(num_layers=2, nonlinearity="relu", bidirectional=True)),
    ("RNN", dict(batch_first=True)),
    ("GRU", dict(num_layers=2, batch_first=True)),
    ("GRU", dict(bidirectional=True, bias=False)),
])
def test_matches_torch_with_the_same_weights(name, kw):
    torch = pytest.importorskip("torch")
    t = getattr(torch.nn, name)(3, 4, **kw).double()
    m = getattr(nn, name)(3, 4, **kw).double()
    m.load_state_dict({k: minigrad.tensor(v.numpy()) for k, v in t.state_dict().items()})
    x = rng.standard_normal((2, 5, 3) if kw.get("batch_first") else (5, 2, 3))
    (om, hm), (ot, ht) = m(minigrad.tensor(x)), t(torch.tensor(x))
    np.testing.assert_allclose(om.detach().numpy(), ot.detach().numpy(), atol=1e-12)
    np.testing.assert_allclose(hm.detach().numpy(), ht.detach().numpy(), atol=1e-12)
    (om.pow(2).sum() + hm.sum()).backward()
    (ot.pow(2).sum() + ht.sum()).backward()
    grads = dict(t.named_parameters())
    for n, p in m.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), grads[n].grad.numpy(), atol=1e-10, err_msg=n)


@pytest.mark.parametrize("name", ["RNNCell", "GRUCell"])
def test_cells_match_torch(name):
    torch = pytest.importorskip("torch")
    t = getattr(torch.nn, name)(3, 4).double()
    m = getattr(nn, name)(3, 4).double()
    m.load_state_dict({k: minigrad.tensor(v.numpy()) for k, v in t.state_dict().items()})
    x, h = rng.standard_normal((2, 3)), rng.standard_normal((2, 4))
    np.testing.assert_allclose(m(minigrad.tensor(x), minigrad.tensor(h)).detach().numpy(),
                               t(torch.tensor(x), torch.tensor(h)).detach().numpy(), atol=1e-12)


def test_bad_inputs_name_expected_and_actual():
    with pytest.raises(ShapeError, match=r"GRU: expected input of shape \(L, N, input_size\).*got \(5, 2, 7\)"):
        nn.GRU(3, 4)(minigrad.zeros(5, 2, 7))
    with pytest.raises(ShapeError, match=r"RNN: expected h_0 of shape \(1, 2, 4\), got \(2, 2, 4\)"):
        nn.RNN(3, 4)(minigrad.zeros(5, 2, 3), minigrad.zeros(2, 2, 4))
    with pytest.raises(ShapeError, match=r"GRUCell: expected hx of shape \(2, 4\)"):
        nn.GRUCell(3, 4)(minigrad.zeros(2, 3), minigrad.zeros(3, 4))
    with pytest.raises(ValueError, match="nonlinearity must be 'tanh' or 'relu', got 'sigmoid'"):
        nn.RNN(3, 4, nonlinearity="sigmoid")


def test_gru_gates_backward_uses_forwards_activations_and_differentiates_again():
    """GRUGates hands r, z and n to its backward op; given or recomputed, the gradients are the
    same, and the backward op's own backward is right (third derivatives of a step)."""
    from minigrad.ops.recurrent import GRUGates, GRUGatesBackward
    t = [_x(*s) for s in ((2, 4), (2, 12), (2, 12), (2, 4))]  # g, gx, gh, h
    given = minigrad.grad((GRUGates.apply(*t[1:]) * t[0]).sum(), t[1:])
    recomputed = GRUGatesBackward.apply(*t)
    for a, b in zip(given, recomputed):
        np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=1e-14)
    assert gradcheck(GRUGatesBackward.apply, t) and gradgradcheck(GRUGatesBackward.apply, t)
