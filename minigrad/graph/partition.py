"""Automatic pipeline partitioning: cut a traced model's graph into N balanced stages (chapter 04).

Pipeline parallelism needs the model cut into consecutive stages, one per rank; cut by hand, one
stage ends up slower and every other rank waits for it. Here the cut is computed from the traced
forward graph: the nodes that depend on the input are laid out in topological order, each gets a
cost (its forward time, measured or estimated from its shape, times three for forward plus a
backward that costs about twice as much), and a dynamic program places the N-1 cuts so that the
slowest stage, compute plus the bytes it sends and receives, is as fast as possible. The values
alive across a cut (every value made before it and read after it) are what the stages send each
other; ``GraphStage`` runs one stage's nodes as a ``Module`` whose input and output pack those
values into one flat tensor, so ``ScheduleGPipe`` runs it unchanged. Nodes computed from
parameters alone (a transposed weight) go with the stage that reads them.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from minigrad.backend import cpu
from minigrad.graph.interpret import ARRAY_ARG, TENSOR_ARG, keeps_ctx, node_step, run_node
from minigrad.graph.ir import SOURCE_OPS, Graph, Node, _escape
from minigrad.nn.module import Module, Parameter
from minigrad.ops import cat
from minigrad._tensor import Tensor, _wrap

__all__ = ["GraphStage", "PartitionError", "PipelinePlan", "StageCost", "node_costs", "partition"]

BACKWARD_FACTOR = 3.0  # forward + backward ~ 3x forward: backward computes two products per product
# the estimated cost model: a rough CPU, so that estimated and measured costs have the same unit
FLOPS_PER_S, BYTES_PER_S = 2e10, 5e9
LINK_BYTES_PER_S = 2e9  # what one message between two ranks of one machine moves per second
STAGE_COLORS = ["#9ecae1", "#fdd49e", "#c7e9c0", "#dadaeb", "#fcbba1", "#f0f0f0", "#fbb4c4", "#d9d9d9"]


class PartitionError(ValueError):
    """A graph that cannot be cut into pipeline stages as asked."""


@dataclass
class StageCost:
    """One stage: its nodes (topological order), the seconds one micro-batch costs it (forward plus
    backward), the bytes it receives and sends per micro-batch, and their transfer time."""

    nodes: list[Node]
    compute_s: float
    recv_bytes: int
    send_bytes: int
    link_s: float

    @property
    def total_s(self) -> float:
        return self.compute_s + self.link_s


@dataclass
class PipelinePlan:
    """Where the cuts are (``cuts[s]``: the position in ``order`` where stage s+1 starts) and what
    each stage costs. ``live[s]`` lists the values stage s receives (``live[0]`` is the input)."""

    graph: Graph
    order: list[Node]
    cuts: list[int]
    stages: list[StageCost]
    live: list[list[Node]]
    owner: dict[Node, int] = field(repr=False)

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    def step_time(self, n_microbatches: int) -> float:
        """GPipe's step with these stage costs: the pipeline fills and drains once (every stage's
        cost) and otherwise runs at the pace of the slowest stage (M-1 more of its cost)."""
        costs = [s.total_s for s in self.stages]
        return sum(costs) + (n_microbatches - 1) * max(costs)

    def bubbles(self, n_microbatches: int) -> list[float]:
        """Each stage's idle fraction of a step; with equal stages every one is (P-1)/(M+P-1)."""
        step = self.step_time(n_microbatches)
        return [1.0 - n_microbatches * s.compute_s / step for s in self.stages]

    def bubble(self, n_microbatches: int) -> float:
        """The mean idle fraction over the stages, what ``ScheduleGPipe.bubble_fraction`` measures."""
        b = self.bubbles(n_microbatches)
        return sum(b) / len(b)

    def report(self, n_microbatches: int) -> str:
        """One line per stage (its nodes, milliseconds, bytes in and out), then the bubble."""
        lines = [f"{'stage':>5} {'nodes':>6} {'compute ms':>11} {'link ms':>8} {'recv B':>9} {'send B':>9}"]
        for s, st in enumerate(self.stages):
            lines.append(f"{s:>5} {len(st.nodes):>6} {st.compute_s * 1e3:>11.3f} {st.link_s * 1e3:>8.3f} "
                         f"{st.recv_bytes:>9} {st.send_bytes:>9}")
        lines.append(f"bubble with M={n_microbatches}: {self.bubble(n_microbatches):.3f} "
                     f"(equal stages: {(self.num_stages - 1) / (n_microbatches + self.num_stages - 1):.3f})")
        return "\n".join(lines)

    def stage_of(self, node: Node) -> int | None:
        """The stage that computes ``node``, or reads it for a parameter or constant; None for the output."""
        if node in self.owner:
            return self.owner[node]
        readers = [self.owner[u] for u in node.users if u in self.owner]
        return min(readers) if readers else None

    def stage_module(self, stage: int) -> GraphStage:
        """Stage ``stage`` as a Module for ``PipelineStage`` (its parameters are the model's own)."""
        return GraphStage(self, stage)

    def to_dot(self, rankdir: str = "TB") -> str:
        """The graph as DOT text with every node filled with its stage's colour and each stage a
        box; edges that cross a cut are red (they become send/recv). Node names come from the
        topological order (``n0``, ``n1``...), never ``id()``, so the text is the same every run."""
        nodes, edges = self.graph.dot_elements()
        topo = self.graph.topological_order()
        stage_of = {f"n{k}": self.stage_of(n) for k, n in enumerate(topo)}
        lines = ["digraph {", f"\trankdir={rankdir}", '\tnode [fontname="Helvetica" fontsize=10]']
        for s in range(self.num_stages):
            st = self.stages[s]
            lines += [f"\tsubgraph cluster_stage{s} {{",
                      f'\t\tlabel="stage {s}: {st.compute_s * 1e3:.2f} ms" style="dashed" fontname="Helvetica"']
            for name, attrs in nodes:
                if stage_of[name] == s:
                    attrs = dict(attrs, fillcolor=STAGE_COLORS[s % len(STAGE_COLORS)])
                    lines.append("\t\t" + _dot_node(name, attrs))
            lines.append("\t}")
        lines += ["\t" + _dot_node(name, attrs) for name, attrs in nodes if stage_of[name] is None]
        for a, b in edges:
            sa, sb = stage_of[a], stage_of[b]
            crossing = sa is not None and sb is not None and sa != sb
            lines.append(f"\t{a} -> {b}" + (' [color="#d7301f" penwidth=2]' if crossing else ""))
        lines.append("}")
        return "\n".join(lines) + "\n"


