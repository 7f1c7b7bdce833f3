"""Dead code elimination: drop the nodes whose values nobody needs (chapter 03).

A node is live when its value reaches the graph's output or a side effect (an in-place write, a
``.grad`` update); everything else is dead: a Python test the trace recorded but no longer acts
on, a gradient the function never used. Liveness is a walk backwards from those roots along the
in-edges (``live_nodes``). Placeholders stay, since they are the graph's signature, and so do
random ops, since a draw from the random generator is an effect on the generator.
"""

from __future__ import annotations

from minigrad.graph.ir import Graph, Node
from minigrad.graph.passes.rewrite import DROP, Rewriter, live_nodes, rewrite

__all__ = ["eliminate_dead_code"]


def eliminate_dead_code(graph: Graph) -> Graph:
    """A new graph without the nodes whose results reach no output or side effect.

    ``live_nodes(graph)`` gives the live nodes (the module docstring says which). Build it with ``rewrite(graph, visit)`` (``passes/rewrite.py``): ``visit(node, rw)`` is called
    once per node in topological order and returns ``None`` to copy the node as it is, ``DROP`` to
    leave it out, or a node of the new graph (``rw.copy(node)``, ``rw.constant(...)``, an earlier
    one) to stand for it.
    The input graph is not changed.
    """
    ### BEGIN SOLUTION chapter 03: dead-code elimination
    live = live_nodes(graph)

    def visit(node: Node, rw: Rewriter) -> object:
        return None if node in live else DROP

    return rewrite(graph, visit)
    ### END SOLUTION
