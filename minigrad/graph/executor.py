"""The executor: run a graph in topological order, freeing each buffer after its last use (chapter 03).

``run_graph`` keeps every intermediate value until the end. Knowing the whole graph ahead of time,
an executor can do better: it plans, for each value, the step of its last reader and drops its
reference right after that step, so the memory returns while the graph still runs; the most bytes
live at once over the schedule is the *planned peak*, computed from node shapes and dtypes before
anything runs. Views (reshape, permute, broadcast) share their input's buffer, so they cost
nothing and keep that buffer alive. With ``parallel=True`` the nodes of each level (no node
depends on another of its level) run at once in a thread pool: numpy releases the GIL in its
kernels. Side effects (``copy_``, ``set_grad``) apply at the end, in order, as in ``run_graph``.
"""

from __future__ import annotations

import itertools
import math
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

from minigrad.graph.ir import Graph, Node
from minigrad.graph.trace import _saved_array, _target, run_node
from minigrad.tensor import Tensor, _wrap

_tensor = sys.modules["minigrad.tensor"]  # the module (``minigrad.tensor`` is also a function)

__all__ = ["Executor"]

VIEW_OPS = frozenset({"Reshape", "Permute", "BroadcastTo"})  # results that share their input's buffer
_FROM_OUTSIDE = frozenset({"placeholder", "constant", "parameter", "grad"})  # memory the graph does not own
_STRUCTURAL = frozenset({"constant", "parameter", "grad", "getitem", "saved"})  # values looked up, not computed


