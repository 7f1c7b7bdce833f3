"""The executor: same results as ``run_graph`` (forward graphs, training steps with effects, random
programs, parallel levels), buffers freed at their last use, and the planned peak memory."""

import copy
import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minigrad as mg
from minigrad import nn, optim
from minigrad.graph import Graph, trace
from minigrad.graph.executor import Executor
from minigrad.graph.passes import PassManager, default_passes
from minigrad.graph.trace import TENSOR_ARG, run_graph
from minigrad.ops.elementwise import Op
from test_passes import random_program, step


def randn(*shape, requires_grad=False):
    return mg.randn(*shape, dtype=mg.float64, requires_grad=requires_grad)


def close(got, want):
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("parallel", [False, True])
def test_a_traced_mlp_runs_as_with_run_graph(parallel):
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3)).to(mg.float64)
    traced = trace(lambda x: (model(x).softmax(-1), model(x).max(dim=1)[0]), randn(5, 4))
    ex = Executor(traced.graph, parallel=parallel)
    for _ in range(2):
        x = randn(5, 4)
        close(ex.run([x]), run_graph(traced.graph, [x]))
    close(ex(x), run_graph(traced.graph, [x]))
    with pytest.raises(TypeError, match="takes 1 input"):
        ex.run([x, x])


@pytest.mark.parametrize("parallel", [False, True])
def test_a_training_step_applies_its_effects(parallel):
    model = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1)).to(mg.float64)
    twin = copy.deepcopy(model)
    opts = [optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (model, twin)]
    data = [(randn(6, 3), randn(6, 1)) for _ in range(5)]

    def make_step(m, opt):
        def step(x, t):
            opt.zero_grad()
            loss = ((m(x) - t) ** 2).mean()
            loss.backward()
            opt.step()
            return loss
        return step

    for m, opt in zip((model, twin), opts):
        make_step(m, opt)(*data[0])
    traced = trace(make_step(model, opts[0]), *data[1])
    eager = make_step(twin, opts[1])
    eager(*data[1])
    assert "saved" in [n.op for n in traced.graph]  # ReLU's mask: the executor keeps the op's ctx for it
    ex = Executor(PassManager(default_passes())(traced.graph), parallel=parallel)
    for x, t in data[2:]:
        (loss,) = ex.run([x, t])
        np.testing.assert_allclose(loss, eager(x, t).item(), rtol=1e-12)
    for p, q in zip(model.parameters(), twin.parameters()):
        np.testing.assert_allclose(p.data, q.data, rtol=1e-12)
        np.testing.assert_allclose(p.grad.data, q.grad.data, rtol=1e-12)


