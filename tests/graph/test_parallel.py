"""Ordering edges and the threaded executor: every order, pass and executor honours ``Node.after``
(a write into memory after the reads of the old contents, a call after a value is ready); the
threaded scheduler computes what the sequential run does whatever order its threads finish in,
frees buffers when their last reader finishes, and the cost model keeps small graphs sequential."""

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minigrad as mg
from minigrad.graph import Graph, GraphError, trace
from minigrad.graph.executor import TRIALS, Executor
from minigrad.graph import parallel
from minigrad.graph.parallel import MIN_HANDOFF_SECONDS, branches, node_seconds, plan_parallel
from minigrad.graph.streams import plan_streams
from minigrad.graph.passes import (PassManager, default_passes, eliminate_common_subexpressions, eliminate_dead_code,
                                   fold_constants, fuse_elementwise, simplify)
from minigrad.graph.trace import run_graph
from minigrad.ops.elementwise import Op
from helpers import AliveProbe, to_numpy
from test_passes import random_program, step


def randn(*shape):
    return mg.randn(*shape, dtype=mg.float64)


def add_write(graph, target, value, after=()):
    """A call node that adds ``value``'s array into ``target``'s, in place (as ``w += d``)."""
    def write(w, d):
        w += d
    return graph.add_node("call", [target, value], {"fn": write}, after=after, name="%write")


def reader_and_write(with_edge):
    """``y = tanh(tanh(tanh(x))) @ w`` and, added after it as in the program's order, ``w += d``:
    the product must read the old ``w``. Without an ordering edge nothing in the graph says so."""
    traced = trace(lambda x, w, d: x.tanh().tanh().tanh() @ w, randn(4, 4), randn(4, 4), randn(4, 4))
    g = traced.graph
    x, w, d = g.placeholders
    product = next(n for n in g if n.op == "Matmul")
    add_write(g, w, d, after=[product] if with_edge else ())
    return g


def inputs():
    rng = np.random.default_rng(0)
    return [mg.tensor(rng.standard_normal((4, 4))) for _ in range(3)]


def expected(x, w, d):
    return np.tanh(np.tanh(np.tanh(to_numpy(x)))) @ to_numpy(w)


# -- the IR -------------------------------------------------------------------------------------------
def test_an_ordering_edge_orders_the_graph_without_being_read():
    g = Graph()
    a = g.add_node("placeholder", name="%a")
    late = g.add_node("call", [a], {"fn": print}, name="%late")
    early = g.add_node("call", [a], {"fn": print}, name="%early")
    g.add_ordering(early, late)
    assert [n.name for n in g.topological_order()] == ["%a", "%early", "%late"]
    assert late.after == (early,) and early.followers == [late] and late.inputs == (a,)
    assert [[n.name for n in level] for level in g.levels()] == [["%a"], ["%early"], ["%late"]]
    assert "after %early" in late.format() and "style=dashed" in g.to_dot()
    twin = g.copy()
    assert [n.name for n in twin.nodes[2].after] == ["%early"]
    with pytest.raises(GraphError, match="still used by %late"):
        g.erase(early)
    with pytest.raises(GraphError, match="cannot run after itself"):
        g.add_ordering(late, late)
    g.add_ordering(late, early)
    with pytest.raises(GraphError, match="cycle"):
        g.topological_order()


def test_replacing_a_node_moves_what_waited_for_it():
    g = Graph()
    a, b = g.add_node("placeholder", name="%a"), g.add_node("placeholder", name="%b")
    c = g.add_node("call", [a], {"fn": print}, after=[a])
    g.replace_all_uses_with(a, b)
    assert c.inputs == (b,) and c.after == (b,) and a.followers == []


# -- the passes -----------------------------------------------------------------------------------------
def test_dead_code_keeps_calls_and_what_they_are_ordered_after():
    g = reader_and_write(with_edge=True)
    g.set_outputs([])  # nothing returned: only the write, ordered after the product, keeps it alive
    kept = eliminate_dead_code(g)
    assert [n.op for n in kept.topological_order()].count("Matmul") == 1
    assert any(n.op == "call" for n in kept)
    no_edge = reader_and_write(with_edge=False)
    no_edge.set_outputs([])
    assert "Matmul" not in [n.op for n in eliminate_dead_code(no_edge)]


