"""Elementwise ops: arithmetic with broadcasting, math functions, comparisons, casts.

Each op is a ``Function`` whose forward computes on ``xp`` arrays and whose backward is one line
per input, written once against ``ctx.ops`` (chapter 02's table of derivatives): arrays when
nobody records the backward pass, minigrad's ops when it is recorded. Broadcasting is undone once, by the
engine, so ``Add.backward`` just returns ``g, g``. ``_binary`` applies PyTorch's dtype rules
before an op runs: Python scalars never widen a tensor's dtype, and int with float gives float.
``power`` and ``absolute`` are exported by ``minigrad.ops`` as ``pow`` and ``abs``, so that in this
module, where students write backward rules, ``pow`` and ``abs`` stay Python's builtins.
"""

from __future__ import annotations

import math
from typing import Any

from minigrad import backend
from minigrad.autograd.function import OUTPUT, Function
from minigrad.errors import ArgumentError, DTypeError
from minigrad.ops.op import GRADIENT_OP, Op, same_value
from minigrad._tensor import Tensor, _wrap

__all__ = [
    "Op", "add", "cast", "clamp", "clip", "clone", "contiguous", "cos", "div", "exp", "log",
    "maximum", "minimum", "mul", "neg", "rsqrt", "sigmoid", "sign", "sin", "sqrt", "sub",
    "tanh", "to_device", "where",
]


_CONSTANTS: dict = {}  # (number, dtype) -> a read-only 0-d array (_operand)


def _operand(s: float, like: Any) -> Any:
    """A Python float operand of an op on the float numpy array ``like``, as a 0-d array of its
    dtype: numpy resolves a Python scalar's dtype on every call, which about doubles the cost of
    an op on a small array, and by NEP 50 it casts the scalar to ``like``'s dtype anyway, so the
    result is the same bit for bit. A zero (its sign), a NaN (as a dict key), a value a float16
    cannot hold and anything on another array module are returned as they are."""
    c = _CONSTANTS.get((s, like.dtype)) if type(like) is _ndarray else None
    if c is None:
        if type(like) is not _ndarray or like.dtype.kind != "f" or not 0 < abs(s) <= 65504 or len(_CONSTANTS) > 256:
            return s
        c = _CONSTANTS[(s, like.dtype)] = backend.numpy.asarray(s, like.dtype)
        c.flags.writeable = False
    return c


_ndarray = backend.numpy.ndarray


def _number_position(i: int, s: float, c: Any) -> Any:
    """What forward saves of argument ``i``, the Python float ``s`` it computed with as ``c``
    (``_operand``): ``(i, c)``, so that the array binding's ``g * s`` or ``g / s`` reads the 0-d
    array on numpy's faster path (``save_positions``), when ``c`` holds ``s`` exactly. Then the
    result is the same bit for bit: for ``g`` of ``c``'s dtype by NEP 50, and for a wider ``g``
    (a float64 gradient passed for a float32 output) since ``c`` widens back to ``s``."""
    return (i, c) if c is not s and c.item() == s else i


# -- arithmetic ------------------------------------------------------------------------------------
class Add(Op):
    kind = "elementwise"
    ufunc = "add"
    cuda = "{0} + {1}"
    onnx = "Add"
    affine = "shift"
    unit = (0, (0, 1))

    @staticmethod
    def forward(ctx, a, b): return a + (_operand(b, a) if type(b) is float else b)
    @staticmethod
    def backward(ctx, g): return g, g


class Sub(Op):
    kind = "elementwise"
    ufunc = "subtract"
    cuda = "{0} - {1}"
    onnx = "Sub"
    affine = "negated_shift"
    unit = (0, (1,))

    @staticmethod
    def forward(ctx, a, b): return a - (_operand(b, a) if type(b) is float else b)
    @staticmethod
    def backward(ctx, g): return g, (-g if ctx.needs_input_grad[1] else None)


