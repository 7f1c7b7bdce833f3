"""The graph IR: edges kept in sync, cached topological order, SSA text, DOT text, levels, copy; and
the code that reads graphs learns about an op from its class, never from a table of op names."""

import ast
from pathlib import Path

import pytest

from minigrad import float32
from minigrad.graph import Graph, GraphError, op_kind
from minigrad.ops.elementwise import Add, Exp, Neg
from minigrad.ops.linalg import Matmul
from minigrad.ops.op import all_ops


def diamond():
    """x -> a = Exp(x), b = Neg(x) -> c = Add(a, b) -> output: two independent branches."""
    g = Graph()
    x = g.add_node("placeholder", shape=(2, 3), dtype=float32, name="%x")
    a = g.add_node("Exp", [x], shape=(2, 3), dtype=float32, fn=Exp)
    b = g.add_node("Neg", [x], shape=(2, 3), dtype=float32, fn=Neg)
    c = g.add_node("Add", [a, b], shape=(2, 3), dtype=float32, fn=Add)
    g.set_outputs([c])
    return g, x, a, b, c


def test_edges_are_kept_in_sync():
    g, x, a, b, c = diamond()
    assert x.users == [a, b] and c.inputs == (a, b)
    c.inputs = [a, a]
    assert b.users == [] and a.users == [c]
    c.replace_input(a, b)
    assert c.inputs == (b, b) and a.users == [] and b.users == [c]


def test_cached_order_is_invalidated_by_every_mutation():
    g, x, a, b, c = diamond()
    order = g.topological_order()
    assert order == [x, a, b, c, g.output_node]
    assert g.topological_order() == order and g._order is not None  # cached
    d = g.add_node("Relu", [c], shape=(2, 3), dtype=float32)
    assert g._order is None
    g.set_outputs([d])
    assert g.topological_order()[-2:] == [d, g.output_node]
    # a node added later but read by an earlier one moves before it
    e = g.add_node("Sin", [x], shape=(2, 3), dtype=float32)
    a.inputs = [e]
    order = g.topological_order()
    assert order.index(e) < order.index(a)
    assert g.replace_all_uses_with(c, b) == 1 and g._order is None
    g.erase(c)
    assert c not in g and g._order is None
    assert [n.op for n in g.topological_order()] == ["placeholder", "Neg", "Relu", "output", "Sin", "Exp"]


def test_erase_refuses_a_node_in_use_and_cycles_are_reported():
    g, x, a, b, c = diamond()
    with pytest.raises(GraphError, match="still used by"):
        g.erase(a)
    a.inputs = [c]
    with pytest.raises(GraphError, match="cycle"):
        g.topological_order()
    with pytest.raises(GraphError, match="not a node of this graph"):
        Graph().add_node("Neg", [x])


def test_ssa_listing():
    g, *_ = diamond()
    g.add_node("Sum", [g.outputs[0]], {"dims": (1,), "keepdim": False}, shape=(2,), dtype=float32)
    assert str(g).splitlines() == [
        "%x = placeholder  # (2, 3) float32",
        "%1 = Exp(%x)  # (2, 3) float32",
        "%2 = Neg(%x)  # (2, 3) float32",
        "%3 = Add(%1, %2)  # (2, 3) float32",
        "output(%3)",
        "%5 = Sum(%3, dims=(1,), keepdim=False)  # (2,) float32",
    ]


def test_names_are_unique_and_deterministic():
    g = Graph()
    assert [g.add_node("placeholder", name="%x").name for _ in range(3)] == ["%x", "%x_1", "%x_2"]


def test_levels_group_independent_nodes():
    g, x, a, b, c = diamond()
    assert g.levels() == [[x], [a, b], [c], [g.output_node]]
    for level in g.levels():
        for n in level:
            assert not set(n.inputs) & set(level)


def test_to_dot_is_deterministic_and_coloured_by_kind():
    g1, *_ = diamond()
    g2, *_ = diamond()
    src = g1.to_dot()
    assert src == g2.to_dot() and src.startswith("digraph {")
    assert "n0 -> n1" in src and "n0 -> n2" in src and src.count("->") == 5
    assert "0x" not in src
    fills = {n.op: attrs["fillcolor"] for n, (_, attrs) in zip(g1.topological_order(), g1.dot_elements()[0])}
    assert fills["Exp"] == fills["Add"] != fills["placeholder"]
    # a node's kind is what its op class declares; an op that declares none (or no class) is "other"
    m = g1.add_node("Matmul", [g1.placeholders[0], g1.placeholders[0]], fn=Matmul)
    assert op_kind(m) == "matmul" and g1.nodes[1].kind == "elementwise" and g1.placeholders[0].kind == "placeholder"
    assert g1.add_node("Whatever", fn=None).kind == "other"


def test_copy_is_independent():
    g, x, a, b, c = diamond()
    h = g.copy()
    assert str(h) == str(g) and len(h) == len(g)
    h.erase(h.output_node)
    assert g.output_node is not None and len(g) == 5 and len(h) == 4


def op_names_in(source: str) -> list[tuple[int, str]]:
    """(line, name) of each string literal in ``source`` that is the name of a built-in op class,
    outside docstrings and the ONNX op types an emitter passes to its builder (``b.add("Mul", ...)``:
    ONNX's names, which happen to match some of ours)."""
    names = {cls.__name__ for cls in all_ops()}
    tree = ast.parse(source)
    allowed = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body \
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            allowed.add(id(body[0].value))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add" \
                and node.args:
            allowed.add(id(node.args[0]))
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in names and id(n) not in allowed]


def test_no_code_that_reads_graphs_names_an_op():
    root = Path(__file__).resolve().parents[2] / "minigrad" / "graph"
    found = {str(p.relative_to(root)): hits for p in sorted(root.rglob("*.py")) if (hits := op_names_in(p.read_text()))}
    assert not found, f"op class names in quoted strings (declare what the pass needs on the op class instead): {found}"


def test_the_op_name_finder_finds_a_name_in_a_comparison_and_in_a_table():
    code = '''"""Docstring naming "Mul"."""
def f(node, b):
    """Matches ``"Add"``."""
    b.add("Mul", [node])
    return node.op in ("Sub",) or {"Exp": 1}.get(node.op)
'''
    assert sorted(op_names_in(code)) == [(5, "Exp"), (5, "Sub")]
