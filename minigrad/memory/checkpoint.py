"""Gradient checkpointing: keep a segment's inputs instead of its activations, and recompute them
during backward (chapter 03).

A checkpointed segment becomes one graph node, ``CheckpointFunction`` (``minigrad.memory.recompute``,
re-exported here). Its forward keeps only the segment's inputs; its backward runs the segment again,
this time recording the graph, and backpropagates through that fresh graph. Activation memory falls
from every layer's to one segment's plus the segment boundaries, for the price of a second forward
pass; with sqrt(n) segments of n layers both are about sqrt(n) layers. The random state saved at
forward makes dropout draw the same masks when the segment is recomputed.

Two variants, as in PyTorch (``use_reentrant``):

- ``False`` (the default) runs the segment once with grad enabled to find the tensors it reads
  (parameters, captured weights: the leaves of that graph), then drops the graph. Those tensors
  become inputs of the node, so their gradients travel the ordinary way: ``minigrad.grad`` with
  respect to parameters, leaf hooks, nested checkpoints and ``create_graph=True`` all work.
- ``True`` runs the segment under ``no_grad`` and, in backward, calls ``backward()`` on the
  recomputed outputs, which adds the parameters' gradients straight into their ``.grad``. So
  ``minigrad.grad`` returns the inputs' gradients but not the parameters' (those land in
  ``.grad``), ``create_graph`` is refused, and if no input requires grad the parameters get none.

The segment's tensor arguments (positional or keyword) are its inputs; any other tensor it reads
must be a leaf (a parameter, a constant): a computed tensor read from outside could not get its
gradient back, and backward says so. Recomputing BatchNorm in training mode would update its
running statistics a second time; the buffers of the modules a checkpoint runs (the callable when
it is a Module, a bound method's module, ``checkpoint_sequential``'s layers) are restored after
the recomputation, so a checkpointed step changes them once, as an ordinary step does. (PyTorch
updates them twice; so does minigrad for other callables.)
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any, Callable, Sequence

from minigrad import backend
from minigrad.autograd import engine
from minigrad.autograd.function import AccumulateGrad
from minigrad.autograd.grad_mode import is_grad_enabled, no_grad
from minigrad.backend import cpu
from minigrad.protocols import ModuleLike, is_module
from minigrad.memory.recompute import CheckpointFunction, as_outputs, detached
from minigrad._tensor import Tensor, _wrap

__all__ = ["CheckpointFunction", "checkpoint", "checkpoint_modules", "checkpoint_sequential"]


def checkpoint(function: Callable, *args: Any, use_reentrant: bool = False, preserve_rng_state: bool = True,
               **kwargs: Any) -> Any:
    """``function(*args, **kwargs)``, keeping only its tensor arguments for backward and
    recomputing its activations then. ``function`` returns a Tensor or a tuple of Tensors."""
    if not is_grad_enabled():  # nothing will be differentiated, so there is nothing to save
        return function(*args, **kwargs)
    call = _Call(function, args, kwargs)
    inputs = call.take_tensors()
    seg = _Segment(call, inputs, preserve_rng_state, use_reentrant)
    if use_reentrant:
        if not any(t.requires_grad for t in inputs):
            warnings.warn("checkpoint(use_reentrant=True): no input requires grad, so the parameters used "
                          "inside get no gradient; use use_reentrant=False", stacklevel=2)
        return CheckpointFunction.apply(seg, *inputs)
    # Run the segment once recording its graph, only to learn which tensors it reads (the leaves
    # of that graph), then let the graph go: its activations are what checkpointing does not keep.
    cut = [detached(t) for t in inputs]
    result = call(cut)
    outputs = as_outputs(result)
    nodes = engine.topological_order([o.grad_fn for o in outputs if o.grad_fn is not None])
    own = {id(d) for d in cut}
    seg.params = [n.variable for n in nodes if type(n) is AccumulateGrad and id(n.variable) not in own]
    seg.inner = weakref.WeakSet([n for n in nodes if type(n) is not AccumulateGrad])
    fresh = tuple([_wrap(o.array, o.device) for o in outputs])  # the same data, without the graph
    seg.outputs = fresh[0] if isinstance(result, Tensor) else fresh
    del result, outputs, nodes, fresh
    return CheckpointFunction.apply(seg, *inputs, *seg.params)


def checkpoint_sequential(functions: Sequence[Callable] | ModuleLike, segments: int, input: Tensor,
                          use_reentrant: bool = False, **kwargs: Any) -> Tensor:
    """Run a Sequential (or a list of layers) as ``segments`` pieces, checkpointing each piece but
    the last, as PyTorch does: the last piece's activations are needed at once by backward."""
    preserve_rng_state = kwargs.pop("preserve_rng_state", True)
    if kwargs:
        raise ValueError(f"checkpoint_sequential: unexpected keyword arguments {sorted(kwargs)}")
    layers = list(functions)
    if not 1 <= segments <= len(layers):
        raise ValueError(f"checkpoint_sequential: segments must be between 1 and the number of layers "
                         f"({len(layers)}), got {segments}")
    size = len(layers) // segments
    end = 0
    for start in range(0, size * (segments - 1), size):
        end = start + size
        input = checkpoint(_Layers(layers[start:end]), input, use_reentrant=use_reentrant,
                           preserve_rng_state=preserve_rng_state)
    return _Layers(layers[end:])(input)


