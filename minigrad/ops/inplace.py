"""In-place ops: ``add_``, ``mul_``, ``copy_``, ``fill_``... and the version counter they bump.

An in-place op writes into the tensor's own memory, so every view of it sees the change, and
bumps the version counter it shares with those views. When autograd needs to record it, it is
applied out of place and the result is written back: the tensor's ``grad_fn`` becomes the new
node, and any node that saved the old value notices the version change and refuses to run
backward with a wrong value (PyTorch's rule, chapter 02). The op's own node is the exception:
where it saved the very tensor it is about to overwrite (``a.mul_(w)`` keeps ``a`` for ``w``'s
gradient), it is given a copy of the values from before the write instead, as PyTorch does.
A write through a view also changes its base: the base's ``grad_fn`` becomes an ``index_put`` of
the view's new value at the view's positions (PyTorch's CopySlices), and the view's old value is
read afresh from the base's graph, so gradients reach what the base held before and what was written.
"""

from __future__ import annotations

from typing import Any, Callable

from minigrad import backend
from minigrad.autograd import grad_mode, mode
from minigrad.autograd.function import SAVED_TENSOR
from minigrad.errors import AutogradError, DTypeError, ShapeError
from minigrad._tensor import Tensor


def _check_target(t: Tensor, op: str, recording: bool) -> None:
    if not recording:
        return
    if t.grad_fn is None and t.requires_grad:
        raise AutogradError(
            f"{op}: a leaf tensor that requires grad is being used in an in-place operation; "
            "wrap the update in `with minigrad.no_grad():`"
        )
    base = _view_base(t)
    if base is not None and base.requires_grad and (base.grad_fn is None or not _made_by_an_op(t)):
        raise AutogradError(
            f"{op}: in-place modification of a view of a leaf tensor that requires grad, or of a view "
            "returned by a custom Function, is not supported by minigrad's autograd (nor by PyTorch's); "
            "use out-of-place ops"
        )


def _view_base(t: Tensor) -> Tensor | None:
    """The tensor whose graph a recorded write into ``t`` changes too: t's base, unless t is the
    base's own array under another name (``y.detach()``), which PyTorch cuts from y's graph; a
    custom Function's output that returns its input's array is a view all the same."""
    base = t._base
    if base is None or t.array is base.array and _made_by_an_op(t):
        return None
    return base


def _made_by_an_op(t: Tensor) -> bool:
    """Whether ``t``'s node (if any) is a built-in op's: a custom Function's output that is a view
    of its input cannot be rewritten from its base, since the Function's backward is opaque."""
    from minigrad.ops.op import Op

    return t.grad_fn is None or isinstance(t.grad_fn, Op)


def _write_back(t: Tensor, result: Tensor, op: str) -> None:
    if result.shape != t.shape:
        raise ShapeError(
            f"{op}: the result has shape {tuple(result.shape)}, which does not fit in place into a "
            f"tensor of shape {tuple(t.shape)}"
        )
    if not t.device.xp.can_cast(result.dtype, t.dtype, casting="same_kind"):
        raise DTypeError(f"{op}: result type {result.dtype} can't be cast to the tensor's dtype {t.dtype} in place")
    try:
        t.device.xp.copyto(t.array, result.array, casting="same_kind")
    except ValueError:  # equal shapes but unequal arrays: the result holds a vmap's batch, t one example
        raise ShapeError(
            f"{op}: the result holds a batch of shape {tuple(result.array.shape)} (one value per example "
            f"of a vmap), which does not fit in place into a tensor the vmap does not batch (shape "
            f"{tuple(t.array.shape)}); write into a batched tensor, or use the out-of-place op"
        ) from None
    t._bump_version()
    if mode.current_modes():  # a traced training step replays this write (optimizer updates)
        mode.inplace_write(t, result)


