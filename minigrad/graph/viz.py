"""Drawing graphs with Graphviz: the autograd graph behind a tensor, or a traced IR graph (chapter 01).

``draw(loss)`` walks the graph autograd recorded, from ``loss.grad_fn`` through the in-edges of each node
to the leaves, and draws the data flowing forward: tensors as ellipses (inputs, parameters,
constants and the output each in their own colour, with shape and dtype), ops as boxes, and each
edge labelled with the shape that flows along it. ``draw(graph)`` draws an IR ``Graph`` coloured
by op kind, its ordering edges (``Node.after``) dashed. ``draw_pair(before, after)`` draws a graph before and after a pass side by side, with
the nodes the pass changed (``changed_nodes``) outlined in red (chapter 03). Node names in the DOT text are counters in traversal order, never ``id()``, so the same
computation gives the same picture byte for byte (nbval compares the stored SVG).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from minigrad.autograd.engine import topological_order
from minigrad.autograd.function import AccumulateGrad, Function
from minigrad.graph.ir import Graph
from minigrad._tensor import Tensor
from minigrad.protocols import is_parameter

try:
    import graphviz
except ImportError:  # pragma: no cover - the dev extra installs it
    raise ImportError("minigrad.graph.draw needs the graphviz Python package: pip install graphviz "
                      "(it comes with pip install -e '.[dev]')") from None

__all__ = ["Digraph", "GraphvizNotFoundError", "changed_nodes", "draw", "draw_pair", "draw_plan"]

_INSTALL = ("Graphviz's `dot` program was not found, so the graph cannot be rendered (its DOT text is "
            "still in `.source`). Install it with `sudo apt-get install graphviz` (Debian/Ubuntu; "
            "`brew install graphviz` on macOS), or run `make graphviz` in the minigrad repository.")
_COLORS = {"input": "#9ecae1", "parameter": "#fdd49e", "constant": "#d9d9d9", "output": "#c7e9c0",
           "op": "#f0f0f0", "more": "#ffffff"}
_MAX_GRAD_VALUES = 12  # show_grads prints the values of gradients this small, else their norm


class GraphvizNotFoundError(graphviz.ExecutableNotFound):
    """Rendering needs Graphviz's ``dot``; the message says how to install it."""

    def __init__(self) -> None:
        RuntimeError.__init__(self, _INSTALL)


def _explain_missing_dot(method: Callable) -> Callable:
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except GraphvizNotFoundError:
            raise
        except graphviz.ExecutableNotFound:
            raise GraphvizNotFoundError() from None

    wrapper.__name__, wrapper.__doc__ = method.__name__, method.__doc__
    return wrapper


class Digraph(graphviz.Digraph):
    """A ``graphviz.Digraph`` whose rendering, when ``dot`` is missing, says how to install it."""

    pipe = _explain_missing_dot(graphviz.Digraph.pipe)
    render = _explain_missing_dot(graphviz.Digraph.render)
    view = _explain_missing_dot(graphviz.Digraph.view)
    _repr_image_svg_xml = _explain_missing_dot(graphviz.Digraph._repr_image_svg_xml)
    _repr_mimebundle_ = _explain_missing_dot(graphviz.Digraph._repr_mimebundle_)


def draw(tensor_or_graph: Tensor | Graph, show_grads: bool = False, rankdir: str = "TB",
         max_nodes: int | None = 300, names: Mapping[str, Tensor] | None = None) -> Digraph:
    """Draw a tensor's autograd graph or an IR ``Graph``; returns a ``graphviz.Digraph``, which
    Jupyter renders inline. ``names`` labels tensors (``dict(model.named_parameters())``);
    ``show_grads`` adds the ``.grad`` of leaves after backward; at most ``max_nodes`` nodes are
    drawn (those nearest the output), the rest summarised in one box."""
    dot = Digraph(graph_attr={"rankdir": rankdir}, node_attr={"fontname": "Helvetica", "fontsize": "10"},
                  edge_attr={"fontname": "Helvetica", "fontsize": "9"})
    if isinstance(tensor_or_graph, Graph):
        _draw_ir(dot, tensor_or_graph, max_nodes)
    elif isinstance(tensor_or_graph, Tensor):
        labels = {id(t): name for name, t in (names or {}).items()}
        _draw_autograd(dot, tensor_or_graph, show_grads, max_nodes, labels)
    else:
        raise TypeError(f"draw: expected a Tensor or a minigrad.graph.Graph, got {type(tensor_or_graph).__name__}")
    return dot


