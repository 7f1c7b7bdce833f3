"""Every ``nn`` layer on a batch of 0 and on zero-size features behaves as PyTorch: empty outputs
of the right shape (``Linear(0, n)`` gives its bias, a mean loss of nothing is NaN, a sum 0), an
empty batch in training leaves BatchNorm's running statistics as they were, and backward gives
gradients of the parameters' shapes. Each case is checked against known expectations, and
against torch (outputs, gradients, buffers) where it is installed; every layer ``minigrad.nn``
exports has a case."""

import inspect
import math
import warnings
from typing import Any, Callable, NamedTuple

import numpy as np
import pytest

import minigrad as mg
from minigrad import nn


class Case(NamedTuple):
    name: str
    make: Callable[[Any], Any]  # the nn module (minigrad's or torch's) -> the layer
    inputs: list  # (shape, "float" | "index") per input
    shapes: list  # the expected shape of each output (outputs flattened)


F, I = "float", "index"
CASES = [
    Case("Linear", lambda n: n.Linear(3, 4), [((0, 3), F)], [(0, 4)]),
    Case("Linear", lambda n: n.Linear(0, 4), [((2, 0), F)], [(2, 4)]),
    Case("Linear", lambda n: n.Linear(3, 0), [((2, 3), F)], [(2, 0)]),
    Case("Linear", lambda n: n.Linear(0, 4), [((0, 0), F)], [(0, 4)]),
    Case("Conv2d", lambda n: n.Conv2d(3, 4, 3), [((0, 3, 5, 5), F)], [(0, 4, 3, 3)]),
    Case("MaxPool2d", lambda n: n.MaxPool2d(2), [((0, 3, 4, 4), F)], [(0, 3, 2, 2)]),
    Case("AvgPool2d", lambda n: n.AvgPool2d(2), [((0, 3, 4, 4), F)], [(0, 3, 2, 2)]),
    Case("AdaptiveAvgPool2d", lambda n: n.AdaptiveAvgPool2d((2, 2)), [((0, 3, 4, 4), F)], [(0, 3, 2, 2)]),
    Case("BatchNorm1d", lambda n: n.BatchNorm1d(3), [((0, 3), F)], [(0, 3)]),
    Case("BatchNorm1d", lambda n: n.BatchNorm1d(3), [((0, 3, 5), F)], [(0, 3, 5)]),
    Case("BatchNorm1d", lambda n: n.BatchNorm1d(3), [((2, 3, 0), F)], [(2, 3, 0)]),
    Case("BatchNorm2d", lambda n: n.BatchNorm2d(3), [((0, 3, 4, 4), F)], [(0, 3, 4, 4)]),
    Case("LayerNorm", lambda n: n.LayerNorm(3), [((0, 3), F)], [(0, 3)]),
    Case("LayerNorm", lambda n: n.LayerNorm(0), [((2, 0), F)], [(2, 0)]),
    Case("Embedding", lambda n: n.Embedding(10, 4), [((0,), I)], [(0, 4)]),
    Case("Embedding", lambda n: n.Embedding(10, 4), [((2, 0), I)], [(2, 0, 4)]),
    Case("Embedding", lambda n: n.Embedding(10, 0), [((2,), I)], [(2, 0)]),
    Case("Dropout", lambda n: n.Dropout(0.5), [((0, 3), F)], [(0, 3)]),
    Case("Flatten", lambda n: n.Flatten(), [((0, 3, 4), F)], [(0, 12)]),
    Case("Identity", lambda n: n.Identity(), [((0, 3), F)], [(0, 3)]),
    Case("LSTM", lambda n: n.LSTM(3, 4), [((5, 0, 3), F)], [(5, 0, 4), (1, 0, 4), (1, 0, 4)]),
    Case("LSTM", lambda n: n.LSTM(3, 4, batch_first=True), [((0, 5, 3), F)], [(0, 5, 4), (1, 0, 4), (1, 0, 4)]),
    Case("LSTMCell", lambda n: n.LSTMCell(3, 4), [((0, 3), F)], [(0, 4), (0, 4)]),
    Case("RNN", lambda n: n.RNN(3, 4), [((5, 0, 3), F)], [(5, 0, 4), (1, 0, 4)]),
    Case("GRU", lambda n: n.GRU(3, 4, batch_first=True), [((0, 5, 3), F)], [(0, 5, 4), (1, 0, 4)]),
    Case("RNNCell", lambda n: n.RNNCell(3, 4), [((0, 3), F)], [(0, 4)]),
    Case("GRUCell", lambda n: n.GRUCell(3, 4), [((0, 3), F)], [(0, 4)]),
    Case("MultiheadAttention", lambda n: n.MultiheadAttention(4, 2, batch_first=True),
         [((0, 5, 4), F)] * 3, [(0, 5, 4), (0, 5, 5)]),
    Case("TransformerEncoderLayer",
         lambda n: n.TransformerEncoderLayer(4, 2, dim_feedforward=8, dropout=0.0, batch_first=True),
         [((0, 5, 4), F)], [(0, 5, 4)]),
    Case("Sequential", lambda n: n.Sequential(n.Linear(3, 4), n.ReLU(), n.Linear(4, 2)), [((0, 3), F)], [(0, 2)]),
    Case("MSELoss", lambda n: n.MSELoss(), [((0, 3), F), ((0, 3), F)], [()]),
    Case("MSELoss", lambda n: n.MSELoss(reduction="sum"), [((0, 3), F), ((0, 3), F)], [()]),
    Case("MSELoss", lambda n: n.MSELoss(reduction="none"), [((0, 3), F), ((0, 3), F)], [(0, 3)]),
    Case("L1Loss", lambda n: n.L1Loss(), [((0, 3), F), ((0, 3), F)], [()]),
    Case("CrossEntropyLoss", lambda n: n.CrossEntropyLoss(), [((0, 3), F), ((0,), I)], [()]),
    Case("CrossEntropyLoss", lambda n: n.CrossEntropyLoss(reduction="sum"), [((0, 3), F), ((0,), I)], [()]),
    Case("NLLLoss", lambda n: n.NLLLoss(), [((0, 3), F), ((0,), I)], [()]),
    Case("BCEWithLogitsLoss", lambda n: n.BCEWithLogitsLoss(), [((0,), F), ((0,), F)], [()]),
    Case("BCELoss", lambda n: n.BCELoss(reduction="sum"), [((0,), F), ((0,), F)], [()]),
    Case("SmoothL1Loss", lambda n: n.SmoothL1Loss(reduction="sum"), [((0, 3), F), ((0, 3), F)], [()]),
    Case("HuberLoss", lambda n: n.HuberLoss(reduction="none"), [((0, 3), F), ((0, 3), F)], [(0, 3)]),
    Case("ConvTranspose1d", lambda n: n.ConvTranspose1d(3, 4, 3), [((0, 3, 5), F)], [(0, 4, 7)]),
    Case("ConvTranspose2d", lambda n: n.ConvTranspose2d(3, 4, 3, stride=2), [((0, 3, 4, 4), F)], [(0, 4, 9, 9)]),
    Case("Dropout1d", lambda n: n.Dropout1d(0.5), [((0, 3, 4), F)], [(0, 3, 4)]),
    Case("Dropout2d", lambda n: n.Dropout2d(0.5), [((0, 3, 4, 4), F)], [(0, 3, 4, 4)]),
    Case("Dropout3d", lambda n: n.Dropout3d(0.5), [((0, 3, 2, 2, 2), F)], [(0, 3, 2, 2, 2)]),
    Case("TransformerEncoder",
         lambda n: n.TransformerEncoder(n.TransformerEncoderLayer(4, 2, dim_feedforward=8, dropout=0.0,
                                                                  batch_first=True), 2, enable_nested_tensor=False),
         [((0, 5, 4), F)], [(0, 5, 4)]),
    Case("TransformerDecoderLayer",
         lambda n: n.TransformerDecoderLayer(4, 2, dim_feedforward=8, dropout=0.0, batch_first=True),
         [((0, 5, 4), F), ((0, 6, 4), F)], [(0, 5, 4)]),
    Case("TransformerDecoder",
         lambda n: n.TransformerDecoder(n.TransformerDecoderLayer(4, 2, dim_feedforward=8, dropout=0.0,
                                                                  batch_first=True), 2),
         [((0, 5, 4), F), ((0, 6, 4), F)], [(0, 5, 4)]),
    Case("Transformer",
         lambda n: n.Transformer(4, 2, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=8, dropout=0.0,
                                 batch_first=True),
         [((0, 6, 4), F), ((0, 5, 4), F)], [(0, 5, 4)]),
]
for act in ("ReLU", "GELU", "Sigmoid", "Tanh", "SiLU", "LeakyReLU", "Hardswish"):
    CASES += [Case(act, lambda n, a=act: getattr(n, a)(), [((0, 3), F)], [(0, 3)]),
              Case(act, lambda n, a=act: getattr(n, a)(), [((2, 0), F)], [(2, 0)])]
