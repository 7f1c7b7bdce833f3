"""minigrad.quantization: grids, observers, the straight-through estimator, fusion, the int8
kernels, post-training static and dynamic quantization and quantization-aware training."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import minigrad
import minigrad.quantization as Q
from minigrad import nn
from minigrad.quantization.ops import int_matmul, quantize


def small_cnn(bn: bool = True) -> nn.Module:
    layers = [nn.Conv2d(2, 8, 3, padding=1)] + ([nn.BatchNorm2d(8)] if bn else []) + [
        nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 3 * 3, 16), nn.ReLU(), nn.Linear(16, 4)]
    model = nn.Sequential(*layers)
    if bn:  # running statistics that are not the identity, so folding has work to do
        with minigrad.no_grad():
            model[1].running_mean.copy_(minigrad.tensor(np.linspace(-0.2, 0.3, 8).astype("float32")))
            model[1].running_var.copy_(minigrad.tensor(np.linspace(0.5, 2.0, 8).astype("float32")))
            model[1].weight.copy_(minigrad.tensor(np.linspace(0.5, 1.5, 8).astype("float32")))
    return model.eval()


def batch(n: int = 32, seed: int = 0) -> minigrad.Tensor:
    return minigrad.tensor(np.random.default_rng(seed).standard_normal((n, 2, 6, 6)).astype("float32"))


def ptq(model: nn.Module, qconfig=Q.default_qconfig) -> nn.Module:
    prepared = Q.prepare(Q.fuse_modules(model), qconfig)
    with minigrad.no_grad():
        prepared(batch(64, seed=1))
    return Q.convert(prepared)


# -- grids and observers --------------------------------------------------------------------------
@settings(max_examples=50, deadline=None)
@given(arrays("float32", st.integers(1, 40), elements=st.floats(-1e3, 1e3, width=32)), st.booleans())
def test_round_trip_error_is_at_most_half_a_step(x, symmetric):
    qp = Q.calculate_qparams(np, x.min(), x.max(), "qint8" if symmetric else "quint8", symmetric)
    back = (quantize(np, x, qp.scale, qp.zero_point, qp.qmin, qp.qmax).astype("float64") - qp.zero_point) * qp.scale
    assert np.all(np.abs(back - x) <= qp.scale * 0.5001 + 1e-6)
    zero = quantize(np, np.zeros(1, "float32"), qp.scale, qp.zero_point, qp.qmin, qp.qmax)
    assert zero[0] == qp.zero_point  # 0 is exact: zero padding and ReLU lose nothing
    if symmetric:
        assert qp.zero_point == 0


def test_minmax_moving_average_and_per_channel_observers():
    a = minigrad.tensor([[-1.0, 2.0], [0.5, 0.0]], device="cpu")  # the grids below are host arrays
    b = minigrad.tensor([[3.0, -0.5], [0.0, -1.26]], device="cpu")
    mm, ma, pc = Q.MinMaxObserver(), Q.MovingAverageMinMaxObserver(averaging_constant=0.5), Q.PerChannelMinMaxObserver()
    for obs in (mm, ma, pc):
        assert obs(a) is a
        obs(b)
    assert (float(mm.min_val.detach().numpy()), float(mm.max_val.detach().numpy())) == pytest.approx((-1.26, 3.0))
    assert (float(ma.min_val.detach().numpy()), float(ma.max_val.detach().numpy())) == pytest.approx((-1.13, 2.5))  # halfway to batch 2
    np.testing.assert_array_equal(pc.max_val.detach().numpy(), [3.0, 0.0])  # the last tensor's rows
    qp = pc.calculate_qparams()
    np.testing.assert_allclose(qp.scale, [3 / 63, 1.26 / 63], rtol=1e-6)
    assert qp.axis == 0 and qp.zero_point.dtype == np.int8
    with pytest.raises(RuntimeError, match="no values observed"):
        Q.MinMaxObserver().calculate_qparams()
    with pytest.raises(ValueError, match="dtype must be one of"):
        Q.MinMaxObserver(dtype="int4")


def test_histogram_observer_clips_an_outlier_for_a_finer_grid():
    rng = np.random.default_rng(0)
    # one outlier: clipping it costs 36^2, but a 9x finer grid saves more over 600k values
    x = np.concatenate([rng.standard_normal(599999), [40.0]]).astype("float32")
    hist, mm = Q.HistogramObserver(), Q.MinMaxObserver()
    for part in np.split(x, 3):  # the range grows between batches
        hist(minigrad.tensor(part, device="cpu"))
        mm(minigrad.tensor(part, device="cpu"))

    def mse(qp):
        back = (quantize(np, x, qp.scale, qp.zero_point, 0, 255).astype("float64") - qp.zero_point) * qp.scale
        return float(((back - x) ** 2).mean())

    assert hist.calculate_qparams().scale < mm.calculate_qparams().scale / 4
    assert mse(hist.calculate_qparams()) < mse(mm.calculate_qparams())


# -- the straight-through estimator ---------------------------------------------------------------
def test_fake_quantize_gradient_is_identity_inside_the_range_and_zero_outside():
    x = minigrad.tensor(np.linspace(-1.03, 1.03, 41), requires_grad=True)  # scale 0.1, zero 3, [0, 10]: [-0.3, 0.7]
    y = Q.fake_quantize(x, 0.1, 3, 0, 10)
    y.sum().backward()
    inside = (x.detach().numpy() >= -0.35) & (x.detach().numpy() <= 0.75)
    np.testing.assert_array_equal(x.grad.detach().numpy(), inside.astype("float64"))
    np.testing.assert_allclose(y.detach().numpy(), np.clip(np.rint(x.detach().numpy() / 0.1) + 3, 0, 10) * 0.1 - 0.3, atol=1e-7)
    assert 0 < inside.sum() < inside.size


# -- fusion -----------------------------------------------------------------------------------------
def test_fuse_modules_keeps_the_function_and_matches_explicit_names():
    model, x = small_cnn(), batch()
    auto, named = Q.fuse_modules(model), Q.fuse_modules(model, [["0", "1", "2"], ["5", "6"]])
    assert isinstance(auto[0], Q.ConvReLU2d) and isinstance(auto[5], Q.LinearReLU)
    assert isinstance(auto[1], nn.Identity) and type(auto[0][0]) is nn.Conv2d
    with minigrad.no_grad():
        for fused in (auto, named):
            np.testing.assert_allclose(fused(x).detach().numpy(), model(x).detach().numpy(), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="cannot fuse"):
        Q.fuse_modules(model, [["0", "3"]])
    with pytest.raises(ValueError, match="training mode"):
        Q.fuse_modules(small_cnn().train(), [["0", "1"]])


# -- the int8 kernels -------------------------------------------------------------------------------
@pytest.mark.parametrize("qconfig", [Q.default_qconfig, Q.full_range_qconfig], ids=["7-bit weights", "8-bit weights"])
def test_int8_kernels_compute_the_integer_sums_exactly(qconfig):
    q, x = ptq(small_cnn(), qconfig), batch(8, seed=3)
    conv, lin = q[0], q[5]
    with minigrad.no_grad():
        h = q[4](q[3](conv(x)))
        out = lin(h)
    # the same sums in int64 by numpy's einsum, requantized by hand
    for layer, inp, got in ((lin, h.detach().numpy(), out.detach().numpy()),):
        xq = quantize(np, inp, layer.input_scale.detach().numpy(), layer.input_zero_point.detach().numpy(), 0, 255).astype("int64")
        acc = (xq - int(layer.input_zero_point.detach().numpy())) @ layer.weight.detach().numpy().astype("int64").T + layer.bias.detach().numpy()
        m = (layer.input_scale.detach().numpy() * layer.weight_scale.detach().numpy() / layer.scale.detach().numpy()).astype("float32")
        z = int(layer.zero_point.detach().numpy())
        q_out = np.clip(np.rint(acc.astype("float32") * m) + z, z if layer.relu else 0, 255)
        expected = (q_out - z) * layer.scale.detach().numpy()
        np.testing.assert_array_equal(got, expected.astype("float32"))
    assert conv.weight.dtype == np.int8 and conv.bias.dtype == np.int32 and conv.input_zero_point.dtype == np.uint8
    assert np.abs(conv.weight.detach().numpy().astype(int)).max() == (63 if qconfig is Q.default_qconfig else 127)


def test_int_matmul_is_exact_on_both_paths():
    rng = np.random.default_rng(0)
    a, b = rng.integers(-255, 256, (5, 300)).astype("int32"), rng.integers(-127, 128, (300, 4)).astype("int32")
    exact = a.astype("int64") @ b.astype("int64")
    for bound in (255 * 127, 2 ** 24):  # float32 BLAS (300 * 32385 < 2^24), then int32
        np.testing.assert_array_equal(int_matmul(a, b, bound), exact)


@pytest.mark.parametrize("qconfig", [Q.default_qconfig, Q.histogram_qconfig, Q.full_range_qconfig], ids=str)
def test_post_training_quantization_stays_close_to_the_float_model(qconfig):
    model, x = small_cnn(), batch(64, seed=1)
    q = ptq(model, qconfig)
    assert [type(m).__name__ for m in q][:6:5] == ["QuantizedConv2d", "QuantizedLinear"]
    with minigrad.no_grad():
        ref, got = model(x).detach().numpy(), q(x).detach().numpy()
    assert np.abs(got - ref).max() < 0.1 * np.abs(ref).max()
    assert (got.argmax(1) == ref.argmax(1)).mean() > 0.9
    assert Q.model_size(q) < Q.model_size(model) / 2.5


def test_stubs_prepare_and_convert():
    model = nn.Sequential(Q.QuantStub(), nn.Linear(4, 3), Q.DeQuantStub())
    prepared = Q.prepare(model)
    assert isinstance(prepared[1], Q.QuantWrapper) and "activation_post_process" in prepared[0]._modules
    x = minigrad.tensor(np.linspace(-1, 1, 8, dtype="float32").reshape(2, 4))
    with minigrad.no_grad():
        prepared(x)
        q = Q.convert(prepared)
        assert isinstance(q[0], Q.Quantize) and isinstance(q[2], nn.Identity)
        np.testing.assert_allclose(q(x).detach().numpy(), model(x).detach().numpy(), atol=0.05)
    assert isinstance(model[1], nn.Linear)  # prepare and convert copy unless inplace
    with pytest.raises(TypeError, match="container"):
        Q.prepare(nn.Linear(2, 2))
    four_bits = Q.prepare(model, Q.QConfig(lambda: Q.MinMaxObserver(quant_max=15), Q.PerChannelMinMaxObserver))
    four_bits(x)
    with pytest.raises(ValueError, match="quint8 grids 0..255, got quint8 0..15"):
        Q.convert(four_bits)


def test_dynamic_quantization_of_linear_layers():
    model = nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 5)).eval()
    q = Q.quantize_dynamic(model, {nn.Linear})
    assert isinstance(q[0], Q.DynamicQuantizedLinear) and q[0].weight.dtype == np.int8
    x = minigrad.tensor(np.random.default_rng(0).standard_normal((16, 10)).astype("float32"))
    with minigrad.no_grad():
        ref, got = model(x).detach().numpy(), q(x).detach().numpy()
    assert np.abs(got - ref).max() < 0.03 * np.abs(ref).max()
    with pytest.raises(ValueError, match="supports Linear and LSTM"):
        Q.quantize_dynamic(model, {nn.Conv2d})


def test_quantization_aware_training_learns_and_converts():
    minigrad.manual_seed(0)
    model = small_cnn(bn=False).train()
    qat = Q.prepare_qat(Q.fuse_modules(model.eval()))
    assert qat.training and isinstance(qat[0].weight_post_process, Q.FakeQuantize)
    rng = np.random.default_rng(5)
    x = batch(64, seed=5)
    y = minigrad.tensor(rng.integers(0, 4, 64))
    opt = minigrad.optim.Adam(qat.parameters(), lr=0.01)
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(qat(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]
    assert qat[0].layer.weight.grad is not None  # the gradient went through the fake quantizers
    for m in qat.modules():
        if isinstance(m, Q.FakeQuantize):
            m.observer_enabled = False
    q = Q.convert(qat.eval())
    with minigrad.no_grad():
        fake, real = qat(x).detach().numpy(), q(x).detach().numpy()
    # the int8 model rounds its bias and sums where the fake-quantized one does not: a few steps apart
    np.testing.assert_allclose(real, fake, atol=10 * float(q[-1].scale.detach().numpy()))
    assert (real.argmax(1) == fake.argmax(1)).mean() > 0.9


def test_quantized_model_runs_on_every_device(device):
    q = ptq(small_cnn())
    with minigrad.no_grad():
        ref = q(batch(8)).detach().numpy()
        q.to(device)
        got = q(batch(8).to(device))
    assert got.device == minigrad.device(device)
    np.testing.assert_allclose(got.cpu().numpy(), ref, atol=1e-6)


def test_dynamic_quantization_of_an_lstm():
    lstm = nn.LSTM(6, 8, num_layers=2, bidirectional=True)
    model = nn.Sequential(lstm)
    q = Q.quantize_dynamic(model)
    assert isinstance(q[0], Q.DynamicQuantizedLSTM) and q[0].weight_ih_l1_reverse.dtype == np.int8
    assert not list(q.parameters()) and Q.model_size(q) < Q.model_size(model) / 2
    x = minigrad.tensor(np.random.default_rng(0).standard_normal((5, 3, 6)).astype("float32"))
    with minigrad.no_grad():
        (ref, (h_ref, c_ref)), (got, (h, c)) = lstm(x), q[0](x)
    assert got.shape == ref.shape and h.shape == h_ref.shape and c.shape == c_ref.shape
    assert np.abs(got.detach().numpy() - ref.detach().numpy()).max() < 0.03 * np.abs(ref.detach().numpy()).max()
    assert isinstance(Q.quantize_dynamic(lstm), Q.DynamicQuantizedLSTM)  # a bare LSTM is swapped too
