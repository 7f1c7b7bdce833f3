"""``RemovableHandle``: what registering a hook returns, so the hook can be removed again.

Hooks live in ordered dicts keyed by the handle's id (as in PyTorch), for tensors, graph nodes
and modules alike.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable


class RemovableHandle:
    """``handle.remove()`` (or leaving a ``with`` block) takes the hook out of its dict."""

    _next_id = itertools.count()

    def __init__(self, hooks: dict) -> None:
        self._hooks, self.id = hooks, next(RemovableHandle._next_id)

    def remove(self) -> None:
        self._hooks.pop(self.id, None)

    def __enter__(self) -> RemovableHandle:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


def add_hook(hooks: dict, hook: Callable, prepend: bool = False) -> RemovableHandle:
    """Register ``hook`` in ``hooks`` (first when ``prepend``) and return its handle."""
    handle = RemovableHandle(hooks)
    hooks[handle.id] = hook
    if prepend:
        hooks.move_to_end(handle.id, last=False)
    return handle
