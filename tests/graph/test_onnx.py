"""ONNX export: exported MLPs, CNNs (BatchNorm live and folded), LayerNorm/GELU/softmax models,
attention and a table of single ops run in onnxruntime and give what eager minigrad gives; ops
without a translation, graphs that write state and a missing onnx package raise clear errors."""

import subprocess
import sys

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import minigrad as mg  # noqa: E402
from minigrad import nn  # noqa: E402
from minigrad.errors import ShapeError  # noqa: E402
from minigrad.graph import export_onnx, trace  # noqa: E402
from minigrad.graph.onnx_export import OnnxExporterError, UnsupportedOperatorError  # noqa: E402
from minigrad.graph.passes import fold_batch_norm, fold_constants  # noqa: E402
from minigrad.nn import functional as F  # noqa: E402
from minigrad.ops import softplus  # noqa: E402


def run_onnx(path, *inputs):
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {i.name: x.numpy() for i, x in zip(sess.get_inputs(), inputs)})


def eager(fn, *inputs):
    with mg.no_grad():
        out = fn(*inputs)
    return [o.numpy() for o in (out if isinstance(out, tuple) else (out,))]


def check_export(fn, *inputs, tmp_path, **kwargs):
    """Export ``fn``, run the file in onnxruntime and compare with eager minigrad; returns the model."""
    if isinstance(fn, nn.Module):
        fn.eval()
    expected = eager(fn, *inputs)
    path = tmp_path / "model.onnx"
    model = export_onnx(fn, inputs[0] if len(inputs) == 1 else inputs, path, **kwargs)
    got = run_onnx(path, *inputs)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.shape == e.shape and g.dtype == e.dtype
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)
    return model


def op_types(model):
    return [n.op_type for n in model.graph.node]


def cnn():
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(4, 6, 3, stride=2, padding=(1, 2), dilation=(1, 2), groups=2, bias=False),
                          nn.BatchNorm2d(6), nn.ReLU(), nn.AvgPool2d(2, ceil_mode=True), nn.Flatten(),
                          nn.Linear(24, 5))
    with mg.no_grad():
        for bn in (model[1], model[5]):  # running statistics that are not the identity
            bn.running_mean.copy_(mg.randn(bn.num_features))
            bn.running_var.copy_(mg.rand(bn.num_features) + 0.5)
            bn.weight.copy_(mg.randn(bn.num_features))
    return model


# -- models -----------------------------------------------------------------------------------------
def test_mlp_exports_as_gemms_with_named_weights(tmp_path):
    mlp = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 8), nn.Tanh(),
                        nn.Linear(8, 3), nn.Sigmoid())
    model = check_export(mlp, mg.randn(5, 4), tmp_path=tmp_path)
    assert op_types(model) == ["Gemm", "Relu", "Gemm", "Tanh", "Gemm", "Sigmoid"]
    assert [t.name for t in model.graph.initializer] == [f"{i}.{p}" for i in (0, 3, 5) for p in ("weight", "bias")]
    assert [i.name for i in model.graph.input] == ["input"] and [o.name for o in model.graph.output] == ["output"]
    assert mlp.training is False  # check_export put it in eval mode; export leaves the mode as it was


def test_export_restores_training_mode_and_writes_the_file(tmp_path):
    mlp = nn.Sequential(nn.Linear(3, 2), nn.Dropout(0.5))
    model = export_onnx(mlp, mg.randn(2, 3), tmp_path / "m.onnx")
    assert mlp.training and onnx.load(tmp_path / "m.onnx").graph == model.graph
    assert op_types(model) == ["Gemm"]  # traced in eval mode: dropout is the identity


def test_cnn_with_batchnorm_pooling_and_flatten(tmp_path):
    model = check_export(cnn(), mg.randn(2, 3, 10, 10), tmp_path=tmp_path)
    ops = op_types(model)
    assert ops.count("Conv") == 2 and "MaxPool" in ops and "AveragePool" in ops and "Gemm" in ops


def test_batchnorm_folded_cnn_graph(tmp_path):
    model, x = cnn().eval(), mg.randn(2, 3, 10, 10)
    with mg.no_grad():
        graph = fold_batch_norm(fold_constants(trace(model, x).graph, freeze=True))
    assert "Add" not in [n.op for n in graph.nodes]  # both BatchNorms are inside their convs
    expected = eager(model, x)[0]
    exported = export_onnx(graph, x, tmp_path / "folded.onnx", input_names=["image"], output_names=["logits"])
    np.testing.assert_allclose(run_onnx(tmp_path / "folded.onnx", x)[0], expected, rtol=1e-5, atol=1e-5)
    assert op_types(exported)[:5] == ["Conv", "Relu", "MaxPool", "Conv", "Relu"]
    assert [i.name for i in exported.graph.input] == ["image"] and exported.graph.output[0].name == "logits"


def test_layernorm_gelu_softmax(tmp_path):
    model = nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.GELU(), nn.Linear(8, 4), nn.Softmax(-1))
    x = mg.randn(2, 3, 6)
    assert "LayerNormalization" in op_types(check_export(model, x, tmp_path=tmp_path))
    assert "LayerNormalization" not in op_types(check_export(model, x, tmp_path=tmp_path, opset=16))
    assert "Gelu" in op_types(check_export(model, x, tmp_path=tmp_path, opset=20))


def test_transformer_encoder_layer(tmp_path):
    layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.1, batch_first=True)
    check_export(layer, mg.randn(2, 5, 8), tmp_path=tmp_path)


