"""Leak finding: tensors that keep their autograd graphs alive (chapter 03, debugging tools).

A tensor made by an op holds its ``grad_fn``, and through it every node of the graph that made it
and every array those nodes saved for backward: what backward needs, freed when the tensor goes.
The classic leak keeps such a tensor past its step: ``losses.append(loss)`` instead of
``loss.item()`` keeps every step's graph, so memory grows step after step. ``live_graphs`` finds
the tensors that hold graphs (the roots, not the tensors inside another one's graph), what each
graph keeps and what refers to the tensor; ``memory_per_step`` measures the growth with the
memory tracker; ``minigrad.graph.viz.draw(leak.tensor())`` draws the graph that is kept.
"""

from __future__ import annotations

import gc
import inspect
import weakref
from typing import Any, Callable, NamedTuple

from minigrad.autograd.engine import topological_order
from minigrad.autograd.function import SAVED_TENSOR, Function, saved_entries
from minigrad.backend import Device, storage_of
from minigrad.memory.tracker import _fmt, saved_arrays, track
from minigrad.protocols import is_parameter
from minigrad._tensor import Tensor

__all__ = ["LiveGraph", "live_graphs", "memory_per_step", "report"]


class LiveGraph(NamedTuple):
    """A live tensor that holds an autograd graph: ``tensor()`` gives it back (a weak reference,
    so the finding keeps nothing alive), ``nodes`` counts the graph's ops, ``nbytes`` the buffers
    they saved for backward (each once, parameters excluded: they live anyway), ``held_by`` says
    what refers to the tensor."""

    tensor: weakref.ref
    shape: tuple
    op: str
    nodes: int
    nbytes: int
    held_by: tuple[str, ...]


def live_graphs(device: str | Device = "cpu") -> list[LiveGraph]:
    """The tensors on ``device`` alive now that hold an autograd graph, largest graph first."""
    dev = Device(device)
    gc.collect()
    holders = [o for o in gc.get_objects()
               if issubclass(type(o), Tensor) and o.grad_fn is not None and o.device == dev]
    graphs = {id(t): set(topological_order([t.grad_fn])) for t in holders}
    roots, seen = [], set()
    for t in sorted(holders, key=lambda t: -len(graphs[id(t)])):
        if t.grad_fn in seen:  # inside a larger graph found already (or the same graph's other output)
            continue
        seen |= graphs[id(t)]
        roots.append(t)
    found = [LiveGraph(weakref.ref(t), tuple(t.shape), t.grad_fn.name(), len(graphs[id(t)]),
                       _graph_bytes(graphs[id(t)]), _referrers(t, ignore=(holders, roots))) for t in roots]
    return sorted(found, key=lambda g: -g.nbytes)


def _graph_bytes(nodes: set[Function]) -> int:
    """Bytes of the buffers the graph's nodes keep for backward, each buffer counted once."""
    buffers: dict[int, int] = {}
    for fn in nodes:
        arrays = [a for a, _ in saved_arrays(fn)]
        arrays += [t.array for kind, t in saved_entries(fn) if kind == SAVED_TENSOR and not is_parameter(t)]
        for a in map(storage_of, arrays):
            buffers[id(a)] = a.nbytes
    return sum(buffers.values())


def _referrers(t: Tensor, ignore: tuple) -> tuple[str, ...]:
    """What refers to ``t``, in words: a list, a dict entry (a notebook's globals), a generator's or
    finished frame's local; a running function's locals are not objects gc can see.
    No comprehension here mentions ``t``: its closure cell would be one more referrer."""
    said = []
    for r in gc.get_referrers(t):
        if any(r is i for i in ignore) or inspect.isframe(r) and r.f_code.co_filename == __file__:
            continue
        if type(r) is list:
            said.append(f"a list of {len(r)} items")
        elif type(r) is dict:
            said.append(f"dict key {_key_of(r, t)!r}")
        elif inspect.isframe(r):
            said.append(f"local {_key_of(r.f_locals, t)} of {r.f_code.co_name}()")
        else:
            said.append(f"a {type(r).__name__}")
    return tuple(said)


def _key_of(mapping: dict, value: Any) -> Any:
    for k, v in mapping.items():
        if v is value:
            return k
    return "?"


def memory_per_step(step: Callable[[], Any], steps: int, device: str | Device = "cpu") -> list[int]:
    """Run ``step()`` ``steps`` times under the memory tracker; the bytes alive after each step
    beyond those alive before the first. Flat: nothing outlives a step; growing: a leak."""
    alive = []
    with track(device) as mem:
        for _ in range(steps):
            step()
            gc.collect()
            alive.append(mem.current - mem.start)
    return alive


def report(device: str | Device = "cpu", top: int = 10) -> None:
    """Print the live graphs on ``device``, largest first."""
    found = live_graphs(device)
    print(f"{len(found)} tensor(s) on {Device(device)} hold autograd graphs, keeping "
          f"{_fmt(sum(g.nbytes for g in found))} saved for backward")
    for g in found[:top]:
        print(f"{_fmt(g.nbytes):>11}  {g.nodes:>4} ops  {str(g.shape):<12} made by {g.op:<14} held by "
              f"{', '.join(g.held_by) or 'a local variable of a running function'}")
