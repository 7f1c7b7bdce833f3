"""Comparisons and logic: elementwise ops whose results are bool, so nothing flows back (chapter 02).

``a < b`` and ``a == b`` follow the same dtype rules as arithmetic (``elementwise._binary``); the
results mask values (``where``), select rows and count correct predictions.
"""

from __future__ import annotations

from typing import Any

from minigrad.autograd.function import Function
from minigrad.errors import DTypeError
from minigrad.ops.elementwise import _binary, _is_bool
from minigrad.ops.op import Op
from minigrad._tensor import Tensor

__all__ = ["bitwise_and", "bitwise_not", "bitwise_or", "eq", "ge", "gt", "le", "logical_and", "logical_not",
           "logical_or", "lt", "ne"]


def _compare(ufunc_name: str, c_operator: str, onnx: Any):
    class Compare(Op):
        kind = "elementwise"
        cpu = ufunc_name + "({0}, {1}, out={o})"
        cuda = "{0} " + c_operator + " {1}"

        @staticmethod
        def forward(ctx, a, b): return getattr(ctx.xp, ufunc_name)(a, b)

    Compare.onnx = onnx if isinstance(onnx, str) else staticmethod(onnx)
    Compare.__name__ = Compare.__qualname__ = ufunc_name.title().replace("_", "")
    return Compare


def _onnx_compare(op_type: str, negate: bool = False):
    return lambda b, node, x, y: b.compare(op_type, x, y, negate)


Equal = _compare("equal", "==", _onnx_compare("Equal"))
NotEqual = _compare("not_equal", "!=", _onnx_compare("Equal", negate=True))
Less = _compare("less", "<", _onnx_compare("Less"))
LessEqual = _compare("less_equal", "<=", _onnx_compare("LessEqual"))
Greater = _compare("greater", ">", _onnx_compare("Greater"))
GreaterEqual = _compare("greater_equal", ">=", _onnx_compare("GreaterEqual"))
LogicalAnd, LogicalOr = _compare("logical_and", "&&", "And"), _compare("logical_or", "||", "Or")


class LogicalNot(Op):
    kind = "elementwise"
    cpu = "logical_not({0}, out={o})"
    cuda = "!{0}"
    onnx = "Not"

    @staticmethod
    def forward(ctx, a): return ctx.xp.logical_not(a)


class BitwiseAnd(Op):
    """``&`` on integers (on bools it is ``LogicalAnd``)."""

    batch = "elementwise"  # elementwise in all but kind (no float kernels)
    onnx_refused = "no emitter written yet: ONNX BitwiseAnd (opset 18)"

    @staticmethod
    def forward(ctx, a, b): return ctx.xp.bitwise_and(a, b)


class BitwiseOr(Op):
    batch = "elementwise"  # elementwise in all but kind (no float kernels)
    onnx_refused = "no emitter written yet: ONNX BitwiseOr (opset 18)"

    @staticmethod
    def forward(ctx, a, b): return ctx.xp.bitwise_or(a, b)


class BitwiseNot(Op):
    """``~`` on integers: ``-x - 1`` in two's complement (on bools it is ``LogicalNot``)."""

    batch = "elementwise"  # elementwise in all but kind (no float kernels)
    onnx_refused = "no emitter written yet: ONNX BitwiseNot (opset 18)"

    @staticmethod
    def forward(ctx, a): return ctx.xp.invert(a)


def eq(a, b): return _binary(Equal, a, b)
def ne(a, b): return _binary(NotEqual, a, b)
def lt(a, b): return _binary(Less, a, b)
def le(a, b): return _binary(LessEqual, a, b)
def gt(a, b): return _binary(Greater, a, b)
def ge(a, b): return _binary(GreaterEqual, a, b)
def logical_and(a, b): return _binary(LogicalAnd, a, b)
def logical_or(a, b): return _binary(LogicalOr, a, b)
def logical_not(a): return LogicalNot.apply(a)


def _bitwise(cls: type[Function], logical: type[Function], a: Any, b: Any, op: str) -> Tensor:
    """``&``, ``|`` on integer or bool operands (bool with bool stays the logical op)."""
    for v in (a, b):
        if isinstance(v, float) or (isinstance(v, Tensor) and v.dtype.kind == "f"):
            raise DTypeError(f"{op}: bitwise ops take integer or bool tensors, got "
                             f"{v.dtype if isinstance(v, Tensor) else 'a float'}")
    return _binary(logical if _is_bool(a) and _is_bool(b) else cls, a, b)


def bitwise_and(a, b): return _bitwise(BitwiseAnd, LogicalAnd, a, b, "bitwise_and")
def bitwise_or(a, b): return _bitwise(BitwiseOr, LogicalOr, a, b, "bitwise_or")


def bitwise_not(x):
    """``~x``: logical not of a bool tensor, bitwise not (``-x - 1``) of an integer one."""
    if x.dtype.kind == "f":
        raise DTypeError(f"bitwise_not: ~ takes integer or bool tensors, got {x.dtype}")
    return LogicalNot.apply(x) if x.dtype.kind == "b" else BitwiseNot.apply(x)