def test_common_subexpressions_across_an_ordering_edge_stay_apart():
    """``w * 2`` read before and after a write into ``w`` are two values, not one."""
    traced = trace(lambda w, d: (w * 2, w * 2), randn(3), randn(3))
    g = traced.graph
    w, d = g.placeholders
    first, second = [n for n in g if n.op == "Mul"]
    write = add_write(g, w, d, after=[first])
    g.add_ordering(write, second)
    merged = eliminate_common_subexpressions(g)
    assert [n.op for n in merged].count("Mul") == 2
    for ex in (Executor(merged), Executor(merged, parallel=True)):
        wt, dt = randn(3), randn(3)
        w0 = to_numpy(wt).copy()
        before, after = (to_numpy(v) for v in ex.run([wt, dt]))
        np.testing.assert_allclose(before, w0 * 2)
        np.testing.assert_allclose(after, (w0 + to_numpy(dt)) * 2)
    unordered = trace(lambda w: (w * 2, (w * 2).exp()), randn(3)).graph
    assert [n.op for n in eliminate_common_subexpressions(unordered)].count("Mul") == 1  # without edges they merge


def test_simplify_and_fusion_leave_ordered_nodes_where_they_are():
    """``a * 1.0`` simplifies away and ``exp``, ``+ 1``, ``sin`` fuse into one kernel, unless an
    ordering edge pins a node: then it stays a node of its own, run after what it waits for."""
    def f(a):
        return ((a * 1.0).exp() + 1.0).sin()
    plain = trace(f, randn(3)).graph
    assert "Mul" not in [n.op for n in simplify(plain)]
    assert [n.op for n in fuse_elementwise(simplify(plain))].count("fused") == 1
    g = trace(f, randn(3)).graph
    (x,) = g.placeholders
    mul, exp = (next(n for n in g if n.op == op) for op in ("Mul", "Exp"))
    marks = []
    mark = g.add_node("call", [x], {"fn": lambda a: marks.append("mark")}, name="%mark")
    g.add_ordering(mark, exp)
    g.add_ordering(mark, mul)
    simple = simplify(g)
    assert "Mul" in [n.op for n in simple]
    fused = fuse_elementwise(simple)
    assert [n.op for n in fused].count("Exp") == 1  # ordered: not inside a kernel
    assert all("Exp" not in n.attrs["ops"] for n in fused if n.op == "fused")
    x_in = randn(3)
    np.testing.assert_allclose(to_numpy(Executor(fused).run([x_in])[0]), np.sin(np.exp(to_numpy(x_in)) + 1.0))
    assert marks == ["mark"]


def test_constant_folding_skips_ordered_nodes_and_what_a_call_may_write():
    g = trace(lambda x: x + mg.tensor(np.ones(3)).exp(), randn(3)).graph
    assert "Exp" not in [n.op for n in fold_constants(g)]  # nothing ordered: folded
    const = next(n for n in g if n.op == "constant")
    g.add_node("call", [const], {"fn": lambda a: a.__iadd__(1.0)}, name="%bump")
    assert "Exp" in [n.op for n in fold_constants(g)]  # the call may change the constant first
    g = trace(lambda x: x + mg.tensor(np.ones(3)).exp(), randn(3)).graph
    (x,) = g.placeholders
    mark = g.add_node("call", [x], {"fn": lambda a: None}, name="%mark")
    g.add_ordering(mark, next(n for n in g if n.op == "Exp"))
    assert "Exp" in [n.op for n in fold_constants(g)]


# -- the executors ---------------------------------------------------------------------------------------
def test_without_an_ordering_edge_the_threaded_executor_writes_before_the_read():
    """The concrete failure the lesson shows: the write reads only sources, so it is ready at once,
    and the scheduler runs it while the product's long input chain is still computing."""
    x, w, d = inputs()
    want = expected(x, w, d)
    for with_edge in (False, True):
        g = reader_and_write(with_edge)
        for parallel in (False, True):
            ts = [mg.tensor(to_numpy(t).copy()) for t in (x, w, d)]
            got = to_numpy(Executor(g, parallel=parallel).run(ts)[0])
            right = np.allclose(got, want)
            assert right == (with_edge or not parallel), (with_edge, parallel)
            np.testing.assert_allclose(to_numpy(ts[1]), to_numpy(w) + to_numpy(d))  # the write ran once


