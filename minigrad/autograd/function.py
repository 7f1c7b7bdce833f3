"""``Function``: one op of the graph, its forward rule and its backward rule (chapter 02).

Applying a Function computes its output and, when grad mode is on and an input requires grad,
records a graph node: the Function instance itself (``ctx``), which becomes the output's
``grad_fn``. A node's in-edges are its ``_edges``, one tuple per input: the node that produced
it (its ``grad_fn``, or an ``AccumulateGrad`` node for a leaf that requires grad), and the
input's shape and dtype; PyTorch's ``next_functions`` shows them as ``(node, output_nr)`` pairs.

A built-in rule is written once, against ``ctx.ops`` (``minigrad.autograd.binding``), which the
engine binds per backward pass: to minigrad's differentiable ops when the pass is recorded
(``create_graph=True``, or any mode on the stack), so that it can be differentiated again, and to
the raw array module when nobody records, so that no Tensor or node is built for a gradient.

User-defined ops are written exactly as in PyTorch::

    class Cube(minigrad.autograd.Function):
        @staticmethod
        def forward(ctx, x):              # x is a Tensor; nothing inside is recorded
            ctx.save_for_backward(x)
            return x * x * x
        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return grad * 3 * x * x

The built-in ops in ``minigrad.ops`` are the same kind of class with two differences that buy
speed: they set ``array_forward = True`` and their ``forward`` receives and returns raw ``xp``
arrays (numpy or cupy), so no Tensor is built for intermediate values; and their ``backward`` is
written against ``ctx.ops`` (``tensor_backward = False``), so it runs on arrays too. A user
Function keeps PyTorch's Tensor semantics under either binding: the engine wraps its gradients. ``apply`` is also where
the modes on the thread's stack (``minigrad.autograd.mode``: anomaly detection, autocast, the
profiler, the memory tracker, the tracer) see each op, before and after it runs.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Any, Callable, Iterator

from minigrad.autograd import grad_mode
from minigrad.autograd.binding import TENSOR_OPS
from minigrad.autograd.grad_mode import is_grad_enabled
from minigrad.autograd.mode import current_modes
from minigrad.backend import cpu, selected
from minigrad.errors import AutogradError, DeviceError, ShapeError
from minigrad.hooks import RemovableHandle, add_hook
from minigrad._tensor import Tensor, _wrap

_FREED = object()  # marks saved tensors released by a backward pass without retain_graph


class Function:
    """Base class of every op and graph node; ``Function.apply(*args)`` runs and records it."""

    array_forward = False  # built-in ops compute on raw arrays; user ops on Tensors
    # the rule reads and returns Tensors under either binding (user Functions, as in PyTorch; the few
    # built-in ops that say why): the engine wraps the gradients for it when nobody records
    tensor_backward = True
    _non_differentiable: tuple = ()  # outputs a user forward marked as having no gradient

    # ctx fields, set by apply (slots keep the per-op cost low; subclasses still get a __dict__, made
    # on the first write of a field that is not a slot, which costs more than all the slot writes):
    # ``ops`` is the binding of ``ctx.ops`` (binding.py), ``TENSOR_OPS`` until the engine binds
    # the node's rule; ``_saved`` is what forward passed to save_for_backward or save_positions,
    # packed by apply, ``None`` when it saved nothing
    __slots__ = (
        "_edges", "needs_input_grad", "device", "xp", "_n_outputs", "_output_meta", "_trace",
        "ops", "_saved", "__weakref__", "__dict__",
    )
    _pre_hooks: OrderedDict | None = None  # hooks on the gradients arriving at this node

    @staticmethod
    def forward(ctx: Function, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("a Function subclass must define a static forward(ctx, *inputs)")

    @staticmethod
    def backward(ctx: Function, *grad_outputs: Tensor) -> Any:
        """The gradients of forward's arguments, given the gradient of each output: the contract
        every backward rule follows (chapter 02).

        ``grad_outputs``: one Tensor per output of forward, of that output's shape (d loss / d
        output). Return one entry per argument of forward, in order (a tuple; a bare value when
        forward took one argument): the gradient of that argument, a Tensor, or ``None`` for an
        argument that is not a Tensor or whose ``ctx.needs_input_grad[i]`` is False. A gradient
        may have the broadcast shape of forward's output: the engine sums it back to the input's
        shape. What forward kept is in ``ctx.saved_tensors`` (Tensors, in ``save_for_backward``'s
        order) and in the attributes forward set on ``ctx``. A user Function gets Tensors and
        builds the gradient from minigrad ops on them. A built-in op's rule (``minigrad.ops``) is
        written once against ``ctx.ops``, with operators and ``ctx.ops`` functions only (never
        ``.array`` or a method only Tensors have): the engine binds it to raw arrays when nobody
        records the backward pass (``g`` and ``ctx.saved_tensors`` are arrays) and to Tensors and
        minigrad's ops when it is recorded, so the same rule is differentiable in turn
        (``create_graph=True``, Hessians). A rule must not change ``g`` or a saved value in place.
        """
        raise NotImplementedError(f"{type(ctx).__name__} does not define backward")

    # -- what forward may call on ctx -----------------------------------------------------------
    def save_for_backward(self, *tensors: Any) -> None:
        """Keep inputs or outputs (or other arrays) for backward; resolved after forward returns."""
        self._saved = list(tensors)  # a list: values to be found among the inputs and outputs

    def save_positions(self, *positions: int | str | None) -> None:
        """Keep forward's inputs by index, or its output (``OUTPUT``), for backward: the built-in
        ops' form of ``save_for_backward``, which says where each value is instead of leaving it
        to be searched for among the inputs and outputs. ``None`` keeps a slot empty, and
        ``(i, operand)`` keeps argument ``i``, a Python number, which the array binding reads as
        ``operand`` instead: the 0-d array of the output's dtype forward computed with, the same
        bits by NEP 50 (a Python float is cast to the array's dtype) on numpy's faster path."""
        self._saved = positions  # a tuple: where each value is (save_for_backward's list says what it is)

    def mark_non_differentiable(self, *outputs: Any) -> None:
        self._non_differentiable = outputs

    @property
    def saved_tensors(self) -> tuple:
        """The tensors given to ``save_for_backward``, checked against in-place modification."""
        saved = self._saved
        if saved is _FREED:
            raise AutogradError(
                f"{self.name()}: trying to backward through the graph a second time (or to read "
                "saved tensors after they were freed); pass retain_graph=True to the first backward"
            )
        if not saved:
            return ()
        arrays = self.ops.arrays  # under the array binding a rule reads arrays
        tensors = []
        for s in saved:  # a loop: cheaper than a comprehension for the one or two entries most ops keep
            if arrays:  # (the commonest entries read here, without _unpack's call)
                kind, value, version = s
                if kind >= SAVED_ARRAY:  # a constant or a Python value: as it was saved
                    tensors.append(value if kind != SAVED_NUMBER else version)  # (a number: its operand)
                    continue
                if kind == SAVED_TENSOR:
                    if version == (value._vc if value._base is None else value._base._vc):
                        tensors.append(value.array)
                        continue
                else:  # an output: its data, unless the output still lives and was changed in place
                    o = value[2]()
                    if o is None or version == (o._vc if o._base is None else o._base._vc):
                        tensors.append(value[0])
                        continue
            tensors.append(_unpack(self, s, arrays))
        return tuple(tensors)

    @property
    def next_functions(self) -> tuple:
        """The in-edges as PyTorch shows them: for each argument of forward, ``(node, output_nr)``,
        or ``None`` where no gradient flows; made from ``_edges`` (``_connect``) when read."""
        return tuple([None if e[0] is None else (e[0], e[1]) for e in self._edges])

    def name(self) -> str:
        return type(self).__name__

    def register_prehook(self, hook: Callable) -> RemovableHandle:
        """Call ``hook(grad_outputs) -> grad_outputs or None`` before this node's backward."""
        if self._pre_hooks is None:
            self._pre_hooks = OrderedDict()
        return add_hook(self._pre_hooks, hook)

    def __repr__(self) -> str:
        return f"<{self.name()}Backward>"

    # -- apply ------------------------------------------------------------------------------------
    @classmethod
    def apply(cls, *args: Any, **kwargs: Any) -> Any:
        # One frame does an op's whole bookkeeping (inputs, forward, outputs, the node): on a small
        # tensor that bookkeeping is the op's cost, and every call made here is paid on every op.
        stack = current_modes()  # the modes on (minigrad.autograd.mode): empty unless one is entered
        if stack:
            for m in reversed(stack):
                if m.runs_ops:  # vmap: an op on batched tensors runs once, by its batching rule
                    out = m.run_op(cls, args, kwargs)
                    if out is not NotImplemented:
                        return out
            for m in reversed(stack):
                args = m.before_op(cls, args)
        ctx = object.__new__(cls)
        ctx.ops, ctx._saved = TENSOR_OPS, None
        device = None
        requires_grad = False
        arrays = []
        for a in args:
            if isinstance(a, Tensor):
                if device is None:
                    device = a.device
                elif a.device is not device:
                    raise DeviceError(
                        f"{cls.__name__}: expected all tensors on the same device, got {device} and {a.device}"
                    )
                if a.requires_grad:
                    requires_grad = True
                arrays.append(a.array)
            else:
                arrays.append(a)
        if device is None:
            device = cpu
        ctx.device = device
        xp = ctx.xp = device.xp
        record = requires_grad and is_grad_enabled()
        if record:
            _connect(ctx, args)
        else:
            ctx.needs_input_grad = _NONE_NEEDED[len(args)] if len(args) < 8 else (False,) * len(args)

        # cupy allocates and launches on the *current* GPU, which need not be the inputs' one:
        # an op on cuda:1 selects cuda:1 for its forward (and the engine for its backward). The
        # cpu has nothing to select, and skips the context manager (it costs two calls per op).
        gpu = selected(device) if device.type == "cuda" else None
        if gpu is not None:
            gpu.__enter__()
        try:
            if cls.array_forward:
                try:  # (a call without ** when there are no keywords: it costs a dict less)
                    out = cls.forward(ctx, *arrays, **kwargs) if kwargs else cls.forward(ctx, *arrays)
                except ValueError as e:
                    shapes = ", ".join(str(tuple(a.shape)) for a in args if isinstance(a, Tensor))
                    raise ShapeError(f"{cls.__name__}: {e} (input shapes: {shapes})") from None
                ndarray = xp.ndarray  # numpy reduces to a scalar; a tensor always holds an array
                if type(out) is tuple:
                    outputs = tuple([_wrap(o if type(o) is ndarray else xp.asarray(o), device, stack) for o in out])
                else:  # (_wrap's lines, here: the call costs more than the writes it makes)
                    outputs = object.__new__(Tensor)
                    outputs.array, outputs.device = out if type(out) is ndarray else xp.asarray(out), device
                    outputs.requires_grad, outputs.grad, outputs.grad_fn = False, None, None
                    outputs._output_nr, outputs._vc, outputs._base, outputs._accum, outputs._hooks = 0, 0, None, None, None
                    for m in stack:  # the memory tracker counts the new array
                        m.new_array(outputs.array)
            else:
                with grad_mode.no_grad():
                    outputs = out = cls.forward(ctx, *args, **kwargs)
                if type(outputs) is tuple:
                    outputs = tuple([_fresh_output(o, args) for o in outputs])
                else:
                    outputs = _fresh_output(outputs, args)
        finally:
            if gpu is not None:
                gpu.__exit__(None, None, None)

        if record:  # the node becomes the grad_fn of its (floating) outputs and packs what it saved
            if type(outputs) is tuple:
                _attach_several(ctx, outputs)
                if ctx._saved:
                    _pack_saved(ctx, args, arrays, outputs, out, stack)
            else:
                ctx._n_outputs = 1
                if outputs.array.dtype.kind == "f" and not ctx._non_differentiable:
                    outputs.requires_grad = True
                    outputs.grad_fn = ctx
                saved = ctx._saved
                if saved:  # (positions, the built-in ops' form, are packed by the leaner call)
                    if type(saved) is tuple and not stack:
                        ctx._saved = _pack_positions(saved, args, arrays, outputs, out)
                    else:
                        _pack_saved(ctx, args, arrays, (outputs,), (out,), stack)
        if stack:  # (here, in apply's frame: the profiler pairs before_op and after_op by their caller)
            for m in stack:
                m.after_op(ctx, args, kwargs, outputs)
        return outputs


_NONE_NEEDED = [(False,) * n for n in range(8)]
NO_EDGE = (None, 0, None, None)  # the _edges entry of an argument that is not a Tensor (_connect)


class AccumulateGrad(Function):
    """The node at a leaf that requires grad: the engine adds the incoming gradient to ``.grad``."""

    __slots__ = ("variable",)

    def name(self) -> str:
        return "AccumulateGrad"

    def __repr__(self) -> str:
        return "<AccumulateGrad>"


# ---------------------------------------------------------------------------------------------
def _fresh_output(out: Any, args: tuple) -> Any:
    """A user forward may return an input as is; the output must be a new Tensor of its own, a
    view of that input (as in PyTorch): one memory, one version counter, so an in-place write
    through either is seen by the check of tensors saved for backward."""
    if not isinstance(out, Tensor):
        return out
    if any(out is a for a in args):
        return out.detach()
    return out


def _accumulator(t: Tensor) -> AccumulateGrad:
    """The leaf's AccumulateGrad node, shared by every use of the leaf (the leaf holds it weakly)."""
    node = t._accum() if t._accum is not None else None
    if node is None:
        node = object.__new__(AccumulateGrad)
        node.variable, node.ops, node._saved = t, TENSOR_OPS, None
        node._edges = ()
        node._n_outputs = 1
        t._accum = weakref.ref(node)
    return node


def _connect(ctx: Function, args: tuple) -> None:
    """Record the node's in-edges: for each input, the node that produced it (its grad_fn, or
    its leaf's AccumulateGrad), plus its shape and dtype so gradients can be checked against them.

    ``args`` are forward's arguments, Tensors or not (a dim, a shape, a Python number). Set two
    tuples on ``ctx``, each with one entry per argument, in order:

    - ``ctx._edges``: one tuple per argument, ``(node, output_nr, shape, dtype)``, where ``shape``
      and ``dtype`` are ``a.array``'s (the engine sums a broadcast gradient back to that shape and
      casts it to that dtype): ``(a.grad_fn, a._output_nr, ...)`` for a Tensor an op made;
      ``(_accumulator(a), 0, ...)`` for a leaf that requires grad (one node per leaf, shared by all
      its uses); ``(None, 0, ...)`` for a Tensor that needs no gradient (no edge, but
      ``graph.viz`` still draws the constant with its shape); ``NO_EDGE``, ``(None, 0, None,
      None)``, for every other argument;
    - ``ctx.needs_input_grad``: ``a.requires_grad`` for a Tensor, False otherwise.

    One tuple per edge holds what three parallel tuples per op used to (the in-edges, the inputs'
    shapes and dtypes, and PyTorch's ``next_functions``), so recording an op builds fewer objects:
    ``ctx.next_functions``, PyTorch's ``(node, output_nr)`` pairs (``None`` where no gradient
    flows), is made from ``_edges`` when someone reads it. The engine walks ``_edges``,
    ``graph.viz`` draws them and the backward rules read ``needs_input_grad``; both are checked
    on tensors, leaves, constants and non-tensor arguments.
    """
    ### BEGIN SOLUTION chapter 01: Function.apply records the in-edges
    needs, edges = [], []
    for a in args:
        if isinstance(a, Tensor):
            shape, dtype = a.array.shape, a.array.dtype
            if a.grad_fn is not None:
                edges.append((a.grad_fn, a._output_nr, shape, dtype))
            elif a.requires_grad:
                edges.append((_accumulator(a), 0, shape, dtype))
            else:
                edges.append((None, 0, shape, dtype))
            needs.append(a.requires_grad)
        else:
            edges.append(NO_EDGE)
            needs.append(False)
    ctx._edges = tuple(edges)
    ctx.needs_input_grad = tuple(needs)
    ### END SOLUTION


def _attach_several(ctx: Function, outputs: tuple) -> None:
    """Make the node the grad_fn of each of its floating outputs, numbered, except the ones forward
    marked non-differentiable."""
    non_diff = ctx._non_differentiable
    ctx._n_outputs = len(outputs)
    ctx._output_meta = tuple([(o.array.shape, o.array.dtype) for o in outputs])
    for i, o in enumerate(outputs):
        if isinstance(o, Tensor) and o.array.dtype.kind == "f" and not any(o is n for n in non_diff):
            o.requires_grad, o.grad_fn, o._output_nr = True, ctx, i


def _pack_saved(ctx: Function, args: tuple, arrays: list, out_list: tuple, raw_list: tuple, stack: tuple) -> None:
    """Turn what forward saved into saved entries (``raw_list`` is what forward returned, which it
    may have saved before it became ``out_list``'s Tensors)."""
    saved = ctx._saved
    if type(saved) is tuple:  # declared by position (save_positions): nothing to search
        ctx._saved = packed = _pack_positions(saved, args, arrays, out_list, raw_list, several=True)
    else:
        packed = []
        for x in saved:  # plain loops: on this path, zip() and comprehensions cost more than the work
            packed.append(_pack(x, args, arrays, out_list, raw_list))
        ctx._saved = packed = tuple(packed)
    if stack:  # a constant kept for backward (a mask, im2col columns) is memory, and a traced value
        for k, (kind, value, _) in enumerate(packed):
            if kind == SAVED_ARRAY:
                for m in stack:
                    m.saved_array(ctx, k, value)


def _pack_positions(positions: tuple, args: tuple, arrays: list, outputs: Any, raws: Any,
                    several: bool = False) -> tuple:
    """The saved entries of a forward that said where its values are (``save_positions``): forward's
    arguments by index, its (first) output as ``OUTPUT``; nothing is searched for but an argument
    that is neither a Tensor nor a plain Python value. ``outputs`` and ``raws`` are forward's
    output and what it returned, or tuples of them when ``several``."""
    kept = None
    if OUTPUT in positions:  # kept as its data and a weak reference (the node must not keep it alive)
        o = outputs[0] if several else outputs
        kept = (SAVED_OUTPUT, (o.array, 0, weakref.ref(o)), o._vc if o._base is None else o._base._vc)
        if len(positions) == 1:  # an elementwise op keeping its result, the commonest: no loop
            return (kept,)
    packed = []
    for p in positions:  # (a tensor's version read inline: the _version property costs a call)
        if p is OUTPUT:
            packed.append(kept)
        elif p is None:
            packed.append(_NOTHING)
        elif type(p) is tuple:  # a number, and the operand array the array binding reads instead
            packed.append((SAVED_NUMBER, args[p[0]], p[1]))
        else:
            a = args[p]
            if isinstance(a, Tensor):
                packed.append((SAVED_TENSOR, a, a._vc if a._base is None else a._base._vc))
            elif a is None or type(a) in _PLAIN:  # (what _pack would find, without its call)
                packed.append((SAVED_VALUE, a, 0))
            else:
                outs, rs = (outputs, raws) if several else ((outputs,), (raws,))
                packed.append(_pack(a, args, arrays, outs, rs))
    return tuple(packed)


# A saved entry is (kind, value, version), of one of five kinds: a tensor kept as is (an input); an
# output of this node, kept as its data plus a weak reference (so the node does not keep its output
# alive); a constant array (no gradient flows through it); a plain Python value; a Python number
# whose third field is not a version but the operand array the array binding reads in its place.
SAVED_TENSOR, SAVED_OUTPUT, SAVED_ARRAY, SAVED_VALUE, SAVED_NUMBER = 0, 1, 2, 3, 4
_PLAIN = (int, float, bool, tuple)  # plain Python values forward often keeps
_NOTHING = (SAVED_VALUE, None, 0)
OUTPUT = "output"  # what save_positions names forward's output by (its first, when it returns several)


def saved_entries(fn: Function) -> Iterator[tuple[int, Any]]:
    """``(kind, value)`` for each entry ``fn`` keeps for backward, once packed: none while its
    forward runs (or after it failed) and none after a backward freed them."""
    if type(fn._saved) is tuple:
        for entry in fn._saved:
            if type(entry) is tuple and len(entry) == 3:
                yield entry[0], entry[1]


def _pack(s: Any, args: tuple, arrays: list, outputs: tuple, raws: tuple) -> Any:
    if s is None or type(s) in _PLAIN or not hasattr(s, "shape"):  # a Python value (hasattr is slow on those)
        return (SAVED_VALUE, s, 0)
    i = 0
    for arr in arrays:  # an input: kept as its tensor
        if s is arr or s is args[i]:
            a = args[i]
            if isinstance(a, Tensor):
                return (SAVED_TENSOR, a, a._version)
        i += 1
    i = 0
    for o in outputs:  # an output: kept as its array and a weak reference
        if s is o or s is o.array or s is raws[i]:
            return (SAVED_OUTPUT, (o.array, i, weakref.ref(o)), o._version)
        i += 1
    if isinstance(s, Tensor):
        return (SAVED_TENSOR, s, s._version)
    return (SAVED_ARRAY, s, 0)


def _unpack(ctx: Function, entry: Any, arrays: bool = False) -> Any:
    """A saved entry as the rule reads it: a Tensor, or its array under the array binding."""
    kind, value, version = entry
    if kind >= SAVED_VALUE:  # a Python value (a number's operand array is for the fast path above)
        return value
    if kind == SAVED_ARRAY:
        return value if arrays else _wrap(value, ctx.device)
    if kind == SAVED_TENSOR:
        current, t = value._version, value
        if arrays and current == version:
            return value.array
    else:
        data, nr, ref = value
        o = ref()
        current = o._version if o is not None else version
        if arrays and current == version:
            return data
        t = _wrap(data, ctx.device)
        t.requires_grad, t.grad_fn, t._output_nr = True, ctx, nr
    if current != version:
        raise AutogradError(
            f"{ctx.name()}: a tensor of shape {tuple(t.shape)} saved for backward was modified by an "
            f"in-place operation (its version is {current}, expected {version}); use an out-of-place "
            "op (x = x + 1 instead of x += 1) or .clone() it first"
        )
    return t
