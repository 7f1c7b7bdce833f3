"""``minigrad.accelerator``: is there an accelerator, and which, as ``torch.accelerator``.

minigrad's only accelerator is an NVIDIA GPU through cupy (``minigrad.cuda``), so this answers
with ``cuda`` when cupy sees a GPU and with nothing otherwise (chapter 03 moves work to the GPU).
"""

from __future__ import annotations

from minigrad.backend import cuda
from minigrad.backend import Device

__all__ = ["current_accelerator", "device_count", "is_available"]


is_available = cuda.is_available


def current_accelerator(check_available: bool = False) -> Device | None:
    """``device('cuda')`` when a GPU is usable, else None (torch also gives None without one)."""
    return Device("cuda") if cuda.is_available() else None


device_count = cuda.device_count  # 0 without cupy or a GPU
