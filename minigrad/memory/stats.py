"""``memory_stats``, ``memory_summary`` and ``empty_cache`` for either device, as ``minigrad.*``
(chapter 03): minigrad's caching allocator on the cpu (``minigrad.backend.allocator``), CuPy's pool on cuda
(``minigrad.cuda``). torch has these under ``torch.cuda`` only; minigrad has both there too.
"""

from __future__ import annotations

from typing import Any

from minigrad.backend import cuda
from minigrad.backend import Device
from minigrad.backend.allocator import cpu_allocator, format_summary


def _device(device: Any) -> Device:
    return Device("cpu" if device is None else device)


def memory_stats(device: Any = None) -> dict[str, int | float]:
    """The caching allocator's figures for ``device`` (default: cpu)."""
    dev = _device(device)
    return cuda.memory_stats(dev) if dev.type == "cuda" else cpu_allocator.memory_stats()


def memory_summary(device: Any = None) -> str:
    """``memory_stats(device)`` as a short table."""
    return format_summary(str(_device(device)), memory_stats(device))


def empty_cache(device: Any = None) -> None:
    """Give the cached, unused blocks of ``device``'s pool (default: cpu) back to the system."""
    if _device(device).type == "cuda":
        cuda.empty_cache()
    else:
        cpu_allocator.empty_cache()
