"""Parallel execution: run the graph's independent nodes at once, on threads, when it pays (chapter 03).

A graph says which nodes are independent: any node whose inputs (and ordering edges, ``Node.after``)
are done is *ready*, and ready nodes may run in any order or at once. numpy gives up the GIL inside
a matrix product or a ufunc over a large array, so two such nodes really run on two cores; a small
op spends its time in Python, holding the GIL, and handing it to another thread only adds the
hand-off (about 40 us measured here, ``benchmarks/bench_parallel.py``). So the scheduler works from
a cost model of node sizes (``node_seconds``): the main thread takes ready nodes by priority (the
longest estimated path from the node to the end first, as list schedulers do) and hands a ready
node to an idle helper thread only when the model says it is big enough to be worth it and the
main thread has other ready work meanwhile. ``plan_parallel`` first simulates exactly that
schedule with the model's times; when the simulated run is not clearly shorter than one thread,
the executor stays sequential, so turning parallelism on never costs more than noise.
Buffers are freed by counting readers, so they go whenever their last reader finishes, in
whatever order the threads finish; a value that the plan computes into a tensor's memory
(``minigrad.graph.writeback``) waits for every node before it in the sequential order, since that
is the order in which the plan checked that nobody reads the old contents any more.
"""

from __future__ import annotations

import heapq
import math
import os
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, Callable, NamedTuple

from minigrad.graph.ir import EFFECT_OPS, SOURCE_OPS, Node, op_kind

__all__ = ["HANDOFF_SECONDS", "MIN_HANDOFF_SECONDS", "ParallelPlan", "Slot", "helpers", "node_seconds",
           "plan_parallel", "run_parallel"]

# The model's figures, measured on the 2-core machine the course runs on (benchmarks/bench_parallel.py):
HANDOFF_SECONDS = 40e-6  # submit a node to a pool thread and collect its result
MIN_HANDOFF_SECONDS = 100e-6  # a node estimated below this stays on the main thread: the GIL-free part is too short
PAYS_BELOW = 0.9  # go parallel only when the simulated time is under 90% of the sequential one
_OP_SECONDS = 4e-6  # a node's Python overhead (dispatch, argument checks), GIL held
_MAC_SECONDS_PER_BYTE = 1 / 1.8e11  # one multiply-add per byte of its dtype: 4.4e10/s in float32 on one core
_ELEMENT_SECONDS = 0.5e-9  # one element read or written by an elementwise op or a reduction


def node_seconds(n: Node) -> float:
    """The model's estimate of one node's time: Python overhead plus multiply-adds for a product
    or a conv, elements read and written for anything else; 0 for sources and structural nodes."""
    if n.op in SOURCE_OPS or n.op in ("getitem", "saved", "output") or n.op in EFFECT_OPS:
        return 0.0
    if n.op == "call":
        return _OP_SECONDS
    if getattr(n.fn, "returns_view", False):  # a view moves no data
        return _OP_SECONDS
    macs = multiply_adds(n)
    elements = sum(_size(i) for i in n.inputs) + _size(n)
    return _OP_SECONDS + macs * _MAC_SECONDS_PER_BYTE * getattr(n.dtype, "itemsize", 4) + elements * _ELEMENT_SECONDS


def multiply_adds(n: Node) -> int:
    """A product's or conv's multiply-adds (a fused group's: its product's), 0 for any other node."""
    if n.op == "fused":
        return max((multiply_adds(m) for m in n.meta["group"]), default=0)
    if op_kind(n) != "matmul" or n.shape is None or len(n.inputs) < 2 or not n.inputs[1].shape:
        return 0
    weight = n.inputs[1].shape
    if len(weight) >= 3 and len(n.shape) == len(weight):  # a conv: each output reads C_in * kernel inputs
        return math.prod(n.shape) * math.prod(weight[1:])
    return math.prod(n.shape) * (n.inputs[0].shape[-1] if n.inputs[0].shape else 1)


def _size(n: Node) -> int:
    return math.prod(n.shape) if n.shape is not None else 0


class Slot(NamedTuple):
    """One node's place in a schedule: the thread it ran on (0: the main thread) and its start
    and end in seconds from the start of the run."""

    node: Node
    thread: int
    start: float
    end: float


