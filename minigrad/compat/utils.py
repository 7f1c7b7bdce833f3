"""``minigrad.utils``: where PyTorch programs look for the data package, checkpointing and TensorBoard.

``minigrad.utils.data`` is ``minigrad.data`` under torch's name (``torch.utils.data``), and
``minigrad.utils.checkpoint`` is ``minigrad.memory.checkpoint``'s public functions, so code written
for torch imports them unchanged. The code itself lives where the chapters teach it (chapter 01:
input pipelines; chapter 03: checkpointing). ``minigrad.utils.tensorboard`` (chapter 03's debugging
lesson) is imported by name, as in torch, so its optional dependency loads only when used.
"""

from minigrad.compat.unsupported import module_getattr as _module_getattr
import importlib

from minigrad.compat import utils_data as data  # noqa: F401

checkpoint = importlib.import_module("minigrad.memory.checkpoint")  # the module: minigrad.memory binds the function

__all__ = ["checkpoint", "data", "tensorboard"]
_missing = _module_getattr("minigrad.utils")  # the public path (minigrad.compat.ALIASES)


def __getattr__(name: str):
    """``tensorboard`` on first use; a PyTorch feature minigrad does not follow raises
    NotImplementedError naming it."""
    if name == "tensorboard":
        import importlib

        return importlib.import_module("minigrad.utils.tensorboard")
    return _missing(name)
