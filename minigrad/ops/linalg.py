"""Matrix products: ``matmul`` (with ``mm``, ``bmm``, ``dot``, ``outer``) and ``einsum``.

For ``C = A @ B`` the chain rule gives ``dA = dC @ B^T`` and ``dB = A^T @ dC``: the backward of a
matrix product is two more matrix products (chapter 02 derives it on an MLP). Batch dimensions
broadcast as in numpy, and the engine sums a broadcast gradient back to each input's shape. An
einsum's gradient with respect to one operand is another einsum: contract the output gradient
with the other operands into that operand's subscripts.
"""

from __future__ import annotations

import math
import string
from typing import Any

from minigrad import backend
from minigrad.autograd import mode
from minigrad.errors import DTypeError, ShapeError
from minigrad.ops.elementwise import Op, cast
from minigrad.ops.movement import BroadcastTo, broadcast_to, reshape
from minigrad._tensor import Tensor, _wrap

__all__ = ["bmm", "dot", "einsum", "linear", "matmul", "mm", "outer"]


class Linear(Op):
    """``x @ w.T + b`` in one op, as PyTorch's ``F.linear`` (a GEMM with a bias epilogue). Batch
    dims of x fold into the rows; the weight gradient comes out in the weight's own layout."""

    kind = "matmul"
    batch = "rows"
    epilogue = True
    channel_axis = -1
    autocast = "low"

    @staticmethod
    def onnx(b, node, x, w, bias):
        if len(node.shape) == 2:  # one GEMM with the weight transposed in place and the bias added
            return b.add("Gemm", [x, w] + ([bias] if bias is not None else []), transB=1)
        y = b.add("MatMul", [x, b.add("Transpose", [w], perm=[1, 0])])
        return y if bias is None else b.add("Add", [y, bias])

    @staticmethod
    def forward(ctx, x, w, b):
        need_x, need_w = ctx.needs_input_grad[:2]
        ctx.save_for_backward(x if need_w else None, w if need_x else None)
        y = x.reshape(_rows(x.shape), x.shape[-1]) @ w.T  # not -1, which numpy cannot infer for 0 features
        if b is not None:
            y += b
        return y.reshape(x.shape[:-1] + w.shape[:1])

    @staticmethod
    def backward(ctx, g):
        """``y = x @ w.T + b`` with x (..., in), w (out, in), b (out,) or ``None``; g is (..., out).
        Forward saved ``(x, w)`` (each only when the other needs a gradient). The weight's
        gradient has w's shape, summed over every row of the batch (fold the batch dims into
        rows, as forward does, for one matrix product); the bias's is g summed over the rows.
        Compute only what ``ctx.needs_input_grad`` asks for. The contract of every rule:
        ``minigrad.autograd.Function.backward``.
        Use ``ctx.ops.matmul``, ``ctx.ops.reshape`` and ``ctx.ops.sum``: arrays or Tensors, as the
        engine bound the rule.
        """
        ### BEGIN SOLUTION chapter 02: Linear.backward
        x, w = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad
        ops = ctx.ops
        rows = ops.reshape(g, (_rows(g.shape), g.shape[-1]))
        gx = ops.matmul(g, w) if need_x else None
        gw = ops.matmul(rows.mT, ops.reshape(x, (_rows(x.shape), x.shape[-1]))) if need_w else None
        gb = ops.sum(rows, 0) if need_b else None
        return gx, gw, gb
        ### END SOLUTION


def _rows(shape: tuple) -> int:
    """The rows a (..., features) array folds into: the product of its batch dims."""
    return math.prod(shape[:-1])


