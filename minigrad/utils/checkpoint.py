"""``minigrad.utils.checkpoint``: ``torch.utils.checkpoint``'s names for ``minigrad.memory``'s
gradient checkpointing (chapter 03)."""

from minigrad.memory.checkpoint import checkpoint, checkpoint_sequential

__all__ = ["checkpoint", "checkpoint_sequential"]
