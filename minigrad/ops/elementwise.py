"""Elementwise ops: arithmetic with broadcasting, math functions, comparisons, casts.

Each op is a ``Function`` whose forward computes on ``xp`` arrays and whose backward is one line
of minigrad ops per input (chapter 02's table of derivatives). Broadcasting is undone once, by the
engine, so ``Add.backward`` just returns ``g, g``. ``_binary`` applies PyTorch's dtype rules
before an op runs: Python scalars never widen a tensor's dtype, and int with float gives float.
"""

from __future__ import annotations

import math
from typing import Any

from minigrad import backend
from minigrad.autograd.function import Function
from minigrad.errors import DTypeError
from minigrad.tensor import Tensor, _wrap

__all__ = [
    "Op", "abs", "add", "cast", "clamp", "clip", "clone", "contiguous", "cos", "div", "eq", "exp",
    "ge", "gt", "le", "log", "logical_and", "logical_not", "logical_or", "lt",
    "maximum", "minimum", "mul", "ne", "neg", "pow", "rsqrt", "sigmoid", "sign", "sin", "sqrt", "sub",
    "tanh", "to_device", "where",
]


class Op(Function):
    """A built-in op: forward receives and returns raw ``xp`` arrays."""

    array_forward = True


def _save_other(ctx: Function, a: Any, b: Any) -> None:
    """Save only what backward will read: b for a's gradient, a for b's (as in ``a * b``)."""
    need_a, need_b = ctx.needs_input_grad
    ctx.save_for_backward(a if need_b else None, b if need_a else None)


# -- arithmetic ------------------------------------------------------------------------------------
class Add(Op):
    @staticmethod
    def forward(ctx, a, b): return a + b
    @staticmethod
    def backward(ctx, g): return g, g


class Sub(Op):
    @staticmethod
    def forward(ctx, a, b): return a - b
    @staticmethod
    def backward(ctx, g): return g, (-g if ctx.needs_input_grad[1] else None)


class Mul(Op):
    @staticmethod
    def forward(ctx, a, b):
        _save_other(ctx, a, b)
        return a * b

    @staticmethod
    def backward(ctx, g):
        ### BEGIN SOLUTION chapter 02: Mul.backward
        a, b = ctx.saved_tensors
        return (g * b if b is not None else None), (g * a if a is not None else None)
        ### END SOLUTION


class Div(Op):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a if ctx.needs_input_grad[1] else None, b)
        return a / b

    @staticmethod
    def backward(ctx, g):
        ### BEGIN SOLUTION chapter 02: Div.backward
        a, b = ctx.saved_tensors
        return (g / b if ctx.needs_input_grad[0] else None), (-g * a / (b * b) if a is not None else None)
        ### END SOLUTION


class Neg(Op):
    @staticmethod
    def forward(ctx, a): return -a
    @staticmethod
    def backward(ctx, g): return -g


class Pow(Op):
    @staticmethod
    def forward(ctx, a, b):
        out = a ** b
        ctx.save_for_backward(a, b, out if ctx.needs_input_grad[1] else None)
        return out

    @staticmethod
    def backward(ctx, g):
        ### BEGIN SOLUTION chapter 02: Pow.backward
        a, b, out = ctx.saved_tensors
        ga = g * b * a ** (b - 1) if ctx.needs_input_grad[0] else None
        if ctx.needs_input_grad[1]:  # a may be a Python number (2 ** x)
            return ga, g * out * (log(a) if isinstance(a, Tensor) else math.log(a))
        return ga, None
        ### END SOLUTION


# -- math functions ----------------------------------------------------------------------------------
class Exp(Op):
    @staticmethod
    def forward(ctx, a):
        out = ctx.xp.exp(a)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g): return g * ctx.saved_tensors[0]


class Log(Op):
    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return ctx.xp.log(a)

    @staticmethod
    def backward(ctx, g): return g / ctx.saved_tensors[0]


