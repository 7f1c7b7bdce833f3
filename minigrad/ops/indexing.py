"""Indexing: ``x[index]``, ``x[index] = value``, ``gather``, ``index_select`` and their gradients.

Reading ``x[index]`` picks some elements of ``x``; its gradient puts the incoming gradient back
where they came from, into zeros of ``x``'s shape, *adding* where an index repeats (a scatter-add).
Those two ops, ``GetItem`` and ``ScatterIndex``, are each other's backward, so derivatives of any
order flow through indexing; ``gather``, ``index_select`` and ``index_add`` are the same two ops
with a different index. Basic indexing (ints, slices, None, ...) returns a *view*: it shares memory
and the version counter with its base, as in PyTorch (chapter 02, in-place ops and autograd).
"""

from __future__ import annotations

import operator
from typing import Any

from minigrad import backend
from minigrad.backend import value_checks
from minigrad.autograd import grad_mode
from minigrad.autograd.mode import current_modes, index_by_tensors
from minigrad.errors import DeviceError, ShapeError
from minigrad.backend.meta import has_values
from minigrad.ops.elementwise import Op, cast
from minigrad.ops.op import GRADIENT_OP
from minigrad.ops.inplace import inplace
from minigrad._tensor import Tensor, _dim

__all__ = ["gather", "getitem", "index_add", "index_put", "index_select", "scatter_add", "setitem"]


def _as_view(out: Tensor, x: Tensor) -> Tensor:
    """Mark ``out`` as a view of ``x`` when its data lives in x's memory: it then shares x's
    version counter, so an in-place change through either one is caught by autograd's check of
    the tensors saved for backward. Every op that may return a view calls this on its output."""
    if out is not x and x.device.xp.may_share_memory(out.array, x.array):
        out._base = x._base if x._base is not None else x
    return out


# An index is normalised to a pair (basic, advanced): ``a[basic]`` is a view (ints, slices, None,
# ...), and ``advanced`` (None, or a tuple with the integer/bool arrays) then indexes that view.
# Two steps are PyTorch's rule: its ints never count as advanced indices, which decides where the
# indexed dims land (x[0, :, [1, 2]] has shape (3, 2) for x of shape (2, 3, 4); numpy says (2, 3)).
def _take(a: Any, index: tuple) -> Any:
    basic, advanced = index
    return a[basic] if advanced is None else a[basic][advanced]


def _put(xp: Any, out: Any, index: tuple, values: Any, accumulate: bool = False) -> None:
    """Write ``values`` into ``out`` at ``index``, in place (adding them up when ``accumulate``)."""
    basic, advanced = index
    if advanced is None:
        out[basic] = values  # basic indices never repeat
    elif accumulate:
        backend.add_at(xp, out[basic], advanced, values)  # a repeated index adds up
    else:
        out[basic][advanced] = values


# -- the ops ---------------------------------------------------------------------------------------
class GetItem(Op):
    kind = "movement"
    batch = "index"

    @staticmethod
    def forward(ctx, a, index):
        ctx.shape, ctx.index = a.shape, index
        return _take(a, index)

    @staticmethod
    def backward(ctx, g):
        """The gradient of ``a[index]`` has a's shape (``ctx.shape``): zeros, with ``g`` added at the
        positions ``ctx.index`` read (the ``(basic, advanced)`` pair of ``_normalize``). A position read
        twice (``x[[0, 0]]``) receives both gradients added, not the last one. The index gets ``None``.
        The contract of every rule: ``minigrad.autograd.Function.backward``.
        Run another op with ``ctx.ops.apply(OtherOp, *args)``.
        """
        ### BEGIN SOLUTION chapter 02: GetItem.backward
        return ctx.ops.apply(ScatterIndex, g, ctx.shape, ctx.index), None
        ### END SOLUTION

    @staticmethod
    def onnx(b, node, a, index):
        """Basic indexing only: one Slice for the ints and slices, then a Reshape drops the int
        dims and adds the None ones."""
        basic, advanced = index
        if advanced is not None:
            raise b.unsupported(f"{node.name} (GetItem) indexes with integer or boolean tensors; only ints, "
                                "slices, None and ... export")
        shape = node.inputs[0].shape
        items = basic if isinstance(basic, tuple) else (basic,)
        used = sum(i is not None and i is not Ellipsis for i in items)
        items = tuple(x for i in items for x in ((slice(None),) * (len(shape) - used) if i is Ellipsis else (i,)))
        starts, ends, axes, steps, axis = [], [], [], [], 0
        for item in items:
            if item is None:
                continue
            n = shape[axis]
            if isinstance(item, slice):
                start, stop, step = item.indices(n)
                if (start, stop, step) != (0, n, 1):  # a stop before 0 (a backward slice) is -n-1 in ONNX
                    starts, ends, axes, steps = starts + [start], ends + [stop if stop >= 0 else -n - 1], \
                        axes + [axis], steps + [step]
            else:
                i = operator.index(item) % n
                starts, ends, axes, steps = starts + [i], ends + [i + 1], axes + [axis], steps + [1]
            axis += 1
        out = b.add("Slice", [a, b.ints(starts), b.ints(ends), b.ints(axes), b.ints(steps)]) if axes else a
        if all(isinstance(i, slice) for i in items):
            return out
        return b.add("Reshape", [out, b.shape(node, infer=True)])


