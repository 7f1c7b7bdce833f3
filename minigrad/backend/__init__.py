"""Devices, array modules, dtypes and random numbers: the one place that knows about numpy and cupy.

A tensor's data is an array of its device's *array module* (``xp``): numpy on ``cpu``, cupy on
``cuda``. Ops ask for ``xp`` here instead of importing numpy, so the CPU and GPU paths are the same
lines of code (chapter 03 shows the GPU side). This module also fixes the dtype policy (float32 by
default, PyTorch's promotion rules), the default device of new tensors, and one seeded random
generator per device; the few calls where numpy and cupy differ (scatter-add, random
permutations, generator states) are written once here.
"""

from __future__ import annotations

import contextlib
import importlib
import secrets
from typing import Any, Callable

import numpy

from minigrad.errors import DeviceError, DTypeError
from minigrad.backend.value_checks import raise_pending
from minigrad.backend.host_malloc import keep_freed_memory

keep_freed_memory()  # numpy's large temporaries reuse freed pages instead of faulting in fresh ones each step

# ---------------------------------------------------------------------------------------------
# dtypes: minigrad uses numpy dtype objects directly, under torch's names.
float16 = numpy.dtype("float16")
float32 = numpy.dtype("float32")
float64 = numpy.dtype("float64")
int8 = numpy.dtype("int8")
uint8 = numpy.dtype("uint8")
int16 = numpy.dtype("int16")
int32 = numpy.dtype("int32")
int64 = numpy.dtype("int64")
bool_ = numpy.dtype("bool")

DTYPES = {d.name: d for d in (float16, float32, float64, int8, uint8, int16, int32, int64, bool_)}
_SUPPORTED = frozenset(DTYPES.values())
_default_dtype = float32


def get_default_dtype() -> numpy.dtype:
    """The floating dtype that new tensors get from Python floats (float32 unless changed)."""
    return _default_dtype


def set_default_dtype(dtype: Any) -> None:
    """Change the default floating dtype (float32 or float64), as ``torch.set_default_dtype``."""
    global _default_dtype
    d = as_dtype(dtype)
    if d.kind != "f":
        raise DTypeError(f"set_default_dtype: expected a floating dtype, got {d}")
    _default_dtype = d


class UnsupportedDType:
    """A PyTorch dtype name that minigrad knows but cannot compute in: it exists, so code that only
    names it (a table of dtypes, ``x.dtype == minigrad.bfloat16``) runs, and any use raises a
    DTypeError that says why."""

    def __init__(self, name: str, reason: str) -> None:
        self.name, self.reason = name, reason

    def __repr__(self) -> str:
        return f"minigrad.{self.name}"


bfloat16 = UnsupportedDType("bfloat16", "numpy has no native bfloat16, so minigrad cannot compute in it; "
                                        "use float16 (minigrad.autocast's dtype) or float32")
_UNSUPPORTED = {"bfloat16": bfloat16}


def as_dtype(dtype: Any) -> numpy.dtype:
    """Turn ``"float32"``, ``minigrad.float32``, ``numpy.float32`` or a torch-style alias into a dtype."""
    if isinstance(dtype, numpy.dtype):
        d = dtype
    elif isinstance(dtype, UnsupportedDType) or (isinstance(dtype, str) and dtype in _UNSUPPORTED):
        unsupported = _UNSUPPORTED.get(dtype, dtype) if isinstance(dtype, str) else dtype
        raise DTypeError(f"dtype {unsupported.name} is not supported: {unsupported.reason}")
    else:
        try:
            d = numpy.dtype(dtype)
        except TypeError:
            raise DTypeError(f"unknown dtype {dtype!r}; expected one of {sorted(DTYPES)}") from None
    if d not in _SUPPORTED and d.name not in DTYPES:  # (a set lookup first: dtype.name is slow Python)
        raise DTypeError(f"dtype {d} is not supported; expected one of {sorted(DTYPES)}")
    return d


def is_floating(dtype: numpy.dtype) -> bool:
    return dtype.kind == "f"


_KIND_RANK = {"b": 0, "u": 1, "i": 1, "f": 2}


def result_type(a: numpy.dtype, b: numpy.dtype, a_is_scalar: bool, b_is_scalar: bool) -> numpy.dtype:
    """PyTorch's promotion for two tensors: a 0-D tensor only decides the dtype when it is of a
    higher category (bool < integer < float) than the other operand; int + float gives the float's
    dtype (numpy would widen int32 + float32 to float64)."""
    ka, kb = _KIND_RANK[a.kind], _KIND_RANK[b.kind]
    if ka != kb:
        return a if ka > kb else b
    if a_is_scalar != b_is_scalar:
        return b if a_is_scalar else a
    return numpy.promote_types(a, b)