class ParallelPlan(NamedTuple):
    """What ``plan_parallel`` decided. ``waits`` maps each node to the nodes it must wait for (its
    inputs, its ordering edges); ``barrier`` are the nodes that also wait for every node before
    them in ``order``; ``handoff`` the nodes worth a helper thread; ``priority`` the estimated
    seconds from a node to the end. ``sequential`` and ``parallel`` are the simulated times, and
    ``simulated`` the simulated schedule, whose order is ``order``; ``pays`` says whether to use it."""

    workers: int
    waits: dict[Node, tuple[Node, ...]]
    barrier: frozenset[Node]
    handoff: frozenset[Node]
    priority: dict[Node, float]
    order: list[Node]
    sequential: float
    parallel: float
    simulated: list[Slot]

    @property
    def pays(self) -> bool:
        return self.parallel < PAYS_BELOW * self.sequential

    def report(self) -> str:
        """One line: the simulated times and the choice."""
        choice = "parallel" if self.pays else "sequential: parallel does not pay"
        return (f"{len(self.handoff)} of {len(self.order)} nodes worth a thread; simulated {self.sequential * 1e3:.3f} ms "
                f"on 1 thread, {self.parallel * 1e3:.3f} ms on {self.workers}: {choice}")


def plan_parallel(schedule: list[Node], workers: int = 2, barrier: frozenset[Node] = frozenset(),
                  cost: Callable[[Node], float] = node_seconds, force: bool = False) -> ParallelPlan:
    """Simulate the ready-set schedule of ``schedule`` (a topological order without the output
    node) on ``workers`` threads with the cost model; ``force`` hands every op to a thread (for
    tests: it makes the threads finish in every order)."""
    inside = set(schedule)
    waits = {n: tuple(dict.fromkeys(p for p in n.predecessors if p in inside)) for n in schedule}
    seconds = {n: cost(n) for n in schedule}
    priority: dict[Node, float] = {}
    for n in reversed(schedule):
        after = [priority[s] for s in n.successors if s in priority]
        priority[n] = seconds[n] + max(after, default=0.0)
    handoff = frozenset(n for n in schedule if _threadable(n) and (force or seconds[n] >= MIN_HANDOFF_SECONDS))
    plan = ParallelPlan(workers, waits, barrier, handoff, priority, list(schedule), sum(seconds.values()), 0.0, [])
    simulated = _simulate(plan, schedule, seconds) if workers > 1 and handoff else [
        Slot(n, 0, t - seconds[n], t) for n, t in zip(schedule, _cumsum([seconds[n] for n in schedule]))]
    end = max((s.end for s in simulated), default=0.0)
    return plan._replace(order=[s.node for s in sorted(simulated, key=lambda s: s.start)], parallel=end,
                         simulated=simulated)


def _threadable(n: Node) -> bool:
    """Whether a node may run on a helper thread: an op (sources, parts of tuples and effects are
    bookkeeping on the main thread), and not a call, whose side effect belongs to the main thread."""
    return not (n.op in SOURCE_OPS or n.op in EFFECT_OPS or n.op in ("getitem", "saved", "call", "output"))


def _cumsum(xs: list[float]) -> list[float]:
    out, total = [], 0.0
    for x in xs:
        total += x
        out.append(total)
    return out


class _Ready:
    """The scheduler's state, shared by the simulation and the real run: how many of each node's
    waits are still running, the ready nodes by priority, and the barrier's progress."""

    def __init__(self, plan: ParallelPlan, schedule: list[Node]) -> None:
        self.plan, self.index = plan, {n: k for k, n in enumerate(schedule)}
        self.missing = {n: len(w) for n, w in plan.waits.items()}
        self.done = [False] * len(schedule)
        self.prefix = 0  # every node before this index in the sequential order is done
        self.held: list[Node] = []  # barrier nodes whose inputs are done but not the prefix
        self.heap: list[tuple[float, int, Node]] = []
        self.followers: dict[Node, list[Node]] = {n: [] for n in schedule}
        for n, w in plan.waits.items():
            for p in w:
                self.followers[p].append(n)
        for n in schedule:
            if self.missing[n] == 0:
                self._ready(n)

    def _ready(self, n: Node) -> None:
        if n in self.plan.barrier and self.prefix < self.index[n]:
            self.held.append(n)
        else:
            heapq.heappush(self.heap, (-self.plan.priority[n], self.index[n], n))

    def pop(self) -> Node:
        return heapq.heappop(self.heap)[2]

    def finish(self, n: Node) -> None:
        for f in self.followers[n]:
            self.missing[f] -= 1
            if self.missing[f] == 0:
                self._ready(f)
        self.done[self.index[n]] = True
        while self.prefix < len(self.done) and self.done[self.prefix]:
            self.prefix += 1
        for h in [h for h in self.held if self.index[h] <= self.prefix]:
            self.held.remove(h)
            heapq.heappush(self.heap, (-self.plan.priority[h], self.index[h], h))