class ScatterIndex(Op):
    """zeros(shape) with ``g`` added at ``index``, a repeated position getting the sum (a scatter-add)."""

    kind = "movement"
    onnx_refused = GRADIENT_OP

    @staticmethod
    def forward(ctx, g, shape, index):
        ctx.index = index
        out = ctx.xp.zeros(shape, g.dtype)
        _put(ctx.xp, out, index, g, accumulate=True)
        return out

    @staticmethod
    def backward(ctx, g):
        """Forward took ``(g, shape, index)`` and kept ``ctx.index``; ``shape`` and ``index`` get
        ``None``. Each element of forward's ``g`` went to one position of the output, so its
        gradient is the incoming gradient at that position. The contract of every rule:
        ``minigrad.autograd.Function.backward``.
        Run another op with ``ctx.ops.apply(OtherOp, *args)``.
        """
        ### BEGIN SOLUTION chapter 02: ScatterIndex.backward
        return ctx.ops.apply(GetItem, g, ctx.index), None, None
        ### END SOLUTION


class IndexPut(Op):
    """A copy of ``a`` with ``v`` written at ``index`` (``x[index] = v`` when autograd records it)."""

    kind = "movement"
    onnx_refused = "no emitter written yet: ONNX ScatterND"

    @staticmethod
    def forward(ctx, a, index, v):
        ctx.index = index
        out = a.copy()
        _put(ctx.xp, out, index, v)
        return out

    @staticmethod
    def backward(ctx, g):
        """``out = a`` with ``v`` written at ``ctx.index``. The gradient of ``a`` is ``g`` with zeros at
        the overwritten positions (their old values did not reach the output); that of ``v`` is ``g``
        read at the index (the engine sums it to v's shape when v was broadcast); the index gets
        ``None``. Compute only what ``ctx.needs_input_grad`` asks for. The contract of every rule: ``minigrad.autograd.Function.backward``.
        Run another op with ``ctx.ops.apply(OtherOp, *args)``.
        """
        ### BEGIN SOLUTION chapter 02: IndexPut.backward
        need_a, _, need_v = ctx.needs_input_grad
        ga = ctx.ops.apply(IndexPut, g, ctx.index, 0) if need_a else None  # overwritten elements get no gradient
        gv = ctx.ops.apply(GetItem, g, ctx.index) if need_v else None  # the engine sums it to v's shape
        return ga, None, gv
        ### END SOLUTION


# -- index normalisation -----------------------------------------------------------------------------
def _describe(index: Any) -> str:
    """A short rendering of an index for error messages (arrays by shape, not by value)."""
    if isinstance(index, tuple):
        return "(" + ", ".join(_describe(i) for i in index) + ")"
    if isinstance(index, Tensor):
        index = index.array
    if hasattr(index, "shape") and getattr(index, "ndim", 0) > 0:
        return f"array(shape={tuple(index.shape)}, dtype={index.dtype})"
    if isinstance(index, slice):
        parts = (index.start, index.stop) + ((index.step,) if index.step is not None else ())
        return ":".join("" if v is None else str(v) for v in parts)
    return "..." if index is Ellipsis else repr(index)


def _to_array(item: Any, x: Tensor, op: str) -> Any:
    """An index given as a Tensor, array or list, as an integer or bool array on x's device."""
    if isinstance(item, Tensor):
        item = item.array
    if not hasattr(item, "dtype"):
        item = backend.numpy.asarray(item)
        if item.size == 0:
            item = item.astype(backend.int64)  # `x[[]]` selects nothing, as in torch
    arr = backend.to_device(item, x.device)
    if arr.dtype.kind not in "iub":
        raise IndexError(f"{op}: tensors used as indices must be integer or bool, got dtype {arr.dtype}")
    return arr