def changed_nodes(before: Graph, after: Graph) -> set[str]:
    """The names of the nodes that a pass from ``before`` to ``after`` removed, added or changed:
    those whose listing line (``node.format()``) is in one graph and not the other. Passes keep
    the names of the nodes they do not replace, so one name serves both graphs."""
    old, new = {n.format() for n in before}, {n.format() for n in after}
    return {n.name for n in before if n.format() not in new} | {n.name for n in after if n.format() not in old}


def draw_pair(before: Graph, after: Graph, colours: Mapping[str, str] | None = None,
              marked: Any = None, titles: tuple[str, str] = ("before", "after")) -> Digraph:
    """Draw two IR graphs side by side, each in a titled box. ``colours`` maps node names to fill
    colours (a fusion group's members, say); the nodes named in ``marked`` (by default
    ``changed_nodes(before, after)``) get a red outline."""
    marked = changed_nodes(before, after) if marked is None else set(marked)
    dot = Digraph(node_attr={"fontname": "Helvetica", "fontsize": "10"})
    for title, graph in zip(titles, (before, after)):
        nodes, edges = graph.dot_elements()  # ids follow the topological order
        with dot.subgraph(name=f"cluster_{title}", graph_attr={"label": title, "fontname": "Helvetica"}) as box:
            for node, (key, attrs) in zip(graph.topological_order(), nodes):
                attrs = dict(attrs, fillcolor=(colours or {}).get(node.name, attrs["fillcolor"]))
                if node.name in marked:
                    attrs.update(color="#d7301f", penwidth="3")
                box.node(f"{title}_{key}", **_escaped(attrs))
            for a, b in edges:
                box.edge(f"{title}_{a}", f"{title}_{b}")
    return dot


def draw_plan(plan: Any, rankdir: str = "LR") -> Digraph:
    """Draw a checkpoint plan (``minigrad.memory.plan``): the chain's layers, each coloured by how
    often backward recomputes it (green: kept), each recomputed range a box around its layers,
    nested as the plan nests them. Nodes are named ``L0``, ``L1``... in chain order."""
    dot = Digraph(graph_attr={"rankdir": rankdir, "fontname": "Helvetica", "fontsize": "9"},
                  node_attr={"fontname": "Helvetica", "fontsize": "10", "shape": "box", "style": "filled"})
    counts = plan.recompute_counts()
    ranges = iter(range(len(plan.layers)))

    def add(into: Digraph, pieces: list) -> None:
        for piece in pieces:
            if piece[0] == "keep":
                i = piece[1]
                into.node(f"L{i}", f"{i}: {type(plan.layers[i]).__name__}", fillcolor=_RECOMPUTED[min(counts[i], 3)])
            else:
                with into.subgraph(name=f"cluster_{next(ranges)}") as box:
                    box.attr(label=f"recompute {piece[1]}..{piece[2] - 1}", style="dashed")
                    add(box, piece[3].pieces)

    add(dot, plan.pieces)
    for i in range(1, len(plan.layers)):
        dot.edge(f"L{i - 1}", f"L{i}")
    return dot


_RECOMPUTED = ["#c7e9c0", "#fdd49e", "#fc8d59", "#d7301f"]  # kept, recomputed once, twice, 3+ times


