"""A SIMULATED cupy that keeps its "device" arrays in host memory. It is not a GPU and verifies
nothing about CUDA: it lets a CPU-only machine run minigrad's ``cuda`` code path (device dispatch,
transfers, the memory-pool figures, the generator API) and catch code that falls back to plain
numpy on device data, which real cupy refuses.

Where real cupy is strict, this module is strict too: device arrays (a numpy subclass) refuse to
meet a plain numpy array in arithmetic or in a ``cupy.*`` function, refuse numpy functions called
on them directly, and refuse implicit conversion to numpy (``numpy.asarray(device_array)``,
``numpy.array``...: cupy's ``__array__`` raises; a numpy subclass never reaches ``__array__``, so
``strict_numpy`` wraps those few numpy functions while the stand-in is installed). They give 0-d
arrays where numpy gives scalars, carry the GPU they were allocated on (``.device``), and count
every host synchronisation a real GPU would make: ``float()``, ``int()``, ``bool()``,
``.item()``, ``.tolist()`` and ``.get()`` on a device array wait for the GPU's queued work, so a
test can assert that an op's code makes none (``syncs()``). The generator has only cupy's methods
(no ``permutation``, state in a device array). Install it with ``install(monkeypatch)``;
``MINIGRAD_SIMULATE_CUDA=1`` does that for a whole run.
"""

from __future__ import annotations

import sys
import types
import weakref
from typing import Any

import numpy

_current = [0]  # the "current GPU", as cupy.cuda.Device(i) sets it
_inside = [0]  # > 0 while a cupy.* function runs numpy's code on device arrays
_syncs: list[str] = []  # what waited for the GPU, in order (a device array read on the host)


def syncs() -> list[str]:
    """The host synchronisations so far, each named by what made it (``"float()"``, ``".item()"``);
    a test takes ``len(syncs())`` before and after the code it watches."""
    return list(_syncs)


def _sync(what: str) -> None:
    if not _inside[0]:  # numpy's own code inside a cupy.* function runs on the "device"
        _syncs.append(what)


class ndarray(numpy.ndarray):
    """A device array: numpy memory labelled as living on the GPU that was current when it was
    allocated (a view lives where its base does)."""

    def __array_finalize__(self, obj: Any) -> None:
        if self.base is None:  # a new buffer (a copy, astype), not a view: the pool hands it out
            self.gpu = _current[-1]
            _allocate(self)
        else:
            self.gpu = getattr(obj, "gpu", _current[-1])

    @property
    def device(self) -> Any:
        return cuda.Device(self.gpu)

    def get(self) -> numpy.ndarray:
        """Copy to the host, as cupy's ``ndarray.get`` (which waits for the GPU)."""
        _sync(".get()")
        return numpy.array(self.view(numpy.ndarray))

    # A device array read as a Python value waits for every kernel queued before it.
    def item(self, *args: Any) -> Any:
        _sync(".item()")
        return self.view(numpy.ndarray).item(*args)

    def tolist(self) -> Any:
        _sync(".tolist()")
        return self.view(numpy.ndarray).tolist()

    def __float__(self) -> float:
        _sync("float()")
        return float(self.view(numpy.ndarray))

    def __int__(self) -> int:
        _sync("int()")
        return int(self.view(numpy.ndarray))

    def __bool__(self) -> bool:
        _sync("bool()")
        return bool(self.view(numpy.ndarray))

    def __index__(self) -> int:
        _sync("an index")
        return self.view(numpy.ndarray).__index__()

    def __array__(self, dtype: Any = None, copy: Any = None) -> numpy.ndarray:
        raise TypeError("simulated cupy: implicit conversion to a NumPy array is not allowed "
                        "(cupy refuses it too); copy to the host with .get()")

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        out = kwargs.get("out", ())
        if not _inside[0]:  # inside a cupy.* function numpy's own code may mix in host arrays
            _refuse_host(ufunc.__name__, inputs + tuple(out))
            _refuse_other_gpu(ufunc.__name__, inputs + tuple(out))
        result = getattr(ufunc, method)(*_plain(inputs), **_plain(kwargs))
        if out:
            return out[0] if len(out) == 1 else out
        return _to_device(result)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        if not _inside[0]:
            raise TypeError(f"simulated cupy: numpy.{func.__name__} was called on a device array; cupy "
                            "arrays do not convert to numpy implicitly (copy to the host with .get())")
        return super().__array_function__(func, types, args, kwargs)

    def __getitem__(self, index: Any) -> Any:
        index = _wrap_around(self.shape, _plain(index))
        return _to_device(super().__getitem__(index))  # an element is a 0-d array in cupy

    def __setitem__(self, index: Any, value: Any) -> None:
        if type(value) is numpy.ndarray and value.ndim:
            raise TypeError("simulated cupy: a numpy array cannot be written into a device array "
                            "(copy it with cupy.asarray first)")
        super().__setitem__(_plain(index), _plain(value))