class Sqrt(Op):
    @staticmethod
    def forward(ctx, a):
        out = ctx.xp.sqrt(a)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g): return g / (2 * ctx.saved_tensors[0])


class Rsqrt(Op):
    @staticmethod
    def forward(ctx, a):
        out = 1 / ctx.xp.sqrt(a)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g): return -0.5 * g * ctx.saved_tensors[0] ** 3


class Abs(Op):
    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return ctx.xp.abs(a)

    @staticmethod
    def backward(ctx, g): return g * sign(ctx.saved_tensors[0])


class Sign(Op):
    @staticmethod
    def forward(ctx, a): return ctx.xp.sign(a)
    @staticmethod
    def backward(ctx, g): return g * 0


class Sin(Op):
    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return ctx.xp.sin(a)

    @staticmethod
    def backward(ctx, g): return g * cos(ctx.saved_tensors[0])


class Cos(Op):
    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return ctx.xp.cos(a)

    @staticmethod
    def backward(ctx, g): return -g * sin(ctx.saved_tensors[0])


class Tanh(Op):
    @staticmethod
    def forward(ctx, a):
        out = ctx.xp.tanh(a)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g): return TanhBackward.apply(g, ctx.saved_tensors[0])


class TanhBackward(Op):
    """``g * (1 - y*y)`` in one op instead of three; differentiable again for higher orders."""

    @staticmethod
    def forward(ctx, g, y):
        ctx.save_for_backward(g, y)
        return g * (1 - y * y)

    @staticmethod
    def backward(ctx, gg):
        ### BEGIN SOLUTION chapter 02: TanhBackward.backward
        g, y = ctx.saved_tensors
        return gg * (1 - y * y), -2 * gg * g * y
        ### END SOLUTION


class Sigmoid(Op):
    @staticmethod
    def forward(ctx, a):
        # 0.5 * (1 + tanh(a / 2)) never overflows, unlike 1 / (1 + exp(-a)) for a << 0
        out = 0.5 + 0.5 * ctx.xp.tanh(0.5 * a)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g): return SigmoidBackward.apply(g, ctx.saved_tensors[0])


class SigmoidBackward(Op):
    """``g * y * (1 - y)`` in one op; differentiable again for higher orders."""

    @staticmethod
    def forward(ctx, g, y):
        ctx.save_for_backward(g, y)
        return g * y * (1 - y)

    @staticmethod
    def backward(ctx, gg):
        ### BEGIN SOLUTION chapter 02: SigmoidBackward.backward
        g, y = ctx.saved_tensors
        return gg * y * (1 - y), gg * g * (1 - 2 * y)
        ### END SOLUTION


class Clamp(Op):
    @staticmethod
    def forward(ctx, a, lo, hi):
        ctx.save_for_backward(((a >= lo) if lo is not None else True) & ((a <= hi) if hi is not None else True))
        return ctx.xp.clip(a, lo, hi)

    @staticmethod
    def backward(ctx, g): return g * ctx.saved_tensors[0], None, None


class Maximum(Op):
    @staticmethod
    def forward(ctx, a, b):
        # ties split the gradient evenly, as PyTorch does
        ctx.save_for_backward((a > b) + 0.5 * (a == b))
        return ctx.xp.maximum(a, b)

    @staticmethod
    def backward(ctx, g):
        ### BEGIN SOLUTION chapter 02: Maximum.backward
        w = ctx.saved_tensors[0]
        need_a, need_b = ctx.needs_input_grad
        return (g * w if need_a else None), (g * (1 - w) if need_b else None)
        ### END SOLUTION


class Minimum(Op):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward((a < b) + 0.5 * (a == b))
        return ctx.xp.minimum(a, b)

    @staticmethod
    def backward(ctx, g):
        w = ctx.saved_tensors[0]
        need_a, need_b = ctx.needs_input_grad
        return (g * w if need_a else None), (g * (1 - w) if need_b else None)


