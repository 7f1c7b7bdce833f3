"""Movement ops: reshape/view, transpose/permute, squeeze, expand, cat/stack, split, pad, flip, repeat.

They move or copy data without arithmetic, so each backward is the inverse movement: reshape
back, permute back, sum a broadcast, slice a concatenation, scatter a padding. Most are compositions
of a few primitives (``Reshape``, ``Permute``, ``BroadcastTo``, ``Cat``, ``Flip``, ``Repeat``, ``Pad``
and indexing). Those that numpy can do without copying return *views* that share memory and the
version counter with their input, as in PyTorch (chapter 02).
"""

from __future__ import annotations

import math
from typing import Sequence

from minigrad import backend
from minigrad.errors import DeviceError, ShapeError
from minigrad.ops.elementwise import Op, cast, clone
from minigrad.ops.indexing import _as_view, _dim_of, getitem, index_select
from minigrad._tensor import Tensor, _dim

__all__ = [
    "broadcast_to", "cat", "chunk", "expand", "flatten", "flip", "movedim", "narrow", "pad", "permute",
    "repeat", "reshape", "roll", "split", "squeeze", "stack", "transpose", "unsqueeze", "view",
]


# -- primitives ----------------------------------------------------------------------------------------
class Reshape(Op):
    kind = "movement"
    batch = "shape"
    returns_view = True

    @staticmethod
    def onnx(b, node, a, shape): return b.add("Reshape", [a, b.shape(node, infer=True)])

    is_identity = True  # whenever the shape stays

    @staticmethod
    def compose(inner, outer): return outer

    @staticmethod
    def forward(ctx, a, shape):
        ctx.shape = a.shape
        return a.reshape(shape)

    @staticmethod
    def backward(ctx, g):
        """The gradient of a reshape is ``g`` reshaped back to the input's shape, ``ctx.shape``.
        The contract of every rule: ``minigrad.autograd.Function.backward``.
        Use ``ctx.ops.reshape``, which reshapes an array or a Tensor.
        """
        ### BEGIN SOLUTION chapter 02: Reshape.backward
        return ctx.ops.reshape(g, ctx.shape), None
        ### END SOLUTION


class BroadcastTo(Op):
    kind = "movement"
    batch = "shape"
    returns_view = True

    @staticmethod
    def onnx(b, node, a, shape): return b.add("Expand", [a, b.shape(node)])

    is_identity = True  # whenever the shape stays

    @staticmethod
    def forward(ctx, a, shape):
        ctx.shape = a.shape
        return ctx.xp.broadcast_to(a, shape)

    @staticmethod
    def backward(ctx, g):
        """Broadcasting copies each input element to many places, so its gradient is the sum of
        ``g`` over those places: ``g`` summed down to the input's shape ``ctx.shape`` (chapter 02's
        ``sum_to``). The contract of every rule: ``minigrad.autograd.Function.backward``.
        Use ``ctx.ops.sum_to``, which is ``sum_to`` on Tensors and the same sum on arrays.
        """
        ### BEGIN SOLUTION chapter 02: BroadcastTo.backward
        return ctx.ops.sum_to(g, ctx.shape), None
        ### END SOLUTION


class Permute(Op):
    kind = "movement"
    batch = "perm"
    returns_view = True

    @staticmethod
    def onnx(b, node, a, dims): return b.add("Transpose", [a], perm=list(dims))

    @staticmethod
    def is_identity(attrs): return tuple(attrs["dims"]) == tuple(range(len(attrs["dims"])))

    @staticmethod
    def compose(inner, outer): return dict(outer, dims=tuple(inner["dims"][d] for d in outer["dims"]))

    @staticmethod
    def forward(ctx, a, dims):
        ctx.dims = dims
        return ctx.xp.transpose(a, dims)

    @staticmethod
    def backward(ctx, g):
        """Forward moved input axis ``ctx.dims[i]`` to output axis ``i``; the gradient is ``g``
        permuted by the inverse permutation, which puts each axis back (for a 2-D transpose the
        permutation is its own inverse; for 3 or more axes it is generally not). The contract of every rule: ``minigrad.autograd.Function.backward``.
        Permute with ``ctx.ops.apply(Permute, g, dims)``.
        """
        ### BEGIN SOLUTION chapter 02: Permute.backward (transpose)
        inverse = [0] * len(ctx.dims)
        for i, d in enumerate(ctx.dims):
            inverse[d] = i
        return ctx.ops.apply(Permute, g, tuple(inverse)), None
        ### END SOLUTION


