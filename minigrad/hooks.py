"""``RemovableHandle``: what registering a hook returns, so the hook can be removed again."""

from __future__ import annotations

from typing import Any


class RemovableHandle:
    """``handle.remove()`` takes the hook out of the list it was added to (at most once)."""

    def __init__(self, hooks: list, hook: Any) -> None:
        self._hooks, self._hook = hooks, hook

    def remove(self) -> None:
        if self._hook is not None and self._hook in self._hooks:
            self._hooks.remove(self._hook)
        self._hook = None

    def __enter__(self) -> RemovableHandle:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()