class Mul(Op):
    kind = "elementwise"
    ufunc = "multiply"
    cuda = "{0} * {1}"
    onnx = "Mul"
    affine = "scale"
    unit = (1, (0, 1))

    @staticmethod
    def forward(ctx, a, b):
        need_a, need_b = ctx.needs_input_grad  # save b for a's gradient, a for b's
        if type(b) is not float:
            ctx.save_positions(0 if need_b else None, 1 if need_a else None)
            return a * b
        c = _operand(b, a)
        ctx.save_positions(0 if need_b else None, _number_position(1, b, c) if need_a else None)
        return a * c

    @staticmethod
    def backward(ctx, g):
        """d(a*b) = b da + a db. Forward saved ``(a, b)`` by position: ``b`` only when a
        needs a gradient and ``a`` only when b does, the other slot ``None`` (either may be a Python
        number). The contract of every rule: ``minigrad.autograd.Function.backward``.
        ``g`` and the saved values are arrays or Tensors, as the engine bound ``ctx.ops``: operators
        work on both, so the rule is written once.
        """
        ### BEGIN SOLUTION chapter 02: Mul.backward
        a, b = ctx.saved_tensors
        return (g * b if b is not None else None), (g * a if a is not None else None)
        ### END SOLUTION


class Div(Op):
    kind = "elementwise"
    ufunc = "divide"
    cuda = "{0} / {1}"
    onnx = "Div"
    unit = (1, (1,))

    @staticmethod
    def forward(ctx, a, b):
        if type(b) is not float:
            ctx.save_positions(0 if ctx.needs_input_grad[1] else None, 1)
            return a / b
        c = _operand(b, a)
        ctx.save_positions(None, _number_position(1, b, c))
        return a / c

    @staticmethod
    def backward(ctx, g):
        """d(a/b) = da / b - a db / b^2. Forward saved ``(a, b)``, ``a`` only when b needs a
        gradient (else ``None``). The contract of every rule: ``minigrad.autograd.Function.backward``.
        """
        ### BEGIN SOLUTION chapter 02: Div.backward
        a, b = ctx.saved_tensors
        return (g / b if ctx.needs_input_grad[0] else None), (-g * a / (b * b) if a is not None else None)
        ### END SOLUTION


class Neg(Op):
    kind = "elementwise"
    cpu = "negative({0}, out={o})"
    cuda = "-{0}"
    onnx = "Neg"
    involution = True

    @staticmethod
    def forward(ctx, a): return -a
    @staticmethod
    def backward(ctx, g): return -g


class Pow(Op):
    kind = "elementwise"
    cpu = "power({0}, {1}, out={o})"
    cuda = "pow({0}, {1})"
    cuda_kinds = "f"  # C has no integer pow: integer powers run as their own op
    onnx = "Pow"
    autocast = "fp32"
    unit = (1, (1,))

    @staticmethod
    def forward(ctx, a, b):
        out = a ** b
        ctx.save_for_backward(a, b, out if ctx.needs_input_grad[1] else None)
        return out

    @staticmethod
    def backward(ctx, g):
        """d(a^b) = b a^(b-1) da + a^b ln(a) db. Forward saved ``(a, b, out)``, ``out`` only when
        ``b`` needs a gradient; ``a`` may be a Python number (``2 ** x``: use ``math.log`` for it), and
        either gradient is computed only when ``ctx.needs_input_grad`` asks for it. The contract of every rule: ``minigrad.autograd.Function.backward``.
        For ``ln(a)`` of a saved tensor use ``ctx.ops.apply(Log, a)`` (the op's own forward on
        arrays, ``Log.apply`` on Tensors).
        """
        ### BEGIN SOLUTION chapter 02: Pow.backward
        a, b, out = ctx.saved_tensors
        ga = g * b * a ** (b - 1) if ctx.needs_input_grad[0] else None
        if ctx.needs_input_grad[1]:  # a may be a Python number (2 ** x)
            return ga, g * out * (math.log(a) if isinstance(a, (int, float)) else ctx.ops.apply(Log, a))
        return ga, None
        ### END SOLUTION


# -- math functions ----------------------------------------------------------------------------------
class Exp(Op):
    kind = "elementwise"
    cpu = "exp({0}, out={o})"
    cuda = "exp({0})"
    onnx = "Exp"
    autocast = "fp32"

    @staticmethod
    def forward(ctx, a):
        out = ctx.xp.exp(a)
        ctx.save_positions(OUTPUT)
        return out

    @staticmethod
    def backward(ctx, g):
        """d exp(a) = exp(a) da; forward saved its output. The contract of every rule: ``minigrad.autograd.Function.backward``."""
        ### BEGIN SOLUTION chapter 02: Exp.backward
        return g * ctx.saved_tensors[0]
        ### END SOLUTION


