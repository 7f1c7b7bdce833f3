"""detect_anomaly: the first NaN/Inf names its op and the line of user code that created that op."""

import inspect
import os

import pytest

import minigrad
from minigrad.autograd import Function, anomaly, detect_anomaly, is_anomaly_enabled, set_detect_anomaly
from minigrad.autograd import mode
from minigrad.errors import AnomalyError

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's own nan/inf warnings

HERE = os.path.basename(__file__)


def line() -> int:
    """The caller's line number."""
    return inspect.currentframe().f_back.f_lineno


def test_forward_nan_names_the_op_and_the_line():
    x = minigrad.tensor([1.0, 3.0], requires_grad=True)
    with detect_anomaly():
        y = x * 2
        with pytest.raises(AnomalyError) as info:
            created = line(); (y - 4).log()  # noqa: E702  (log(-2) is nan)
    msg = str(info.value)
    assert "'Log' returned nan values in its 0th output (forward)" in msg
    assert f"{HERE}:{created}" in msg
    assert "(y - 4).log()" in msg  # the source line is shown


def test_forward_inf():
    with detect_anomaly(), pytest.raises(AnomalyError, match="'Div' returned inf values"):
        minigrad.tensor([1.0]) / minigrad.tensor([0.0])


def test_inf_gradient_names_the_backward_node_and_its_forward_line():
    x = minigrad.tensor([0.0, 4.0], requires_grad=True)
    with detect_anomaly():
        created = line(); y = x.sqrt().sum()  # noqa: E702  (d sqrt(x)/dx = inf at 0)
        with pytest.raises(AnomalyError) as info:
            y.backward()
    msg = str(info.value)
    assert "'SqrtBackward' returned inf values in its 0th output" in msg  # not the Div inside its rule
    assert f'"{__file__}", line {created}' in msg
    assert "x.sqrt().sum()" in msg


def test_zero_times_inf_gradient_is_nan():
    x = minigrad.tensor([0.0], requires_grad=True)
    with detect_anomaly():
        y = (x.sqrt() * 0).sum()  # the forward is fine (0); backward gives 0 / 0 inside SqrtBackward
        with pytest.raises(AnomalyError, match="'SqrtBackward' returned nan values in its 0th output"):
            y.backward()


class NanGrad(Function):
    @staticmethod
    def forward(ctx, a, b):
        return a * b

    @staticmethod
    def backward(ctx, g):
        return g, g * float("nan")


def test_user_function_output_index():
    a, b = minigrad.ones(2, requires_grad=True), minigrad.ones(2, requires_grad=True)
    with detect_anomaly(), pytest.raises(AnomalyError, match="'NanGradBackward' returned nan values in its 1th output"):
        NanGrad.apply(a, b).sum().backward()


def test_without_anomaly_mode_nan_passes_silently_and_nothing_is_recorded(monkeypatch):
    calls = []
    monkeypatch.setattr(anomaly, "check_forward", lambda *a: calls.append("forward"))
    monkeypatch.setattr(anomaly, "check_backward", lambda *a: calls.append("backward"))
    x = minigrad.tensor([0.0, -1.0], requires_grad=True)
    y = x.log()
    y.sum().backward()
    assert calls == []
    assert getattr(y.grad_fn, "_trace", None) is None
    assert not is_anomaly_enabled()


def test_op_created_before_anomaly_mode_has_no_trace():
    x = minigrad.tensor([0.0], requires_grad=True)
    y = x.sqrt().sum()
    with detect_anomaly(), pytest.raises(AnomalyError, match="unknown: the op ran before anomaly detection"):
        y.backward()


def test_trace_is_short_and_outside_minigrad():
    package = os.path.dirname(minigrad.__file__)
    with detect_anomaly():
        y = (minigrad.ones(2, requires_grad=True) * 3).tanh()
    trace = y.grad_fn._trace
    assert 1 <= len(trace) <= 5
    assert trace[-1].filename == __file__ and ".tanh()" in trace[-1].line
    assert not any(f.filename.startswith(package) for f in trace)


def test_check_nan_false_records_but_does_not_raise():
    with detect_anomaly(check_nan=False):
        y = minigrad.tensor([-1.0], requires_grad=True).log()
        y.sum().backward()
    assert y.grad_fn._trace[-1].filename == __file__


def test_decorator_and_restoring_the_previous_mode():
    @detect_anomaly()
    def step(x):
        assert is_anomaly_enabled()
        return x.log()

    with pytest.raises(AnomalyError):
        step(minigrad.tensor([-1.0]))
    assert not is_anomaly_enabled() and mode.current_modes() == ()


def test_set_detect_anomaly_plain_call_and_context():
    set_detect_anomaly(True)
    try:
        assert is_anomaly_enabled()
        with set_detect_anomaly(False):
            assert not is_anomaly_enabled()
            minigrad.tensor([-1.0]).log()  # unchecked
        assert is_anomaly_enabled()
    finally:
        set_detect_anomaly(False)
    assert not is_anomaly_enabled()


def test_higher_order_backward_is_checked_too():
    x = minigrad.tensor([0.0, 1.0], requires_grad=True)
    with detect_anomaly():
        (g,) = minigrad.autograd.grad((x ** 3).sum(), x, create_graph=True)  # 3x^2: fine at 0
        (gg,) = minigrad.autograd.grad(g.sum(), x)
        assert gg.tolist() == [0.0, 6.0]
        (g,) = minigrad.autograd.grad((x ** 1.5).sum(), x, create_graph=True)  # 1.5 x^0.5
        with pytest.raises(AnomalyError, match="Backward' returned inf values"):
            minigrad.autograd.grad(g.sum(), x)  # 0.75 x^-0.5 is inf at 0
