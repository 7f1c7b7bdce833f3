"""draw: the autograd graph of a tensor and IR graphs as Graphviz pictures, identical run to run."""

import re
import shutil

import pytest

graphviz = pytest.importorskip("graphviz")

import minigrad as mg  # noqa: E402
from minigrad import nn  # noqa: E402
from minigrad.graph import draw, trace  # noqa: E402
from minigrad.graph.viz import GraphvizNotFoundError  # noqa: E402

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")


def expression():
    """y = sum(W @ a + x): W a parameter, a an input leaf that requires grad, x a constant."""
    mg.manual_seed(0)
    W = nn.Parameter(mg.randn(2, 3))
    a = mg.randn(3, requires_grad=True)
    x = mg.randn(2)
    return (W @ a + x).sum(), W, a


def counts(dot):
    nodes = [line for line in dot.source.splitlines()
             if re.match(r"\s+\w+ \[", line) and line.split()[0] not in ("graph", "node", "edge")]
    edges = [line for line in dot.source.splitlines() if "->" in line]
    return len(nodes), len(edges)


def test_autograd_graph_has_ops_tensors_and_shapes():
    y, W, a = expression()
    dot = draw(y)
    assert isinstance(dot, graphviz.Digraph)
    # ops Sum, Add, Matmul; tensors W, a, the constant x and the output y
    assert counts(dot) == (7, 6)
    src = dot.source
    for text in ("Matmul", "Add", "Sum", "parameter\\n(2, 3) float32", "input\\n(3,) float32",
                 "constant\\n(2,) float32", "output\\n() float32", 'label="(2,)"'):
        assert text in src, text
    assert src.count("#fdd49e") == 1  # the parameter has its own colour
    assert "0x" not in src


def test_names_and_gradients_in_labels():
    y, W, a = expression()
    y.backward()
    src = draw(y, show_grads=True, names={"W": W, "a": a}, rankdir="LR").source
    assert "W\\n(2, 3) float32\\ngrad [" in src and "a\\n(3,) float32\\ngrad [" in src
    assert "rankdir=LR" in src


@needs_dot
def test_drawing_is_identical_across_runs():
    first, second = draw(expression()[0]), draw(expression()[0])
    assert first.source == second.source
    assert first.pipe(format="svg") == second.pipe(format="svg")


def test_ir_graph_is_coloured_by_kind():
    W = mg.randn(3, 4, requires_grad=True)

    def f(x):
        return (x @ W).relu().sum()

    sources = [draw(trace(f, mg.randn(2, 3)).graph).source for _ in range(2)]
    assert sources[0] == sources[1]
    src = sources[0]
    assert counts(draw(trace(f, mg.randn(2, 3)).graph)) == (6, 5)
    for color in ("#9ecae1", "#fdd49e", "#dadaeb", "#c7e9c0", "#fcbba1"):  # input, param, matmul, ewise, reduce
        assert color in src
    graph = trace(f, mg.randn(2, 3)).graph
    assert graph.to_dot().count("->") == 5


def test_ir_ordering_edges_are_drawn_dashed():
    g = trace(lambda w: (w * 2, w * 3), mg.randn(3)).graph
    first, second = [n for n in g if n.op == "Mul"]
    g.add_ordering(first, second)  # no value flows: the edge only orders the two
    src = draw(g).source
    ids = {n: f"n{k}" for k, n in enumerate(g.topological_order())}
    assert f"{ids[first]} -> {ids[second]} [style=dashed]" in src
    assert src.count("style=dashed") == 1 and counts(draw(g))[1] == g.to_dot().count("->")


def test_max_nodes_summarises_the_rest():
    x = mg.randn(3, requires_grad=True)
    y = x
    for _ in range(30):
        y = y * 1.5
    src = draw(y, max_nodes=10).source
    assert "... 21 more nodes" in src and counts(draw(y, max_nodes=10))[0] == 12


def test_missing_dot_says_how_to_install_it(monkeypatch):
    dot = draw(expression()[0])
    monkeypatch.setenv("PATH", "")  # no `dot` to run
    assert dot.source.startswith("digraph")  # the text is still there
    for render in (lambda: dot.pipe(format="svg"), dot._repr_mimebundle_, dot._repr_image_svg_xml):
        with pytest.raises(GraphvizNotFoundError, match="apt-get install graphviz") as err:
            render()
        assert "make graphviz" in str(err.value)
        assert isinstance(err.value, graphviz.ExecutableNotFound)


def test_draw_rejects_other_objects():
    with pytest.raises(TypeError, match="expected a Tensor"):
        draw(3)


def test_draw_pair_outlines_what_a_pass_changed():
    from minigrad.graph.passes import eliminate_dead_code
    from minigrad.graph.viz import changed_nodes, draw_pair

    def f(x):
        (x * 3).exp()  # dead: nothing reads it
        return x.tanh() + 1

    before = trace(f, mg.randn(2, 3)).graph
    after = eliminate_dead_code(before)
    dead = {n.name for n in before if n.op in ("Mul", "Exp")}
    assert changed_nodes(before, after) == dead and changed_nodes(before, before) == set()
    src = draw_pair(before, after, colours={n.name: "#abcdef" for n in after if n.op == "Tanh"}).source
    assert "subgraph cluster_before" in src and "subgraph cluster_after" in src
    assert src.count('color="#d7301f"') == len(dead)  # outlined in the graph before only
    assert src.count('fillcolor="#abcdef"') == 2  # the tanh, in both graphs
    assert draw_pair(before, after, marked=()).source.count("#d7301f") == 0
    assert draw_pair(before, after).source == draw_pair(trace(f, mg.randn(2, 3)).graph, after).source  # byte for byte
