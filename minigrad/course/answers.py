"""A student's answers as plain data: what crosses from the student's process to the instructor's checks.

A check cell marks what it reads from the student's code with ``answer(...)``::

    got = answer(count_nodes(t))
    assert got == len(topological_order([t.grad_fn])), f"expected ..., got {got}"

In a notebook ``answer`` returns its argument. When grading, the student's process evaluates only
the ``answer`` expressions (``minigrad.course.checks``) and sends each value, encoded here as JSON
of numbers, strings, lists, dicts and arrays, over a pipe; the instructor's checks run in another
process on the decoded values, so no object of the student's (an ``==`` that is always true, a
patched method) ever reaches them. ``decode`` builds only builtin containers, numpy arrays of
numeric, boolean or string dtypes, and minigrad Tensors from such arrays.
"""

from __future__ import annotations

import base64
import json
import math
from typing import Any, BinaryIO

import numpy as np

__all__ = ["MAX_ANSWER_BYTES", "AnswerError", "answer", "decode", "encode", "read_messages", "write_message"]

MAX_ANSWER_BYTES = 64 * 2**20  # all answers of one exercise together
_MAX_DEPTH = 64
_PLAIN_KINDS = "biufcSU"  # numpy dtype kinds an answer may hold (no objects, no raw void records)


class AnswerError(ValueError):
    """An answer that is not plain data, or a message from the student's process that is malformed."""


def answer(value: Any) -> Any:
    """Mark ``value`` as the student's answer a check reads; in a notebook it is returned as it is."""
    return value


def _tensor_type() -> type | None:
    import sys

    module = sys.modules.get("minigrad._tensor")
    return getattr(module, "Tensor", None)


def _array(array: np.ndarray) -> dict[str, Any]:
    if array.dtype.kind not in _PLAIN_KINDS:
        raise AnswerError(f"an answer may hold arrays of numbers, booleans or strings, got dtype {array.dtype}")
    return {"dtype": array.dtype.str, "shape": list(array.shape),
            "data": base64.b64encode(array.tobytes(order="C")).decode()}


def encode(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON-ready data; raises ``AnswerError`` for anything that is not plain data."""
    if depth > _MAX_DEPTH:
        raise AnswerError(f"an answer may nest at most {_MAX_DEPTH} containers deep")
    kind = type(value)
    if value is None or kind in (bool, str):
        return value
    if kind is int:
        return value if abs(value) < 2**63 else {"$int": str(value)}
    if kind is float:
        return value if math.isfinite(value) else {"$float": repr(value)}
    if kind is complex:
        return {"$complex": [encode(value.real), encode(value.imag)]}
    if kind is bytes:
        return {"$bytes": base64.b64encode(value).decode()}
    if kind is list:
        return [encode(v, depth + 1) for v in value]
    if kind is tuple:
        return {"$tuple": [encode(v, depth + 1) for v in value]}
    if kind in (set, frozenset):
        return {"$set": [encode(v, depth + 1) for v in value]}
    if kind is dict:
        return {"$dict": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    if isinstance(value, np.generic) and kind.__module__ == "numpy":
        return {"$scalar": _array(np.asarray(value))}
    if kind is np.ndarray:
        return {"$array": _array(value)}
    if kind is _tensor_type():
        return {"$tensor": _array(np.asarray(value.detach().cpu().numpy()))}
    raise AnswerError(f"an answer must be plain data (numbers, strings, lists, dicts, arrays, Tensors), "
                      f"got a {kind.__module__}.{kind.__qualname__}")


def _decode_array(data: Any) -> np.ndarray:
    if not isinstance(data, dict) or set(data) != {"dtype", "shape", "data"}:
        raise AnswerError(f"malformed array in an answer: {str(data)[:80]}")
    dtype = np.dtype(str(data["dtype"]))
    shape = data["shape"]
    if dtype.kind not in _PLAIN_KINDS or not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
        raise AnswerError(f"an answer's array must hold numbers, booleans or strings, got {data['dtype']!r}")
    raw = base64.b64decode(str(data["data"]), validate=True)
    if len(raw) != dtype.itemsize * math.prod(shape):
        raise AnswerError(f"an answer's array of shape {tuple(shape)} and dtype {dtype} has {len(raw)} bytes")
    return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()


_DECODERS = {
    "$int": lambda v, d: int(str(v)),
    "$float": lambda v, d: float(str(v)),
    "$complex": lambda v, d: complex(float(decode(v[0], d)), float(decode(v[1], d))),
    "$bytes": lambda v, d: base64.b64decode(str(v), validate=True),
    "$tuple": lambda v, d: tuple(decode(x, d) for x in v),
    "$set": lambda v, d: {decode(x, d) for x in v},
    "$dict": lambda v, d: {decode(k, d): decode(x, d) for k, x in v},
    "$scalar": lambda v, d: _decode_array(v)[()],
    "$array": lambda v, d: _decode_array(v),
}


def decode(data: Any, depth: int = 0) -> Any:
    """The value ``encode`` gave ``data`` for; only builtin types, numpy arrays and minigrad Tensors come out."""
    if depth > _MAX_DEPTH:
        raise AnswerError(f"an answer may nest at most {_MAX_DEPTH} containers deep")
    if data is None or type(data) in (bool, int, float, str):
        return data
    if type(data) is list:
        return [decode(v, depth + 1) for v in data]
    if type(data) is dict and len(data) == 1:
        (tag, value), = data.items()
        if tag == "$tensor":
            import minigrad

            return minigrad.tensor(_decode_array(value))
        if tag in _DECODERS:
            try:
                return _DECODERS[tag](value, depth + 1)
            except (TypeError, ValueError, IndexError) as error:
                raise AnswerError(f"malformed {tag[1:]} in an answer: {error}") from error
    raise AnswerError(f"malformed answer: {str(data)[:80]}")


def write_message(out: BinaryIO, message: dict[str, Any]) -> None:
    """One message as a line of JSON (``{"answer": ...}``, ``{"error": ...}``, ``{"done": ...}``)."""
    out.write(json.dumps(message, allow_nan=False).encode() + b"\n")
    out.flush()


def read_messages(data: bytes) -> list[dict[str, Any]]:
    """The messages in ``data``; raises ``AnswerError`` at the first line that is not one."""
    messages = []
    for line in data.splitlines():
        try:
            message = json.loads(line)
        except ValueError as error:
            raise AnswerError(f"a message from the student's process is not JSON: {line[:80]!r}") from error
        if type(message) is not dict or len(message) != 1:
            raise AnswerError(f"a message from the student's process is malformed: {line[:80]!r}")
        messages.append(message)
    return messages
