"""Multi-output fusion: an optimizer's update of one parameter as one kernel (chapter 03).

After ``fuse_elementwise``, SGD with momentum still updates each weight in two kernels: ``buf =
0.9 * buf + g`` (copied into the momentum buffer) and ``p = p - lr * buf`` (copied into the
weight), the second reading back from memory the buffer the first has just written; Adam takes
three (both moments, then the weight). A fused group has one way out, its root, so a value that is
both stored and read on ends a group. ``fuse_updates`` merges a fused group with the producers it
reads that are elementwise groups of its shape read by nothing else than it and the copies into
their tensors: one ``fused`` node with several results, one C loop that stores each
(``codegen.c.MultiKernel``), and a ``getitem`` per result for the copies, which the executor
computes straight into the tensors (``minigrad.graph.writeback``). XLA calls this multi-output
fusion. The copies of the merged producers move to just after the merged node; the pass merges
only where no other write comes between, so the writes keep their order. Only C kernels merge:
blocked numpy gains nothing from one loop.
"""

from __future__ import annotations

from typing import Any

from minigrad.graph.codegen import c
from minigrad.graph.ir import EFFECT_OPS, Graph, Node
from minigrad.graph.passes.rewrite import DROP, Rewriter, rewrite

__all__ = ["fuse_updates"]


def fuse_updates(graph: Graph, backend: str = "c") -> Graph:
    """A new graph in which each fused group and the producers it alone reads (besides their
    ``copy_`` writes) are one ``fused`` node with several results (``backend="c"``; with
    ``"numpy"`` the graph is copied unchanged)."""
    merges = _merges(graph) if backend == "c" else {}
    absorbed = {a: b for b, (producers, _, _) in merges.items() for a in producers}
    waiting: dict[Node, list[Node]] = {}  # a merged root -> its producers' copies, emitted after it

    def visit(node: Node, rw: Rewriter) -> Any:
        if node in absorbed:
            return DROP
        if node.op == "copy_" and node.inputs[1] in absorbed and node.inputs[1] not in rw.env:
            waiting.setdefault(absorbed[node.inputs[1]], []).append(node)
            return DROP
        if node not in merges:
            return None
        producers, inputs, kernel = merges[node]
        results = producers + [node]
        meta = {"device": node.meta.get("device"), "ctx_device": node.meta.get("ctx_device"),
                "args": ("<tensor>",) * len(inputs), "kwargs": (), "group": kernel.group, "kind": "elementwise"}
        merged = rw.new.add_node("fused", [rw[i] for i in inputs], {"ops": kernel.ops, "results": len(results)},
                                 fn=kernel, name=f"{node.name}_fused", meta=meta)
        for k, r in enumerate(results):
            rw.env[r] = rw.new.add_node("getitem", [merged], {"index": k}, shape=r.shape, dtype=r.dtype,
                                        name=r.name, meta={"device": r.meta.get("device")})
        for copy in waiting.pop(node, []):
            rw.env[copy] = rw.copy(copy)
        return rw.env[node]

    return rewrite(graph, visit)


def _merges(graph: Graph) -> dict[Node, tuple[list[Node], list[Node], c.MultiKernel]]:
    """Each group root that takes producers: (the producers, the merged node's inputs, its kernel)."""
    order = graph.topological_order()
    position = {n: k for k, n in enumerate(order)}
    merges: dict[Node, tuple[list[Node], list[Node], c.MultiKernel]] = {}
    taken: set[Node] = set()
    for b in order:
        if not _plain(b) or b in taken:
            continue
        producers = [a for a in dict.fromkeys(b.inputs) if _plain(a) and a not in taken and a not in merges
                     and a.shape == b.shape and a.meta.get("device") is b.meta.get("device") and _only_written(a, b)]
        copies = [u for a in producers for u in a.users if u.op == "copy_"]
        if not producers or any(n.op in EFFECT_OPS and n not in copies
                                for n in order[min(position[u] for u in copies):position[b]]):
            continue  # another write between them would change places with the producers' copies
        inputs = list(dict.fromkeys(i for n in producers + [b] for i in n.inputs if i not in producers))
        kernel = _kernel(producers, b, inputs)
        if kernel is not None:
            merges[b] = (producers, inputs, kernel)
            taken.update(producers)
    return merges


def _plain(n: Node) -> bool:
    """A fused elementwise group with a C kernel (no product, no reduction)."""
    return n.op == "fused" and n.meta.get("kind") == "elementwise" and isinstance(n.fn, c.CKernel)


def _only_written(a: Node, b: Node) -> bool:
    """Whether ``a`` is read by ``b`` and otherwise only copied into tensors (other than itself)."""
    copies = [u for u in a.users if u is not b]
    return bool(copies) and all(u.op == "copy_" and u.inputs[1] is a and u.inputs[0] is not a for u in copies)


def _kernel(producers: list[Node], b: Node, inputs: list[Node]) -> c.MultiKernel | None:
    """The merged sub-graph (every group's members, a producer's root feeding the groups that read
    it) and its C kernel; None when C cannot write it."""
    sub = Graph()
    twin: dict[Node, Node] = {i: sub.add_node("placeholder", shape=i.shape, dtype=i.dtype, name=i.name,
                                              meta={"device": i.meta.get("device")}) for i in inputs}
    for n in producers + [b]:
        group = n.meta["group"]
        inner = dict(zip(group.placeholders, [twin[i] for i in n.inputs]))
        for m in group.topological_order():
            if m.op not in ("placeholder", "output"):
                inner[m] = sub.add_node(m.op, [inner[i] for i in m.inputs], m.attrs, shape=m.shape, dtype=m.dtype,
                                        fn=m.fn, name=m.name, meta=m.meta)
        twin[n] = inner[group.outputs[0]]
    sub.set_outputs([twin[n] for n in producers + [b]])
    parts = [(n.fn, [("part", producers.index(i)) if i in producers else inputs.index(i) for i in n.inputs])
             for n in producers + [b]]
    return c.generate_multi(sub, parts)
