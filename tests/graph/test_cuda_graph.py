"""Fusion and compile on a GPU: the generated ``cupy.ElementwiseKernel`` and ``ReductionKernel``
run for real and agree with eager cuda (the GELU-gate chain of bench_fusion, groups ending in a
reduction, matmul epilogues, dtypes and constants), ``minigrad.compile`` on cuda equals eager
(inference and ten MLP training steps), and the digits CNN trains on cuda to the cpu's accuracy.
Each test is skipped without a GPU, and under the simulated cupy (which has no kernels). Where
cupy is installed, even without a GPU, cupy parses every kernel's parameters (the C is compiled
only when a kernel first runs on a GPU)."""

import math

import numpy as np
import pytest

import conftest
import minigrad as mg
from minigrad import nn
from minigrad.examples import train_digits
from minigrad.graph import trace
from minigrad.graph.codegen import cuda
from minigrad.graph.passes import eliminate_dead_code, fuse_elementwise
from minigrad.graph.trace import run_graph
from minigrad.ops.activation import softplus
from helpers import NO_KERNELS, simulated, skip_if_kernels_cannot_run, to_numpy
from test_compile import mlp, train_both


@pytest.fixture
def gpu():
    """cuda as the default device; skipped without a GPU, or with the simulated cupy."""
    device = conftest.require("cuda")
    skip_if_kernels_cannot_run(device)
    mg.set_default_device(device)
    return device


def fused_run(fn, *inputs, rtol=1e-5, atol=1e-6):
    """Trace ``fn`` on the inputs, fuse, run the fused graph and eager ``fn``, compare on the host;
    returns the fused nodes."""
    graph = eliminate_dead_code(trace(fn, *inputs).graph)
    new = fuse_elementwise(graph)
    nodes = [n for n in new if n.op == "fused"]
    assert nodes, "nothing was fused"
    with mg.no_grad():
        want = fn(*inputs)
    want = want if isinstance(want, tuple) else (want,)
    for got, expected in zip(run_graph(new, list(inputs)), want):
        assert got.dtype == expected.dtype and tuple(got.shape) == tuple(expected.shape)
        np.testing.assert_allclose(to_numpy(got), to_numpy(expected), rtol=rtol, atol=atol, equal_nan=True)
    return nodes


def gelu_gate_normalise(x, scale, shift):
    """bench_fusion's chain: tanh GELU, a per-column scale and shift, a sigmoid gate, a row normalise."""
    g = 0.5 * x * (1 + mg.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)))
    h = g * scale + shift
    h = h * mg.sigmoid(h)
    d = h - h.mean(-1, keepdim=True)
    return d * mg.rsqrt((d * d).mean(-1, keepdim=True) + 1e-5)


def test_the_gelu_gate_chain_runs_as_cuda_kernels(gpu):
    nodes = fused_run(gelu_gate_normalise, mg.randn(256, 512), mg.randn(512), mg.randn(512))
    kinds = {n.fn.kind for n in nodes}
    assert kinds == {"ElementwiseKernel", "ReductionKernel"}  # the variance's d * d folds into its mean
    assert max(len(n.attrs["ops"]) for n in nodes) >= 13  # GELU and the gate: one kernel


@pytest.mark.parametrize("reduce", [lambda y: y.sum(1), lambda y: y.mean(-1, keepdim=True), lambda y: y.amax(0),
                                    lambda y: y.amin(1, keepdim=True), lambda y: y.sum(), lambda y: y.mean((0, 1)),
                                    lambda y: y.softmax(-1), lambda y: y.var(1)])
@pytest.mark.parametrize("dtype", [mg.float32, mg.float64])
def test_groups_ending_in_a_reduction(gpu, reduce, dtype):
    x, row, col = mg.randn(33, 70, dtype=dtype), mg.randn(33, 1, dtype=dtype), mg.randn(70, dtype=dtype)
    (node,) = fused_run(lambda x, r, c: reduce((x * c + r).tanh() * 2), x, row, col,
                        rtol=1e-5 if dtype == mg.float32 else 1e-12)
    assert node.meta["kind"] == "reduction"


def test_a_reduction_kernel_propagates_nan_and_meets_broadcast_inputs(gpu):
    x = mg.randn(8, 16)
    x[3, 5] = float("nan")
    (node,) = fused_run(lambda x, c: (x * c).amax(1), x, mg.randn(1, 16))
    assert node.fn.kind == "ReductionKernel"
    (node,) = fused_run(lambda a, b: (a + b).exp().sum(0), mg.randn(8, 1), mg.randn(1, 16))  # (8, 16) made inside


