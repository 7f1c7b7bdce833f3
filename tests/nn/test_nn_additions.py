"""The layers a real program reaches for after the basics: ConvTranspose1d/2d, Dropout1d/2d/3d,
SmoothL1Loss/HuberLoss, LSTM.flatten_parameters and the Transformer family. Each has torch's
parameter layout; gradients are checked by finite differences in float64 and, where torch is
installed, outputs and gradients are compared with torch's module on the same weights.
(The functional forms have rows in ``op_table.py``.)"""

import math

import numpy as np
import pytest

import minigrad as mg
from minigrad import nn
from minigrad.autograd import gradcheck
from minigrad.errors import ShapeError


def _copy_from_torch(ours: nn.Module, theirs) -> None:
    """Load torch's state dict into ours (same names and shapes, or the test fails)."""
    state = {k: mg.tensor(v.detach().numpy()) for k, v in theirs.state_dict().items()}
    result = ours.load_state_dict(state)
    assert not result.missing_keys and not result.unexpected_keys


def _compare_with_torch(ours, theirs, inputs, call=lambda m, *x: m(*x), rtol=1e-9):
    """Same output and same parameter and input gradients (float64) for one forward + backward."""
    import torch

    ours.double() if hasattr(ours, "double") else None
    theirs.double()
    _copy_from_torch(ours, theirs)
    xs = [mg.tensor(a, requires_grad=a.dtype.kind == "f") for a in inputs]
    ts = [torch.tensor(a, requires_grad=a.dtype.kind == "f") for a in inputs]
    out, ref = call(ours, *xs), call(theirs, *ts)
    np.testing.assert_allclose(out.detach().numpy(), ref.detach().numpy(), rtol=rtol, atol=1e-10)
    weights = np.random.default_rng(0).standard_normal(tuple(ref.shape))
    (out * mg.tensor(weights)).sum().backward()
    (ref * torch.tensor(weights)).sum().backward()
    theirs_params = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), theirs_params[name].grad.numpy(), rtol=rtol, atol=1e-10,
                                   err_msg=name)
    for x, t in zip(xs, ts):
        if x.requires_grad:
            np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=rtol, atol=1e-10)


# -- transposed convolution ------------------------------------------------------------------------
@pytest.mark.parametrize("cls,kwargs,shape", [
    ("ConvTranspose2d", dict(in_channels=4, out_channels=6, kernel_size=3, stride=2, padding=1, output_padding=1,
                             groups=2, dilation=1), (2, 4, 3, 3)),
    ("ConvTranspose2d", dict(in_channels=2, out_channels=3, kernel_size=(2, 3), stride=(1, 2), dilation=2,
                             bias=False), (1, 2, 4, 3)),
    ("ConvTranspose1d", dict(in_channels=3, out_channels=4, kernel_size=3, stride=2, padding=1, output_padding=1),
     (2, 3, 5)),
    ("ConvTranspose1d", dict(in_channels=4, out_channels=2, kernel_size=2, groups=2, dilation=3), (4, 6)),
])
def test_conv_transpose_matches_torch_and_finite_differences(cls, kwargs, shape):
    layer = getattr(nn, cls)(**kwargs).double()
    x = mg.randn(*shape, dtype=mg.float64, requires_grad=True)
    params = [p for p in layer.parameters()]
    assert gradcheck(lambda x, *ps: layer(x), [x, *params])
    torch = pytest.importorskip("torch")
    theirs = getattr(torch.nn, cls)(**kwargs)
    assert {k: tuple(v.shape) for k, v in layer.state_dict().items()} == \
           {k: tuple(v.shape) for k, v in theirs.state_dict().items()}
    _compare_with_torch(getattr(nn, cls)(**kwargs), theirs, [np.random.default_rng(1).standard_normal(shape)])