def inplace(t: Tensor, fn: Callable[..., Tensor], *args: Any) -> Tensor:
    """Apply ``fn(t, *args)`` and store the result in ``t``'s memory (``t.add_(x)`` and friends)."""
    op = fn.__name__ + "_"
    recording = grad_mode.is_grad_enabled() and (
        t.requires_grad or any(isinstance(a, Tensor) and a.requires_grad for a in args)
    )
    _check_target(t, op, recording)
    if not recording and _arithmetic_in_place(t, fn, args):
        return t
    if not recording:
        with grad_mode.no_grad():
            result = fn(t, *args)
        _write_back(t, result, op)
        return t
    from minigrad.ops.indexing import getitem, index_put  # indexing imports this module

    where = _positions(t) if _view_base(t) is not None else None
    if where is not None and t._base.requires_grad:
        _set_graph(t, getitem(t._base, where))  # the view's old value, as its base's graph has it now
    known = {a.grad_fn for a in _tensors((t,) + args) if a.grad_fn is not None}
    result = fn(t, *args)
    _keep_pre_write_values(t, result, known)
    _write_back(t, result, op)
    _set_graph(t, result)
    if where is not None:
        _copy_slices(t, result, where)
    return t


def _copy_slices(view: Tensor, value: Tensor, where: tuple) -> None:
    """The base of ``view`` now holds ``value`` at the view's positions ``where``: so does its graph
    (PyTorch's CopySlices: the old base's gradient is zero there, ``value``'s is read from there)."""
    from minigrad.ops.indexing import index_put  # indexing imports this module

    base = view._base
    _set_graph(base, index_put(base if base.requires_grad else base.detach(), where, value))


def _set_graph(t: Tensor, value: Tensor) -> None:
    """Make ``value``'s node the one that produced ``t`` (which holds ``value``'s values)."""
    t.grad_fn, t._output_nr, t.requires_grad = value.grad_fn, value._output_nr, True


def _positions(view: Tensor) -> tuple:
    """Where each element of ``view`` sits in its base: a tuple of index Tensors of the view's shape,
    one per dim of the base, found from the two arrays' memory addresses and strides."""
    base = view._base
    xp = base.device.xp

    def offsets(a: Any, start: int) -> Any:  # each element's byte offset, in a's shape
        off = xp.full(a.shape, start, dtype=xp.int64)
        for d, (n, s) in enumerate(zip(a.shape, a.strides)):
            off = off + (xp.arange(n, dtype=xp.int64) * s).reshape((n,) + (1,) * (a.ndim - d - 1))
        return off

    ov = offsets(view.array, _address(view.array) - _address(base.array))
    if base.array.flags.c_contiguous:  # the usual base: an element's offset is its flat index's
        flat = ov // base.array.itemsize
    else:  # any other layout: look each offset up among the base's own
        ob = offsets(base.array, 0).ravel()
        order = xp.argsort(ob, kind="stable")
        flat = order[xp.searchsorted(ob[order], ov)]
    return tuple(Tensor(c, device=base.device) for c in xp.unravel_index(flat, base.array.shape))


def _address(a: Any) -> int:
    return a.data.ptr if hasattr(a.data, "ptr") else a.__array_interface__["data"][0]  # cupy, numpy


def _tensors(args: tuple) -> list[Tensor]:
    """The Tensors among an op's arguments, also those inside a tuple or list (an index)."""
    found = []
    for a in args:
        if isinstance(a, Tensor):
            found.append(a)
        elif isinstance(a, (tuple, list)):
            found.extend(x for x in a if isinstance(x, Tensor))
    return found