def _wrap_around(shape: tuple, index: Any) -> Any:
    """cupy wraps an out-of-range integer *array* index around (row 7 of 5 is row 2) where numpy
    raises: a GPU kernel checks nothing, so minigrad's own range checks must catch it."""
    items = index if isinstance(index, tuple) else (index,)
    consumed = sum(i.ndim if isinstance(i, numpy.ndarray) and i.dtype.kind == "b" else 1
                   for i in items if i is not None and i is not Ellipsis)
    axis, out = 0, []
    for item in items:
        if item is Ellipsis:
            axis += len(shape) - consumed
        elif isinstance(item, numpy.ndarray) and item.dtype.kind == "b":
            axis += item.ndim
        elif isinstance(item, numpy.ndarray) and item.dtype.kind in "iu" and axis < len(shape) and shape[axis]:
            item = numpy.mod(item, shape[axis])
            axis += 1
        elif item is not None:
            axis += 1
        out.append(item)
    return tuple(out) if isinstance(index, tuple) else out[0]


def _plain(x: Any) -> Any:
    """Device arrays as plain numpy views of the same memory (also inside tuples, lists, dicts)."""
    if isinstance(x, ndarray):
        return x.view(numpy.ndarray)
    if isinstance(x, (tuple, list)):
        return type(x)(_plain(v) for v in x)
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    return x


def _to_device(x: Any) -> Any:
    """numpy results as device arrays; numpy scalars as 0-d device arrays, as cupy returns them."""
    if type(x) is numpy.ndarray:  # a new buffer becomes one the device owns (and the pool counts)
        return x.view(ndarray).copy() if x.base is None else x.view(ndarray)
    if isinstance(x, numpy.generic):
        return _to_device(numpy.asarray(x))
    if isinstance(x, (tuple, list)):
        return type(x)(_to_device(v) for v in x)
    return x


def _refuse_host(name: str, args: Any) -> None:
    for a in args:
        if isinstance(a, (tuple, list)):
            _refuse_host(name, a)
        elif type(a) is numpy.ndarray:
            raise TypeError(f"simulated cupy: cupy.{name} was given a numpy array; device code must "
                            "not mix host arrays in (copy with cupy.asarray first)")


def _refuse_other_gpu(name: str, args: Any) -> None:
    """cupy runs a kernel on the current GPU and refuses (without peer access) an array that lives
    on another: an op on cuda:1 must select cuda:1 first."""
    for a in args:
        if isinstance(a, (tuple, list)):
            _refuse_other_gpu(name, a)
        elif isinstance(a, ndarray) and a.gpu != _current[-1]:
            raise ValueError(f"simulated cupy: {name}: the device where the array resides ({a.gpu}) is "
                             f"different from the current device ({_current[-1]})")


def _function(fn: Any) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        _refuse_host(fn.__name__, args + tuple(kwargs.values()))
        _refuse_other_gpu(fn.__name__, args + tuple(kwargs.values()))
        if fn.__name__ in ("take", "take_along_axis") and len(args) >= 2:  # cupy wraps indices around
            axis = kwargs.get("axis", args[2] if len(args) > 2 else None)
            size = args[0].size if axis is None else args[0].shape[axis]
            args = (args[0], _to_device(numpy.mod(_plain(args[1]), size)) if size else args[1], *args[2:])
        _inside[0] += 1
        try:
            return _to_device(fn(*args, **kwargs))
        finally:
            _inside[0] -= 1

    call.__name__ = fn.__name__
    return call


