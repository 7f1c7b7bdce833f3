"""The package's import graph (``tools/import_graph.py``, read with ``ast``) has one circle: Tensor
and the ops, which Tensor's operators call and which build on Tensor, closed by one import at the
end of ``minigrad/_tensor.py``. Any other circle means a module reaches back into one that imports it."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("import_graph", ROOT / "tools" / "import_graph.py")
import_graph = importlib.util.module_from_spec(spec)
spec.loader.exec_module(import_graph)

# Tensor, the ops, and the autograd machinery an op is made of (Function, the engine and anomaly
# checks it calls while running, and the bindings of ctx.ops its backward rule calls)
CORE = {"minigrad._tensor", "minigrad.autograd.function", "minigrad.autograd.engine", "minigrad.autograd.anomaly",
        "minigrad.autograd.binding"}


def in_core(module: str) -> bool:
    return module in CORE or module == "minigrad.ops" or module.startswith("minigrad.ops.")


def test_the_only_circle_is_tensor_and_the_ops():
    circles = import_graph.circles(import_graph.graph(ROOT))
    assert len(circles) == 1, f"import circles besides Tensor <-> ops: {circles[1:]}"
    (core,) = circles
    assert "minigrad._tensor" in core and "minigrad.ops" in core
    assert all(in_core(m) for m in core), f"modules caught in the core circle: {[m for m in core if not in_core(m)]}"


def test_one_import_at_the_end_of_tensor_py_closes_it():
    edges = import_graph.graph(ROOT, deferred=False)
    assert import_graph.circles(edges)  # at load time too
    edges["minigrad._tensor"].discard("minigrad.ops")
    assert import_graph.circles(edges) == []


def test_the_reader_finds_edges_of_every_form():
    edges = import_graph.graph(ROOT)
    assert "minigrad.ops.op" in edges["minigrad.ops.elementwise"]  # from minigrad.ops.op import Op
    assert "minigrad.ops" in edges["minigrad._tensor"]  # from minigrad import ops as _ops
    assert "minigrad.graph.codegen.cpu" in edges["minigrad.graph.codegen"]  # from minigrad.graph.codegen import cpu
    assert "minigrad.autograd.engine" in edges["minigrad._tensor"]  # deferred: inside Tensor.backward
    assert "minigrad.autograd.engine" not in import_graph.graph(ROOT, deferred=False)["minigrad._tensor"]
