"""The executor: same results as ``run_graph`` (forward graphs, training steps with effects, random
programs, the threaded scheduler), buffers freed at their last use, the planned peak memory, and updates
computed straight into their tensors only once nothing reads the old value (random update programs)."""

import copy
import functools
import os
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minigrad as mg
from minigrad import nn, optim
from minigrad.graph import Graph, trace
from minigrad.graph import overlap, parallel
from minigrad.graph.executor import Executor
from minigrad.graph.passes import PassManager, default_passes, fuse_elementwise, rewrite
from minigrad.graph.trace import TENSOR_ARG, run_graph
from minigrad.graph.writeback import drop_overwritten_copies
from minigrad.ops.elementwise import Op
from helpers import AliveProbe, skip_if_kernels_cannot_run, to_numpy, training_step
from test_passes import random_program, step


def randn(*shape, requires_grad=False):
    return mg.randn(*shape, dtype=mg.float64, requires_grad=requires_grad)


def close(got, want):
    for a, b in zip(got, want):
        np.testing.assert_allclose(to_numpy(a), to_numpy(b), rtol=1e-12, atol=1e-12)


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


def mse(y, t):
    return ((y - t) ** 2).mean()


@pytest.mark.parametrize("parallel", [False, True])
def test_a_training_step_applies_its_effects(parallel):
    model = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1)).to(mg.float64)
    twin = copy.deepcopy(model)
    opts = [optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (model, twin)]
    data = [(randn(6, 3), randn(6, 1)) for _ in range(5)]

    for m, opt in zip((model, twin), opts):
        training_step(m, opt, mse)(*data[0])
    traced = trace(training_step(model, opts[0], mse), *data[1])
    eager = training_step(twin, opts[1], mse)
    eager(*data[1])
    assert "saved" in [n.op for n in traced.graph]  # ReLU's mask: the executor keeps the op's ctx for it
    ex = Executor(PassManager(default_passes())(traced.graph), parallel=parallel)
    for x, t in data[2:]:
        (loss,) = ex.run([x, t])
        np.testing.assert_allclose(to_numpy(loss), eager(x, t).item(), rtol=1e-12)
    for p, q in zip(model.parameters(), twin.parameters()):
        close([p, p.grad], [q, q.grad])


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
    probe = AliveProbe()
    g = Graph()
    v = g.add_node("placeholder", shape=(100,), dtype=np.dtype("float64"), name="%x")
    for _ in range(5):
        v = probe.add(g, v)
    g.set_outputs([v])
    Executor(g).run([randn(100)])
    assert probe.alive == [0, 1, 1, 1, 1]  # only the input of the running probe is alive
    probe.clear()
    run_graph(g, [randn(100)])
    assert probe.alive == [0, 1, 2, 3, 4]  # run_graph keeps every value to the end


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


def test_the_threaded_scheduler_runs_independent_branches(monkeypatch):
    monkeypatch.setattr(parallel, "WAKE_SECONDS", 60.0)  # the helper gets its branch, however busy the machine
    class Twice(mg.autograd.Function):  # a user Function: runs under no_grad, which is per thread
        @staticmethod
        def forward(ctx, a):
            return a * 2

    def f(x):
        branches = [x.exp(), x.sin(), x.cos(), x.tanh(), (x * 2).sigmoid(), Twice.apply(x), Twice.apply(x.T)]
        return functools.reduce(lambda a, b: a + b, branches)

    traced = trace(f, randn(64, 64))
    ex = Executor(traced.graph, parallel=True, max_workers=2)
    assert ex.parallel and len(ex.parallel_plan.handoff) >= 7  # forced: every op may go to the helper
    x = randn(64, 64)
    for _ in range(3):  # threads finish in any order; the result must not depend on it
        close(ex.run([x], timeline=True), run_graph(traced.graph, [x]))
        assert {s.thread for s in ex.timeline} == {0, 1}
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