# ---------------------------------------------------------------------------------------------
# devices
class Device:
    """Where a tensor lives: ``Device("cpu")`` or ``Device("cuda:0")``. Devices are interned, so
    ``a.device is b.device`` is the fast same-device test the ops use."""

    __slots__ = ("type", "index", "xp", "_rng")
    _cache: dict[str, Device] = {}

    def __new__(cls, spec: str | Device = "cpu") -> Device:
        if isinstance(spec, Device):
            return spec
        key = str(spec)
        dev = cls._cache.get(key)
        if dev is not None:
            return dev
        kind, _, index = key.partition(":")
        if kind not in ("cpu", "cuda", "meta") or (index and not index.isdigit()) or (kind == "meta" and index):
            raise DeviceError(f"unknown device {spec!r}; expected 'cpu', 'cuda', 'cuda:N' or 'meta'")
        if kind == "cuda" and not index:
            dev = cls("cuda:0")
            cls._cache[key] = dev
            return dev
        dev = object.__new__(cls)
        dev.type, dev.index = kind, (int(index) if index else None)
        dev.xp = _array_module(dev)
        dev._rng = None
        cls._cache[key] = dev
        return dev

    def __repr__(self) -> str:
        return f"device(type='{self.type}'" + (f", index={self.index})" if self.index is not None else ")")

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            try:
                other = Device(other)
            except DeviceError:
                return False
        return self is other

    def __hash__(self) -> int:
        return hash(str(self))

    def __reduce__(self):
        return (Device, (str(self),))

    @property
    def rng(self):
        """This device's random generator (``numpy.random.Generator`` or cupy's), seeded by ``manual_seed``."""
        if self._rng is None:
            with selected(self):  # cupy keeps the generator's state on the current GPU
                self._rng = self.xp.random.default_rng(_seed)
        return self._rng

    def __enter__(self) -> Device:
        """``with minigrad.device("cuda:1"):`` makes this the default device of new tensors, as
        ``with torch.device(...)`` does, and on a GPU also the one cupy allocates on."""
        global _default_device
        gpu = self.xp.cuda.Device(self.index) if self.type == "cuda" else None
        if gpu is not None:
            gpu.__enter__()
        _entered.append((_default_device, gpu))
        _default_device = self
        return self

    def __exit__(self, *exc: Any) -> None:
        global _default_device
        _default_device, gpu = _entered.pop()
        if gpu is not None:
            gpu.__exit__(*exc)


def _array_module(dev: Device):
    if dev.type == "cpu":
        return numpy
    if dev.type == "meta":  # shapes and dtypes only (minigrad.backend.meta, chapter 01)
        return importlib.import_module("minigrad.backend.meta").xp
    try:
        cupy = importlib.import_module("cupy")
    except ImportError:
        raise DeviceError(
            f"device {dev} needs cupy, which is not installed; install the 'cuda' extra "
            "(pip install 'minigrad[cuda]') on a machine with an NVIDIA GPU"
        ) from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # the CUDA runtime raises its own error types when there is no driver
        raise DeviceError(f"device {dev}: cupy is installed but no CUDA GPU is usable ({e})") from None
    if dev.index >= count:
        raise DeviceError(f"device {dev}: only {count} CUDA device(s) present")
    watch_memory_pool(cupy)  # max_memory_allocated counts from the first cuda tensor on
    return cupy


class PeakAllocator:
    """The default pool's ``malloc`` with a high-water mark per GPU, and callbacks for trackers."""

    def __init__(self, cupy: Any) -> None:
        self.cupy, self.pool = cupy, cupy.get_default_memory_pool()
        self.peak: dict[int, int] = {}  # GPU index -> most bytes in use at once
        self.watchers: list[Callable[[int, int], None]] = []  # watcher(gpu index, bytes in use)

    def __call__(self, nbytes: int) -> Any:
        memory = self.pool.malloc(nbytes)
        index, used = memory.device_id, self.pool.used_bytes()  # malloc ran on the current GPU
        if used > self.peak.get(index, 0):
            self.peak[index] = used
        for watch in self.watchers:
            watch(index, used)
        return memory

    def used(self, index: int) -> int:
        with self.cupy.cuda.Device(index):  # the pool answers for the current GPU
            return self.pool.used_bytes()


_allocator: PeakAllocator | None = None


