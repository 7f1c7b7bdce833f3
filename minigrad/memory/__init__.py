"""Memory: measure it (``track``, ``summary``) and trade compute for it (``checkpoint``), chapter 03."""

from minigrad.memory.tracker import LiveTensor, MemoryTracker, snapshot, summary, track
from minigrad.memory.checkpoint import CheckpointFunction, checkpoint, checkpoint_sequential

__all__ = [
    "CheckpointFunction", "LiveTensor", "MemoryTracker", "checkpoint", "checkpoint_sequential", "snapshot",
    "summary", "track",
]
