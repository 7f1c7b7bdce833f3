"""Containers: ``Sequential``, ``ModuleList`` and ``ModuleDict`` hold sub-modules (chapter 02).

A plain Python list of layers would hide them from ``parameters()`` and ``state_dict()``; these
containers register each entry as a sub-module, named by its position (``"0"``, ``"1"``) or key,
which is where state-dict keys such as ``0.weight`` come from.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Iterable, Iterator, Mapping

from minigrad.nn.module import Module

__all__ = ["ModuleDict", "ModuleList", "Sequential"]


class Sequential(Module):
    """Layers applied one after another: ``Sequential(Linear(2, 8), ReLU(), Linear(8, 1))``.

    Also accepts one ``OrderedDict`` of named layers.
    """

    runs_layers_in_order = True  # the memory planner may cut it into segments (minigrad.protocols.is_sequential)

    def __init__(self, *args: Module) -> None:
        super().__init__()
        if len(args) == 1 and isinstance(args[0], OrderedDict):
            for name, m in args[0].items():
                self.add_module(name, m)
        else:
            for i, m in enumerate(args):
                self.add_module(str(i), m)

    def forward(self, input: Any) -> Any:
        for m in self._modules.values():
            input = m(input)
        return input

    def _index(self, idx: int) -> str:
        n = len(self._modules)
        if not -n <= idx < n:
            raise IndexError(f"index {idx} is out of range for a {type(self).__name__} of length {n}")
        return list(self._modules)[idx % n]

    def __getitem__(self, idx: int | slice) -> Any:
        if isinstance(idx, slice):
            return type(self)(OrderedDict(list(self._modules.items())[idx]))
        return self._modules[self._index(idx)]

    def __setitem__(self, idx: int, module: Module) -> None:
        setattr(self, self._index(idx), module)

    def __delitem__(self, idx: int | slice) -> None:
        keys = list(self._modules)[idx] if isinstance(idx, slice) else [self._index(idx)]
        for k in keys:
            del self._modules[k]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def append(self, module: Module) -> Sequential:
        self.add_module(str(len(self)), module)
        return self


class ModuleList(Module):
    """A list of sub-modules, indexed like a list; the model's ``forward`` decides how to use them."""

    def __init__(self, modules: Iterable[Module] | None = None) -> None:
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def _index(self, idx: int) -> str:
        n = len(self._modules)
        if not -n <= idx < n:
            raise IndexError(f"index {idx} is out of range for a ModuleList of length {n}")
        return str(idx % n)

    def __getitem__(self, idx: int | slice) -> Any:
        if isinstance(idx, slice):
            return ModuleList(list(self._modules.values())[idx])
        return self._modules[self._index(idx)]

    def __setitem__(self, idx: int, module: Module) -> None:
        setattr(self, self._index(idx), module)

    def __delitem__(self, idx: int | slice) -> None:
        keys = list(self._modules)[idx] if isinstance(idx, slice) else [self._index(idx)]
        for k in keys:
            del self._modules[k]
        # renumber, so names stay 0..n-1 as in a list
        kept = list(self._modules.values())
        self._modules.clear()
        for i, m in enumerate(kept):
            self._modules[str(i)] = m

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def __iadd__(self, modules: Iterable[Module]) -> ModuleList:
        return self.extend(modules)

    def append(self, module: Module) -> ModuleList:
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules: Iterable[Module]) -> ModuleList:
        for m in modules:
            self.append(m)
        return self

    def insert(self, index: int, module: Module) -> None:
        kept = list(self._modules.values())
        kept.insert(index, module)
        self._modules.clear()
        for i, m in enumerate(kept):
            self.add_module(str(i), m)


class ModuleDict(Module):
    """A dict of sub-modules by name, in insertion order."""

    def __init__(self, modules: Mapping[str, Module] | Iterable[tuple[str, Module]] | None = None) -> None:
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key: str) -> Module:
        return self._modules[key]

    def __setitem__(self, key: str, module: Module) -> None:
        self.add_module(key, module)

    def __delitem__(self, key: str) -> None:
        del self._modules[key]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def __contains__(self, key: str) -> bool:
        return key in self._modules

    def keys(self):
        return self._modules.keys()

    def values(self):
        return self._modules.values()

    def items(self):
        return self._modules.items()

    def pop(self, key: str) -> Module:
        return self._modules.pop(key)

    def clear(self) -> None:
        self._modules.clear()

    def update(self, modules: Mapping[str, Module] | Iterable[tuple[str, Module]]) -> None:
        items = modules.items() if isinstance(modules, Mapping) else modules
        for key, m in items:
            self[key] = m