def test_conv_transpose_init_follows_torchs_bounds():
    layer = nn.ConvTranspose2d(8, 4, 3, groups=2)
    bound = 1 / math.sqrt(4 // 2 * 9)  # fan_in of the (in, out/groups, kH, kW) weight
    assert layer.weight.shape == (8, 2, 3, 3)
    assert float(layer.weight.abs().max()) <= bound and float(layer.bias.abs().max()) <= bound
    assert float(layer.weight.abs().max()) > bound * 0.8


def test_conv_transpose_output_size_picks_the_output_padding():
    layer = nn.ConvTranspose2d(1, 1, 3, stride=2, padding=1)
    x = mg.randn(1, 1, 4, 4)
    assert layer(x).shape == (1, 1, 7, 7)
    assert layer(x, output_size=(8, 8)).shape == (1, 1, 8, 8)
    assert layer(x, output_size=[1, 1, 8, 7]).shape == (1, 1, 8, 7)
    with pytest.raises(ValueError, match="valid sizes range from 7 to 8"):
        layer(x, output_size=(9, 9))
    assert nn.ConvTranspose1d(1, 1, 3, stride=2)(mg.randn(1, 1, 4), output_size=(10,)).shape == (1, 1, 10)


def test_conv_transpose_refuses_bad_arguments():
    with pytest.raises(ValueError, match="divisible by groups"):
        nn.ConvTranspose2d(3, 4, 2, groups=2)
    with pytest.raises(ValueError, match='Only "zeros" padding mode'):
        nn.ConvTranspose1d(2, 2, 2, padding_mode="reflect")
    with pytest.raises(ShapeError, match="conv_transpose1d: expected a 2-D or 3-D input"):
        nn.ConvTranspose1d(2, 2, 2)(mg.randn(1, 2, 3, 3))


# -- channel dropout -------------------------------------------------------------------------------
@pytest.mark.parametrize("cls,shape", [("Dropout1d", (4, 6, 5)), ("Dropout2d", (4, 6, 3, 3)),
                                       ("Dropout3d", (4, 6, 2, 2, 2)), ("Dropout2d", (6, 3, 3))])
def test_channel_dropout_zeroes_whole_channels_and_scales_the_rest(cls, shape):
    layer = getattr(nn, cls)(p=0.5)
    x = (mg.rand(*shape, dtype=mg.float64) + 1.0).requires_grad_()
    y = layer(x)
    batched = {"Dropout1d": 3, "Dropout2d": 4, "Dropout3d": 5}[cls] == len(shape)
    ratio = (y / x).detach().numpy().reshape(shape[:2 if batched else 1] + (-1,))
    assert set(np.unique(ratio)) <= {0.0, 2.0}
    assert (ratio.min(-1) == ratio.max(-1)).all()  # one decision per channel
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), (y / x).detach().numpy())
    layer.eval()
    assert layer(x) is x


def test_channel_dropout_keeps_the_mean_and_checks_its_input():
    y = nn.Dropout2d(0.25)(mg.ones(200, 50, 1, 1))
    assert abs(float(y.mean()) - 1.0) < 0.05
    assert float(nn.Dropout1d(1.0)(mg.ones(2, 3, 4)).abs().sum()) == 0.0
    with pytest.raises(ShapeError, match="dropout1d: expected a 2-D \\(unbatched\\) or 3-D \\(batched\\) input"):
        nn.Dropout1d()(mg.ones(1, 2, 3, 4))
    with pytest.raises(ValueError, match="between 0 and 1"):
        nn.Dropout3d(1.5)


def test_dropout2d_takes_a_2d_input_as_torch_does_with_a_warning():
    # pytorch/examples mnist_rnn applies Dropout2d to (N, C) features: torch warns and drops entries
    mg.manual_seed(0)
    with pytest.warns(UserWarning, match="dropout2d: received a 2-D input, which PyTorch deprecates"):
        y = nn.Dropout2d(0.5)(mg.ones(64, 32)).numpy()
    assert set(np.unique(y)) == {0.0, 2.0} and 0.3 < (y == 0).mean() < 0.7
    assert (y == 0).any(axis=1).all() and not (y == 0).all(axis=1).any()  # entries dropped, not whole rows
    with pytest.warns(UserWarning):
        assert nn.Dropout2d(0.5).eval()(mg.ones(4, 3)).tolist() == [[1.0] * 3] * 4


# -- regression losses ------------------------------------------------------------------------------
@pytest.mark.parametrize("cls,kwargs", [("SmoothL1Loss", {}), ("SmoothL1Loss", dict(beta=0.3, reduction="sum")),
                                        ("HuberLoss", dict(delta=0.4)), ("HuberLoss", dict(reduction="none"))])
def test_robust_losses_match_torch(cls, kwargs):
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((5, 3)), rng.standard_normal((5, 3))
    x = mg.tensor(a, requires_grad=True)
    loss = getattr(nn, cls)(**kwargs)(x, mg.tensor(b))
    assert gradcheck(lambda x: getattr(nn, cls)(**kwargs)(x, mg.tensor(b)), [mg.tensor(a, requires_grad=True)])
    torch = pytest.importorskip("torch")
    tx = torch.tensor(a, requires_grad=True)
    ref = getattr(torch.nn, cls)(**kwargs)(tx, torch.tensor(b))
    np.testing.assert_allclose(loss.detach().numpy(), ref.detach().numpy(), rtol=1e-12)
    loss.sum().backward()
    ref.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-12)


def test_huber_is_delta_times_smooth_l1():
    x, y = mg.randn(20, dtype=mg.float64), mg.randn(20, dtype=mg.float64)
    np.testing.assert_allclose(nn.HuberLoss(delta=0.7)(x, y).item(), 0.7 * nn.SmoothL1Loss(beta=0.7)(x, y).item())


