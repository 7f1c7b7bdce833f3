"""Generated kernels: the blocked CPU kernels agree with eager evaluation on broadcast, strided
and reversed inputs, over many blocks and threads; the CUDA source text reads as intended (the
kernels running on a GPU are tests/graph/test_cuda_graph.py's)."""

import linecache
import sys

import numpy as np
import pytest

import minigrad as mg
from minigrad import nn
from minigrad.graph import trace
from minigrad.graph.codegen import cuda, numpy_blocks, program
from minigrad.graph.ir import GraphError
from minigrad.graph.passes import fuse_elementwise
from minigrad.graph.trace import run_graph


@pytest.fixture(autouse=True)
def on_cpu():
    """Groups are traced on the cpu whatever the suite's device: the CPU kernels (blocked numpy,
    ``run_rows``, BLOCK_SIZE and threads) run on numpy arrays, and ``cuda.generate`` only reads a
    group's ops and dtypes, so its source text needs no GPU."""
    mg.set_default_device("cpu")


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 8 elements on two threads: small tensors then take the many-block path."""
    monkeypatch.setattr(numpy_blocks, "BLOCK_SIZE", 8)
    monkeypatch.setattr(numpy_blocks, "NUM_THREADS", 2)
    monkeypatch.setattr(numpy_blocks, "PARALLEL_MIN_SIZE", 0)


def fused(fn, *inputs):
    """The traced graph of fn, the fused graph, and its fused nodes."""
    graph = trace(fn, *inputs).graph
    new = fuse_elementwise(graph)
    return graph, new, [n for n in new if n.op == "fused"]


def check(fn, *inputs, exact=True):
    graph, new, nodes = fused(fn, *inputs)
    assert nodes, "nothing was fused"
    got, want = run_graph(new, inputs), run_graph(graph, inputs)
    for a, b in zip(got, want):
        assert np.asarray(a).dtype == np.asarray(b).dtype and np.shape(a) == np.shape(b)
        if exact:  # the same ufuncs in the same order: the same bits
            np.testing.assert_array_equal(a, b)
        else:
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    return nodes


def mixed(x, row, col, s):
    y = mg.where(x > 0, (x * row + col).tanh(), s - x) * 3
    return y - mg.sigmoid(x / (1 + x.abs())).clamp(0.1, 0.9) ** 2


def test_strided_reversed_and_broadcast_inputs(small_blocks, monkeypatch):
    shares = []
    parallel = numpy_blocks._parallel
    monkeypatch.setattr(numpy_blocks, "_parallel", lambda work, blocks, size: shares.append(len(blocks)) or parallel(work, blocks, size))
    base = mg.randn(9, 14, dtype=mg.float64)
    x = base.T[::2]  # (7, 9), neither row- nor column-contiguous
    row = mg.randn(7, 1, dtype=mg.float64)
    col = mg.randn(12, dtype=mg.float64).flip(0)[:9]  # a reversed view
    s = mg.tensor(2.5, dtype=mg.float64)  # a 0-d operand
    (node,) = check(mixed, x, row, col, s)
    assert node.fn.source.count("def ") == 2
    assert shares == [14]  # 7 rows of 9 in blocks of at most 8 (two per row), shared by 2 threads


@pytest.mark.parametrize("shape", [(), (5,), (3, 1, 4), (40, 3), (2, 3, 5, 7)])
def test_every_shape_blocks_alike(small_blocks, shape):
    x = mg.randn(*shape)
    col = mg.randn(*shape[-1:]) if shape else mg.randn()
    check(lambda x, c: ((x * c - 1).exp() + x).sin() / 2, x, col)


def test_contiguous_operands_collapse_to_flat_blocks():
    a = np.zeros((4, 5, 6))
    shape, views = numpy_blocks._collapse(a.shape, [a, np.broadcast_to(np.float64(1), a.shape)])
    assert shape == (120,) and views[0].shape == (120,)
    row = np.broadcast_to(np.zeros((4, 1, 1)), a.shape)  # a per-row operand keeps rows apart
    assert numpy_blocks._collapse(a.shape, [a, row])[0] == (4, 30)
    blocks = numpy_blocks._blocks((4, 30), 8)
    assert sum(n for _, n, _ in blocks) == 120 and max(n for _, n, _ in blocks) <= 8
    assert numpy_blocks._blocks((), 8) == [(Ellipsis, 1, ())]


def test_dtypes_bools_casts_and_integers(small_blocks):
    x, i = mg.randn(6, 5, dtype=mg.float64), mg.randint(-3, 4, (6, 5))
    check(lambda x, i: mg.where((x > 0) & (i != 0), x * i, (i * 2 + 1).to(mg.float64)), x, i)


def test_ops_without_a_template_run_their_forward_per_block(small_blocks):
    x = mg.randn(5, 7, dtype=mg.float64)
    (node,) = check(lambda x: nn.functional.gelu(nn.functional.leaky_relu(x * 2, 0.1)) + mg.erf(x), x)
    assert "copyto(" in node.fn.source and "gelu_" in node.fn.source


@pytest.mark.parametrize("reduce", [lambda y: y.sum(1), lambda y: y.mean(-1, keepdim=True),
                                    lambda y: y.amax(1), lambda y: y.softmax(1), lambda y: y.sum(0),
                                    lambda y: y.sum(), lambda y: y.var(1)])
def test_reduction_groups_by_rows_or_whole(small_blocks, reduce):
    x, col = mg.randn(9, 6, dtype=mg.float64), mg.randn(6, dtype=mg.float64)
    (node,) = check(lambda x, c: reduce((x * c).tanh() + 1), x, col, exact=False)
    assert node.meta["kind"] == "reduction"


def test_rows_path_reduces_each_block_of_rows():
    x = mg.randn(4, 6)
    (node,) = fused(lambda x: (x * 2).sum(1), x)[2]
    assert "run_rows(" in node.fn.source
    (node,) = fused(lambda x: (x * 2).sum(0), x)[2]
    assert "p = empty((4, 6), 'float32')" in node.fn.source  # axis 0 reduced: the prologue is materialised


def normalise(x, c):
    h = (x * c).tanh()
    d = h - h.mean(-1, keepdim=True)
    return d * ((d * d).mean(-1, keepdim=True) + 1e-5).rsqrt()


@pytest.mark.parametrize("fn", [normalise, lambda x, c: (x * c).softmax(-1) * 2 + 1,
                                lambda x, c: x / (x.abs().amax(-1, keepdim=True) + c[:1]).exp(),
                                lambda x, c: (x - x.mean(-1, keepdim=True)).sum(-1)])
def test_row_reductions_inside_a_kernel_see_whole_rows(small_blocks, fn):
    x, col = mg.randn(7, 3, 5, dtype=mg.float64), mg.randn(5, dtype=mg.float64)
    (node,) = check(fn, x, col)
    assert "run_rows(" in node.fn.source and "by blocks of rows" in node.fn.source


def test_kernels_write_into_a_given_output():
    x, col = mg.randn(6, 4), mg.randn(4)
    for fn in (lambda x, c: (x * c).tanh() + 1, normalise, lambda x, c: (x * c).exp().sum(0),
               lambda x, c: (x * c).exp().sum(1)):
        graph, _, (node,) = fused(fn, x, col)
        want = run_graph(graph, [x, col])[0]
        out = np.empty(node.shape, node.dtype)
        assert node.fn(x.numpy(), col.numpy(), out=out) is out
        np.testing.assert_array_equal(out, want)


def test_matmul_epilogue_writes_over_the_product(small_blocks):
    W, b = mg.randn(6, 5, dtype=mg.float64), mg.randn(5, dtype=mg.float64)
    (node,) = check(lambda x: (x @ W + b).relu() * 2, mg.randn(7, 6, dtype=mg.float64))
    assert "m = matmul_" in node.fn.source and "reuse_or_empty(m" in node.fn.source
    lin = nn.Linear(6, 5).to(mg.float64)
    with mg.no_grad():  # ends in Sigmoid, several ufuncs: its result needs its own buffer
        (node,) = check(lambda x: mg.sigmoid(lin(x)), mg.randn(3, 4, 6, dtype=mg.float64))
    assert "out = empty(" in node.fn.source
    m = np.ones((3, 4))
    assert numpy_blocks.reuse_or_empty(m, (np.ones(2),), (3, 4), "float64") is m
    assert numpy_blocks.reuse_or_empty(m, (m[0],), (3, 4), "float64") is not m  # shares memory with an input


def test_block_functions_allocate_nothing_and_reuse_dead_buffers():
    def chain(x):
        for _ in range(8):
            x = (x * 1.5 + 0.5).tanh()
        return x

    (node,) = fused(chain, mg.randn(10))[2]
    block = node.fn.source.split("\n\n\n")[0]
    assert "empty(" not in block and block.count("out=") == 24
    assert "def block(o, x0, s0):" in block  # one scratch buffer serves the whole chain


def test_source_is_registered_for_tracebacks():
    (node,) = fused(lambda x: (x * 2).exp(), mg.randn(3))[2]
    filename = node.fn._fn.__code__.co_filename
    assert filename.startswith("<minigrad kernel") and "".join(linecache.getlines(filename)) == node.fn.source


# -- CUDA source text -------------------------------------------------------------------------------
def group_of(fn, *inputs):
    (node,) = fused(fn, *inputs)[2]
    return node.meta["group"]


def test_cuda_elementwise_kernel_source(monkeypatch):
    monkeypatch.delitem(sys.modules, "cupy", raising=False)  # imported already where there is one, or simulated
    k = cuda.generate(group_of(lambda x, c: mg.sigmoid(x * c + 0.5).tanh(), mg.randn(4, 3), mg.randn(3)))
    assert k.kind == "ElementwiseKernel" and k.params["in_params"] == "float32 x0, float32 x1"
    assert k.params["out_params"] == "float32 y"
    assert k.params["operation"].splitlines() == [
        "float v0 = x0 * x1;  // Mul",
        "float v1 = v0 + (float)0.5;  // Add",
        "float v2 = (float)0.5 + (float)0.5 * tanh((float)0.5 * v1);  // Sigmoid",
        "y = tanh(v2);  // Tanh",
    ]  # values named by their place in the chain, not by graph node: cupy caches kernels by source
    assert k.source.startswith("cupy.ElementwiseKernel(") and "name='fused_sigmoid_tanh'" in k.source
    assert "cupy" not in sys.modules  # nothing imported until a kernel runs


def test_cuda_types_literals_and_special_ops():
    k = cuda.generate(group_of(lambda x: mg.where(x > 0, x.clamp(max=2.0), x.abs() * float("inf")),
                               mg.randn(5, dtype=mg.float64)))
    op = k.params["operation"]
    assert "bool v0 = x0 > (double)0;" in op and "double v1 = (x0 > (double)2.0 ? (double)2.0 : x0);" in op
    assert "fabs(x0)" in op and "__longlong_as_double(0x7ff0000000000000LL)" in op
    assert "y = v0 ? v1 : v3;" in op
    k = cuda.generate(group_of(lambda x: (x * 2).to(mg.int32) + 1, mg.randn(5)))
    assert "int v1 = (int)v0;" in k.params["operation"] and "y = v1 + (int)1;" in k.params["operation"]


def test_cuda_constants_take_the_type_the_op_computes_in():
    x, mask = mg.randn(5), mg.randn(5) > 0
    op = cuda.generate(group_of(lambda x, m: mg.where(m, x.exp(), 2.5) + 1, x, mask)).params["operation"]
    assert "float v1 = x1 ? v0 : (float)2.5;" in op  # not (bool)2.5, the condition's type
    op = cuda.generate(group_of(lambda m: (m + 2) * 3, mask)).params["operation"]
    assert "long long v0 = x0 + (long long)2;" in op
    op = cuda.generate(group_of(lambda x: x.clamp(min=np.float32(-1.5)).exp(), x)).params["operation"]
    assert "(x0 < (float)-1.5 ? (float)-1.5 : x0)" in op  # a numpy scalar written as C
    half = mg.randn(5, dtype=mg.float16)
    op = cuda.generate(group_of(lambda x: nn.functional.leaky_relu(x * 2, 0.1), half)).params["operation"]
    assert "float16 v0 = x0 * (float16)2;" in op and "y = v0 > (float16)0 ? v0 : (float16)(v0 * (float16)0.1);" in op
    graph = trace(lambda i: (i ** 2).exp(), mg.tensor([1, 2, 3])).graph
    assert [cuda.supports(n) for n in graph if n.op in ("Pow", "Exp")] == [False, True]  # C has no int pow


@pytest.mark.parametrize("op, reduce_expr, identity, post", [
    ("sum", "a + b", "0", "y = a"),
    ("mean", "a + b", "0", "y = a / (float)(_in_ind.size() / _out_ind.size())"),
    ("amax", "(a > b || a != a) ? a : b", "-__int_as_float(0x7f800000)", "y = a"),
])
def test_cuda_reduction_kernel_source(op, reduce_expr, identity, post):
    k = cuda.generate(group_of(lambda x: getattr(x.exp() * 2, op)(1), mg.randn(4, 3)))
    p = k.params
    assert k.kind == "ReductionKernel" and p["map_expr"] == f"fused_exp_{op}_map(x0)"
    assert (p["reduce_expr"], p["identity"], p["post_map_expr"]) == (reduce_expr, identity, post)
    assert p["preamble"].splitlines() == [f"__device__ float fused_exp_{op}_map(float x0) {{",
                                          "    float v0 = exp(x0);  // Exp",
                                          "    return v0 * (float)2;  // Mul", "}"]


def test_cuda_other_reductions_and_epilogues_keep_their_own_op():
    k = cuda.generate(group_of(lambda x: (x * 2).softmax(1), mg.randn(4, 3)))
    assert k.kind == "ElementwiseKernel" and k._reduce is not None
    W = mg.randn(3, 2)
    k = cuda.generate(group_of(lambda x: (x @ W).relu(), mg.randn(4, 3)))
    assert k.params["in_params"] == "float32 m" and k._anchor is not None
    assert k.params["operation"] == "y = (m > (float)0 || m != m) ? m : (float)0;  // Relu\n"


def test_cuda_supports_only_ops_it_can_write():
    graph = trace(lambda x: mg.tanh(x).cumsum(0) + x.cos(), mg.randn(3)).graph
    ops = {n.op: cuda.supports(n) for n in graph if n.fn is not None}
    assert ops == {"Tanh": True, "Cumsum": False, "Cos": True, "Add": True}


def test_program_reads_a_group_as_a_recipe():
    W = mg.randn(3, 2)
    prog = program(group_of(lambda x: (x @ W + 1).relu(), mg.randn(4, 3)))
    assert prog.anchor.op == "Matmul" and [n.op for n in prog.ops] == ["Add", "Relu"]
    assert prog.reduction is None and prog.shape == (4, 2) and prog.name == "fused_matmul_relu"


def test_cuda_source_refuses_a_group_by_rows():
    x, col = mg.randn(6, 4), mg.randn(4)
    (node,) = fused(normalise, x, col)[2]
    with pytest.raises(GraphError, match="Mean, Mean inside the group needs whole rows"):
        cuda.generate(node.meta["group"])