def test_adaptive_pool_gelu_tanh_and_log_softmax(tmp_path):
    model = nn.Sequential(nn.Conv2d(2, 3, 3), nn.AdaptiveAvgPool2d((2, 1)), nn.Flatten(), nn.Linear(6, 4),
                          nn.GELU(approximate="tanh"), nn.LeakyReLU(0.2), nn.LogSoftmax(dim=1))
    check_export(model, mg.randn(2, 2, 7, 6), tmp_path=tmp_path)


# -- single ops -------------------------------------------------------------------------------------
OPS = {
    "arithmetic": lambda x, y: (x + y, x - 2.0, 3.0 * y, x / (y.abs() + 1), -x, (x.abs() + 1) ** 1.5, 2.0 ** x),
    "unary": lambda x, y: (x.exp(), (x.abs() + 1).log(), (y.abs() + 1).sqrt(), (y.abs() + 1).rsqrt(), x.sin(),
                           x.cos(), x.sign(), F.silu(x), softplus(x * 10, 2.0, 15.0)),
    "clamp_where": lambda x, y: (x.clamp(-0.5, 0.5), x.clamp(min=0.1), mg.maximum(x, y), mg.minimum(x, y),
                                 mg.where(x > y, x, 0.0)),
    "reductions": lambda x, y: (x.sum(), x.sum(1), x.mean((0, 2), keepdim=True), x.amax(-1), x.amin(0),
                                x.logsumexp(1), x.prod(2)),
    "movement": lambda x, y: (x.permute(2, 0, 1), x.reshape(3, -1), x[:, 1], x[..., ::-2], x[1:, None, :2],
                              mg.cat([x, y], 1), F.pad(x, (1, 2)), x.unsqueeze(0).expand(2, 2, 3, 4),
                              x.transpose(1, 2).contiguous()),
    "matmul_cast": lambda x, y: (x @ y.transpose(1, 2), mg.einsum("bij,bkj->bik", x, y), x.double() * 2,
                                 x.softmax(0), x.log_softmax(2)),
}


@pytest.mark.parametrize("opset", [13, 17, 18])
@pytest.mark.parametrize("name", sorted(OPS))
def test_ops(name, opset, tmp_path):
    check_export(OPS[name], mg.randn(2, 3, 4), mg.randn(2, 3, 4), tmp_path=tmp_path, opset=opset)


def test_inputs_returned_twice_and_names(tmp_path):
    def f(a, b):
        y = a * b
        return y, y, a, b.sum()

    model = check_export(f, mg.randn(3), mg.randn(3), tmp_path=tmp_path, output_names=["p", "q", "r", "s"])
    assert [i.name for i in model.graph.input] == ["a", "b"]
    assert [o.name for o in model.graph.output] == ["p", "q", "r", "s"]


def test_traced_function_and_float64(tmp_path):
    mlp = nn.Sequential(nn.Linear(3, 4), nn.ReLU()).double().eval()
    x = mg.randn(2, 3, dtype=mg.float64)
    with mg.no_grad():
        traced = trace(mlp, x)
    export_onnx(traced, x, tmp_path / "t.onnx")
    np.testing.assert_allclose(run_onnx(tmp_path / "t.onnx", x)[0], eager(mlp, x)[0], rtol=1e-12)


# -- errors -----------------------------------------------------------------------------------------
def test_unsupported_op_names_it_and_lists_the_supported(tmp_path):
    with pytest.raises(UnsupportedOperatorError, match=r"op Cumsum .*supported ops: .*Conv2d.*Linear"):
        export_onnx(lambda x: x.cumsum(1), mg.randn(2, 3), tmp_path / "x.onnx")
    with pytest.raises(UnsupportedOperatorError, match="integer or boolean tensors"):
        export_onnx(lambda x: x[mg.tensor([0, 2])], mg.randn(3, 2), tmp_path / "x.onnx")


def test_graph_that_writes_state_is_refused(tmp_path):
    bn, x = nn.BatchNorm1d(3), mg.randn(4, 3)
    graph = trace(bn, x).graph  # training mode: the running statistics are written
    with pytest.raises(OnnxExporterError, match="inference graphs"):
        export_onnx(graph, x, tmp_path / "x.onnx")


def test_bad_arguments(tmp_path):
    mlp = nn.Linear(3, 2)
    graph = trace(mlp, mg.randn(2, 3)).graph
    with pytest.raises(ShapeError, match=r"\(2, 3\).*\(4, 3\)"):
        export_onnx(graph, mg.randn(4, 3), tmp_path / "x.onnx")
    with pytest.raises(ValueError, match="opset"):
        export_onnx(mlp, mg.randn(2, 3), tmp_path / "x.onnx", opset=9)
    with pytest.raises(ValueError, match="input_names"):
        export_onnx(mlp, mg.randn(2, 3), tmp_path / "x.onnx", input_names=["a", "b"])


def test_missing_onnx_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "onnx", None)  # makes `import onnx` raise ImportError
    with pytest.raises(ImportError, match=r"pip install 'minigrad\[onnx\]'"):
        export_onnx(nn.Linear(2, 2), mg.randn(1, 2), tmp_path / "x.onnx")


def test_importing_minigrad_does_not_import_onnx():
    code = "import sys, minigrad, minigrad.graph; minigrad.graph.export_onnx; assert 'onnx' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("opset", [13, 17])
def test_a_new_op_exports_from_its_declaration(opset, tmp_path):
    """Hardswish's class says how it exports (HardSwish from opset 14, x * HardSigmoid(x) before)."""
    model = check_export(nn.Sequential(nn.Linear(4, 6), nn.Hardswish()), mg.randn(3, 4) * 4, tmp_path=tmp_path,
                         opset=opset)
    assert ("HardSwish" if opset >= 14 else "HardSigmoid") in op_types(model)