def test_a_call_runs_after_the_values_it_is_ordered_after():
    traced = trace(lambda x: (x.exp(), x.sin().cos()), randn(50, 50))
    g = traced.graph
    done = []
    cos = next(n for n in g if n.op == "Cos")
    g.add_node("call", [], {"fn": lambda: done.append("step done")}, after=[cos])
    for parallel in (False, True):
        ex = Executor(g, parallel=parallel)
        ex.run([randn(50, 50)], timeline=True)
        when = {s.node.op: s for s in ex.timeline}
        assert when["call"].start >= when["Cos"].end
    assert done == ["step done"] * 2


def test_a_write_applied_at_the_end_cannot_be_waited_for():
    g = Graph()
    t = mg.zeros(3)
    p = g.add_node("parameter", shape=(3,), dtype=t.dtype, meta={"target": t}, name="%p")
    x = g.add_node("placeholder", shape=(3,), dtype=t.dtype, name="%x")
    copy = g.add_node("copy_", [p, x])
    g.add_node("call", [x], {"fn": print}, after=[copy], name="%log")
    with pytest.raises(GraphError, match="ordered after the write"):
        Executor(g)


def test_buffers_are_freed_when_their_last_reader_finishes_on_any_thread():
    probe = AliveProbe()
    g = Graph()
    x = g.add_node("placeholder", shape=(100,), dtype=np.dtype("float64"), name="%x")
    ends = []
    for _ in range(2):  # two chains of five probes: the threads interleave them
        v = x
        for _ in range(5):
            v = probe.add(g, v)
        ends.append(v)
    g.set_outputs(ends)
    for _ in range(5):
        probe.clear()
        Executor(g, parallel=True).run([randn(100)])
        assert len(probe.alive) == 10 and max(probe.alive) <= 3  # its own input, the other chain's, one in flight
    probe.clear()
    run_graph(g, [randn(100)])
    assert max(probe.alive) == 9  # run_graph keeps every value to the end
    memory = pytest.importorskip("minigrad.memory")
    ex = Executor(g, parallel=True)
    ex.run([randn(100)], measure=True)  # the tracker hears of each buffer on the main thread
    if hasattr(memory, "track"):
        assert 0 < ex.measured_peak <= 5 * 800 < ex.planned_total


@settings(max_examples=25, deadline=None)
@given(st.lists(step, min_size=1, max_size=12), st.integers(0, 2**16), st.booleans())
def test_random_programs_run_threaded_as_in_eager(steps, seed, optimise):
    traced, ins, eager = random_program(steps, seed)
    graph = PassManager(default_passes())(traced.graph) if optimise else traced.graph
    for parallel in (True, "auto"):
        for a, b in zip(Executor(graph, parallel=parallel).run(ins), eager):
            np.testing.assert_allclose(to_numpy(a), to_numpy(b), rtol=1e-12, atol=1e-12)


# -- branches: the units the threads take ------------------------------------------------------------------
def heads(x, *ws):
    """A sum of heads, each a branch of products and an elementwise op on x."""
    return sum(((x @ w).tanh() @ w.T for w in ws), start=x)


