"""A traced function that reads a traced value out as Python data (``.item()``, ``.numpy()``,
``.tolist()``) computes the rest from a constant of the trace: ``trace`` warns naming the call,
``minigrad.compile`` runs that signature eagerly (a CompileWarning), and ``export_onnx`` refuses
when the value depends on the input (it exported the example's values as a constant before).
``export_onnx`` without example inputs says what it needs."""

import warnings

import numpy as np
import pytest

import minigrad as mg
from minigrad import nn
from minigrad.graph import trace
from minigrad.graph.compile import CompileWarning
from minigrad.graph.trace import TraceWarning

READS = ["numpy", "item", "tolist"]


class Reads(nn.Module):
    """A layer whose output is scaled by a number read out of its own output."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.fc, self.how = nn.Linear(3, 3), how

    def forward(self, x):
        y = self.fc(x)
        s = y.sum()
        if self.how == "numpy":
            c = mg.tensor(s.numpy())
        elif self.how == "item":
            c = s.item()
        else:
            c = mg.tensor(y.tolist()).sum()
        return y * c


def eager(model, x):
    with mg.no_grad():
        return model(x).numpy()


@pytest.mark.parametrize("how", READS)
def test_trace_warns_naming_the_call(how):
    model = Reads(how)
    with mg.no_grad(), pytest.warns(TraceWarning, match=rf"{how}\(\) reads the value of %\d+"):
        traced = trace(model, mg.randn(2, 3))
    assert [h for h, _ in traced.values_read] == [f"{how}()"]


@pytest.mark.parametrize("how", READS)
def test_compile_runs_such_a_function_eagerly(how):
    model = Reads(how)
    compiled = mg.compile(model)
    x, other = mg.randn(2, 3), mg.randn(2, 3)
    with mg.no_grad(), pytest.warns(CompileWarning, match=rf"runs eagerly for this signature: {how}\(\)"):
        compiled(x)
    with mg.no_grad():
        got = compiled(other).numpy()
    np.testing.assert_allclose(got, eager(model, other), rtol=1e-5)  # not the first input's number


def test_reading_a_constant_or_a_parameter_is_not_a_read_of_the_input():
    table = mg.tensor([1.0, 2.0, 3.0])

    def f(x):
        return x * table.sum().item()  # a constant of the function: the same at every call

    with mg.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", TraceWarning)
        assert trace(f, mg.randn(3)).values_read == []


@pytest.mark.parametrize("how", READS)
def test_export_onnx_refuses_a_forward_that_reads_its_input_as_python_data(tmp_path, how):
    pytest.importorskip("onnx")
    from minigrad.graph.onnx_export import OnnxExporterError, export_onnx
    with pytest.raises(OnnxExporterError, match=rf"forward calls {how}\(\) on %\d+ .*a value computed from the input"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TraceWarning)
            export_onnx(Reads(how), mg.randn(2, 3), tmp_path / "m.onnx")
    assert not (tmp_path / "m.onnx").exists()


def test_export_onnx_takes_a_parameter_read_out_as_a_number(tmp_path):
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from minigrad.graph.onnx_export import export_onnx

    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 2)

        def forward(self, x):
            return self.fc(x) * self.fc.weight.detach().abs().sum().item()  # the same at every call

    model, x = Scaled(), mg.randn(4, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        export_onnx(model, x, tmp_path / "m.onnx")
    session = ort.InferenceSession(str(tmp_path / "m.onnx"))
    other = mg.randn(4, 3)
    (got,) = session.run(None, {session.get_inputs()[0].name: other.numpy()})
    np.testing.assert_allclose(got, eager(model, other), rtol=1e-5)


@pytest.mark.parametrize("example", [None, 3.0, "x"])
def test_export_onnx_without_example_inputs_says_what_it_needs(tmp_path, example):
    pytest.importorskip("onnx")
    from minigrad.graph.onnx_export import export_onnx
    with pytest.raises(TypeError, match=rf"example_input must be a Tensor or a tuple of Tensors.*got {type(example).__name__}"):
        export_onnx(nn.Linear(3, 2), example, tmp_path / "m.onnx")
