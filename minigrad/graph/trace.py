"""Tracing: run a function once, record every op it applies, then replay the record (chapter 01).

This is the static half of chapter 01's dynamic-vs-static story. While ``trace`` runs ``fn``, a
``Tracer`` on the thread's mode stack (``minigrad.autograd.mode``) turns each op, each array an op
saves, each in-place write and each fresh ``.grad`` into nodes of a ``Graph``; the
``TracedFunction`` replays that graph with the interpreter (``minigrad.graph.interpret``): no
Python control flow, no autograd graph. Because backward is made of minigrad ops, a whole
training step (forward, ``loss.backward()``, optimizer update) traces into one graph.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable, NamedTuple, Sequence

from minigrad import backend
from minigrad.autograd.mode import Mode, active
from minigrad.backend import cpu
from minigrad.errors import DeviceError, DTypeError, ShapeError, TraceError
from minigrad.graph.signature import flatten, positional_names, unflatten
from minigrad.graph.interpret import ARRAY_ARG, TENSOR_ARG, run_graph, run_node
from minigrad.graph.ir import SOURCE_OPS, Graph, Node
from minigrad._tensor import Tensor, _wrap
from minigrad.protocols import is_parameter

__all__ = ["ARRAY_ARG", "TENSOR_ARG", "TraceError", "TraceWarning", "TracedFunction", "Tracer", "run_graph",
           "run_node", "trace"]


class TraceWarning(UserWarning):
    """A traced value that the graph freezes although it may differ at the next call."""


def trace(fn: Callable[..., Any], *example_inputs: Tensor) -> TracedFunction:
    """Run ``fn(*example_inputs)`` once, for real, recording its ops; return a callable that
    replays them on new inputs of the same shapes and dtypes (``Tracer`` says what becomes which node).

    A branch taken at trace time is baked in. What a trace cannot capture: Python values read from
    tensors (``if x.sum() > 0``, ``loss.item()``) or kept outside them (Adam's step count and bias
    corrections), which are baked in as constants (``.item()``, ``.numpy()`` and ``.tolist()`` of a
    value computed from the inputs or parameters warn, naming the call); arrays computed outside ops (random masks drawn
    with the device RNG, arrays built from ``tensor.array`` and passed to an op), which become
    constants; writes that bypass ops (``t[i] = v`` under ``no_grad``, ``fill_``/``zero_``) and
    writes through a view whose base is read again (or is an input), which raise ``TraceError``
    once ``fn`` has returned; and state created during the trace (an optimizer's first momentum
    buffer), which a replay re-creates instead of keeping: trace a training step after one eager
    warm-up step. Views themselves replay as in eager: one taken before a write into its memory
    reads the new values.
    """
    for i, x in enumerate(example_inputs):
        if not isinstance(x, Tensor):
            raise TypeError(f"trace: example input {i} must be a Tensor, got {type(x).__name__}")
    if len({id(x) for x in example_inputs}) != len(example_inputs):
        raise TraceError("trace: pass a distinct tensor for each input (the same tensor was given twice)")
    if active(Tracer) is not None:
        raise TraceError("trace: already tracing; traces cannot nest")
    tracer = Tracer(Graph())
    for name, x in zip(positional_names(fn, len(example_inputs), 0, "input"), example_inputs):
        tracer.add_input(x, "%" + name)
    with tracer:
        result = fn(*example_inputs)
    spec = tracer.finish(result)
    traced = TracedFunction(tracer.graph, spec, [(x.shape, x.dtype, x.device) for x in example_inputs],
                            getattr(fn, "__name__", "fn"))
    traced.values_read = tracer.values_read
    return traced


class TracedFunction:
    """A recorded function: ``.graph`` is the IR; calling it replays the graph, recording no
    autograd graph (its outputs do not require grad; a traced backward is already in the graph)."""

    def __init__(self, graph: Graph, spec: Any, signature: list[tuple], name: str) -> None:
        self.graph, self._spec, self._signature, self.__name__ = graph, spec, signature, name
        self.values_read: list[tuple[str, Node]] = []  # (``item()``..., the node read) during the trace

    def __call__(self, *inputs: Tensor) -> Any:
        self._check(inputs)
        if active(Tracer) is not None:
            raise TraceError(f"traced {self.__name__}: cannot replay while another trace is recording; "
                             "call the original function instead")
        values = run_graph(self.graph, inputs)
        outs = iter([_wrap(v, n.meta.get("device", cpu)) for v, n in zip(values, self.graph.outputs)])
        return unflatten(self._spec, outs)

    def _check(self, inputs: Sequence[Any]) -> None:
        name = self.__name__
        if len(inputs) != len(self._signature):
            raise TypeError(f"traced {name}: expected {len(self._signature)} input(s), got {len(inputs)}")
        for i, (x, (shape, dtype, device)) in enumerate(zip(inputs, self._signature)):
            if not isinstance(x, Tensor):
                raise TypeError(f"traced {name}: input {i} must be a Tensor, got {type(x).__name__}")
            if x.shape != shape:
                raise ShapeError(f"traced {name}: input {i} was traced with shape {tuple(shape)}, got shape "
                                 f"{tuple(x.shape)}; trace again for new shapes")
            if x.dtype != dtype:
                raise DTypeError(f"traced {name}: input {i} was traced with dtype {dtype}, got {x.dtype}")
            if x.device is not device:
                raise DeviceError(f"traced {name}: input {i} was traced on {device}, got a tensor on {x.device}")

    def __repr__(self) -> str:
        return f"<TracedFunction {self.__name__}: {len(self.graph)} nodes>"


# -- recording -----------------------------------------------------------------------------------
class Tracer(Mode):
    """The mode that turns the ops run while it is on into nodes of ``graph``:

    - the example inputs become ``placeholder`` nodes, given anew at every call;
    - leaves that require grad (parameters) become ``parameter`` nodes, read when the graph runs,
      so a replay sees their current values; so do tensors the function updates in place
      (buffers, optimizer state); every other tensor from outside the function is a ``constant``
      (its array is kept as it was, not copied);
    - in-place writes to such tensors become ``copy_`` nodes, and changes of a leaf's ``.grad``
      become ``set_grad`` nodes; a replay applies them, in order, after computing every value;
    - a view shares its base's memory, so a write into that memory (through the base or any view
      of it) changes the view too: read again, the view becomes its view op once more, applied to
      the current value of what it views (``_reread``); tensors on the very same array
      (``t.detach()``, ``t.data``) take the written value at once;
    - arrays an op saved for its backward (a ReLU mask) become ``saved`` nodes of that op.

    ``frozen`` lists (op name, message) for each op argument that froze a traced value, and
    (``item()``/``numpy()``/``tolist()``, message) for each traced value read out as Python data,
    which ``values_read`` also lists with the node read;
    ``fresh_grads`` counts the ``.grad``s the engine set (a backward pass ran); ``python_states``
    lists (owner, its ``python_state()`` then) for each optimizer whose step read its Python numbers;
    ``refused`` says why the graph cannot stand in for the function (a write it cannot replay),
    which ``finish`` raises as a ``TraceError`` once the function has run to its end.
    """

    sees_writes = True  # in-place arithmetic must report its writes, to be replayed

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.frozen: list[tuple[str, str]] = []
        self.values_read: list[tuple[str, Node]] = []
        self.fresh_grads = 0
        self.python_states: list[tuple[Any, Any]] = []
        self.refused: str | None = None
        self._bound: dict[int, _Binding] = {}
        self._arrays: dict[int, Any] = {}  # id(array) -> the tensor holding it, its node, or (op node, k, array) if an op saved it
        self._holders: dict[int, dict[int, Tensor]] = {}  # id(array) -> the bound tensors holding it (t, t.detach(), t.data)
        self._sharing: dict[int, dict[int, Tensor]] = {}  # id(memory's owner array) -> the bound tensors showing it
        self._uncounted: dict[int, int] = {}  # id(root) -> writes into its memory that its version counter missed
        self._home: dict[int, tuple[Tensor, Node]] = {}  # tensors from outside fn -> their source node
        self._leaves: dict[int, tuple[Tensor, Node, Tensor | None]] = {}  # (leaf, node, .grad at start)
        self._saved: dict[tuple[Node, int], Node] = {}
        self._kept: dict[Any, list[tuple[int, Any]]] = {}  # ctx -> the arrays it saved, until after_op
        self._alive: list = []  # every tensor and array seen stays alive, so no id() is reused

    # -- the mode's hooks -----------------------------------------------------------------------------
    def saved_array(self, ctx: Any, index: int, array: Any) -> None:
        self._kept.setdefault(ctx, []).append((index, array))

    def after_op(self, ctx: Any, args: tuple, kwargs: dict, outputs: Any) -> None:
        """Record the op ``ctx`` ran as a node (and a ``getitem`` node per output of a tuple)."""
        cls = type(ctx)
        inputs, layout, attrs, device = [], [], {}, None
        for name, a in zip(_param_names(cls, len(args)), args):
            if isinstance(a, Tensor):
                inputs.append(self.node_of(a))
                layout.append(TENSOR_ARG)
                device = a.device if device is None else device
            elif _is_array(a):
                inputs.append(self._array_node(a))
                layout.append(ARRAY_ARG)
            else:
                self._warn_if_frozen(cls, a)
                attrs[name] = a
                layout.append(name)
        attrs.update(kwargs)
        meta = {"args": tuple(layout), "kwargs": tuple(kwargs), "ctx_device": device or cpu,
                "needs_input_grad": ctx.needs_input_grad}
        add = self.graph.add_node
        roots = tuple((_root(a), self._stamp(a)) for a in args if isinstance(a, Tensor))
        if type(outputs) is tuple:  # (unbind's outputs become views of its input after apply)
            node = add(cls.__name__, inputs, attrs, fn=cls, meta=meta)
            for i, o in enumerate(outputs):
                if isinstance(o, Tensor):
                    part = add("getitem", [node], {"index": i}, shape=o.shape, dtype=o.dtype, meta={"device": o.device})
                    self._bind(o, part, _Made(part, (), roots))
        else:
            meta["device"] = outputs.device
            node = add(cls.__name__, inputs, attrs, shape=outputs.shape, dtype=outputs.dtype, fn=cls, meta=meta)
            self._bind(outputs, node, _Made(node, args, roots))
        for k, value in self._kept.pop(ctx, ()):  # arrays forward computed and kept for backward
            self._alive.append(value)
            self._arrays.setdefault(id(value), (node, k, value))

    def fresh_grad(self, leaf: Tensor, grad: Tensor, value: Tensor) -> None:
        """A leaf's first ``.grad``: the engine's copy of ``value`` reads ``value``'s node."""
        self.fresh_grads += 1
        if grad is not value:
            self._alive.append(grad)
            self._bind(grad, self.node_of(value))

    def reads_values(self, t: Tensor, how: str) -> None:
        """A value computed from the inputs or parameters read out as Python data: the graph
        holds what follows as constants of this trace (``values_read``; compile runs eagerly)."""
        if id(t) not in self._bound:  # never an op's input or output: a constant of the function
            return
        node = self.node_of(t)
        seen, stack = {node}, [node]  # computed from constants only, it is the same at every call
        while stack:
            n = stack.pop()
            if not n.inputs and n.op != "constant":
                break
            stack += [i for i in n.inputs if i not in seen]
            seen.update(n.inputs)
        else:
            return
        self.values_read.append((how, node))
        message = (f"trace: {how} reads the value of {node.name} ({node.op}) as Python data; the graph freezes "
                   "what is computed from it, so replays reuse its value from trace time")
        self.frozen.append((how, message))
        warnings.warn(message, TraceWarning, stacklevel=4)  # points at the caller of .item()

    def reads_python_state(self, owner: Any) -> None:
        if not any(o is owner for o, _ in self.python_states):
            self.python_states.append((owner, owner.python_state()))

    def inplace_write(self, t: Tensor, result: Tensor) -> None:
        """``t`` now holds ``result``'s values: later reads of ``t`` read that node, and when ``t``
        comes from outside the function, a ``copy_`` node writes the value back at replay."""
        value = self.node_of(result)
        if id(t) not in self._bound:
            self._bind(t, self._source_node(t))
        for r in self._roots_sharing(t):
            if r is not _root(t):  # a version counter that this write did not bump
                self._uncounted[id(r)] = self._uncounted.get(id(r), 0) + 1
        holders = self._holders[id(t.array)]  # t, and tensors on the very same array (t.detach(), t.data)
        home = next((self._home[i] for i in holders if i in self._home), None)
        if home is None and self._bound[id(t)].node.op in SOURCE_OPS:  # a tensor on an array first seen raw
            home = self._home[id(t)] = (t, self._bound[id(t)].node)
        if home is not None:
            target = home[1]
            if target.op == "constant":  # state the function updates: read it afresh at every call
                target.op = "parameter"
                del target.attrs["value"]
                target.meta["target"] = t
            self.graph.add_node("copy_", [target, value])
        for u in list(holders.values()):
            self._bind(u, value, self._bound[id(u)].made)  # a view stays its view op of what it views
        self._arrays[id(t.array)] = t

    def _roots_sharing(self, t: Tensor) -> list[Tensor]:
        """The roots (tensors that are no view) of every bound tensor on ``t``'s memory: its own
        root, and those of ``t.data``, ``t.detach()``, and of their views and theirs, however far
        (``t.reshape(-1).data`` is a root of its own on a view of t's array)."""
        roots = {id(_root(t)): _root(t)}
        for u in self._sharing.get(id(_memory(t.array)), {}).values():
            roots.setdefault(id(_root(u)), _root(u))
        return list(roots.values())

    # -- tensors to nodes ---------------------------------------------------------------------------
    def add_input(self, x: Tensor, name: str) -> Node:
        node = self.graph.add_node("placeholder", shape=x.shape, dtype=x.dtype, name=name,
                                   meta={"device": x.device})
        self._bind(x, node)
        self._home[id(x)] = (x, node)
        if x.requires_grad:
            self._watch_leaf(x, node)
        return node

    def node_of(self, t: Tensor) -> Node:
        """The node holding ``t``'s current value, created on first sight."""
        entry = self._bound.get(id(t))
        if entry is None:
            base = t._base
            if base is not None and id(base) in self._bound and not self._current(base):
                self._refuse(base, self._bound[id(base)].node)
            node = self._source_node(t)
            self._bind(t, node)
            return node
        return entry.node if self._current(t) else self._reread(t, entry)

    def _current(self, t: Tensor) -> bool:
        """Whether ``t``'s memory still holds the value of its node: nothing wrote into it since."""
        entry = self._bound[id(t)]
        if t._base is entry.base:
            return self._stamp(t) == entry.stamp
        # an op's output became a view (ops mark views after apply returns): it then shares the
        # version counter of what it views, whose stamp when the op ran tells if a write came since
        then = None if entry.made is None else next((v for r, v in entry.made.roots if r is t._base), None)
        if then != self._stamp(t):
            return False
        self._bound[id(t)] = entry._replace(stamp=then, base=t._base)
        return True

    def _stamp(self, t: Tensor) -> tuple[int, int]:
        """What changes with every write into ``t``'s memory: its version, and the writes through
        a tensor of another version counter on the same array (``t.data``, which has its own)."""
        return t._version, self._uncounted.get(id(_root(t)), 0)

    def _reread(self, t: Tensor, entry: _Binding) -> Node:
        """The node of ``t``'s value after a write into its memory. A view shows its base's memory,
        so it is its view op again, on the current values of its arguments (each read again in
        turn if it is such a view itself). Any other tensor was changed by a write the tracer did
        not see, or through a view of it, which would need the view undone: refused."""
        made = entry.made
        if t._base is None or made is None or made.node.op == "getitem":  # one view of several: not replayed
            return self._refuse(t, entry.node)
        op = made.node
        fed = [a for a in made.args if isinstance(a, Tensor) or _is_array(a)]  # the args op.inputs stand for
        inputs = [self.node_of(a) if isinstance(a, Tensor) else i for a, i in zip(fed, op.inputs)]
        node = self.graph.add_node(op.op, inputs, op.attrs, shape=op.shape, dtype=op.dtype, fn=op.fn, meta=op.meta)
        self._bind(t, node, made)
        return node

    def _refuse(self, t: Tensor, node: Node) -> Node:
        """Remember the first write the graph cannot replay (``finish`` raises it); go on with
        ``node`` so that the function runs to its end."""
        if self.refused is None:
            self.refused = (
                f"trace: a tensor of shape {tuple(t.shape)} (node {node.name}) was changed in place by a write "
                "the tracer cannot record (t[i] = v under no_grad, fill_, zero_, or a write through a view "
                "of it); use out-of-place ops or in-place arithmetic (add_, mul_, copy_) instead")
        return node

    def _bind(self, t: Tensor, node: Node, made: _Made | None = None) -> None:
        self._bound[id(t)] = _Binding(node, self._stamp(t), t._base, made)
        self._alive.append(t)
        self._alive.append(t.array)
        self._arrays.setdefault(id(t.array), t)
        self._holders.setdefault(id(t.array), {})[id(t)] = t
        memory = _memory(t.array)
        self._alive.append(memory)
        self._sharing.setdefault(id(memory), {})[id(t)] = t

    def _source_node(self, t: Tensor) -> Node:
        """A node for a tensor no traced op produced."""
        found = self._known_array(t.array)
        if found is not None:  # a detached wrapper, or an array an op saved for backward
            return found
        for p, pnode, start in self._leaves.values():
            if p.grad is t and t is start:
                node = self.graph.add_node("grad", shape=t.shape, dtype=t.dtype,
                                           meta={"target": p, "device": t.device})
                self._home[id(t)] = (t, node)
                return node
        add = self.graph.add_node
        if t.grad_fn is None and t.requires_grad or _is_parameter(t):
            node = add("parameter", shape=t.shape, dtype=t.dtype, meta={"target": t, "device": t.device})
            if t.requires_grad:
                self._watch_leaf(t, node)
        else:
            node = add("constant", attrs={"value": t.array}, shape=t.shape, dtype=t.dtype, meta={"device": t.device})
        self._home[id(t)] = (t, node)
        return node

    def _known_array(self, a: Any) -> Node | None:
        """The node of an array seen before: through the tensor holding it (whose memory may have
        been written since), as saved by an op, or as a constant."""
        found = self._arrays.get(id(a))
        if isinstance(found, Tensor):
            return self.node_of(found)
        return self._saved_node(*found) if type(found) is tuple else found

    def _array_node(self, a: Any) -> Node:
        found = self._known_array(a)
        if found is not None:
            return found
        node = self.graph.add_node("constant", attrs={"value": a}, shape=a.shape, dtype=a.dtype,
                                   meta={"device": backend.device_of(a)})
        self._alive.append(a)
        self._arrays[id(a)] = node
        return node

    def _saved_node(self, op_node: Node, k: int, arr: Any) -> Node:
        node = self._saved.get((op_node, k))
        if node is None:
            node = self._saved[(op_node, k)] = self.graph.add_node(
                "saved", [op_node], {"index": k}, shape=arr.shape, dtype=arr.dtype,
                meta={"device": backend.device_of(arr)})
        return node

    def _warn_if_frozen(self, cls: type, value: Any) -> None:
        """An op argument that holds a traced tensor's array inside a tuple (``x[idx]``) is frozen."""
        for arr in _nested_arrays(value):
            found = self._arrays.get(id(arr))
            if isinstance(found, Tensor):
                found = self._bound[id(found)].node
            node = found[0] if type(found) is tuple else found
            if node is not None and node.op != "constant":
                message = (f"trace: an argument of {cls.__name__} holds the value of {node.name} as a raw "
                           "array; the graph freezes it, so replays reuse its value from trace time")
                self.frozen.append((cls.__name__, message))
                warnings.warn(message, TraceWarning, stacklevel=4)  # points at the caller of Function.apply

    def _watch_leaf(self, t: Tensor, node: Node) -> None:
        """Remember the leaf's .grad now: a change of it by the end becomes a ``set_grad`` node."""
        self._leaves[id(t)] = (t, node, t.grad)

    # -- the end ------------------------------------------------------------------------------------
    def finish(self, result: Any) -> Any:
        """Bind what ``fn`` returned to the output node, record changed ``.grad``s, and check that
        no tensor from outside was written without the tracer seeing it. Returns the output spec."""
        spec, flat = flatten(result)
        outputs = [self.node_of(t) for t in flat]
        for p, pnode, start in self._leaves.values():
            if p.grad is not start:
                value = [self.node_of(p.grad)] if p.grad is not None else []
                self.graph.add_node("set_grad", [pnode] + value)
        for t, node in self._home.values():
            if not self._current(t):
                self._refuse(t, node)
        if self.refused is not None:
            raise TraceError(self.refused)
        self.graph.set_outputs(outputs)
        return spec