def check_range(arr: Any, size: int, dim: int, op: str, index: Any, shape: tuple, negative: bool = True) -> None:
    """Raise IndexError naming ``op`` when an index in ``arr`` falls outside ``size`` (below ``-size``
    with ``negative``, below 0 without), the one check every op that looks rows up runs."""
    if arr.size == 0 or not has_values(arr):
        return
    lo, hi = arr.min(), arr.max()  # on a GPU these stay there: the check is read at the next host read

    def message() -> str:
        bad = int(hi) if hi >= size else int(lo)
        return (f"{op}: index {bad} is out of range for dimension {dim} of size {size} "
                f"(index {_describe(index)}, tensor shape {tuple(shape)})")

    xp = backend.device_of(arr).xp
    value_checks.check(xp, (hi >= size) | (lo < (-size if negative else 0)), IndexError, message)


def _normalize(x: Tensor, index: Any, op: str) -> tuple[tuple, tuple | None]:
    """Check ``index`` against x's shape and turn it into a (basic, advanced) pair (see ``_take``)
    whose arrays live on x's device."""
    items, advanced = [], False
    for item in index if isinstance(index, tuple) else (index,):
        if isinstance(item, (Tensor, list, tuple)) or hasattr(item, "dtype"):
            arr = _to_array(item, x, op)
            if arr.ndim == 0 and arr.dtype.kind in "iu":
                item = int(arr)  # a 0-d integer index selects like an int (a view)
            else:
                item, advanced = arr, True
        elif isinstance(item, bool):
            advanced = True  # numpy and torch read True/False as a 0-d mask
        elif not (item is None or item is Ellipsis or isinstance(item, slice)):
            try:
                item = operator.index(item)
            except TypeError:
                raise IndexError(f"{op}: indices must be ints, slices, None, Ellipsis or integer/bool "
                                 f"tensors, got {type(item).__name__}") from None
        items.append(item)
    _check_fits(x, items, index, op)
    if not any(i is Ellipsis for i in items):
        items.append(Ellipsis)  # so that an all-int index gives a 0-d array, not a numpy scalar
    if not advanced:
        return tuple(items), None
    basic, rest = [], []
    for item in items:
        if isinstance(item, bool) or hasattr(item, "dtype"):
            basic += [slice(None)] * _dims_used(item)
            rest.append(item)
        elif isinstance(item, int):
            basic.append(item)
        else:  # a slice or None leaves one dim in the view, Ellipsis as many as it stood for
            basic.append(item)
            rest.append(Ellipsis if item is Ellipsis else slice(None))
    return tuple(basic), tuple(rest)


def _check_fits(x: Tensor, items: list, raw: Any, op: str) -> None:
    """Raise IndexError, naming the index and the shape, for any index that does not fit x."""
    used = sum(_dims_used(i) for i in items)
    if sum(i is Ellipsis for i in items) > 1:
        raise IndexError(f"{op}: an index can only have a single ellipsis, got {_describe(raw)}")
    if used > x.ndim:
        raise IndexError(f"{op}: too many indices for a tensor of shape {tuple(x.shape)}: "
                         f"{_describe(raw)} indexes {used} dimensions")
    d = 0
    for item in items:
        if item is Ellipsis:
            d += x.ndim - used
        elif isinstance(item, int) and not isinstance(item, bool):
            n = x.shape[d]
            if not -n <= item < n:
                raise IndexError(f"{op}: index {item} is out of range for dimension {d} of size {n} "
                                 f"(index {_describe(raw)}, tensor shape {tuple(x.shape)})")
        elif hasattr(item, "dtype") and item.dtype.kind == "b":
            if item.shape != x.shape[d:d + item.ndim]:
                raise IndexError(f"{op}: a bool mask of shape {tuple(item.shape)} must match the sizes "
                                 f"{tuple(x.shape[d:d + item.ndim])} it covers (from dimension {d}) of the tensor "
                                 f"of shape {tuple(x.shape)}")
        elif hasattr(item, "dtype"):
            check_range(item, x.shape[d], d, op, raw, x.shape)
        d += _dims_used(item)


