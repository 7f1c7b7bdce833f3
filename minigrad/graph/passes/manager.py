"""The pass manager: run graph passes in order and say what each one changed (chapter 03).

A pass is any function ``Graph -> Graph``; options are bound with ``functools.partial``
(``partial(fold_constants, freeze=True)``). ``PassManager(passes)(graph)`` runs them in order,
optionally repeating the whole list until a round changes nothing (one pass often opens work for
another: folding makes constants that CSE can merge, simplification leaves dead nodes), and with
``verbose=True`` prints one line per pass: its name, the node count before and after, the time.
"""

from __future__ import annotations

import functools
import time
from typing import Callable, NamedTuple, Sequence

from minigrad.graph.ir import Graph
from minigrad.graph.passes.constant_folding import fold_constants
from minigrad.graph.passes.cse import eliminate_common_subexpressions
from minigrad.graph.passes.dce import eliminate_dead_code
from minigrad.graph.passes.fold_bn import fold_batch_norm
from minigrad.graph.passes.simplify import simplify

__all__ = ["PassManager", "PassRecord", "default_passes", "pass_name"]

Pass = Callable[[Graph], Graph]


class PassRecord(NamedTuple):
    """What one run of one pass did."""

    name: str
    nodes_before: int
    nodes_after: int
    seconds: float

    def format(self) -> str:
        return f"{self.name:<34} {self.nodes_before:>5} -> {self.nodes_after:<5} nodes  {self.seconds * 1e3:.2f} ms"


class PassManager:
    """Runs ``passes`` in order; ``fixed_point=True`` repeats them (at most ``max_rounds`` times)
    until the graph stops changing. ``history`` keeps a ``PassRecord`` per pass run."""

    def __init__(self, passes: Sequence[Pass], verbose: bool = False, fixed_point: bool = False,
                 max_rounds: int = 10) -> None:
        self.passes, self.verbose = list(passes), verbose
        self.fixed_point, self.max_rounds = fixed_point, max_rounds
        self.history: list[PassRecord] = []

    def __call__(self, graph: Graph) -> Graph:
        """The graph after every pass; ``graph`` itself is not changed."""
        self.history = []
        for _ in range(self.max_rounds if self.fixed_point else 1):
            before = str(graph)
            for p in self.passes:
                start, n = time.perf_counter(), len(graph)
                graph = p(graph)
                record = PassRecord(pass_name(p), n, len(graph), time.perf_counter() - start)
                self.history.append(record)
                if self.verbose:
                    print(record.format())
            if str(graph) == before:  # the listing names every node, edge and attribute
                break
        return graph

    def __repr__(self) -> str:
        names = ", ".join(pass_name(p) for p in self.passes)
        return f"PassManager([{names}]{', fixed_point=True' if self.fixed_point else ''})"


def pass_name(p: Pass) -> str:
    """``fold_constants``, or ``fold_constants(freeze=True)`` for a partial."""
    if isinstance(p, functools.partial):
        args = [repr(a) for a in p.args] + [f"{k}={v!r}" for k, v in p.keywords.items()]
        return f"{pass_name(p.func)}({', '.join(args)})"
    return getattr(p, "__name__", type(p).__name__)


def default_passes(freeze: bool = False) -> list[Pass]:
    """The passes of chapter 03 in a good order (fusion, code generation aside): fold constants
    (``freeze=True`` for inference: parameters count as constants, and BatchNorm folds into the
    layer before it), simplify, merge common subexpressions, then drop dead code."""
    passes: list[Pass] = [functools.partial(fold_constants, freeze=True)] if freeze else [fold_constants]
    if freeze:
        passes.append(fold_batch_norm)
    return passes + [simplify, eliminate_common_subexpressions, eliminate_dead_code]
