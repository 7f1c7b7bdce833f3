"""Parallel execution: run the graph's independent branches at once, on threads, when it pays (chapter 03).

A graph says which nodes are independent: any node whose inputs (and ordering edges, ``Node.after``)
are done is *ready*, and ready nodes may run in any order or at once. numpy gives up the GIL inside
a matrix product or a ufunc over a large array, so two such nodes really run on two cores; a small
op spends its time in Python, holding the GIL, and every meeting of two threads (a lock, a wake-up:
tens of microseconds measured here, ``benchmarks/bench_parallel.py``) only adds to it. So the threads
take whole *branches* (``branches``: an attention head, an Inception branch), and meet once per
branch, not once per node: each thread, when free, takes the ready branch with the longest
estimated path to the end (as list schedulers do), a helper only those worth a thread by the cost
model of node sizes (``node_seconds``). ``plan_parallel`` first simulates exactly that schedule
with the model's times; when the simulated run is not clearly shorter than one thread, the
executor stays sequential, so turning parallelism on never costs more than noise.
Buffers are freed by counting readers, so they go whenever their last reader finishes, in
whatever order the threads finish (a branch drops its own intermediates as it goes); a value that
the plan computes into a tensor's memory (``minigrad.graph.writeback``) waits for every node before
it in the sequential order, since that is the order in which the plan checked that nobody reads
the old contents any more, and no branch spans such a node.
"""

from __future__ import annotations

import bisect
import contextvars
import heapq
import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Callable, NamedTuple

from minigrad.graph.ir import EFFECT_OPS, SOURCE_OPS, Node, op_kind

__all__ = ["HANDOFF_SECONDS", "MIN_HANDOFF_SECONDS", "ParallelPlan", "Slot", "branches", "helpers", "node_seconds",
           "plan_parallel", "run_parallel"]

# The model's figures, measured on the 2-core machine the course runs on (benchmarks/bench_parallel.py):
HANDOFF_SECONDS = 40e-6  # a helper thread wakes up and takes a branch
MIN_HANDOFF_SECONDS = 100e-6  # a branch estimated below this stays on the main thread: the GIL-free part is too short
WAKE_SECONDS = 5e-3  # how long the main thread leaves a branch to an idle helper that does not come for it
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
    """What ``plan_parallel`` decided. ``tasks`` are the units the threads take, each a branch of
    nodes in the sequential order (``branches``); ``task_waits`` the tasks each must wait for (its
    nodes' inputs and ordering edges outside it). ``waits`` maps each node to the nodes it must
    wait for; ``barrier`` are the nodes that also wait for every node before them in the
    sequential order (each is a task of its own); ``handoff`` the nodes of the tasks worth a helper
    thread; ``priority`` the estimated seconds from a node to the end (a task's: its first node's).
    ``sequential`` and ``parallel`` are the simulated times, and ``simulated`` the simulated
    schedule, whose order is ``order``; ``pays`` says whether to use it."""

    workers: int
    waits: dict[Node, tuple[Node, ...]]
    barrier: frozenset[Node]
    handoff: frozenset[Node]
    priority: dict[Node, float]
    order: list[Node]
    sequential: float
    parallel: float
    simulated: list[Slot]
    tasks: list[tuple[Node, ...]]
    task_waits: list[tuple[int, ...]]

    @property
    def pays(self) -> bool:
        return self.parallel < PAYS_BELOW * self.sequential

    def report(self) -> str:
        """One line: the branches worth a thread, the simulated times and the choice."""
        choice = "parallel" if self.pays else "sequential: parallel does not pay"
        worth = sum(t[0] in self.handoff for t in self.tasks)
        return (f"{worth} of {len(self.tasks)} tasks ({len(self.handoff)} of {len(self.order)} nodes) worth a thread; "
                f"simulated {self.sequential * 1e3:.3f} ms on 1 thread, {self.parallel * 1e3:.3f} ms on "
                f"{self.workers}: {choice}")


