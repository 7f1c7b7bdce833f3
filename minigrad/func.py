"""Function transforms, as in ``torch.func``: grad, vjp, jvp, jacrev, jacfwd, hessian, vmap (chapter 02).

A transform takes a function and returns a function. Here every transform is built on the one
reverse-mode engine, always with ``create_graph=True``, so transforms compose: the result of an
inner transform is an ordinary differentiable Tensor expression of its inputs, and an outer
transform differentiates it again (``jacfwd(jacrev(f))`` is the Hessian). Forward mode (``jvp``,
``jacfwd``) comes from the double-vjp trick of ``autograd.functional``: ``u -> J^T u`` is linear
in a dummy cotangent ``u``, so differentiating it with respect to ``u`` along ``v`` gives ``J v``.
``vmap`` runs the function once on the whole batch, each op by its batching rule
(``minigrad.batching``), so ``jacrev`` is one backward pass with the identity's rows as a batch of
cotangents and ``jacfwd`` one with the identity's columns as a batch of tangents. A transform
under a vmap differentiates the whole batch at once where it can (``vmap(grad(f))``: the gradient
of the sum of the examples' outputs holds each one's; ``vmap(jacrev(f))``: each cotangent repeated
for every example) and otherwise (``vjp``, ``jvp``, nested batches) runs once per example.

Results are cut from the graph at the outermost transform unless the caller's own tensors
require grad, in which case they stay connected (as torch.func composes with autograd).
Arguments may be pytrees: Tensors in nested tuples, lists and dicts (``functional_call``'s
parameter dict).
"""

from __future__ import annotations

import functools
import math
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from minigrad.autograd.functional import _fill_in_zeros, _grad, _prepare
from minigrad.autograd.functional import jvp as _jvp
from minigrad.autograd.grad_mode import enable_grad
from minigrad.autograd.mode import current_modes, transform, transform_depth
from minigrad.batching import BatchedTensor, VmapMode, current_level
from minigrad.creation import ones_like, zeros, zeros_like
from minigrad.errors import ArgumentError, ShapeError, TraceError
from minigrad.graph.signature import flatten, unflatten
from minigrad.ops import stack
from minigrad._tensor import Tensor, _wrap

__all__ = ["functional_call", "grad", "grad_and_value", "hessian", "jacfwd", "jacrev", "jvp", "vjp", "vmap"]


def _nested() -> bool:
    return transform_depth() > 0


@contextmanager
def _transform(*given: Any, nested: bool = False) -> Iterator[Callable[[Any], Any]]:
    """Run a transform; yields ``finish``, which cuts the results from the graph unless this
    transform is ``nested`` in another or the caller's tensors (``given``) require grad."""
    keep = nested or _nested() or any(t.requires_grad for t in _flatten(given)[0])
    with transform(), enable_grad():
        yield lambda result: result if keep else _map(lambda t: t.detach(), result)


# -- pytrees: Tensors in nested tuples, lists and dicts (the tracer's flatten and unflatten) ------
def _flatten(tree: Any) -> tuple[list, Any]:
    """``(leaves, spec)``: the tree's Tensors in order, and what ``_unflatten`` rebuilds it from."""
    try:
        spec, leaves = flatten(tree)
    except TraceError:
        raise ArgumentError(f"minigrad.func: expected Tensors in nested tuples, lists and dicts, got "
                            f"{tree!r:.80}") from None
    return leaves, spec


def _unflatten(spec: Any, leaves: list) -> Any:
    return unflatten(spec, iter(leaves))


def _finish_aux(finish: Callable[[Any], Any], aux: Any) -> Any:
    """``aux`` as ``finish`` leaves it, or as it came if it holds values other than Tensors."""
    try:
        return finish(aux)
    except ArgumentError:
        return aux


def _map(fn: Callable[[Tensor], Tensor], tree: Any) -> Any:
    leaves, spec = _flatten(tree)
    return _unflatten(spec, [fn(t) for t in leaves])


# -- which arguments are differentiated ---------------------------------------------------------
def _argnums(argnums: int | tuple[int, ...], n_args: int, fn_name: str) -> tuple[int, ...]:
    nums = argnums if isinstance(argnums, tuple) else (argnums,)
    if not nums or not all(isinstance(i, int) and -n_args <= i < n_args for i in nums):
        raise ArgumentError(f"{fn_name}: argnums must be an int or a non-empty tuple of ints in "
                            f"[{-n_args}, {n_args}) for {n_args} positional arguments, got {argnums!r}")
    return tuple(i % n_args for i in nums)


