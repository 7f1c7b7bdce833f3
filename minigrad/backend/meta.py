"""The ``meta`` device: tensors with a shape and a dtype and no storage (chapter 01, lazy loading).

Building a model whose weights fill most of memory, only to overwrite them with a checkpoint,
costs twice the memory and the time of random initialisation. As in PyTorch, a model built under
``with minigrad.device("meta"):`` gets parameters that hold no data; ``Module.to_empty`` or
``load_state_dict(..., assign=True)`` (with ``minigrad.load(path, mmap=True)``) give them storage
later. Ops on meta tensors compute only their output's shape and dtype: a ``MetaArray`` is the
meta device's array, and ``xp`` below is its array module, so the ops run unchanged. numpy's
dispatch protocols (``__array_ufunc__``, ``__array_function__``) send every numpy call on a
MetaArray here. Shapes come from the broadcasting and matmul rules, from a small rule for each
numpy function that builds a new array (``_RULES``: concatenate, stack, where, cumsum...), or from
running the numpy function on a *stand-in*: a zero-stride view of one element with the right shape,
which costs no memory for the views (reshape, transpose, slicing) that most shape work is. A
function that only moves elements (indexing by an array, ``take``, ``pad``, ``roll``) runs on
stand-ins whose dtype takes no bytes, so its copy of the elements allocates nothing. Anything that
needs values (``item()``, printing the numbers, a boolean mask, a copy to cpu) raises ``DeviceError``.
"""

from __future__ import annotations

import math
import types
import warnings
from typing import Any

import numpy  # shapes and dtypes follow numpy's rules; the stand-ins are numpy views
from numpy.lib.array_utils import normalize_axis_index
from numpy.lib.mixins import NDArrayOperatorsMixin

from minigrad.errors import DeviceError


def needs_values(what: str) -> DeviceError:
    return DeviceError(f"{what} needs the values of a meta tensor, which has none (meta tensors hold a "
                       "shape and a dtype only); give the model storage first with Module.to_empty(device=...) "
                       "or load_state_dict(state_dict, assign=True)")


def has_values(array: Any) -> bool:
    """Whether ``array`` holds values: not on the meta device. Checks of values (an index in range,
    probabilities in [0, 1]) and loops over them (redrawing samples outside a range) skip a meta
    array, as in torch, where a model's shapes are built before it has any values."""
    return not isinstance(array, MetaArray)