def node_costs(graph: Graph, example: Sequence[Tensor] | None = None, repeats: int = 5) -> dict[Node, float]:
    """Seconds of forward per op node: measured when ``example`` is given (each node run on the
    values ``example`` gives it, every node in turn ``repeats`` times so that a busy spell of the
    machine hits them all alike, keeping each node's fastest run), else estimated from shapes
    (flops of the products, bytes read and written by everything else, on a rough CPU)."""
    ops = [n for n in graph.topological_order() if n.fn is not None]
    if example is None:
        return {n: _estimate(n) for n in ops}
    env = _values(graph, example)  # also a first run of every node, which warms caches
    costs = dict.fromkeys(ops, float("inf"))
    for _ in range(repeats):
        for n in ops:
            arrays = [env[i] for i in n.inputs]
            t0 = time.perf_counter()
            run_node(n, arrays)
            costs[n] = min(costs[n], time.perf_counter() - t0)
    return costs


def partition(traced: Any, num_stages: int, example: Sequence[Tensor] | None = None, *,
              cuts: Sequence[int] | None = None, link_bytes_per_s: float = LINK_BYTES_PER_S,
              costs: dict[Node, float] | None = None) -> PipelinePlan:
    """Cut a traced forward (a ``TracedFunction`` of one input and one output, traced at the
    micro-batch's shape) into ``num_stages`` stages. Costs are measured on ``example`` when it is
    given, else estimated (or taken from ``costs``); ``cuts`` fixes the cut positions instead of
    choosing them (a hand cut, or the plan another rank made)."""
    graph = getattr(traced, "graph", traced)
    order, placeholder = _check(graph)
    if num_stages < 1 or num_stages > len(order):
        raise PartitionError(f"partition: {len(order)} op nodes depend on the input, so 1 to {len(order)} stages "
                             f"are possible, got num_stages={num_stages}")
    if costs is None:
        costs = node_costs(graph, example)
    fwd = [costs.get(n, 0.0) * BACKWARD_FACTOR for n in order]
    dependent = set(order)
    for n in graph.topological_order():  # parameter-only nodes join the first stage that reads them
        if n.fn is not None and n not in dependent:
            fwd[_first_reader(n, order)] += costs.get(n, 0.0) * BACKWARD_FACTOR
    lives = [_live(graph, order, placeholder, c) for c in range(len(order) + 1)]
    live_bytes = [sum(_nbytes(n) for n in live) for live in lives]
    sendable = [all(_floating(n) for n in live) for live in lives]  # a tuple or integers cannot be cut through
    prefix = [0.0]
    for t in fwd:
        prefix.append(prefix[-1] + t)

    def stage_cost(i: int, j: int) -> float:  # order[i:j] as one stage
        link = (live_bytes[i] if i else 0) + (live_bytes[j] if j < len(order) else 0)
        return prefix[j] - prefix[i] + 2 * link / link_bytes_per_s  # activation forward, gradient back

    if cuts is None:
        cuts = _balance(len(order), num_stages, stage_cost, live_bytes, sendable)
    cuts = [int(c) for c in cuts]
    if len(cuts) != num_stages - 1 or cuts != sorted(set(cuts)) or (cuts and (cuts[0] < 1 or cuts[-1] >= len(order))):
        raise PartitionError(f"partition: cuts {cuts} must be {num_stages - 1} increasing positions in 1.."
                             f"{len(order) - 1}")
    return _plan(graph, order, placeholder, cuts, costs, link_bytes_per_s)