def _dims_used(item: Any) -> int:
    if item is None or item is Ellipsis or isinstance(item, bool):
        return 0
    if hasattr(item, "dtype") and item.dtype.kind == "b":
        return item.ndim
    return 1


def _index(x: Tensor, index: tuple) -> Tensor:
    return _as_view(GetItem.apply(x, index), x)


def _index_array(index: Any, x: Tensor, op: str) -> Any:
    arr = _to_array(index, x, op)
    if arr.dtype.kind == "b":
        raise IndexError(f"{op}: index must be an integer tensor, got dtype {arr.dtype}")
    return arr


def _mesh(x: Tensor, dim: int, idx: Any) -> tuple:
    """The advanced index that picks ``x[i][j][idx[i, j, k]]`` style elements (gather's rule):
    ``idx`` along ``dim``, and along every other dimension the position itself."""
    xp, nd = x.device.xp, idx.ndim
    return tuple(
        idx if k == dim else xp.arange(n).reshape((1,) * k + (n,) + (1,) * (nd - k - 1))
        for k, n in enumerate(idx.shape)
    )


def _check_like(op: str, x: Tensor, dim: int, idx: Any, what: str = "index") -> None:
    """gather/scatter_add rule: same number of dims, no larger than x except along ``dim``."""
    if idx.ndim != x.ndim or any(k != dim and m > n for k, (m, n) in enumerate(zip(idx.shape, x.shape))):
        raise ShapeError(
            f"{op}: {what} of shape {tuple(idx.shape)} must have as many dimensions as the input "
            f"(shape {tuple(x.shape)}) and be no larger outside dimension {dim}"
        )


# -- the functions users call --------------------------------------------------------------------------
def getitem(x: Tensor, index: Any) -> Tensor:
    """``x[index]`` with PyTorch's semantics: ints, slices (any step, also negative, as numpy),
    None, Ellipsis, integer lists/arrays/Tensors and bool masks, mixed freely. Index tensors that
    a vmap batches index each example with its own (``minigrad.batching.index_batched``)."""
    if current_modes() and _holds_tensor(index):
        out = index_by_tensors(getitem, x, index)  # a vmap's, when it batches an index tensor
        if out is not NotImplemented:
            return out
    return _index(x, _normalize(x, index, "getitem"))


def _holds_tensor(index: Any) -> bool:
    return isinstance(index, Tensor) or type(index) is tuple and any(isinstance(i, Tensor) for i in index)


def index_put(x: Tensor, index: Any, value: Any) -> Tensor:
    """A copy of ``x`` with ``value`` (broadcast) written at ``index``; differentiable in both."""
    if current_modes() and _holds_tensor(index):
        out = index_by_tensors(index_put, x, index, value)  # a vmap's, when it batches an index tensor
        if out is not NotImplemented:
            return out
    idx = _normalize(x, index, "index_put")
    if not isinstance(value, Tensor):
        value = Tensor(value, dtype=x.dtype, device=x.device)
    _check_device("index_put", x, value)
    return IndexPut.apply(x, idx, cast(value, x.dtype))


def setitem(t: Tensor, index: Any, value: Any) -> None:
    """``t[index] = value``: written straight into t's memory when autograd needn't record it,
    otherwise as the in-place form of ``index_put`` (so the gradient reaches ``value``), as also
    under a mode that runs ops (a vmap: ``t`` holds a batch, and the index is one example's)."""
    if grad_mode.is_grad_enabled() and (t.requires_grad or (isinstance(value, Tensor) and value.requires_grad)) \
            or any(m.runs_ops for m in current_modes()):
        inplace(t, index_put, index, value)
        return
    idx = _normalize(t, index, "setitem")
    if isinstance(value, Tensor):
        _check_device("setitem", t, value)
        value = value.array
    elif hasattr(value, "dtype"):
        value = backend.to_device(value, t.device)
    elif isinstance(value, (list, tuple)):
        value = t.device.xp.asarray(value)
    try:
        _put(t.device.xp, t.array, idx, value)
    except ValueError as e:
        raise ShapeError(f"setitem: {e} (index {_describe(index)}, tensor shape {tuple(t.shape)})") from None
    t._bump_version()


def _check_device(op: str, x: Tensor, value: Tensor) -> None:
    if value.device is not x.device:
        raise DeviceError(f"{op}: the value is on {value.device} but the tensor is on {x.device}")