# -- updates computed in place ------------------------------------------------------------------------
@pytest.mark.parametrize("parallel", [False, True])
def test_an_optimizer_step_writes_its_updates_into_the_tensors(parallel):
    model = nn.Linear(3, 2).to(mg.float64)
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(x):
        opt.zero_grad()
        (model(x) ** 2).sum().backward()
        opt.step()

    step(randn(4, 3))  # the momentum buffers exist before the trace
    ex = Executor(trace(step, randn(4, 3)).graph, parallel=parallel)
    tensors = list(model.parameters()) + [opt.state[p]["momentum_buffer"] for p in model.parameters()]
    copies = [n for n in ex.effects if n.op == "copy_"]
    # buf.mul_(0.9).add_(g) and p.sub_(0.1 * buf): every new value lands in its tensor as it is computed
    assert set(ex.writes.into.values()) == {n.inputs[0] for n in copies} and ex.writes.absorbed == set(copies)
    assert sorted(n.op for n in ex.writes.into) == ["Add", "Add", "Mul", "Mul", "Sub", "Sub"]
    arrays = [t.array for t in tensors]
    before = [a.copy() for a in arrays]
    x = randn(4, 3)
    ex.run([x])
    assert all(t.array is a for t, a in zip(tensors, arrays))  # the same buffers, updated
    want = [a.copy() for a in arrays]
    for a, b in zip(arrays, before):
        a[...] = b
    run_graph(ex.graph, [x])
    close(arrays, want)


def _updates(f, x, p, fuse=False):
    """Run the traced ``f`` (which updates ``p`` in place) with the executor and with ``run_graph``
    from the same start; checks that both agree and returns the executor."""
    if fuse:
        skip_if_kernels_cannot_run()
    graph = trace(f, x).graph
    graph = fuse_elementwise(graph) if fuse else graph
    ex = Executor(graph)
    start = p.array.copy()
    got = ex.run([x]) + [p.array.copy()]
    p.array[...] = start
    close(got, run_graph(graph, [x]) + [p.array])
    return ex


def _reads_before_an_update(p):
    """Two steps that read ``p`` (itself, or a view of it) and then double it in place."""
    def read_before(x):
        with mg.no_grad():
            y = p * x
            p.mul_(2)
        return y.exp()

    def view_read_before(x):
        with mg.no_grad():
            y = p.T * x
            p.mul_(2)
        return y.exp()

    return read_before, view_read_before


def test_a_value_moves_into_its_tensor_only_after_the_old_value_is_read():
    p = randn(3, 3, requires_grad=True)

    def returns_the_new_value(x):  # the caller must not get the tensor's memory
        with mg.no_grad():
            p.mul_(x)
        return p

    for f in _reads_before_an_update(p):
        ex = _updates(f, randn(3, 3), p)
        assert [n.op for n in ex.writes.into] == ["Mul"]
    assert not _updates(returns_the_new_value, randn(3, 3), p).writes.into


def test_fused_with_its_reader_the_update_runs_first():
    p = randn(3, 3, requires_grad=True)
    for f in _reads_before_an_update(p):
        # fused with exp, the read of the old value moves to exp's step, after the update
        ex = _updates(f, randn(3, 3), p, fuse=True)
        assert [n.op for n in ex.schedule if n.op in ("Mul", "fused")] == ["Mul", "fused"]
        assert not ex.writes.into and not ex.writes.absorbed


def test_copies_that_a_later_copy_overwrites_are_skipped():
    p = randn(3, 3, requires_grad=True)

    def twice(x):
        with mg.no_grad():
            p.mul_(x)
            p.add_(x.exp())
            p.sub_(x)
        return x * 1

    ex = _updates(twice, randn(3, 3), p)
    assert len(ex.writes.absorbed) == 3 and len(ex.writes.into) == 3


