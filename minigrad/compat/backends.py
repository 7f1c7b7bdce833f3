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

from minigrad.ops import conv_algorithms

__all__ = ["autotune", "cuda", "cudnn", "mps"]


def _switch(name: str) -> property:
    """A module attribute that reads and sets conv2d's autotuning switch ``name``, which lives with
    the op (``minigrad.ops.conv_algorithms``), below this layer of torch's names."""
    return property(lambda self: conv_algorithms.autotune_switch(name),
                    lambda self, on: conv_algorithms.set_autotune(on, name))


class _Backends(types.ModuleType):
    autotune = _switch("autotune")  # conv2d: pick the fastest algorithm per shape, timed on first use


class _Cudnn(types.ModuleType):
    benchmark = _switch("cudnn.benchmark")  # torch's spelling of the same switch


sys.modules[__name__].__class__ = _Backends


def _module(name: str, doc: str, kind: type = types.ModuleType, **attrs: object) -> types.ModuleType:
    mod = kind(f"minigrad.backends.{name}", doc)  # the public path, as torch.backends.cudnn
    mod.__dict__.update(attrs)
    sys.modules[mod.__name__] = mod
    return mod


cuda = _module("cuda", "CUDA math settings: kept, without effect (cupy has no TF32 switch).",
               matmul=types.SimpleNamespace(allow_tf32=False, allow_fp16_reduced_precision_reduction=True,
                                            allow_bf16_reduced_precision_reduction=True),
               is_built=lambda: False)
cudnn = _module("cudnn", "cuDNN settings: kept; benchmark=True turns on conv2d autotuning as backends.autotune does, "
                         "the others are without effect (minigrad does not use cuDNN).",
                _Cudnn, enabled=True, deterministic=False, allow_tf32=True,
                is_available=lambda: False, version=lambda: None)
mps = _module("mps", "Apple's Metal backend: not in minigrad.", is_available=lambda: False, is_built=lambda: False)
