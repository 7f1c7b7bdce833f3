"""``CheckpointFunction``: one graph node standing for a whole checkpointed segment (chapter 03).

Its forward keeps only the segment's inputs; its backward runs the segment again with grad
enabled, from the random state saved at forward and leaving BatchNorm's buffers as they were, and
backpropagates through the fresh graph. ``minigrad.memory.checkpoint`` builds the segment and
applies it (``checkpoint``, ``checkpoint_sequential``) and explains the two variants.
"""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any, Iterator

from minigrad import backend
from minigrad.autograd import engine
from minigrad.autograd.function import AccumulateGrad, Function
from minigrad.autograd.grad_mode import enable_grad, is_grad_enabled, no_grad
from minigrad.autograd.binding import TENSOR_OPS, array_ops
from minigrad.autograd.mode import casts_inputs, current_modes, recomputation
from minigrad.errors import AutogradError
from minigrad.ops.linalg import Linear as LinearOp
from minigrad.ops.movement import reshape
from minigrad.protocols import is_plain_linear
from minigrad._tensor import Tensor, _wrap

__all__ = ["CheckpointFunction", "as_outputs", "detached"]


class CheckpointFunction(Function):
    """One graph node standing for a whole checkpointed segment.

    ``forward(ctx, segment, *inputs)``: ``inputs`` are the segment's tensor arguments followed (in
    the default variant) by the tensors it reads, such as parameters. ``backward`` recomputes the
    segment with grad enabled and returns one gradient per input.
    """

    # its rule is a whole forward and backward of the segment on Tensors (a recomputation, then
    # engine.grad), not a formula, so it stays on Tensors under either binding of ctx.ops
    tensor_backward = True
    # the gradients it returns are fresh arrays nobody else holds (``_handed_over`` copies any that
    # might not be), so the engine may store them as .grad without a copy: one per parameter a step
    owns_gradients = True

    @staticmethod
    def forward(ctx, segment: Any, *inputs: Tensor) -> Any:  # memory.checkpoint builds the segment
        ctx.segment = segment
        ctx.save_for_backward(*inputs[:len(segment.call.slots)])
        if segment.outputs is not None:  # computed already while looking for the parameters
            outputs, segment.outputs = segment.outputs, None
            return outputs
        return segment.call(inputs)  # use_reentrant=True: apply runs this under no_grad

    @staticmethod
    def backward(ctx, *grad_outputs: Tensor) -> tuple:
        """``recompute_backward``, or, for a segment ending on a Linear that need not be recomputed,
        ``_backward_last_apart``; either way the gradients handed over as fresh arrays
        (``_handed_over``, as ``owns_gradients`` promises the engine)."""
        last = _last_apart(ctx.segment, is_grad_enabled(), grad_outputs)
        if last is not None:
            grads = _backward_last_apart(ctx.segment, ctx.saved_tensors, last, grad_outputs[0])
        else:
            grads = CheckpointFunction.recompute_backward(ctx, *grad_outputs)
        return _handed_over(grads, grad_outputs)

    @staticmethod
    def recompute_backward(ctx, *grad_outputs: Tensor) -> tuple:
        """Recompute the segment with grad enabled, then backpropagate ``grad_outputs`` through it.

        ``ctx.segment`` holds ``call`` (run the segment on a list of inputs), ``rng_states`` and
        ``modules`` (replay the random numbers and keep BatchNorm's buffers: ``_replayed_rng``,
        ``_buffers_kept``), ``reentrant`` and ``params`` (the tensors it reads besides its
        inputs). Replay under ``recomputation()`` and ``enable_grad()`` with inputs made by
        ``_replay_input``; ``create_graph`` is whether grad mode is on now (refused with
        ``use_reentrant=True``). Reentrant: a nested ``engine.backward`` from each output that
        requires grad, returning the replayed inputs' ``.grad``. Otherwise ``engine.grad`` with
        respect to the replayed inputs and ``params`` that require grad
        (``_check_no_outside_nodes`` first). Return ``None`` for the segment, then one gradient
        (or ``None``) per input of forward, in order.
        """
        ### BEGIN SOLUTION chapter 03: checkpoint as a Function
        seg = ctx.segment
        create_graph = is_grad_enabled()  # the engine records backward only for create_graph=True
        if create_graph and seg.reentrant:
            raise AutogradError("checkpoint(use_reentrant=True) does not support create_graph=True; "
                                "use use_reentrant=False")
        saved = ctx.saved_tensors
        with _replayed_rng(seg.rng_states), _buffers_kept(seg.modules), recomputation(), enable_grad():
            replay = [_replay_input(t, create_graph, seg.reentrant) for t in saved]
            outputs = as_outputs(seg.call(replay))
        outputs = tuple([_graph_only(o) for o in outputs])  # the recomputed values go now, not after backward
        pairs = [(o, g) for o, g in zip(outputs, grad_outputs) if o.requires_grad and g is not None]
        if seg.reentrant:  # as PyTorch: a nested backward fills the .grad of every leaf it reaches
            for i, (o, g) in enumerate(pairs):
                engine.backward(o, g, retain_graph=i < len(pairs) - 1)
            return (None, *[t.grad if t.requires_grad else None for t in replay])
        _check_no_outside_nodes(seg, outputs, replay)
        wanted = [t for t in replay + seg.params if t.requires_grad]
        grads = iter(engine.grad([o for o, _ in pairs], wanted, [g for _, g in pairs],
                                 create_graph=create_graph, allow_unused=True) if pairs else [None] * len(wanted))
        return (None, *[next(grads) if t.requires_grad else None for t in replay + seg.params])
        ### END SOLUTION