def watch_memory_pool(cupy: Any) -> PeakAllocator:
    """Route cupy's allocations through the peak-keeping allocator (once; the backend calls this
    when the first cuda device is made). An allocator the user set is left in place; peaks are
    then not recorded. Returns the peak-keeping allocator."""
    global _allocator
    if _allocator is None or _allocator.cupy is not cupy:
        _allocator = PeakAllocator(cupy)
        if cupy.cuda.get_allocator() == _allocator.pool.malloc:
            cupy.cuda.set_allocator(_allocator)
    return _allocator


cpu = Device("cpu")
_default_device = cpu
_entered: list[tuple[Device, Any]] = []  # what each active `with device:` block replaced


def get_default_device() -> Device:
    """The device new tensors go to when no ``device=`` is given (``cpu`` unless changed)."""
    return _default_device


def set_default_device(device: str | Device | None) -> None:
    """Make creation functions and ``tensor()`` put new tensors on ``device`` by default, as
    ``torch.set_default_device`` (``None`` means cpu again). Raises DeviceError for a device
    that is not usable here, such as ``"cuda"`` without cupy or without a GPU."""
    global _default_device
    _default_device = cpu if device is None else Device(device)


def resolve_device(device: str | Device | None) -> Device:
    """The Device a ``device=`` argument names, or the default device when it is None."""
    return _default_device if device is None else Device(device)


def selected(dev: Device) -> Any:
    """A context in which cupy allocates on ``dev``'s GPU (cupy uses the current GPU; nothing to
    select on the cpu)."""
    return dev.xp.cuda.Device(dev.index) if dev.type == "cuda" else contextlib.nullcontext()


def device(spec: str | Device = "cpu") -> Device:
    """``minigrad.device("cuda")``: the interned Device for a spec string."""
    return Device(spec)


def device_of(array: Any) -> Device:
    """The device an array lives on: a cupy array's ``device`` is its GPU; a numpy array's is the
    string ``"cpu"`` (a meta array's ``"meta"``), and scalars and lists have none."""
    gpu = getattr(array, "device", "cpu")
    if isinstance(gpu, str):
        return cpu if gpu == "cpu" else Device(gpu)
    return Device(f"cuda:{gpu.id}")


def storage_of(array: Any) -> Any:
    """The array that owns ``array``'s memory, whose bytes a view's belong to: follow ``.base`` from
    view to view while it is an array of the same array module (numpy's subclasses, such as
    ``memmap``, included). The owner's own base is ``None`` or the buffer it was made over (a pool
    block's memoryview, a mapped file), not an array. numpy's ``as_strided`` (conv's windows) puts
    a small wrapper between a view and its base, which is stepped over."""
    kind = device_of(array).xp.ndarray
    while True:
        base = getattr(array, "base", None)
        if not isinstance(base, kind):
            base = getattr(base, "base", None)
            if not isinstance(base, kind):
                return array
        array = base


def to_device(array: Any, dev: Device) -> Any:
    """Copy an array to ``dev`` (no copy when it is already there). Going to ``meta`` keeps the
    shape and dtype only; a meta array has nothing to copy anywhere else."""
    source = device_of(array)
    if source is dev:
        return array
    if dev.type == "meta":
        return dev.xp.empty(numpy.shape(array), array.dtype)
    if source.type == "meta":
        array.get()  # raises: a meta tensor has no data to copy
    if dev.type == "cpu":
        raise_pending()  # the host waits for the GPU here: the checks queued on it are read too
        return array.get()
    with selected(dev):
        return dev.xp.array(array)  # copies from the host or from another GPU


def add_at(xp: Any, out: Any, index: Any, values: Any) -> None:
    """``out[index] += values``, adding once per occurrence of a repeated index (a scatter-add;
    plain ``out[index] += values`` keeps only the last write). numpy spells it ``add.at``; cupy's
    ``add.at`` is ``cupyx.scatter_add``, built on CUDA's atomicAdd, which has no int64 kernel: an
    int64 array is added as uint64, the very same bits in two's complement."""
    if xp is not numpy and out.dtype == int64:
        out, values = out.view(numpy.uint64), xp.asarray(values, dtype=int64).view(numpy.uint64)
    if xp is numpy and _add_rows_at(out, index, values):
        return
    xp.add.at(out, index, values)