def test_a_head_is_one_branch_and_runs_whole_on_one_thread(monkeypatch):
    monkeypatch.setattr(parallel, "WAKE_SECONDS", 60.0)  # the helper gets its branch, however busy the machine
    ins = [randn(256, 256) for _ in range(5)]
    graph = trace(heads, *ins).graph
    ex = Executor(graph, parallel="auto")  # the model's cut (parallel=True cuts at every fork, w.T's too)
    assert ex.parallel
    tasks = ex.parallel_plan.tasks
    for product in (n for n in graph if n.op == "Matmul" and n.inputs[0].op == "placeholder"):
        (task,) = [t for t in tasks if product in t]  # the head: its products, tanh and transpose
        assert [n.op for n in task][:4] == ["Matmul", "Tanh", "Permute", "Matmul"]
    adds = [n for n in graph if n.op == "Add"]
    assert sum(len(t) == 1 and t[0] in adds for t in tasks) == len(adds) - 1  # the first add joins its head
    want = to_numpy(Executor(graph).run(ins)[0])
    for _ in range(3):
        np.testing.assert_allclose(to_numpy(ex.run(ins, timeline=True)[0]), want, rtol=1e-12)
        thread = {s.node: s.thread for s in ex.timeline}
        assert all(len({thread[n] for n in t if n in thread}) <= 1 for t in tasks)
        assert {s.thread for s in ex.timeline} == {0, 1}
    chain = trace(lambda x, w: ((x @ w).tanh() @ w).tanh(), randn(64, 64), randn(64, 64)).graph
    assert len([t for t in Executor(chain, parallel=True).parallel_plan.tasks if t[0].op != "placeholder"]) == 1


def test_a_fork_below_the_root_is_found_and_cut_there():
    def block(x, w):  # relu over a sum of two heavy branches: the fork lies below the root
        return ((x @ w).tanh() + (x @ w.T).exp()).relu()
    graph = trace(block, randn(128, 128), randn(128, 128)).graph
    tasks = Executor(graph, parallel=True).parallel_plan.tasks
    ops = [[n.op for n in t] for t in tasks if t[0].op != "placeholder"]
    assert sorted(ops) == sorted([["Matmul", "Tanh"], ["Permute", "Matmul", "Exp"], ["Add", "Relu"]])


def test_no_branch_spans_a_barrier_node():
    graph = trace(heads, *[randn(32, 32) for _ in range(3)]).graph
    schedule = [n for n in graph.topological_order() if n.op != "output"]
    index = {n: k for k, n in enumerate(schedule)}
    wall = next(n for n in schedule if n.op == "Tanh")  # as if this value were written into a tensor
    seconds = {n: node_seconds(n) for n in schedule}
    free = branches(schedule, seconds)
    assert any(min(index[n] for n in t) < index[wall] < max(index[n] for n in t) for t in free)
    walled = branches(schedule, seconds, barrier=frozenset([wall]))
    assert (wall,) in walled
    assert not any(min(index[n] for n in t) < index[wall] < max(index[n] for n in t) for t in walled)
    assert sorted(n.name for t in walled for n in t) == sorted(n.name for n in schedule)


def test_an_error_in_a_branch_on_a_helper_stops_the_run_and_is_raised(monkeypatch):
    monkeypatch.setattr(parallel, "WAKE_SECONDS", 60.0)  # a branch is left to the helper, however busy the machine
    class Boom(Op):
        @staticmethod
        def forward(ctx, a):
            if threading.current_thread() is not threading.main_thread():
                raise FloatingPointError("boom on the helper")
            return a * 2

    def f(x):  # four branches and nothing else: the helper gets at least one
        return tuple(Boom.apply(x.exp() + k) for k in range(4))
    x = randn(64, 64)
    graph = trace(f, x).graph
    with pytest.raises(FloatingPointError, match="boom on the helper"):
        Executor(graph, parallel=True).run([x])  # the main thread leaves the last ready branch to the idle helper
    fine = trace(heads, *[randn(16, 16) for _ in range(3)]).graph  # the shared helper is free again
    ins = [randn(16, 16) for _ in range(3)]
    np.testing.assert_allclose(to_numpy(Executor(fine, parallel=True).run(ins)[0]),
                               to_numpy(Executor(fine).run(ins)[0]), rtol=1e-12)


def test_the_threaded_plan_predicts_its_own_peak():
    ins = [randn(64, 64) for _ in range(5)]
    graph = trace(heads, *ins).graph
    one = Executor(graph, parallel=True, max_workers=1)  # one thread: the simulated order is the real one
    assert one.planned_parallel_peak >= one.planned_peak
    two = Executor(graph, parallel=True)
    assert two.planned_parallel_peak >= one.planned_peak and "threaded" in two.report()
    assert Executor(graph).planned_parallel_peak is None
    memory = pytest.importorskip("minigrad.memory")
    if hasattr(memory, "track"):
        one.run(ins, measure=True)
        assert one.measured_peak == one.planned_parallel_peak