def plan_parallel(schedule: list[Node], workers: int = 2, barrier: frozenset[Node] = frozenset(),
                  cost: Callable[[Node], float] = node_seconds, force: bool = False) -> ParallelPlan:
    """Cut ``schedule`` (a topological order without the output node) into branches and simulate
    their ready-set schedule on ``workers`` threads with the cost model; ``force`` cuts at every
    fork and hands every branch of ops to a thread (for tests: it makes the threads finish in
    every order)."""
    inside = set(schedule)
    waits = {n: tuple(dict.fromkeys(p for p in n.predecessors if p in inside)) for n in schedule}
    seconds = {n: cost(n) for n in schedule}
    priority: dict[Node, float] = {}
    for n in reversed(schedule):
        after = [priority[s] for s in n.successors if s in priority]
        priority[n] = seconds[n] + max(after, default=0.0)
    tasks = branches(schedule, seconds, barrier, force)
    task_of = {n: k for k, t in enumerate(tasks) for n in t}
    task_waits = [tuple(dict.fromkeys(task_of[p] for n in t for p in waits[n] if task_of[p] != k))
                  for k, t in enumerate(tasks)]
    worth = [t for t in tasks if _threadable(t) and (force or sum(seconds[n] for n in t) >= MIN_HANDOFF_SECONDS)]
    handoff = frozenset(n for t in worth for n in t)
    plan = ParallelPlan(workers, waits, barrier, handoff, priority, list(schedule), sum(seconds.values()), 0.0, [],
                        tasks, task_waits)
    simulated = _simulate(plan, schedule, seconds)
    end = max((s.end for s in simulated), default=0.0)
    return plan._replace(order=[s.node for s in sorted(simulated, key=lambda s: s.start)], parallel=end,
                         simulated=simulated)


def branches(schedule: list[Node], seconds: dict[Node, float], barrier: frozenset[Node] = frozenset(),
             force: bool = False) -> list[tuple[Node, ...]]:
    """Cut the schedule into the units a thread takes whole: branches, so that the threads meet
    once per branch rather than once per node. A node whose value only one op reads belongs to
    that op's tree (an attention head is the tree of its output projection: its three products,
    the softmax, ...). Walking down from each tree's root, the first node with two or more inputs
    whose trees are worth a thread (``MIN_HANDOFF_SECONDS``; with ``force``, any) is a fork: it
    runs after its branches, and each branch is a unit of its own, cut further only where its
    root is such a fork again (a sum of heads: each head whole). Sources, calls, writes and
    barrier nodes are units of their own. Returns the units, each in the sequential order."""
    index = {n: k for k, n in enumerate(schedule)}
    walls = sorted(index[b] for b in barrier if b in index)
    parent: dict[Node, Node] = {}
    for n in schedule:
        user = _sole_user(n, barrier)
        # a branch lies wholly before or after each barrier node: that node waits for all before it
        if user is not None and user in index and bisect.bisect(walls, index[n]) == bisect.bisect(walls, index[user]):
            parent[n] = user
    children: dict[Node, list[Node]] = {n: [] for n in schedule}
    for n, user in parent.items():
        children[user].append(n)
    tree: dict[Node, float] = {}  # the seconds of a node's whole tree
    for n in schedule:
        tree[n] = seconds[n] + sum(tree[c] for c in children[n])

    def heavy(n: Node) -> list[Node]:
        return [c for c in children[n] if force or tree[c] >= MIN_HANDOFF_SECONDS]

    def members(n: Node, cut: list[Node]) -> list[Node]:
        out, stack = [], [n]
        while stack:
            m = stack.pop()
            out.append(m)
            stack.extend(c for c in children[m] if c not in cut)
        return out

    units: list[list[Node]] = []
    roots = [(n, True) for n in schedule if n not in parent]  # (root, walk down its spine)
    while roots:
        root, walk = roots.pop()
        spine = root
        while walk and len(heavy(spine)) == 1:
            spine = heavy(spine)[0]
        forks = heavy(spine)
        if len(forks) < 2:
            units.append(members(root, []))
            continue
        units.append(members(root, forks))
        roots.extend((f, False) for f in forks)
    return sorted((tuple(sorted(u, key=index.__getitem__)) for u in units), key=lambda u: index[u[0]])


def _sole_user(n: Node, barrier: frozenset[Node]) -> Node | None:
    """The op that ``n`` joins the tree of: its only reader, where both may run on a helper, and
    neither is ordered nor waits for the barrier."""
    users = n.users
    if len(users) != 1 or n.ordered or n in barrier or not _groupable(n):
        return None
    (user,) = users
    return None if user.ordered or user in barrier or not _groupable(user) else user


