"""An int8 model exported in QDQ form runs in onnxruntime and gives what minigrad's int8 model
gives; fake-quantized (QAT) models export the same way; the README's snippet runs as printed."""

import re
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import minigrad  # noqa: E402
import minigrad.quantization as Q  # noqa: E402
from minigrad.examples.train_digits import make_model  # noqa: E402
from minigrad.graph import export_onnx  # noqa: E402
from test_quantization import batch, ptq, small_cnn  # noqa: E402

README = Path(__file__).resolve().parents[2] / "README.md"


def run(path, x, optimize=True):
    options = ort.SessionOptions()
    if not optimize:  # the reference semantics of each op, without onnxruntime's fused int8 kernels
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]


@pytest.mark.parametrize("qconfig, optimize", [(Q.default_qconfig, True), (Q.full_range_qconfig, False)],
                         ids=["7-bit weights, int8 kernels", "8-bit weights, reference kernels"])
def test_int8_model_in_qdq_form_matches_onnxruntime(tmp_path, qconfig, optimize):
    q, x = ptq(small_cnn(), qconfig), batch(16, seed=4)
    model = export_onnx(q, x, tmp_path / "q.onnx")
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("QuantizeLinear") == 3 * 2 and "Conv" in ops and "Gemm" in ops
    weights = [i for i in model.graph.initializer if i.data_type == onnx.TensorProto.INT8]
    assert len(weights) == 3  # the two Linear weights and the conv's, stored as int8
    with minigrad.no_grad():
        expected = q(x).numpy()
    np.testing.assert_allclose(run(tmp_path / "q.onnx", x.numpy(), optimize), expected, rtol=0, atol=1e-6)


def test_fake_quantized_model_exports_as_qdq(tmp_path):
    qat = Q.prepare_qat(Q.fuse_modules(small_cnn(bn=False)))
    x = batch(16, seed=6)
    qat(x)  # one training-mode pass sets the ranges
    qat.eval()
    for m in qat.modules():
        if isinstance(m, Q.FakeQuantize):
            m.observer_enabled = False
    model = export_onnx(qat, x, tmp_path / "qat.onnx")
    # activations keep their QDQ pairs; constant folding rounds each weight once, to its grid
    assert [n.op_type for n in model.graph.node].count("DequantizeLinear") == 6
    with minigrad.no_grad():
        expected = qat(x).numpy()
    np.testing.assert_allclose(run(tmp_path / "qat.onnx", x.numpy(), optimize=False), expected, rtol=1e-5, atol=1e-5)


def test_readme_snippet_runs_as_printed(tmp_path, monkeypatch, capsys):
    section = README.read_text().split("## From a trained model to an int8 ONNX file", 1)[1]
    snippet = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    minigrad.save({"model_state_dict": make_model().state_dict()}, "digits_cnn.ckpt")  # stands in for training
    exec(compile(snippet, "README.md", "exec"), {})
    assert (tmp_path / "digits_int8.onnx").exists()
    assert re.fullmatch(r"\[[\d ]+\]\n", capsys.readouterr().out)
