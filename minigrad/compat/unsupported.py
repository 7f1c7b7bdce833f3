"""The PyTorch features minigrad does not follow, and the error that says so.

A program written for torch that reaches for ``torch.jit`` or ``torch.distributed.rpc`` should
learn at once that minigrad has no such feature and why, not meet an ``AttributeError`` from deep
inside. The packages that torch programs reach into (``minigrad``, ``minigrad.cuda``,
``minigrad.distributed``, ``minigrad.nn``, ``minigrad.utils``) end with the module ``__getattr__``
that ``module_getattr`` makes, which asks ``missing`` here; ``docs/pytorch_compat.md`` lists the same features.
A key that is a module path of torch (``minigrad.jit``) imports as a stand-in module
(``minigrad.compat.torch_paths``) whose every name raises the error with this reason.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["MISSING", "missing", "module_getattr"]

_C_EXT = "it needs PyTorch's C++/CUDA runtime, and minigrad is numpy and cupy only"

MISSING: dict[str, str] = {
    "minigrad.jit": "TorchScript compiles models for PyTorch's C++ runtime; minigrad.compile traces and "
                    "optimises a function instead",
    "minigrad.fx": "minigrad's tracer is minigrad.graph.trace (a Graph of Nodes), not torch.fx",
    "minigrad.ao": "torch.ao.quantization's eager-mode API is minigrad.quantization (prepare, convert, "
                   "quantize_dynamic); there is no pruning or sparsity toolkit",
    "minigrad.hub": "minigrad never downloads models or code",
    "minigrad.export": "torch.export produces graphs for PyTorch's runtimes; " + _C_EXT,
    "minigrad.library": "custom-op registration targets PyTorch's dispatcher; " + _C_EXT,
    "minigrad.mps": "Apple's Metal backend is not a minigrad device (cpu and cuda only)",
    "minigrad.xpu": "Intel GPUs are not a minigrad device (cpu and cuda only)",
    "minigrad.fft": "minigrad has no FFT ops",
    "minigrad.nested": "minigrad has no nested (ragged) tensors",
    "minigrad.cuda.graphs": "CUDA graph capture is not exposed; minigrad.compile fuses kernels instead",
    "minigrad.cuda.CUDAGraph": "CUDA graph capture is not exposed; minigrad.compile fuses kernels instead",
    "minigrad.cuda.nvtx": "NVTX ranges are not emitted; use minigrad.profiler.profile",
    "minigrad.distributed.rpc": "minigrad's distributed package has collectives (MPI, NCCL), not remote calls",
    "minigrad.distributed.fsdp": "minigrad shards by pipeline and tensor parallelism, not FSDP",
    "minigrad.distributed.elastic": "minigrad runs a fixed set of MPI processes; there is no elastic launcher",
    "minigrad.nn.DataParallel": "minigrad runs one process per device; use "
                                "minigrad.distributed.DistributedDataParallel",
    "minigrad.nn.parallel.DataParallel": "minigrad runs one process per device; use "
                                         "minigrad.nn.parallel.DistributedDataParallel",
    "minigrad.utils.cpp_extension": "C++/CUDA extensions build against PyTorch's C++ API; " + _C_EXT,
}


def missing(module: str, name: str) -> Exception:
    """The error for ``module.name`` not found: NotImplementedError naming a feature minigrad
    does not implement, else the usual AttributeError with a pointer to the compatibility table."""
    key = f"{module}.{name}"
    if key in MISSING:
        torch_name = "torch" + key[len("minigrad"):]
        return NotImplementedError(f"minigrad does not implement {torch_name}: {MISSING[key]} "
                                   f"(see docs/pytorch_compat.md)")
    return AttributeError(f"module {module!r} has no attribute {name!r} "
                          f"(docs/pytorch_compat.md lists the PyTorch API minigrad follows)")


def module_getattr(module: str) -> Callable[[str], Any]:
    """The ``__getattr__`` of package ``module``: a submodule torch has is imported (as torch
    imports its own, ``minigrad.nn.modules`` works without an import statement); any other name it
    lacks raises ``missing``'s error."""

    def __getattr__(name: str) -> Any:
        from minigrad.compat.torch_modules import MODULES

        if f"{module}.{name}" in MODULES:
            import importlib

            return importlib.import_module(f"{module}.{name}")
        raise missing(module, name)

    return __getattr__