# -- helpers ---------------------------------------------------------------------------------------
class _Made(NamedTuple):
    """How an op made a tensor: its node, its arguments, and (root, stamp then) for each
    tensor argument, the root being the tensor whose memory it shows (itself, or its base)."""

    node: Node
    args: tuple
    roots: tuple[tuple[Tensor, tuple[int, int]], ...]


class _Binding(NamedTuple):
    """What the tracer knows of a tensor: the node of its value, its stamp and base then, and
    (for an op's output) how it was made, to read a view again after a write into its memory."""

    node: Node
    stamp: tuple[int, int]
    base: Tensor | None
    made: _Made | None


@functools.lru_cache(maxsize=None)
def _param_names(cls: type, n: int) -> tuple[str, ...]:
    """Attribute names for an op's arguments, from its forward's signature (``dim``, ``keepdim``)."""
    return positional_names(cls.forward, n, 1, "arg")


def _root(t: Tensor) -> Tensor:
    return t._base if t._base is not None else t


def _memory(a: Any) -> Any:
    """The array that owns ``a``'s memory: numpy and cupy point a view's ``base`` at it (a buffer
    that is no array, e.g. under ``frombuffer``, ends the walk)."""
    base = getattr(a, "base", None)
    return a if base is None or not hasattr(base, "shape") else _memory(base)


def _is_array(a: Any) -> bool:
    return isinstance(a, backend.numpy.ndarray) or (type(a).__module__.startswith("cupy") and hasattr(a, "shape"))


def _nested_arrays(value: Any) -> list:
    if isinstance(value, (tuple, list)):
        return [a for v in value for a in _nested_arrays(v)]
    return [value] if _is_array(value) else []


def _is_parameter(t: Tensor) -> bool:
    return is_parameter(t)