# -- the cost model ------------------------------------------------------------------------------------
def test_the_cost_model_keeps_small_graphs_sequential_and_runs_wide_products_in_parallel():
    small = trace(lambda x: (x.exp() + x.sin()) * x.cos(), randn(8, 8)).graph
    ex = Executor(small, parallel="auto")
    assert not ex.parallel and not ex.parallel_plan.handoff
    assert "does not pay" in ex.parallel_plan.report()

    def heads(x, *ws):
        return sum(((x @ w).tanh() @ w.T for w in ws), start=x)
    wide = trace(heads, randn(256, 256), *[randn(256, 256) for _ in range(4)]).graph
    ex = Executor(wide, parallel="auto")
    plan = ex.parallel_plan
    assert ex.parallel and plan.parallel < 0.7 * plan.sequential
    assert {s.thread for s in plan.simulated} == {0, 1}
    products = [n for n in wide if n.op == "Matmul"]
    assert all(node_seconds(n) >= MIN_HANDOFF_SECONDS for n in products) and set(products) <= plan.handoff
    chain = trace(lambda x, w: ((x @ w).tanh() @ w).tanh() @ w, randn(256, 256), randn(256, 256)).graph
    assert not Executor(chain, parallel="auto").parallel  # a chain has nothing to run beside it
    ordered = plan_parallel([n for n in wide.topological_order() if n.op != "output"], workers=1)
    assert ordered.parallel == pytest.approx(ordered.sequential) and not ordered.pays
    ins = [randn(256, 256) for _ in range(5)]
    alone = Executor(wide, parallel=True, max_workers=1)  # the scheduler with no helper: every node inline
    alone.run(ins, timeline=True)
    assert {s.thread for s in alone.timeline} == {0}
    with pytest.raises(ValueError, match="parallel must be"):
        Executor(wide, parallel="yes")


def test_auto_times_both_ways_first_and_keeps_the_faster():
    def heads(x, *ws):
        return sum(((x @ w).tanh() @ w.T for w in ws), start=x)
    ins = [randn(256, 256) for _ in range(5)]
    graph = trace(heads, *ins).graph
    want = to_numpy(Executor(graph).run(ins)[0])
    ex = Executor(graph, parallel="auto")
    for _ in range(2 * TRIALS):  # the real trial: either way may win on a busy machine
        np.testing.assert_allclose(to_numpy(ex.run(ins)[0]), want, rtol=1e-12)
    assert ex.measured_choice is not None and ex._trials is None
    for threaded_seconds, keeps in ((2.0, False), (0.5, True)):  # the decision, fed known times
        ex = Executor(graph, parallel="auto")
        for _ in range(TRIALS):
            ex._trial(True, threaded_seconds)
            ex._trial(False, 1.0)
        assert ex.parallel is keeps and ("threaded" if keeps else "sequential") in ex.measured_choice
        np.testing.assert_allclose(to_numpy(ex.run(ins)[0]), want, rtol=1e-12)


# -- cuda: branches on streams, events for the edges ------------------------------------------------------
class Stream:
    """A recording stand-in for a cupy stream: the fake runs every kernel at once, so what is
    checked is the order a GPU would be bound to, read from the log (what each stream queued)."""

    def __init__(self, name, log):
        self.name, self.log = name, log

    def record(self):
        event = f"{self.name}#{sum(e[0] == 'record' and e[1] == self.name for e in self.log) + 1}"
        self.log.append(("record", self.name, event))
        return event

    def wait_event(self, event):
        self.log.append(("wait", self.name, event))

    def __enter__(self):
        self.log.append(("enter", self.name, None))

    def __exit__(self, *exc):
        pass


