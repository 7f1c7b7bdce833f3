"""Comparisons and logic: elementwise ops whose results are bool, so nothing flows back (chapter 02).

``a < b`` and ``a == b`` follow the same dtype rules as arithmetic (``elementwise._binary``); the
results mask values (``where``), select rows and count correct predictions.
"""

from __future__ import annotations

from typing import Any

from minigrad.ops.elementwise import _binary
from minigrad.ops.op import Op

__all__ = ["eq", "ge", "gt", "le", "logical_and", "logical_not", "logical_or", "lt", "ne"]


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


def eq(a, b): return _binary(Equal, a, b)
def ne(a, b): return _binary(NotEqual, a, b)
def lt(a, b): return _binary(Less, a, b)
def le(a, b): return _binary(LessEqual, a, b)
def gt(a, b): return _binary(Greater, a, b)
def ge(a, b): return _binary(GreaterEqual, a, b)
def logical_and(a, b): return _binary(LogicalAnd, a, b)
def logical_or(a, b): return _binary(LogicalOr, a, b)
def logical_not(a): return LogicalNot.apply(a)