def _handed_over(grads: tuple, grad_outputs: tuple) -> tuple:
    """``grads`` with a copy of each one that another may hold (``CheckpointFunction.owns_gradients``
    promises the engine fresh arrays): a gradient passed through from ``grad_outputs`` (a segment
    ``x + b`` gives ``b`` its output's gradient itself), one returned twice (``x`` and ``b`` there),
    a view. Under ``create_graph`` the engine keeps gradients as they are anyway, graph and all."""
    if is_grad_enabled():
        return grads
    # by array, not by Tensor: the engine wraps one array in several Tensors (its array binding)
    seen, result = {id(g.array) for g in grad_outputs if g is not None and not g.is_sparse}, []
    for g in grads:
        if g is not None and not g.is_sparse:
            if id(g.array) in seen or g.array.base is not None:
                g = _wrap(g.array.copy(), g.device)
            seen.add(id(g.array))
        result.append(g)
    return tuple(result)


def _last_apart(seg: Any, create_graph: bool, grad_outputs: tuple) -> Any:
    """The segment's last layer, when backward may skip recomputing it: a segment of modules that
    says how to run all but its last layer (``seg.head``, ``memory.planner`` gives it), ending on a
    plain ``nn.Linear``. Linear's backward reads its input and weight, never its output, so the
    recomputation stops before it and its rule is called on what it would have saved: one matrix
    product fewer per such segment. Anything that could see the difference keeps the whole
    recomputation: ``create_graph`` (the gradients must carry a graph), a module hook, autocast,
    mixed dtypes, a missing output gradient."""
    if seg.head is None or create_graph or seg.reentrant or len(grad_outputs) != 1 or grad_outputs[0] is None:
        return None
    last = seg.modules[-1] if seg.modules else None
    if not is_plain_linear(last) or last._forward_hooks or last._forward_pre_hooks or casts_inputs():
        return None
    w, b = last.weight, last.bias
    if w.dtype != grad_outputs[0].dtype or (b is not None and b.dtype != w.dtype):
        return None
    return last


def _backward_last_apart(seg: Any, saved: tuple, last: Any, g: Tensor) -> tuple:
    """``CheckpointFunction.backward`` for a segment whose last layer, a Linear, is not recomputed:
    recompute the rest (``seg.head``) to get that layer's input ``h``, call ``Linear.backward`` on
    ``(h, weight)`` as its node would have saved them (bound to arrays, or to Tensors while a mode
    such as the memory tracker watches, as the engine binds it), then backpropagate ``h``'s
    gradient through the recomputed graph. The gradients equal the whole recomputation's bit for
    bit: the same rule on the same values."""
    with _replayed_rng(seg.rng_states), _buffers_kept(seg.modules), recomputation(), enable_grad():
        replay = [_replay_input(t, False, False) for t in saved]
        h = seg.head(replay[0])
    if not isinstance(h, Tensor) or h.dtype != last.weight.dtype:
        raise AutogradError(f"checkpoint: the segment's head must return a Tensor of the last Linear's dtype "
                            f"({last.weight.dtype}), got {getattr(h, 'dtype', type(h).__name__)}")
    w, b = last.weight, last.bias
    needs = (h.requires_grad, w.requires_grad, b is not None and b.requires_grad)
    tensors = bool(current_modes())
    ops = TENSOR_OPS if tensors else array_ops(g.device)
    rule = SimpleNamespace(saved_tensors=(h, w) if tensors else (h.array, w.array), needs_input_grad=needs, ops=ops)
    with no_grad():
        gh, gw, gb = LinearOp.backward(rule, g if tensors else g.array)
    if not tensors:
        gh, gw, gb = [None if a is None else _wrap(a, g.device) for a in (gh, gw, gb)]
    del rule  # it holds h's values, which Linear's rule has read: the recomputed graph needs only h's place
    h = _graph_only(h)
    _check_no_outside_nodes(seg, (h,), replay)
    wanted = [t for t in replay + seg.params if t.requires_grad]
    if h.grad_fn is not None and gh is not None:
        found = engine.grad([h], wanted, [gh], allow_unused=True)
    else:  # h is the segment's input itself (the head ran no layer), or nothing before it needs a gradient
        found = [gh if t is h else None for t in wanted]
    grads = {id(t): g for t, g in zip(wanted, found)}
    for t, extra in ((w, gw), (b, gb)):
        if extra is not None and id(t) in grads:
            grads[id(t)] = extra if grads[id(t)] is None else grads[id(t)] + extra  # a weight used twice
    return (None, *[grads.get(id(t)) for t in replay + seg.params])


