"""The fusion pass: which ops group together (the rules of minigrad.graph.passes.fusion) and the
fused graph it builds, which runs exactly like the original."""

import math

import numpy as np
import pytest

import minigrad as mg
from minigrad import nn
from minigrad.nn import functional as F
from minigrad.graph import trace
from minigrad.graph.passes import eliminate_dead_code, fuse_elementwise, fusion_groups
from minigrad.graph.trace import run_graph
from helpers import cpu_only, skip_if_kernels_cannot_run, to_numpy


def randn(*shape, requires_grad=False):
    return mg.randn(*shape, requires_grad=requires_grad)


def groups_of(fn, *inputs, **kwargs):
    graph = eliminate_dead_code(trace(fn, *inputs).graph)
    return [[n.op for n in g] for g in fusion_groups(graph, **kwargs)]


def gelu_tanh(x):
    return 0.5 * x * (1 + mg.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)))


def test_an_elementwise_chain_is_one_group():
    assert groups_of(gelu_tanh, randn(4, 8)) == [["Mul", "Mul", "Mul", "Mul", "Add", "Mul", "Tanh", "Add", "Mul"]]


def test_consumers_that_meet_again_fuse_and_those_that_do_not_are_a_boundary():
    # a diamond: both uses of exp(x) meet again at the product, so all four ops are one group
    assert groups_of(_diamond, randn(3, 4)) == [["Exp", "Add", "Sub", "Mul"]]
    # two outputs that never meet: exp(x) ends no group, each branch is its own
    assert groups_of(_fork, randn(3, 4)) == [["Add", "Tanh"], ["Mul", "Sin"]]


def _diamond(x):
    a = x.exp()
    return (a + 1) * (a - 1)


def _fork(x):
    a = x.exp()
    return (a + 1).tanh(), (a * 2).sin()


def test_a_prologue_fuses_into_a_reduction_which_ends_the_group():
    assert groups_of(lambda x: ((x.exp() * 2).sum(1) + 1).tanh(), randn(3, 4)) == [
        ["Exp", "Mul", "Sum"], ["Add", "Tanh"]]


def _normalise(x):
    d = x - x.mean(-1, keepdim=True)
    return d * ((d * d).mean(-1, keepdim=True) + 1e-5).rsqrt()


@cpu_only("only CPU kernels run by blocks of rows (a GPU's groups: the next test)")
def test_row_statistics_fuse_with_their_rows_on_the_cpu():
    # a LayerNorm-style normalise: each row's mean and variance sit inside the group, which runs by rows
    assert groups_of(lambda x: _normalise(x.tanh()), randn(6, 8)) == [
        ["Tanh", "Mean", "Sub", "Mul", "Mean", "Add", "Rsqrt", "Mul"]]
    # a statistic over axis 0 needs every row: it is computed first, its consumers group without it
    assert groups_of(lambda x: (x - x.mean(0, keepdim=True)).exp() * 2, randn(6, 8)) == [["Sub", "Exp", "Mul"]]


def test_row_statistics_end_their_group_on_a_gpu():
    graph = eliminate_dead_code(trace(lambda x: _normalise(x.tanh()), randn(6, 8)).graph)
    gpu = type("Device", (), {"type": "cuda"})()  # fusion only reads the device type: no GPU is needed
    for n in graph:
        n.meta["device"] = gpu
    # one element per thread: a reduction ends its group, and the values it splits are boundaries
    assert [[n.op for n in g] for g in fusion_groups(graph)] == [["Mul", "Mean"], ["Add", "Rsqrt"]]


def test_matmul_and_linear_take_an_epilogue_but_no_prologue():
    W, b = randn(4, 5), randn(5)
    assert groups_of(lambda x: (x.exp() @ W + b).relu(), randn(3, 4)) == [["Matmul", "Add", "Relu"]]
    lin = nn.Linear(4, 5)
    with mg.no_grad():
        assert groups_of(lambda x: mg.sigmoid(lin(x)) * 2, randn(3, 4)) == [["Linear", "Sigmoid", "Mul"]]


def test_broadcast_operands_stay_outside_and_smaller_shapes_do_not_join():
    row, col = randn(3, 1), randn(4)
    assert groups_of(lambda x: (x * row + col * 2).tanh(), randn(3, 4)) == [["Mul", "Add", "Tanh"]]


def test_group_size_is_capped():
    def chain(x):
        for _ in range(10):
            x = (x * 1.5).tanh()
        return x

    groups = groups_of(chain, randn(5), max_group_size=4)
    assert [len(g) for g in groups] == [4, 4, 4, 4, 4]