class Where(Op):
    @staticmethod
    def forward(ctx, cond, a, b):
        ctx.save_for_backward(cond)
        return ctx.xp.where(cond, a, b)

    @staticmethod
    def backward(ctx, g):
        ### BEGIN SOLUTION chapter 02: Where.backward
        cond = ctx.saved_tensors[0]
        _, need_a, need_b = ctx.needs_input_grad
        return None, (where(cond, g, 0.0) if need_a else None), (where(cond, 0.0, g) if need_b else None)
        ### END SOLUTION


class Cast(Op):
    """A dtype change; differentiable, so float16 compute still gives float32 master gradients."""

    @staticmethod
    def forward(ctx, a, dtype):
        ctx.src = a.dtype
        return a.astype(dtype)

    @staticmethod
    def backward(ctx, g): return cast(g, ctx.src), None


class Clone(Op):
    @staticmethod
    def forward(ctx, a): return a.copy()
    @staticmethod
    def backward(ctx, g): return g


class Contiguous(Op):
    @staticmethod
    def forward(ctx, a): return ctx.xp.ascontiguousarray(a)
    @staticmethod
    def backward(ctx, g): return g


class ToDevice(Function):
    """A copy on another device. Its forward takes and returns Tensors, unlike the other ops here:
    an array-level op's output is put on its input's device."""

    @staticmethod
    def forward(ctx, x, device):
        ctx.src = x.device
        return _wrap(backend.to_device(x.data, device), device)

    @staticmethod
    def backward(ctx, g): return to_device(g, ctx.src), None


# -- comparisons and logic: results are bool, nothing flows back -----------------------------------
def _compare(ufunc_name: str):
    class Compare(Op):
        @staticmethod
        def forward(ctx, a, b): return getattr(ctx.xp, ufunc_name)(a, b)

    Compare.__name__ = Compare.__qualname__ = ufunc_name.title().replace("_", "")
    return Compare


Equal, NotEqual, Less, LessEqual, Greater, GreaterEqual = map(
    _compare, ["equal", "not_equal", "less", "less_equal", "greater", "greater_equal"]
)
LogicalAnd, LogicalOr = _compare("logical_and"), _compare("logical_or")


class LogicalNot(Op):
    @staticmethod
    def forward(ctx, a): return ctx.xp.logical_not(a)


# -- the functions users call ---------------------------------------------------------------------
def _scalar_operand(s: Any, t: Tensor) -> tuple[Any, Tensor]:
    """Prepare a Python (or numpy) scalar operand: it keeps a float tensor's dtype, and turns an
    integer or bool tensor into the default float dtype when the scalar is a float."""
    if isinstance(s, (bool, int, float)):
        if isinstance(s, float) and t.dtype.kind != "f":
            t = cast(t, backend.get_default_dtype())
        return s, t
    if hasattr(s, "dtype") and getattr(s, "ndim", 1) == 0 and not isinstance(s, Tensor):
        return _scalar_operand(s.item(), t)  # numpy scalars count as Python scalars, as in torch
    if isinstance(s, (list, tuple)) or hasattr(s, "__array__"):
        return Tensor(s, device=t.device), t
    raise TypeError(f"unsupported operand type {type(s).__name__} for a tensor op")


def _binary(cls: type[Function], a: Any, b: Any) -> Tensor:
    if isinstance(a, Tensor):
        if isinstance(b, Tensor):
            if a.data.dtype is not b.data.dtype:
                dt = backend.result_type(a.dtype, b.dtype, a.ndim == 0, b.ndim == 0)
                a, b = (a if a.dtype == dt else cast(a, dt)), (b if b.dtype == dt else cast(b, dt))
            return cls.apply(a, b)
        if type(b) is float and a.data.dtype.kind == "f" or type(b) is int:
            return cls.apply(a, b)  # the common case, decided without _scalar_operand
        b, a = _scalar_operand(b, a)
        if isinstance(b, Tensor):
            return _binary(cls, a, b)
        return cls.apply(a, b)
    a, b = _scalar_operand(a, b)
    if isinstance(a, Tensor):
        return _binary(cls, a, b)
    return cls.apply(a, b)