def _chain(n=1000, length=4):
    def f(x):
        for _ in range(length):
            x = x.tanh() * 0.5
        return x.reshape(10, n // 10).sum()
    return trace(f, randn(n))


def test_the_planned_peak_counts_what_is_alive_at_each_step():
    traced = _chain()
    ex = Executor(traced.graph)
    # each op reads one 8000-byte buffer and writes another; the first reads the input (not counted)
    assert ex.planned_peak == 16000
    assert ex.planned_live[:3] == [0, 8000, 16000] and ex.planned_live[-1] == 8  # the returned scalar
    assert ex.planned_total == 64008 and "planned peak 16.00 kB (keeping every value: 64.01 kB)" in ex.report()
    x = randn(1000)
    close(ex.run([x]), run_graph(traced.graph, [x]))


def test_views_share_their_buffer_and_tuples_count_their_members():
    traced = trace(lambda x: x.reshape(8, 125).T.exp().max(dim=0)[0], randn(1000))
    ex = Executor(traced.graph)
    # Exp's 8000 bytes, and alongside them MaxDim's values (8 float64) and indices (8 int64)
    assert ex.planned_peak == 8000 + 64 + 64
    x = randn(1000)
    close(ex.run([x]), run_graph(traced.graph, [x]))


def test_buffers_are_freed_after_their_last_use():
    """A probe op remembers how many probes' outputs are still alive when it runs."""
    import weakref

    alive = []

    class Probe(Op):
        @staticmethod
        def forward(ctx, a):
            out = a + 1.0
            alive.append(sum(r() is not None for r in refs))
            refs.append(weakref.ref(out))
            return out

    refs = []
    g = Graph()
    f64 = np.dtype("float64")
    v = g.add_node("placeholder", shape=(100,), dtype=f64, name="%x")
    for _ in range(5):
        v = g.add_node("Probe", [v], shape=(100,), dtype=f64, fn=Probe, meta={"args": (TENSOR_ARG,), "kwargs": ()})
    g.set_outputs([v])
    Executor(g).run([randn(100)])
    assert alive == [0, 1, 1, 1, 1]  # only the input of the running probe is alive
    alive.clear(), refs.clear()
    run_graph(g, [randn(100)])
    assert alive == [0, 1, 2, 3, 4]  # run_graph keeps every value to the end


def test_the_measured_peak_matches_the_plan():
    memory = pytest.importorskip("minigrad.memory")
    if not hasattr(memory, "track"):
        pytest.skip("minigrad.memory.track is not available")
    traced = _chain()
    ex = Executor(traced.graph)
    ex.run([randn(1000)], measure=True)
    assert ex.measured_peak == ex.planned_peak == 16000
    assert "measured peak 16.00 kB" in ex.report()
    ex.run([randn(1000)])
    assert ex.measured_peak is None


def test_parallel_levels_run_independent_branches():
    class Twice(mg.autograd.Function):  # a user Function: runs under no_grad, so on the main thread
        @staticmethod
        def forward(ctx, a):
            return a * 2

    def f(x):
        branches = [x.exp(), x.sin(), x.cos(), x.tanh(), (x * 2).sigmoid(), Twice.apply(x), Twice.apply(x.T)]
        return functools.reduce(lambda a, b: a + b, branches)

    traced = trace(f, randn(64, 64))
    ex = Executor(traced.graph, parallel=True, max_workers=2)
    assert max(sum(n.op not in ("placeholder", "output") for n in step) for step in ex.steps) >= 4
    x = randn(64, 64)
    for _ in range(3):  # threads finish in any order; the result must not depend on it
        close(ex.run([x]), run_graph(traced.graph, [x]))
    assert mg.is_grad_enabled()


def test_nodes_run_through_run_node_whatever_their_fn():
    """A fused kernel is an ordinary node with its own callable: the executor only calls run_node."""
    class AddMulTanh(Op):
        @staticmethod
        def forward(ctx, a, b, scale):
            return ctx.xp.tanh((a + b) * scale)

    g = Graph()
    f64 = np.dtype("float64")
    a = g.add_node("placeholder", shape=(3,), dtype=f64, name="%a")
    b = g.add_node("placeholder", shape=(3,), dtype=f64, name="%b")
    fused = g.add_node("AddMulTanh", [a, b], {"scale": 0.5}, shape=(3,), dtype=f64, fn=AddMulTanh,
                       meta={"args": (TENSOR_ARG, TENSOR_ARG, "scale"), "kwargs": ()})
    g.set_outputs([fused])
    x, y = randn(3), randn(3)
    close(Executor(g).run([x, y]), [np.tanh((x.numpy() + y.numpy()) * 0.5)])


@settings(max_examples=25, deadline=None)
@given(st.lists(step, min_size=1, max_size=12), st.integers(0, 2**16), st.booleans(), st.booleans())
def test_random_programs_run_as_in_eager(steps, seed, optimise, parallel):
    traced, inputs, eager = random_program(steps, seed)
    graph = PassManager(default_passes())(traced.graph) if optimise else traced.graph
    ex = Executor(graph, parallel=parallel)
    close(ex.run(inputs), eager)
    assert ex.planned_peak <= sum(n.shape is not None and np.prod(n.shape) * n.dtype.itemsize for n in graph)
