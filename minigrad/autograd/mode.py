"""Modes: everything that watches or changes ops as they run, on one stack per thread (chapters 02, 03).

Anomaly detection, autocast, the profiler, the memory tracker and the tracer are all ``Mode``s, as
PyTorch's dispatch modes are: entered with ``with``, kept on a stack of the current thread, and
told about each op by ``Function.apply`` (``before_op`` may rewrite its arguments, ``after_op``
sees its outputs, and a mode that ``runs_ops``, as vmap's does, may run the op itself, and also the
two core calls that are not one op: a random draw and an index by tensors), about each backward rule by the engine (``node_backward``), and about the few
things the core does besides running ops (a new array, an array saved for backward, an in-place
write, a fresh ``.grad``, an optimizer about to read its Python numbers, a tensor's values read
out as Python data by ``.item()``, ``.numpy()`` or ``.tolist()``). With the stack empty an
op pays one read of ``current_modes()``: modes cost nothing unless they are on. The thread's
other depths are kept here too: how many backward passes run (``is_backward_running``), the
backward depth at which ops compute forward values (``in_forward``: checkpointing's
``recomputation`` runs forward inside backward), and how many ``minigrad.func`` transforms run.
All are context variables, which every thread has its own of (and which cost a third of a
``threading.local`` attribute to read).
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any, Callable, TypeVar

M = TypeVar("M", bound="Mode")
_stack: ContextVar[tuple[Mode, ...]] = ContextVar("minigrad_modes", default=())
_backward_depth: ContextVar[int] = ContextVar("minigrad_backward_depth", default=0)
current_modes = _stack.get  # () -> this thread's modes, outermost first; Function.apply calls it on every op
backward_depth = _backward_depth.get  # () -> how many backward passes run on this thread, one inside another
_forward_depth: ContextVar[int] = ContextVar("minigrad_forward_depth", default=0)
_transform_depth: ContextVar[int] = ContextVar("minigrad_transform_depth", default=0)
transform_depth = _transform_depth.get  # () -> how many minigrad.func transforms run on this thread


class Mode:
    """A mode does nothing until it overrides a hook. ``before_op`` hooks run from the innermost
    mode out, ``after_op`` hooks from the outermost in, so the innermost mode wraps the op closest
    (ops a hook runs itself, such as autocast's casts, pass through the whole stack too).
    ``sees_writes`` asks in-place arithmetic to take the path that reports its writes;
    ``casts_inputs`` says that ``before_op`` may change input dtypes (ops then leave a dtype
    mismatch to it)."""

    sees_writes = False
    casts_inputs = False
    runs_ops = False  # run_op is asked first, innermost mode first (vmap's batching rules)

    def __enter__(self: M) -> M:
        push(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        pop(self)

    # -- around each op (Function.apply) ----------------------------------------------------------
    def run_op(self, cls: type, args: tuple, kwargs: dict) -> Any:
        """The op's outputs, computed another way, or ``NotImplemented`` to let it run as usual."""
        return NotImplemented

    def before_op(self, cls: type, args: tuple) -> tuple:
        return args

    def after_op(self, ctx: Any, args: tuple, kwargs: dict, outputs: Any) -> None:
        pass

    # -- core calls that are not one op (asked of the modes that run ops, innermost first) ------------
    def random_call(self, name: str, call: Callable[..., Any], args: tuple, fills: bool) -> Any:
        """``call(*args)``, the random function ``name`` of the core (a factory such as ``randn``,
        ``multinomial``; with ``fills``, an in-place fill of ``args[0]`` such as ``nn.init.normal_``),
        computed another way, or ``NotImplemented`` to let it run as usual."""
        return NotImplemented

    def index_by_tensors(self, fn: Callable[..., Any], x: Any, index: Any, rest: tuple) -> Any:
        """``fn(x, index, *rest)``, a read (``getitem``, no ``rest``) or a write (``index_put``, the
        value in ``rest``) at an index that holds tensors, computed another way (``fn`` takes any
        other index), or ``NotImplemented`` to let it run as usual."""
        return NotImplemented

    # -- in backward (the engine) -------------------------------------------------------------------
    def node_backward(self, node: Any, grads: tuple) -> None:
        """A node's backward rule returned ``grads`` (one per forward input)."""

    # -- events from the core -----------------------------------------------------------------------
    def new_array(self, array: Any) -> None:
        """A new Tensor wraps ``array`` (or an op kept ``array`` for backward)."""

    def saved_array(self, ctx: Any, index: int, array: Any) -> None:
        """Op node ``ctx`` kept a constant ``array`` for backward (a mask) at ``index`` of its saved values."""

    def inplace_write(self, t: Any, result: Any) -> None:
        """``t`` now holds ``result``'s values (an in-place op wrote them)."""

    def fresh_grad(self, leaf: Any, grad: Any, value: Any) -> None:
        """The engine gave ``leaf`` its first ``.grad``: ``grad``, holding ``value``'s values."""

    def reads_python_state(self, owner: Any) -> None:
        """A step is about to read ``owner``'s Python numbers (``owner.python_state()``: an
        optimizer's learning rate, Adam's step count), which no op sees."""

    def reads_values(self, t: Any, how: str) -> None:
        """``t``'s values leave the ops as Python data or a raw array (``how``: ``item()``,
        ``numpy()``, ``tolist()``), which no op sees: what is computed from them is not recorded."""


def push(mode: Mode) -> None:
    _stack.set(_stack.get() + (mode,))


def pop(mode: Mode) -> None:
    """Take ``mode`` off this thread's stack (the innermost entry of it, wherever it is)."""
    stack = _stack.get()
    for i in range(len(stack) - 1, -1, -1):
        if stack[i] is mode:
            _stack.set(stack[:i] + stack[i + 1:])
            return


def active(kind: type[M]) -> M | None:
    """The innermost mode of type ``kind`` on this thread's stack, if any."""
    for m in reversed(_stack.get()):
        if isinstance(m, kind):
            return m
    return None


def is_backward_running() -> bool:
    """Whether the engine is running a backward pass on this thread (ops now are backward rules)."""
    return _backward_depth.get() > 0


class backward_pass:
    """What the engine wraps a backward pass in (ops run inside it are backward rules)."""

    def __enter__(self) -> None:
        self.token = _backward_depth.set(_backward_depth.get() + 1)

    def __exit__(self, *exc: Any) -> None:
        _backward_depth.reset(self.token)


def in_forward() -> bool:
    """Whether ops on this thread compute forward values (activations): no backward pass runs, or
    a ``recomputation`` inside the innermost one does."""
    return _backward_depth.get() == _forward_depth.get()


class recomputation:
    """Count what ops make in this block as forward values although backward is running:
    checkpointing recomputes a segment's forward pass inside the backward pass."""

    def __enter__(self) -> None:
        self.token = _forward_depth.set(_backward_depth.get())

    def __exit__(self, *exc: Any) -> None:
        _forward_depth.reset(self.token)


class transform:
    """What a ``minigrad.func`` transform runs inside (``transform_depth`` counts them)."""

    def __enter__(self) -> None:
        self.token = _transform_depth.set(_transform_depth.get() + 1)

    def __exit__(self, *exc: Any) -> None:
        _transform_depth.reset(self.token)


def random_call(name: str, call: Callable[..., Any], args: tuple = (), fills: bool = False) -> Any:
    """``call(*args)``, a random function of the core, as the modes that run ops want it (a vmap
    refuses it, draws once for the batch, or draws for each example: ``Mode.random_call``)."""
    for m in reversed(_stack.get()):
        if m.runs_ops:
            out = m.random_call(name, call, args, fills)
            if out is not NotImplemented:
                return out
    return call(*args)


def index_by_tensors(fn: Callable[..., Any], x: Any, index: Any, *rest: Any) -> Any:
    """``fn(x, index, *rest)`` (an index holding tensors) as a mode that runs ops computes it, or
    ``NotImplemented`` when none does (``Mode.index_by_tensors``)."""
    for m in reversed(_stack.get()):
        if m.runs_ops:
            out = m.index_by_tensors(fn, x, index, rest)
            if out is not NotImplemented:
                return out
    return NotImplemented


def new_array(array: Any) -> None:
    for m in _stack.get():
        m.new_array(array)


def inplace_write(t: Any, result: Any) -> None:
    for m in _stack.get():
        m.inplace_write(t, result)


def reads_python_state(owner: Any) -> None:
    for m in _stack.get():
        m.reads_python_state(owner)


def reads_values(t: Any, how: str) -> None:
    for m in _stack.get():
        m.reads_values(t, how)


def sees_writes() -> bool:
    return any(m.sees_writes for m in _stack.get())


def casts_inputs() -> bool:
    return any(m.casts_inputs for m in _stack.get())