def checkpoint_modules(function: Callable, input: Tensor, modules: Sequence[ModuleLike],
                       preserve_rng_state: bool = True, head: Callable | None = None) -> Any:
    """``checkpoint(function, input)`` for a function that reads nothing but its input and the
    parameters and buffers of ``modules`` (a chain of layers, say): those parameters are known, so
    no first run recording a graph is needed to find them. The first run is under ``no_grad``, as
    in the reentrant variant, while gradients travel as in the default one; backward refuses a
    recomputed graph that reaches any other leaf. ``memory.plan`` runs its recomputed ranges so,
    each run of a range as cheap as a forward pass without autograd.

    ``head``, when given, runs all of ``function`` but its last layer, ``modules[-1]``:
    ``function(x)`` is ``modules[-1](head(x))``. When that layer is an ``nn.Linear``, whose
    backward never reads its output, backward recomputes the head only
    (``minigrad.memory.recompute``)."""
    if not is_grad_enabled():
        return function(input)
    call = _Call(function, (input,), {})
    inputs = call.take_tensors()
    seg = _Segment(call, inputs, preserve_rng_state, reentrant=False)
    seg.modules = list(modules)
    seg.head = head
    seg.params = list({id(p): p for m in seg.modules for p in m.parameters() if p.requires_grad}.values())
    with no_grad():
        seg.outputs = call(inputs)
    return CheckpointFunction.apply(seg, *inputs, *seg.params)


# ---------------------------------------------------------------------------------------------
class _Call:
    """``function(*args, **kwargs)`` with its tensor arguments taken out, to be called again on
    other tensors (the recomputation gets them back from the node's saved tensors)."""

    def __init__(self, function: Callable, args: tuple, kwargs: dict) -> None:
        self.function, self.args, self.kwargs = function, list(args), dict(kwargs)
        self.slots: list[int | str] = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
        self.slots += [k for k, v in kwargs.items() if isinstance(v, Tensor)]

    def take_tensors(self) -> list[Tensor]:
        tensors = []
        for slot in self.slots:
            where = self.args if isinstance(slot, int) else self.kwargs
            tensors.append(where[slot])
            where[slot] = None
        return tensors

    def __call__(self, tensors: Sequence[Tensor]) -> Any:
        args, kwargs = list(self.args), dict(self.kwargs)
        for slot, t in zip(self.slots, tensors):
            (args if isinstance(slot, int) else kwargs)[slot] = t
        return self.function(*args, **kwargs)


class _Segment:
    """What a checkpoint keeps to rerun its segment: the call, the random state of every device
    involved, the modules whose buffers the rerun must leave alone, and (use_reentrant=False) the
    tensors the segment reads and the nodes of the graph recorded at forward."""

    def __init__(self, call: _Call, inputs: list[Tensor], preserve_rng_state: bool, reentrant: bool) -> None:
        self.call, self.reentrant = call, reentrant
        self.modules = _modules_of(call.function)
        devices = list(dict.fromkeys([cpu] + [t.device for t in inputs]))
        self.rng_states = {d: backend.get_rng_state(d) for d in devices} if preserve_rng_state else None
        self.params: list[Tensor] = []
        self.inner: weakref.WeakSet | None = None
        self.head: Callable | None = None  # all but the last layer (checkpoint_modules)
        self.outputs: Any = None


class _Layers:
    """Layers called one after another: one segment of ``checkpoint_sequential``."""

    def __init__(self, layers: Sequence[Callable]) -> None:
        self.layers = layers

    def __call__(self, x: Any) -> Any:
        for layer in self.layers:
            x = layer(x)
        return x


def _modules_of(function: Callable) -> list[ModuleLike]:
    """The modules a checkpointed callable runs, when it says: itself, a bound method's module, or
    a segment's layers."""
    found = function.layers if isinstance(function, _Layers) else [function, getattr(function, "__self__", None)]
    return [m for m in found if is_module(m)]