# -- the stage as a Module -------------------------------------------------------------------------
class GraphStage(Module):
    """Run one stage of a plan with autograd: unpack the values it receives from one flat tensor
    (the first stage takes the model's input itself), apply its nodes' Functions, and pack the
    values the next stages need (the last stage returns the model's output itself)."""

    def __init__(self, plan: PipelinePlan, stage: int) -> None:
        super().__init__()
        if not 0 <= stage < plan.num_stages:
            raise PartitionError(f"GraphStage: the plan has stages 0..{plan.num_stages - 1}, got {stage}")
        self.stage, self.first, self.last = stage, stage == 0, stage == plan.num_stages - 1
        self.receives = plan.live[stage]
        self.sends = plan.live[stage + 1] if not self.last else list(plan.graph.outputs)
        mine = [n for n in plan.graph.topological_order() if plan.owner.get(n) == stage]
        self.steps = [n for n in mine if n.fn is not None or n.op == "getitem"]
        self.sources = {}
        for n in plan.graph.topological_order():
            if n.op in ("parameter", "constant") and any(plan.owner.get(u) == stage for u in n.users):
                self.sources[n] = n.meta["target"] if n.op == "parameter" else n.attrs["value"]
        params = [t for t in self.sources.values() if isinstance(t, Parameter)]
        for k, p in enumerate(params):  # the model's own Parameters: their .grad is the model's
            self.register_parameter(f"p{k}", p)

    def forward(self, x: Tensor) -> Tensor:
        env: dict[Node, Any] = dict(self.sources)
        if self.first:
            env[self.receives[0]] = x
        else:
            start = 0
            for n in self.receives:
                size = _size(n.shape)
                env[n] = x[start:start + size].reshape(n.shape)
                start += size
        for n in self.steps:
            if n.op == "getitem":
                env[n] = env[n.inputs[0]][n.attrs["index"]]
                continue
            it = iter(n.inputs)
            args = []
            for k in n.meta["args"]:
                if k == TENSOR_ARG:
                    v = env[next(it)]
                    args.append(v if isinstance(v, Tensor) else _wrap(v, n.meta.get("ctx_device", cpu)))
                elif k == ARRAY_ARG:
                    v = env[next(it)]
                    args.append(v.array if isinstance(v, Tensor) else v)
                else:
                    args.append(n.attrs[k])
            env[n] = n.fn.apply(*args, **{k: n.attrs[k] for k in n.meta["kwargs"]})
        if self.last:
            return env[self.sends[0]]
        return cat([env[n].reshape(-1) for n in self.sends])