def linear(x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    """``x @ w.T + b`` for x (..., in), w (out, in), b (out,): the affine map of ``nn.Linear``."""
    xs, ws = x.array.shape, w.array.shape  # the arrays' tuples: a Size is slower to build and index
    # trailing dims only: under vmap the arrays carry a leading batch dim (minigrad.batching)
    if xs[-1:] != ws[-1:] or w.ndim != 2 or (b is not None and (b.ndim != 1 or b.array.shape[-1:] != ws[-2:-1])):
        raise ShapeError(
            f"linear: input of shape {tuple(x.shape)} does not fit weight {tuple(w.shape)}"
            + (f" and bias {tuple(b.shape)}" if b is not None else "")
            + " (expected input (..., in), weight (out, in), bias (out,))"
        )
    # mixed dtypes: let matmul promote, unless autocast is about to cast all three to one dtype
    if (w.dtype != x.dtype or (b is not None and b.dtype != x.dtype)) and not mode.casts_inputs():
        out = matmul(x, w.mT)
        return out if b is None else out + b
    return Linear.apply(x, w, b)


class Matmul(Op):
    kind = "matmul"
    batch = "matmul"
    epilogue = True
    onnx = "MatMul"
    autocast = "low"

    @staticmethod
    def forward(ctx, a, b):
        need_a, need_b = ctx.needs_input_grad
        ctx.save_for_backward(a if need_b else None, b if need_a else None)
        ctx.ndims = a.ndim, b.ndim
        a, b = _dense(ctx.xp, a), _dense(ctx.xp, b)
        if a.ndim > 2 and b.ndim == 2:
            # (..., n, k) @ (k, m) as one (B*n, k) @ (k, m) product: numpy would otherwise run a
            # small matrix product per batch element, several times slower
            return ctx.xp.matmul(a.reshape(-1, a.shape[-1]), b).reshape(a.shape[:-1] + b.shape[-1:])
        return ctx.xp.matmul(a, b)

    @staticmethod
    def backward(ctx, g):
        """For 2-D ``a @ b``: ``da = g @ b^T`` and ``db = a^T @ g`` (``.mT`` transposes the last two
        dims). Forward saved ``(a, b)`` (each only when the other needs a gradient) and
        ``ctx.ndims``: a 1-D ``a`` acted as a row ``(1, k)``, a 1-D ``b`` as a column ``(k, 1)``, and
        both 1-D is a dot product with a 0-D ``g``; batched operands broadcast over their leading
        dims (the engine sums a gradient back to a smaller batch shape). The contract of every rule: ``minigrad.autograd.Function.backward``.
        Multiply with ``ctx.ops.matmul`` (the op's own product under either binding, so the two
        agree bit for bit) and add axes with ``ctx.ops.unsqueeze``; ``.mT`` works on arrays and Tensors alike.
        """
        ### BEGIN SOLUTION chapter 02: Matmul.backward
        a, b = ctx.saved_tensors
        need_a, need_b = ctx.needs_input_grad
        na, nb = ctx.ndims
        mm, unsqueeze, reshape = ctx.ops.matmul, ctx.ops.unsqueeze, ctx.ops.reshape
        if na == 1 and nb == 1:  # a dot product: g is 0-D
            return (g * b if need_a else None), (g * a if need_b else None)
        if na == 1:  # (k) @ (..., k, m): a acts as a (1, k) row
            row = unsqueeze(g, -2)
            return (mm(row, b.mT) if need_a else None), (mm(unsqueeze(a, -1), row) if need_b else None)
        if nb == 1:  # (..., n, k) @ (k): b acts as a (k, 1) column
            return (mm(unsqueeze(g, -1), unsqueeze(b, -2)) if need_a else None), (mm(unsqueeze(g, -2), a) if need_b else None)
        ga = mm(g, b.mT) if need_a else None
        gb = None
        if need_b:
            if nb == 2 and na > 2:
                # fold the batch into the rows, as forward does: one (k, B*n) @ (B*n, m) product
                # instead of B of them followed by a sum over the batch
                gb = mm(reshape(a, (-1, a.shape[-1])).mT, reshape(g, (-1, g.shape[-1])))
            else:
                gb = mm(a.mT, g)
        return ga, gb
        ### END SOLUTION


def _dense(xp: Any, x: Any) -> Any:
    """A broadcast array (a zero stride, as the gradient of a sum is) defeats BLAS, and numpy
    falls back to a loop many times slower than copying it first."""
    if 0 in x.strides and any(s == 0 and n > 1 for s, n in zip(x.strides, x.shape)):  # (the first test is cheap)
        return xp.ascontiguousarray(x)
    return x


def _operand(x: Any, other: Any, op: str) -> Tensor:
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (bool, int, float)):
        raise TypeError(f"{op}: both arguments must be tensors, got a Python {type(x).__name__}")
    device = other.device if isinstance(other, Tensor) else None
    return Tensor(x, device=device)