def _split(args: tuple, nums: tuple[int, ...]) -> tuple[list, Any, Callable[[list], tuple]]:
    """The Tensors of ``args[nums]``, flat; the spec of the tuple ``args[nums]``; and a function
    putting replacements for them back into ``args``."""
    leaves, spec = _flatten(tuple(args[i] for i in nums))

    def rebuild(new_leaves: list) -> tuple:
        new = list(args)
        for i, value in zip(nums, _unflatten(spec, list(new_leaves))):
            new[i] = value
        return tuple(new)
    return leaves, spec, rebuild


def _per_argnums(argnums: Any, flat: list, spec: Any) -> Any:
    """Flat results (one per differentiated Tensor) shaped like the differentiated arguments,
    whose spec ``_split`` gave."""
    tree = _unflatten(spec, flat)
    return tree if isinstance(argnums, tuple) else tree[0]


def _output_and_aux(out: Any, has_aux: bool, fn_name: str) -> tuple[Any, Any]:
    if not has_aux:
        return out, None
    if not (isinstance(out, tuple) and len(out) == 2):
        raise ArgumentError(f"{fn_name}(f, has_aux=True): f must return a tuple (output, aux), got "
                            f"{type(out).__name__}")
    return out


# -- reverse mode -------------------------------------------------------------------------------
def grad_and_value(func: Callable, argnums: int | tuple[int, ...] = 0, has_aux: bool = False) -> Callable:
    """``(gradient, value)`` of a function returning one scalar Tensor (``(gradient, (value, aux))``
    with ``has_aux``); the gradient is shaped like the arguments named by ``argnums``."""
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> tuple[Any, Any]:
        nums = _argnums(argnums, len(args), "grad")
        leaves, spec, rebuild = _split(args, nums)
        level = _batched_level((args, kwargs))
        if level and not _one_level(leaves, level):
            return _per_example(wrapper, args, kwargs, level)
        with _transform(*(args[i] for i in nums)) as finish:
            if level:  # the batch's leaves, differentiated once (see _batch_leaves)
                physical = _prepare(_batch_leaves(leaves, level, _batch_size((args, kwargs), level)),
                                    create_graph=True, need_graph=True)
                inputs = tuple(BatchedTensor(p, level) for p in physical)
            else:
                physical = inputs = _prepare(tuple(leaves), create_graph=True, need_graph=True)
            output, aux = _output_and_aux(func(*rebuild(inputs), **kwargs), has_aux, "grad")
            if not isinstance(output, Tensor) or output.numel() != 1:
                shape = tuple(output.shape) if isinstance(output, Tensor) else type(output).__name__
                raise ShapeError(f"grad: f must return a Tensor with a single element, got {shape}")
            if not level:
                grads = _fill_in_zeros(_grad((output,), inputs, create_graph=True), inputs, False, True, "back")
            elif type(output) is BatchedTensor and output.level == level:
                if type(output.value) is BatchedTensor:  # batched by an outer vmap too: no one-pass form
                    return _per_example(wrapper, args, kwargs, level)
                value = output.value
                grads = _grad((value,), physical, (ones_like(value),), create_graph=True)
                grads = tuple(BatchedTensor(g, level) for g in _fill_in_zeros(grads, physical, False, True, "back"))
            else:  # the output does not depend on the batch, so on no differentiated argument
                grads = tuple(BatchedTensor(zeros_like(p), level) for p in physical)
            gradient = finish(_per_argnums(argnums, list(grads), spec))
            return gradient, ((finish(output), _finish_aux(finish, aux)) if has_aux else finish(output))
    return wrapper


def _one_level(leaves: list, level: int) -> bool:
    """Whether the differentiated tensors are batched by the vmap at ``level`` or not at all."""
    return all(type(t) is not BatchedTensor or (t.level == level and type(t.value) is not BatchedTensor)
               for t in leaves)


def _batch_size(tree: Any, level: int) -> int:
    return next(t.value.shape[0] for t in _flatten_batched(tree) if t.level == level)


def _batch_leaves(leaves: list, level: int, size: int) -> tuple:
    """The differentiated tensors as whole batches, an unbatched one repeated for each example. The
    examples of a batch never mix (each op runs by a batching rule), so the gradient of the sum of
    their outputs with respect to these holds each example's own gradient: one backward pass."""
    return tuple(t.value if type(t) is BatchedTensor else t.unsqueeze(0).expand((size,) + tuple(t.shape))
                 for t in leaves)


