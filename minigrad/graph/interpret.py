"""The interpreter: run a recorded graph's nodes on arrays, then apply its side effects (chapters 01, 03).

A node becomes one *step*, a function that puts the node's value into an environment (a dict from
node to array): a source node looks its value up (an input, a constant, a parameter's current
array, a ``.grad``), an op node runs its Function's forward on the arrays of its inputs, with no
autograd graph, and ``getitem`` and ``saved`` nodes pick a part of another node's result. A
``call`` node calls its function on its inputs' arrays where the order puts it. The
writes (``copy_``, ``set_grad``) wait until every value is computed. ``run_graph`` walks the graph
in topological order with these steps and keeps every value; the ``Executor`` (chapter 03) plans
the same steps ahead of time and frees each value after its last use.
"""

from __future__ import annotations

import functools
import operator
from typing import Any, Callable, Sequence

from minigrad.autograd import grad_mode
from minigrad.backend import cpu
from minigrad.errors import TraceError
from minigrad.graph.ir import Graph, Node
from minigrad._tensor import Tensor, _wrap

__all__ = ["ARRAY_ARG", "EFFECT_OPS", "TENSOR_ARG", "apply_effect", "keeps_ctx", "node_runner", "node_step",
           "run_graph", "run_node", "saved_value", "source_tensor"]

TENSOR_ARG, ARRAY_ARG = "<tensor>", "<array>"  # marks in node.meta["args"] for positions fed by inputs
EFFECT_OPS = ("copy_", "set_grad")  # writes, applied in order after every value is computed

Step = Callable[[dict, dict], None]  # step(env, ctxs): puts one node's value into env


def run_node(node: Node, arrays: Sequence[Any]) -> tuple[Any, Any]:
    """Run an op node's Function forward on raw input arrays; returns (value, ctx)."""
    return node_runner(node)(arrays)


def node_runner(node: Node) -> Callable[[Sequence[Any]], tuple[Any, Any]]:
    """``run_node`` for one op node, with what it looks up in the node prepared once (its ctx's
    device, the layout of its arguments, its keyword arguments): the executor runs a node on
    every call of a compiled step, and a small op's own work takes a few microseconds."""
    cls = node.fn
    if not isinstance(cls, type):  # a generated kernel (a fused group, chapter 03): arrays in, array out
        return lambda arrays: (cls(*arrays), None)
    device = node.meta.get("ctx_device", cpu)
    xp, layout = device.xp, node.meta["args"]
    needs = node.meta.get("needs_input_grad", (False,) * len(layout))
    kwargs = {k: node.attrs[k] for k in node.meta["kwargs"]}
    forward, new = cls.forward, object.__new__
    if not cls.array_forward:  # a user Function's forward takes Tensors (it runs without recording, as in apply)
        def run(arrays: Sequence[Any]) -> tuple[Any, Any]:
            ctx = new(cls)
            ctx.device, ctx.xp, ctx.needs_input_grad = device, xp, needs
            it = iter(arrays)
            args = [_wrap(next(it), device) if k == TENSOR_ARG else next(it) if k == ARRAY_ARG else node.attrs[k]
                    for k in layout]
            with grad_mode.no_grad():
                out = forward(ctx, *args, **kwargs)
            if type(out) is tuple:
                return tuple(o.array if isinstance(o, Tensor) else o for o in out), ctx
            return out.array if isinstance(out, Tensor) else out, ctx
        return run
    fixed = [(k in (TENSOR_ARG, ARRAY_ARG), None if k in (TENSOR_ARG, ARRAY_ARG) else node.attrs[k]) for k in layout]
    if all(fed for fed, _ in fixed):
        def run(arrays: Sequence[Any]) -> tuple[Any, Any]:
            ctx = new(cls)
            ctx.device, ctx.xp, ctx.needs_input_grad = device, xp, needs
            return forward(ctx, *arrays, **kwargs), ctx
    else:
        def run(arrays: Sequence[Any]) -> tuple[Any, Any]:
            ctx = new(cls)
            ctx.device, ctx.xp, ctx.needs_input_grad = device, xp, needs
            it = iter(arrays)
            return forward(ctx, *[next(it) if fed else value for fed, value in fixed], **kwargs), ctx
    return run


def source_tensor(node: Node, given: dict[Node, Tensor]) -> Tensor:
    """The tensor a source node (placeholder, parameter, grad) stands for at this call."""
    if node.op == "placeholder":
        return given[node]
    t = node.meta["target"]
    if node.op != "grad":
        return t
    if t.grad is None:
        raise TraceError(f"traced function: {node.name} reads the .grad of a tensor of shape "
                               f"{tuple(t.shape)}, which was set at trace time but is None now")
    return t.grad


