"""A pipeline cut by the graph: every rank traces the model, one rank measures what each node
costs, and all of them cut the same plan and run their own stage with GPipe (chapter 04).

``minigrad.graph.partition`` chooses the cuts; this module makes the ranks agree on them. The
measured costs differ from rank to rank (each process times on its own busy core), so rank
``src`` alone measures and broadcasts its costs; the dynamic program is deterministic, so the same
costs give every rank the same cuts, and each keeps the ``GraphStage`` of its own rank: one
stage's nodes run as a ``Module`` (the graph layer below builds no Modules) whose input and output
pack the values alive across its cuts into one flat tensor, so ``ScheduleGPipe`` runs it unchanged.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from minigrad import creation
from minigrad.backend import cpu
from minigrad.distributed.collectives import broadcast
from minigrad.distributed.pipeline_parallel import PipelineStage
from minigrad.distributed.process_group import group
from minigrad.graph.interpret import ARRAY_ARG, TENSOR_ARG
from minigrad.graph.ir import Node
from minigrad.graph.partition import PartitionError, PipelinePlan, node_costs, partition
from minigrad.nn.module import Module, Parameter
from minigrad.ops import cat
from minigrad._tensor import Tensor, _wrap

__all__ = ["GraphStage", "auto_pipeline_stage"]


def auto_pipeline_stage(traced: Any, example: Sequence[Tensor] | None = None, src: int = 0,
                        **options: Any) -> tuple[PipelineStage, PipelinePlan]:
    """Cut ``traced`` (a forward traced at the micro-batch's shape) into one stage per rank, with
    the node costs rank ``src`` measures on ``example`` (estimated when it is None); returns this
    rank's ``PipelineStage`` and the plan, the same on every rank. ``options`` go to ``partition``."""
    pg = group()
    graph = getattr(traced, "graph", traced)
    ops = [n for n in graph.topological_order() if n.fn is not None]
    times = creation.zeros(len(ops), dtype="float64")
    if pg.rank() == src:
        measured = node_costs(graph, example)
        times = creation.tensor([measured[n] for n in ops], dtype="float64")
    broadcast(times, src)
    plan = partition(graph, pg.size(), costs=dict(zip(ops, times.tolist())), **options)
    return PipelineStage(GraphStage(plan, pg.rank())), plan


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
                size = math.prod(n.shape)
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
