"""tools/compile_cuda_kernels.py, the CI check that every CUDA kernel minigrad generates compiles:
it harvests the kernels of a CPU program as if its graph lived on a GPU (and leaves the graph as
it was), wraps each in cupy's argument types in every layout under a unique name, and, where the
toolchain's wheels are installed (``make cuda-toolchain``: build/cuda), compiles them with NVRTC and
ptxas, reporting registers, and reporting a kernel that does not compile as an error."""

import math
import sys
from pathlib import Path

import pytest

import minigrad as mg
from minigrad.graph import trace
from minigrad.graph.passes import fuse_elementwise

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import compile_cuda_kernels as tool  # noqa: E402


def gelu_gate(x, scale):
    g = 0.5 * x * (1 + mg.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)))
    h = g * scale
    return (h * mg.sigmoid(h)).sum(-1)


def harvested():
    found = tool.Harvest()
    graph = trace(gelu_gate, mg.randn(4, 8), mg.randn(8)).graph
    with found.installed():
        fuse_elementwise(graph)
    return found, graph


def test_a_cpu_programs_kernels_are_harvested_as_on_a_gpu_and_the_graph_is_left_as_it_was():
    found, graph = harvested()
    kinds = sorted(found.kinds.values())
    assert kinds == ["ReductionKernel"] and found.graphs == 1 and not found.errors  # the chain ends in its sum
    (params,) = found.kernels.values()
    assert "tanh(" in params["preamble"] and params["reduce_expr"] == "a + b"
    assert all(n.meta.get("device") in (None, mg.device("cpu")) for n in graph)
    assert [n.op for n in fuse_elementwise(graph)].count("fused") >= 1  # the CPU's own fusion is untouched


def test_each_kernel_is_wrapped_in_every_layout_under_a_name_of_its_own():
    found, _ = harvested()
    (key, params), = found.kernels.items()
    source, names = tool.unit([(7, found.kinds[key], params, tool.LAYOUTS), (8, found.kinds[key], params, tool.LAYOUTS)])
    assert len(names) == 2 * len(tool.LAYOUTS) and len(set(names)) == len(names)
    assert source.count("namespace k7_") == len(tool.LAYOUTS) and "CIndexer<4, 0> _in_ind" in source


def test_the_kernels_compile_and_a_broken_one_is_reported():
    toolkit = ROOT / "build" / "cuda"
    try:
        chain = tool.find_toolchain(str(toolkit) if toolkit.is_dir() else None)
    except tool.ToolchainError as e:
        pytest.skip(f"the CUDA toolchain wheels are not installed (make cuda-toolchain): {e}")
    found, _ = harvested()
    (key, params), = found.kernels.items()
    broken = {"in_params": "float32 x0", "out_params": "float32 y", "operation": "y = no_such_function(x0);",
              "name": "broken"}
    result = tool.compile_all(chain, [(found.kinds[key], params, tool.LAYOUTS),
                                      ("ElementwiseKernel", broken, tool.LAYOUTS[:1])])
    assert result["compilations"] == len(tool.LAYOUTS) * len(tool.ARCHS)
    assert all(0 < n <= 255 for n in result["registers"].values()) and not result["spills"]
    assert len(result["errors"]) == len(tool.ARCHS) and all("no_such_function" in e for e in result["errors"])