def _groupable(n: Node) -> bool:
    """Whether a node may be part of a branch that runs on a helper thread: an op or a lookup
    (``getitem``, ``saved``), not a source, a write or a call, whose side effect belongs to the
    main thread where the order puts it."""
    return not (n.op in SOURCE_OPS or n.op in EFFECT_OPS or n.op in ("call", "output"))


def _threadable(task: tuple[Node, ...]) -> bool:
    """Whether a task may go to a helper thread: groupable nodes, one of them an op (a lone
    lookup is bookkeeping on the main thread)."""
    return all(_groupable(n) for n in task) and any(n.op not in ("getitem", "saved") for n in task)


class _Ready:
    """The scheduler's state, shared by the simulation and the real run: how many of each task's
    waits are still running, the ready tasks by priority (those worth a helper in ``shared``,
    which any thread takes; the rest in ``mine``, which only the main thread takes: what only it
    may run, and branches too small for a hand-off), and the barrier's progress."""

    def __init__(self, plan: ParallelPlan, schedule: list[Node]) -> None:
        self.plan, self.index = plan, {n: k for k, n in enumerate(schedule)}
        tasks = plan.tasks
        self.missing = [len(w) for w in plan.task_waits]
        self.left = len(tasks)  # tasks not finished yet
        self.done = [False] * len(schedule)
        self.prefix = 0  # every node before this index in the sequential order is done
        self.held: list[int] = []  # barrier tasks whose inputs are done but not the prefix
        self.shared: list[tuple[float, int, int]] = []
        self.mine: list[tuple[float, int, int]] = []
        self.followers: list[list[int]] = [[] for _ in tasks]
        for k, w in enumerate(plan.task_waits):
            for p in w:
                self.followers[p].append(k)
        self.handoff = {k for k, t in enumerate(tasks) if t[0] in plan.handoff}
        self.threadable = {k for k, t in enumerate(tasks) if _threadable(t)}
        for k in range(len(tasks)):
            if self.missing[k] == 0:
                self._ready(k)

    def _key(self, k: int) -> tuple[float, int, int]:
        # what only the main thread runs goes first (sources, calls, lookups): it is cheap and may make branches ready
        first = self.plan.tasks[k][0]
        return -math.inf if k not in self.threadable else -self.plan.priority[first], self.index[first], k

    def _heap(self, k: int) -> list[tuple[float, int, int]]:
        return self.shared if k in self.handoff else self.mine

    def _ready(self, k: int) -> bool:
        """Queue a task whose waits are done (or hold it for the barrier); whether it is queued."""
        first = self.plan.tasks[k][0]
        if first in self.plan.barrier and self.prefix < self.index[first]:
            self.held.append(k)
            return False
        heapq.heappush(self._heap(k), self._key(k))
        return True

    def take(self, main: bool, spare: int = 0, after: list[int] = ()) -> int | None:
        """The next task for the main thread (the best of both heaps, leaving as many shared tasks
        as there are ``spare`` helpers, idle ones, to them) or a helper (shared ones only). A task
        that the thread's last one made ready (``after``) comes first: its inputs are still in
        this core's cache, and a sum of heads adds each head as it comes, not all at the end;
        only what the main thread alone runs (sources, calls, lookups) comes before it, there."""
        if main and self.mine and self.mine[0][0] == -math.inf:
            return heapq.heappop(self.mine)[2]
        for k in sorted(after, key=self._key):
            heap, key = self._heap(k), self._key(k)
            if (main or heap is self.shared) and key in heap:
                heap.remove(key)
                heapq.heapify(heap)
                return k
        shared = self.shared if not main or len(self.shared) > spare else []
        if main and self.mine and (not shared or self.mine[0] < shared[0]):
            return heapq.heappop(self.mine)[2]
        return heapq.heappop(shared)[2] if shared else None

    def finish(self, k: int) -> list[int]:
        """Task ``k`` is done: its followers' waits drop, the barrier moves on; returns the tasks
        that it made ready."""
        self.left -= 1
        made = [f for f in self.followers[k] if self._arrive(f)]
        for n in self.plan.tasks[k]:
            self.done[self.index[n]] = True
        while self.prefix < len(self.done) and self.done[self.prefix]:
            self.prefix += 1
        for h in [h for h in self.held if self.index[self.plan.tasks[h][0]] <= self.prefix]:
            self.held.remove(h)
            heapq.heappush(self._heap(h), self._key(h))
        return made

    def _arrive(self, f: int) -> bool:
        self.missing[f] -= 1
        return self.missing[f] == 0 and self._ready(f)