def test_a_product_on_the_helper_thread_is_waited_for_before_its_input_is_updated(monkeypatch):
    """``x @ w`` runs on the helper thread while ``(x @ v) @ v`` runs here; ``w.mul_(2)`` is
    computed into w's memory, so the run waits for the product first."""
    monkeypatch.setattr(overlap, "OVERLAP_MIN_MACS", 0)
    w, v = randn(64, 64), randn(64, 64)

    def program(w, v):
        def f(x):
            a = x @ w
            b = (x @ v) @ v
            with mg.no_grad():
                w.mul_(2)
            return a + b
        return f

    ex = Executor(trace(program(w, v), randn(64, 64)).graph)
    (product, wait), = ex.overlap.items()
    assert product.inputs[1].op == "parameter" and ex.writes.into.get(ex.schedule[wait]) is product.inputs[1]
    twins = [w.clone(), v.clone()]
    for _ in range(3):
        x = randn(64, 64)
        close(ex.run([x]), [program(*twins)(x).numpy()])
        close([w.array], [twins[0].array])


def test_a_product_the_busy_helper_has_not_started_is_computed_here(monkeypatch):
    """While the helper thread is held by other work, the run does not wait for it to be free:
    the product it was handed, not started yet, is taken back and computed on this thread."""
    monkeypatch.setattr(overlap, "OVERLAP_MIN_MACS", 0)
    w, v = randn(64, 64), randn(64, 64)

    def f(x):
        return x @ w + (x @ v) @ v

    ex = Executor(trace(f, randn(64, 64)).graph)
    assert ex.overlap
    release = threading.Event()
    timer = threading.Timer(60, release.set)  # were the run to wait for the helper, it would go on after this
    timer.start()
    held = overlap.helper().submit(release.wait)
    try:
        x = randn(64, 64)
        close(ex.run([x]), [f(x).numpy()])
        assert not release.is_set() and not held.done()  # the helper was still held: computed here
    finally:
        release.set()
        timer.cancel()
        held.result()


def test_every_executor_shares_one_helper_thread_and_a_forked_child_makes_its_own():
    first = overlap.helper()
    assert overlap.helper() is first  # not one idle thread per compiled graph
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the parent's thread does not exist here, so a new one must run the work
        ok = overlap.helper() is not first and overlap.helper().submit(lambda: 7).result(timeout=10) == 7
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.waitpid(pid, 0)
    assert answer == b"1"


def test_a_timed_run_records_every_node_and_effect_and_computes_the_same():
    model = nn.Linear(3, 2).to(mg.float64)
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step = training_step(model, opt, lambda y, t: ((y - t) ** 2).mean())
    x, t = randn(4, 3), randn(4, 2)
    step(x, t)
    ex = Executor(trace(step, x, t).graph)
    twin = Executor(ex.graph)
    before = [p.array.copy() for p in model.parameters()]
    (timed,) = ex.run([x, t], time_nodes=True)
    assert set(ex.node_seconds) == {n for n in ex.schedule if n.op != "placeholder"}
    for p, b in zip(model.parameters(), before):
        p.array[...] = b
    close([timed], twin.run([x, t]))
    assert not twin.node_seconds


def test_an_overwritten_copy_is_dropped_and_the_one_left_counts_every_write():
    """``p.mul_(x)`` and ``p.add_(1)`` are overwritten by ``p.sub_(x)``: one copy into p stays,
    standing for three writes (p's version moves by 3, as in eager)."""
    def program(p, q):
        def f(x):
            with mg.no_grad():
                p.mul_(x)
                q.copy_(p.T.T)
                p.add_(1)
                p.sub_(x)
            return x * 1
        return f

    p, q = randn(3, 3), randn(3, 3)
    graph = drop_overwritten_copies(trace(program(p, q), randn(3, 3)).graph)  # tracing runs f once
    assert [n.attrs.get("writes", 1) for n in graph if n.op == "copy_"] == [1, 3]
    twins = [p.clone(), q.clone()]
    ex = Executor(graph)
    for _ in range(2):
        x = randn(3, 3)
        versions = [t._version for t in (p, q, *twins)]
        close(ex.run([x]), [program(*twins)(x).numpy()])
        close([p.array, q.array], [t.array for t in twins])
        assert [t._version - v for t, v in zip((p, q, *twins), versions)] == [3, 1, 3, 1]


