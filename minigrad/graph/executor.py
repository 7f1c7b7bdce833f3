"""The executor: run a graph in topological order, freeing each buffer after its last use (chapter 03).

``run_graph`` keeps every intermediate value until the end. Knowing the whole graph ahead of time,
an executor does better: it plans when each value is last read and drops it right after, so
memory returns while the graph still runs, and it can predict the peak before anything runs. It
runs the interpreter's steps (``minigrad.graph.interpret``), prepared once per node, one after
another or, where the cost model says it pays, independent ones at once (``minigrad.graph.parallel``).
"""

from __future__ import annotations

import functools
import itertools
import math
import time
from typing import Any, Callable, Sequence

from minigrad.autograd import mode
from minigrad.graph.interpret import (EFFECT_OPS, apply_effect, keeps_ctx, node_runner, node_step, run_node,
                                      source_tensor)
from minigrad.graph.ir import SOURCE_OPS, Graph, GraphError, Node
from minigrad.graph.overlap import helper, plan_overlap
from minigrad.graph.parallel import PAYS_BELOW, ParallelPlan, Slot, helpers, plan_parallel, run_parallel
from minigrad.graph.streams import StreamPlan, plan_streams, run_streams
from minigrad.graph.writeback import plan_writes, ufunc_args
from minigrad._tensor import Tensor

__all__ = ["Executor"]

_FROM_OUTSIDE = SOURCE_OPS  # memory the graph does not own
TRIALS = 5  # timed calls of each way before parallel="auto" settles
_STRUCTURAL = (SOURCE_OPS - {"placeholder"}) | {"getitem", "saved"}  # values looked up, not computed


