"""``minigrad.cuda``: is there a GPU, how many, wait for it, how much memory it holds (chapter 03).

The names follow ``torch.cuda``. A GPU is reached through CuPy, which is imported only when one of
these functions asks for it, so ``import minigrad`` never needs cupy. Memory is CuPy's default
memory pool: ``memory_allocated`` is what the pool has handed out and not taken back. CuPy keeps
no high-water mark, so minigrad wraps the pool's allocator and notes the most in use after each
allocation (memory only grows at an allocation: ``backend.watch_memory_pool``, installed when the
first cuda device is made); the memory tracker reads the same figures.
"""

from __future__ import annotations

import importlib
from typing import Any

from minigrad import backend
from minigrad.backend import Device, PeakAllocator, watch_memory_pool
from minigrad.errors import DeviceError
from minigrad.backend.value_checks import raise_pending
from minigrad.backend.allocator import format_summary
from minigrad.compat.unsupported import module_getattr as _module_getattr

__all__ = [
    "current_device", "device_count", "empty_cache", "is_available", "manual_seed", "manual_seed_all",
    "amp", "is_bf16_supported", "max_memory_allocated", "memory_allocated", "memory_stats", "memory_summary",
    "reset_peak_memory_stats", "synchronize",
]


def _cupy() -> Any:
    """cupy, when it is installed and sees a GPU; None otherwise."""
    try:
        cupy = importlib.import_module("cupy")
        return cupy if cupy.cuda.runtime.getDeviceCount() > 0 else None
    except Exception:  # ImportError, or the CUDA runtime's own error when there is no driver or GPU
        return None


def is_available() -> bool:
    """Whether ``device="cuda"`` can be used: cupy is installed and sees at least one GPU."""
    return _cupy() is not None


def device_count() -> int:
    """The number of GPUs cupy sees (0 without cupy or without a GPU)."""
    cupy = _cupy()
    return cupy.cuda.runtime.getDeviceCount() if cupy is not None else 0


def _device(device: int | str | Device | None) -> Device:
    """The cuda Device meant by ``device`` (None: the current GPU); raises backend's DeviceError,
    which says what is missing, when there is no usable GPU."""
    if device is None:
        device = f"cuda:{Device('cuda').xp.cuda.runtime.getDevice()}"
    elif isinstance(device, int):
        device = f"cuda:{device}"
    dev = Device(device)
    if dev.type != "cuda":
        raise DeviceError(f"minigrad.cuda: expected a cuda device, got {dev}")
    return dev


def current_device() -> int:
    """The index of the GPU that cupy allocates on now."""
    return _device(None).index


def synchronize(device: int | str | Device | None = None) -> None:
    """Wait until every kernel queued on the GPU has finished (timings need this: launches return
    before the work is done)."""
    dev = _device(device)
    dev.xp.cuda.Device(dev.index).synchronize()
    raise_pending()  # what failed on the GPU is known now: say so, as CUDA reports a device-side assert


# -- memory ----------------------------------------------------------------------------------------
def _pool(device: int | str | Device | None) -> tuple[PeakAllocator, int]:
    dev = _device(device)
    return watch_memory_pool(dev.xp), dev.index


def memory_allocated(device: int | str | Device | None = None) -> int:
    """Bytes of GPU memory in use by arrays (CuPy's pool: handed out and not yet freed)."""
    allocator, index = _pool(device)
    return allocator.used(index)


def max_memory_allocated(device: int | str | Device | None = None) -> int:
    """The most bytes in use at once since the first cuda tensor or ``reset_peak_memory_stats``."""
    allocator, index = _pool(device)
    return max(allocator.peak.get(index, 0), allocator.used(index))


def reset_peak_memory_stats(device: int | str | Device | None = None) -> None:
    """Start measuring ``max_memory_allocated`` again from what is in use now."""
    allocator, index = _pool(device)
    allocator.peak[index] = allocator.used(index)


def memory_stats(device: int | str | Device | None = None) -> dict[str, int]:
    """CuPy's pool in ``torch.cuda.memory_stats``'s names (CuPy is a caching allocator of the
    same design as minigrad's CPU pool, ``minigrad.backend.allocator``; it reports no block layout)."""
    allocator, index = _pool(device)
    with allocator.cupy.cuda.Device(index):  # the pool answers for the current GPU
        pool = allocator.pool
        return {
            "allocated_bytes.all.current": pool.used_bytes(),
            "allocated_bytes.all.peak": max_memory_allocated(index),
            "reserved_bytes.all.current": pool.total_bytes(),
            "cached_bytes": pool.free_bytes(),
            "cached_blocks": pool.n_free_blocks(),
        }


def memory_summary(device: int | str | Device | None = None) -> str:
    """``memory_stats`` as a short table, as ``torch.cuda.memory_summary``."""
    return format_summary(str(_device(device)), memory_stats(device))


def empty_cache() -> None:
    """Give the pool's free blocks back to the GPU (``memory_allocated`` does not change; what
    other processes and ``nvidia-smi`` see does)."""
    allocator, _ = _pool(None)
    allocator.pool.free_all_blocks()


# -- random numbers --------------------------------------------------------------------------------
def manual_seed(seed: int) -> None:
    """Seed the current GPU's generator. Silently does nothing without a GPU, as in torch, so a
    script may seed the GPU unconditionally."""
    if is_available():
        backend.seed_device(_device(None), seed)


def manual_seed_all(seed: int) -> None:
    """Seed every GPU's generator (does nothing without a GPU, as in torch)."""
    for index in range(device_count()):
        backend.seed_device(Device(f"cuda:{index}"), seed)


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """False: numpy and cupy have no native bfloat16, so minigrad never computes in it."""
    return False


# Imported as minigrad.cuda (minigrad.compat.ALIASES), whose torch submodules (minigrad.cuda.amp, the
# old spelling of mixed precision) the module __getattr__ imports on first use.
__getattr__ = _module_getattr("minigrad.cuda")  # a PyTorch feature minigrad does not follow raises NotImplementedError