def grad(func: Callable, argnums: int | tuple[int, ...] = 0, has_aux: bool = False) -> Callable:
    """The gradient of a function returning one scalar Tensor (``(gradient, aux)`` with ``has_aux``)."""
    g_and_v = grad_and_value(func, argnums, has_aux)

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        gradient, value = g_and_v(*args, **kwargs)
        return (gradient, value[1]) if has_aux else gradient
    return wrapper


def vjp(func: Callable, *primals: Any, has_aux: bool = False) -> tuple:
    """``(func(*primals), vjp_fn)``: ``vjp_fn(cotangents)`` is a tuple, one ``v^T J`` per primal.
    ``vjp_fn`` may be called many times (``vmap(vjp_fn)(rows)`` gives the Jacobian)."""
    level = _batched_level(primals)
    if level:
        pairs = _each_example(lambda i: vjp(func, *_example(primals, level, i), has_aux=has_aux), primals, level)

        def batched_vjp_fn(cotangents: Any) -> tuple:
            return _restack([p[1](_example(cotangents, level, i)) for i, p in enumerate(pairs)], level)
        out = (_restack([p[0] for p in pairs], level), batched_vjp_fn)
        return out + (_restack([p[2] for p in pairs], level),) if has_aux else out
    leaves, _, rebuild = _split(primals, tuple(range(len(primals))))
    nested = _nested()
    with _transform(primals) as finish:
        inputs = _prepare(tuple(leaves), create_graph=True, need_graph=True)
        output, aux = _output_and_aux(func(*rebuild(inputs)), has_aux, "vjp")
    outputs, out_spec = _flatten(output)

    def vjp_fn(cotangents: Any) -> tuple:
        vs, v_spec = _flatten(cotangents)
        if v_spec != out_spec or any(v.shape != o.shape for v, o in zip(vs, outputs)):
            raise ShapeError(f"vjp_fn: cotangents must have the output's structure and shapes "
                             f"{[tuple(o.shape) for o in outputs]}, got {[tuple(v.shape) for v in vs]}")
        with _transform(primals, cotangents, nested=nested) as finish_vjp:
            grads = _grad(tuple(outputs), inputs, tuple(vs), create_graph=True, retain_graph=True)
            return finish_vjp(rebuild(list(_fill_in_zeros(grads, inputs, False, True, "back"))))
    result = (finish(output), vjp_fn)
    return result + (_finish_aux(finish, aux),) if has_aux else result


# -- forward mode, by the double-vjp trick -------------------------------------------------------
def jvp(func: Callable, primals: tuple, tangents: tuple, has_aux: bool = False) -> tuple:
    """``(func(*primals), J tangents)``, computed by differentiating a vjp (see the module docstring)."""
    if not isinstance(primals, (tuple, list)) or not isinstance(tangents, (tuple, list)):
        raise ArgumentError("jvp: primals and tangents must be tuples, as in torch.func.jvp")
    level = _batched_level((primals, tangents))
    if level:
        return _per_example(lambda p, t: jvp(func, p, t, has_aux), (tuple(primals), tuple(tangents)), {}, level)
    leaves, spec, rebuild = _split(tuple(primals), tuple(range(len(primals))))
    t_leaves, t_spec = _flatten(tuple(tangents))
    if t_spec != spec:
        raise ShapeError("jvp: tangents must have the same structure as primals")
    box: dict[str, Any] = {}

    def flat_func(*xs: Tensor) -> tuple:
        out, box["aux"] = _output_and_aux(func(*rebuild(list(xs))), has_aux, "jvp")
        outs, box["spec"] = _flatten(out)
        return tuple(outs)
    with _transform(primals, tangents) as finish:
        outs, jv = _jvp(flat_func, tuple(leaves), tuple(t_leaves), create_graph=True)
        result = finish((_unflatten(box["spec"], list(outs)), _unflatten(box["spec"], list(jv))))
        return result + (_finish_aux(finish, box["aux"]),) if has_aux else result