@contextmanager
def _replayed_rng(states: dict | None) -> Iterator[None]:
    """Run a block from the random state saved at forward, then put back the current one, so the
    recomputation draws the same dropout masks and the random stream goes on as without it."""
    if states is None:
        yield
        return
    now = {d: backend.get_rng_state(d) for d in states}
    for d, state in states.items():
        backend.set_rng_state(state, d)
    try:
        yield
    finally:
        for d, state in now.items():
            backend.set_rng_state(state, d)


@contextmanager
def _buffers_kept(modules: list) -> Iterator[None]:
    """Undo what a recomputation writes into the buffers of modules in training mode (BatchNorm's
    running statistics), so that the step updates them once."""
    with no_grad():
        kept = [(b, b.clone()) for m in modules for sub in m.modules() if sub.training
                for b in sub.buffers(recurse=False)]
    try:
        yield
    finally:
        with no_grad():
            for b, value in kept:
                b.copy_(value)


def _replay_input(t: Tensor, create_graph: bool, reentrant: bool) -> Tensor:
    """The tensor the recomputation starts from. A leaf serves as itself (its gradient is caught at
    its own node); a computed tensor is cut from the graph before it, or, for create_graph=True,
    aliased so that the gradients returned stay differentiable with respect to it. The reentrant
    variant always cuts, since it reads the gradients from the cut tensors' ``.grad``."""
    if reentrant or (t.grad_fn is not None and not create_graph):
        return detached(t)
    return t if t.grad_fn is None else reshape(t, t.shape)


def _check_no_outside_nodes(seg: Any, outputs: tuple, replay: list) -> None:
    """A node of the graph recorded at forward that turns up again in the recomputed graph was made
    outside the segment (the recomputation makes fresh nodes): the segment read a computed tensor it
    was not given as an argument, and its gradient could not reach that tensor's graph. A segment of
    modules first run without a graph (``memory.checkpoint.checkpoint_modules``) has no such record;
    its recomputed graph, up to its inputs, must reach no leaf but its inputs and its parameters."""
    roots = [o.grad_fn for o in outputs if o.grad_fn is not None]
    if seg.inner is not None:
        for node in engine.topological_order(roots):
            if node in seg.inner:
                raise AutogradError(
                    f"checkpoint: the function read a tensor computed outside it (by {node.name()}) without "
                    "receiving it as an argument, so its gradient cannot flow back; pass it to checkpoint() "
                    "as an argument")
        return
    known = {id(t) for t in replay + seg.params}
    inputs = {t.grad_fn for t in replay if t.grad_fn is not None}  # aliases (create_graph): outside beyond
    seen, stack = set(), roots
    while stack:
        node = stack.pop()
        if node in seen or node in inputs:
            continue
        seen.add(node)
        if type(node) is AccumulateGrad and id(node.variable) not in known:
            raise AutogradError(
                f"checkpoint: the modules read a tensor of shape {tuple(node.variable.shape)} that requires "
                "grad and is neither their input nor one of their parameters, so its gradient cannot flow "
                "back; register it as a parameter, or checkpoint with memory.checkpoint()")
        stack += [e[0] for e in node.next_functions if e is not None]


def _graph_only(t: Tensor) -> Tensor:
    """A recomputed output as backward needs it: its place in the graph and its shape and dtype, not
    its values (no backward rule reads an output through the output tensor; an op that needs its
    output saved its own reference). Dropping the values while backward runs through the segment
    frees one output's memory at the segment's peak. A leaf stays itself: its gradient is caught at
    its own node."""
    if t.grad_fn is None:
        return t
    xp = t.device.xp
    stand_in = _wrap(xp.broadcast_to(xp.zeros((), t.dtype), t.shape), t.device)
    stand_in.requires_grad, stand_in.grad_fn, stand_in._output_nr = True, t.grad_fn, t._output_nr
    return stand_in


def as_outputs(result: Any) -> tuple:
    """A segment's result as a tuple of Tensors (it must return a Tensor or a tuple of them)."""
    outputs = (result,) if isinstance(result, Tensor) else result
    if not isinstance(outputs, tuple) or not all(isinstance(o, Tensor) for o in outputs):
        raise TypeError(f"checkpoint: the function must return a Tensor or a tuple of Tensors, "
                        f"got {type(result).__name__}")
    return outputs


def detached(t: Tensor) -> Tensor:
    """``t`` cut from its graph, still requiring grad if it did."""
    d = t.detach()
    return d.requires_grad_() if t.requires_grad else d
