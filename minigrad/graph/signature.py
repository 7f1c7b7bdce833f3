"""What tracing, compiling and export share about a traced function's signature (chapters 01, 03).

A traced function takes tensors and returns tensors in nested tuples, lists and dicts. ``flatten``
splits such a result into a spec and a flat list of tensors (the graph's outputs) and
``unflatten`` rebuilds the structure around new values; ``positional_names`` names the inputs
after the function's parameters, so graph nodes read ``%x`` rather than ``%input0``.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from minigrad.errors import TraceError
from minigrad._tensor import Tensor

__all__ = ["flatten", "positional_names", "unflatten"]


def positional_names(func: Callable, n: int, skip: int, fallback: str) -> tuple[str, ...]:
    """Names for n positional arguments of ``func`` (after ``skip`` of them), numbering ``*args``."""
    try:
        params = list(inspect.signature(func).parameters.values())[skip:]
    except (TypeError, ValueError):
        params = []
    names: list[str] = []
    for p in params:
        if p.kind is p.VAR_POSITIONAL:
            names += [f"{p.name}{j}" for j in range(n - len(names))]
            break
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
    names += [f"{fallback}{j}" for j in range(len(names), n)]
    return tuple(names[:n])


def flatten(result: Any) -> tuple[Any, list[Tensor]]:
    """Split a returned structure (tensors in nested tuples, lists and dicts) into a spec and a list."""
    if result is None:
        return None, []
    if isinstance(result, Tensor):
        return "tensor", [result]
    if isinstance(result, (tuple, list)):
        specs, flat = [], []
        for r in result:
            s, f = flatten(r)
            specs.append(s)
            flat += f
        return (type(result), specs), flat
    if isinstance(result, dict):
        s, flat = flatten(list(result.values()))
        return (dict, list(result), s), flat
    raise TraceError(f"trace: the traced function returned a {type(result).__name__}; return tensors "
                     "(tuples, lists or dicts of them) or None, since other values would be frozen")


def unflatten(spec: Any, values: Any) -> Any:
    """The structure ``spec`` describes, filled with the next items of the iterator ``values``."""
    if spec is None:
        return None
    if spec == "tensor":
        return next(values)
    if spec[0] is dict:
        return dict(zip(spec[1], unflatten(spec[2], values)))
    kind, specs = spec
    items = [unflatten(s, values) for s in specs]
    if kind is list:
        return items
    return kind(*items) if hasattr(kind, "_fields") else kind(items)
