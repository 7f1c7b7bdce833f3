"""``minigrad.compile``: trace a function once, optimise its graph, replay the optimised graph (chapter 03).

It puts chapter 03's pieces together behind one decorator, as ``torch.compile`` does: the tracer
records the first call, the passes (folding, CSE, dead code, fusion into generated kernels)
rewrite the graph, and the ``Executor`` replays it on later calls with the same signature. When a
graph cannot stand in for the function, that signature runs eagerly and a ``CompileWarning`` says why.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable, NamedTuple

from minigrad.amp import is_autocast_enabled
from minigrad.autograd import grad_mode
from minigrad.autograd.mode import active
from minigrad.backend import cpu
from minigrad.errors import TraceError
from minigrad.graph.codegen import check_backend, default_backend
from minigrad.graph.executor import Executor
from minigrad.graph.signature import flatten, positional_names, unflatten
from minigrad.graph.ir import Graph
from minigrad.graph.passes import PassManager, default_passes
from minigrad.graph.passes.fusion import MAX_GROUP_SIZE, fuse_elementwise
from minigrad.graph.passes.horizontal_fusion import fuse_horizontal
from minigrad.graph.passes.update_fusion import fuse_updates
from minigrad.graph.trace import Tracer, TraceWarning
from minigrad.graph.writeback import drop_overwritten_copies
from minigrad._tensor import Tensor, _wrap

__all__ = ["CompileWarning", "CompiledFunction", "compile"]


class CompileWarning(UserWarning):
    """A compiled function runs eagerly for some signature; the message says why."""


def compile(fn: Callable[..., Any] | None = None, *, passes: list | None = None,
            max_group_size: int = MAX_GROUP_SIZE, verbose: bool = False, cache_size_limit: int = 8,
            backend: str | None = None, parallel: bool | str = False) -> Any:
    """Compile ``fn`` (a function of tensors, or a ``Module``, whose forward is then compiled).
    Use as ``compile(fn)``, ``@compile`` or ``@compile(verbose=True)``. ``passes`` replaces the
    default pass list; ``verbose`` prints what each pass changed; after ``cache_size_limit``
    signatures, new ones run eagerly. ``backend`` writes fused CPU kernels in compiled C (``"c"``,
    the default unless ``$MINIGRAD_KERNELS`` says ``"numpy"``) or blocked numpy (``"numpy"``).
    ``parallel`` is the ``Executor``'s: ``"auto"`` runs independent branches on two threads where
    it pays (``minigrad.graph.parallel``), on cuda on two streams.

    The first call with a new input signature (each tensor's shape, dtype, device and
    requires_grad, plus grad mode, autocast and a module's train/eval mode) runs the function for
    real under the tracer, so that call's result is the eager one; later calls with that signature
    replay the optimised graph, whose executor frees every buffer after its last use and computes
    an optimizer's updates straight into the tensors they update (with C kernels, one kernel per
    parameter: ``passes.update_fusion``, and all parameters' in one call: ``passes.horizontal_fusion``).
    As with ``trace``, Python control
    flow is frozen at trace time, and a training step should be compiled after one eager warm-up
    step, so that optimizer state (momentum buffers) exists before the trace. An optimizer's Python
    numbers (learning rate, Adam's step count), which no op sees, are part of the signature: a new
    learning rate traces again, and numbers that change on two calls in a row make the signature
    run eagerly, since a replay would freeze them. A signature runs eagerly, with a ``CompileWarning``
    naming the ops, when op arguments hold traced values as raw arrays, when the function reads a
    traced value out as Python data (``.item()``, ``.numpy()``, ``.tolist()``), when a write cannot be
    replayed, or when outputs require grad outside a traced backward (a replay records no autograd
    graph: compile the whole training step, or run inference under ``no_grad``).
    """
    if fn is None:
        return functools.partial(compile, passes=passes, max_group_size=max_group_size, verbose=verbose,
                                 cache_size_limit=cache_size_limit, backend=backend, parallel=parallel)
    return CompiledFunction(fn, passes, max_group_size, verbose, cache_size_limit, backend, parallel)


_MISSING = object()  # no entry yet for a signature (None: the signature runs eagerly)


class _Entry(NamedTuple):
    graph: Graph
    executor: Executor
    spec: Any


class CompiledFunction:
    """What ``compile`` returns: call it like ``fn``. ``graphs`` maps each signature seen to its
    optimised ``Graph`` (None where it runs eagerly)."""

    def __init__(self, fn: Callable[..., Any], passes: list | None, max_group_size: int, verbose: bool,
                 cache_size_limit: int, backend: str | None = None, parallel: bool | str = False) -> None:
        if parallel not in (False, True, "auto"):  # said now, not at the first call's trace
            raise ValueError(f"compile: parallel must be False, True or 'auto', got {parallel!r}")
        self.fn, self.parallel = fn, parallel
        self.backend = check_backend(backend) if backend is not None else default_backend()
        fuse = (functools.partial(fuse_elementwise, backend=self.backend) if max_group_size == MAX_GROUP_SIZE
                else functools.partial(fuse_elementwise, max_group_size=max_group_size, backend=self.backend))
        merge = ([functools.partial(fuse_updates, backend=self.backend), fuse_horizontal] if self.backend == "c"
                 else [])
        self.passes = passes if passes is not None else default_passes() + [drop_overwritten_copies, fuse] + merge
        self.verbose, self.cache_size_limit = verbose, cache_size_limit
        self._cache: dict[tuple, _Entry | None] = {}
        self._owners: list = []  # optimizers whose Python numbers a traced step read (Optimizer.python_state)
        self._last: dict[tuple, tuple] = {}  # signature -> those numbers at its last call
        self._streak: dict[tuple, int] = {}  # signature -> calls in a row on which they changed
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)
        self.__doc__ = getattr(fn, "__doc__", None)

    @property
    def graphs(self) -> dict[tuple, Graph | None]:
        return {key: entry.graph if entry is not None else None for key, entry in self._cache.items()}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if active(Tracer) is not None:  # inside another trace: let it record the ops themselves
            return self.fn(*args, **kwargs)
        key = self._signature(args, kwargs)
        if key is not None:
            key = self._with_python_state(key)
        entry = self._cache.get(key, _MISSING) if key is not None else None
        if entry is _MISSING:
            if len(self._cache) >= self.cache_size_limit:
                warnings.warn(f"compile: {self.__name__} has been compiled for {len(self._cache)} signatures "
                              f"(cache_size_limit); running this one eagerly", CompileWarning, stacklevel=2)
                return self.fn(*args, **kwargs)
            return self._compile(key, args, kwargs)
        if entry is None:
            return self.fn(*args, **kwargs)
        values = entry.executor.run([a for a in args if isinstance(a, Tensor)])
        outs = iter([_wrap(v, n.meta.get("device", cpu)) for v, n in zip(values, entry.graph.outputs)])
        return unflatten(entry.spec, outs)

    def __getattr__(self, name: str) -> Any:  # a compiled module still answers .parameters(), .eval()...
        if name == "fn":
            raise AttributeError(name)
        return getattr(self.fn, name)

    def __repr__(self) -> str:
        return f"<CompiledFunction {self.__name__}: {len(self._cache)} signature(s)>"

    # -- tracing and optimising ---------------------------------------------------------------------
    def _signature(self, args: tuple, kwargs: dict) -> tuple | None:
        """The cache key of a call; None when an argument cannot be part of one (it runs eagerly)."""
        parts: list[Any] = [grad_mode.is_grad_enabled(), is_autocast_enabled("cpu") or is_autocast_enabled("cuda"),
                            getattr(self.fn, "training", None)]
        for a in args:
            if isinstance(a, Tensor):
                parts.append((tuple(a.shape), str(a.dtype), str(a.device), a.requires_grad))
            else:
                parts.append((type(a), a))  # 2 and 2.0 trace differently
        for k, v in sorted(kwargs.items()):
            if isinstance(v, Tensor):
                return self._eager(f"tensor keyword argument {k!r} (pass tensors positionally)")
            parts.append((k, type(v), v))
        try:
            hash(tuple(parts))
        except TypeError:
            return self._eager("an argument that is not hashable (non-tensor arguments are constants of a signature)")
        return tuple(parts)

    def _with_python_state(self, signature: tuple) -> tuple | None:
        """The cache key: the signature and the Python numbers of the optimizers its steps read (a
        replay would freeze them: a new learning rate traces again). Numbers that change on two
        calls in a row, as Adam's step count does, make the signature run eagerly (None)."""
        state = tuple(o.python_state() for o in self._owners)
        last = self._last.get(signature, state)
        self._last[signature] = state
        streak = self._streak[signature] = self._streak.get(signature, 0) + 1 if state != last else 0
        if streak == 2:
            self._eager(f"the Python numbers {_changed(last, state)} of its {_names(self._owners)} step changed "
                        "on two calls in a row, and a compiled replay would freeze them")
        return None if streak >= 2 else (signature, state)

    def _compile(self, key: tuple, args: tuple, kwargs: dict) -> Any:
        """Run the function under the tracer (its result is this call's), then optimise the graph."""
        tensors = [a for a in args if isinstance(a, Tensor)]
        if len({id(t) for t in tensors}) != len(tensors):
            self._cache[key] = self._eager("the same tensor passed twice")
            return self.fn(*args, **kwargs)

        def call(*ts: Tensor) -> Any:  # non-tensor arguments are constants of this signature
            it = iter(ts)
            return self.fn(*[next(it) if isinstance(a, Tensor) else a for a in args], **kwargs)

        graph = Graph()
        tracer = Tracer(graph)
        for name, t in zip(positional_names(self._callee(), len(args), 0, "input"), args):
            if isinstance(t, Tensor):
                tracer.add_input(t, "%" + name)
        with warnings.catch_warnings(record=True) as caught:  # the tracer's own warnings become one CompileWarning
            warnings.simplefilter("always")
            try:
                with tracer:
                    result = call(*tensors)
            except TraceError:
                self._cache[key] = self._eager("a write the tracer cannot record; later calls run eagerly")
                raise
        for w in caught:
            if not issubclass(w.category, TraceWarning):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        try:
            spec = tracer.finish(result)
        except TraceError as e:
            self._cache[key] = self._eager(str(e))
            return result
        if tracer.frozen:
            ops = sorted({op for op, _ in tracer.frozen})
            self._cache[key] = self._eager(f"{', '.join(ops)} would freeze a traced value ({tracer.frozen[0][1]})")
            return result
        _, flat = flatten(result)
        backward_ran = tracer.fresh_grads or any(n.op == "set_grad" for n in graph)
        if any(t.requires_grad for t in flat) and not backward_ran:
            self._cache[key] = self._eager(
                "its outputs require grad, and a compiled replay records no autograd graph; compile the whole "
                "training step (forward, backward, update) or call it under minigrad.no_grad()")
            return result
        new = [(o, state) for o, state in tracer.python_states if not any(o is known for known in self._owners)]
        if new:  # from now on their numbers are part of the key; this graph holds their values at the trace
            self._owners += [o for o, _ in new]
            key = (key[0], key[1] + tuple(state for _, state in new))
            self._last[key[0]] = key[1]
        graph = PassManager(self.passes, verbose=self.verbose)(graph)
        self._cache[key] = _Entry(graph, Executor(graph, parallel=self.parallel), spec)
        return result

    def _callee(self) -> Callable[..., Any]:
        return getattr(self.fn, "forward", self.fn)

    def _eager(self, why: str) -> None:
        warnings.warn(f"compile: {self.__name__} runs eagerly for this signature: {why}", CompileWarning,
                      stacklevel=4)
        return None


def _names(owners: list) -> str:
    return " and ".join(sorted({type(o).__name__ for o in owners}))


def _changed(old: tuple, new: tuple) -> str:
    """The names of the Python numbers that differ between two ``python_state()`` tuples (as "(lr, step)")."""
    names = set()
    for before, after in zip(old, new):  # one (groups, per-parameter state) per owner
        for part_before, part_after in zip(before, after):
            for items_before, items_after in zip(part_before, part_after):
                names.update(k for (k, v), (k2, v2) in zip(items_before, items_after) if k != k2 or v != v2)
                if len(items_before) != len(items_after):
                    names.update(k for k, _ in items_before + items_after)
    return f"({', '.join(sorted(names))})" if names else "(its state)"