# -- Jacobians --------------------------------------------------------------------------------
def _jacobian_transform(func: Callable, argnums: Any, has_aux: bool, fn_name: str,
                        compute: Callable[[Callable, tuple, tuple], tuple]) -> Callable:
    """Shared by jacrev and jacfwd: ``compute(flat_func, inputs, lead)`` gives entry ``[i][k]`` =
    d output_i / d input_k, shaped ``lead + output_i.shape + input_k.shape``. ``lead`` is ``()``, or
    ``(B,)`` under a vmap that batches the arguments: then the inputs and outputs are whole batches
    (see ``_batch_leaves``) and each example's Jacobian comes out of the same passes."""
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        nums = _argnums(argnums, len(args), fn_name)
        leaves, spec, rebuild = _split(args, nums)
        level = _batched_level((args, kwargs))
        if level and not _one_level(leaves, level):
            return _per_example(wrapper, args, kwargs, level)
        size = _batch_size((args, kwargs), level) if level else None
        box: dict[str, Any] = {}

        def flat_func(*xs: Tensor) -> tuple:
            if level:
                xs = tuple(BatchedTensor(x, level) for x in xs)
            out, box["aux"] = _output_and_aux(func(*rebuild(list(xs)), **kwargs), has_aux, fn_name)
            outs, box["spec"] = _flatten(out)
            return tuple(_batch_output(o, level, size) for o in outs) if level else tuple(outs)
        with _transform(*(args[i] for i in nums)) as finish:
            try:
                if level:
                    jac = compute(flat_func, _batch_leaves(leaves, level, size), (size,))
                    jac = [[BatchedTensor(j, level) for j in row] for row in jac]
                else:
                    jac = compute(flat_func, tuple(leaves), ())
            except _NotOnePass:
                return _per_example(wrapper, args, kwargs, level)
            result = finish(_unflatten(box["spec"], [_per_argnums(argnums, list(row), spec) for row in jac]))
            return (result, _finish_aux(finish, box["aux"])) if has_aux else result
    return wrapper


class _NotOnePass(Exception):
    """An output is batched by an outer vmap too: the Jacobian is taken once per example instead."""


def _batch_output(t: Tensor, level: int, size: int) -> Tensor:
    """An output of the batched function as a whole batch (one that does not depend on the batch,
    repeated)."""
    if type(t) is BatchedTensor and t.level == level:
        if type(t.value) is BatchedTensor:
            raise _NotOnePass
        return t.value
    if type(t) is BatchedTensor:
        raise _NotOnePass
    return t.unsqueeze(0).expand((size,) + tuple(t.shape))


def _identity(shape: tuple, like: Tensor) -> Tensor:
    """The unit tensors of ``shape``, stacked: ``(n, *shape)``, the rows of the n x n identity; as
    a batch of cotangents they pick out the rows of a Jacobian."""
    n = math.prod(shape)
    return _wrap(like.device.xp.eye(n, dtype=like.dtype).reshape((n,) + shape), like.device)


def _spread(v: Tensor, lead: tuple) -> Tensor:
    """A cotangent or tangent of one example, the same for every example of a batch of ``lead``."""
    return v.unsqueeze(0).expand(lead + tuple(v.shape)) if lead else v


def jacrev(func: Callable, argnums: int | tuple[int, ...] = 0, has_aux: bool = False) -> Callable:
    """The Jacobian by reverse mode: ``vmap`` of the vjp over the identity's rows, so one backward
    pass with a batch of cotangents per output (not one pass per output element)."""
    def compute(flat_func: Callable, inputs: tuple, lead: tuple) -> tuple:
        inputs = _prepare(inputs, create_graph=True, need_graph=True)
        outputs = flat_func(*inputs)
        jac = []
        for out in outputs:
            shape = tuple(out.shape)[len(lead):]  # one example's output
            if out.numel() == 0:
                jac.append(tuple(zeros(tuple(out.shape) + tuple(x.shape)[len(lead):], dtype=x.dtype) for x in inputs))
                continue

            def row(v: Tensor, out: Tensor = out) -> tuple:
                grads = _grad((out,), inputs, (_spread(v, lead),), create_graph=True, retain_graph=True)
                return _fill_in_zeros(grads, inputs, False, True, "back")
            rows = vmap(row, out_dims=len(lead))(_identity(shape, out))  # entry k: lead + (n,) + x's shape
            jac.append(tuple(r.reshape(tuple(out.shape) + tuple(x.shape)[len(lead):]) for r, x in zip(rows, inputs)))
        return tuple(jac)
    return _jacobian_transform(func, argnums, has_aux, "jacrev", compute)