class _Ufunc:
    _AT_DTYPES = ("float16", "float32", "float64", "int32", "uint32", "uint64")  # cupy's atomicAdd

    def __init__(self, ufunc: Any) -> None:
        self.ufunc, self.__name__, self._call = ufunc, ufunc.__name__, _function(ufunc)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(*args, **kwargs)

    def at(self, a: Any, indices: Any, b: Any = None) -> None:
        if self.ufunc is numpy.add and a.dtype.name not in self._AT_DTYPES:
            raise TypeError("cupy.add.at only supports int32, float16, float32, float64, uint32, uint64, as data type")
        _refuse_host(f"{self.__name__}.at", (a, indices, b))
        self.ufunc.at(_plain(a), _plain(indices), _plain(b))


# -- array creation from host data -----------------------------------------------------------------
def asarray(a: Any, dtype: Any = None) -> ndarray:
    if isinstance(a, ndarray) and (dtype is None or numpy.dtype(dtype) == a.dtype):
        return a
    return array(a, dtype=dtype)


def array(a: Any, dtype: Any = None, copy: bool = True) -> ndarray:
    return numpy.array(_plain(a), dtype=dtype).view(ndarray).copy()


def asnumpy(a: Any) -> numpy.ndarray:
    return a.get() if isinstance(a, ndarray) else numpy.asarray(a)


_CONVERSIONS = ("asarray", "array", "asanyarray", "ascontiguousarray", "asfortranarray")


def _holds_device_array(x: Any) -> bool:
    if isinstance(x, ndarray):
        return True
    return isinstance(x, (list, tuple)) and any(_holds_device_array(v) for v in x)


def _strict(convert: Any) -> Any:
    def call(a: Any, *args: Any, **kwargs: Any) -> Any:
        if not _inside[0] and _holds_device_array(a):
            raise TypeError(f"simulated cupy: numpy.{convert.__name__} was given a device array; implicit "
                            "conversion to a NumPy array is not allowed (copy to the host with .get())")
        return convert(a, *args, **kwargs)

    call.__name__, call.__wrapped__ = convert.__name__, convert
    return call


def strict_numpy(setattr_: Any = setattr) -> None:
    """Make numpy's array constructors refuse device arrays, as cupy's ``__array__`` makes them
    (numpy takes its own subclass as it is, without asking ``__array__``). ``setattr_`` is
    ``monkeypatch.setattr`` for one test, plain ``setattr`` for a whole run."""
    for name in _CONVERSIONS:
        convert = getattr(numpy, name)
        setattr_(numpy, name, _strict(getattr(convert, "__wrapped__", convert)))


# -- the memory pool and the allocator hook --------------------------------------------------------
class _Pointer:
    def __init__(self, device_id: int, size: int) -> None:
        self.device_id, self.size = device_id, size


class _MemoryPool:
    def __init__(self) -> None:
        self.used: dict[int, int] = {}

    def malloc(self, nbytes: int) -> _Pointer:
        self.used[_current[-1]] = self.used.get(_current[-1], 0) + nbytes
        return _Pointer(_current[-1], nbytes)

    def free(self, pointer: _Pointer) -> None:
        self.used[pointer.device_id] -= pointer.size

    def used_bytes(self) -> int:
        return self.used.get(_current[-1], 0)

    def total_bytes(self) -> int:  # the fake caches nothing: all it holds is in use
        return self.used_bytes()

    def free_bytes(self) -> int:
        return 0

    def n_free_blocks(self) -> int:
        return 0

    def free_all_blocks(self) -> None:
        pass


_pool = _MemoryPool()
_allocator: list[Any] = [_pool.malloc]


def _allocate(owner: numpy.ndarray) -> None:
    pointer = _allocator[0](owner.nbytes)
    weakref.finalize(owner, _pool.free, pointer)


def get_default_memory_pool() -> _MemoryPool:
    return _pool


class _Device:
    def __init__(self, index: int = 0) -> None:
        self.id = index

    def __enter__(self) -> _Device:
        _current.append(self.id)
        return self

    def __exit__(self, *exc: Any) -> None:
        _current.pop()

    def synchronize(self) -> None:
        cuda.synchronized += 1