def ordered_on_the_gpu(log, first, then):
    """Whether a GPU must finish log entry ``first`` before it starts entry ``then``: a path along
    each stream's queue order and from each event's record to its waits."""
    after = {k: [] for k in range(len(log))}
    last_on, recorded = {}, {}
    for k, (kind, stream, event) in enumerate(log):
        if stream in last_on:
            after[last_on[stream]].append(k)
        last_on[stream] = k
        if kind == "record":
            recorded[event] = k
        elif kind == "wait":
            after[recorded[event]].append(k)
    seen, stack = set(), [first]
    while stack:
        k = stack.pop()
        if k == then:
            return True
        if k not in seen:
            seen.add(k)
            stack.extend(after[k])
    return False


def heads_on(device):
    ins = [mg.randn(16, 16, device=device, dtype=mg.float64) for _ in range(4)]
    return trace(lambda x, *ws: sum((((x @ w).tanh() @ w.T) for w in ws), start=x), *ins), ins


@pytest.mark.parametrize("drop_events", [False, True])
def test_on_cuda_branches_go_to_streams_and_events_order_every_edge(simulated_cuda, monkeypatch, drop_events):
    log = []
    monkeypatch.setattr(simulated_cuda.cuda, "Stream", lambda non_blocking: Stream(f"side{len(log)}", log),
                        raising=False)
    monkeypatch.setattr(simulated_cuda.cuda, "get_current_stream", lambda: Stream("current", log), raising=False)
    traced, ins = heads_on("cuda")
    ex = Executor(traced.graph, parallel=True, max_workers=3)
    assert ex.stream_plan is not None and ex.parallel and ex.stream_plan.used == 3
    if drop_events:  # what the check below catches: a plan without its events
        ex.stream_plan = ex.stream_plan._replace(waits={})
    got = ex.run(ins)
    want = Executor(traced.graph).run(ins)
    np.testing.assert_allclose(to_numpy(got[0]), to_numpy(want[0]), rtol=1e-12)
    enters = [k for k, entry in enumerate(log) if entry[0] == "enter"]
    nodes = [step[0] for step in ex.steps]
    assert len(enters) == len(nodes)
    where = dict(zip(nodes, enters))
    plan = ex.stream_plan
    edges = [(p, n) for n in nodes if n in plan.stream_of for p in n.predecessors if p in plan.stream_of]
    broken = [(p.name, n.name) for p, n in edges if not ordered_on_the_gpu(log, where[p], where[n])]
    assert bool(broken) == drop_events, broken
    assert log[-1][0] == "wait" and log[-1][1] == "current"  # the join: the caller's stream waits for the side streams


def test_on_cuda_values_read_across_streams_live_to_the_end_and_writes_wait_for_every_stream():
    g = trace(lambda x, w: (x @ w).exp() + (x @ w.T).tanh(), randn(8, 8), randn(8, 8)).graph
    schedule = [n for n in g.topological_order() if n.op != "output"]
    plan = plan_streams(schedule, streams=2)
    add = next(n for n in g if n.op == "Add")
    assert len({plan.stream_of[i] for i in add.inputs}) == 2  # the two branches went to two streams
    assert set(plan.waits[add]) & set(add.inputs) <= plan.crossing and plan.waits[add]
    assert set(plan.waits[add]) <= plan.recorded
    exp = next(n for n in g if n.op == "Exp")
    tanh = next(n for n in g if n.op == "Tanh")
    barred = plan_streams(schedule, streams=2, barrier=frozenset([tanh]))  # as if tanh wrote into a tensor
    assert exp in barred.waits[tanh] and exp not in plan.waits.get(tanh, ())


def test_compile_passes_parallel_to_its_executor():
    model = mg.nn.Sequential(mg.nn.Linear(8, 8), mg.nn.Tanh()).to(mg.float64)
    fast = mg.compile(model, parallel="auto")
    x = randn(4, 8)
    with mg.no_grad():
        want = to_numpy(model(x))
        fast(x)
        got = to_numpy(fast(x))
    np.testing.assert_allclose(got, want, rtol=1e-12)
    (entry,) = [e for e in fast._cache.values() if e is not None]
    assert entry.executor.parallel_plan is not None and not entry.executor.parallel  # a chain: nothing beside it
    with pytest.raises(ValueError, match="parallel must be"):
        mg.compile(model, parallel=2)