def _add_rows_at(out: Any, index: Any, values: Any) -> bool:
    """``numpy.add.at`` for whole rows picked by one integer array (an embedding's backward), or
    False when the call is not of that form. ``add.at`` goes row by row at about 0.7 us a row;
    here each row's first occurrence is added in one fancy-indexed ``+=`` (no row twice in it),
    and only the repeats go through ``add.at``, in their order: the same sums in the same order,
    so the same bits, at a third of the time for an LM's batch of words."""
    if type(index) is tuple:  # (rows,) or (rows, ...): indexing's normal form
        index = index[0] if len(index) == 1 or (len(index) == 2 and index[1] is Ellipsis) else None
    rows = index
    if (type(rows) is not numpy.ndarray or rows.dtype.kind not in "iu" or out.ndim < 2 or rows.size < 2
            or out.dtype.kind != "f" or getattr(values, "dtype", None) != out.dtype
            or values.shape != rows.shape + out.shape[1:] or rows.min() < 0):  # -1 and n-1: one row, two keys
        return False
    rows, values = rows.reshape(-1), values.reshape((rows.size,) + out.shape[1:])  # (-1: ambiguous for 0-wide rows)
    unique, first = numpy.unique(rows, return_index=True)
    out[unique] += values[first]
    if len(unique) < len(rows):
        repeats = numpy.ones(len(rows), bool)
        repeats[first] = False
        numpy.add.at(out, rows[repeats], values[repeats])
    return True


# ---------------------------------------------------------------------------------------------
# random numbers
_seed: int | None = None


def manual_seed(seed: int) -> None:
    """Seed every device's random generator, as ``torch.manual_seed``."""
    global _seed
    _seed = int(seed)
    for dev in Device._cache.values():
        dev._rng = None


def seed_device(dev: Device, seed: int) -> None:
    """Seed one device's generator only (``minigrad.cuda.manual_seed``)."""
    with selected(dev):
        dev._rng = dev.xp.random.default_rng(int(seed))


def permutation(dev: Device, n: int, rng: Any = None) -> Any:
    """A random permutation of ``range(n)`` from ``rng`` (default: the device's generator). cupy's
    Generator has no ``permutation``; sorting n uniform keys gives a uniformly random order too."""
    rng = dev.rng if rng is None else rng
    if dev.type == "cpu":
        return rng.permutation(n)
    return rng.random(n).argsort()


# A generator's state: numpy's bit generator gives it as a dict; cupy's cuRAND generator keeps
# one state per GPU thread in a device array (``bit_generator._state``), copied and written back.
def get_rng_state(dev: Device | str = "cpu") -> Any:
    """A copy of a device's generator state (used by checkpointing to replay dropout exactly)."""
    dev = Device(dev)
    return get_rng_state_of(dev.rng, dev)


def set_rng_state(state: Any, dev: Device | str = "cpu") -> None:
    dev = Device(dev)
    set_rng_state_of(dev.rng, dev, state)


def get_rng_state_of(rng: Any, dev: Device) -> Any:
    """A copy of the state of ``rng``, a generator of ``dev``'s array module."""
    if dev.type == "cpu":
        return rng.bit_generator.state
    with selected(dev):
        return rng.bit_generator._state.copy()


def set_rng_state_of(rng: Any, dev: Device, state: Any) -> None:
    if dev.type == "cpu":
        rng.bit_generator.state = state
    else:
        with selected(dev):
            rng.bit_generator._state[...] = state


# ---------------------------------------------------------------------------------------------
# a program's own random streams
DEFAULT_SEED = 67280421310721  # torch.Generator()'s initial seed


class Generator:
    """A random stream of its own on ``device``: ``Generator().manual_seed(0)``."""

    def __init__(self, device: str | Device = "cpu") -> None:
        self.device = Device(device)
        self.manual_seed(DEFAULT_SEED)

    def manual_seed(self, seed: int) -> Generator:
        """Restart the stream from ``seed``; returns the generator, as in torch."""
        self._seed = int(seed)
        with selected(self.device):
            self.rng = self.device.xp.random.default_rng(self._seed)
        return self

    def initial_seed(self) -> int:
        return self._seed

    def seed(self) -> int:
        """Reseed from fresh operating-system entropy; returns the new seed."""
        self.manual_seed(secrets.randbits(63))
        return self._seed

    def get_state(self) -> Any:
        return get_rng_state_of(self.rng, self.device)

    def set_state(self, state: Any) -> Generator:
        set_rng_state_of(self.rng, self.device, state)
        return self

    def __repr__(self) -> str:
        return f"<minigrad.Generator device={self.device} seed={self._seed}>"


def rng_of(device: Device, generator: Generator | None) -> Any:
    """The array module's generator to draw from: ``generator``'s, or else the device's global one."""
    if generator is None:
        return device.rng
    if not isinstance(generator, Generator):
        raise TypeError(f"generator: expected a minigrad.Generator, got {type(generator).__name__}")
    if generator.device is not device:
        raise DeviceError(f"generator is on {generator.device}, but the values are drawn on {device}")
    return generator.rng
