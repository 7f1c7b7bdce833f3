"""Operator fusion: merge chains of elementwise ops into one node that runs a generated kernel (chapter 03).

Eager execution runs ``0.5 * x * (1 + tanh(...))`` as a dozen ops, each reading its inputs from
memory and writing a full-size result back; fused, the chain reads ``x`` once and writes the result
once. The rules rank ops by kind, as TVM's ``fuse_ops`` does; an op's kind, and whether it takes an
epilogue or draws random numbers, are what its class declares (``minigrad.ops.op``). A node joins
the group of its consumers when *all* of its consumers are in that one group (then every path from
it meets again inside the group, so the group has one way out, its root) and its kind allows it:

- an elementwise op joins a group of elementwise ops of its shape (broadcast operands stay outside,
  as inputs), or the prologue of a reduction over its shape; a reduction ends its group, except
- a reduction that keeps axis 0 and its dims (``h.mean(-1, keepdim=True)``) may sit inside a group
  on the CPU, and so may elementwise ops on per-row values of shape ``(N, 1)``: the kernel then runs
  by blocks of whole rows, so ``h - h.mean(-1, keepdim=True)`` sees each row's mean in the same
  block (a LayerNorm-style normalise is one kernel);
- a matmul, linear or conv joins an elementwise group once, as the producer of its epilogue (a
  GEMM with bias and activation); its own inputs stay outside;
- anything else is a boundary: movement ops, tuple-valued ops, ops whose saved arrays backward
  reads, random ops (Dropout), effects (``copy_``, ``set_grad``, ``call``) and nodes with an
  ordering edge (``Node.after``) are never fused.

Groups hold at most ``max_group_size`` nodes. Each group becomes one ``fused`` node whose
``attrs['ops']`` lists its members, whose ``meta['group']`` keeps their sub-graph, and whose
``fn`` is the kernel that ``minigrad.graph.codegen`` generates for it (``fn.source`` shows it).
"""

from __future__ import annotations

from typing import Any

from minigrad.graph import codegen
from minigrad.graph.codegen import is_anchor
from minigrad.graph.ir import Graph, Node, op_kind
from minigrad.graph.passes.rewrite import DROP, Rewriter, rewrite
from minigrad.graph.trace import TENSOR_ARG

__all__ = ["MAX_GROUP_SIZE", "fuse_elementwise", "fusion_groups"]

MAX_GROUP_SIZE = 32  # members per group: long enough for GELU + gate, short enough to read the kernel


class _Group:
    """A group grown backwards from its root: members (root first), the shape its blocks cover,
    device, its product (anchor), and whether it runs by blocks of rows."""

    def __init__(self, root: Node, role: str) -> None:
        self.members, self.anchor = [root], None
        # the shape every member but the root computes: the reduced input's for a reduction
        self.shape = root.inputs[0].shape if role == "reduction" else root.shape
        self.reduction = role == "reduction"
        self.device = root.meta.get("device")
        self.rows = self.reduction and codegen.reduces_rows(root) and codegen.fuses_rows(root)

    def accepts(self, node: Node, role: str, max_size: int) -> bool:
        if len(self.members) >= max_size or node.meta.get("device") is not self.device:
            return False
        if role == "anchor":  # an epilogue has one product to start from
            return not self.reduction and not self.rows and self.anchor is None and node.shape == self.shape
        if self.anchor is not None and self.anchor in node.users:  # the product's inputs stay outside
            return False
        if role == "elementwise" and node.shape == self.shape:
            return True
        # By blocks of rows, a group also holds per-row values (N, 1) and row reductions (a
        # normalise's mean), so that the rows' statistics and the rows meet in one kernel.
        full = node.inputs[0].shape if role == "reduction" else self.shape
        if (self.anchor is not None or (self.reduction and not self.rows) or not codegen.fuses_rows(node)
                or (role == "reduction" and not codegen.reduces_rows(node))
                or not codegen.row_compatible(node.shape, full) or not codegen.row_compatible(self.shape, full)):
            return False
        self.shape, self.rows = full, True
        return True