class Executor:
    """Runs ``graph`` on input tensors: ``Executor(graph).run(inputs)`` returns the output arrays,
    as ``run_graph`` does.

    For each value it plans the step of its last reader and drops its reference right after that
    step; the most bytes live at once over the schedule is the *planned peak*, computed from node
    shapes and dtypes. Views (reshape, permute, broadcast) share their input's buffer, so they cost
    nothing and keep that buffer alive. With ``parallel="auto"`` independent branches run at once on
    ``max_workers`` threads (2 by default; numpy releases the GIL in its kernels) when the cost
    model's simulation (``parallel_plan``, ``minigrad.graph.parallel``) says it pays, and one after
    another otherwise; where the model says it pays, the first ``2 * TRIALS`` calls time both ways
    in turn and the faster stays (``measured_choice`` says what they measured: a busy second core
    makes the model's promise void). ``parallel=True`` always runs the threaded scheduler.
    Threaded, buffers are freed when their last reader finishes, whichever thread ran it, and
    ``timeline=True`` records each node's ``Slot`` (thread, start, end) in ``timeline``; the planned
    peak is the sequential order's, which concurrent branches may exceed: ``planned_parallel_peak``
    is the threaded plan's (from its simulated schedule). On cuda, ``parallel``
    puts branches on ``max_workers`` CUDA streams instead, with events for the edges between them
    (``stream_plan``, ``minigrad.graph.streams``). Ordering edges (``Node.after``) hold in every
    mode; a ``call`` node runs on the main thread (the current stream) where the order puts it.
    Side effects (``copy_``, ``set_grad``) apply at the end, in order, except the updates
    that ``minigrad.graph.writeback`` plans into their tensors: those values are computed straight
    into the tensor's memory (an optimizer's new weights and momentum), so their copies have
    nothing left to do.

    ``planned_peak`` is the most bytes of intermediate values alive at once (inputs, parameters
    and constants not counted), ``planned_live`` those bytes at each step, and ``planned_total``
    what keeping every value to the end (as ``run_graph`` does) holds; ``measured_peak`` is set by
    ``run(..., measure=True)`` when the memory tracker (``minigrad.memory.track``) is available.
    ``writes`` is the plan of updates computed in place (``minigrad.graph.writeback``), and
    ``overlap`` maps the big matrix products that run on a helper thread while the graph goes on
    (``minigrad.graph.overlap``; in the sequential run, not while measuring) to the step that waits.
    ``run(..., time_nodes=True)`` records in ``node_seconds`` the seconds each node took (the ops
    the pool computes excepted), writes included: where a compiled step's time goes.
    """

    def __init__(self, graph: Graph, parallel: bool | str = False, max_workers: int | None = None) -> None:
        if parallel not in (False, True, "auto"):
            raise ValueError(f"Executor: parallel must be False, True or 'auto', got {parallel!r}")
        self.graph, self.max_workers = graph, max_workers or 2
        self.schedule = [n for n in graph.topological_order() if n.op != "output"]
        self.steps = [[n] for n in self.schedule]
        self.effects = [n for n in self.schedule if n.op in EFFECT_OPS]
        for e in self.effects:
            if e.followers:  # the writes apply after every node has run, so nothing can wait for one
                raise GraphError(f"Executor: {', '.join(f.name for f in e.followers)} is ordered after the write "
                                 f"{e.name} ({e.op}), which applies at the end of the run; use a call node to write "
                                 "in the middle of a graph")
        self._keep_ctx = {n for n in self.schedule if keeps_ctx(n)}
        self.writes = plan_writes(self.steps, self.effects, graph.outputs, self._keep_ctx)
        self._results_into: dict[Node, list] = {}  # a kernel with several results -> the tensor each goes into
        for v, target in self.writes.into.items():
            if v.op == "getitem":
                self._results_into.setdefault(v.inputs[0], [None] * v.inputs[0].attrs["results"])[
                    v.attrs["index"]] = target.meta["target"]
        writers = frozenset(self.writes.into) | frozenset(self._results_into)  # the nodes that write into tensors
        self.parallel_plan: ParallelPlan | None = None
        self.stream_plan: StreamPlan | None = None
        device = next((n.meta["device"] for n in self.schedule if n.meta.get("device") is not None), None)
        if parallel and getattr(device, "type", "cpu") == "cuda":  # branches on streams, not threads
            self.stream_plan = plan_streams(self.schedule, self.max_workers, writers)
            self._device, self._side_streams = device, None
        elif parallel:  # the values written into tensors wait for every node before them (see parallel.py)
            self.parallel_plan = plan_parallel(self.schedule, self.max_workers, writers, force=parallel is True)
        self.parallel = ((self.parallel_plan is not None and (parallel is True or self.parallel_plan.pays))
                         or (self.stream_plan is not None and self.stream_plan.used > 1))
        # "auto": the model proposes, the first calls measure; both ways are timed in turn and the faster stays
        self._trials: dict[bool, list[float]] | None = ({True: [], False: []} if parallel == "auto" and self.parallel
                                                        and self.parallel_plan is not None else None)
        self.timeline: list[Slot] = []
        # the sources whose arrays decide whether a call may write in place (see _apart)
        self._watched = list(dict.fromkeys([*self.writes.into.values(), *(n for p in self.writes.overlaps for n in p)]))
        self._watched_tensors = [n.meta["target"] if n.op == "parameter" else None for n in self._watched]
        self._seen: tuple[list, bool] | None = None  # the watched arrays of the last check, and its answer
        self._in_place = True  # this call writes the planned values into their tensors
        self._work = self._plan_work()
        # the plain sequential run (nothing timed, measured or overlapped): one flat list of calls and frees
        self._plain = [(tuple(call for _, call in calls), tuple(frees), tuple(ctx_frees))
                       for calls, frees, ctx_frees, _ in self._work]
        self.overlap = plan_overlap(self.schedule, writers, self._keep_ctx)  # the sequential run's
        self._waits: dict[int, list[Node]] = {}
        for n, k in self.overlap.items():
            self._waits.setdefault(k, []).append(n)
        self._launch = {n: self._compute(n) for n in self.overlap}
        self._effect_plan = [(e.op, e.inputs[0], e.inputs[1] if len(e.inputs) > 1 else None,
                              e in self.writes.absorbed, e in self.writes.own_grads, e.attrs.get("writes", 1))
                             for e in self.effects]
        self.planned_live = self._plan_memory()
        self.planned_peak = max(self.planned_live, default=0)
        owned = [n for n in self.schedule if n.op not in _FROM_OUTSIDE and not _is_view(n)]
        self.planned_total = sum(_nbytes(n) for n in owned)
        self.measured_peak: int | None = None
        self.node_seconds: dict[Node, float] = {}
        self.measured_choice: str | None = None  # parallel="auto": what its first calls measured
        # the threaded run's own peak: branches alive at once, and their inputs held until a branch is done
        self.planned_parallel_peak = self._plan_parallel_memory() if self.parallel_plan is not None else None
        if self.parallel and self.parallel_plan is not None:
            self._prepare_parallel()

    # -- running ------------------------------------------------------------------------------------
    def run(self, inputs: Sequence[Tensor], measure: bool = False, time_nodes: bool = False,
            timeline: bool = False) -> list[Any]:
        """Execute the graph; returns the output arrays. ``measure=True`` records the measured peak
        of the bytes the run allocates in ``measured_peak`` (None without the memory tracker);
        ``time_nodes=True`` each node's seconds in ``node_seconds`` (one node after another);
        ``timeline=True`` each node's thread, start and end in ``timeline``."""
        if len(inputs) != len(self.graph.placeholders):
            raise TypeError(f"Executor.run: the graph takes {len(self.graph.placeholders)} input(s), got {len(inputs)}")
        if time_nodes:
            self.node_seconds = {}
        self.timeline = [] if timeline else self.timeline
        parallel = self.parallel and not time_nodes
        trial = self._trials is not None and not (measure or time_nodes or timeline)
        if trial:  # alternate, parallel first
            parallel = len(self._trials[True]) <= len(self._trials[False])
        run = (self._run if not parallel else self._run_streams if self.stream_plan is not None
               else self._run_parallel)
        track = _tracker() if measure else None
        if track is None:
            self.measured_peak = None
            start = time.perf_counter()
            outputs = run(inputs, clock=time_nodes, timeline=timeline)
            if trial:
                self._trial(parallel, time.perf_counter() - start)
            return outputs
        with track() as mem:
            outputs = run(inputs, report=True)
        self.measured_peak = mem.peak - mem.start
        return outputs

    def __call__(self, *inputs: Tensor) -> list[Any]:
        return self.run(inputs)

    def _run(self, inputs: Sequence[Tensor], report: bool = False, clock: bool = False,
             timeline: bool = False) -> list[Any]:
        given = dict(zip(self.graph.placeholders, inputs))
        env: dict[Node, Any] = {n: x.array for n, x in given.items()}
        ctxs: dict[Node, Any] = {}
        self._in_place = not self._watched or self._apart(given)
        overlap = bool(self.overlap) and not report and not clock and not timeline
        if not (overlap or report or clock or timeline):
            for calls, frees, ctx_frees in self._plain:
                for call in calls:
                    call(env, ctxs)
                for n in frees:  # drop the last references: the buffer can be freed now
                    del env[n]
                for n in ctx_frees:  # a ctx holds the arrays its op saved
                    del ctxs[n]
            self._apply_effects(env, given, clock)
            return [env[n] for n in self.graph.outputs]
        thread = helper() if overlap else None
        pending: dict[Node, Any] = {}  # products running on the helper thread
        t0 = time.perf_counter()
        try:
            for k, (calls, frees, ctx_frees, new) in enumerate(self._work):
                if overlap:
                    for n in self._waits.get(k, ()):
                        env[n] = _finish(pending.pop(n), self._launch[n])
                    if calls and calls[0][0] in self._launch:  # one node per step when not parallel
                        n = calls[0][0]
                        arrays = [env[i] for i in n.inputs]
                        pending[n] = (thread.submit(self._launch[n], arrays), arrays)
                        calls = ()
                for n, call in calls:
                    if clock or timeline:
                        start = time.perf_counter()
                        call(env, ctxs)
                        end = time.perf_counter()
                        if clock:
                            self.node_seconds[n] = end - start
                        if timeline:
                            self.timeline.append(Slot(n, 0, start - t0, end - t0))
                    else:
                        call(env, ctxs)
                if report:  # the memory tracker counts each new buffer, as it counts each new Tensor
                    for n in new:
                        _report(env[n])
                for n in frees:  # drop the last references: the buffer can be freed now
                    del env[n]
                for n in ctx_frees:  # a ctx holds the arrays its op saved
                    del ctxs[n]
            for n, job in pending.items():  # values only the writes or the output read
                env[n] = _finish(job, self._launch[n])
        finally:
            for f, _ in pending.values():  # an error here: let the helper finish before its inputs go away
                f.cancel() or f.exception()
        self._apply_effects(env, given, clock)
        return [env[n] for n in self.graph.outputs]

    def _run_streams(self, inputs: Sequence[Tensor], report: bool = False, clock: bool = False,
                     timeline: bool = False) -> list[Any]:
        """On cuda: the sequential steps, each queued on its stream with the plan's events; a value
        read on another stream than its own stays to the end (see ``minigrad.graph.streams``)."""
        given = dict(zip(self.graph.placeholders, inputs))
        env: dict[Node, Any] = {n: x.array for n, x in given.items()}
        ctxs: dict[Node, Any] = {}
        self._in_place = not self._watched or self._apart(given)
        xp, plan = self._device.xp, self.stream_plan
        with xp.cuda.Device(self._device.index):
            if self._side_streams is None:  # made once: a stream is a GPU resource
                self._side_streams = [xp.cuda.Stream(non_blocking=True) for _ in range(plan.streams - 1)]
            side = [xp.cuda.get_current_stream(), *self._side_streams]

            def queue(calls: list, frees: list, ctx_frees: list, new: list) -> Callable[[], None]:
                def step() -> None:
                    for _, call in calls:
                        call(env, ctxs)
                    if report:
                        for n in new:
                            _report(env[n])
                    for n in frees:
                        if n not in plan.crossing:
                            del env[n]
                    for n in ctx_frees:
                        del ctxs[n]
                return step

            run_streams(plan, side, [(step[0], queue(*work)) for step, work in zip(self.steps, self._work)])
        self._apply_effects(env, given, clock)
        return [env[n] for n in self.graph.outputs]

    def _trial(self, parallel: bool, seconds: float) -> None:
        """Record one timed call of ``parallel="auto"``; after ``TRIALS`` of each way, keep the
        threaded run only if its fastest call is clearly faster than the sequential one's. (The
        fastest, not the median: a burst of load from elsewhere during two or three of the ten
        calls once made the medians pick sequential for a graph that runs 1.45x faster threaded.
        A second core that stays busy slows every threaded call, so the fastest still tells.)"""
        self._trials[parallel].append(seconds)
        if min(len(t) for t in self._trials.values()) >= TRIALS:
            par, seq = (min(self._trials[k]) for k in (True, False))
            self.parallel = par < PAYS_BELOW * seq
            self.measured_choice = (f"measured {par * 1e3:.3f} ms threaded vs {seq * 1e3:.3f} ms sequential: "
                                    f"{'threaded' if self.parallel else 'sequential'}")
            self._trials = None

    def _prepare_parallel(self) -> None:
        """What the threaded run needs: per task (a branch, ``ParallelPlan.tasks``) its nodes' steps,
        each with the values to drop right after it, those only the branch itself reads (so a
        branch frees its own intermediates on whichever thread runs it); per node, how many nodes
        read its value (and its ctx) before it can be freed; values an effect or the output reads stay."""
        self._readers = {n: len({u for u in n.users if u.op not in EFFECT_OPS and u.op != "output"})
                         for n in self.schedule}
        self._kept = {n for n in self.schedule for u in n.users if u.op == "output" or u.op in EFFECT_OPS}
        self._ctx_readers = {n: sum(u.op == "saved" for u in n.users) for n in self._keep_ctx}
        self._tasks = []
        for task in self.parallel_plan.tasks:
            inner = set(task)
            last = {i: n for n in task for i in n.inputs
                    if i in inner and i not in self._kept and all(u in inner for u in i.users)}
            steps = []
            for n in task:
                if n.op == "placeholder" or n.op in EFFECT_OPS:
                    continue
                call = node_step(n, self._compute(n), n in self._keep_ctx)
                report = n.op not in _FROM_OUTSIDE and n not in self.writes.into
                steps.append((n, call, report, tuple(i for i, reader in last.items() if reader is n)))
            self._tasks.append(steps)
        self._pool = helpers(self.max_workers - 1) if self.max_workers > 1 else None  # one worker: all inline

    def _run_parallel(self, inputs: Sequence[Tensor], report: bool = False, clock: bool = False,
                      timeline: bool = False) -> list[Any]:
        """The threaded run: ``run_parallel`` with this executor's steps, a branch per thread at a
        time; a value goes as soon as its last reader is done, whichever order the threads finish in."""
        given = dict(zip(self.graph.placeholders, inputs))
        env: dict[Node, Any] = {n: x.array for n, x in given.items()}
        ctxs: dict[Node, Any] = {}
        self._in_place = not self._watched or self._apart(given)
        readers, ctx_readers = dict(self._readers), dict(self._ctx_readers)
        slots = self.timeline if timeline else None

        # both threads write env and ctxs, each its own keys: a dict's item assignment and deletion are atomic
        def run_task(k: int, thread: int, t0: float) -> None:
            for n, call, new, frees in self._tasks[k]:
                start = time.perf_counter() if slots is not None else 0.0
                call(env, ctxs)
                if slots is not None:
                    slots.append(Slot(n, thread, start - t0, time.perf_counter() - t0))
                if report and new and n in env:
                    _report(env[n])
                for i in frees:  # the branch's own intermediates: nothing outside it reads them
                    del env[i]

        def finish(n: Node) -> None:
            for i in set(n.inputs):  # drop the last references: the buffer can be freed now
                readers[i] -= 1
                if readers[i] == 0 and i not in self._kept:
                    env.pop(i, None)
                if n.op == "saved" and i in ctx_readers:
                    ctx_readers[i] -= 1
                    if ctx_readers[i] == 0:
                        del ctxs[i]
            if readers.get(n) == 0 and n not in self._kept:
                env.pop(n, None)

        run_parallel(self.parallel_plan, self.schedule, self._pool, run_task, finish)
        self._apply_effects(env, given, clock)
        return [env[n] for n in self.graph.outputs]

    def _apply_effects(self, env: dict[Node, Any], given: dict[Node, Tensor], clock: bool = False) -> None:
        """The effects, in order: a ``copy_`` whose value the run already wrote into the tensor
        (or that a later copy overwrites) only bumps the tensor's version."""
        in_place = self._in_place
        if not clock:
            for op, target_node, value, absorbed, own, writes in self._effect_plan:
                target = (target_node.meta["target"] if target_node.op == "parameter"
                          else source_tensor(target_node, given))
                if absorbed and in_place and op == "copy_":  # already in the tensor: its version moves
                    for _ in range(writes):
                        target._bump_version()
                else:
                    apply_effect(op, target, env[value] if value is not None else None, own=own, writes=writes)
            return
        for e, (op, target_node, value, absorbed, own, writes) in zip(self.effects, self._effect_plan):
            start = time.perf_counter() if clock else 0.0
            apply_effect(op, source_tensor(target_node, given), env[value] if value is not None else None,
                         written=absorbed and in_place, own=own, writes=writes)
            if clock:
                self.node_seconds[e] = time.perf_counter() - start

    def _apart(self, given: dict[Node, Tensor]) -> bool:
        """Whether the tensors written in place share no memory with the sources that the plan
        assumes apart from them (a constant that is a view of a parameter would see the update
        early), and still have the shapes and dtypes traced. Checked again only when an array changes."""
        arrays = [t.array if t is not None else given[n].array if n.op == "placeholder"
                  else n.attrs["value"] if n.op == "constant" else source_tensor(n, given).array
                  for n, t in zip(self._watched, self._watched_tensors)]
        if self._seen is not None and all(a is b for a, b in zip(arrays, self._seen[0])):
            return self._seen[1]
        array_of = dict(zip(self._watched, arrays))
        fit = all(array_of[t].shape == t.shape and array_of[t].dtype == t.dtype for t in set(self.writes.into.values()))
        shared = any(type(array_of[t]) is type(array_of[s])
                     and t.meta["target"].device.xp.may_share_memory(array_of[t], array_of[s])
                     for t, s in self.writes.overlaps)
        self._seen = (arrays, fit and not shared)  # kept, so that "is" compares with live arrays only
        return self._seen[1]

    # -- planning -------------------------------------------------------------------------------------
    def _last_step(self) -> dict[Node, int]:
        """The step after which each value is no longer needed (values the output or an effect
        reads are needed to the end, past the last step)."""
        step_of = {n: k for k, step in enumerate(self.steps) for n in step}
        end = len(self.steps)
        last = {}
        for n in self.schedule:
            readers = [step_of.get(u, end) if u.op not in EFFECT_OPS else end for u in n.users]
            last[n] = max(readers, default=step_of[n])
        return last

    def _plan_work(self) -> list[tuple]:
        """For each step (one node): the nodes to run with their calls (ops and structural nodes:
        sources, getitem, saved), the values and ctxs to drop after it, and the nodes whose values
        are new buffers (for the memory tracker)."""
        step_of = {n: k for k, step in enumerate(self.steps) for n in step}
        frees: list[list[Node]] = [[] for _ in self.steps]
        ctx_frees: list[list[Node]] = [[] for _ in self.steps]
        for n, k in self._last_step().items():
            if k < len(self.steps) and n.op not in EFFECT_OPS:
                frees[k].append(n)
            if n in self._keep_ctx:
                ctx_frees[max(step_of[u] for u in n.users if u.op == "saved")].append(n)
        work = []
        for step, free, ctx_free in zip(self.steps, frees, ctx_frees):
            inline = [n for n in step if not _is_structural(n)] + [n for n in step if n.op in _STRUCTURAL]
            new = [n for n in step if n.op not in _FROM_OUTSIDE and n.op not in EFFECT_OPS
                   and n not in self.writes.into and n not in self._results_into]  # its getitems report
            work.append(([(n, node_step(n, self._compute(n), n in self._keep_ctx)) for n in inline], free,
                         ctx_free, new))
        return work

    def _compute(self, n: Node) -> Callable[[list], tuple[Any, Any]]:
        """``run_node`` for ``n``; for a value planned into a tensor, a call that writes it there."""
        if n in self._results_into:
            kernel, tensors = n.fn, self._results_into[n]
            return lambda arrays: (kernel(*arrays, out=tuple(t.array if t is not None else None for t in tensors)
                                          if self._in_place else None), None)
        target = self.writes.into.get(n)
        if target is None or n.op == "getitem":  # a result of the kernel above: looked up
            return node_runner(n) if n.op not in _STRUCTURAL and n.op != "call" else functools.partial(run_node, n)
        t = target.meta["target"]
        if n.op == "fused":
            kernel = n.fn
            return lambda arrays: (kernel(*arrays, out=t.array if self._in_place else None), None)
        ufunc = getattr(n.meta["ctx_device"].xp, n.fn.ufunc)
        return lambda arrays: (ufunc(*ufunc_args(n, arrays), out=t.array if self._in_place else None), None)

    def _plan_memory(self) -> list[int]:
        """Bytes of intermediate values alive during each step. A buffer is born at the step of
        the op that makes it (a getitem's or saved array's at its op's) and lives until the last
        reader of it, or of any view of it, has run. A value computed into a tensor costs nothing."""
        step_of = {n: k for k, step in enumerate(self.steps) for n in step}
        last = self._last_step()
        owner, born, size = self._buffers(step_of.__getitem__)
        dies: dict[Node, int] = {}
        for n in self.schedule:
            o = owner[n]
            if o is not None:
                dies[o] = max(dies.get(o, 0), last[n])
        change = [0] * (len(self.steps) + 2)  # bytes allocated minus bytes freed, per step
        for o, b in born.items():
            change[b] += size[o]
            change[dies[o] + 1] -= size[o]
        return list(itertools.accumulate(change[:-1]))

    def _buffers(self, born_at: Callable[[Node], Any]) -> tuple[dict, dict, dict]:
        """Per value, the node whose buffer holds it (None: memory the graph does not own, or a
        value computed into a tensor); per buffer, when it is born (``born_at`` of the node that
        makes it: a getitem's or saved array's is its op's) and its bytes. A view owns nothing."""
        owner: dict[Node, Node | None] = {}
        born, size = {}, {}
        for n in self.schedule:
            if n.op in _FROM_OUTSIDE or n.op in EFFECT_OPS or n in self.writes.into:
                owner[n] = None
            elif _is_view(n):
                owner[n] = owner[n.inputs[0]]
            else:
                owner[n] = n
                born[n], size[n] = born_at(n.inputs[0] if n.op in ("getitem", "saved") else n), _nbytes(n)
        return owner, born, size

    def _plan_parallel_memory(self) -> int:
        """The most bytes of intermediate values alive at once in the threaded plan's simulated
        schedule (``ParallelPlan.simulated``): a buffer is born when the node that makes it starts
        and dies when the last reader of it, or of any view of it, lets go: as soon as that reader
        ends if both are of one branch (a branch drops its own intermediates), when the reader's
        whole branch is done otherwise (that is when the scheduler counts its reads)."""
        plan = self.parallel_plan
        slot = {s.node: s for s in plan.simulated}
        task_of = {n: k for k, t in enumerate(plan.tasks) for n in t}
        task_end = {k: max(slot[n].end for n in t) for k, t in enumerate(plan.tasks)}
        forever = math.inf
        owner, born, size = self._buffers(lambda n: slot[n].start)
        dies: dict[Node, float] = {}
        for n in self.schedule:
            o = owner[n]
            if o is None:
                continue
            if any(u.op == "output" or u.op in EFFECT_OPS for u in n.users):
                release = forever
            else:
                readers = [u for u in n.users if u in slot]
                inner = all(task_of[u] == task_of[n] for u in readers)
                release = max((slot[u].end if inner else task_end[task_of[u]] for u in readers),
                              default=task_end[task_of[n]])
            dies[o] = max(dies.get(o, 0.0), release)
        events = sorted([(t, 0, -size[o]) for o, t in dies.items() if t != forever]  # frees first on a tie
                        + [(t, 1, size[o]) for o, t in born.items()])
        live = peak = 0
        for _, _, change in events:
            live += change
            peak = max(peak, live)
        return peak

    def report(self) -> str:
        """One line: steps, planned peak (and the threaded plan's), what keeping every value would
        cost, measured peak."""
        line = (f"{len(self.schedule)} nodes in {len(self.steps)} steps: planned peak {_fmt(self.planned_peak)} "
                f"(keeping every value: {_fmt(self.planned_total)})")
        if self.planned_parallel_peak is not None:
            line += f", threaded {_fmt(self.planned_parallel_peak)}"
        if self.measured_peak is not None:
            line += f", measured peak {_fmt(self.measured_peak)}"
        return line

    def __repr__(self) -> str:
        return f"<Executor {self.report()}>"