for soft in ("Softmax", "LogSoftmax"):
    CASES += [Case(soft, lambda n, s=soft: getattr(n, s)(dim=1), [((0, 3), F)], [(0, 3)]),
              Case(soft, lambda n, s=soft: getattr(n, s)(dim=1), [((2, 0), F)], [(2, 0)])]
NOT_LAYERS = {"Module", "ModuleList", "ModuleDict"}  # containers with no forward of their own


def case_id(case: Case) -> str:
    return f"{case.name}-{'-'.join('x'.join(map(str, s)) for s, _ in case.inputs)}"


def arrays(case: Case, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 3, shape).astype(np.int64) if kind == I else
            rng.random(shape, dtype=np.float32) for shape, kind in case.inputs]


def flat(out: Any) -> list:
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in flat(o)]
    return [out]


def run(case: Case, n: Any, tensor: Callable, module: Any = None) -> tuple[Any, list, list]:
    """The layer (``module`` or a new one), its flattened outputs in training mode, and its inputs."""
    layer = module if module is not None else case.make(n)
    layer.train()
    ins = [tensor(a) for a in arrays(case)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy's "mean of empty slice": the NaN is the answer
        outs = flat(layer(*ins))
        if outs[0].requires_grad:
            outs[0].sum().backward()
    return layer, outs, ins


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_layers_on_empty_batches_and_features_give_the_expected_shapes(case):
    layer, outs, _ = run(case, nn, lambda a: mg.tensor(a) if a.dtype == np.int64 else mg.tensor(a, requires_grad=True))
    assert [tuple(o.shape) for o in outs] == case.shapes
    for name, p in layer.named_parameters():
        assert p.grad is None or tuple(p.grad.shape) == tuple(p.shape), name


def test_linear_without_input_features_gives_its_bias():
    layer = nn.Linear(0, 4)
    np.testing.assert_array_equal(layer(mg.zeros(2, 0)).detach().numpy(), np.broadcast_to(layer.bias.detach().numpy(), (2, 4)))


@pytest.mark.parametrize("reduction, value", [("mean", math.nan), ("sum", 0.0)])
def test_a_loss_over_nothing_is_nan_as_a_mean_and_zero_as_a_sum(reduction, value):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = [nn.MSELoss(reduction=reduction)(mg.zeros(0, 3), mg.zeros(0, 3)).item(),
               nn.CrossEntropyLoss(reduction=reduction)(mg.zeros(0, 3), mg.zeros(0, dtype=mg.int64)).item()]
    np.testing.assert_array_equal(got, [value, value])


def test_batchnorm_in_training_on_an_empty_batch_keeps_its_running_statistics():
    bn = nn.BatchNorm1d(3)
    bn(mg.randn(8, 3) * 2 + 1)
    mean, var = bn.running_mean.numpy().copy(), bn.running_var.numpy().copy()
    out = bn(mg.zeros(0, 3, requires_grad=True))
    out.sum().backward()
    assert tuple(out.shape) == (0, 3) and int(bn.num_batches_tracked.item()) == 2  # counted, as in torch
    np.testing.assert_array_equal(bn.running_mean.numpy(), mean)
    np.testing.assert_array_equal(bn.running_var.numpy(), var)
    np.testing.assert_array_equal(bn.weight.grad.numpy(), np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="more than 1 value per channel"):  # one value is still an error
        bn(mg.zeros(1, 3))
    # no channels at all: empty too (torch 2 raises IndexError from inside its empty-batch path here)
    assert tuple(nn.BatchNorm1d(0)(mg.zeros(4, 0)).shape) == (4, 0)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_layers_on_empty_batches_and_features_match_torch(case):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    theirs = case.make(torch.nn)
    ours = case.make(nn)
    ours.load_state_dict({k: mg.tensor(v.detach().numpy().copy()) for k, v in theirs.state_dict().items()})
    _, want, _ = run(case, torch.nn, lambda a: torch.from_numpy(a) if a.dtype == np.int64 else
                     torch.from_numpy(a).requires_grad_(True), theirs)
    _, got, _ = run(case, nn, lambda a: mg.tensor(a) if a.dtype == np.int64 else mg.tensor(a, requires_grad=True),
                    ours)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.detach().numpy(), w.detach().numpy(), rtol=1e-5, atol=1e-6, equal_nan=True)
    theirs_params = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        t = theirs_params[name]
        if t.grad is None:
            assert p.grad is None or not p.grad.numpy().any(), name
        else:
            np.testing.assert_allclose(p.grad.numpy(), t.grad.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)
    theirs_buffers = dict(theirs.named_buffers())
    for name, b in ours.named_buffers():
        np.testing.assert_allclose(b.numpy(), theirs_buffers[name].numpy(), rtol=1e-6, err_msg=name)


def test_every_layer_minigrad_nn_exports_has_a_case():
    layers = {name for name, cls in vars(nn).items() if inspect.isclass(cls) and issubclass(cls, nn.Module)}
    assert layers - NOT_LAYERS - {c.name for c in CASES} == set()