class Cat(Op):
    kind = "movement"
    batch = "cat"

    @staticmethod
    def onnx(b, node, dim, *xs): return b.add("Concat", list(xs), axis=dim)

    @staticmethod
    def forward(ctx, dim, *arrays):
        ctx.dim, ctx.sizes = dim, [a.shape[dim] for a in arrays]
        return ctx.xp.concatenate(arrays, axis=dim)

    @staticmethod
    def backward(ctx, g):
        """``cat(tensors, dim)``: forward took ``(dim, *arrays)`` and saved ``ctx.dim`` and
        ``ctx.sizes``, each input's length along dim. Return ``None`` for ``dim``, then for each input
        its slice of ``g`` along dim (``narrow``), or ``None`` when it needs no gradient. The contract of every rule: ``minigrad.autograd.Function.backward``.
        Slice with ``ctx.ops.narrow(g, dim, start, length)``.
        """
        ### BEGIN SOLUTION chapter 02: Cat.backward
        grads, start = [], 0
        for n, need in zip(ctx.sizes, ctx.needs_input_grad[1:]):
            grads.append(ctx.ops.narrow(g, ctx.dim, start, n) if need else None)
            start += n
        return (None, *grads)
        ### END SOLUTION


class Flip(Op):
    kind = "movement"
    batch = "dims"
    onnx_refused = "no emitter written yet: Slice with step -1 on each flipped axis"

    @staticmethod
    def forward(ctx, a, dims):
        ctx.dims = dims
        return ctx.xp.flip(a, dims).copy()  # numpy's flip is a view; torch's is a copy

    @staticmethod
    def backward(ctx, g): return ctx.ops.apply(Flip, g, ctx.dims), None


class Repeat(Op):
    kind = "movement"
    onnx_refused = "no emitter written yet: ONNX Tile"

    @staticmethod
    def forward(ctx, a, sizes):
        ctx.shape, ctx.sizes = a.shape, sizes
        return ctx.xp.tile(a, sizes)

    @staticmethod
    def backward(ctx, g):
        # out has shape (r0*s0, r1*s1, ...): split every dim into (copy, position) and add the copies
        shape = (1,) * (len(ctx.sizes) - len(ctx.shape)) + ctx.shape
        split = tuple(n for r, s in zip(ctx.sizes, shape) for n in (r, s))
        one_copy = tuple(n for s in shape for n in (1, s))
        ops = ctx.ops
        return ops.reshape(ops.sum_to(ops.reshape(g, split), one_copy), ctx.shape), None


class Pad(Op):
    """Constant padding; ``pairs`` holds (before, after) for every dim."""

    kind = "movement"

    @staticmethod
    def onnx(b, node, a, pairs, value):
        pads = [lo for lo, _ in pairs] + [hi for _, hi in pairs]
        return b.add("Pad", [a, b.ints(pads), b.scalar(value, node.dtype)], mode="constant")

    @staticmethod
    def forward(ctx, a, pairs, value):
        ctx.inner = tuple(slice(lo, lo + n) for (lo, _), n in zip(pairs, a.shape))
        return ctx.xp.pad(a, pairs, mode="constant", constant_values=value)

    @staticmethod
    def backward(ctx, g): return ctx.ops.getitem(g, ctx.inner), None, None