def fusion_groups(graph: Graph, max_group_size: int = MAX_GROUP_SIZE) -> list[list[Node]]:
    """The groups fusion would make, each in topological order with its root (the node whose
    value leaves the group) last. Single nodes are not groups.

    Walk the nodes consumers first (reversed topological order). A node joins the group of its
    users only when all of them are in one group and that group ``accepts`` it (role from
    ``_role``: ``None`` never fuses; an ``"anchor"`` (a matmul, a conv) may end a group as the
    first node of its epilogue but never starts one); otherwise it starts its own group. Groups
    of one node are dropped. A node read outside its group would have to be written to memory
    anyway, which is why all users must share the group.
    """
    ### BEGIN SOLUTION chapter 03: fusion grouping
    group_of: dict[Node, _Group] = {}
    groups: list[_Group] = []
    for node in reversed(graph.topological_order()):  # consumers first
        role = _role(node)
        if role is None:
            continue
        consumers = {id(group_of.get(u)) for u in node.users}  # the one group of all users, or none
        group = group_of.get(node.users[0]) if len(consumers) == 1 and node.users else None
        if group is not None and group.accepts(node, role, max_group_size):
            group.members.append(node)
            group.anchor = node if role == "anchor" else group.anchor
            group_of[node] = group
        elif role != "anchor":
            group_of[node] = _Group(node, role)
            groups.append(group_of[node])
    return [g.members[::-1] for g in reversed(groups) if len(g.members) > 1]
    ### END SOLUTION


def fuse_elementwise(graph: Graph, max_group_size: int = MAX_GROUP_SIZE, backend: str = "numpy") -> Graph:
    """A new graph in which every group of ``fusion_groups`` is one ``fused`` node running a
    generated kernel; ``graph`` itself is not changed. ``backend`` writes CPU kernels in compiled
    C (``"c"``) or blocked numpy (``"numpy"``, the default: its source reads as Python)."""
    groups = {members[-1]: members for members in fusion_groups(graph, max_group_size)}
    inside = {n for members in groups.values() for n in members[:-1]}

    def visit(node: Node, rw: Rewriter) -> Any:
        if node in inside:
            return DROP
        members = groups.get(node)
        return None if members is None else _fused_node(members, rw, backend)

    return rewrite(graph, visit)


def _role(node: Node) -> str | None:
    """How a node may take part in fusion: elementwise, reduction, anchor, or not at all."""
    if node.shape is None or not getattr(node.fn, "array_forward", False) or getattr(node.fn, "random", False):
        return None
    if node.ordered:  # inside a kernel it would run when the group's root runs, not where its edge says
        return None
    if any(u.op in ("saved", "getitem") for u in node.users):  # backward reads its ctx
        return None
    if is_anchor(node):
        return "anchor"
    kind = op_kind(node)
    if kind == "elementwise" and codegen.supports(node):
        return "elementwise"
    if kind == "reduction" and len(node.inputs) == 1:
        return "reduction"
    return None


def _fused_node(members: list[Node], rw: Rewriter, backend: str) -> Node:
    """The ``fused`` node standing for ``members`` in the new graph, with its sub-graph and kernel."""
    root, inside = members[-1], set(members)
    inputs = list(dict.fromkeys(i for m in members for i in m.inputs if i not in inside))
    sub = Graph()
    twin: dict[Node, Node] = {}
    for i in inputs:
        twin[i] = sub.add_node("placeholder", shape=i.shape, dtype=i.dtype, name=i.name,
                               meta={"device": i.meta.get("device", root.meta.get("device"))})
    for m in members:  # kernels only evaluate forward: nothing needs to be kept for a backward
        meta = dict(m.meta, needs_input_grad=(False,) * len(m.meta.get("args", ())))
        twin[m] = sub.add_node(m.op, [twin[i] for i in m.inputs], m.attrs, shape=m.shape, dtype=m.dtype,
                               fn=m.fn, name=m.name, meta=meta)
    sub.set_outputs([twin[root]])
    kind = ("reduction" if op_kind(root) == "reduction"
            else "matmul" if any(is_anchor(m) for m in members) else "elementwise")
    meta = {"device": root.meta.get("device"), "ctx_device": root.meta.get("ctx_device"),
            "args": (TENSOR_ARG,) * len(inputs), "kwargs": (), "group": sub, "kind": kind}
    return rw.new.add_node("fused", [rw[i] for i in inputs], {"ops": tuple(m.op for m in members)},
                           shape=root.shape, dtype=root.dtype, fn=codegen.generate(sub, backend), name=root.name, meta=meta)
