"""Horizontal fusion (``passes.horizontal_fusion``, ``codegen.multi_tensor``): a compiled training
step updates every parameter in one multi-tensor kernel call (and its step counts and bias
corrections in one each), each result computed into its tensor, with parameters, gradients and
optimizer state equal to eager's bit for bit; kernels that depend on one another stay apart; a
result that would clobber another tensor's operand goes into a new array; without a compiler the
members' own kernels compute the same values (and ``test_update_fusion`` runs its steps
without a compiler and on the threaded executor with and without this pass)."""

import numpy as np
import pytest

from minigrad.backend import cc
from minigrad.graph.codegen import c
from minigrad.graph.codegen.multi_tensor import MultiTensorKernel
from minigrad.graph.executor import Executor
from minigrad.graph.ir import Graph
from minigrad.graph.passes.fusion import fuse_elementwise
from minigrad.graph.passes.horizontal_fusion import fuse_horizontal
from test_update_fusion import OPTIMIZERS, train_both

pytestmark = pytest.mark.skipif(cc.compiler() is None, reason="no C compiler on this machine")


def multi_tensor_nodes(graph):
    return [n for n in graph if n.op == "fused" and isinstance(n.fn, MultiTensorKernel)]


@pytest.mark.parametrize("name", ["Adam", "AdamW", "SGD momentum"])
def test_every_parameter_is_updated_by_one_call_into_its_tensors_as_eager_does(name):
    make_opt, results = OPTIMIZERS[name]
    model, graph = train_both(make_opt, horizontal=True)  # bit-for-bit equal to eager: checked there
    params = len(list(model.parameters()))
    updates = [n for n in multi_tensor_nodes(graph) if all(isinstance(k, c.MultiKernel) for k in n.fn.parts)]
    assert len(updates) == 1 and len(updates[0].fn.parts) == params
    assert not [n for n in graph if n.op == "fused" and isinstance(n.fn, c.MultiKernel)]
    (node,) = updates
    assert node.attrs["results"] == results * params
    ex = Executor(graph)
    absorbed = {e.inputs[1] for e in ex.writes.absorbed}
    assert len(node.users) == results * params
    assert all(g in ex.writes.into and g in absorbed for g in node.users)  # no copy left to do


def chain_graph(n):
    """``n`` independent chains ``x_k * 2 + 1`` and one more, ``(x_0 * 2 + 1) * 2 + 1``, that
    depends on the first: fused elementwise groups, all with one loop body."""
    g = Graph()
    from minigrad.ops.elementwise import Add, Mul

    xs = [g.add_node("placeholder", shape=(5,), dtype=np.dtype("float64"), name=f"x{k}") for k in range(n)]

    def affine(x):
        args = {"args": ("<tensor>", "b"), "kwargs": ()}
        m = g.add_node("Mul", [x], {"b": 2.0}, shape=(5,), dtype=x.dtype, fn=Mul, meta=dict(args))
        return g.add_node("Add", [m], {"b": 1.0}, shape=(5,), dtype=x.dtype, fn=Add, meta=dict(args))

    ys = [affine(x) for x in xs]
    g.set_outputs(ys + [affine(ys[0])])
    return g


def test_dependent_kernels_stay_apart_and_values_match():
    graph = fuse_elementwise(chain_graph(5), backend="c")
    fused = fuse_horizontal(graph)
    (node,) = multi_tensor_nodes(fused)
    assert len(node.fn.parts) == 5  # the chain that reads the first result runs after it, on its own
    xs = [np.arange(5.0) + k for k in range(5)]
    want = [x * 2 + 1 for x in xs] + [(xs[0] * 2 + 1) * 2 + 1]
    for got, w in zip(Executor(fused).run([_T(x) for x in xs]), want):
        np.testing.assert_array_equal(got, w)


def test_without_a_compiler_the_members_kernels_compute_the_same(monkeypatch):
    graph = fuse_horizontal(fuse_elementwise(chain_graph(4), backend="c"))
    (node,) = multi_tensor_nodes(graph)
    xs = [np.arange(5.0) * k for k in range(4)]
    want = node.fn(*xs)
    kernel = MultiTensorKernel(node.fn.name, node.fn.source, node.fn.arity, node.fn._leaves,
                               [str(t) for t in node.fn._types], node.fn._results, node.fn.parts, node.fn.group)
    kernel._fn = False  # what _load gives when no compiler builds it
    outs = tuple(np.empty(5) for _ in xs)
    got = kernel(*xs, out=outs)
    assert all(g is o for g, o in zip(got, outs))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_a_result_that_overlaps_another_tensors_operand_goes_into_a_new_array():
    graph = fuse_horizontal(fuse_elementwise(chain_graph(4), backend="c"))
    (node,) = multi_tensor_nodes(graph)
    backing = np.arange(25.0)
    xs = [backing[5 * k:5 * k + 5].copy() for k in range(4)]
    want = [x * 2 + 1 for x in xs]
    shared = [backing[5 * k:5 * k + 5] for k in range(4)]
    outs = (backing[1:6], np.empty(5), np.empty(5), np.empty(5))  # over x0 at an offset and into x1
    got = node.fn(*shared, out=outs)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    same = [x.copy() for x in xs]  # each result into its own operand: element for element, allowed
    got = node.fn(*same, out=tuple(same))
    for g, s, w in zip(got, same, want):
        assert g is s
        np.testing.assert_array_equal(g, w)


class _T:
    """The one thing the executor asks of an input: its array."""

    def __init__(self, array):
        self.array = array