def _promote(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """The same dtype rules as elementwise ops: int with float gives the float's dtype."""
    if a.dtype is b.dtype:
        return a, b
    dt = backend.result_type(a.dtype, b.dtype, False, False)
    return cast(a, dt), cast(b, dt)


def _batch_broadcast(sa: tuple, sb: tuple) -> bool:
    for x, y in zip(reversed(sa), reversed(sb)):
        if x != y and x != 1 and y != 1:
            return False
    return True


def matmul(input: Tensor, other: Tensor) -> Tensor:  # noqa: A002  (torch's names, as keywords too)
    """``a @ b`` with PyTorch's rules: 1-D @ 1-D is a dot product, a 1-D operand is treated as a
    row (left) or column (right) vector and that dim is dropped, leading dims broadcast."""
    a, b = _operand(input, other, "matmul"), _operand(other, input, "matmul")
    sa, sb = tuple(a.shape), tuple(b.shape)
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError(f"matmul: both arguments need at least 1 dimension, got shapes {sa} and {sb}")
    k_b = sb[0] if b.ndim == 1 else sb[-2]
    if sa[-1] != k_b:
        raise ShapeError(
            f"matmul: shapes {sa} and {sb} cannot be multiplied ({sa[-1]} columns in the first, "
            f"{k_b} rows in the second)"
        )
    if not _batch_broadcast(sa[:-2], sb[:-2]):
        raise ShapeError(f"matmul: the batch dimensions of shapes {sa} and {sb} do not broadcast")
    return Matmul.apply(*_promote(a, b))


def mm(input: Tensor, mat2: Tensor) -> Tensor:  # noqa: A002  (torch's names, as keywords too)
    """Matrix product of two 2-D tensors."""
    a, b = _operand(input, mat2, "mm"), _operand(mat2, input, "mm")
    if a.ndim != 2 or b.ndim != 2:
        raise ShapeError(f"mm: expected two 2-D tensors, got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    return matmul(a, b)


def bmm(input: Tensor, mat2: Tensor) -> Tensor:  # noqa: A002  (torch's names, as keywords too)
    """Batched matrix product of (B, n, k) and (B, k, m) tensors (no broadcasting)."""
    a, b = _operand(input, mat2, "bmm"), _operand(mat2, input, "bmm")
    if a.ndim != 3 or b.ndim != 3 or a.shape[0] != b.shape[0]:
        raise ShapeError(
            f"bmm: expected (B, n, k) and (B, k, m) tensors with the same B, got shapes "
            f"{tuple(a.shape)} and {tuple(b.shape)}"
        )
    return matmul(a, b)


def dot(a: Tensor, b: Tensor) -> Tensor:
    """Inner product of two 1-D tensors of the same length."""
    a, b = _operand(a, b, "dot"), _operand(b, a, "dot")
    if a.ndim != 1 or b.ndim != 1 or a.shape != b.shape:
        raise ShapeError(
            f"dot: expected two 1-D tensors of the same length, got shapes {tuple(a.shape)} and {tuple(b.shape)}"
        )
    if a.dtype != b.dtype:
        raise DTypeError(f"dot: expected both tensors to have the same dtype, got {a.dtype} and {b.dtype}")
    return matmul(a, b)


def outer(a: Tensor, b: Tensor) -> Tensor:
    """Outer product of two 1-D tensors: ``out[i, j] = a[i] * b[j]``."""
    a, b = _operand(a, b, "outer"), _operand(b, a, "outer")
    if a.ndim != 1 or b.ndim != 1:
        raise ShapeError(f"outer: expected two 1-D tensors, got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    return reshape(a, (-1, 1)) * reshape(b, (1, -1))


# -- einsum ------------------------------------------------------------------------------------------
class Einsum(Op):
    """``forward(ctx, equation, *operands)``: the equation is explicit, one letter per axis."""

    kind = "matmul"
    autocast = "low"

    @staticmethod
    def onnx(b, node, equation, *xs): return b.add("Einsum", list(xs), equation=equation)

    @staticmethod
    def forward(ctx, equation, *operands):
        ctx.equation = equation
        ctx.shapes = [o.shape for o in operands]
        ctx.save_for_backward(*operands)
        # a contraction path only pays for itself with two operands or more
        return ctx.xp.einsum(equation, *operands, optimize=len(operands) > 1)

    @staticmethod
    def backward(ctx, g):
        operands = ctx.saved_tensors
        lhs, out = ctx.equation.split("->")
        terms = lhs.split(",")
        grads = [None]
        for k, need in enumerate(ctx.needs_input_grad[1:]):
            grads.append(_einsum_grad(ctx.ops, ctx.xp, g, terms, out, operands, k, ctx.shapes) if need else None)
        return tuple(grads)


def _einsum_grad(ops: Any, xp: Any, g: Any, terms: list, out: str, operands: tuple, k: int, shapes: list) -> Any:
    """d(einsum)/d(operand k): contract g with every other operand into operand k's subscripts.
    Letters only operand k has were summed out, so the gradient is broadcast along them; a letter
    repeated in operand k (a diagonal, as in 'ii->i') puts the gradient back on that diagonal."""
    term = terms[k]
    sizes = {}
    for t, shape in zip(terms, shapes):
        for c, n in zip(t, shape):
            sizes[c] = max(sizes.get(c, 1), n)
    rest = [(t, o) for j, (t, o) in enumerate(zip(terms, operands)) if j != k] + [(out, g)]
    have = set("".join(t for t, _ in rest))
    letters = "".join(dict.fromkeys(term))
    kept = "".join(c for c in letters if c in have)
    grad = ops.apply(Einsum, ",".join(t for t, _ in rest) + "->" + kept, *[o for _, o in rest])
    if kept != letters:
        grad = ops.reshape(grad, tuple(grad.shape[kept.index(c)] if c in kept else 1 for c in letters))
    full = tuple(sizes[c] for c in letters)
    if grad.shape != full:  # the other operands were broadcast along some of these letters
        grad = ops.apply(BroadcastTo, grad, full)
    if letters != term:
        free = iter(c for c in string.ascii_letters if c not in "".join(terms) + out)
        renamed, eyes, seen = "", [], set()
        for c in term:
            if c in seen:
                f = next(free)
                renamed += f
                eyes.append(c + f)
            else:
                renamed += c
                seen.add(c)
        eye = [ops.constant(xp.eye(sizes[e[0]], dtype=g.dtype)) for e in eyes]
        grad = ops.apply(Einsum, ",".join([letters] + eyes) + "->" + renamed, grad, *eye)
    return grad


def _parse(equation: str, shapes: list) -> str:
    """Rewrite an einsum equation in explicit form with no ellipsis, checking it against shapes."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise ShapeError(f"einsum: equation {equation!r} has {len(terms)} operand(s), but {len(shapes)} were given")
    for t in terms + [rhs]:
        if not all(c in string.ascii_letters for c in t.replace("...", "", 1)):
            raise ValueError(f"einsum: invalid subscripts {t!r} in {equation!r}: use letters and at most one '...'")
    used = set(eq)
    free = [c for c in string.ascii_letters if c not in used]
    n_ell = [len(s) - (len(t) - 3) if "..." in t else 0 for t, s in zip(terms, shapes)]
    width = max(n_ell, default=0)
    if width > len(free):
        raise ValueError(f"einsum: {equation!r} needs more distinct letters than are left")
    ell = "".join(free[:width])
    expanded = []
    for t, s, n in zip(terms, shapes, n_ell):
        e = t.replace("...", ell[width - n:]) if "..." in t else t
        if n < 0 or len(e) != len(s):
            raise ShapeError(f"einsum: subscripts {t!r} do not fit an operand of shape {tuple(s)} in {equation!r}")
        expanded.append(e)
    if arrow:
        out = rhs.replace("...", ell)
    else:  # implicit output: broadcast dims, then every letter used once, in alphabetical order
        counts = "".join(terms)
        out = ell + "".join(sorted(c for c in set(counts) if c != "." and counts.count(c) == 1))
    sizes: dict = {}
    for e, s in zip(expanded, shapes):
        for c, n in zip(e, s):
            if sizes.get(c, 1) != 1 and n != 1 and sizes[c] != n:
                raise ShapeError(
                    f"einsum: subscript {c!r} has size {sizes[c]} in one operand and {n} in another "
                    f"({equation!r} with shapes {', '.join(str(tuple(x)) for x in shapes)})"
                )
            sizes[c] = n if sizes.get(c, 1) == 1 else sizes[c]
    if len(set(out)) != len(out) or any(c not in sizes for c in out):
        raise ValueError(
            f"einsum: output subscripts {rhs!r} in {equation!r} must be distinct letters used by the inputs"
        )
    return ",".join(expanded) + "->" + out


def einsum(equation: str, *operands: Tensor) -> Tensor:
    """Einstein summation, as ``torch.einsum``: ``einsum('bij,bjk->bik', a, b)``. Supports any
    number of operands, implicit output, repeated indices ('ii->i'), broadcasting '...'."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not operands or not all(isinstance(o, Tensor) for o in operands):
        raise TypeError("einsum: expected one or more Tensor operands after the equation")
    dt = operands[0].dtype
    for o in operands[1:]:
        dt = backend.result_type(dt, o.dtype, False, False)
    operands = tuple(cast(o, dt) for o in operands)
    return Einsum.apply(_parse(equation, [o.shape for o in operands]), *operands)