def _draw_ir(dot: Digraph, graph: Graph, max_nodes: int | None) -> None:
    nodes, edges = graph.dot_elements()
    kept = {name for name, _ in nodes[:max_nodes]} if max_nodes is not None else {name for name, _ in nodes}
    for name, attrs in nodes:
        if name in kept:
            dot.node(name, **_escaped(attrs))
    if len(kept) < len(nodes):
        dot.node("more", f"... {len(nodes) - len(kept)} more nodes", shape="box", style="dashed")
    summarised = set()  # edges from the summary box are drawn once per target
    for a, b in edges:
        if b not in kept:
            continue
        if a not in kept:
            if b in summarised:
                continue
            a = "more"
            summarised.add(b)
        dot.edge(a, b)
    ids = {n: f"n{k}" for k, n in enumerate(graph.topological_order())}  # as dot_elements numbers them
    for n, b in ids.items():  # ordering edges (Node.after): dashed, as to_dot draws them; they pass no value
        for first in n.after:
            if b in kept:
                dot.edge(ids[first] if ids[first] in kept else "more", b, style="dashed")


def _escaped(attrs: Mapping[str, str]) -> dict[str, str]:
    """Graphviz attributes with line breaks as DOT writes them."""
    return {k: v.replace("\n", "\\n") for k, v in attrs.items()}


def _draw_autograd(dot: Digraph, root: Tensor, show_grads: bool, max_nodes: int | None,
                   labels: dict[int, str]) -> None:
    dot.node("out", _tensor_label(root, labels.get(id(root), "output"), show_grads), shape="ellipse",
             style="filled", fillcolor=_COLORS["output"], peripheries="2")
    if root.grad_fn is None:
        return
    order = topological_order([root.grad_fn])
    kept = order[:max_nodes] if max_nodes is not None else order
    ids: dict[Function, str] = {}
    for k, node in enumerate(kept):
        if type(node) is AccumulateGrad:
            v = node.variable
            kind = "parameter" if _is_parameter(v) else "input"
            ids[node] = f"leaf{k}"
            dot.node(ids[node], _tensor_label(v, labels.get(id(v), kind), show_grads), shape="ellipse",
                     style="filled", fillcolor=_COLORS[kind])
        else:
            ids[node] = f"op{k}"
            dot.node(ids[node], node.name(), shape="box", style="filled,rounded", fillcolor=_COLORS["op"])
    if len(kept) < len(order):
        dot.node("more", f"... {len(order) - len(kept)} more nodes", shape="box", style="dashed")
    dot.edge(ids[root.grad_fn], "out", label=_shape(root.shape))
    constants = 0
    for node in kept:
        if type(node) is AccumulateGrad:
            continue
        for nxt, nr, shape, dtype in node._edges:  # (autograd.function._connect)
            if shape is None:  # a non-tensor argument (a dim, a shape)
                continue
            if nxt is None:  # a tensor that does not require grad
                src = f"const{constants}"
                constants += 1
                dot.node(src, f"constant\\n{_shape(shape)} {dtype}", shape="ellipse", style="filled",
                         fillcolor=_COLORS["constant"])
            else:
                src = ids.get(nxt, "more")
            label = _shape(shape) + (f" [{nr}]" if nxt is not None and nxt._n_outputs > 1 else "")
            dot.edge(src, ids[node], label=label)


def _tensor_label(t: Tensor, title: str, show_grads: bool) -> str:
    label = f"{title}\\n{_shape(t.shape)} {t.dtype}"
    if show_grads and t.grad is not None:
        g = t.grad.detach().numpy()
        if g.size <= _MAX_GRAD_VALUES:
            values = ", ".join(f"{v:.4g}" for v in g.reshape(-1).tolist())
            label += f"\\ngrad [{values}]"
        else:
            label += f"\\ngrad norm {float((g.astype('float64') ** 2).sum()) ** 0.5:.4g}"
    return label


def _shape(shape: Any) -> str:
    return str(tuple(shape))


def _is_parameter(t: Tensor) -> bool:
    return is_parameter(t)
