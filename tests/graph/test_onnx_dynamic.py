"""ONNX export with dynamic axes: the exported model runs in onnxruntime at batch sizes other than
the traced one and matches eager minigrad; what cannot follow the batch is refused by name; every
op without an ONNX translation says why."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import minigrad as mg  # noqa: E402
from minigrad import nn  # noqa: E402
from minigrad.errors import ShapeError  # noqa: E402
from minigrad.graph import export_onnx, trace  # noqa: E402
from minigrad.graph.onnx_export import OnnxExporterError, UnsupportedOperatorError  # noqa: E402
from minigrad.ops import all_ops  # noqa: E402

BATCH = {"x": {0: "batch"}}


def check_batches(fn, shape, tmp_path, batches=(1, 6), dynamic_axes=BATCH, shapes=(), **kwargs):
    """Export ``fn`` traced at batch ``shape[0]`` with a dynamic batch; compare onnxruntime with
    eager minigrad at each of ``batches`` (and input ``shapes``). Returns the model."""
    mg.manual_seed(0)
    model = export_onnx(fn, mg.randn(*shape), tmp_path / "m.onnx", dynamic_axes=dynamic_axes, **kwargs)
    sess = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    for x_shape in [(n, *shape[1:]) for n in batches] + list(shapes):
        x = mg.randn(*x_shape)
        with mg.no_grad():
            expected = fn(x).numpy()
        got = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
        assert got.shape == expected.shape
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    return model


def dims(value_info):
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                                  nn.Flatten(), nn.Linear(64, 10))

    def forward(self, x):
        return self.body(x).softmax(-1)


def test_cnn_runs_at_other_batch_sizes_and_marks_the_axis(tmp_path):
    model = check_batches(Net().eval(), (3, 1, 8, 8), tmp_path, batches=(1, 3, 7))
    assert dims(model.graph.input[0]) == ["batch", 1, 8, 8]
    assert dims(model.graph.output[0]) == ["batch", 10]
    reshape = next(n for n in model.graph.node if n.op_type == "Reshape")
    target = next(t for t in model.graph.initializer if t.name == reshape.input[1])
    assert onnx.numpy_helper.to_array(target).tolist() == [-1, 64]


def test_batch_merged_into_rows_and_split_back(tmp_path):
    lin = nn.Linear(5, 2)

    def per_token(x):  # (batch, 4, 5) -> (batch * 4, 5) -> (batch, 4, 2)
        return lin(x.reshape(-1, 5)).reshape(x.shape[0], 4, 2)

    model = check_batches(per_token, (3, 4, 5), tmp_path)
    assert dims(model.graph.output[0]) == ["batch", 4, 2]


def test_a_broadcast_to_the_batch_reads_its_size_at_run_time(tmp_path):
    def fn(x):  # the column means, repeated on every row
        return x.mean(0, keepdim=True).expand(x.shape[0], 5)

    model = check_batches(fn, (3, 5), tmp_path, batches=(2, 9))
    assert {"Shape", "Gather", "Concat", "Expand"} <= {n.op_type for n in model.graph.node}


def test_transformer_layer_with_dynamic_batch_and_sequence(tmp_path):
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True).eval()
    model = check_batches(layer, (2, 5, 8), tmp_path, batches=(1, 4), shapes=[(3, 1, 8), (1, 9, 8)],
                          dynamic_axes={"src": {0: "batch", 1: "seq"}})
    assert dims(model.graph.output[0]) == ["batch", "seq", 8]


def test_list_form_and_output_axes(tmp_path):
    model = check_batches(nn.Linear(3, 2), (4, 3), tmp_path, dynamic_axes={"x": [0], "y": {0: "x_dim0"}},
                          input_names=["x"], output_names=["y"])
    assert dims(model.graph.input[0])[0] == "x_dim0" and dims(model.graph.output[0])[0] == "x_dim0"
    with pytest.raises(OnnxExporterError, match="axis 1 of output 'output'"):
        export_onnx(nn.Linear(3, 2), mg.randn(4, 3), tmp_path / "m.onnx",
                    dynamic_axes={"input": [0], "output": {1: "b"}})


# -- what cannot follow the batch -------------------------------------------------------------------
def test_a_constant_of_batch_shape_is_refused_by_name(tmp_path):
    with pytest.raises(UnsupportedOperatorError, match=r"batch cannot be dynamic: the constant .* \(shape \[3, 2\]"):
        export_onnx(lambda x: x + mg.ones(x.shape[0], 2), mg.randn(3, 2), tmp_path / "m.onnx", dynamic_axes=BATCH)


def test_a_slice_ending_at_the_batch_size_is_refused(tmp_path):
    with pytest.raises(UnsupportedOperatorError, match="read by Slice"):
        export_onnx(lambda x: x[1:] * 2, mg.randn(3, 2), tmp_path / "m.onnx", dynamic_axes=BATCH)


def test_shape_dependent_control_flow_is_refused(tmp_path):
    def fn(x):
        return x * 2 if x.shape[0] % 2 else x.exp()

    with pytest.raises(ShapeError, match="control flow"):
        export_onnx(fn, mg.randn(3, 2), tmp_path / "m.onnx", dynamic_axes=BATCH)


def test_bad_dynamic_axes(tmp_path):
    x, path = mg.randn(3, 2), tmp_path / "m.onnx"
    with pytest.raises(ValueError, match="neither an input"):
        export_onnx(nn.Linear(2, 2), x, path, dynamic_axes={"y": [0]})
    with pytest.raises(ShapeError, match="out of range"):
        export_onnx(nn.Linear(2, 2), x, path, dynamic_axes={"input": [2]})
    with pytest.raises(OnnxExporterError, match="needs the Module or function"):
        export_onnx(trace(nn.Linear(2, 2), x).graph, x, path, dynamic_axes={"input": [0]})


def test_every_op_without_a_translation_says_why(tmp_path):
    refused = [op for op in all_ops() if op.onnx is None]
    assert refused and all(op.onnx_refused for op in refused)
    with pytest.raises(UnsupportedOperatorError, match=r"op Cumsum .*\(no emitter written yet: ONNX CumSum\)"):
        export_onnx(lambda x: x.cumsum(1), mg.randn(2, 3), tmp_path / "x.onnx")