# -- reshaping -----------------------------------------------------------------------------------------
def _infer_shape(op: str, x: Tensor, shape: Sequence[int]) -> tuple:
    """``shape`` with its one ``-1`` filled in, checked to hold exactly x's elements."""
    shape = tuple(int(n) for n in shape)
    unknown = [i for i, n in enumerate(shape) if n == -1]
    if len(unknown) > 1 or any(n < -1 for n in shape):
        raise ShapeError(f"{op}: invalid shape {shape}; sizes must be >= 0, with at most one -1")
    known = math.prod(n for n in shape if n != -1)
    if unknown:
        if known == 0 or x.numel() % known:
            raise ShapeError(f"{op}: cannot infer the -1 in shape {shape} for a tensor of shape {tuple(x.shape)} "
                             f"({x.numel()} elements)")
        shape = shape[:unknown[0]] + (x.numel() // known,) + shape[unknown[0] + 1:]
    elif known != x.numel():
        raise ShapeError(f"{op}: cannot reshape a tensor of shape {tuple(x.shape)} ({x.numel()} elements) "
                         f"into shape {shape} ({known} elements)")
    return shape


def _viewable(old: tuple, strides: tuple, new: tuple) -> bool:
    """Can ``new`` be laid over memory of shape ``old`` and ``strides`` without a copy? When not,
    ``reshape`` must copy and ``view`` refuses. The strides are numpy's, in bytes: the rule only
    compares a stride with multiples of another, so it reads the same in elements, as below
    (``view`` then skips converting them on every call). PyTorch's rule: walking from the
    last dim, neighbouring old dims whose elements are one evenly spaced run (``stride[d-1] ==
    size[d] * stride[d]``, size-1 dims never breaking a run) form a chunk; every chunk must be the
    product of a run of new dims, which then step through it with the chunk's innermost stride.

    (3, 4) with strides (4, 1) is one chunk of 12: any shape of 12 elements is a view. Its
    transpose, (4, 3) with strides (1, 4), is two chunks, 4 and 3: (2, 2, 3) is a view, (12,) or
    (3, 4) is not. ``x[:, ::2]`` of a (4, 6) tensor, (4, 3) with strides (6, 2), is one chunk of
    12 elements two apart: ``view(12)`` works, with stride 2. A new dim of size 1 fits anywhere."""
    if not old or math.prod(old) == 0:
        return True
    ### BEGIN SOLUTION chapter 01: strided views: when reshape must copy
    n = len(new) - 1
    base, chunk, view = strides[-1], 1, 1
    for d in range(len(old) - 1, -1, -1):
        chunk *= old[d]
        if d == 0 or (old[d - 1] != 1 and strides[d - 1] != chunk * base):  # a chunk ends at d
            while n >= 0 and (view < chunk or new[n] == 1):
                view *= new[n]
                n -= 1
            if view != chunk:
                return False
            if d > 0:
                base, chunk, view = strides[d - 1], 1, 1
    return n == -1
    ### END SOLUTION


def reshape(x: Tensor, shape: Sequence[int]) -> Tensor:
    """The same elements in a new shape (one dim may be -1); a view when no copy is needed."""
    return _as_view(Reshape.apply(x, _infer_shape("reshape", x, shape)), x)


def view(x: Tensor, shape: Sequence[int]) -> Tensor:
    """Like ``reshape``, but always a view: raises when x's layout needs a copy (then use reshape)."""
    shape = _infer_shape("view", x, shape)
    if not _viewable(x.shape, x.array.strides, shape):
        strides = tuple(s // x.array.itemsize for s in x.array.strides)
        raise ShapeError(
            f"view: a tensor of shape {tuple(x.shape)} with strides {strides} (not contiguous) cannot be viewed "
            f"as shape {shape} without a copy; use .reshape(...) or .contiguous() first"
        )
    return _as_view(Reshape.apply(x, shape), x)


def flatten(x: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    if x.ndim == 0:
        return reshape(x, (1,))
    s, e = _dim(start_dim, x.ndim, "flatten"), _dim(end_dim, x.ndim, "flatten")
    if s > e:
        raise ShapeError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim} "
                         f"for a tensor of shape {tuple(x.shape)}")
    return reshape(x, x.shape[:s] + (math.prod(x.shape[s:e + 1]),) + x.shape[e + 1:])


def squeeze(x: Tensor, dim: int | Sequence[int] | None = None) -> Tensor:
    """Drop dims of size 1 (all of them, or those in ``dim``; a listed dim of another size stays)."""
    if dim is None:
        dims = set(range(x.ndim))
    else:
        dims = {_dim(d, x.ndim, "squeeze") for d in ((dim,) if isinstance(dim, int) else dim)}
    return reshape(x, tuple(n for i, n in enumerate(x.shape) if n != 1 or i not in dims))


def unsqueeze(x: Tensor, dim: int) -> Tensor:
    d = _dim(dim, x.ndim + 1, "unsqueeze")
    return reshape(x, x.shape[:d] + (1,) + x.shape[d:])


# -- reordering dims -----------------------------------------------------------------------------------
def permute(x: Tensor, dims: Sequence[int]) -> Tensor:
    if len(dims) != x.ndim:
        raise ShapeError(f"permute: got {len(dims)} dims {tuple(dims)} for a tensor of shape {tuple(x.shape)}")
    dims = tuple(_dim(d, x.ndim, "permute") for d in dims)
    if len(set(dims)) != len(dims):
        raise ShapeError(f"permute: dims {dims} repeat a dimension")
    return _as_view(Permute.apply(x, dims), x)


def transpose(x: Tensor, dim0: int, dim1: int) -> Tensor:
    dims = list(range(x.ndim))
    d0, d1 = _dim(dim0, x.ndim, "transpose"), _dim(dim1, x.ndim, "transpose")
    if x.ndim == 0:
        return permute(x, ())
    dims[d0], dims[d1] = d1, d0
    return permute(x, dims)


def movedim(x: Tensor, source: int | Sequence[int], destination: int | Sequence[int]) -> Tensor:
    """Move the dims in ``source`` to positions ``destination``; the others keep their order."""
    src = [_dim(d, x.ndim, "movedim") for d in ((source,) if isinstance(source, int) else source)]
    dst = [_dim(d, x.ndim, "movedim") for d in ((destination,) if isinstance(destination, int) else destination)]
    if len(src) != len(dst) or len(set(src)) != len(src) or len(set(dst)) != len(dst):
        raise ShapeError(f"movedim: source {source} and destination {destination} must be as many distinct dims")
    order = [None] * x.ndim
    for s, d in zip(src, dst):
        order[d] = s
    rest = iter(d for d in range(x.ndim) if d not in src)
    return permute(x, [d if d is not None else next(rest) for d in order])


# -- broadcasting ----------------------------------------------------------------------------------------
def expand(x: Tensor, sizes: Sequence[int]) -> Tensor:
    """A view with size-1 dims repeated to ``sizes`` (-1 keeps a dim; new leading dims allowed)."""
    sizes = tuple(int(n) for n in sizes)
    lead = len(sizes) - x.ndim
    if lead < 0:
        raise ShapeError(f"expand: target sizes {sizes} have fewer dims than the tensor of shape {tuple(x.shape)}")
    shape = []
    for i, n in enumerate(sizes):
        old = x.shape[i - lead] if i >= lead else None
        if n == -1 and old is not None:
            n = old
        if n < 0 or (old is not None and old != 1 and old != n):
            raise ShapeError(f"expand: cannot expand a tensor of shape {tuple(x.shape)} to {sizes} "
                             f"(dimension {i}: {'new leading dim' if old is None else old} -> {n})")
        shape.append(n)
    shape = tuple(shape)
    if shape == x.shape:  # numpy's broadcast views are read-only; a plain view stays writable
        return _as_view(Reshape.apply(x, shape), x)
    return _as_view(BroadcastTo.apply(x, shape), x)


broadcast_to = expand


# -- joining and splitting -------------------------------------------------------------------------------
def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """Join tensors along an existing ``dim``; dtypes promote as in PyTorch."""
    tensors = list(tensors)
    if not tensors:
        raise ShapeError("cat: expected a non-empty sequence of tensors")
    first = tensors[0]
    for i, t in enumerate(tensors):
        if not isinstance(t, Tensor):
            raise TypeError(f"cat: expected a sequence of Tensors, got {type(t).__name__} at index {i}")
        if t.ndim == 0:
            raise ShapeError(f"cat: zero-dimensional tensor at index {i} cannot be concatenated")
        if t.device is not first.device:
            raise DeviceError(f"cat: tensor {i} is on {t.device} but tensor 0 is on {first.device}")
    d = _dim(dim, first.ndim, "cat")
    for i, t in enumerate(tensors):
        if t.ndim != first.ndim or any(k != d and m != n for k, (m, n) in enumerate(zip(t.shape, first.shape))):
            raise ShapeError(f"cat: tensor {i} has shape {tuple(t.shape)} but tensor 0 has shape {tuple(first.shape)}; "
                             f"they must match except in dimension {d}")
    dtype = first.dtype
    for t in tensors[1:]:
        dtype = backend.result_type(dtype, t.dtype, False, False)
    return Cat.apply(d, *(cast(t, dtype) for t in tensors))


def stack(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """Join equally shaped tensors along a new ``dim``."""
    tensors = list(tensors)
    if not tensors:
        raise ShapeError("stack: expected a non-empty sequence of tensors")
    for i, t in enumerate(tensors):
        if not isinstance(t, Tensor):
            raise TypeError(f"stack: expected a sequence of Tensors, got {type(t).__name__} at index {i}")
        if t.shape != tensors[0].shape:
            raise ShapeError(f"stack: tensor {i} has shape {tuple(t.shape)} but tensor 0 has shape {tuple(tensors[0].shape)}; "
                             "stack needs equal shapes")
    d = _dim(dim, tensors[0].ndim + 1, "stack")
    return cat([unsqueeze(t, d) for t in tensors], d)


def narrow(x: Tensor, dim: int, start: int, length: int) -> Tensor:
    """The view ``x[..., start:start + length, ...]`` along ``dim`` (start may be negative)."""
    d = _dim_of(x, dim, "narrow")
    n, start, length = x.shape[d], int(start), int(length)
    begin = start + n if start < 0 else start
    if not 0 <= begin <= n or length < 0 or begin + length > n:
        raise ShapeError(f"narrow: start {start} and length {length} do not fit in dimension {d} of size {n} "
                         f"(tensor shape {tuple(x.shape)})")
    start = begin
    return getitem(x, (slice(None),) * d + (slice(start, start + length),))


def split(x: Tensor, split_size_or_sections: int | Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
    """Views of x along ``dim``: pieces of ``split_size`` (the last may be smaller) or of the given sizes."""
    d = _dim_of(x, dim, "split")
    n = x.shape[d]
    if isinstance(split_size_or_sections, int):
        size = split_size_or_sections
        if size <= 0 and n > 0:
            raise ShapeError(f"split: split_size must be positive, got {size}")
        count = max(-(-n // size), 1) if size > 0 else 1
        sizes = [size] * (count - 1) + [n - size * (count - 1)]
    else:
        sizes = [int(s) for s in split_size_or_sections]
        if sum(sizes) != n or any(s < 0 for s in sizes):
            raise ShapeError(f"split: sizes {sizes} must be >= 0 and sum to {n}, the size of dimension {d} "
                             f"(tensor shape {tuple(x.shape)})")
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return tuple(narrow(x, d, s, k) for s, k in zip(starts, sizes))


def chunk(x: Tensor, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    """At most ``chunks`` equal views along ``dim`` (the last may be smaller), as torch.chunk."""
    if chunks <= 0:
        raise ShapeError(f"chunk: chunks must be positive, got {chunks}")
    n = x.shape[_dim_of(x, dim, "chunk")]
    return split(x, [0] * chunks if n == 0 else -(-n // chunks), dim)


# -- copies: pad, flip, repeat ---------------------------------------------------------------------------
def pad(x: Tensor, pad: Sequence[int], mode: str = "constant", value: float = 0.0) -> Tensor:
    """``torch.nn.functional.pad``: ``pad = (last_before, last_after, prev_before, ...)``, pairs from
    the last dim backwards. Modes: constant (negative pads crop), reflect, replicate, circular."""
    pad = [int(p) for p in pad]
    if len(pad) % 2 or len(pad) > 2 * x.ndim:
        raise ShapeError(f"pad: needs an even number of sizes, at most 2 per dim, got {tuple(pad)} "
                         f"for shape {tuple(x.shape)}")
    pairs = [(0, 0)] * (x.ndim - len(pad) // 2) + [(pad[i], pad[i + 1]) for i in range(len(pad) - 2, -1, -2)]
    if mode == "constant":
        if any(lo < 0 or hi < 0 for lo, hi in pairs):
            x = getitem(x, tuple(slice(max(-lo, 0), n - max(-hi, 0)) for (lo, hi), n in zip(pairs, x.shape)))
            pairs = [(max(lo, 0), max(hi, 0)) for lo, hi in pairs]
        return Pad.apply(x, tuple(pairs), value)
    if mode not in ("reflect", "replicate", "circular"):
        raise ValueError(f"pad: mode must be 'constant', 'reflect', 'replicate' or 'circular', got {mode!r}")
    xp, out = x.device.xp, x
    for d, ((lo, hi), n) in enumerate(zip(pairs, x.shape)):
        if lo == hi == 0:
            continue
        limit = {"reflect": n - 1, "replicate": math.inf if n else -1, "circular": n}[mode]
        if min(lo, hi) < 0 or max(lo, hi) > limit:
            raise ShapeError(f"pad: {mode} padding ({lo}, {hi}) does not fit dimension {d} of size {n} "
                             f"(shape {tuple(x.shape)})")
        # the padded tensor is x gathered along d at positions mapped back into [0, n)
        i = xp.arange(-lo, n + hi)
        if mode == "reflect":
            i = xp.where(i < 0, -i, xp.where(i >= n, 2 * (n - 1) - i, i))
        else:
            i = xp.clip(i, 0, n - 1) if mode == "replicate" else i % n
        out = index_select(out, d, i)
    return out if out is not x else clone(x)  # nothing padded: still a new tensor, as in torch


def flip(x: Tensor, dims: int | Sequence[int]) -> Tensor:
    dims = tuple(_dim(d, x.ndim, "flip") for d in ((dims,) if isinstance(dims, int) else dims))
    if len(set(dims)) != len(dims):
        raise ShapeError(f"flip: dims {dims} repeat a dimension")
    return Flip.apply(x, dims)


def repeat(x: Tensor, sizes: Sequence[int]) -> Tensor:
    """Tile x: ``sizes[i]`` copies along dim i (extra leading sizes add dims), as Tensor.repeat."""
    sizes = tuple(int(n) for n in sizes)
    if len(sizes) < x.ndim or any(n < 0 for n in sizes):
        raise ShapeError(f"repeat: needs one non-negative count per dim ({x.ndim} or more), got {sizes} "
                         f"for shape {tuple(x.shape)}")
    return Repeat.apply(x, sizes)


def roll(x: Tensor, shifts: int | Sequence[int], dims: int | Sequence[int] | None = None) -> Tensor:
    """Shift elements along ``dims`` with wrap-around (``torch.roll``): two slices joined by cat,
    so the gradient rolls back the other way."""
    if dims is None:
        return reshape(roll(flatten(x), shifts, 0), x.shape)
    shifts = (shifts,) if isinstance(shifts, int) else tuple(shifts)
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    if len(shifts) != len(dims):
        raise ShapeError(f"roll: got {len(shifts)} shifts for {len(dims)} dims; give one shift per dim")
    for shift, dim in zip(shifts, dims):
        dim = _dim_of(x, dim, "roll")
        n = x.shape[dim]
        shift = shift % n if n else 0
        if shift:
            x = cat([narrow(x, dim, n - shift, shift), narrow(x, dim, 0, n - shift)], dim)
    return x