class Log(Op):
    kind = "elementwise"
    cpu = "log({0}, out={o})"
    cuda = "log({0})"
    onnx = "Log"
    autocast = "fp32"

    @staticmethod
    def forward(ctx, a):
        ctx.save_positions(0)
        return ctx.xp.log(a)

    @staticmethod
    def backward(ctx, g):
        """d log(a) = da / a; forward saved ``a``. The contract of every rule: ``minigrad.autograd.Function.backward``."""
        ### BEGIN SOLUTION chapter 02: Log.backward
        return g / ctx.saved_tensors[0]
        ### END SOLUTION


class Sqrt(Op):
    kind = "elementwise"
    cpu = "sqrt({0}, out={o})"
    cuda = "sqrt({0})"
    onnx = "Sqrt"

    @staticmethod
    def forward(ctx, a):
        out = ctx.xp.sqrt(a)
        ctx.save_positions(OUTPUT)
        return out

    @staticmethod
    def backward(ctx, g): return g / (2 * ctx.saved_tensors[0])


class Rsqrt(Op):
    kind = "elementwise"
    cpu = "sqrt({0}, out={o}); divide(1, {o}, out={o})"
    cuda = "({T})1 / sqrt({0})"
    autocast = "fp32"

    @staticmethod
    def onnx(b, node, a): return b.add("Reciprocal", [b.add("Sqrt", [a])])

    @staticmethod
    def forward(ctx, a):
        out = 1 / ctx.xp.sqrt(a)
        ctx.save_positions(OUTPUT)
        return out

    @staticmethod
    def backward(ctx, g): return -0.5 * g * ctx.saved_tensors[0] ** 3


class Abs(Op):
    kind = "elementwise"
    cpu = "absolute({0}, out={o})"
    onnx = "Abs"

    @staticmethod
    def cuda(args, T, out_type): return f"{'fabs' if T in ('float', 'double', 'float16') else 'abs'}({args[0]})"

    @staticmethod
    def forward(ctx, a):
        ctx.save_positions(0)
        return ctx.xp.abs(a)

    @staticmethod
    def backward(ctx, g): return g * ctx.ops.apply(Sign, ctx.saved_tensors[0])


class Sign(Op):
    kind = "elementwise"
    cpu = "sign({0}, out={o})"
    cuda = "({0} != {0}) ? {0} : ({T})(({0} > ({T})0) - ({0} < ({T})0))"  # NaN stays NaN, as numpy's sign
    onnx = "Sign"

    @staticmethod
    def forward(ctx, a): return a.copy() if a.dtype.kind == "b" else ctx.xp.sign(a)
    @staticmethod
    def backward(ctx, g): return g * 0


class Sin(Op):
    kind = "elementwise"
    cpu = "sin({0}, out={o})"
    cuda = "sin({0})"
    onnx = "Sin"

    @staticmethod
    def forward(ctx, a):
        ctx.save_positions(0)
        return ctx.xp.sin(a)

    @staticmethod
    def backward(ctx, g): return g * ctx.ops.apply(Cos, ctx.saved_tensors[0])


class Cos(Op):
    kind = "elementwise"
    cpu = "cos({0}, out={o})"
    cuda = "cos({0})"
    onnx = "Cos"

    @staticmethod
    def forward(ctx, a):
        ctx.save_positions(0)
        return ctx.xp.cos(a)

    @staticmethod
    def backward(ctx, g): return -g * ctx.ops.apply(Sin, ctx.saved_tensors[0])


class Tanh(Op):
    kind = "elementwise"
    cpu = "tanh({0}, out={o})"
    cuda = "tanh({0})"
    onnx = "Tanh"

    @staticmethod
    def forward(ctx, a):
        out = ctx.xp.tanh(a)
        ctx.save_positions(OUTPUT)
        return out

    @staticmethod
    def backward(ctx, g): return ctx.ops.apply(TanhBackward, g, ctx.saved_tensors[0])


class TanhBackward(Op):
    """``g * (1 - y*y)`` in one op instead of three; differentiable again for higher orders."""

    kind = "elementwise"
    onnx_refused = GRADIENT_OP
    cpu = "multiply({1}, {1}, out={o}); subtract(1, {o}, out={o}); multiply({0}, {o}, out={o})"
    cuda = "{0} * (({T})1 - {1} * {1})"

    @staticmethod
    def forward(ctx, g, y):
        ctx.save_positions(0, 1)
        return g * (_operand(1.0, y) - y * y)  # (1 as a 0-d array: the same bits, sooner)

    @staticmethod
    def backward(ctx, gg):
        """Second derivatives of tanh: this op computes ``g * (1 - y*y)`` from its two inputs
        ``(g, y)`` (both saved); return the gradients of both, d/dg and d/dy of that expression times
        ``gg``. The contract of every rule: ``minigrad.autograd.Function.backward``.
        """
        ### BEGIN SOLUTION chapter 02: TanhBackward.backward
        g, y = ctx.saved_tensors
        return gg * (1 - y * y), -2 * gg * g * y
        ### END SOLUTION


