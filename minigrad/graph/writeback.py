"""Updates in place: compute a traced step's new values straight into the tensors they update (chapter 03).

A traced optimizer step ends in ``copy_`` effects: ``buf.mul_(0.9).add_(g)`` and ``p.sub_(lr *
buf)`` record ``copy_(buf, m)``, ``copy_(buf, a)`` and ``copy_(p, u)``, applied once the whole graph
has run, so each new value is computed into a fresh array and then copied. A tensor's buffer is like
a register: a new value may move in once every reader of the value it holds has run. ``plan_writes``
finds, before anything runs, the values that can be computed into their tensor's buffer (a ufunc's
``out=``, for ops that declare their ``ufunc``, or a generated kernel's), so that their copies have
nothing left to do, the copies that a later copy into the same tensor overwrites anyway, and the new
gradients that may become ``.grad`` without a copy (as eager's engine keeps a gradient no one else
holds). Before fusion, ``drop_overwritten_copies`` removes the overwritten copies from the graph, so
that ``m = buf * 0.9`` is read by ``m + g`` alone and both fuse into one kernel. A kernel with
several results (``passes.update_fusion``: the new momentum and the new weight) writes each into
its tensor when it runs, so its results are planned at its step.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from minigrad.graph.codegen import is_anchor
from minigrad.graph.codegen.c import CKernel, MultiKernel
from minigrad.graph.codegen.multi_tensor import MultiTensorKernel
from minigrad.graph.codegen.numpy_blocks import CpuKernel, one_ufunc
from minigrad.graph.ir import EFFECT_OPS, SIDE_EFFECT_OPS, SOURCE_OPS, Graph, Node, op_kind
from minigrad.graph.passes.rewrite import DROP, Rewriter, rewrite
from minigrad.graph.trace import ARRAY_ARG, TENSOR_ARG

__all__ = ["WritePlan", "drop_overwritten_copies", "plan_writes", "ufunc_args"]


class WritePlan(NamedTuple):
    """What ``plan_writes`` found. ``into`` maps a value to the parameter node whose tensor's buffer
    it is computed into; ``absorbed`` copies have nothing left to write (the buffer already holds
    the value, or a later copy overwrites it) but still bump the tensor's version; ``own_grads``
    are the ``set_grad`` effects whose value becomes ``.grad`` as it is; ``overlaps`` are the pairs
    of source nodes whose arrays must not overlap for ``into`` to hold (checked when they change)."""

    into: dict[Node, Node]
    absorbed: frozenset[Node]
    own_grads: frozenset[Node]
    overlaps: tuple[tuple[Node, Node], ...]


def plan_writes(steps: list[list[Node]], effects: list[Node], outputs: list[Node], keep_ctx: set[Node]) -> WritePlan:
    """Plan the in-place writes of a schedule (``steps``: nodes that run at once, in order)."""
    step_of = {n: k for k, step in enumerate(steps) for n in step}
    copies: dict[Node, list[Node]] = {}
    for e in effects:
        if e.op == "copy_":
            copies.setdefault(e.inputs[0], []).append(e)
    into: dict[Node, Node] = {}
    absorbed: set[Node] = set()
    for target, writes in copies.items():
        if target.op != "parameter":  # an input or a .grad: whose memory it is depends on the call
            continue
        if _end_readers(_aliases(target)):  # an effect or the output reads what the tensor holds
            continue
        placed = _place(target, writes, step_of, keep_ctx, into)
        into.update((v, target) for v in placed)
        absorbed.update(writes[:-1])  # the last copy overwrites these: nothing reads the tensor between
        if writes[-1].inputs[1] in placed:
            absorbed.add(writes[-1])
    return WritePlan(into, frozenset(absorbed), _own_grads(effects, outputs, into),
                     _overlaps(into, copies, step_of, len(steps)))


def drop_overwritten_copies(graph: Graph) -> Graph:
    """A new graph without the ``copy_`` effects that a later copy into the same input or
    parameter overwrites, when no effect between the two reads memory that may hold the tensor
    (only fresh values). Effects apply at the end, in order, so an overwritten copy only made its
    value look read twice, which kept it out of a fused group. The copy that stays records in
    ``attrs['writes']`` how many writes it stands for: the tensor's version moves as in eager."""
    effects = [n for n in graph.topological_order() if n.op in EFFECT_OPS]
    heir: dict[Node, Node] = {}  # an overwritten copy -> the last copy into its tensor
    later: dict[Node, int] = {}  # a target -> the index of the next copy into it
    for k in reversed(range(len(effects))):
        e = effects[k]
        if e.op != "copy_" or e.inputs[0].op not in ("parameter", "placeholder"):
            continue
        j = later.get(e.inputs[0])
        if j is not None and all(_fresh(v) for between in effects[k + 1:j] for v in between.inputs[1:]):
            heir[e] = heir.get(effects[j], effects[j])
        later[e.inputs[0]] = k
    writes: dict[Node, int] = {}
    for e, h in heir.items():
        writes[h] = writes.get(h, h.attrs.get("writes", 1)) + e.attrs.get("writes", 1)

    def visit(node: Node, rw: Rewriter) -> Any:
        if node in heir:
            return DROP
        return rw.copy(node, attrs={**node.attrs, "writes": writes[node]}) if node in writes else None

    return rewrite(graph, visit)


