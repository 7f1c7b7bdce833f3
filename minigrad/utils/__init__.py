"""``minigrad.utils``: where PyTorch programs look for the data package and checkpointing.

``minigrad.utils.data`` is ``minigrad.data`` under torch's name (``torch.utils.data``), and
``minigrad.utils.checkpoint`` is ``minigrad.memory.checkpoint``'s public functions, so code written
for torch imports them unchanged. The code itself lives where the chapters teach it (chapter 01:
input pipelines; chapter 03: checkpointing).
"""

from minigrad.utils import checkpoint, data  # noqa: F401

__all__ = ["checkpoint", "data"]


def __getattr__(name: str):
    """A PyTorch feature minigrad does not follow raises NotImplementedError naming it."""
    from minigrad.unsupported import missing

    raise missing(__name__, name)
