"""Creation functions with PyTorch's names and defaults: ``tensor, zeros, ones, randn, arange...``.

Floating results default to float32 (``minigrad.get_default_dtype()``), integer ranges to int64,
and tensors go to ``minigrad.get_default_device()`` (cpu unless changed) when no ``device`` is given.
Random ones draw from the device's generator, seeded by ``minigrad.manual_seed`` (chapter 01);
inside ``vmap`` they follow its ``randomness`` (``minigrad.autograd.mode.random_call``).
"""

from __future__ import annotations

from typing import Any

from minigrad import backend
from minigrad.backend import Device
from minigrad.autograd.mode import random_call
from minigrad._tensor import Tensor, _shape_arg, _wrap, inferred_dtype
from minigrad.tensor_types import Size, dtype_of_type_name


# Each function allocates inside ``backend.selected(dev)``: cupy allocates on the current GPU,
# which need not be the one ``device="cuda:1"`` names.
def _make(array: Any, dev: Device, requires_grad: bool) -> Tensor:
    t = _wrap(array, dev)
    if requires_grad:
        t.requires_grad_(True)
    return t


def _float_dtype(dtype: Any) -> Any:
    return backend.get_default_dtype() if dtype is None else backend.as_dtype(dtype)


def tensor(data: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """A new tensor holding a copy of ``data`` (nested lists, a scalar, an array or a Tensor)."""
    if dtype is None and isinstance(data, (list, tuple)):  # inferred here: Tensor(list) is always float
        data = backend.numpy.asarray(data)
        dtype = inferred_dtype(data)
    return Tensor(data, dtype=dtype, device=device, requires_grad=requires_grad)


def zeros(*size, dtype=None, device=None, requires_grad=False) -> Tensor:
    dev = backend.resolve_device(device)
    with backend.selected(dev):
        return _make(dev.xp.zeros(_shape_arg(size), _float_dtype(dtype)), dev, requires_grad)


def ones(*size, dtype=None, device=None, requires_grad=False) -> Tensor:
    dev = backend.resolve_device(device)
    with backend.selected(dev):
        return _make(dev.xp.ones(_shape_arg(size), _float_dtype(dtype)), dev, requires_grad)


def empty(*size, dtype=None, device=None, requires_grad=False) -> Tensor:
    dev = backend.resolve_device(device)
    with backend.selected(dev):
        return _make(dev.xp.empty(_shape_arg(size), _float_dtype(dtype)), dev, requires_grad)


def full(size, fill_value, dtype=None, device=None, requires_grad=False) -> Tensor:
    dev = backend.resolve_device(device)
    if dtype is None:
        dtype = backend.bool_ if isinstance(fill_value, bool) else (
            backend.int64 if isinstance(fill_value, int) else backend.get_default_dtype())
    with backend.selected(dev):
        return _make(dev.xp.full(tuple(size), fill_value, backend.as_dtype(dtype)), dev, requires_grad)


def arange(start, end=None, step=1, dtype=None, device=None, requires_grad=False) -> Tensor:
    """``arange(5)``, ``arange(1, 4)``, ``arange(0, 1, 0.25)``: int64 unless a bound is a float."""
    if end is None:
        start, end = 0, start
    dev = backend.resolve_device(device)
    if dtype is None:
        is_int = all(isinstance(v, int) for v in (start, end, step))
        dtype = backend.int64 if is_int else backend.get_default_dtype()
    with backend.selected(dev):
        return _make(dev.xp.arange(start, end, step).astype(backend.as_dtype(dtype)), dev, requires_grad)


def linspace(start, end, steps, dtype=None, device=None, requires_grad=False) -> Tensor:
    dev = backend.resolve_device(device)
    with backend.selected(dev):
        return _make(dev.xp.linspace(start, end, steps).astype(_float_dtype(dtype)), dev, requires_grad)


def eye(n, m=None, dtype=None, device=None, requires_grad=False) -> Tensor:
    dev = backend.resolve_device(device)
    with backend.selected(dev):
        return _make(dev.xp.eye(n, m, dtype=_float_dtype(dtype)), dev, requires_grad)


def rand(*size, generator=None, dtype=None, device=None, requires_grad=False) -> Tensor:
    """Uniform samples in [0, 1) (from ``generator``, a ``minigrad.Generator``, when given)."""
    dev = backend.resolve_device(device)
    dt = _float_dtype(dtype)
    def draw() -> Tensor:
        with backend.selected(dev):
            return _make(_draw(dev, backend.rng_of(dev, generator).random, _shape_arg(size), dt), dev, requires_grad)
    return random_call("rand", draw)


def randn(*size, generator=None, dtype=None, device=None, requires_grad=False) -> Tensor:
    """Standard normal samples."""
    dev = backend.resolve_device(device)
    dt = _float_dtype(dtype)
    def draw() -> Tensor:
        with backend.selected(dev):
            return _make(_draw(dev, backend.rng_of(dev, generator).standard_normal, _shape_arg(size), dt), dev,
                         requires_grad)
    return random_call("randn", draw)


def _draw(dev: backend.Device, method: Any, shape: tuple, dtype: Any) -> Any:
    """``method(shape)`` as ``dtype``. A GPU draws float32 itself (cuRAND has float32 kernels; float16
    is drawn as float32): half the random bits and memory of float64, and no cast. The CPU keeps
    numpy's float64 stream, cast, so a seed gives the values it always gave (the lessons' stored
    outputs are made from them)."""
    if dev.type == "cuda":
        return method(shape, dtype=dtype if dtype == backend.float64 else backend.float32).astype(dtype, copy=False)
    return method(shape).astype(dtype)


def randint(low, high=None, size=(), *, generator=None, dtype=None, device=None) -> Tensor:
    """Integers uniform in [low, high) (``randint(high, size)`` also works, as in torch)."""
    if isinstance(high, (tuple, list)):  # randint(high, size)
        low, high, size = 0, low, high
    elif high is None:
        low, high = 0, low
    dev = backend.resolve_device(device)
    dt = backend.int64 if dtype is None else backend.as_dtype(dtype)
    def draw() -> Tensor:
        with backend.selected(dev):
            return _make(backend.rng_of(dev, generator).integers(low, high, size=tuple(size)).astype(dt), dev, False)
    return random_call("randint", draw)


def randperm(n, *, generator=None, dtype=None, device=None) -> Tensor:
    """A random order of ``0 .. n-1``."""
    dev = backend.resolve_device(device)
    dt = backend.int64 if dtype is None else backend.as_dtype(dtype)
    def draw() -> Tensor:
        with backend.selected(dev):
            return _make(backend.permutation(dev, n, backend.rng_of(dev, generator)).astype(dt), dev, False)
    return random_call("randperm", draw)


def from_numpy(array: Any) -> Tensor:
    """A cpu tensor sharing ``array``'s memory (no copy): writes through either show in both."""
    if not isinstance(array, backend.numpy.ndarray):
        raise TypeError(f"from_numpy: expected a numpy.ndarray, got {type(array).__name__}")
    backend.as_dtype(array.dtype)  # a DTypeError naming the supported dtypes
    return _wrap(array, backend.cpu)


def _like(fn):
    def like(input: Tensor, dtype=None, device=None, requires_grad=False) -> Tensor:
        return fn(input.shape, dtype=dtype or input.dtype, device=device or input.device,
                  requires_grad=requires_grad)

    like.__name__ = fn.__name__ + "_like"
    like.__doc__ = f"``{fn.__name__}`` with the shape, dtype and device of ``input``."
    return like


zeros_like, ones_like, empty_like, rand_like, randn_like = map(_like, (zeros, ones, empty, rand, randn))


def full_like(input: Tensor, fill_value, dtype=None, device=None, requires_grad=False) -> Tensor:
    return full(input.shape, fill_value, dtype=dtype or input.dtype, device=device or input.device,
                requires_grad=requires_grad)


# -- the legacy typed constructors: FloatTensor([1, 2]) is data, FloatTensor(2, 3) a shape (zeros:
# minigrad never hands out uninitialised memory); isinstance(x, LongTensor) tests the dtype.
class _TypedTensorMeta(type):
    """Calling the class makes a Tensor of its dtype; ``isinstance`` checks a Tensor's dtype."""

    dtype: Any

    def __call__(cls, *args: Any, device: Any = None) -> Any:
        if not args:
            return zeros(0, dtype=cls.dtype, device=device)
        if all(isinstance(a, int) and not isinstance(a, bool) for a in args) or (
                len(args) == 1 and isinstance(args[0], Size)):
            return zeros(*args, dtype=cls.dtype, device=device)
        if len(args) != 1:
            raise TypeError(f"{cls.__name__}(): expected sizes or one sequence of data, got {args!r}")
        return tensor(args[0], dtype=cls.dtype, device=device)

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, Tensor) and obj.dtype == cls.dtype


def _typed(name: str) -> type:
    dtype = dtype_of_type_name(name)
    return _TypedTensorMeta(name, (), {"dtype": dtype, "__doc__": f"Legacy constructor of {dtype} tensors."})


(FloatTensor, DoubleTensor, HalfTensor, LongTensor, IntTensor, ShortTensor, CharTensor, ByteTensor,
 BoolTensor) = map(_typed, ["FloatTensor", "DoubleTensor", "HalfTensor", "LongTensor", "IntTensor", "ShortTensor",
                           "CharTensor", "ByteTensor", "BoolTensor"])