def _place(target: Node, writes: list[Node], step_of: dict[Node, int], keep_ctx: set[Node],
           into: dict[Node, Node]) -> list[Node]:
    """The values written into ``target`` that can be computed into its buffer, in schedule order:
    each moves in once every reader of the previous occupant (the old value first) has run. At the
    end the buffer holds the last value placed, so an effect may read it there only if it is the
    final one; the output never (the caller would get the tensor's memory). A value copied into
    two tensors is computed into the first one's buffer only."""
    final = writes[-1].inputs[1]
    values = sorted(dict.fromkeys(w.inputs[1] for w in writes), key=step_of.__getitem__)
    occupant, placed = target, []
    for v in values:
        readers = _end_readers(_aliases(v))
        late = any(r.op == "output" for r in readers) if v is final else bool(readers - set(writes[:-1]))
        if (v in into or v.shape != target.shape or v.dtype != target.dtype or not _writes_out(v, keep_ctx) or late
                or (occupant is not target and step_of[_maker(occupant)] >= step_of[_maker(v)])  # at once (parallel)
                or not _moves_in_after(v, occupant, step_of)):
            continue
        placed.append(v)
        occupant = v
        if v is final:  # the buffer must end with the last value copied into it
            break
    return placed


def _moves_in_after(v: Node, occupant: Node, step_of: dict[Node, int]) -> bool:
    """Whether ``v`` may be written over ``occupant``'s buffer at its step: everything that reads
    the occupant (or a view of it) runs earlier, except ``v`` itself when it can write over its
    input (a ufunc can, whatever the overlap; a kernel only over the very array it reads)."""
    maker = _maker(v)  # a result of a kernel with several is written when that kernel runs
    s = step_of[maker]
    for a in _aliases(occupant):
        if a is not occupant and step_of[a] >= s:
            return False
        for u in a.users:
            if u.op in SIDE_EFFECT_OPS:
                continue
            if u is maker:
                if maker.op == "fused" and not (a is occupant and _kernel_overwrites(maker, a, v)):
                    return False
            elif step_of[u] >= s:
                return False
    return True


def _writes_out(v: Node, keep_ctx: set[Node]) -> bool:
    """Whether the executor can have ``v`` computed into a given array."""
    if v.op == "fused":
        return isinstance(v.fn, (CpuKernel, CKernel))
    if _several(v):
        return True
    return (getattr(v.fn, "ufunc", None) is not None and not v.meta.get("kwargs")
            and v not in keep_ctx)  # a ctx must hold what forward saves: forward has to run


