"""A pipeline cut by the graph: every rank traces the model, one rank measures what each node
costs, and all of them cut the same plan and run their own stage with GPipe (chapter 04).

``minigrad.graph.partition`` chooses the cuts; this module makes the ranks agree on them. The
measured costs differ from rank to rank (each process times on its own busy core), so rank
``src`` alone measures and broadcasts its costs; the dynamic program is deterministic, so the same
costs give every rank the same cuts, and each keeps the ``GraphStage`` of its own rank.
"""

from __future__ import annotations

from typing import Any, Sequence

from minigrad import creation
from minigrad.distributed.collectives import broadcast
from minigrad.distributed.pipeline import PipelineStage
from minigrad.distributed.process_group import group
from minigrad.graph.partition import PipelinePlan, node_costs, partition
from minigrad._tensor import Tensor

__all__ = ["auto_pipeline_stage"]


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
    return PipelineStage(plan.stage_module(pg.rank())), plan
