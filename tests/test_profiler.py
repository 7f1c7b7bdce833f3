"""The profiler: one event per op in call order, shapes and dtypes, bytes allocated, forward vs
backward, nesting inside composite ops and labelled ranges, the summary table, and a Chrome trace
whose JSON chrome://tracing and Perfetto accept."""

import json

import numpy as np
import pytest

import minigrad as mg
from minigrad import nn
from minigrad.autograd import mode
from minigrad.profiler import profile, record_function


def test_records_every_op_in_call_order_with_shapes_and_dtypes():
    a, b = mg.ones(2, 3), mg.ones(3, dtype=mg.float16)
    with profile() as prof:
        c = a * 2.0
        d = c.sum(1)
        b.exp()
    assert [e.name for e in prof.events] == ["Mul", "Sum", "Exp"]
    mul, s, exp = prof.events
    assert mul.input_shapes == [(2, 3)] and s.input_shapes == [(2, 3)] and exp.input_dtypes == ["float16"]
    assert all(e.phase == "forward" and e.depth == 0 and e.parent is None for e in prof.events)
    assert [e.start_ns for e in prof.events] == sorted(e.start_ns for e in prof.events)
    assert all(e.duration_ns > 0 and e.self_ns == e.duration_ns for e in prof.events)
    assert d.shape == (2,)


def test_bytes_count_new_outputs_not_views():
    x = mg.ones(4, 5)
    with profile() as prof:
        x + 1.0
        x.reshape(20)
        x.transpose(0, 1)
        x.max(1)  # two outputs: values (float32) and indices (int64)
    assert [e.bytes for e in prof.events] == [80, 0, 0, 4 * 4 + 4 * 8]


def test_backward_ops_are_labelled_backward():
    w = mg.ones(3, 2, requires_grad=True)
    x = mg.ones(4, 3)
    with profile() as prof:
        loss = (x @ w).tanh().sum()
        loss.backward()
    phases = {(e.name, e.phase) for e in prof.events}
    assert {("Matmul", "forward"), ("Tanh", "forward"), ("Sum", "forward")} <= phases
    assert ("TanhBackward", "backward") in phases and ("Matmul", "backward") in phases
    first_backward = next(i for i, e in enumerate(prof.events) if e.phase == "backward")
    assert all(e.phase == "backward" for e in prof.events[first_backward:])


class Composite(mg.autograd.Function):
    """A user op whose forward is made of ops: those run inside it."""

    @staticmethod
    def forward(ctx, x):
        return (x * x).exp()

    @staticmethod
    def backward(ctx, g):
        return g


def test_ops_inside_a_composite_are_nested_under_it():
    x = mg.ones(8)
    with profile() as prof:
        Composite.apply(x)
        x.neg()
    outer, mul, exp, neg = prof.events
    assert outer.name == "Composite" and (mul.name, exp.name) == ("Mul", "Exp")
    assert mul.parent == exp.parent == outer.id and mul.depth == exp.depth == 1 and neg.parent is None
    assert outer.self_ns == outer.duration_ns - mul.duration_ns - exp.duration_ns
    end = outer.start_ns + outer.duration_ns
    assert all(outer.start_ns <= c.start_ns and c.start_ns + c.duration_ns <= end for c in (mul, exp))


def test_record_function_labels_a_range():
    with profile() as prof:
        with record_function("step"):
            mg.ones(3) * 2
    step, mul = prof.events
    assert step.name == "step" and mul.parent == step.id and step.bytes == 0
    with record_function("nothing to record"):  # no profiler: nothing happens
        mg.ones(3) * 2


def test_table_and_key_averages():
    model = nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 2))
    x = mg.ones(5, 6)
    with profile() as prof:
        for _ in range(3):
            model(x).sum().backward()
    averages = prof.key_averages()
    linear = next(a for a in averages if a.key == "Linear" and a.phase == "forward")
    assert linear.count == 6 and linear.bytes == 3 * (5 * 4 + 5 * 2) * 4
    assert linear.mean_ns == pytest.approx(linear.total_ns / 6)
    assert [a.total_ns for a in averages] == sorted((a.total_ns for a in averages), reverse=True)
    text = prof.table(sort_by="count", row_limit=3)
    lines = text.splitlines()
    assert lines[0].split()[:4] == ["Name", "Phase", "Calls", "Total"] and "Self %" in lines[0]
    assert len(lines) == 2 + 3 + 2  # header, rule, three rows, rule, total
    counts = [int(line.split()[2]) for line in lines[2:5]]
    assert counts == sorted(counts, reverse=True)
    assert "Self time total" in lines[-1]
    assert prof.table(sort_by="cpu_time_total") == prof.key_averages().table("total_time")
    by_shape = prof.table(group_by_input_shape=True, row_limit=100)
    assert "[(5, 6), (4, 6), (4,)]" in by_shape
    with pytest.raises(ValueError, match="sort_by"):
        prof.table(sort_by="speed")


def test_self_percentages_add_up():
    with profile() as prof:
        (mg.ones(10) * 3).sum()
    rows = prof.table().splitlines()[2:-2]
    assert sum(float(r.split("%")[0].split()[-1]) for r in rows) == pytest.approx(100, abs=0.2)


def test_chrome_trace_is_valid_trace_event_json(tmp_path):
    x = mg.ones(4, 4, requires_grad=True)
    with profile() as prof:
        with record_function("forward"):
            y = Composite.apply(x @ x)
        y.sum().backward()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    assert len(events) == len(prof.events)
    for e in events:
        assert e["ph"] == "X" and isinstance(e["name"], str) and e["cat"] in ("forward", "backward")
        assert isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float)) and e["dur"] >= 0
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        assert isinstance(e["args"]["input_shapes"], list) and isinstance(e["args"]["bytes"], int)
    by_name = {e["name"]: e for e in events}
    assert by_name["Matmul"]["args"]["input_shapes"] == [[4, 4], [4, 4]]
    outer, inner = by_name["forward"], by_name["Composite"]  # nesting shows as containment in time
    assert outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"]
    assert np.all(np.diff([e["ts"] for e in events]) >= 0)


class Failing(mg.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x.exp()
        raise ValueError("no")


def test_a_failed_op_leaves_no_open_frame_and_the_hook_is_removed():
    assert mode.active(profile) is None
    with profile() as prof:
        with pytest.raises(ValueError):
            Failing.apply(mg.ones(2))
        mg.ones(2) + 1.0
    assert mode.active(profile) is None
    assert [(e.name, e.depth, e.parent) for e in prof.events] == [("Exp", 1, 1), ("Add", 0, None)]
    with pytest.raises(ZeroDivisionError):
        with profile():
            1 / 0
    assert mode.active(profile) is None
    with profile() as outer:  # an inner profile takes the events while it is active
        with profile() as inner:
            mg.ones(2) + 1.0
            assert mode.active(profile) is inner and mode.current_modes() == (outer, inner)
        assert mode.active(profile) is outer
    assert [e.name for e in inner.events] == ["Add"] and not outer.events
