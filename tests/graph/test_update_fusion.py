"""Multi-output fusion of optimizer updates (``passes.update_fusion``): with C kernels a compiled
training step updates each parameter in one kernel (SGD with momentum: the buffer and the weight;
Adam: both moments and the weight), each result computed into its tensor; after several float64
steps the parameters, gradients and optimizer state equal eager's bit for bit. Without a working
compiler the merged groups' own kernels run in turn, with the same results."""

import copy
import warnings

import numpy as np
import pytest

import minigrad as mg
from minigrad import nn, optim
from minigrad.backend import cc
from minigrad.graph.codegen import c
from minigrad.graph.codegen.multi_tensor import MultiTensorKernel
from minigrad.graph.executor import Executor
from minigrad.graph.passes.horizontal_fusion import fuse_horizontal
from minigrad.graph.passes.update_fusion import fuse_updates
from helpers import training_step

pytestmark = pytest.mark.skipif(cc.compiler() is None, reason="no C compiler on this machine")

OPTIMIZERS = {
    "SGD momentum": (lambda ps: optim.SGD(ps, lr=0.05, momentum=0.9), 2),
    "SGD momentum, weight decay, nesterov": (
        lambda ps: optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=1e-3, nesterov=True), 2),
    "Adam": (lambda ps: optim.Adam(ps, lr=1e-2), 3),
    "AdamW": (lambda ps: optim.AdamW(ps, lr=1e-2, weight_decay=1e-2), 3),
}


def mse(y, t):
    return ((y - t) ** 2).mean()  # no exp or log: the C and numpy paths round alike, bit for bit


def train_both(make_opt, steps=6, horizontal=False):
    """A float64 ReLU MLP and its copy, one trained by the compiled step (C kernels), one eagerly,
    after an eager warm-up step each (the optimizer state exists before the trace). Without
    ``horizontal``, the per-parameter kernels stay apart (``passes.horizontal_fusion`` off)."""
    mg.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3)).double()
    twin = copy.deepcopy(model)
    opts = [make_opt(m.parameters()) for m in (model, twin)]
    rng = np.random.default_rng(0)
    data = [(mg.tensor(rng.standard_normal((10, 6))), mg.tensor(rng.standard_normal((10, 3))))
            for _ in range(steps + 1)]
    for m, opt in zip((model, twin), opts):
        training_step(m, opt, mse)(*data[0])
    compiled = mg.compile(training_step(model, opts[0], mse), backend="c")
    if not horizontal:
        compiled.passes = [p for p in compiled.passes if p is not fuse_horizontal]
    eager = training_step(twin, opts[1], mse)
    versions = {p: p._version for m in (model, twin) for p in m.parameters()}  # deepcopy starts twin's at 0
    for x, t in data[1:]:
        np.testing.assert_array_equal(compiled(x, t).detach().numpy(), eager(x, t).detach().numpy())
    for p, q in zip(model.parameters(), twin.parameters()):
        np.testing.assert_array_equal(p.detach().numpy(), q.detach().numpy())
        np.testing.assert_array_equal(p.grad.numpy(), q.grad.numpy())
        for k, v in opts[0].state[p].items():
            if isinstance(v, mg.Tensor):
                np.testing.assert_array_equal(v.numpy(), opts[1].state[q][k].numpy())
                assert min(v._version, opts[1].state[q][k]._version) >= steps, k
        # every step bumps each tensor it writes: the compiled one once per recorded write, eager
        # Adam's array update once per tensor (its in-place writes go to the arrays)
        assert min(p._version - versions[p], q._version - versions[q]) >= steps
    (graph,) = compiled.graphs.values()
    return model, graph


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_each_parameter_is_updated_by_one_kernel_into_its_tensors_as_eager_does(name):
    make_opt, results = OPTIMIZERS[name]
    model, graph = train_both(make_opt)
    merged = [n for n in graph if n.op == "fused" and isinstance(n.fn, c.MultiKernel)]
    assert len(merged) == len(list(model.parameters()))  # one kernel per parameter's update
    assert all(n.attrs["results"] == results for n in merged)
    ex = Executor(graph)
    absorbed = {e.inputs[1] for e in ex.writes.absorbed}
    for n in merged:  # every result goes straight into its tensor: no copy is left to do
        assert len(n.users) == results and all(g in ex.writes.into and g in absorbed for g in n.users)


