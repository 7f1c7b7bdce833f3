"""The executor: run a graph in topological order, freeing each buffer after its last use (chapter 03).

``run_graph`` keeps every intermediate value until the end. Knowing the whole graph ahead of time,
an executor does better: it plans when each value is last read and drops it right after, so
memory returns while the graph still runs, and it can predict the peak before anything runs. It
runs the interpreter's steps (``minigrad.graph.interpret``), prepared once per node.
"""

from __future__ import annotations

import functools
import itertools
import math
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

from minigrad.autograd import mode
from minigrad.graph.interpret import EFFECT_OPS, apply_effect, keeps_ctx, node_step, run_node, source_tensor
from minigrad.graph.ir import SOURCE_OPS, Graph, Node
from minigrad.graph.overlap import helper, plan_overlap
from minigrad.graph.writeback import plan_writes, ufunc_args
from minigrad._tensor import Tensor

__all__ = ["Executor"]

_FROM_OUTSIDE = SOURCE_OPS  # memory the graph does not own
_STRUCTURAL = (SOURCE_OPS - {"placeholder"}) | {"getitem", "saved"}  # values looked up, not computed


class Executor:
    """Runs ``graph`` on input tensors: ``Executor(graph).run(inputs)`` returns the output arrays,
    as ``run_graph`` does.

    For each value it plans the step of its last reader and drops its reference right after that
    step; the most bytes live at once over the schedule is the *planned peak*, computed from node
    shapes and dtypes. Views (reshape, permute, broadcast) share their input's buffer, so they cost
    nothing and keep that buffer alive. With ``parallel=True`` the nodes of each level (no node
    depends on another of its level) run at once in a thread pool: numpy releases the GIL in its
    kernels. Side effects (``copy_``, ``set_grad``) apply at the end, in order, except the updates
    that ``minigrad.graph.writeback`` plans into their tensors: those values are computed straight
    into the tensor's memory (an optimizer's new weights and momentum), so their copies have
    nothing left to do.

    ``planned_peak`` is the most bytes of intermediate values alive at once (inputs, parameters
    and constants not counted), ``planned_live`` those bytes at each step, and ``planned_total``
    what keeping every value to the end (as ``run_graph`` does) holds; ``measured_peak`` is set by
    ``run(..., measure=True)`` when the memory tracker (``minigrad.memory.track``) is available.
    ``writes`` is the plan of updates computed in place (``minigrad.graph.writeback``), and
    ``overlap`` maps the big matrix products that run on a helper thread while the graph goes on
    (``minigrad.graph.overlap``; not with ``parallel``, nor while measuring) to the step that waits.
    ``run(..., time_nodes=True)`` records in ``node_seconds`` the seconds each node took (the ops
    the pool computes excepted), writes included: where a compiled step's time goes.
    """

    def __init__(self, graph: Graph, parallel: bool = False, max_workers: int | None = None) -> None:
        self.graph, self.parallel, self.max_workers = graph, parallel, max_workers
        self.schedule = [n for n in graph.topological_order() if n.op != "output"]
        self.steps = graph.levels() if parallel else [[n] for n in self.schedule]
        self.steps = [[n for n in level if n.op != "output"] for level in self.steps]
        self.effects = [n for n in self.schedule if n.op in EFFECT_OPS]
        self._keep_ctx = {n for n in self.schedule if keeps_ctx(n)}
        self.writes = plan_writes(self.steps, self.effects, graph.outputs, self._keep_ctx)
        # the sources whose arrays decide whether a call may write in place (see _apart)
        self._watched = list(dict.fromkeys([*self.writes.into.values(), *(n for p in self.writes.overlaps for n in p)]))
        self._seen: tuple[list, bool] | None = None  # the watched arrays of the last check, and its answer
        self._in_place = True  # this call writes the planned values into their tensors
        self._results_into: dict[Node, list] = {}  # a kernel with several results -> the tensor each goes into
        for v, target in self.writes.into.items():
            if v.op == "getitem":
                self._results_into.setdefault(v.inputs[0], [None] * v.inputs[0].attrs["results"])[
                    v.attrs["index"]] = target.meta["target"]
        self._work = self._plan_work()
        writers = {**self.writes.into, **dict.fromkeys(self._results_into)}  # the steps that write into tensors
        self.overlap = {} if parallel else plan_overlap(self.schedule, writers, self._keep_ctx)
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

    # -- running ------------------------------------------------------------------------------------
    def run(self, inputs: Sequence[Tensor], measure: bool = False, time_nodes: bool = False) -> list[Any]:
        """Execute the graph; returns the output arrays. ``measure=True`` records the measured peak
        of the bytes the run allocates in ``measured_peak`` (None without the memory tracker);
        ``time_nodes=True`` each node's seconds in ``node_seconds``."""
        if len(inputs) != len(self.graph.placeholders):
            raise TypeError(f"Executor.run: the graph takes {len(self.graph.placeholders)} input(s), got {len(inputs)}")
        if time_nodes:
            self.node_seconds = {}
        track = _tracker() if measure else None
        if track is None:
            self.measured_peak = None
            return self._run(inputs, clock=time_nodes)
        with track() as mem:
            outputs = self._run(inputs, report=True)
        self.measured_peak = mem.peak - mem.start
        return outputs

    def __call__(self, *inputs: Tensor) -> list[Any]:
        return self.run(inputs)

    def _run(self, inputs: Sequence[Tensor], report: bool = False, clock: bool = False) -> list[Any]:
        given = dict(zip(self.graph.placeholders, inputs))
        env: dict[Node, Any] = {n: x.array for n, x in given.items()}
        ctxs: dict[Node, Any] = {}
        self._in_place = not self._watched or self._apart(given)
        pool = ThreadPoolExecutor(self.max_workers) if self.parallel else None
        overlap = bool(self.overlap) and not report and not clock
        thread = helper() if overlap else None
        pending: dict[Node, Any] = {}  # products running on the helper thread
        try:
            for k, (pooled, calls, frees, ctx_frees, new) in enumerate(self._work):
                if overlap:
                    for n in self._waits.get(k, ()):
                        env[n] = pending.pop(n).result()[0]
                    if calls and calls[0][0] in self._launch:  # one node per step when not parallel
                        n = calls[0][0]
                        pending[n] = thread.submit(self._launch[n], [env[i] for i in n.inputs])
                        calls = ()
                if pooled:  # compute on the pool's threads, store here
                    futures = [pool.submit(compute, [env[i] for i in n.inputs]) for n, compute in pooled]
                for n, call in calls:
                    if clock:
                        start = time.perf_counter()
                        call(env, ctxs)
                        self.node_seconds[n] = time.perf_counter() - start
                    else:
                        call(env, ctxs)
                if pooled:
                    for (n, _), f in zip(pooled, futures):
                        env[n], ctx = f.result()
                        if n in self._keep_ctx:
                            ctxs[n] = ctx
                if report:  # the memory tracker counts each new buffer, as it counts each new Tensor
                    for n in new:
                        _report(env[n])
                for n in frees:  # drop the last references: the buffer can be freed now
                    del env[n]
                for n in ctx_frees:  # a ctx holds the arrays its op saved
                    del ctxs[n]
            for n, f in pending.items():  # values only the writes or the output read
                env[n] = f.result()[0]
        finally:
            if pool is not None:
                pool.shutdown()
        self._apply_effects(env, given, clock)
        return [env[n] for n in self.graph.outputs]

    def _apply_effects(self, env: dict[Node, Any], given: dict[Node, Tensor], clock: bool = False) -> None:
        """The effects, in order: a ``copy_`` whose value the run already wrote into the tensor
        (or that a later copy overwrites) only bumps the tensor's version."""
        in_place = self._in_place
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
        arrays = [given[n].array if n.op == "placeholder" else n.attrs["value"] if n.op == "constant"
                  else source_tensor(n, given).array for n in self._watched]
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
        """For each step: the ops for the thread pool (with their compute functions), the nodes to
        run here with their calls (ops and structural nodes: sources, getitem, saved), the values
        and ctxs to drop after it, and the nodes whose values are new buffers (for the memory tracker)."""
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
            ops = [n for n in step if not _is_structural(n)]
            threaded = {n for n in ops if self.parallel and len(ops) > 1}
            pooled = [(n, self._compute(n)) for n in ops if n in threaded]
            inline = [n for n in ops if n not in threaded] + [n for n in step if n.op in _STRUCTURAL]
            new = [n for n in step if n.op not in _FROM_OUTSIDE and n.op not in EFFECT_OPS
                   and n not in self.writes.into and n not in self._results_into]  # its getitems report
            work.append((pooled, [(n, node_step(n, self._compute(n), n in self._keep_ctx)) for n in inline], free,
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
            return functools.partial(run_node, n)
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
        owner: dict[Node, Node | None] = {}  # the node whose buffer holds each value (None: not ours)
        born, dies, size = {}, {}, {}
        for n in self.schedule:
            if n.op in _FROM_OUTSIDE or n.op in EFFECT_OPS or n in self.writes.into:
                owner[n] = None
                continue
            if _is_view(n):
                owner[n] = owner[n.inputs[0]]
            else:
                owner[n] = n
                made_by = n.inputs[0] if n.op in ("getitem", "saved") else n
                born[n], size[n] = step_of[made_by], _nbytes(n)
            o = owner[n]
            if o is not None:
                dies[o] = max(dies.get(o, 0), last[n])
        change = [0] * (len(self.steps) + 2)  # bytes allocated minus bytes freed, per step
        for o, b in born.items():
            change[b] += size[o]
            change[dies[o] + 1] -= size[o]
        return list(itertools.accumulate(change[:-1]))

    def report(self) -> str:
        """One line: steps, planned peak, what keeping every value would cost, measured peak."""
        line = (f"{len(self.schedule)} nodes in {len(self.steps)} steps: planned peak {_fmt(self.planned_peak)} "
                f"(keeping every value: {_fmt(self.planned_total)})")
        if self.measured_peak is not None:
            line += f", measured peak {_fmt(self.measured_peak)}"
        return line

    def __repr__(self) -> str:
        return f"<Executor {self.report()}>"


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