def saved_value(ctx: Any, node: Node) -> Any:
    """The array that the op run with ``ctx`` saved for backward at the ``saved`` node's index."""
    saved = getattr(ctx, "_saved", None)  # a slot: unset when the replayed forward saved nothing
    value = saved[node.attrs["index"]] if saved else None
    if value is None:
        raise TraceError(f"traced function: {node.inputs[0].op} did not save array "
                               f"{node.attrs['index']} at replay")
    return value.array if isinstance(value, Tensor) else value


def node_step(n: Node, compute: Callable[[list], tuple[Any, Any]], keep_ctx: bool) -> Step:
    """The step of a value node (not a placeholder, an output or a write): looked up for a source,
    ``getitem`` or ``saved`` node, the function called for a ``call`` node,
    ``compute(input arrays) -> (value, ctx)`` for an op, whose
    ctx is kept when ``keep_ctx`` (a ``saved`` node reads from it)."""
    op, inputs = n.op, n.inputs
    if op == "constant":
        value = n.attrs["value"]

        def step(env: dict, ctxs: dict) -> None:
            env[n] = value
    elif op == "parameter":
        t = n.meta["target"]

        def step(env: dict, ctxs: dict) -> None:
            env[n] = t.array
    elif op == "grad":
        def step(env: dict, ctxs: dict) -> None:
            env[n] = source_tensor(n, {}).array
    elif op == "getitem":
        index = n.attrs["index"]

        def step(env: dict, ctxs: dict) -> None:
            env[n] = env[inputs[0]][index]
    elif op == "saved":
        def step(env: dict, ctxs: dict) -> None:
            env[n] = saved_value(ctxs[inputs[0]], n)
    elif op == "call":
        fn = n.attrs["fn"]

        def step(env: dict, ctxs: dict) -> None:
            fn(*[env[i] for i in inputs])
            env[n] = None
    elif len(inputs) == 1:  # the inputs' values fetched without a comprehension's frame: a step per node adds up
        (a,) = inputs
        if keep_ctx:
            def step(env: dict, ctxs: dict) -> None:
                env[n], ctxs[n] = compute((env[a],))
        else:
            def step(env: dict, ctxs: dict) -> None:
                env[n] = compute((env[a],))[0]
    else:
        fetch = operator.itemgetter(*inputs) if len(inputs) > 1 else lambda env: ()
        if keep_ctx:
            def step(env: dict, ctxs: dict) -> None:
                env[n], ctxs[n] = compute(fetch(env))
        else:
            def step(env: dict, ctxs: dict) -> None:
                env[n] = compute(fetch(env))[0]
    return step


def apply_effect(op: str, target: Tensor, value: Any, written: bool = False, own: bool = False,
                 writes: int = 1) -> None:
    """Apply one write: ``copy_`` stores ``value`` in ``target`` (unless the run already ``written``
    it there) and bumps its version once for each of the ``writes`` it stands for (overwritten
    copies that a pass dropped); ``set_grad`` makes ``value`` its ``.grad`` (a copy, unless the
    run made the array for it alone: ``own``), or clears it when ``value`` is None."""
    if op == "copy_":
        if not written:
            target.device.xp.copyto(target.array, value, casting="same_kind")
        for _ in range(writes):
            target._bump_version()
    elif value is not None:
        target.grad = _wrap(value if own else value.copy(), target.device)
    else:
        target.grad = None


def keeps_ctx(node: Node) -> bool:
    """Whether a ``saved`` node reads what this op saved, so its ctx must be kept after it runs."""
    return any(u.op == "saved" for u in node.users)


def run_graph(graph: Graph, inputs: Sequence[Tensor]) -> list[Any]:
    """Execute ``graph`` on input tensors, in topological order, keeping every value, then apply its
    writes in order; returns the output arrays."""
    given = dict(zip(graph.placeholders, inputs))
    env: dict[Node, Any] = {n: x.array for n, x in given.items()}
    ctxs: dict[Node, Any] = {}
    effects = []
    for node in graph.topological_order():
        if node.op in EFFECT_OPS:
            effects.append(node)
        elif node.op not in ("placeholder", "output"):
            node_step(node, functools.partial(run_node, node), keeps_ctx(node))(env, ctxs)
    for e in effects:
        value = env[e.inputs[1]] if len(e.inputs) > 1 else None
        apply_effect(e.op, source_tensor(e.inputs[0], given), value, writes=e.attrs.get("writes", 1))
    return [env[n] for n in graph.outputs]