class Sigmoid(Op):
    kind = "elementwise"
    cpu = "multiply(0.5, {0}, out={o}); tanh({o}, out={o}); multiply(0.5, {o}, out={o}); add(0.5, {o}, out={o})"
    cuda = "({T})0.5 + ({T})0.5 * tanh(({T})0.5 * {0})"
    onnx = "Sigmoid"

    @staticmethod
    def forward(ctx, a):
        # 0.5 * (1 + tanh(a / 2)) never overflows, unlike 1 / (1 + exp(-a)) for a << 0
        half = _operand(0.5, a)
        out = half + half * ctx.xp.tanh(half * a)
        ctx.save_positions(OUTPUT)
        return out

    @staticmethod
    def backward(ctx, g): return ctx.ops.apply(SigmoidBackward, g, ctx.saved_tensors[0])


class SigmoidBackward(Op):
    """``g * y * (1 - y)`` in one op; differentiable again for higher orders."""

    kind = "elementwise"
    onnx_refused = GRADIENT_OP
    cpu = "multiply({0}, {1}, out={o}); subtract(1, {1}, out={t}); multiply({o}, {t}, out={o})"
    cuda = "{0} * {1} * (({T})1 - {1})"

    @staticmethod
    def forward(ctx, g, y):
        ctx.save_positions(0, 1)
        return g * y * (_operand(1.0, y) - y)

    @staticmethod
    def backward(ctx, gg):
        """Second derivatives of sigmoid: this op computes ``g * y * (1 - y)`` from ``(g, y)`` (both
        saved); return d/dg and d/dy of that expression times ``gg``. The contract of every rule: ``minigrad.autograd.Function.backward``.
        """
        ### BEGIN SOLUTION chapter 02: SigmoidBackward.backward
        g, y = ctx.saved_tensors
        return gg * y * (1 - y), gg * g * (1 - 2 * y)
        ### END SOLUTION


class Clamp(Op):
    kind = "elementwise"
    cpu = "clip({0}, {1}, {2}, out={o})"

    @staticmethod
    def cuda(args, T, out_type):  # either bound may be absent; NaN stays NaN, as in numpy (CUDA's fmax drops it)
        x, lo, hi = args
        x = x if lo == "None" else f"({x} < {lo} ? {lo} : {x})"
        return x if hi == "None" else f"({x} > {hi} ? {hi} : {x})"

    @staticmethod
    def onnx(b, node, a, lo, hi):
        return b.add("Clip", [a] + ["" if v is None else b.scalar(v, node.dtype) for v in (lo, hi)])

    @staticmethod
    def forward(ctx, a, lo, hi):
        ctx.save_for_backward(((a >= lo) if lo is not None else True) & ((a <= hi) if hi is not None else True))
        return ctx.xp.clip(a, lo, hi)

    @staticmethod
    def backward(ctx, g): return g * ctx.saved_tensors[0], None, None


class Maximum(Op):
    kind = "elementwise"
    cpu = "maximum({0}, {1}, out={o})"
    cuda = "({0} > {1} || {0} != {0}) ? {0} : {1}"  # NaN propagates, as in numpy
    onnx = "Max"

    @staticmethod
    def forward(ctx, a, b):
        # ties split the gradient evenly, as PyTorch does
        ctx.save_for_backward((a > b) + 0.5 * (a == b))
        return ctx.xp.maximum(a, b)

    @staticmethod
    def backward(ctx, g):
        """Forward saved one tensor, ``w``: a's share of the gradient (1 where a is larger, 0 where
        b is, 0.5 on ties, as PyTorch splits ties); b's share is ``1 - w``. Read the share from the
        saved tensor and nothing else: ``Minimum`` saves its own share the same way and reuses this
        rule. Compute only the gradients ``ctx.needs_input_grad`` asks for. The contract of every rule: ``minigrad.autograd.Function.backward``.
        """
        ### BEGIN SOLUTION chapter 02: Maximum.backward
        w = ctx.saved_tensors[0]
        need_a, need_b = ctx.needs_input_grad
        return (g * w if need_a else None), (g * (1 - w) if need_b else None)
        ### END SOLUTION