def jacfwd(func: Callable, argnums: int | tuple[int, ...] = 0, has_aux: bool = False) -> Callable:
    """The Jacobian by forward mode: one forward and one backward pass build ``u -> J^T u``, then
    ``vmap`` of its vjp over the identity's columns (``J e_k`` for every k) is one more pass."""
    def compute(flat_func: Callable, inputs: tuple, lead: tuple) -> tuple:
        inputs = _prepare(inputs, create_graph=True, need_graph=True)
        outputs = flat_func(*inputs)
        us = tuple(zeros_like(o, requires_grad=True) for o in outputs)  # J^T u is linear in u
        jt_u = _grad(outputs, inputs, us, create_graph=True)
        jac: list[list[Tensor]] = [[] for _ in outputs]
        for x, g in zip(inputs, jt_u):
            shape = tuple(x.shape)[len(lead):]  # one example's input
            if g is None or x.numel() == 0:  # no output depends on x
                for i, out in enumerate(outputs):
                    jac[i].append(zeros(tuple(out.shape) + shape, dtype=out.dtype))
                continue

            def column(v: Tensor, g: Tensor = g) -> tuple:
                return _fill_in_zeros(_grad((g,), us, (_spread(v, lead),), True, retain_graph=True), outputs,
                                      False, True, "back_trick")
            cols = vmap(column, out_dims=-1)(_identity(shape, x))  # entry i: (*outputs[i].shape, n)
            for i, out in enumerate(outputs):
                jac[i].append(cols[i].reshape(tuple(out.shape) + shape))
        return tuple(tuple(row) for row in jac)
    return _jacobian_transform(func, argnums, has_aux, "jacfwd", compute)


def hessian(func: Callable, argnums: int | tuple[int, ...] = 0) -> Callable:
    """The Hessian of a scalar function: ``jacfwd(jacrev(func))``, as torch.func defines it."""
    return jacfwd(jacrev(func, argnums), argnums)


# -- vmap: the batch through every op at once -----------------------------------------------
def vmap(func: Callable, in_dims: int | None | tuple = 0, out_dims: int | tuple[int, ...] = 0,
         randomness: str = "error", *, chunk_size: int | None = None) -> Callable:
    """``func`` mapped over dimension ``in_dims`` of its arguments (None: not mapped), the results
    stacked along ``out_dims``. ``func`` runs once, on ``BatchedTensor``s that look like one example,
    and each op runs once on the whole batch by its batching rule; an op without a rule runs once
    per example. ``randomness`` says what a random op inside does, as in torch.func: ``"error"``
    raises ``RandomnessError`` naming it, ``"different"`` draws independently for each example,
    ``"same"`` draws once and shares the draw across the batch. ``chunk_size`` changes nothing."""
    if randomness not in ("error", "different", "same"):
        raise ArgumentError(f"vmap: randomness must be 'error', 'different' or 'same', got {randomness!r}")

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        dims = in_dims if isinstance(in_dims, tuple) else (in_dims,) * len(args)
        if len(dims) != len(args):
            raise ArgumentError(f"vmap: in_dims has {len(dims)} entries for {len(args)} positional arguments")
        mapped = [(t, d + t.ndim if d < 0 else d) for a, d in zip(args, dims) if d is not None
                  for t in _flatten(a)[0]]
        sizes = {t.shape[d] for t, d in mapped if 0 <= d < t.ndim}
        if not mapped or len(sizes) != 1 or not all(0 <= d < t.ndim for t, d in mapped):
            raise ShapeError(f"vmap: every mapped argument needs the same size in its in_dim; got shapes "
                             f"{[tuple(t.shape) for t, _ in mapped]} with in_dims {in_dims}")
        size, level = sizes.pop(), current_level() + 1

        def batch(t: Tensor, d: int) -> BatchedTensor:
            d %= t.ndim
            return BatchedTensor(t.movedim(d, 0) if d else t, level)
        batched = tuple(a if d is None else _map(lambda t, d=d: batch(t, d), a) for a, d in zip(args, dims))
        with VmapMode(level, size, randomness):
            result = func(*batched, **kwargs)
        leaves, spec = _flatten(result)
        outs = out_dims if isinstance(out_dims, tuple) else (out_dims,) * len(leaves)
        if len(outs) != len(leaves):
            raise ArgumentError(f"vmap: out_dims has {len(outs)} entries for {len(leaves)} outputs")
        return _unflatten(spec, [_unbatch(t, d, level, size) for t, d in zip(leaves, outs)])
    return wrapper


