"""Horizontal fusion: the same kernel on many tensors as one call (chapter 03).

After ``fuse_elementwise`` and ``fuse_updates``, a traced optimizer step still calls one kernel
per parameter, and before it one per bias correction and one op per step count: for a small GPT's
102 parameters, about 500 calls whose Python cost is many times their work. These calls do the
same thing to different tensors and none reads another's result, so ``fuse_horizontal`` puts
each set of them into one ``fused`` node with one result per member's result, run by one
multi-tensor C kernel (``codegen.multi_tensor``), with a ``getitem`` per result for its readers;
results copied into tensors are computed straight into them (``minigrad.graph.writeback``). Fusing
*across* independent ops is what XLA calls horizontal fusion (and PyTorch's ``foreach`` optimizers
do by hand). Members are fused elementwise C kernels and single elementwise ops on single numbers,
grouped by their loop body; a member joins a set only if it depends on none of its members
(ancestor sets as bit masks), and only if no other member reads a tensor that it writes. Only C
kernels merge: blocked numpy gains nothing from one call.
"""

from __future__ import annotations

import heapq
import math
from typing import Any

from minigrad.graph.codegen import c
from minigrad.graph.codegen.multi_tensor import MultiTensorKernel, body_of, generate_multi_tensor
from minigrad.graph.codegen.program import Program
from minigrad.graph.ir import EFFECT_OPS, SIDE_EFFECT_OPS, Graph, Node, op_kind
from minigrad.graph.passes.rewrite import Rewriter, is_random

__all__ = ["fuse_horizontal"]

MIN_MEMBERS = 2  # one call saved already pays: a kernel call costs tens of microseconds of Python


def fuse_horizontal(graph: Graph, backend: str = "c") -> Graph:
    """A new graph in which each set of independent kernels with one loop body is one ``fused``
    node (``backend="c"``; with ``"numpy"`` the graph is returned as it is)."""
    if backend != "c":
        return graph
    order = graph.topological_order()
    sets = _sets(order)
    while sets:
        new = _rebuild(graph, order, sets)
        if isinstance(new, Graph):
            return new
        sets = [s for s in sets if not (set(s[0]) & new)]  # dissolve the sets caught in a cycle, try again
    return graph


def _sets(order: list[Node]) -> list[tuple[list[Node], Graph, list[str], list[int]]]:
    """The sets to merge: (members in order, the first member's sub-graph, the body, the leaves)."""
    written = {e.inputs[0] for e in order if e.op == "copy_"}
    bit: dict[Node, int] = {}
    above: dict[Node, int] = {}  # each node's ancestors among the candidates, as a bit mask
    # a body -> its sets still taking members: [members, their bits, what they write, what they read, sub, body, leaves]
    open_sets: dict[Any, list] = {}
    found = []
    for n in order:
        mask = 0
        for p in n.predecessors:
            mask |= above[p] | bit.get(p, 0)
        above[n] = mask
        sub = _sub_graph(n)
        made = body_of(sub, c._C) if sub is not None else None
        if made is None:
            continue
        body, leaves = made
        key = (tuple(body), tuple(leaves), tuple(str(p.dtype) for p in sub.placeholders), len(n.inputs))
        bit[n] = 1 << len(bit)
        reads = set(n.inputs)
        writes = reads & written
        for s in open_sets.setdefault(key, []):
            if not (mask & s[1]) and not (writes & s[3]) and not (reads & s[2]):
                s[0].append(n)
                s[1] |= bit[n]
                s[2] |= writes
                s[3] |= reads
                break
        else:
            open_sets[key].append([[n], bit[n], writes, reads, sub, body, leaves])
    for sets in open_sets.values():
        found += [(s[0], s[4], s[5], s[6]) for s in sets if len(s[0]) >= MIN_MEMBERS]
    return found