def _set_allocator(allocator: Any) -> None:
    _allocator[0] = allocator if allocator is not None else _pool.malloc


cuda = types.SimpleNamespace(
    Device=_Device, set_allocator=_set_allocator, get_allocator=lambda: _allocator[0], synchronized=0,
    runtime=types.SimpleNamespace(getDeviceCount=lambda: 2, getDevice=lambda: _current[-1]),
)


# -- random numbers: cupy's Generator API, with its state in a device array ------------------------
class _BitGenerator:
    """Counter-based, like cuRAND's states: ``_state`` is a device array, and copying it and
    writing it back later replays the same draws (what minigrad's get/set_rng_state do)."""

    def __init__(self, seed: Any) -> None:
        self._key = numpy.random.SeedSequence(seed).entropy
        self._state = array(numpy.zeros(1, numpy.uint64))

    def next(self) -> numpy.random.Generator:
        n = int(self._state.view(numpy.ndarray)[0])  # the counter moves on the device: no sync
        self._state[0] = n + 1
        return numpy.random.default_rng([self._key, n])


class _Generator:
    def __init__(self, bit_generator: _BitGenerator) -> None:
        self.bit_generator = bit_generator

    def random(self, size: Any = None, dtype: Any = numpy.float64) -> ndarray:
        return _to_device(self.bit_generator.next().random(size, dtype=dtype))

    def standard_normal(self, size: Any = None, dtype: Any = numpy.float64) -> ndarray:
        return _to_device(self.bit_generator.next().standard_normal(size, dtype=dtype))

    def standard_exponential(self, size: Any = None, dtype: Any = numpy.float64) -> ndarray:
        return _to_device(self.bit_generator.next().standard_exponential(size, dtype=dtype))

    def uniform(self, low: float = 0.0, high: float = 1.0, size: Any = None, dtype: Any = numpy.float64) -> ndarray:
        return _to_device(self.bit_generator.next().uniform(low, high, size).astype(dtype))

    def integers(self, low: int, high: int | None = None, size: Any = None, dtype: Any = numpy.int64,
                 endpoint: bool = False) -> ndarray:
        return _to_device(self.bit_generator.next().integers(low, high, size, dtype=dtype, endpoint=endpoint))


random = types.SimpleNamespace(default_rng=lambda seed=None: _Generator(_BitGenerator(seed)))
lib = types.SimpleNamespace(stride_tricks=types.SimpleNamespace(
    as_strided=_function(numpy.lib.stride_tricks.as_strided)))


class _Module(types.ModuleType):
    """``cupy``: the names above, and every other numpy function or ufunc wrapped to take and
    return device arrays (dtypes and constants pass through)."""

    def __getattr__(self, name: str) -> Any:
        target = getattr(numpy, name)
        if isinstance(target, numpy.ufunc):
            wrapped = _Ufunc(target)
        elif callable(target) and not isinstance(target, type):
            wrapped = _function(target)
        else:
            wrapped = target
        setattr(self, name, wrapped)
        return wrapped


module = _Module("cupy", __doc__)
for _name in ("ndarray", "asarray", "array", "asnumpy", "get_default_memory_pool", "cuda", "random", "lib"):
    setattr(module, _name, globals()[_name])


def install(monkeypatch: Any) -> Any:
    """Make ``import cupy`` give the simulation for one test (``monkeypatch`` undoes it), with
    minigrad's cached cuda devices and pool allocator cleared before and after."""
    import minigrad

    if sys.modules.get("cupy") is module:
        return lambda: None  # already simulating for the whole run (MINIGRAD_SIMULATE_CUDA=1)

    def forget() -> None:
        for key in [k for k in minigrad.Device._cache if k.startswith("cuda")]:
            del minigrad.Device._cache[key]
        minigrad.backend._allocator = None
        _set_allocator(None)
        minigrad.backend.value_checks._pending.clear()  # checks a test left unread are not the next test's
        cuda.synchronized, _current[:] = 0, [0]

    forget()
    monkeypatch.setitem(sys.modules, "cupy", module)
    strict_numpy(monkeypatch.setattr)
    monkeypatch.setattr(minigrad.backend, "_default_device", minigrad.backend.cpu)
    return forget
