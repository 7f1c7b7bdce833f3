"""Memory: measure it (``track``, ``summary``) and trade compute for it (``checkpoint``, and ``plan``
to a budget), chapter 03."""

from minigrad.memory.tracker import LiveTensor, MemoryTracker, snapshot, summary, track
from minigrad.memory.checkpoint import CheckpointFunction, checkpoint, checkpoint_sequential
from minigrad.memory import planner
from minigrad.memory.planner import LayerCost, Plan, plan

__all__ = [
    "CheckpointFunction", "LayerCost", "LiveTensor", "MemoryTracker", "Plan", "checkpoint", "checkpoint_sequential",
    "plan", "planner", "snapshot", "summary", "track",
]