# -- helpers -----------------------------------------------------------------------------------------
def _check(graph: Graph) -> tuple[list[Node], Node]:
    """The op nodes that depend on the input, in topological order, and the input."""
    if len(graph.placeholders) != 1 or len(graph.outputs) != 1:
        raise PartitionError(f"partition: a pipeline runs a graph of one input and one output, got "
                             f"{len(graph.placeholders)} inputs and {len(graph.outputs)} outputs")
    for n in graph.nodes:
        if n.op in ("copy_", "set_grad", "saved", "grad"):
            raise PartitionError(f"partition: {n.name} ({n.op}) is not a pure forward value; trace the model's "
                                 "forward alone, in eval mode if it updates buffers (BatchNorm's running stats)")
    placeholder = graph.placeholders[0]
    depends = {placeholder}
    order = []
    for n in graph.topological_order():
        if n.op not in SOURCE_OPS and n.op != "output" and any(i in depends for i in n.inputs):
            depends.add(n)
            order.append(n)
    out = graph.outputs[0]
    if out not in depends or out is placeholder:
        raise PartitionError(f"partition: the output {out.name} does not depend on the input; nothing to pipeline")
    return order, placeholder


def _first_reader(n: Node, order: list[Node]) -> int:
    """The position in ``order`` of the first input-dependent node that reads ``n`` (through other
    parameter-only nodes)."""
    pos = {m: k for k, m in enumerate(order)}
    seen, stack, first = set(), [n], len(order) - 1
    while stack:
        m = stack.pop()
        for u in m.users:
            if u in pos:
                first = min(first, pos[u])
            elif u not in seen and u.op != "output":
                seen.add(u)
                stack.append(u)
    return first


def _live(graph: Graph, order: list[Node], placeholder: Node, c: int) -> list[Node]:
    """The values made before position ``c`` (or the input) that a node at ``c`` or after reads."""
    after = set(order[c:])
    out = graph.outputs[0]
    return [n for n in [placeholder] + order[:c] if n is out or any(u in after for u in n.users)]


def _floating(n: Node) -> bool:
    return n.shape is not None and n.dtype is not None and n.dtype.kind == "f"


def _balance(length: int, num_stages: int, stage_cost: Any, live_bytes: list[int], sendable: list[bool]) -> list[int]:
    """The cuts that minimise the slowest stage's cost, ties going to fewer bytes across the cuts
    (dynamic programming over prefix lengths: best[s][j] for order[:j] in s stages), cutting only
    where every value alive is a floating point tensor."""
    inf = (float("inf"), 0)
    best = [[inf] * (length + 1) for _ in range(num_stages + 1)]
    back = [[0] * (length + 1) for _ in range(num_stages + 1)]
    best[0][0] = (0.0, 0)
    for s in range(1, num_stages + 1):
        for j in range(s, length - (num_stages - s) + 1):
            if j < length and not sendable[j]:
                continue
            for i in range(s - 1, j):
                if best[s - 1][i] == inf:
                    continue
                worst, sent = best[s - 1][i]
                cand = (max(worst, stage_cost(i, j)), sent + (live_bytes[i] if i else 0))
                if cand < best[s][j]:
                    best[s][j], back[s][j] = cand, i
    if best[num_stages][length] == inf:
        raise PartitionError(f"partition: no cut into {num_stages} stages sends floating point values only "
                             "(a tuple of results or integer values is alive at every candidate cut)")
    cuts, j = [], length
    for s in range(num_stages, 1, -1):
        j = back[s][j]
        cuts.append(j)
    return cuts[::-1]