def test_a_copy_is_kept_when_an_effect_before_the_next_one_reads_memory_it_may_change():
    """Between the two copies into p, a copy into q reads the input itself (not a fresh array):
    that input might be a view of p, so the first copy into p stays."""
    p, q = randn(3, 3), randn(3, 3)

    def f(x):
        with mg.no_grad():
            p.mul_(x)
            q.copy_(x)
            p.add_(1)
        return x * 1

    traced = trace(f, randn(3, 3)).graph
    (x,) = traced.placeholders
    into_q = [n for n in traced if n.op == "copy_"][1]
    reads_x = rewrite(traced, lambda n, rw: rw.copy(n, [rw[n.inputs[0]], rw[x]]) if n is into_q else None)
    assert len([n for n in drop_overwritten_copies(traced) if n.op == "copy_"]) == 2
    assert len([n for n in drop_overwritten_copies(reads_x) if n.op == "copy_"]) == 3


def test_a_constant_sharing_memory_with_an_updated_tensor_keeps_the_old_values():
    """The plan cannot see that two arrays share memory; the run checks, and copies at the end instead."""
    p = randn(3, 4, requires_grad=True)
    flat = p.detach().reshape(12)  # a constant of the trace: another array on p's memory

    def f(x):
        with mg.no_grad():
            p.mul_(2)
            return flat * x

    ex = _updates(f, randn(12), p)
    assert ex.writes.into and ex.writes.overlaps


def test_a_tensor_given_another_array_is_updated_in_that_array():
    p = randn(3, 4, requires_grad=True)

    def f(x):
        with mg.no_grad():
            p.mul_(x)
        return x * 1

    x = randn(3, 4)
    ex = _updates(f, x, p)
    new = p.array.astype(np.float32)  # another array, of another dtype than traced
    p.array = new
    want = to_numpy(new) * x.numpy()
    ex.run([x])
    assert p.array is new
    np.testing.assert_allclose(to_numpy(new), want, rtol=1e-6)


def test_a_returned_gradient_is_not_the_tensors_grad():
    w = randn(3, 3, requires_grad=True)

    def f(x):
        w.grad = None
        (w @ x).sum().backward()
        return w.grad

    ex = Executor(trace(f, randn(3, 2)).graph)
    (g,) = ex.run([randn(3, 2)])
    assert not ex.writes.own_grads and not w.device.xp.shares_memory(g, w.grad.array)


UPDATE = st.tuples(st.sampled_from(["read", "view", "mul_", "add_", "sub_", "copy_"]), st.integers(0, 99),
                   st.integers(0, 99))


@pytest.mark.parametrize("optimise", [False, True])
@settings(max_examples=20, deadline=None)
@given(st.lists(UPDATE, min_size=1, max_size=10), st.booleans())
def test_random_updates_run_as_in_eager(optimise, steps, parallel):
    """Reads and in-place updates of two tensors in any order: the executor (with the passes and
    fusion, whose groups move reads of an old value later) ends where eager does."""
    if optimise:
        skip_if_kernels_cannot_run()
    def program(ps):
        def f(x):
            values = [x]
            with mg.no_grad():
                for kind, i, j in steps:
                    p, v = ps[i % 2], values[j % len(values)]
                    if kind == "read":
                        values.append((p * v).tanh())
                    elif kind == "view":
                        values.append(p.T.T - v)
                    elif kind == "copy_":
                        p.copy_(v * 0.5)
                    else:
                        getattr(p, kind)(v)
            return values[-1] + values[len(values) // 2] * 0.5
        return f

    ps = [randn(3, 4, requires_grad=True) for _ in range(2)]
    traced = trace(program(ps), randn(3, 4))
    graph = (fuse_elementwise(drop_overwritten_copies(PassManager(default_passes())(traced.graph))) if optimise
             else traced.graph)
    ex = Executor(graph, parallel=parallel)
    twins = [p.detach().clone().requires_grad_() for p in ps]
    for _ in range(2):
        x = randn(3, 4)
        close(ex.run([x]), [program(twins)(x).numpy()])
        close([p.array for p in ps], [t.array for t in twins])