class MetaArray(NDArrayOperatorsMixin):
    """What a meta tensor holds instead of an array: a shape and a dtype."""

    __slots__ = ("shape", "dtype")
    device = "meta"
    base = None  # never a view of another array's memory: it has none
    flags = types.SimpleNamespace(c_contiguous=True, f_contiguous=False, writeable=True)

    def __init__(self, shape: Any, dtype: Any) -> None:
        self.shape, self.dtype = tuple(int(n) for n in shape), numpy.dtype(dtype)

    ndim = property(lambda self: len(self.shape))
    size = property(lambda self: math.prod(self.shape))
    itemsize = property(lambda self: self.dtype.itemsize)
    nbytes = property(lambda self: self.size * self.dtype.itemsize)
    T = property(lambda self: self.transpose())
    # the last two dims swapped, as numpy's ``.mT``: backward rules on arrays (ctx.ops) use it
    mT = property(lambda self: self.swapaxes(-1, -2))

    @property
    def strides(self) -> tuple:
        """Row-major strides in bytes, as the array would have."""
        out, step = [], self.dtype.itemsize
        for n in reversed(self.shape):
            out.append(step)
            step *= n
        return tuple(reversed(out))

    def __repr__(self) -> str:
        return f"MetaArray(shape={self.shape}, dtype={self.dtype})"

    def standin(self, dtype: Any = None) -> numpy.ndarray:
        """A read-only zero-stride view of one element with this shape: numpy's shape rules run on
        it for free as long as they only make views. With ``dtype=SHAPE_ONLY`` its elements take no
        bytes, so even a function that copies them (indexing by an array, ``take``) allocates nothing."""
        return numpy.broadcast_to(numpy.ones((), self.dtype if dtype is None else dtype), self.shape)

    def astype(self, dtype: Any, copy: bool = True) -> MetaArray:
        return MetaArray(self.shape, dtype)

    def copy(self, order: str = "C") -> MetaArray:
        return MetaArray(self.shape, self.dtype)

    def __getattr__(self, name: str) -> Any:
        if name in _VIEWS:
            return lambda *args, **kwargs: _meta(getattr(self.standin(), name)(*_standins(args), **kwargs), name)
        if name in _METHODS:  # the method is numpy's function of the same name, which dispatches here
            return lambda *args, **kwargs: getattr(numpy, name)(self, *args, **kwargs)
        raise AttributeError(f"a meta tensor's array has no {name!r}")

    def __getitem__(self, index: Any) -> MetaArray:
        return MetaArray(self.standin(SHAPE_ONLY)[_index(index)].shape, self.dtype)

    def __setitem__(self, index: Any, value: Any) -> None:
        target = self.standin(SHAPE_ONLY)[_index(index)]  # checks the index; there is nothing to write
        numpy.broadcast_to(_standin(value), target.shape)  # and that the value fits

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        raise needs_values("converting to a numpy array")

    def get(self) -> Any:
        raise needs_values("copying to the cpu")

    def item(self) -> Any:
        raise needs_values("item()")

    def tolist(self) -> Any:
        raise needs_values("tolist()")

    def __bool__(self) -> bool:
        raise needs_values("the truth value of a tensor")

    __float__ = __int__ = __index__ = item

    # -- numpy's dispatch ---------------------------------------------------------------------------
    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        out = kwargs.pop("out", None)
        if method == "at":  # scatter into a meta array: nothing to write
            return None
        if method == "reduce":
            return _reduce(getattr(ufunc, "reduce"), inputs[0], *inputs[1:], **kwargs)
        if method == "accumulate":
            return MetaArray(inputs[0].shape, _trial(getattr(ufunc, method), inputs, kwargs).dtype)
        if method != "__call__":
            raise needs_values(f"numpy.{ufunc.__name__}.{method}")
        shape = _matmul_shape(*inputs) if ufunc is numpy.matmul else numpy.broadcast_shapes(
            *[numpy.shape(x) if not isinstance(x, MetaArray) else x.shape for x in inputs])
        trial = _trial(ufunc, inputs, kwargs)
        result = tuple(MetaArray(shape, t.dtype) for t in trial) if ufunc.nout > 1 else MetaArray(shape, trial.dtype)
        return out[0] if out else result

    def __array_function__(self, func: Any, types_: Any, args: Any, kwargs: Any) -> Any:
        name = func.__name__
        if name in _REDUCTIONS:
            return _reduce(func, *args, **kwargs)
        if name in _RULES:
            return _RULES[name](func, *args, **kwargs)
        if name in _MOVES:  # its result holds elements of its first argument, moved: no bytes to copy
            a = args[0].standin(SHAPE_ONLY) if isinstance(args[0], MetaArray) else args[0]
            moved = func(a, *_index(tuple(args[1:])), **{k: _index(v) for k, v in kwargs.items()})
            return MetaArray(moved.shape, args[0].dtype)
        if name in _NO_VALUES:
            return func(*_standins(args), **_standins(kwargs))
        if name in ("copyto", "put_along_axis"):  # writes into a meta array: nothing to write
            return None
        if name in _VALUE_DEPENDENT:
            raise needs_values(f"numpy.{name}")
        return _meta(func(*_standins(args), **_standins(kwargs)), f"numpy.{name}")


_REDUCTIONS = {"sum", "mean", "prod", "max", "min", "amax", "amin", "var", "std", "argmax", "argmin", "any",
               "all", "nansum", "nanmax", "nanmin", "nanmean"}
_VIEWS = {"reshape", "transpose", "swapaxes", "squeeze", "ravel", "diagonal", "view"}
_METHODS = _REDUCTIONS | {"cumsum", "cumprod", "clip", "argsort", "sort", "repeat", "take", "nonzero"}
_NO_VALUES = {"result_type", "shape", "ndim", "size", "can_cast", "may_share_memory", "shares_memory",
              "iscomplexobj", "isrealobj", "broadcast_shapes"}
