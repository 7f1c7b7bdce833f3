"""``minigrad.cuda.amp``: PyTorch's older spelling of mixed precision, which much code still uses.

``torch.cuda.amp.GradScaler(init_scale, ...)`` and ``torch.cuda.amp.autocast(enabled, dtype)`` are
``torch.amp``'s classes with ``"cuda"`` filled in; so are these (chapter 03 teaches ``minigrad.amp``).
"""

from __future__ import annotations

from typing import Any

from minigrad import amp, backend

__all__ = ["GradScaler", "autocast"]


class GradScaler(amp.GradScaler):
    """``minigrad.amp.GradScaler("cuda", ...)`` with the old argument order (no device)."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True) -> None:
        super().__init__("cuda", init_scale, growth_factor, backoff_factor, growth_interval, enabled)


class autocast(amp.autocast):
    """``minigrad.amp.autocast("cuda", ...)`` with the old argument order."""

    def __init__(self, enabled: bool = True, dtype: Any = backend.float16, cache_enabled: bool = True) -> None:
        super().__init__("cuda", dtype, enabled, cache_enabled)
