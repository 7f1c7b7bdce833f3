"""``minigrad.backends``: PyTorch's switches for its math libraries, accepted and documented.

Training scripts set ``backends.cudnn.benchmark = True`` or ``backends.cuda.matmul.allow_tf32 =
True`` and ask ``backends.mps.is_available()``. minigrad computes with numpy on the CPU and with
cupy on a GPU, which has no TF32 to switch, so most of these are plain settings that keep the
values a program gives them and change nothing; the ``is_available`` questions answer for minigrad
(no MPS, no cuDNN). One does act: ``autotune = True``, or torch's ``cudnn.benchmark = True``, makes
conv2d time its algorithms per shape on first use and keep the fastest
(``minigrad.ops.conv_algorithms.autotune_cache()`` lists the choices). Submodules are registered
so ``import minigrad.backends.cudnn as cudnn`` works, as with torch (chapter 03 names the real
switches).
"""

from __future__ import annotations

import sys
import types

__all__ = ["autotune", "cuda", "cudnn", "mps"]

autotune = False  # conv2d: pick the fastest algorithm per shape, timed on first use


def _module(name: str, doc: str, **attrs: object) -> types.ModuleType:
    mod = types.ModuleType(f"{__name__}.{name}", doc)
    mod.__dict__.update(attrs)
    sys.modules[mod.__name__] = mod
    return mod


cuda = _module("cuda", "CUDA math settings: kept, without effect (cupy has no TF32 switch).",
               matmul=types.SimpleNamespace(allow_tf32=False, allow_fp16_reduced_precision_reduction=True,
                                            allow_bf16_reduced_precision_reduction=True),
               is_built=lambda: False)
cudnn = _module("cudnn", "cuDNN settings: kept; benchmark=True turns on conv2d autotuning as backends.autotune does, "
                         "the others are without effect (minigrad does not use cuDNN).",
                enabled=True, benchmark=False, deterministic=False, allow_tf32=True,
                is_available=lambda: False, version=lambda: None)
mps = _module("mps", "Apple's Metal backend: not in minigrad.", is_available=lambda: False, is_built=lambda: False)