class Executor:
    """Runs ``graph`` on input tensors: ``Executor(graph).run(inputs)`` returns the output arrays,
    as ``run_graph`` does. ``planned_peak`` is the most bytes of intermediate values alive at once
    (inputs, parameters and constants not counted), ``planned_live`` those bytes at each step, and
    ``planned_total`` what keeping every value to the end (as ``run_graph`` does) holds;
    ``measured_peak`` is set by ``run(..., measure=True)`` when the memory tracker
    (``minigrad.memory.track``) is available."""

    def __init__(self, graph: Graph, parallel: bool = False, max_workers: int | None = None) -> None:
        self.graph, self.parallel, self.max_workers = graph, parallel, max_workers
        self.schedule = [n for n in graph.topological_order() if n.op != "output"]
        self.steps = graph.levels() if parallel else [[n] for n in self.schedule]
        self.steps = [[n for n in level if n.op != "output"] for level in self.steps]
        self.effects = [n for n in self.schedule if n.op in ("copy_", "set_grad")]
        self._keep_ctx = {n for n in self.schedule if any(u.op == "saved" for u in n.users)}
        self._work = self._plan_work()
        self.planned_live = self._plan_memory()
        self.planned_peak = max(self.planned_live, default=0)
        owned = [n for n in self.schedule if n.op not in _FROM_OUTSIDE and n.op not in VIEW_OPS]
        self.planned_total = sum(_nbytes(n) for n in owned)
        self.measured_peak: int | None = None

    # -- running ------------------------------------------------------------------------------------
    def run(self, inputs: Sequence[Tensor], measure: bool = False) -> list[Any]:
        """Execute the graph; returns the output arrays. ``measure=True`` records the measured peak
        of the bytes the run allocates in ``measured_peak`` (None without the memory tracker)."""
        if len(inputs) != len(self.graph.placeholders):
            raise TypeError(f"Executor.run: the graph takes {len(self.graph.placeholders)} input(s), got {len(inputs)}")
        track = _tracker() if measure else None
        if track is None:
            self.measured_peak = None
            return self._run(inputs)
        with track() as mem:
            outputs = self._run(inputs, report=True)
        self.measured_peak = mem.peak - mem.start
        return outputs

    def __call__(self, *inputs: Tensor) -> list[Any]:
        return self.run(inputs)

    def _run(self, inputs: Sequence[Tensor], report: bool = False) -> list[Any]:
        given = dict(zip(self.graph.placeholders, inputs))
        env: dict[Node, Any] = {n: x.data for n, x in given.items()}
        ctxs: dict[Node, Any] = {}
        keep_ctx = self._keep_ctx
        pool = ThreadPoolExecutor(self.max_workers) if self.parallel else None
        try:
            for threaded, inline, structural, frees, ctx_frees in self._work:
                futures = [pool.submit(run_node, n, [env[i] for i in n.inputs]) for n in threaded]
                for n in inline:
                    env[n], ctx = run_node(n, [env[i] for i in n.inputs])
                    if n in keep_ctx:
                        ctxs[n] = ctx
                for n, f in zip(threaded, futures):
                    env[n], ctx = f.result()
                    if n in keep_ctx:
                        ctxs[n] = ctx
                for n in structural:
                    env[n] = _structural_value(n, env, ctxs, given)
                if report and _tensor.memory_hook is not None:
                    for n in (*threaded, *inline, *structural):
                        if n.op not in _FROM_OUTSIDE:
                            _report(env[n])
                for n in frees:  # drop the last references: the buffer can be freed now
                    env.pop(n, None)
                for n in ctx_frees:  # a ctx holds the arrays its op saved
                    ctxs.pop(n, None)
        finally:
            if pool is not None:
                pool.shutdown()
        for node in self.effects:
            target = _target(node.inputs[0], given)
            if node.op == "copy_":
                target.device.xp.copyto(target.data, env[node.inputs[1]], casting="same_kind")
                target._bump_version()
            else:
                target.grad = _wrap(env[node.inputs[1]].copy(), target.device) if len(node.inputs) > 1 else None
        return [env[n] for n in self.graph.outputs]

    # -- planning -------------------------------------------------------------------------------------
    def _last_step(self) -> dict[Node, int]:
        """The step after which each value is no longer needed (values the output or an effect
        reads are needed to the end, past the last step)."""
        step_of = {n: k for k, step in enumerate(self.steps) for n in step}
        end = len(self.steps)
        last = {}
        for n in self.schedule:
            readers = [step_of.get(u, end) if u.op not in ("copy_", "set_grad") else end for u in n.users]
            last[n] = max(readers, default=step_of[n])
        return last

    def _plan_work(self) -> list[tuple]:
        """For each step: the ops for the thread pool, the ops to run here, the structural nodes
        (sources, getitem, saved) to fill in, and the values and ctxs to drop after it."""
        step_of = {n: k for k, step in enumerate(self.steps) for n in step}
        frees: list[list[Node]] = [[] for _ in self.steps]
        ctx_frees: list[list[Node]] = [[] for _ in self.steps]
        for n, k in self._last_step().items():
            if k < len(self.steps):
                frees[k].append(n)
            if n in self._keep_ctx:
                ctx_frees[max(step_of[u] for u in n.users if u.op == "saved")].append(n)
        work = []
        for step, free, ctx_free in zip(self.steps, frees, ctx_frees):
            ops = [n for n in step if not _is_structural(n)]
            # a user Function runs under no_grad, a global flag, so it stays on this thread
            pooled = self.parallel and len(ops) > 1
            threaded = [n for n in ops if pooled and _array_op(n)]
            inline = [n for n in ops if not (pooled and _array_op(n))]
            structural = [n for n in step if n.op in _STRUCTURAL]
            work.append((threaded, inline, structural, free, ctx_free))
        return work

    def _plan_memory(self) -> list[int]:
        """Bytes of intermediate values alive during each step. A buffer is born at the step of
        the op that makes it (a getitem's or saved array's at its op's) and lives until the last
        reader of it, or of any view of it, has run."""
        step_of = {n: k for k, step in enumerate(self.steps) for n in step}
        last = self._last_step()
        owner: dict[Node, Node | None] = {}  # the node whose buffer holds each value (None: not ours)
        born, dies, size = {}, {}, {}
        for n in self.schedule:
            if n.op in _FROM_OUTSIDE or n.op in ("copy_", "set_grad"):
                owner[n] = None
                continue
            if n.op in VIEW_OPS:
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
    return n.op in _FROM_OUTSIDE or n.op in ("getitem", "saved", "copy_", "set_grad")


def _array_op(n: Node) -> bool:
    """A built-in op or a generated kernel: arrays in, array out, no global state touched."""
    return getattr(n.fn, "array_forward", False) or not isinstance(n.fn, type)


def _structural_value(n: Node, env: dict, ctxs: dict, given: dict) -> Any:
    if n.op == "constant":
        return n.attrs["value"]
    if n.op in ("parameter", "grad"):
        return _target(n, given).data
    if n.op == "getitem":
        return env[n.inputs[0]][n.attrs["index"]]
    return _saved_array(ctxs[n.inputs[0]], n)  # a saved array


def _nbytes(n: Node) -> int:
    if n.shape is None or n.dtype is None:
        return 0  # an op returning several arrays: its getitems count them
    return math.prod(n.shape) * getattr(n.dtype, "itemsize", 0)


def _report(value: Any) -> None:
    """Hand a new buffer to the memory tracker, as every new Tensor does."""
    for v in value if type(value) is tuple else (value,):
        if v is not None:
            _tensor.memory_hook(v)


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