def _simulate(plan: ParallelPlan, schedule: list[Node], seconds: dict[Node, float]) -> list[Slot]:
    """The run that ``run_parallel`` makes, with the model's times instead of real ones: at each
    moment the idle helpers take the best shared tasks, paying the hand-off (a wake-up) before
    they start, then the main thread takes the best task left to it; when nobody can take
    anything, time moves on to the next task's end."""
    state = _Ready(plan, schedule)
    free_at = [0.0] * plan.workers
    running: list[tuple[float, int, int]] = []  # (end, task, thread), finished once time reaches end
    after: list[list[int]] = [[] for _ in range(plan.workers)]  # what each thread's last task made ready
    slots: list[Slot] = []
    now = 0.0

    def start(k: int, thread: int, at: float) -> None:
        for n in plan.tasks[k]:
            slots.append(Slot(n, thread, at, at + seconds[n]))
            at += seconds[n]
        free_at[thread] = at
        after[thread] = []
        running.append((at, k, thread))

    while state.left:
        for r in sorted(r for r in running if r[0] <= now):
            running.remove(r)
            after[r[2]] = state.finish(r[1])
        took = False
        for helper in range(1, plan.workers):
            k = state.take(False, after=after[helper]) if free_at[helper] <= now else None
            if k is not None:
                start(k, helper, now + (HANDOFF_SECONDS if k not in after[helper] else 0.0))
                took = True
        if free_at[0] <= now:
            k = state.take(True, sum(f <= now for f in free_at[1:]), after[0])
            if k is not None:
                start(k, 0, now)
                took = True
        if not took and state.left:
            now = min(t for t in [r[0] for r in running] + free_at if t > now)
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


def run_parallel(plan: ParallelPlan, schedule: list[Node], pool: ThreadPoolExecutor | None,
                 run_task: Callable[[int, int, float], None], finish: Callable[[Node], None]) -> None:
    """Run ``schedule`` as ``plan`` says, a task (a branch) at a time per thread: this thread and
    ``plan.workers - 1`` helpers from ``pool`` each take the best ready task they may run,
    ``run_task(k, thread, t0)`` runs the nodes of ``plan.tasks[k]`` one after another, and
    ``finish(n)`` does each node's bookkeeping (freeing what nothing reads any more) under the
    scheduler's lock. The threads meet once per task, at that lock; a helper runs in a copy of
    this thread's context, so that modes such as the memory tracker and ``no_grad`` hold there too.
    An error on any thread stops every thread after its current task and is raised here."""
    state = _Ready(plan, schedule)
    ready = threading.Condition(threading.Lock())
    failed: list[BaseException] = []
    busy = [0]  # helpers running a task
    t0 = time.perf_counter()

    def work(thread: int) -> None:
        main, made = thread == 0, []
        while True:
            with ready:
                patient = True
                while True:
                    if failed or not state.left:
                        return
                    k = state.take(main, len(team) - busy[0] if main and patient else 0, made)
                    made = []
                    if k is not None:
                        break
                    if main and state.shared:  # left to an idle helper; take it back if none comes for it
                        patient = ready.wait(WAKE_SECONDS)
                    else:
                        ready.wait()
                busy[0] += not main
            try:
                run_task(k, thread, t0)
            except BaseException as e:  # stop the others too; the main thread raises it
                with ready:
                    failed.append(e)
                    ready.notify_all()
                return
            with ready:
                for n in plan.tasks[k]:
                    finish(n)
                made = state.finish(k)
                busy[0] -= not main
                ready.notify_all()

    team = [pool.submit(contextvars.copy_context().run, work, t) for t in range(1, plan.workers)
            ] if pool is not None and state.handoff else []
    try:
        work(0)
    finally:
        with ready:
            if state.left and not failed:  # this thread was interrupted (KeyboardInterrupt)
                failed.append(RuntimeError("run_parallel: the main thread stopped before the graph was done"))
            ready.notify_all()
        # a helper that has not started yet (the pool busy elsewhere) is not needed any more
        wait([f for f in team if not f.cancel()])
    if failed:
        raise failed[0]