def test_effects_random_ops_and_ops_with_saved_arrays_are_never_fused():
    acc = mg.zeros(3, 4)
    W = randn(3, 4, requires_grad=True)

    def step(x):
        y = nn.functional.dropout(x.exp() * 2, 0.5) + 1
        z = (y * W).relu()  # ReLU keeps its mask for backward: a boundary
        z.sum().backward()
        with mg.no_grad():
            acc.add_(z * 3)
        return y

    graph = trace(step, randn(3, 4)).graph
    fused = {op for g in fusion_groups(graph) for op in (n.op for n in g)}
    assert not fused & {"Dropout", "Relu", "copy_", "set_grad"}
    assert ["Exp", "Mul"] in [[n.op for n in g] for g in fusion_groups(graph)]


@cpu_only("one kernel by rows, with a blocked numpy source, is the CPU's way to fuse the chain")
def test_fused_graph_runs_like_the_original_and_keeps_the_group():
    row, col = randn(16, 1), randn(32)

    def f(x):
        h = gelu_tanh(x) * row + col
        h = h * mg.sigmoid(h)
        d = h - h.mean(-1, keepdim=True)
        return d * mg.rsqrt((d * d).mean(-1, keepdim=True) + 1e-5)

    x = randn(16, 32)
    graph = trace(f, x).graph
    fused = fuse_elementwise(graph)
    assert "fused" not in [n.op for n in graph]  # the pass leaves its input alone
    nodes = [n for n in fused if n.op == "fused"]
    assert [n.meta["kind"] for n in nodes] == ["elementwise"]  # the normalise joins the chain: one kernel
    first = nodes[0]
    assert first.attrs["ops"][10:13] == ("Add", "Sigmoid", "Mul") and len(first.attrs["ops"]) == 20
    assert [n.op for n in first.meta["group"].placeholders] == ["placeholder"] * 3
    assert "def block(" in first.fn.source and "tanh(" in first.fn.source
    assert "ops=('Mul', 'Mul'" in fused.to_dot()  # a drawing lists the members of each fused node
    for _ in range(2):
        x = randn(16, 32)
        np.testing.assert_array_equal(run_graph(fused, [x])[0], run_graph(graph, [x])[0])
    assert (len(graph), len(fused)) == (24, 5)


def test_fused_training_step_graph_replays_like_the_traced_one():
    skip_if_kernels_cannot_run()
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    opt = mg.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(x, t):
        opt.zero_grad()
        loss = ((model(x) - t) ** 2).mean()
        loss.backward()
        opt.step()
        return loss

    step(randn(6, 4), randn(6, 2))  # warm-up: momentum buffers exist before the trace
    graph = trace(step, randn(6, 4), randn(6, 2)).graph
    fused = fuse_elementwise(graph)
    assert any(n.meta.get("kind") == "matmul" for n in fused if n.op == "fused")  # Linear + Tanh
    state = {p: (p.detach().clone(), opt.state[p]["momentum_buffer"].clone()) for p in model.parameters()}
    x, t = randn(6, 4), randn(6, 2)
    (expected,) = run_graph(graph, [x, t])
    after = [p.detach().clone() for p in model.parameters()]
    for p, (value, buf) in state.items():  # rewind, then run the fused graph on the same data
        with mg.no_grad():
            p.copy_(value)
            opt.state[p]["momentum_buffer"].copy_(buf)
    (loss,) = run_graph(fused, [x, t])
    np.testing.assert_allclose(to_numpy(loss), to_numpy(expected), rtol=1e-6)
    for p, q in zip(model.parameters(), after):
        np.testing.assert_allclose(p.detach().numpy(), q.numpy(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind", ["elementwise", "reduction"])
def test_no_group_means_no_change(kind):
    fn = (lambda x: x.exp()) if kind == "elementwise" else (lambda x: x.sum(0))
    graph = trace(fn, randn(3)).graph
    assert str(fuse_elementwise(graph)) == str(graph)


def test_a_new_elementwise_op_fuses_from_its_declarations():
    """Hardswish declares its kind and its CPU and CUDA code beside its forward; nothing in graph/ names it."""
    def fn(x):
        return F.hardswish(x * 2 + 1) * x

    x = randn(64, 32) * 4
    assert groups_of(fn, x) == [["Mul", "Add", "Hardswish", "Mul"]]
    fused = fuse_elementwise(eliminate_dead_code(trace(fn, x).graph))
    (node,) = [n for n in fused if n.op == "fused"]
    on_gpu = node.meta["device"].type == "cuda"  # its declared code, not a call of its forward
    assert ("? (float)6 : v2 + (float)3" if on_gpu else "clip(s") in node.fn.source
    skip_if_kernels_cannot_run()
    if on_gpu:
        np.testing.assert_allclose(to_numpy(run_graph(fused, [x])[0]), to_numpy(fn(x)), rtol=1e-6, atol=1e-6)
    else:
        np.testing.assert_array_equal(to_numpy(run_graph(fused, [x])[0]), to_numpy(fn(x)))  # bit for bit
