"""Tracing: run a function once, record every op it applies, then replay the record (chapter 01).

While ``trace`` runs ``fn``, ``Function.apply`` reports each op to a ``Tracer`` (installed as
``minigrad.autograd.function.tracer``) and in-place writes report the value they store; the tracer
maps tensors to the nodes of a ``Graph``. The ``TracedFunction`` it returns replays that graph on
new inputs of the same shapes: no Python control flow, no autograd graph, just the ops in
topological order. That is the static half of chapter 01's dynamic-vs-static story: a branch
taken at trace time is baked in. Because backward is made of minigrad ops, a whole training step
(forward, ``loss.backward()``, optimizer update) traces into one graph.

What the tracer maps, and how a replay treats it:

- the example inputs become ``placeholder`` nodes, given anew at every call;
- leaves that require grad (parameters) become ``parameter`` nodes, read when the graph runs, so a
  replay sees their current values; so do tensors the function updates in place (buffers,
  optimizer state); every other tensor from outside the function is a ``constant`` (its array is
  kept as it was, not copied);
- in-place writes to such tensors become ``copy_`` nodes, and changes of a leaf's ``.grad`` become
  ``set_grad`` nodes; a replay applies them, in order, after computing every value;
- arrays an op saved for its backward (a ReLU mask) become ``saved`` nodes of that op.

What it cannot capture: Python values read from tensors (``if x.sum() > 0``, ``loss.item()``) or
kept outside them (Adam's step count and bias corrections), which are baked in as constants;
arrays computed outside ops (random masks drawn with the device RNG, arrays built from
``tensor.data`` and passed to an op), which become constants; writes that bypass ops (``t[i] = v``
under ``no_grad``, ``fill_``/``zero_``), which raise ``TraceError`` when the tracer notices them;
and state created during the trace (an optimizer's first momentum buffer), which a replay
re-creates instead of keeping: trace a training step after one eager warm-up step.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from typing import Any, Callable, Sequence

from minigrad import backend
from minigrad.autograd import function, grad_mode
from minigrad.backend import cpu
from minigrad.errors import DeviceError, DTypeError, ShapeError
from minigrad.graph.ir import SOURCE_OPS, Graph, Node
from minigrad._tensor import Tensor, _wrap

__all__ = ["TraceError", "TraceWarning", "TracedFunction", "Tracer", "run_graph", "run_node", "trace"]

TENSOR_ARG, ARRAY_ARG = "<tensor>", "<array>"  # marks in node.meta["args"] for positions fed by inputs


class TraceError(RuntimeError):
    """Something the tracer cannot record faithfully (a write that bypassed the ops, a bad output)."""


class TraceWarning(UserWarning):
    """A traced value that the graph freezes although it may differ at the next call."""


def trace(fn: Callable[..., Any], *example_inputs: Tensor) -> TracedFunction:
    """Run ``fn(*example_inputs)`` once, for real, recording its ops; return a callable that
    replays them on new inputs of the same shapes and dtypes (see the module docstring)."""
    for i, x in enumerate(example_inputs):
        if not isinstance(x, Tensor):
            raise TypeError(f"trace: example input {i} must be a Tensor, got {type(x).__name__}")
    if len({id(x) for x in example_inputs}) != len(example_inputs):
        raise TraceError("trace: pass a distinct tensor for each input (the same tensor was given twice)")
    if function.tracer is not None:
        raise TraceError("trace: already tracing; traces cannot nest")
    graph = Graph()
    tracer = Tracer(graph)
    for name, x in zip(_positional_names(fn, len(example_inputs), 0, "input"), example_inputs):
        tracer.add_input(x, "%" + name)
    function.tracer = tracer
    try:
        result = fn(*example_inputs)
    finally:
        function.tracer = None
        tracer.remove_hooks()
    spec = tracer.finish(result)
    return TracedFunction(graph, spec, [(x.shape, x.dtype, x.device) for x in example_inputs],
                          getattr(fn, "__name__", "fn"))


class TracedFunction:
    """A recorded function: ``.graph`` is the IR; calling it replays the graph, recording no
    autograd graph (its outputs do not require grad; a traced backward is already in the graph)."""

    def __init__(self, graph: Graph, spec: Any, signature: list[tuple], name: str) -> None:
        self.graph, self._spec, self._signature, self.__name__ = graph, spec, signature, name

    def __call__(self, *inputs: Tensor) -> Any:
        self._check(inputs)
        if function.tracer is not None:
            raise TraceError(f"traced {self.__name__}: cannot replay while another trace is recording; "
                             "call the original function instead")
        values = run_graph(self.graph, inputs)
        outs = iter([_wrap(v, n.meta.get("device", cpu)) for v, n in zip(values, self.graph.outputs)])
        return _unflatten(self._spec, outs)

    def _check(self, inputs: Sequence[Any]) -> None:
        name = self.__name__
        if len(inputs) != len(self._signature):
            raise TypeError(f"traced {name}: expected {len(self._signature)} input(s), got {len(inputs)}")
        for i, (x, (shape, dtype, device)) in enumerate(zip(inputs, self._signature)):
            if not isinstance(x, Tensor):
                raise TypeError(f"traced {name}: input {i} must be a Tensor, got {type(x).__name__}")
            if x.shape != shape:
                raise ShapeError(f"traced {name}: input {i} was traced with shape {shape}, got shape "
                                 f"{tuple(x.shape)}; trace again for new shapes")
            if x.dtype != dtype:
                raise DTypeError(f"traced {name}: input {i} was traced with dtype {dtype}, got {x.dtype}")
            if x.device is not device:
                raise DeviceError(f"traced {name}: input {i} was traced on {device}, got a tensor on {x.device}")

    def __repr__(self) -> str:
        return f"<TracedFunction {self.__name__}: {len(self.graph)} nodes>"


# -- recording -----------------------------------------------------------------------------------
class Tracer:
    """Turns the ops that ``Function.apply`` reports into nodes of ``graph``."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self._bound: dict[int, tuple] = {}  # id(tensor) -> (node of its value, its version and base then)
        self._arrays: dict[int, Any] = {}  # id(array) -> its node, or (op node, k, array) if an op saved it
        self._home: dict[int, tuple[Tensor, Node]] = {}  # tensors from outside fn -> their source node
        self._leaves: dict[int, tuple[Tensor, Node, Tensor | None]] = {}  # (leaf, node, .grad at start)
        self._fresh_grad: dict[int, Tensor] = {}  # the gradient the engine copied into an empty .grad
        self._saved: dict[tuple[Node, int], Node] = {}
        self._alive: list = []  # every tensor and array seen stays alive, so no id() is reused
        self._handles: list = []

    # called by Function.apply and by in-place write-backs
    def record(self, cls: type, args: tuple, kwargs: dict, outputs: Any) -> None:
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
        ctx = _ctx_of(cls, outputs)
        meta = {"args": tuple(layout), "kwargs": tuple(kwargs), "ctx_device": device or cpu,
                "needs_input_grad": ctx.needs_input_grad if ctx is not None else (False,) * len(args)}
        add = self.graph.add_node
        if type(outputs) is tuple:
            node = add(cls.__name__, inputs, attrs, fn=cls, meta=meta)
            for i, o in enumerate(outputs):
                if isinstance(o, Tensor):
                    self._bind(o, add("getitem", [node], {"index": i}, shape=o.shape, dtype=o.dtype,
                                      meta={"device": o.device}))
        else:
            meta["device"] = outputs.device
            node = add(cls.__name__, inputs, attrs, shape=outputs.shape, dtype=outputs.dtype, fn=cls, meta=meta)
            self._bind(outputs, node)
        if ctx is not None and ctx._saved:
            for k, (kind, value, _) in enumerate(ctx._saved):
                if kind == 2:  # an array forward computed and kept (function._pack's kind 2)
                    self._alive.append(value)
                    self._arrays.setdefault(id(value), (node, k, value))

    def mutate(self, t: Tensor, result: Tensor) -> None:
        """``t`` now holds ``result``'s values: later reads of ``t`` read that node, and when ``t``
        comes from outside the function, a ``copy_`` node writes the value back at replay."""
        value = self.node_of(result)
        if id(t) not in self._bound:
            self._bind(t, self._source_node(t))
        home = self._home.get(id(t))
        if home is None and self._bound[id(t)][0].op in SOURCE_OPS:  # another tensor on the same array
            home = self._home[id(t)] = (t, self._bound[id(t)][0])
        if home is not None:
            target = home[1]
            if target.op == "constant":  # state the function updates: read it afresh at every call
                target.op = "parameter"
                del target.attrs["value"]
                target.meta["target"] = t
            self.graph.add_node("copy_", [target, value])
        self._bind(t, value)
        self._arrays[id(t.data)] = value

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
            if base is not None and id(base) in self._bound:
                self._check_version(base)
            node = self._source_node(t)
            self._bind(t, node)
            return node
        self._check_version(t)
        return entry[0]

    def _check_version(self, t: Tensor) -> None:
        node, version, base = self._bound[id(t)]
        if t._base is not base:  # an op's output became a view (ops mark views after apply returns)
            self._bound[id(t)] = (node, t._version, t._base)
        elif t._version != version:
            raise TraceError(
                f"trace: a tensor of shape {tuple(t.shape)} (node {node.name}) was changed in place by a write "
                "the tracer cannot record (t[i] = v under no_grad, fill_, zero_, or a write through a view "
                "of it); use out-of-place ops or in-place arithmetic (add_, mul_, copy_) instead"
            )

    def _bind(self, t: Tensor, node: Node) -> None:
        self._bound[id(t)] = (node, t._version, t._base)
        self._alive.append(t)
        self._alive.append(t.data)
        self._arrays.setdefault(id(t.data), node)

    def _source_node(self, t: Tensor) -> Node:
        """A node for a tensor no traced op produced."""
        found = self._arrays.get(id(t.data))
        if found is not None:  # a detached wrapper, or an array an op saved for backward
            return self._saved_node(*found) if type(found) is tuple else found
        for p, pnode, start in self._leaves.values():
            if p.grad is t:
                if t is start:
                    node = self.graph.add_node("grad", shape=t.shape, dtype=t.dtype,
                                               meta={"target": p, "device": t.device})
                    self._home[id(t)] = (t, node)
                    return node
                fresh = self._fresh_grad.get(id(p))
                if fresh is not None and t._base is None and t._vc == 0:  # the engine's copy of it
                    return self.node_of(fresh)
        add = self.graph.add_node
        if t.grad_fn is None and t.requires_grad or _is_parameter(t):
            node = add("parameter", shape=t.shape, dtype=t.dtype, meta={"target": t, "device": t.device})
            if t.requires_grad:
                self._watch_leaf(t, node)
        else:
            node = add("constant", attrs={"value": t.data}, shape=t.shape, dtype=t.dtype, meta={"device": t.device})
        self._home[id(t)] = (t, node)
        return node

    def _array_node(self, a: Any) -> Node:
        found = self._arrays.get(id(a))
        if found is not None:
            return self._saved_node(*found) if type(found) is tuple else found
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
            node = found[0] if type(found) is tuple else found
            if node is not None and node.op != "constant":
                warnings.warn(f"trace: an argument of {cls.__name__} holds the value of {node.name} as a raw "
                              "array; the graph freezes it, so replays reuse its value from trace time",
                              TraceWarning, stacklevel=4)  # points at the caller of Function.apply

    # -- gradients --------------------------------------------------------------------------------
    def _watch_leaf(self, t: Tensor, node: Node) -> None:
        """Remember the leaf's .grad now, and the gradient the engine copies into an empty .grad."""
        self._leaves[id(t)] = (t, node, t.grad)

        def seen(g: Tensor) -> None:
            if t.grad is None:
                self._alive.append(g)
                self._fresh_grad[id(t)] = g

        self._handles.append(t.register_hook(seen))

    def remove_hooks(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    # -- the end ------------------------------------------------------------------------------------
    def finish(self, result: Any) -> Any:
        """Bind what ``fn`` returned to the output node, record changed ``.grad``s, and check that
        no tensor from outside was written without the tracer seeing it. Returns the output spec."""
        spec, flat = _flatten(result)
        outputs = [self.node_of(t) for t in flat]
        for p, pnode, start in self._leaves.values():
            if p.grad is not start:
                value = [self.node_of(p.grad)] if p.grad is not None else []
                self.graph.add_node("set_grad", [pnode] + value)
        for t, _ in self._home.values():
            self._check_version(t)
        self.graph.set_outputs(outputs)
        return spec


# -- replaying -----------------------------------------------------------------------------------
def run_node(node: Node, arrays: Sequence[Any]) -> tuple[Any, Any]:
    """Run an op node's Function forward on raw input arrays; returns (value, ctx)."""
    cls = node.fn
    if not isinstance(cls, type):  # a generated kernel (a fused group, chapter 03): arrays in, array out
        return cls(*arrays), None
    ctx = object.__new__(cls)
    device = node.meta.get("ctx_device", cpu)
    ctx.device, ctx.xp = device, device.xp
    layout = node.meta["args"]
    ctx.needs_input_grad = node.meta.get("needs_input_grad", (False,) * len(layout))
    it = iter(arrays)
    kwargs = {k: node.attrs[k] for k in node.meta["kwargs"]}
    if cls.array_forward:
        args = [next(it) if k in (TENSOR_ARG, ARRAY_ARG) else node.attrs[k] for k in layout]
        return cls.forward(ctx, *args, **kwargs), ctx
    # a user Function's forward takes Tensors (it runs without recording, as in Function.apply)
    args = [_wrap(next(it), device) if k == TENSOR_ARG else next(it) if k == ARRAY_ARG else node.attrs[k]
            for k in layout]
    with grad_mode.no_grad():
        out = cls.forward(ctx, *args, **kwargs)
    if type(out) is tuple:
        return tuple(o.data if isinstance(o, Tensor) else o for o in out), ctx
    return out.data if isinstance(out, Tensor) else out, ctx


def run_graph(graph: Graph, inputs: Sequence[Tensor]) -> list[Any]:
    """Execute ``graph`` on input tensors, in topological order, then apply its side effects in
    order; returns the output arrays."""
    env: dict[Node, Any] = dict(zip(graph.placeholders, [x.data for x in inputs]))
    given = dict(zip(graph.placeholders, inputs))
    ctxs: dict[Node, Any] = {}
    effects = []
    for node in graph.topological_order():
        op = node.op
        if op == "placeholder":
            continue
        if op == "constant":
            env[node] = node.attrs["value"]
        elif op in ("parameter", "grad"):
            env[node] = _target(node, given).data
        elif op == "getitem":
            env[node] = env[node.inputs[0]][node.attrs["index"]]
        elif op == "saved":
            env[node] = _saved_array(ctxs[node.inputs[0]], node)
        elif op in ("copy_", "set_grad"):
            effects.append(node)
        elif op == "output":
            continue
        else:
            env[node], ctx = run_node(node, [env[i] for i in node.inputs])
            if any(u.op == "saved" for u in node.users):
                ctxs[node] = ctx
    for node in effects:
        target = _target(node.inputs[0], given)
        if node.op == "copy_":
            target.device.xp.copyto(target.data, env[node.inputs[1]], casting="same_kind")
            target._bump_version()
        else:
            target.grad = _wrap(env[node.inputs[1]].copy(), target.device) if len(node.inputs) > 1 else None
    return [env[n] for n in graph.outputs]


def _target(node: Node, given: dict) -> Tensor:
    """The tensor a source node stands for at this call."""
    if node.op == "placeholder":
        return given[node]
    t = node.meta["target"]
    if node.op != "grad":
        return t
    if t.grad is None:
        raise TraceError(f"traced function: {node.name} reads the .grad of a tensor of shape {tuple(t.shape)}, "
                         "which was set at trace time but is None now")
    return t.grad


def _saved_array(ctx: Any, node: Node) -> Any:
    saved = ctx._saved
    value = saved[node.attrs["index"]] if saved else None
    if value is None:
        raise TraceError(f"traced function: {node.inputs[0].op} did not save array {node.attrs['index']} at replay")
    return value.data if isinstance(value, Tensor) else value


# -- helpers ---------------------------------------------------------------------------------------
def _ctx_of(cls: type, outputs: Any) -> Any:
    """The graph node (ctx) this op recorded, if it recorded one."""
    for o in outputs if type(outputs) is tuple else (outputs,):
        if isinstance(o, Tensor) and type(o.grad_fn) is cls:
            return o.grad_fn
    return None


def _positional_names(func: Callable, n: int, skip: int, fallback: str) -> tuple[str, ...]:
    """Names for n positional arguments of ``func`` (after ``skip`` of them), numbering ``*args``."""
    try:
        params = list(inspect.signature(func).parameters.values())[skip:]
    except (TypeError, ValueError):
        params = []
    names: list[str] = []
    for p in params:
        if p.kind is p.VAR_POSITIONAL:
            names += [f"{p.name}{j}" for j in range(n - len(names))]
            break
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
    names += [f"{fallback}{j}" for j in range(len(names), n)]
    return tuple(names[:n])


@functools.lru_cache(maxsize=None)
def _param_names(cls: type, n: int) -> tuple[str, ...]:
    """Attribute names for an op's arguments, from its forward's signature (``dim``, ``keepdim``)."""
    return _positional_names(cls.forward, n, 1, "arg")


def _is_array(a: Any) -> bool:
    return isinstance(a, backend.numpy.ndarray) or (type(a).__module__.startswith("cupy") and hasattr(a, "shape"))


def _nested_arrays(value: Any) -> list:
    if isinstance(value, (tuple, list)):
        return [a for v in value for a in _nested_arrays(v)]
    return [value] if _is_array(value) else []


def _is_parameter(t: Tensor) -> bool:
    from minigrad.nn.module import Parameter

    return isinstance(t, Parameter)


def _flatten(result: Any) -> tuple[Any, list[Tensor]]:
    """Split a returned structure (tensors in nested tuples, lists and dicts) into a spec and a list."""
    if result is None:
        return None, []
    if isinstance(result, Tensor):
        return "tensor", [result]
    if isinstance(result, (tuple, list)):
        specs, flat = [], []
        for r in result:
            s, f = _flatten(r)
            specs.append(s)
            flat += f
        return (type(result), specs), flat
    if isinstance(result, dict):
        s, flat = _flatten(list(result.values()))
        return (dict, list(result), s), flat
    raise TraceError(f"trace: the traced function returned a {type(result).__name__}; return tensors "
                     "(tuples, lists or dicts of them) or None, since other values would be frozen")


def _unflatten(spec: Any, values: Any) -> Any:
    if spec is None:
        return None
    if spec == "tensor":
        return next(values)
    if spec[0] is dict:
        return dict(zip(spec[1], _unflatten(spec[2], values)))
    kind, specs = spec
    items = [_unflatten(s, values) for s in specs]
    if kind is list:
        return items
    return kind(*items) if hasattr(kind, "_fields") else kind(items)