def _finish(job: tuple, compute: Callable[[list], tuple[Any, Any]]) -> Any:
    """The value of a product handed to the helper thread: its result, or, when the helper has not
    started it yet (a busy machine leaves the helper no core), computed here at once instead of
    waiting for the helper to be scheduled."""
    future, arrays = job
    return compute(arrays)[0] if future.cancel() else future.result()[0]


def _is_structural(n: Node) -> bool:
    return n.op in _FROM_OUTSIDE or n.op in ("getitem", "saved") or n.op in EFFECT_OPS


def _nbytes(n: Node) -> int:
    if n.shape is None or n.dtype is None:
        return 0  # an op returning several arrays: its getitems count them
    return math.prod(n.shape) * getattr(n.dtype, "itemsize", 0)


def _report(value: Any) -> None:
    """Tell the modes (the memory tracker) of a new buffer, as every new Tensor does."""
    for v in value if type(value) is tuple else (value,):
        if v is not None:
            mode.new_array(v)


def _tracker() -> Any:
    try:
        from minigrad.memory import track
    except ImportError:
        return None
    return track


def _fmt(nbytes: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= size:
            return f"{nbytes / size:.2f} {unit}"
    return f"{nbytes} B"


def _is_view(n: Node) -> bool:
    """Whether the node's value shares its input's buffer (its op declares ``returns_view``)."""
    return getattr(n.fn, "returns_view", False)