def _sub_graph(n: Node) -> Graph | None:
    """The sub-graph a member computes (placeholders in the order of ``n``'s inputs, elementwise
    members, results of one shape), or None when ``n`` cannot be a member: a C kernel of
    elementwise ops that calls no vector math function, or one elementwise op on single numbers."""
    if getattr(n.meta.get("device"), "type", "cpu") != "cpu":
        return None  # C kernels are the CPU's
    if n.op == "fused":
        if getattr(n.fn, "threaded", False):
            return None  # a loop big enough to share among threads: the one-thread table would lose that
        if isinstance(n.fn, c.MultiKernel) and all(u.op == "getitem" for u in n.users):
            group = n.fn.group
        elif isinstance(n.fn, c.CKernel) and n.fn._anchor is None and n.meta.get("kind") == "elementwise":
            group = n.meta["group"]
        else:
            return None
        members = [m for m in group.topological_order() if m.op not in ("placeholder", "output")]
        shapes = {tuple(r.shape) for r in group.outputs}
        if any(op_kind(m) != "elementwise" for m in members) or len(shapes) != 1:
            return None
        if math.prod(shapes.pop()) != 1 and any(c._calls_math(m) for m in members):
            return None  # a vector math call might round otherwise than the member's own loop
        return group
    if (n.op in SIDE_EFFECT_OPS or n.shape is None or math.prod(n.shape) != 1 or not n.inputs
            or op_kind(n) != "elementwise" or not isinstance(n.fn, type) or not getattr(n.fn, "array_forward", False)
            or is_random(n) or any(u.op == "saved" for u in n.users)):  # a saved node reads the op's ctx
        return None
    sub = Graph()
    twins = {}
    for i in dict.fromkeys(n.inputs):
        twins[i] = sub.add_node("placeholder", shape=i.shape, dtype=i.dtype, name=i.name,
                                meta={"device": i.meta.get("device")})
    if len(twins) != len(n.inputs):
        return None  # an input read twice: the member's arguments would not line up with the placeholders
    twin = sub.add_node(n.op, [twins[i] for i in n.inputs], n.attrs, shape=n.shape, dtype=n.dtype, fn=n.fn,
                       name=n.name, meta=n.meta)
    sub.set_outputs([twin])
    prog = Program(n.op.lower(), list(n.inputs), None, [n], None, tuple(n.shape), n)
    if c.unsupported(prog) is not None:
        return None
    return sub


def _results(n: Node) -> list[Node]:
    """The nodes that stand for a member's results: its getitems for a kernel with several, else itself."""
    if isinstance(n.fn, c.MultiKernel):
        got = {u.attrs["index"]: u for u in n.users if u.op == "getitem"}
        return [got.get(k) for k in range(n.attrs["results"])]
    return [n]


def _rebuild(graph: Graph, order: list[Node], sets: list) -> Graph | set[Node]:
    """The graph with each set contracted into one node, emitted in a topological order of the
    contracted graph that keeps the original order where it can (and the side effects' order
    always); the nodes of a cycle through the sets when there is none."""
    position = {n: k for k, n in enumerate(order)}
    unit: dict[Node, Any] = {}  # node -> the set (its index) it is emitted with
    for k, (members, *_) in enumerate(sets):
        for m in members:
            unit[m] = k
            for r in _results(m):
                if r is not None and r is not m:
                    unit[r] = k
    units: dict[Any, list[Node]] = {}
    for n in order:
        units.setdefault(unit.get(n, n), []).append(n)
    preds = {u: {unit.get(p, p) for n in ns for p in n.predecessors} - {u} for u, ns in units.items()}
    users: dict[Any, list] = {u: [] for u in units}
    for u, ps in preds.items():
        for p in ps:
            users[p].append(u)
    missing = {u: len(ps) for u, ps in preds.items()}
    prio = {u: min(position[n] for n in ns) for u, ns in units.items()}
    ready = [(prio[u], k, u) for k, u in enumerate(units) if missing[u] == 0]
    heapq.heapify(ready)
    emitted = []
    index = {u: k for k, u in enumerate(units)}
    while ready:
        _, _, u = heapq.heappop(ready)
        emitted.append(u)
        for s in users[u]:
            missing[s] -= 1
            if missing[s] == 0:
                heapq.heappush(ready, (prio[s], index[s], s))
    if len(emitted) != len(units):
        return {n for u, k in missing.items() if k > 0 for n in units[u]}
    if _writes_move([n for u in emitted for n in units[u]], order):
        return set(unit)  # leave every set alone
    rw = Rewriter(graph)
    members = {m for s in sets for m in s[0]}
    for u in emitted:
        if isinstance(u, int):
            _merge(rw, *sets[u], members)
        else:
            rw.env[u] = rw.copy(u)
    return rw.finish()