class Minimum(Op):
    kind = "elementwise"
    cpu = "minimum({0}, {1}, out={o})"
    cuda = "({0} < {1} || {0} != {0}) ? {0} : {1}"
    onnx = "Min"

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward((a < b) + 0.5 * (a == b))
        return ctx.xp.minimum(a, b)

    # Maximum's rule, unchanged: forward saved a's share of the gradient as Maximum's does (1 where
    # a is the smaller, 0.5 on ties), so the same backward gives Minimum's gradient
    backward = staticmethod(Maximum.backward)


class Where(Op):
    kind = "elementwise"
    cpu = "copyto({o}, {2}); copyto({o}, {1}, where={0})"
    cuda = "{0} ? {1} : {2}"

    @staticmethod
    def onnx(b, node, c, x, y): return b.add("Where", [c, b.operand(x, node.dtype), b.operand(y, node.dtype)])

    @staticmethod
    def forward(ctx, cond, a, b):
        ctx.save_for_backward(cond)
        return ctx.xp.where(cond, a, b)

    @staticmethod
    def backward(ctx, g):
        """``where(cond, a, b)``: the gradient goes to ``a`` where the saved ``cond`` holds and to
        ``b`` elsewhere (zeros in the other places); ``cond`` gets ``None``. Either of ``a``, ``b``
        may be a Python number, and may have been broadcast. The contract of every rule: ``minigrad.autograd.Function.backward``.
        Use ``ctx.ops.where``: the array module's ``where`` or minigrad's, as the engine bound the rule.
        """
        ### BEGIN SOLUTION chapter 02: Where.backward
        cond = ctx.saved_tensors[0]
        _, need_a, need_b = ctx.needs_input_grad
        where = ctx.ops.where
        return None, (where(cond, g, 0.0) if need_a else None), (where(cond, 0.0, g) if need_b else None)
        ### END SOLUTION


class Cast(Op):
    """A dtype change; differentiable, so float16 compute still gives float32 master gradients."""

    kind = "elementwise"
    cpu = "copyto({o}, {0}, casting='unsafe')"
    autocast = "keep"  # autocast's own casts

    @staticmethod
    def cuda(args, T, out_type): return f"({out_type}){args[0]}"

    @staticmethod
    def onnx(b, node, a, dtype): return b.add("Cast", [a], to=b.onnx_dtype(node.dtype))

    is_identity = True  # whenever the dtype stays

    @staticmethod
    def forward(ctx, a, dtype):
        ctx.src = a.dtype
        return a.astype(dtype)

    @staticmethod
    def backward(ctx, g): return ctx.ops.cast(g, ctx.src), None


class Clone(Op):
    kind = "elementwise"
    cpu = "copyto({o}, {0})"
    cuda = "{0}"
    onnx = staticmethod(same_value)

    @staticmethod
    def forward(ctx, a): return a.copy()
    @staticmethod
    def backward(ctx, g): return g


class Contiguous(Op):
    kind = "movement"
    batch = "rows"
    onnx = staticmethod(same_value)

    @staticmethod
    def forward(ctx, a): return ctx.xp.ascontiguousarray(a)
    @staticmethod
    def backward(ctx, g): return g


class ToDevice(Function):
    """A copy on another device. Its forward takes and returns Tensors, unlike the other ops here:
    an array-level op's output is put on its input's device."""

    kind = "movement"
    autocast = "keep"
    # it moves Tensors between devices (its gradient goes back to the source device), which an
    # array of one device's module cannot express: the rule stays on Tensors under either binding
    tensor_backward = True

    @staticmethod
    def forward(ctx, x, device):
        ctx.src = x.device
        return _wrap(backend.to_device(x.array, device), device)

    @staticmethod
    def backward(ctx, g): return to_device(g, ctx.src), None


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
    """``cls`` applied to two operands promoted to one dtype, as PyTorch promotes them; a Python
    int that an integer tensor's dtype cannot hold raises ``DTypeError`` (a ``try`` costs nothing
    until something is raised, so the hot path stays one call)."""
    try:
        if isinstance(a, Tensor):
            if isinstance(b, Tensor):
                if a.array.dtype is not b.array.dtype:
                    dt = backend.result_type(a.dtype, b.dtype, a.ndim == 0, b.ndim == 0)
                    a, b = (a if a.dtype == dt else cast(a, dt)), (b if b.dtype == dt else cast(b, dt))
                return cls.apply(a, b)
            if type(b) is float and a.array.dtype.kind == "f" or type(b) is int:
                return cls.apply(a, b)  # the common case, decided without _scalar_operand
            b, a = _scalar_operand(b, a)
            if isinstance(b, Tensor):
                return _binary(cls, a, b)
            return cls.apply(a, b)
        a, b = _scalar_operand(a, b)
        if isinstance(a, Tensor):
            return _binary(cls, a, b)
        return cls.apply(a, b)
    except OverflowError as e:
        raise DTypeError(f"{cls.__name__}: {e}") from None