_MOVES = {"take", "take_along_axis", "pad", "roll", "tile", "repeat", "flip", "tril", "triu"}
SHAPE_ONLY = numpy.dtype([])  # a dtype whose elements take no bytes: for stand-ins whose values are copied
_VALUE_DEPENDENT = {"nonzero", "argwhere", "flatnonzero", "unique", "extract", "compress", "count_nonzero",
                    "allclose", "array_equal", "isclose", "searchsorted", "bincount", "histogram"}


def _standin(x: Any) -> Any:
    return x.standin() if isinstance(x, MetaArray) else x


def _standins(x: Any, dtype: Any = None) -> Any:
    if isinstance(x, MetaArray):
        return x.standin(dtype)
    if isinstance(x, (list, tuple)):
        return type(x)(_standins(v, dtype) for v in x)
    if isinstance(x, dict):
        return {k: _standins(v, dtype) for k, v in x.items()}
    return x


def _index(index: Any) -> Any:
    """An index with meta parts made concrete: integer index arrays become zeros of their shape
    (the result's shape does not depend on which rows they pick); a boolean mask does depend."""
    if isinstance(index, tuple):
        return tuple(_index(i) for i in index)
    if isinstance(index, MetaArray):
        if index.dtype.kind == "b":
            raise needs_values("indexing with a boolean mask")
        return numpy.broadcast_to(numpy.zeros((), index.dtype), index.shape)
    return index


def _meta(x: Any, what: str) -> Any:
    """A stand-in's result as a MetaArray (or a tuple of them); anything else is a value."""
    if isinstance(x, (numpy.ndarray, numpy.generic)):
        return MetaArray(numpy.shape(x), x.dtype)
    if isinstance(x, (tuple, list)):
        return tuple(_meta(v, what) for v in x)
    raise needs_values(what)


def _trial(fn: Any, inputs: tuple, kwargs: dict) -> Any:
    """``fn`` on one-element arrays of the inputs' dtypes: numpy's dtype rules, at no cost."""
    small = [numpy.ones((1,) * max(x.ndim, 1 if fn is numpy.matmul else 0), x.dtype)
             if isinstance(x, (MetaArray, numpy.ndarray)) else x for x in inputs]
    with numpy.errstate(all="ignore"):
        return fn(*small, **kwargs)


def _reduce(fn: Any, a: Any, axis: Any = None, *args: Any, keepdims: bool = False, out: Any = None,
            **kwargs: Any) -> MetaArray:
    """A reduction's output: the reduced axes dropped (or kept as 1)."""
    ndim = a.ndim
    axes = range(ndim) if axis is None else [ax % max(ndim, 1) for ax in numpy.atleast_1d(axis).tolist()]
    shape = tuple(1 if i in axes else n for i, n in enumerate(a.shape) if keepdims or i not in axes)
    with numpy.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # var(ddof=1) of one element: only its dtype counts
        dtype = fn(numpy.ones((1,) * ndim, a.dtype), axis, *args, **kwargs).dtype
    return MetaArray(shape, dtype)


def _join(func: Any, arrays: Any, axis: Any = 0, out: Any = None, dtype: Any = None, casting: str = "same_kind",
          *, new_axis: bool = False) -> MetaArray:
    """``concatenate``'s output (with ``new_axis``: ``stack``'s): sizes along ``axis`` add up. A rule,
    as concatenating stand-ins makes a real array of the output's size (and even with bytes-free
    elements, a copy whose time grows with the output's rows)."""
    shapes = [tuple(numpy.shape(a) if not isinstance(a, MetaArray) else a.shape) for a in arrays]
    if not shapes:
        raise ValueError("need at least one array to concatenate")
    if axis is None and not new_axis:
        shapes, axis = [(math.prod(s),) for s in shapes], 0
    first = shapes[0]
    if not first and not new_axis:
        raise ValueError("zero-dimensional arrays cannot be concatenated")
    ax = normalize_axis_index(axis, len(first) + new_axis)
    for i, s in enumerate(shapes):
        if new_axis and s != first:
            raise ValueError(f"all input arrays must have the same shape, got {first} and {s} (array {i})")
        if len(s) != len(first) or any(m != n for k, (m, n) in enumerate(zip(s, first)) if k != ax):
            raise ValueError(f"all the input array dimensions except for the concatenation axis must match "
                             f"exactly, got {first} and {s} (array {i}) along axis {ax}")
    joined = len(shapes) if new_axis else sum(s[ax] for s in shapes)
    shape = first[:ax] + (joined,) + first[ax + (not new_axis):]
    return MetaArray(shape, numpy.result_type(*arrays) if dtype is None else dtype)