def test_matmul_epilogues(gpu):
    W, b = mg.randn(64, 32), mg.randn(32)
    (node,) = fused_run(lambda x: (x @ W + b).relu() * 2, mg.randn(48, 64))
    assert node.meta["kind"] == "matmul" and node.fn.kind == "ElementwiseKernel"
    lin = nn.Linear(64, 32)
    with mg.no_grad():
        (node,) = fused_run(lambda x: mg.sigmoid(lin(x)) * x[..., :32], mg.randn(5, 48, 64))
    assert node.meta["kind"] == "matmul"


def test_dtypes_constants_and_nan_in_kernels(gpu):
    x = mg.randn(40, 30)
    x[0, :3] = float("nan")
    mask = mg.randn(40, 30) > 0
    fused_run(lambda x, m: mg.where(m, x.clamp(-0.5, 0.5), 2.5) + mg.maximum(x, x * 0.5).relu(), x, mask)
    fused_run(lambda m: (m + 2) * 3 - 1, mask)  # bool arithmetic: int64, constants not cast to bool
    y = mg.randn(40, 30)
    fused_run(lambda y: ((y * 4).to(mg.int32) + 1).to(mg.float32).abs().sign() * y, y)
    fused_run(lambda y: softplus(y * 3) + nn.functional.gelu(y) + mg.erf(y), y)
    half = mg.randn(40, 30, dtype=mg.float16)
    fused_run(lambda h: nn.functional.leaky_relu(h * 2, 0.1) + (h * h).sqrt() - 1, half, rtol=1e-3, atol=1e-3)


def test_compiled_inference_equals_eager(gpu):
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 10))
    compiled = mg.compile(model)
    with mg.no_grad():
        for _ in range(3):  # the first call traces; the next ones run the fused graph
            x = mg.randn(16, 32)
            np.testing.assert_allclose(to_numpy(compiled(x)), to_numpy(model(x)), rtol=1e-5, atol=1e-6)
    (graph,) = compiled.graphs.values()
    assert any(n.op == "fused" and n.fn.kind == "ElementwiseKernel" for n in graph)


def test_compiled_mlp_training_step_equals_eager_for_ten_steps(gpu):
    graph = train_both(mlp, (12, 8))  # compares losses, parameters and gradients at rtol 1e-5
    assert {n.fn.kind for n in graph if n.op == "fused"} >= {"ElementwiseKernel"}


def test_the_digits_cnn_trains_on_cuda_to_the_cpu_accuracy(gpu):
    mg.set_default_device("cpu")
    on_cpu = train_digits.train(epochs=2, progress=False, device="cpu")
    on_cuda = train_digits.train(epochs=2, progress=False, device=gpu)
    assert on_cuda >= on_cpu - 0.02  # the same initial weights and batches; the GPU's float32 sums differ


# -- without a GPU: cupy reads the generated parameters ------------------------------------------------
def group_of(fn, *inputs):
    (node,) = [n for n in fuse_elementwise(trace(fn, *inputs).graph) if n.op == "fused"]
    return node.meta["group"]


@pytest.mark.parametrize("dtype", sorted(cuda._C_TYPES))
def test_cupy_parses_the_kernel_parameters_of_every_dtype(dtype):
    cupy = pytest.importorskip("cupy")
    if simulated():
        pytest.skip(NO_KERNELS)
    mg.set_default_device("cpu")  # generating the source needs no GPU; cupy parses it at construction
    a = mg.zeros(3, 4, dtype=dtype)
    k = cuda.generate(group_of(lambda a: (a == a) & (a != a), a))
    kernel = cupy.ElementwiseKernel(**k.params)
    assert [(p.name, p.dtype.name, p.ctype) for p in kernel.in_params] == [("x0", dtype, cuda._C_TYPES[dtype])]
    assert [(p.name, p.ctype) for p in kernel.out_params] == [("y", "bool")]
    if dtype in ("float32", "float64"):
        k = cuda.generate(group_of(lambda a, c: (a * c).exp().mean(1), a, mg.zeros(4, dtype=dtype)))
        kernel = cupy.ReductionKernel(**k.params)
        assert [p.ctype for p in kernel.in_params + kernel.out_params] == [cuda._C_TYPES[dtype]] * 3