def _simulate(plan: ParallelPlan, schedule: list[Node], seconds: dict[Node, float]) -> list[Slot]:
    """The run that ``run_parallel`` makes, with the model's times instead of real ones: the main
    thread is busy while it runs a node or hands one over; a helper runs what it is handed."""
    state = _Ready(plan, schedule)
    now, slots = 0.0, []
    running: list[tuple[float, int, Node]] = []  # (end, thread, node) on helpers
    free = list(range(1, plan.workers))
    while state.heap or running:
        if not state.heap:  # wait for the first helper to finish
            running.sort(key=lambda r: r[0])
            end, thread, n = running.pop(0)
            now = max(now, end)
            free.append(thread)
            state.finish(n)
            continue
        n = state.pop()
        if n in plan.handoff and free and state.heap:
            thread = free.pop(0)
            start = now + HANDOFF_SECONDS / 2  # the main thread pays half the hand-off here, the rest on collect
            running.append((start + seconds[n], thread, n))
            slots.append(Slot(n, thread, start, start + seconds[n]))
            now += HANDOFF_SECONDS / 2
        else:
            slots.append(Slot(n, 0, now, now + seconds[n]))
            now += seconds[n]
            state.finish(n)
        for r in [r for r in running if r[0] <= now]:  # collected as the main thread looks up
            running.remove(r)
            free.append(r[1])
            now += HANDOFF_SECONDS / 2
            state.finish(r[2])
    return slots


_pools: dict[int, tuple[int, ThreadPoolExecutor]] = {}  # threads -> (the process it was made in, the pool)
_pools_lock = threading.Lock()


def helpers(threads: int) -> ThreadPoolExecutor:
    """The pool of ``threads`` helper threads that every threaded executor of the process shares
    (a compiled graph per signature would otherwise keep threads of its own); a forked child
    makes its own, since the parent's threads do not exist there."""
    with _pools_lock:
        made = _pools.get(threads)
        if made is None or made[0] != os.getpid():
            made = _pools[threads] = (os.getpid(), ThreadPoolExecutor(threads, thread_name_prefix="minigrad-executor"))
        return made[1]


def run_parallel(plan: ParallelPlan, schedule: list[Node], pool: ThreadPoolExecutor,
                 compute: Callable[[Node, list], tuple[Any, Any]], inline: Callable[[Node], None],
                 store: Callable[[Node, Any, Any], None], inputs_of: Callable[[Node], list],
                 clock: list[Slot] | None = None) -> None:
    """Run ``schedule`` as ``plan`` says: ``inline(n)`` runs a node on this thread (and stores its
    value), ``compute(n, arrays)`` computes one on a helper, whose result ``store(n, value, ctx)``
    puts back here; ``inputs_of(n)`` are its input arrays. Every bookkeeping step (storing, freeing)
    happens on this thread. ``clock``, when given, receives a ``Slot`` per node: the real timeline."""
    state = _Ready(plan, schedule)
    running: dict[Future, tuple[Node, int]] = {}
    free = list(range(1, plan.workers))
    t0 = time.perf_counter()

    def timed(n: Node, arrays: list, thread: int) -> tuple[Any, Any, float, float]:
        start = time.perf_counter()
        value, ctx = compute(n, arrays)
        return value, ctx, start - t0, time.perf_counter() - t0

    def collect(done: set) -> None:
        for f in done:
            n, thread = running.pop(f)
            value, ctx, start, end = f.result()
            free.append(thread)
            store(n, value, ctx)
            if clock is not None:
                clock.append(Slot(n, thread, start, end))
            state.finish(n)

    try:
        while state.heap or running:
            finished = {f for f in running if f.done()}
            if not state.heap and not finished:
                finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
            collect(finished)
            if not state.heap:
                continue
            n = state.pop()
            if n in plan.handoff and free and state.heap:
                thread = free.pop(0)
                running[pool.submit(timed, n, inputs_of(n), thread)] = (n, thread)
                continue
            start = time.perf_counter() - t0
            inline(n)
            if clock is not None:
                clock.append(Slot(n, 0, start, time.perf_counter() - t0))
            state.finish(n)
    finally:
        if running:  # an error on this thread: let the helpers finish before their inputs go away
            wait(list(running))