def add(a, b): return _binary(Add, a, b)


def sub(a, b):
    if _is_bool(a) or _is_bool(b):
        raise DTypeError("sub: not supported on bools; use ~ or logical_xor to compare masks")
    return _binary(Sub, a, b)


def mul(a, b): return _binary(Mul, a, b)
def maximum(a, b): return _binary(Maximum, a, b)
def minimum(a, b): return _binary(Minimum, a, b)


def _is_bool(v: Any) -> bool:
    return v.array.dtype.kind == "b" if isinstance(v, Tensor) else isinstance(v, bool)


def _not_bool(v: Any, op: str) -> Any:
    """Subtraction and negation are refused on bool tensors, as in PyTorch (use ``~``)."""
    if isinstance(v, Tensor) and v.array.dtype.kind == "b":
        raise DTypeError(f"{op}: not supported on bool tensors; use ~ or logical_not to invert a mask")
    return v


def power(a, b):
    """``minigrad.pow``, ``a ** b``; a bool base with an integer exponent counts as int64, as in PyTorch."""
    if _is_bool(a) and _is_bool(b):
        raise DTypeError("pow: not supported for bool tensors")
    if isinstance(a, Tensor) and a.dtype.kind == "b" and type(b) is int:
        a = cast(a, backend.int64)
    if isinstance(b, Tensor) and b.dtype.kind == "b" and type(a) is int:
        b = cast(b, backend.int64)
    if isinstance(a, Tensor) and a.dtype == backend.float16 and type(b) in (int, float) and abs(b) > 65504:
        raise DTypeError(f"pow: exponent {b} cannot be converted to float16 without overflow")
    return _binary(Pow, a, b)


def div(a, b):
    """True division; integer tensors divide into the default float dtype, as in PyTorch."""
    if not any(isinstance(v, Tensor) and v.dtype.kind == "f" for v in (a, b)):
        if isinstance(a, Tensor):
            a = cast(a, backend.get_default_dtype())
        elif isinstance(b, Tensor):
            b = cast(b, backend.get_default_dtype())
    return _binary(Div, a, b)


# in-place arithmetic under no_grad (``t.add_(x)``) writes with the op's ufunc (ops.inplace)
add.op, sub.op, mul.op, div.op = Add, Sub, Mul, Div


def neg(x): return Neg.apply(_not_bool(x, "neg"))
def exp(x): return Exp.apply(_floating(x, "exp"))
def log(x): return Log.apply(_floating(x, "log"))
def sqrt(x): return Sqrt.apply(_floating(x, "sqrt"))
def rsqrt(x): return Rsqrt.apply(_floating(x, "rsqrt"))
def absolute(x): return Abs.apply(_not_bool(x, "abs"))
def sign(x): return Sign.apply(x)
def sin(x): return Sin.apply(_floating(x, "sin"))
def cos(x): return Cos.apply(_floating(x, "cos"))
def tanh(x): return Tanh.apply(_floating(x, "tanh"))
def sigmoid(x): return Sigmoid.apply(_floating(x, "sigmoid"))
def clone(x): return Clone.apply(x)
def contiguous(x): return x if x.array.flags.c_contiguous else Contiguous.apply(x)
def to_device(x, device): return ToDevice.apply(x, device)


def clamp(x, min=None, max=None):
    if min is None and max is None:
        raise ArgumentError("clamp: at least one of min and max must be given")
    if x.dtype.kind != "f" and (isinstance(min, float) or isinstance(max, float)):
        x = cast(x, backend.get_default_dtype())  # a float bound makes the result float, as in PyTorch
    if x.dtype.kind in "iu":
        info = backend.numpy.iinfo(x.dtype)
        for bound in (min, max):
            if type(bound) is int and not info.min <= bound <= info.max:
                raise DTypeError(f"clamp: bound {bound} does not fit the tensor's dtype {x.dtype}")
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
