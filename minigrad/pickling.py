"""Whole-object checkpoints: ``save(model, f)`` and ``load(f, weights_only=False)``, with pickle.

A checkpoint of data (dicts of tensors, numbers, strings) needs no code to read, and ``save``
writes it as JSON and ``.npy`` arrays (``minigrad.serialization``). Many programs save the model
object itself, whose class must be imported and called to rebuild it: that takes pickle, and
*unpickling runs code named by the file*, so a file from someone else can do anything your
account can. As in PyTorch, ``load`` therefore unpickles only when the caller says
``weights_only=False``; under the default ``weights_only=True`` it unpickles with an allowlist of
classes (``find_class`` refuses any other) that the caller extends with ``add_safe_globals`` or
the ``safe_globals`` context manager. Tensors never go through pickle: the pickle holds their
index (a persistent id) and their values are the checkpoint's ``.npy`` arrays, with digests.
"""

from __future__ import annotations

import collections
import contextlib
import io
import pickle
from typing import Any, Callable, Iterator

import numpy  # host arrays: the .npy members

from minigrad import backend
from minigrad.tensor_types import Size
from minigrad._tensor import Tensor, _wrap

__all__ = ["add_safe_globals", "clear_safe_globals", "dump", "first_non_data", "get_safe_globals", "load",
           "safe_globals"]

MEMBER = "data.pkl"

# What weights_only=True unpickles without being told: containers and values that run no user code.
_BUILTIN_SAFE: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("builtins", "set"): set, ("builtins", "frozenset"): frozenset, ("builtins", "complex"): complex,
    ("builtins", "slice"): slice, ("builtins", "range"): range, ("builtins", "bytearray"): bytearray,
    ("numpy", "dtype"): numpy.dtype,
    ("minigrad.tensor_types", "Size"): Size,
    ("minigrad.backend", "Device"): backend.Device,
}
_user_safe: list[Any] = []  # add_safe_globals's entries: callables, or (callable, "module.name")


def _entry_name(entry: Any) -> tuple[tuple[str, str], Any]:
    if isinstance(entry, tuple):
        obj, name = entry
        module, _, attr = name.rpartition(".")
        return (module, attr), obj
    return (entry.__module__, entry.__qualname__), entry


def add_safe_globals(safe_globals: list[Callable | tuple[Callable, str]]) -> None:
    """Allow these classes and functions in ``load(..., weights_only=True)`` from now on. An entry
    is the object, or ``(object, "module.name")`` when the file names it differently."""
    for entry in safe_globals:
        if not (callable(entry) or (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], str))):
            raise TypeError(f"add_safe_globals: expected classes, functions or (object, 'module.name') pairs, "
                            f"got {entry!r}")
        _user_safe.append(entry)


def get_safe_globals() -> list[Callable | tuple[Callable, str]]:
    """The entries ``add_safe_globals`` has allowed (not the built-in allowlist)."""
    return list(_user_safe)


def clear_safe_globals() -> None:
    _user_safe.clear()


@contextlib.contextmanager
def safe_globals(safe_globals: list[Callable | tuple[Callable, str]]) -> Iterator[None]:
    """Allow these in ``load(..., weights_only=True)`` inside the ``with`` block only."""
    before = list(_user_safe)
    add_safe_globals(safe_globals)
    try:
        yield
    finally:
        _user_safe[:] = before


_DATA = (type(None), bool, str, int, float, Tensor, numpy.ndarray, numpy.generic)


def first_non_data(obj: Any, where: str, max_depth: int, depth: int = 0) -> tuple[str, str] | None:
    """Where the first value that is not data sits in ``obj`` (``"obj['model']"``) and its type
    name, or None when ``obj`` is all data: what ``save`` writes as JSON and arrays, no pickle."""
    if isinstance(obj, _DATA) or getattr(obj, "is_sparse", False) or depth > max_depth:
        return None  # (too deep: the data path raises its own error)
    if isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    elif isinstance(obj, dict):
        keys = (first_non_data(k, where, max_depth, depth + 1) for k in obj)
        found = next((k for k in keys if k is not None), None)
        if found is not None:
            return found
        items = ((repr(k), v) for k, v in obj.items())
    else:
        return where, type(obj).__name__
    for i, v in items:
        found = first_non_data(v, f"{where}[{i}]", max_depth, depth + 1)
        if found is not None:
            return found
    return None