def _keep_pre_write_values(t: Tensor, result: Tensor, known: set) -> None:
    """Give the nodes ``fn`` just recorded a copy of ``t`` where they saved ``t`` itself (or a view
    sharing its memory), taken now, before the write: the write would otherwise change what they
    read in backward (``a.mul_(w)``: ``w``'s gradient is ``a``'s old value), and they would refuse
    to run. The nodes are the ones between ``result`` and the nodes that made the op's arguments
    (``known``); a node recorded earlier that saved ``t`` still refuses, as in PyTorch. The copy
    is a recorded ``clone``, so a gradient of the backward pass (``create_graph=True``) flows
    through it to ``t``'s history; only an op that saved ``t`` pays for one (``mul_`` does when
    the other factor requires grad)."""
    from minigrad.ops.elementwise import clone

    storage = t._base if t._base is not None else t
    version = storage._vc
    copies: dict = {}
    stack, seen = [result.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in known or node in seen:
            continue
        seen.add(node)
        saved = node._saved
        if type(saved) is tuple and any(_shares(e, storage, version) for e in saved):
            entries = []
            for e in saved:
                if _shares(e, storage, version):
                    c = copies.get(id(e[1]))
                    if c is None:
                        c = copies[id(e[1])] = clone(e[1])
                    e = (SAVED_TENSOR, c, c._version)
                entries.append(e)
            node._saved = tuple(entries)
        stack.extend(edge[0] for edge in node._edges)


def _shares(entry: Any, storage: Tensor, version: int) -> bool:
    """Whether a saved entry is a tensor of ``storage``'s memory, kept at its current version."""
    if type(entry) is not tuple or len(entry) != 3 or entry[0] != SAVED_TENSOR:
        return False
    v = entry[1]
    return (v._base if v._base is not None else v) is storage and entry[2] == version


def _arithmetic_in_place(t: Tensor, fn: Callable, args: tuple) -> bool:
    """Do ``t op= other`` with out=, when that is exactly what the general path would compute.
    Without autograd (an optimizer step under no_grad), ``p.sub_(g)`` can write straight into p's
    memory with the op's ufunc (``Sub.ufunc``): one pass over the data instead of a temporary and a
    copy. ``fn.op`` is the op class of a binary arithmetic function (``add.op is Add``)."""
    op = getattr(fn, "op", None)
    if op is None or len(args) != 1 or mode.sees_writes():
        return False
    name = op.ufunc
    if name == "divide" and t.dtype.kind != "f":
        return False
    other = args[0]
    if isinstance(other, Tensor):
        if other.device is not t.device or other.dtype != t.dtype:
            return False
        other = other.array
    elif not isinstance(other, (int, float)) or (isinstance(other, float) and t.dtype.kind != "f"):
        return False
    shape = getattr(other, "shape", ())
    try:
        if backend.numpy.broadcast_shapes(shape, t.array.shape) != t.array.shape:  # host tuples, not Sizes
            return False
    except ValueError:
        return False  # the general path raises the ShapeError
    getattr(t.device.xp, name)(t.array, other, out=t.array)
    t._bump_version()
    return True


def copy_from(t: Tensor, src: Any) -> Tensor:
    """``t.copy_(src)``: src's values (broadcast to t's shape, cast to t's dtype, moved to t's device)."""
    from minigrad.ops.elementwise import cast, clone, to_device
    from minigrad.ops.movement import broadcast_to

    if not isinstance(src, Tensor):
        src = Tensor(src, dtype=t.dtype, device=t.device)
    if src.device is not t.device:
        src = to_device(src, t.device)
    new = broadcast_to(cast(src, t.dtype), t.shape)
    if grad_mode.is_grad_enabled() and t.requires_grad:
        return _overwrite(t, new)
    return clone(new)  # a new node, so the gradient reaches src


def _overwrite(t: Tensor, new: Tensor) -> Tensor:
    """``new``'s values, in a node that keeps ``t`` as an input with a zero gradient: what t held
    was overwritten, yet t's history stays in the graph and gets zeros (PyTorch's CopyBackwards and
    FillBackward), not nothing. ``where`` with a false condition is that node, and saves no values."""
    from minigrad.ops.elementwise import where

    return where(Tensor(False, device=t.device), t, new)


def fill_(t: Tensor, value: Any) -> Tensor:
    """``t.fill_(v)`` / ``t.zero_()``: every element set to ``value`` (t's old value gets a zero gradient)."""
    recording = grad_mode.is_grad_enabled() and t.requires_grad
    _check_target(t, "fill_", recording)
    raw = value.array if isinstance(value, Tensor) else value
    if isinstance(value, Tensor) and raw.ndim > value.ndim:
        # a vmap's batch of values, one per example in the leading dims: each example fills with its own
        raw = raw.reshape(raw.shape + (1,) * t.ndim)
        if raw.ndim > t.array.ndim:
            raise ShapeError(f"fill_: a value holding a batch of array shape {tuple(value.array.shape)} (one per "
                             f"example of a vmap) cannot fill a tensor the vmap does not batch (array shape "
                             f"{tuple(t.array.shape)})")
    t.array[...] = raw
    t._bump_version()
    if recording:  # t's old history stays in the graph, with a zero gradient
        value = _overwrite(t, t.detach())
        _set_graph(t, value)
        if _view_base(t) is not None:
            _copy_slices(t, value, _positions(t))
    return t
