"""The C library's allocator, told to keep the memory a training step frees (chapter 03, memory).

numpy takes every array from ``malloc``. glibc serves a request of more than 128 KiB with a fresh
``mmap`` at first, and returns free memory above 128 KiB at the top of its heap to the system
(both thresholds move with the sizes it has seen). A training step allocates and frees the same
large arrays every step (a word model's (320, 2000) logits, their log-softmax, its gradient:
2.5 MB each), so those arrays often come back as fresh pages, which the kernel zero-fills on first
touch: on the word LM of ``benchmarks/bench_models.py`` run alone, its log-softmax took 4.2 ms
instead of 1.6 ms and the step 16 ms instead of 12. PyTorch has the same allocator, but far fewer
temporaries per op. ``keep_freed_memory`` raises both thresholds once, when minigrad is imported
(``mallopt``: arrays up to 32 MiB come from the heap, and up to 64 MiB of free heap is kept for the
next step), the same fix as ``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_`` in the
environment. ``MINIGRAD_MALLOC=system`` leaves the allocator as it was; other C libraries than
glibc are left alone.
"""

from __future__ import annotations

import ctypes
import os

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "keep_freed_memory"]

MMAP_THRESHOLD = 32 << 20  # glibc's largest (HEAP_MAX_SIZE / 2 on 64-bit): above it, mmap still
TRIM_THRESHOLD = 64 << 20  # free memory kept at the top of the heap before any goes back
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)
applied = False  # whether keep_freed_memory changed the allocator in this process


def _glibc() -> bool:
    try:
        return (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
    except (ValueError, OSError, AttributeError):  # not a glibc system (macOS, Windows, musl)
        return False


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds (``mallopt``) unless ``MINIGRAD_MALLOC=system`` or
    the C library is not glibc; True when both were set."""
    global applied
    if applied or os.environ.get("MINIGRAD_MALLOC") == "system" or not _glibc():
        return applied
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    # mmap first: it turns off glibc's moving thresholds, then the trim threshold is set to stay
    applied = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return applied