def _clip(func: Any, a: Any, a_min: Any = None, a_max: Any = None, out: Any = None, **kwargs: Any) -> MetaArray:
    """``clip`` broadcasts its three arguments, as a ufunc; the dtype is a one-element trial's."""
    shape = numpy.broadcast_shapes(*[numpy.shape(_standin(x)) for x in (a, a_min, a_max) if x is not None])
    return MetaArray(shape, _trial(func, (a, a_min, a_max), kwargs).dtype)


def _where(func: Any, condition: Any, *xy: Any) -> MetaArray:
    """``where(condition, x, y)``: all three broadcast; the dtype is x's and y's. With the condition
    alone it lists the true positions, which are values."""
    if not xy:
        raise needs_values("numpy.where with a condition only")
    shape = numpy.broadcast_shapes(*[numpy.shape(_standin(a)) for a in (condition, *xy)])
    return MetaArray(shape, numpy.result_type(*[_standin(a) for a in xy]))


def _scan(func: Any, a: Any, *args: Any, **kwargs: Any) -> MetaArray:
    """``cumsum``, ``sort``...: the input's shape, or flattened (``axis=None``, which the trial on a
    one-element array of the input's rank shows); the dtype is the trial's."""
    with numpy.errstate(all="ignore"):
        trial = func(numpy.ones((1,) * a.ndim, a.dtype), *args, **kwargs)
    return MetaArray(a.shape if trial.ndim == a.ndim else (a.size,), trial.dtype)


def _einsum(func: Any, subscripts: Any, *operands: Any, **kwargs: Any) -> MetaArray:
    """``einsum`` with one letter per axis (what minigrad's ops pass): each output letter has the
    size it has in the operands. With ``...`` it runs on the stand-ins instead."""
    if not isinstance(subscripts, str) or "." in subscripts:
        return _meta(func(subscripts, *_standins(operands), **kwargs), "numpy.einsum")
    lhs, arrow, out = subscripts.replace(" ", "").partition("->")
    terms, sizes = lhs.split(","), {}
    if len(terms) != len(operands):
        raise ValueError(f"einsum: {len(terms)} operand subscripts for {len(operands)} operands")
    for term, shape in zip(terms, (numpy.shape(_standin(o)) for o in operands)):
        if len(term) != len(shape) or len({(letter, n) for letter, n in zip(term, shape)}) != len(set(term)):
            raise ValueError(f"einsum: subscripts {term!r} for an operand of shape {shape}")
        for letter, n in zip(term, shape):  # across operands a size of 1 broadcasts, as in numpy
            seen = sizes.setdefault(letter, n)
            if seen != n and 1 not in (seen, n):
                raise ValueError(f"einsum: subscript {letter!r} has sizes {seen} and {n}")
            sizes[letter] = n if seen == 1 else seen
    if not arrow:  # implicit output: the letters used once, in alphabetical order
        out = "".join(sorted(letter for letter in sizes if lhs.count(letter) == 1))
    if any(letter not in sizes for letter in out):
        raise ValueError(f"einsum: output subscripts {out!r} name letters no operand has")
    dtype = numpy.result_type(*operands) if kwargs.get("dtype") is None else kwargs["dtype"]
    return MetaArray(tuple(sizes[letter] for letter in out), dtype)


# numpy functions whose result is a new array: their shape rule, which allocates nothing
_RULES = {"concatenate": _join, "stack": lambda *args, **kwargs: _join(*args, **kwargs, new_axis=True),
          "clip": _clip, "cumsum": _scan, "cumprod": _scan, "sort": _scan, "argsort": _scan, "where": _where,
          "einsum": _einsum}