class _Pickler(pickle.Pickler):
    """A pickler that stores tensors and arrays as checkpoint arrays and pickles only their index;
    a tensor reached twice (tied weights) is one array, and one tensor again after loading."""

    def __init__(self, file: Any, protocol: int, arrays: list) -> None:
        super().__init__(file, protocol, fix_imports=False)  # builtins.set, not Python 2's __builtin__.set
        self.arrays, self.ids = arrays, {}

    def persistent_id(self, obj: Any) -> Any:
        from minigrad.nn.module import Parameter

        kind = {Tensor: "tensor", Parameter: "parameter"}.get(type(obj))
        if kind is None and not (type(obj) is numpy.ndarray and not obj.dtype.hasobject):
            return None
        if id(obj) not in self.ids:
            self.ids[id(obj)] = (obj, len(self.arrays))  # the object is kept so that its id stays unique
            self.arrays.append(obj if kind is None else obj.detach().cpu().numpy())
        index = self.ids[id(obj)][1]
        return ("ndarray", index) if kind is None else (kind, index, obj.requires_grad)


def dump(obj: Any, arrays: list, protocol: int = 2) -> bytes:
    """The pickle of ``obj``, its tensors and arrays appended to ``arrays`` instead."""
    buf = io.BytesIO()
    _Pickler(buf, max(protocol, 2), arrays).dump(obj)  # protocol 2+: objects rebuilt by cls.__new__, no copyreg
    return buf.getvalue()


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: Any, arrays: list, device: Any, weights_only: bool, path: Any) -> None:
        super().__init__(file)
        self.arrays, self.device, self.weights_only, self.path, self.loaded = arrays, device, weights_only, path, {}

    def persistent_load(self, pid: Any) -> Any:
        from minigrad.nn.module import Parameter

        if not (isinstance(pid, tuple) and pid and pid[0] in ("tensor", "parameter", "ndarray")
                and type(pid[1]) is int and 0 <= pid[1] < len(self.arrays)):
            raise pickle.UnpicklingError(f"{self.path}: malformed tensor reference {pid!r} in {MEMBER}")
        if pid[1] not in self.loaded:
            array = self.arrays[pid[1]]
            if pid[0] == "ndarray":
                value = array
            else:
                t = _wrap(array, self.device) if self.device is backend.cpu else Tensor(array, device=self.device)
                value = Parameter(t, bool(pid[2])) if pid[0] == "parameter" else t.requires_grad_(bool(pid[2]))
            self.loaded[pid[1]] = value
        return self.loaded[pid[1]]

    def find_class(self, module: str, name: str) -> Any:
        if not self.weights_only:
            return super().find_class(module, name)
        allowed = dict(_BUILTIN_SAFE)
        allowed.update(_entry_name(e) for e in _user_safe)
        if (module, name) in allowed:
            return allowed[(module, name)]
        raise pickle.UnpicklingError(
            f"Weights only load failed: {self.path} holds a pickled object of {module}.{name}, which "
            "weights_only=True does not rebuild. If you trust the file, load it with weights_only=False "
            "(unpickling runs code named by the file); or allow the class with "
            f"minigrad.serialization.add_safe_globals([{name}]) or inside "
            f"`with minigrad.serialization.safe_globals([{name}]):`")


def load(raw: bytes, arrays: list, device: Any, weights_only: bool, path: Any) -> Any:
    """The object pickled in ``raw``, its tensors taken from ``arrays`` onto ``device``."""
    return _Unpickler(io.BytesIO(raw), arrays, device, weights_only, path).load()