def _writes_move(new: list[Node], old: list[Node]) -> bool:
    """Whether the new order changes the order of the writes into one tensor, or, where the graph
    has a ``call`` (which may read anything), the order of any two side effects."""
    def writes(order: list[Node]) -> Any:
        effects = [n for n in order if n.op in SIDE_EFFECT_OPS and n.op != "output"]
        if any(n.op not in EFFECT_OPS for n in effects):
            return effects
        per: dict[Node, list[Node]] = {}
        for e in effects:
            per.setdefault(e.inputs[0], []).append(e)
        return per
    return writes(new) != writes(old)


def _merge(rw: Rewriter, members: list[Node], sub: Graph, body: list[str], leaves: list[int],
           merged_nodes: set[Node]) -> None:
    """One ``fused`` node for the set and a ``getitem`` per member result, standing for the old
    ones. A result that only merged kernels read (``merged_nodes``: a bias correction) is kept
    in the kernel's own memory from call to call: nothing else holds it."""
    first = members[0]
    per = len(sub.outputs)
    shapes = [_shapes(m) for m in members]
    sizes = [math.prod(s[0][0]) for s in shapes]
    ops = dict.fromkeys(n.op.lower() for n in sub if n.op not in ("placeholder", "output"))
    name = "".join(ch if ch.isalnum() else "_" for ch in f"fused_{len(members)}_tensors_{'_'.join(list(ops)[:3])}")
    source = generate_multi_tensor(name, body, sizes, per, len(leaves))
    kept = frozenset(j * per + k for j, m in enumerate(members) for k, r in enumerate(_results(m))
                     if r is not None and r.users and all(u in merged_nodes for u in r.users))
    parts = [m.fn if m.op == "fused" else _forward(m) for m in members]
    types = [str(sub.placeholders[k].dtype) for k in leaves]
    kernel = MultiTensorKernel(name, source, len(first.inputs), leaves, types, shapes, parts, sub, kept)
    inputs = [rw[i] for m in members for i in m.inputs]
    meta = {"device": first.meta.get("device"), "ctx_device": first.meta.get("ctx_device"),
            "args": ("<tensor>",) * len(inputs), "kwargs": (), "group": sub, "kind": "elementwise"}
    merged = rw.new.add_node("fused", inputs, {"ops": kernel.ops, "results": per * len(members)}, fn=kernel,
                             name=f"{first.name}_x{len(members)}", meta=meta)
    for j, m in enumerate(members):
        for k, r in enumerate(_results(m)):
            if r is None:
                continue
            rw.env[r] = rw.new.add_node("getitem", [merged], {"index": j * per + k}, shape=r.shape, dtype=r.dtype,
                                        name=r.name, meta={"device": r.meta.get("device")})


def _shapes(n: Node) -> list[tuple]:
    """A member's results' shapes and dtypes."""
    if n.op != "fused":
        return [(tuple(n.shape), n.dtype)]
    group = n.fn.group if isinstance(n.fn, c.MultiKernel) else n.meta["group"]
    return [(tuple(r.shape), r.dtype) for r in group.outputs]


def _forward(n: Node) -> Any:
    """A single op's forward on arrays: the fallback of its member."""
    from minigrad.graph.interpret import run_node

    return lambda *arrays: run_node(n, arrays)[0]
