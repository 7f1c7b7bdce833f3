"""PyTorch's module paths for minigrad's code: the aliases, the adapters and the names torch has.

A program written for torch imports ``torch.cuda``, ``torch.utils.data`` or ``torch.onnx``; minigrad
keeps the code where the chapters teach it (``minigrad/backend/cuda.py``, ``minigrad/data/``,
``minigrad/graph/onnx_export.py``) and answers torch's paths here, in one place: ``ALIASES`` maps
each public path to the module that holds it (``torch_paths``'s finder imports it under both names),
the small adapters that give torch's signatures live beside it (``cuda_amp``, ``accelerator``,
``backends``, ``onnx``, ``utils``, ``utils_data``, ``tensorboard``), and ``torch_modules`` and
``unsupported`` list every public torch path and the features minigrad does not follow.
``torch_modules`` and ``unsupported`` import nothing from minigrad, so every package's module
``__getattr__`` may read them; the rest of this package sits above everything it names.
"""

# Public path (what a torch program imports, with torch spelled minigrad) -> the module that answers it.
ALIASES: dict[str, str] = {
    "minigrad.cuda": "minigrad.backend.cuda",
    "minigrad.cuda.amp": "minigrad.compat.cuda_amp",
    "minigrad.accelerator": "minigrad.compat.accelerator",
    "minigrad.backends": "minigrad.compat.backends",
    "minigrad.onnx": "minigrad.compat.onnx",
    "minigrad.utils": "minigrad.compat.utils",
    "minigrad.utils.data": "minigrad.compat.utils_data",
    "minigrad.utils.checkpoint": "minigrad.memory.checkpoint",
    "minigrad.utils.tensorboard": "minigrad.compat.tensorboard",
}
