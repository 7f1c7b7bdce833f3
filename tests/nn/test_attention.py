"""MultiheadAttention, TransformerEncoderLayer and scaled_dot_product_attention
(minigrad.nn.attention): torch's names, and outputs and gradients equal to torch's with the
weights copied over (float64, dropout off)."""

import numpy as np
import pytest

import minigrad
from minigrad import nn
from minigrad.errors import ShapeError
from minigrad.nn.functional import scaled_dot_product_attention

rng = np.random.default_rng(0)


def _twins(mg_module, torch_module):
    torch_module.double()
    mg_module.double()
    mg_module.load_state_dict({k: minigrad.tensor(v.numpy()) for k, v in torch_module.state_dict().items()})
    return mg_module, torch_module


def _inputs(torch, *shapes):
    arrays = [rng.standard_normal(s) for s in shapes]
    return ([minigrad.tensor(a, requires_grad=True) for a in arrays],
            [torch.tensor(a, requires_grad=True) for a in arrays])


def _check(torch, mg_out, torch_out, mg_inputs, torch_inputs, mg_module=None, torch_module=None):
    np.testing.assert_allclose(mg_out.detach().numpy(), torch_out.detach().numpy(), atol=1e-10)
    w = rng.standard_normal(torch_out.shape)
    (mg_out * minigrad.tensor(w)).sum().backward()
    (torch_out * torch.tensor(w)).sum().backward()
    for m, t in zip(mg_inputs, torch_inputs):
        np.testing.assert_allclose(m.grad.numpy(), t.grad.numpy(), atol=1e-10)
    if mg_module is not None:
        mine = dict(mg_module.named_parameters())
        for name, p in torch_module.named_parameters():
            np.testing.assert_allclose(mine[name].grad.numpy(), p.grad.numpy(), atol=1e-10, err_msg=name)


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


def test_multihead_attention_names_and_init_match_torch(torch):
    mine, ref = nn.MultiheadAttention(8, 2), torch.nn.MultiheadAttention(8, 2)
    assert [(k, tuple(v.shape)) for k, v in mine.state_dict().items()] == \
           [(k, tuple(v.shape)) for k, v in ref.state_dict().items()]
    assert not mine.in_proj_bias.detach().numpy().any() and not mine.out_proj.bias.detach().numpy().any()
    bound = np.sqrt(6 / (8 + 24))  # xavier_uniform_ on the (3E, E) in_proj_weight
    assert np.abs(mine.in_proj_weight.detach().numpy()).max() <= bound
    layer = nn.TransformerEncoderLayer(8, 2, 16)
    assert list(layer.state_dict()) == list(torch.nn.TransformerEncoderLayer(8, 2, 16).state_dict())


@pytest.mark.parametrize("batch_first", [False, True])
def test_self_attention_matches_torch(torch, batch_first):
    mine, ref = _twins(nn.MultiheadAttention(8, 2, batch_first=batch_first),
                       torch.nn.MultiheadAttention(8, 2, batch_first=batch_first))
    (mx,), (tx,) = _inputs(torch, (3, 5, 8))
    (out, w), (tout, tw) = mine(mx, mx, mx), ref(tx, tx, tx)
    np.testing.assert_allclose(w.detach().numpy(), tw.detach().numpy(), atol=1e-12)
    _check(torch, out, tout, [mx], [tx], mine, ref)


def test_cross_attention_with_masks_matches_torch(torch):
    mine, ref = _twins(nn.MultiheadAttention(6, 3), torch.nn.MultiheadAttention(6, 3))
    mq, tq = _inputs(torch, (4, 2, 6))
    mkv, tkv = _inputs(torch, (5, 2, 6), (5, 2, 6))
    padding = np.array([[False] * 5, [False, False, False, True, True]])
    causal = np.triu(np.ones((4, 5), dtype=bool), 1)
    kw = dict(need_weights=True, average_attn_weights=False)
    out, w = mine(mq[0], *mkv, key_padding_mask=minigrad.tensor(padding), attn_mask=minigrad.tensor(causal), **kw)
    tout, tw = ref(tq[0], *tkv, key_padding_mask=torch.tensor(padding), attn_mask=torch.tensor(causal), **kw)
    assert w.shape == (2, 3, 4, 5)
    np.testing.assert_allclose(w.detach().numpy(), tw.detach().numpy(), atol=1e-12)
    _check(torch, out, tout, mq + mkv, tq + tkv, mine, ref)