def _plan(graph: Graph, order: list[Node], placeholder: Node, cuts: list[int], costs: dict[Node, float],
          link_bytes_per_s: float) -> PipelinePlan:
    bounds = [0] + cuts + [len(order)]
    owner: dict[Node, int] = {placeholder: 0}
    for s in range(len(bounds) - 1):
        for n in order[bounds[s]:bounds[s + 1]]:
            owner[n] = s
    for n in reversed(graph.topological_order()):  # parameter-only nodes: with their first reader
        if n not in owner and n.op not in SOURCE_OPS and n.op != "output" and n.users:
            owner[n] = min(owner[u] for u in n.users if u in owner)
    for n in graph.nodes:
        if n.op == "parameter":
            stages = sorted({owner[u] for u in n.users if u in owner})
            if len(stages) > 1:
                raise PartitionError(f"partition: parameter {n.name} of shape {tuple(n.shape)} is read by stages "
                                     f"{stages}; a pipeline keeps each parameter on one stage (tied weights must "
                                     "fall in one stage)")
    live = [[placeholder]] + [_live(graph, order, placeholder, c) for c in cuts]
    for n in (n for cut in live[1:] for n in cut):
        if not _floating(n):
            raise PartitionError(f"partition: {n.name} ({n.op}, dtype {n.dtype}) crosses a cut; the stages send "
                                 "floating point values only, so cut where no such value is alive")
    stages = []
    for s in range(len(bounds) - 1):
        recv = sum(_nbytes(n) for n in live[s]) if s else 0
        send = sum(_nbytes(n) for n in live[s + 1]) if s + 1 < len(live) else 0
        nodes = [n for n in graph.topological_order() if owner.get(n) == s and n is not placeholder]
        compute = sum(costs.get(n, 0.0) for n in nodes) * BACKWARD_FACTOR
        stages.append(StageCost(nodes, compute, recv, send, 2 * (recv + send) / link_bytes_per_s))
    return PipelinePlan(graph, order, cuts, stages, live, owner)


def _values(graph: Graph, example: Sequence[Tensor]) -> dict[Node, Any]:
    """Every node's value on ``example`` (to time each node on real inputs)."""
    env: dict[Node, Any] = {n: x.array for n, x in zip(graph.placeholders, example)}
    ctxs: dict[Node, Any] = {}
    for n in graph.topological_order():
        if n.op not in ("placeholder", "output"):
            node_step(n, functools.partial(run_node, n), keeps_ctx(n))(env, ctxs)
    return env


def _estimate(n: Node) -> float:
    """Seconds on a rough CPU: a product's flops (its output's size times the length it sums
    over, read from the weight when the op declares a channel axis), or else the bytes it moves."""
    moved = _nbytes(n) + sum(_nbytes(i) for i in n.inputs)
    if n.kind == "matmul" and n.shape is not None and len(n.inputs) >= 2:
        axis = getattr(n.fn, "channel_axis", None)
        w, x = n.inputs[1], n.inputs[0]
        depth = _size(w.shape) // n.shape[axis] if axis is not None else x.shape[-1]
        return 2 * _size(n.shape) * depth / FLOPS_PER_S + moved / BYTES_PER_S
    return moved / BYTES_PER_S


def _size(shape: Sequence[int] | None) -> int:
    out = 1
    for d in shape or ():
        out *= d
    return out


def _nbytes(n: Node) -> int:
    return _size(n.shape) * getattr(n.dtype, "itemsize", 4) if n.shape is not None else 0


def _dot_node(name: str, attrs: dict) -> str:
    return f"{name} [" + " ".join(f'{k}="{_escape(v)}"' for k, v in attrs.items()) + "]"
