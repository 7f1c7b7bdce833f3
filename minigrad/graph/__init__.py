"""Static graphs: the graph IR, tracing a function into it, and drawing graphs (chapters 01 and 03).

``trace(fn, *inputs)`` records what ``fn`` computes as a ``Graph`` of ``Node``s and replays it;
``draw(tensor_or_graph)`` renders a tensor's autograd graph or an IR graph with Graphviz. ``draw``
is imported on first use, so tracing works without the graphviz package installed.
"""

from typing import Any

from minigrad.graph.executor import Executor
from minigrad.graph.ir import Graph, GraphError, Node, op_kind
from minigrad.graph.trace import TracedFunction, TraceError, TraceWarning, trace
from minigrad.graph.compile import CompiledFunction, CompileWarning, compile  # noqa: E402  (needs trace)

__all__ = ["Graph", "GraphError", "Node", "TraceError", "TraceWarning", "TracedFunction", "draw", "op_kind", "trace"]
__all__ += ["Executor"]
__all__ += ["CompiledFunction", "CompileWarning", "compile"]


def __getattr__(name: str) -> Any:
    if name == "draw":
        from minigrad.graph.viz import draw

        return draw
    if name == "export_onnx":
        from minigrad.graph.onnx_export import export_onnx

        return export_onnx
    raise AttributeError(f"module 'minigrad.graph' has no attribute {name!r}")
