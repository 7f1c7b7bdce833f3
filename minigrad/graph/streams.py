"""Streams: a graph's independent branches on separate CUDA streams, with events for the edges (chapter 03).

A GPU runs the kernels of one stream in the order they were queued and the kernels of two
streams in any order, overlapped; so the GPU's way to run independent branches at once is to
queue them on different streams, and its ordering edge is an *event*: recorded on the producer's
stream after the producer's kernel, waited for by the consumer's stream before the consumer's.
``plan_streams`` assigns each op node a stream (a node continues the stream of the input it
extends, when that input is the last thing queued there, and otherwise starts on the stream with
the least estimated work, ``minigrad.graph.parallel.node_seconds``) and lists the events. The
host still queues in one topological order; the streams only let the GPU reorder. Memory needs
care: CuPy's pool hands a freed buffer to the next allocation *on the stream that made it*, which
would not wait for a reader on another stream, so a value read across streams is kept until the
run's end, when the current stream waits for every side stream (the *join*); at the start each
side stream waits for the current one (the *fork*), so a new run never overtakes the last.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

from minigrad.graph.ir import EFFECT_OPS, SOURCE_OPS, Node
from minigrad.graph.parallel import node_seconds

__all__ = ["StreamPlan", "plan_streams", "run_streams"]


class StreamPlan(NamedTuple):
    """``stream_of`` maps every node but sources and writes to a stream index (0: the stream
    current when the graph runs); ``waits`` maps a node to the nodes on other streams whose events
    its stream waits for first; ``recorded`` are the nodes an event is recorded after;
    ``crossing`` the values read on another stream than their own (kept to the run's end)."""

    streams: int
    stream_of: dict[Node, int]
    waits: dict[Node, tuple[Node, ...]]
    recorded: frozenset[Node]
    crossing: frozenset[Node]

    @property
    def used(self) -> int:
        """How many streams the plan puts work on."""
        return len(set(self.stream_of.values()))


def plan_streams(schedule: list[Node], streams: int = 2, barrier: frozenset[Node] = frozenset()) -> StreamPlan:
    """Streams and events for ``schedule`` (a topological order without the output node). A
    ``barrier`` node (a value computed into a tensor's memory, ``minigrad.graph.writeback``) also
    waits for the last node of every other stream: everything queued before it has read the old contents."""
    stream_of: dict[Node, int] = {}
    extra: dict[Node, list[Node]] = {}
    tail: dict[int, Node] = {}  # the last node queued on each stream
    work = [0.0] * streams
    for n in schedule:
        if n.op in SOURCE_OPS or n.op in EFFECT_OPS or n.op == "placeholder":
            continue  # there before the fork, or applied after the join
        if n.op in ("getitem", "saved"):  # a part of its op's result: no kernel of its own
            stream_of[n] = stream_of[n.inputs[0]]
            continue
        if n.op == "call":  # a host-side effect: on the current stream, where the caller's work is
            s = 0
        else:
            chained = [stream_of[i] for i in n.predecessors if i in stream_of and tail.get(stream_of[i]) is i]
            s = chained[0] if chained else min(range(streams), key=lambda k: (work[k], k))
        if n in barrier:
            extra[n] = [t for k, t in tail.items() if k != s]
        stream_of[n] = s
        tail[s] = n
        work[s] += node_seconds(n)
    waits = {n: tuple(dict.fromkeys(p for p in [*n.predecessors, *extra.get(n, ())]
                                    if p in stream_of and stream_of[p] != s))
             for n, s in stream_of.items()}
    waits = {n: w for n, w in waits.items() if w}
    recorded = frozenset(p for w in waits.values() for p in w)
    crossing = frozenset(p for n, w in waits.items() for p in w if p in n.inputs)
    return StreamPlan(streams, stream_of, waits, recorded, crossing)


def run_streams(plan: StreamPlan, side: list[Any], steps: list[tuple[Node, Callable[[], None]]]) -> None:
    """Queue ``steps`` (node, the call that queues its kernels) in order, each under its stream
    (``side[k]``: ``side[0]`` is the current stream), with the plan's events; fork first, join last."""
    current = side[0]
    fork = current.record()
    for s in side[1:]:
        s.wait_event(fork)
    events: dict[Node, Any] = {}
    for n, call in steps:
        s = side[plan.stream_of.get(n, 0)]
        for p in plan.waits.get(n, ()):
            s.wait_event(events[p])
        with s:
            call()
        if n in plan.recorded:
            events[n] = s.record()
    for s in side[1:]:
        current.wait_event(s.record())