def add(a, b): return _binary(Add, a, b)
def sub(a, b): return _binary(Sub, a, b)
def mul(a, b): return _binary(Mul, a, b)
def pow(a, b): return _binary(Pow, a, b)
def maximum(a, b): return _binary(Maximum, a, b)
def minimum(a, b): return _binary(Minimum, a, b)
def eq(a, b): return _binary(Equal, a, b)
def ne(a, b): return _binary(NotEqual, a, b)
def lt(a, b): return _binary(Less, a, b)
def le(a, b): return _binary(LessEqual, a, b)
def gt(a, b): return _binary(Greater, a, b)
def ge(a, b): return _binary(GreaterEqual, a, b)
def logical_and(a, b): return _binary(LogicalAnd, a, b)
def logical_or(a, b): return _binary(LogicalOr, a, b)
def logical_not(a): return LogicalNot.apply(a)


def div(a, b):
    """True division; integer tensors divide into the default float dtype, as in PyTorch."""
    if isinstance(a, Tensor) and a.dtype.kind != "f" and not (isinstance(b, Tensor) and b.dtype.kind == "f"):
        a = cast(a, backend.get_default_dtype())
    return _binary(Div, a, b)


def neg(x): return Neg.apply(x)
def exp(x): return Exp.apply(_floating(x, "exp"))
def log(x): return Log.apply(_floating(x, "log"))
def sqrt(x): return Sqrt.apply(_floating(x, "sqrt"))
def rsqrt(x): return Rsqrt.apply(_floating(x, "rsqrt"))
def abs(x): return Abs.apply(x)
def sign(x): return Sign.apply(x)
def sin(x): return Sin.apply(_floating(x, "sin"))
def cos(x): return Cos.apply(_floating(x, "cos"))
def tanh(x): return Tanh.apply(_floating(x, "tanh"))
def sigmoid(x): return Sigmoid.apply(_floating(x, "sigmoid"))
def clone(x): return Clone.apply(x)
def contiguous(x): return x if x.data.flags.c_contiguous else Contiguous.apply(x)
def to_device(x, device): return ToDevice.apply(x, device)


def clamp(x, min=None, max=None):
    if min is None and max is None:
        raise ValueError("clamp: at least one of min and max must be given")
    if isinstance(min, Tensor) or isinstance(max, Tensor):
        out = x
        if min is not None:
            out = maximum(out, min)
        if max is not None:
            out = minimum(out, max)
        return out
    return Clamp.apply(x, min, max)


clip = clamp


def where(cond, x, y):
    """``x`` where ``cond`` is true, else ``y`` (either may be a Python scalar)."""
    if not isinstance(cond, Tensor):
        cond = Tensor(cond)
    if cond.dtype.kind != "b":
        raise DTypeError(f"where: condition must be a bool tensor, got {cond.dtype}")
    if isinstance(x, Tensor) and isinstance(y, Tensor) and x.dtype is not y.dtype:
        dt = backend.result_type(x.dtype, y.dtype, x.ndim == 0, y.ndim == 0)
        x, y = cast(x, dt), cast(y, dt)
    return Where.apply(cond, x, y)


def cast(x: Tensor, dtype: Any) -> Tensor:
    dtype = backend.as_dtype(dtype)
    return x if x.dtype == dtype else Cast.apply(x, dtype)


def _floating(x: Tensor, op: str) -> Tensor:
    """Math functions of integer tensors compute in the default float dtype, as in PyTorch."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}: expected a Tensor, got {type(x).__name__}")
    return x if x.dtype.kind == "f" else cast(x, backend.get_default_dtype())