def _kernel_overwrites(v: Node, a: Node, result: Node) -> bool:
    """Whether ``v``'s kernel may write its result over its input ``a``: it reads each element
    of ``a`` before writing that element of the result. Block by block, only the group's root
    writes the result, after the other members have read their inputs; the root itself may read
    ``a`` only when it is one ufunc call (codegen's rule for writing a product's epilogue over it).
    A C kernel reads every element before writing it, but falls back to blocks where it cannot be
    built, so the blocks' rule holds for both. A kernel with several results loads every element
    before storing any (and without a compiler computes them into new arrays first). A kernel
    over many tensors (``passes.horizontal_fusion``) does so tensor by tensor: its ``result``
    may go over ``a`` only when no other tensor of it reads ``a``."""
    if isinstance(v.fn, MultiKernel):
        return True
    if isinstance(v.fn, MultiTensorKernel):
        arity, member = v.fn.arity, result.attrs["index"] // v.fn.per_member
        return all(k // arity == member for k, i in enumerate(v.inputs) if i is a)
    group = v.meta["group"]
    (root,) = group.outputs
    twin = group.placeholders[v.inputs.index(a)]
    return twin not in root.inputs or one_ufunc(root)


def _aliases(x: Node) -> set[Node]:
    """``x`` and the nodes whose value may share its memory: views of it (or of them), the
    arrays that ops reading them saved for backward, and anything an op might return unchanged.
    Only a new array from an elementwise op, a product or a generated kernel is known to be fresh."""
    found, stack = {x}, [x]
    while stack:
        for u in stack.pop().users:
            if u in found or u.op in SIDE_EFFECT_OPS:
                continue
            new = [u] if not _fresh(u) else [s for s in u.users if s.op == "saved" and s not in found]
            found.update(new)
            stack.extend(new)
    return found


def _several(n: Node) -> bool:
    """Whether ``n`` is a result of a fused kernel with several results (``passes.update_fusion``)."""
    return n.op == "getitem" and isinstance(n.inputs[0].fn, (MultiKernel, MultiTensorKernel))


def _maker(n: Node) -> Node:
    """The node whose run writes ``n``'s value: its kernel for a result of one with several."""
    return n.inputs[0] if _several(n) else n


def _fresh(n: Node) -> bool:
    return n.op == "fused" or _several(n) or (getattr(n.fn, "array_forward", False)
                               and (op_kind(n) == "elementwise" or is_anchor(n)))


def _end_readers(nodes: set[Node]) -> set[Node]:
    """The effects and the output that read one of ``nodes`` (as a value, not as the target)."""
    return {u for n in nodes for u in n.users
            if u.op == "output" or (u.op in EFFECT_OPS and n in u.inputs[1:])}


def _own_grads(effects: list[Node], outputs: list[Node], into: dict[Node, Node]) -> frozenset[Node]:
    """The ``set_grad`` effects whose value is a fresh array that nothing else returns or keeps."""
    grads = [e for e in effects if e.op == "set_grad" and len(e.inputs) > 1]
    own = set()
    for e in grads:
        g = e.inputs[1]
        others = {o.inputs[1] for o in grads if o is not e}
        if _fresh(g) and g not in into and not (_aliases(g) & (others | set(outputs))):
            own.add(e)
    return frozenset(own)


def _overlaps(into: dict[Node, Node], copies: dict[Node, list[Node]], step_of: dict[Node, int],
              end: int) -> tuple[tuple[Node, Node], ...]:
    """Pairs (written target, other source) whose arrays must not overlap: a source that is read
    after the first write into the target, or written itself, would otherwise see the new value."""
    first: dict[Node, int] = {}
    for v, t in into.items():
        first[t] = min(first.get(t, end), step_of[_maker(v)])
    sources = [n for n in step_of if n.op in SOURCE_OPS]
    pairs = []
    for s in sources:
        aliases = _aliases(s)
        late = end if s in copies or _end_readers(aliases) else max(
            [step_of[u] for a in aliases for u in a.users if u.op not in SIDE_EFFECT_OPS]
            + [step_of[a] for a in aliases])
        pairs += [(t, s) for t, k in first.items() if t is not s and late >= k]
    return tuple(pairs)


def ufunc_args(node: Node, arrays: list[Any]) -> list[Any]:
    """The arguments of a ``ufunc`` op's forward: its input arrays with its recorded attributes."""
    it = iter(arrays)
    return [next(it) if k in (TENSOR_ARG, ARRAY_ARG) else node.attrs[k] for k in node.meta["args"]]