def _dim_of(x: Tensor, dim: int, op: str) -> int:
    """``dim`` of a tensor that must have one (PyTorch refuses these ops on 0-d tensors)."""
    if x.ndim == 0:
        raise ShapeError(f"{op}: expects a tensor with at least one dimension, got a 0-d tensor")
    return _dim(dim, x.ndim, op)


def gather(x: Tensor, dim: int, index: Any) -> Tensor:
    """``out[i][j][k] = x[i][index[i][j][k]][k]`` for ``dim=1`` (and likewise for other dims)."""
    d = _dim_of(x, dim, "gather")
    idx = _index_array(index, x, "gather")
    by_tensor = _by_tensor(index)
    _check_like("gather", x, d, index if by_tensor else idx)
    check_range(idx, x.shape[d], d, "gather", idx, x.shape, negative=False)
    if by_tensor:
        return getitem(x, _mesh(x, d, index))
    return _index(x, ((Ellipsis,), _mesh(x, d, idx)))


def _by_tensor(index: Any) -> bool:
    """Whether to read with ``index`` the Tensor (through ``getitem``) rather than its array: when
    a mode on the stack may see more in it, as a vmap sees one index per example in a batched one."""
    return isinstance(index, Tensor) and bool(current_modes())


def index_select(x: Tensor, dim: int, index: Any) -> Tensor:
    """The slices of ``x`` along ``dim`` at the positions in the 1-D ``index`` (repeats allowed)."""
    d = _dim_of(x, dim, "index_select")
    idx = _index_array(index, x, "index_select")
    by_tensor = _by_tensor(index)
    shape = tuple(index.shape if by_tensor else idx.shape)
    if len(shape) > 1:
        raise ShapeError(f"index_select: index must be 1-D, got shape {shape}")
    check_range(idx, x.shape[d], d, "index_select", idx, x.shape, negative=False)
    if by_tensor:
        return getitem(x, (slice(None),) * d + (index.reshape(-1),))
    return _index(x, ((Ellipsis,), (slice(None),) * d + (idx.reshape(-1), Ellipsis)))


def index_add(x: Tensor, dim: int, index: Any, source: Tensor, alpha: float = 1) -> Tensor:
    """A copy of ``x`` with ``alpha * source[..., i, ...]`` added at ``x[..., index[i], ...]``."""
    if isinstance(index, Tensor) and current_modes():  # a vmap's, when it batches the index: per example
        out = index_by_tensors(lambda x, idx, source: index_add(x, dim, idx[0], source, alpha), x, (index,), source)
        if out is not NotImplemented:
            return out
    d = _dim(dim, x.ndim, "index_add")
    idx = _index_array(index, x, "index_add").reshape(-1)
    expected = x.shape[:d] + (len(idx),) + x.shape[d + 1:]
    if source.shape != expected:
        raise ShapeError(f"index_add: source must have shape {expected} for input {tuple(x.shape)} and "
                         f"{len(idx)} indices, got {tuple(source.shape)}")
    check_range(idx, x.shape[d], d, "index_add", idx, x.shape, negative=False)
    spread = ScatterIndex.apply(source, x.shape, ((Ellipsis,), (slice(None),) * d + (idx, Ellipsis)))
    return x + (spread if alpha == 1 else spread * alpha)


def scatter_add(x: Tensor, dim: int, index: Any, src: Tensor) -> Tensor:
    """A copy of ``x`` with ``src[i][j][k]`` added at ``x[i][index[i][j][k]][k]`` for ``dim=1``:
    the transpose of ``gather``."""
    if isinstance(index, Tensor) and current_modes():  # a vmap's, when it batches the index: per example
        out = index_by_tensors(lambda x, idx, src: scatter_add(x, dim, idx[0], src), x, (index,), src)
        if out is not NotImplemented:
            return out
    d = _dim(dim, x.ndim, "scatter_add")
    idx = _index_array(index, x, "scatter_add")
    _check_like("scatter_add", x, d, idx)
    if src.ndim != idx.ndim or any(m > n for m, n in zip(idx.shape, src.shape)):
        raise ShapeError(f"scatter_add: index of shape {tuple(idx.shape)} must be no larger than "
                         f"src of shape {tuple(src.shape)}")
    check_range(idx, x.shape[d], d, "scatter_add", idx, x.shape, negative=False)
    if src.shape != idx.shape:
        src = _index(src, (tuple(slice(0, n) for n in idx.shape), None))  # only the part under index counts
    return x + ScatterIndex.apply(src, x.shape, ((Ellipsis,), _mesh(x, d, idx)))
