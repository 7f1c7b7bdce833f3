"""The package's import graph (``tools/import_graph.py``, read with ``ast``) keeps its layers: no
module imports from a layer above its own (deferred imports included), every module is in a layer,
and per-thread state lives only on the mode stack and in grad mode's context variables, with each
process-wide setting named and explained. The one import circle is Tensor and the ops, which
Tensor's operators call and which build on Tensor, closed by one import at the end of
``minigrad/_tensor.py``; any other circle means a module reaches back into one that imports it."""

import ast
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
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
    # from minigrad.graph.codegen import numpy_blocks
    assert "minigrad.graph.codegen.numpy_blocks" in edges["minigrad.graph.codegen"]
    assert "minigrad.autograd.engine" in edges["minigrad._tensor"]  # deferred: inside Tensor.backward
    assert "minigrad.autograd.engine" not in import_graph.graph(ROOT, deferred=False)["minigrad._tensor"]


def test_no_module_imports_from_a_layer_above_its_own():
    found = import_graph.violations(import_graph.graph(ROOT))
    assert found == [], "imports reaching up a layer (move the code down, or ask through minigrad.protocols):\n" + \
        "\n".join(found)


def test_every_module_is_in_a_layer_and_the_layers_run_bottom_up():
    edges = import_graph.graph(ROOT)
    layers = {m: import_graph.layer_of(m) for m in edges}  # raises KeyError naming a module in no layer
    names = [title for title, _ in import_graph.LAYERS]
    assert names[0] == "foundation" and names[-1] == "applications and torch's names"
    assert layers["minigrad.errors"] < layers["minigrad.backend.cuda"] < layers["minigrad.ops.elementwise"] \
        < layers["minigrad.graph.trace"] < layers["minigrad.nn.module"] < layers["minigrad.distributed.ddp"] \
        < layers["minigrad.course.grade"]
    assert layers["minigrad.compat.unsupported"] == 0 and layers["minigrad.compat.torch_paths"] == len(names) - 1
    with pytest.raises(KeyError, match="minigrad_other.x is in no layer"):
        import_graph.layer_of("minigrad_other.x")


def test_an_import_reaching_up_is_named_with_both_layers():
    edges = {"minigrad.ops.parallel": {"minigrad.distributed.process_group", "minigrad.ops.op"},
             "minigrad.graph.trace": {"minigrad.nn.module"}, "minigrad.nn.module": {"minigrad.graph.trace"}}
    assert import_graph.violations(edges) == [
        "minigrad.graph.trace (transforms and tools) imports minigrad.nn.module (models and training)",
        "minigrad.ops.parallel (core) imports minigrad.distributed.process_group (distributed)",
    ]


def test_per_thread_state_lives_on_the_mode_stack_and_process_wide_settings_say_why():
    assert import_graph.state_violations(ROOT) == []
    files = import_graph.modules(ROOT)
    rebound = {(m, g) for m in {m for m, _ in import_graph.PROCESS_WIDE}
               for node in ast.walk(ast.parse(files[m].read_text())) if isinstance(node, ast.Global) for g in node.names}
    stale = set(import_graph.PROCESS_WIDE) - rebound
    assert not stale, f"PROCESS_WIDE lists settings no function rebinds any more: {sorted(stale)}"
    assert all(len(why) > 30 for why in import_graph.PROCESS_WIDE.values())


def test_state_outside_its_place_is_found(tmp_path):
    pkg = tmp_path / "minigrad"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "cache.py").write_text("import threading\nlocal = threading.local()\n_n = 0\n"
                                  "def bump():\n    global _n\n    _n += 1\n")
    found = import_graph.state_violations(tmp_path)
    assert any("minigrad.cache:2: local()" in f for f in found), found
    assert any("minigrad.cache: global _n" in f for f in found), found


def test_the_layer_picture_names_every_layer():
    text = import_graph.dot(import_graph.graph(ROOT))
    assert text.startswith("digraph layers {") and text.rstrip().endswith("}")
    for i, (title, _) in enumerate(import_graph.LAYERS):
        assert f'L{i} [label="{i}. {title}' in text
    assert "backend (allocator, cc, cuda, host_malloc, machine, meta, value_checks)" in text and "torch_paths" in text