# -- LSTM.flatten_parameters ------------------------------------------------------------------------
def test_lstm_flatten_parameters_changes_nothing():
    lstm = nn.LSTM(3, 4)
    before = {k: v.numpy().copy() for k, v in lstm.state_dict().items()}
    assert lstm.flatten_parameters() is None
    assert all(np.array_equal(before[k], v.numpy()) for k, v in lstm.state_dict().items())


# -- Transformer --------------------------------------------------------------------------------------
def _causal(n):
    return nn.Transformer.generate_square_subsequent_mask(n)


def test_transformer_matches_torch_on_the_same_weights():
    torch = pytest.importorskip("torch")
    cfg = dict(d_model=8, nhead=2, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=16, dropout=0.0)
    rng = np.random.default_rng(3)
    src, tgt = rng.standard_normal((5, 2, 8)), rng.standard_normal((4, 2, 8))
    src_pad = np.array([[False] * 5, [False, False, False, True, True]])

    def call(m, s, t):
        lib = torch if isinstance(s, torch.Tensor) else mg
        mask = m.generate_square_subsequent_mask(4, dtype=lib.float64)
        pad = lib.tensor(src_pad)
        return m(s, t, tgt_mask=mask, src_key_padding_mask=pad, memory_key_padding_mask=pad)

    _compare_with_torch(nn.Transformer(**cfg), torch.nn.Transformer(**cfg), [src, tgt], call, rtol=1e-8)


@pytest.mark.parametrize("norm_first,batch_first", [(False, False), (True, True)])
def test_decoder_stack_matches_torch(norm_first, batch_first):
    torch = pytest.importorskip("torch")
    kw = dict(d_model=6, nhead=3, dim_feedforward=10, dropout=0.0, norm_first=norm_first, batch_first=batch_first,
              activation="gelu")
    ours = nn.TransformerDecoder(nn.TransformerDecoderLayer(**kw), 2, nn.LayerNorm(6))
    theirs = torch.nn.TransformerDecoder(torch.nn.TransformerDecoderLayer(**kw), 2, torch.nn.LayerNorm(6))
    rng = np.random.default_rng(4)
    tgt, memory = rng.standard_normal((2, 3, 6)), rng.standard_normal((2, 5, 6))
    if not batch_first:
        tgt, memory = tgt.transpose(1, 0, 2).copy(), memory.transpose(1, 0, 2).copy()

    def call(m, t, mem):
        lib = torch if isinstance(t, torch.Tensor) else mg
        return m(t, mem, tgt_mask=lib.tensor(np.triu(np.ones((3, 3), bool), 1)), tgt_is_causal=True)

    _compare_with_torch(ours, theirs, [tgt, memory], call)


def test_transformer_gradients_by_finite_differences():
    mg.manual_seed(0)
    model = nn.Transformer(d_model=4, nhead=2, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=6,
                           dropout=0.0).double()
    src, tgt = mg.randn(3, 1, 4, dtype=mg.float64, requires_grad=True), mg.randn(2, 1, 4, dtype=mg.float64,
                                                                                 requires_grad=True)
    assert gradcheck(lambda s, t: model(s, t, tgt_mask=_causal(2).double()), [src, tgt])


def test_transformer_shapes_names_and_errors():
    model = nn.Transformer(d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=2, dim_feedforward=8,
                           batch_first=True)
    assert model(mg.randn(2, 5, 8), mg.randn(2, 3, 8)).shape == (2, 3, 8)
    names = set(model.state_dict())
    assert {"encoder.layers.0.self_attn.in_proj_weight", "decoder.layers.1.multihead_attn.out_proj.weight",
            "decoder.layers.1.norm3.bias", "encoder.norm.weight", "decoder.norm.weight"} <= names
    assert len(model.decoder.layers) == 2 and model.decoder.layers[0].linear1 is not model.decoder.layers[1].linear1
    with pytest.raises(ShapeError, match="the batch number of src and tgt must be equal"):
        model(mg.randn(2, 5, 8), mg.randn(3, 3, 8))
    with pytest.raises(ShapeError, match="must be equal to d_model=8"):
        model(mg.randn(2, 5, 8), mg.randn(2, 3, 6))
    with pytest.raises(ValueError, match="activation should be 'relu' or 'gelu'"):
        nn.TransformerDecoderLayer(4, 2, activation="tanh")
    assert _causal(3).tolist() == [[0.0, -math.inf, -math.inf], [0.0, 0.0, -math.inf], [0.0, 0.0, 0.0]]


def test_a_compiled_step_draws_a_fresh_channel_mask_every_call():
    import minigrad.nn.functional as F

    step = mg.compile(lambda x: F.dropout2d(x, 0.5).sum(dim=(2, 3)))
    x = mg.ones(8, 16, 2, 2)
    masks = [step(x).numpy() for _ in range(3)]
    assert all(set(np.unique(m)) <= {0.0, 8.0} for m in masks)  # 4 pixels, each 1 / (1 - p) = 2
    assert not np.array_equal(masks[0], masks[1]) or not np.array_equal(masks[1], masks[2])