def _matmul_shape(a: Any, b: Any) -> tuple:
    sa, sb = tuple(numpy.shape(a) if not isinstance(a, MetaArray) else a.shape), tuple(b.shape)
    if not sa or not sb:
        raise ValueError("matmul: a 0-d operand has no dimension to contract")
    a2, b2 = (1,) + sa if len(sa) == 1 else sa, sb + (1,) if len(sb) == 1 else sb
    if a2[-1] != b2[-2]:
        raise ValueError(f"matmul: shapes {sa} and {sb} do not fit ({a2[-1]} != {b2[-2]})")
    shape = numpy.broadcast_shapes(a2[:-2], b2[:-2]) + (a2[-2], b2[-1])
    if len(sa) == 1:
        shape = shape[:-2] + shape[-1:]
    if len(sb) == 1:
        shape = shape[:-1]
    return shape


# -- the meta device's array module ------------------------------------------------------------------
def _shape(shape: Any) -> tuple:
    return (shape,) if isinstance(shape, int) else tuple(shape)


def _like(a: Any, dtype: Any = None, shape: Any = None, **_: Any) -> MetaArray:
    return MetaArray(a.shape if shape is None else _shape(shape), a.dtype if dtype is None else dtype)


class _MetaGenerator:
    """The meta device's random generator: samples of the right shape, with no values."""

    def _sample(self, size: Any, dtype: Any = numpy.float64) -> MetaArray:
        return MetaArray(() if size is None else _shape(size), dtype)

    def random(self, size: Any = None, dtype: Any = numpy.float64) -> MetaArray:
        return self._sample(size, dtype)

    def standard_normal(self, size: Any = None, dtype: Any = numpy.float64) -> MetaArray:
        return self._sample(size, dtype)

    def uniform(self, low: float = 0.0, high: float = 1.0, size: Any = None) -> MetaArray:
        return self._sample(size)

    def integers(self, low: int, high: int | None = None, size: Any = None, dtype: Any = numpy.int64) -> MetaArray:
        return self._sample(size, dtype)

    def permutation(self, n: int) -> MetaArray:
        return self._sample(n, numpy.int64)


class _MetaModule(types.ModuleType):
    """``xp`` for the meta device: creation functions make MetaArrays; every other name is numpy's
    (its functions dispatch to MetaArray through numpy's protocols)."""

    ndarray = MetaArray
    random = types.SimpleNamespace(default_rng=lambda seed=None: _MetaGenerator())
    # a strided view (the windows of a convolution or a pooling) has the shape it is given
    lib = types.SimpleNamespace(stride_tricks=types.SimpleNamespace(
        as_strided=lambda x, shape=None, strides=None, **_: MetaArray(x.shape if shape is None else shape, x.dtype)))

    @staticmethod
    def empty(shape: Any, dtype: Any = numpy.float64, **_: Any) -> MetaArray:
        return MetaArray(_shape(shape), dtype)

    zeros = ones = empty

    @staticmethod
    def full(shape: Any, fill_value: Any, dtype: Any = None, **_: Any) -> MetaArray:
        return MetaArray(_shape(shape), numpy.asarray(fill_value).dtype if dtype is None else dtype)

    empty_like = zeros_like = ones_like = staticmethod(_like)

    @staticmethod
    def full_like(a: Any, fill_value: Any, dtype: Any = None, **_: Any) -> MetaArray:
        return _like(a, dtype)

    @staticmethod
    def arange(*args: Any, dtype: Any = None) -> MetaArray:
        return MetaArray(numpy.arange(*args).shape, numpy.arange(*args[:1] or [0]).dtype if dtype is None else dtype)

    @staticmethod
    def linspace(start: float, stop: float, num: int = 50, dtype: Any = None, **_: Any) -> MetaArray:
        return MetaArray((num,), numpy.float64 if dtype is None else dtype)

    @staticmethod
    def eye(n: int, m: int | None = None, dtype: Any = numpy.float64, **_: Any) -> MetaArray:
        return MetaArray((n, n if m is None else m), dtype)

    @staticmethod
    def asarray(a: Any, dtype: Any = None, **_: Any) -> MetaArray:
        if isinstance(a, MetaArray):
            return a if dtype is None or numpy.dtype(dtype) == a.dtype else a.astype(dtype)
        probe = numpy.asarray(a, dtype=dtype)
        return MetaArray(probe.shape, probe.dtype)

    array = ascontiguousarray = asarray

    def __getattr__(self, name: str) -> Any:
        return getattr(numpy, name)


xp = _MetaModule("minigrad.backend.meta.xp")