def test_the_merged_kernel_writes_every_result_in_one_loop():
    _, graph = train_both(OPTIMIZERS["SGD momentum"][0], steps=1)
    kernel = next(n.fn for n in graph if n.op == "fused" and isinstance(n.fn, c.MultiKernel))
    assert kernel.source.count("for (long") == 1 and "out0[" in kernel.source and "out1[" in kernel.source
    assert kernel.ops == ("Mul", "Add", "Mul", "Sub")


def test_the_merged_kernel_writes_in_place_only_where_no_store_overtakes_a_load():
    """Results go into ``out`` arrays that are the very buffers of inputs (each element is loaded
    before it is stored), not into ones that overlap an input at an offset or each other; the
    values are the same either way."""
    _, graph = train_both(OPTIMIZERS["SGD momentum"][0], steps=1)
    node = next(n for n in graph if n.op == "fused" and isinstance(n.fn, c.MultiKernel) and len(n.shape or ()) != 1
                and n.inputs[0].shape is not None and len(n.inputs[0].shape) == 2)
    kernel, rng = node.fn, np.random.default_rng(0)
    arrays = [rng.standard_normal(i.shape) for i in node.inputs]
    want = kernel(*[a.copy() for a in arrays])
    same = [a.copy() for a in arrays]
    outs = (same[0], same[-1])
    got = kernel(*same, out=outs)
    assert got[0] is outs[0] and got[1] is outs[1]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    size = arrays[0].size
    backing = np.empty(size + 1)
    shifted = [a.copy() for a in arrays]
    shifted[0] = backing[:size].reshape(arrays[0].shape)
    shifted[0][...] = arrays[0]
    outs = (backing[1:].reshape(arrays[0].shape), np.empty_like(arrays[-1]))  # one element past the input
    got = kernel(*shifted, out=outs)
    assert got[0] is outs[0]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("horizontal", [False, True], ids=["per parameter", "all parameters at once"])
def test_without_a_compiler_the_merged_groups_run_one_after_the_other(tmp_path, monkeypatch, horizontal):
    """Bit for bit as eager (``train_both`` checks), the multi-tensor kernels too (each member's own kernel in turn)."""
    monkeypatch.setenv("MINIGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "false")  # a compiler that fails on every kernel
    monkeypatch.setattr(c, "_warned", set())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", c.KernelWarning)
        _, graph = train_both(OPTIMIZERS["Adam"][0], steps=3, horizontal=horizontal)
    kernels = [k for n in graph if n.op == "fused"
               for k in (n.fn.parts if isinstance(n.fn, MultiTensorKernel) else [n.fn]) if isinstance(k, c.MultiKernel)]
    assert len(kernels) == 6 and all(k._fn is False and len(k.parts) == 3 for k in kernels)
    multi = [n.fn for n in graph if n.op == "fused" and isinstance(n.fn, MultiTensorKernel)]
    assert bool(multi) == horizontal and all(k._fn is False for k in multi)


def test_the_numpy_backend_and_shared_producers_are_left_alone():
    mg.manual_seed(0)
    p, buf = nn.Parameter(mg.randn(4, 5)), mg.zeros(4, 5)
    g = mg.randn(4, 5)

    def step(g):
        with mg.no_grad():
            new = buf * 0.9 + g
            buf.copy_(new)
            p.sub_(new * 0.1)
        return new.sum()  # the new buffer is read by more than its copy and the update: not merged

    graph = mg.graph.trace(step, g).graph
    from minigrad.graph.passes import fuse_elementwise
    fused = fuse_elementwise(graph, backend="c")
    assert not any(isinstance(n.fn, c.MultiKernel) for n in fuse_updates(fused, backend="c"))
    assert [n.op for n in fuse_updates(fused, backend="numpy")] == [n.op for n in fused]


@pytest.mark.parametrize("horizontal", [False, True], ids=["per parameter", "all parameters at once"])
def test_the_parallel_executor_runs_the_merged_updates_as_the_serial_one_does(horizontal):
    _, graph = train_both(OPTIMIZERS["Adam"][0], steps=1, horizontal=horizontal)
    tensors = list(dict.fromkeys(n.meta["target"] for n in graph if n.op == "parameter"))
    before = [t.array.copy() for t in tensors]
    rng = np.random.default_rng(1)
    inputs = [mg.tensor(rng.standard_normal((10, 6))), mg.tensor(rng.standard_normal((10, 3)))]
    results = []
    for parallel in (False, True):
        for t, a in zip(tensors, before):
            t.array[...] = a
        Executor(graph, parallel=parallel).run(inputs)
        results.append([t.array.copy() for t in tensors])
    assert any((a != b).any() for a, b in zip(before, results[0]))  # the step did update them
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)