def test_float_mask_and_unbatched_match_torch(torch):
    mine, ref = _twins(nn.MultiheadAttention(4, 1, bias=False), torch.nn.MultiheadAttention(4, 1, bias=False))
    (mx,), (tx,) = _inputs(torch, (3, 4))
    mask = rng.standard_normal((3, 3))
    out, w = mine(mx, mx, mx, attn_mask=minigrad.tensor(mask))
    tout, tw = ref(tx, tx, tx, attn_mask=torch.tensor(mask))
    assert out.shape == (3, 4) and w.shape == (3, 3)
    _check(torch, out, tout, [mx], [tx], mine, ref)
    assert mine(mx, mx, mx, need_weights=False)[1] is None


@pytest.mark.parametrize("norm_first, activation", [(False, "relu"), (True, "gelu")])
def test_transformer_encoder_layer_matches_torch(torch, norm_first, activation):
    kw = dict(dim_feedforward=16, dropout=0.0, activation=activation, batch_first=True, norm_first=norm_first)
    mine, ref = _twins(nn.TransformerEncoderLayer(8, 2, **kw), torch.nn.TransformerEncoderLayer(8, 2, **kw))
    (mx,), (tx,) = _inputs(torch, (2, 5, 8))
    padding = np.array([[False] * 5, [False] * 3 + [True] * 2])
    out = mine(mx, src_key_padding_mask=minigrad.tensor(padding))
    tout = ref(tx, src_key_padding_mask=torch.tensor(padding))
    _check(torch, out, tout, [mx], [tx], mine, ref)


def test_encoder_layer_dropout_is_off_in_eval():
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.5)
    x = minigrad.randn(4, 2, 8)
    assert not np.allclose(layer(x).detach().numpy(), layer(x).detach().numpy())
    layer.eval()
    np.testing.assert_array_equal(layer(x).detach().numpy(), layer(x).detach().numpy())


def test_scaled_dot_product_attention_matches_torch(torch):
    mi, ti = _inputs(torch, (2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 7))
    _check(torch, scaled_dot_product_attention(*mi, is_causal=True),
           torch.nn.functional.scaled_dot_product_attention(*ti, is_causal=True), mi, ti)
    allowed = rng.random((4, 6)) > 0.3
    allowed[:, 0] = True
    mi, ti = _inputs(torch, (2, 4, 5), (2, 6, 5), (2, 6, 7))
    _check(torch, scaled_dot_product_attention(*mi, attn_mask=minigrad.tensor(allowed), scale=0.3),
           torch.nn.functional.scaled_dot_product_attention(*ti, attn_mask=torch.tensor(allowed), scale=0.3), mi, ti)


def test_attention_bad_inputs_name_expected_and_actual():
    with pytest.raises(ValueError, match=r"embed_dim \(10\) must be divisible by num_heads \(3\)"):
        nn.MultiheadAttention(10, 3)
    mha = nn.MultiheadAttention(8, 2)
    x = minigrad.randn(3, 2, 8)
    with pytest.raises(ShapeError, match=r"expected key with 3 dims and last dim embed_dim=8.*got \(3, 2, 6\)"):
        mha(x, minigrad.randn(3, 2, 6), minigrad.randn(3, 2, 6))
    with pytest.raises(ShapeError, match=r"key_padding_mask should have shape \(2, 3\), got \(3, 2\)"):
        mha(x, x, x, key_padding_mask=minigrad.zeros(3, 2).bool())
    with pytest.raises(ShapeError, match=r"attn_mask should have shape \(3, 3\) or \(4, 3, 3\), got \(2, 3\)"):
        mha(x, x, x, attn_mask=minigrad.zeros(2, 3))