def _unbatch(t: Tensor, dim: int, level: int, size: int) -> Tensor:
    """A result of the vmap at ``level`` as one tensor with the batch at ``dim``; a result that did
    not depend on the batch is repeated ``size`` times, as torch.func does."""
    if type(t) is BatchedTensor and t.level == level:
        value = t.value
        d = dim % value.ndim
        return value.movedim(0, d) if d else value
    d = dim % (t.ndim + 1)
    shape = tuple(t.shape)
    return t.unsqueeze(d).expand(shape[:d] + (size,) + shape[d:])


# -- transforms whose arguments an enclosing vmap batches: once per example --------------------
def _tree_map(fn: Callable[[Any], Any], tree: Any) -> Any:
    if isinstance(tree, (tuple, list)):
        return type(tree)(_tree_map(fn, e) for e in tree)
    if isinstance(tree, dict):
        return {k: _tree_map(fn, v) for k, v in tree.items()}
    return fn(tree)


def _batched_level(tree: Any) -> int:
    """The innermost vmap level batching any tensor of ``tree`` (0: none)."""
    found = [0]
    _tree_map(lambda t: found.append(t.level) if type(t) is BatchedTensor else None, tree)
    return max(found)


def _example(tree: Any, level: int, i: int) -> Any:
    return _tree_map(lambda t: t.value[i] if type(t) is BatchedTensor and t.level == level else t, tree)


def _restack(results: list, level: int) -> Any:
    """Per-example results (equal trees) as one tree of tensors batched at ``level``."""
    first = results[0]
    if isinstance(first, (tuple, list)):
        return type(first)(_restack([r[k] for r in results], level) for k in range(len(first)))
    if isinstance(first, dict):
        return {k: _restack([r[k] for r in results], level) for k in first}
    return BatchedTensor(stack(results, 0), level) if isinstance(first, Tensor) else first


def _per_example(call: Callable, args: tuple, kwargs: dict, level: int) -> Any:
    """``call(*args, **kwargs)`` once per example of the vmap at ``level``, restacked: a transform
    on batched arguments differentiates each example's own graph."""
    return _restack(_each_example(lambda i: call(*_example(args, level, i), **_example(kwargs, level, i)),
                                  (args, kwargs), level), level)


def _each_example(run: Callable[[int], Any], tree: Any, level: int) -> list:
    """``run(i)`` for each example of the vmap at ``level``, which ``tree`` is batched by; random
    ops inside draw as its ``randomness`` says (``VmapMode.each_example``)."""
    mode = next(m for m in current_modes() if isinstance(m, VmapMode) and m.level == level)
    return mode.each_example(run, [t.device for t in _flatten_batched(tree) if t.level == level])


def _flatten_batched(tree: Any) -> list:
    found: list = []
    _tree_map(lambda t: found.append(t) if type(t) is BatchedTensor else None, tree)
    return found


def functional_call(module: Any, parameter_and_buffer_dicts: dict | tuple, args: Any = (),
                    kwargs: dict | None = None, *, tie_weights: bool = True, strict: bool = False) -> Any:
    """Call ``module`` with some of its parameters and buffers replaced by the given tensors (by
    dotted name), then put the originals back: the module as a function of its weights."""
    dicts = parameter_and_buffer_dicts if isinstance(parameter_and_buffer_dicts, tuple) else (parameter_and_buffer_dicts,)
    given = {name: t for d in dicts for name, t in d.items()}
    tied: dict[int, list[str]] = {}
    for name, p in list(module.named_parameters(remove_duplicate=False)) + list(module.named_buffers(remove_duplicate=False)):
        tied.setdefault(id(p), []).append(name)
    names = {n for group in tied.values() for n in group}
    unexpected = sorted(set(given) - names)
    missing = sorted(names - set(given))
    if unexpected or (strict and missing):
        raise ArgumentError(f"functional_call: unexpected keys {unexpected}, missing keys "
                            f"{missing if strict else []}")
    if tie_weights:
        for group in tied.values():
            source = next((n for n in group if n in given), None)
            given.update({n: given[source] for n in group if source is not None and n not in given})
    saved = []
    try:
        for name, t in given.items():
            owner, _, leaf = name.rpartition(".")
            mod = module.get_submodule(owner) if owner else module
            store = mod._parameters if leaf in mod._parameters else mod._buffers
            saved.append((store, leaf, store[leaf]))
            store[leaf] = t
        return module(*(args if isinstance(args, tuple) else (args,)), **(kwargs or {}))
    finally:
        for store, leaf, old in reversed(saved):
            store[leaf] = old
