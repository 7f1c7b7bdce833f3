"""Every public module path of PyTorch imports in minigrad, and a missing feature says so on use.

A program written for torch fails on its import line if ``import torch.utils.data.dataloader``
or ``from torch.nn.modules.conv import Conv2d`` names a module minigrad lacks, before any of its
code runs, and the error (``ModuleNotFoundError``) says nothing of why. ``torch_modules.txt``
lists torch's public modules (``tools/torch_modules.py`` generates it from the installed torch),
and the finder here, consulted first for exactly those names, makes each one importable:

- a module minigrad has (``minigrad.nn.functional``) is imported as usual, and made a package
  when torch's is one, so that ``minigrad.nn.utils.rnn`` can be imported below a single file;
- any other is a *stand-in*: a module whose names come from its *homes*, the minigrad modules that
  hold torch's same names (``minigrad.nn.conv`` and ``minigrad.nn`` for ``torch.nn.modules.conv``,
  ``minigrad.utils.data`` for ``torch.utils.data.dataloader``), and whose every other name raises
  ``NotImplementedError`` naming the feature and why (the reasons are ``unsupported.MISSING``'s).

So a program that imports what minigrad lacks runs until the line that uses it.
``docs/pytorch_compat.md`` lists, entry by entry, what minigrad follows.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from typing import Any, Sequence

from minigrad.compat import ALIASES
from minigrad.compat.torch_modules import MODULES, PARENTS as _PARENTS
from minigrad.compat.unsupported import MISSING

__all__ = ["MODULES", "home_of", "install", "is_stand_in"]

# Stand-ins whose names live somewhere other than their nearest minigrad ancestor (the default home).
HOMES: dict[str, str] = {
    "minigrad.nn.modules": "minigrad.nn",
    "minigrad.nn.parallel": "minigrad.distributed",  # DistributedDataParallel
    "minigrad.nn.utils.fusion": "minigrad.nn.fusion",  # fuse_conv_bn_eval
    "minigrad.ao.quantization": "minigrad.quantization",  # torch.quantization's newer name
    "minigrad.autograd.profiler": "minigrad.profiler",
    "minigrad.multiprocessing": "multiprocessing",  # torch's is the standard library's, plus sharing
}
# torch.nn.modules.<file> first asks minigrad.nn.<file> (private names such as _Loss live there),
# under the name given here where minigrad's file is named differently, then minigrad.nn
_NN_FILES = {"batchnorm": "normalization", "container": "containers", "pooling": "conv"}


def is_stand_in(module: Any) -> bool:
    """True for a module this file made up (one minigrad has no code of its own for)."""
    return isinstance(module, types.ModuleType) and getattr(module, "__stand_in__", False)


def _missing_prefix(name: str) -> str | None:
    """The longest key of ``unsupported.MISSING`` that is ``name`` or a package above it."""
    parts = name.split(".")
    for i in range(len(parts), 1, -1):
        if ".".join(parts[:i]) in MISSING:
            return ".".join(parts[:i])
    return None


def home_of(name: str) -> tuple[str, ...]:
    """The modules a stand-in takes its names from, in order: minigrad's file of the same name
    for ``torch.nn.modules.<file>``; a ``HOMES`` entry of it or of a package above it, else its
    nearest ancestor minigrad has code for (never ``minigrad`` itself: a top-level feature
    minigrad lacks has no home). None for a feature ``unsupported.MISSING`` lists."""
    if _missing_prefix(name) is not None:
        return ()
    parts = name.split(".")
    first: tuple[str, ...] = ()
    if len(parts) == 4 and name.startswith("minigrad.nn.modules."):
        file = "minigrad.nn." + _NN_FILES.get(parts[3], parts[3])
        first = (file,) if importlib.util.find_spec(file) is not None else ()
    for i in range(len(parts), 1, -1):
        if ".".join(parts[:i]) in HOMES:
            return first + (HOMES[".".join(parts[:i])],)
    for i in range(len(parts) - 1, 1, -1):
        ancestor = sys.modules.get(".".join(parts[:i]))
        if ancestor is not None and not is_stand_in(ancestor):
            return first + (ancestor.__name__,)
    return first


def _stand_in_getattr(name: str):
    def __getattr__(attr: str) -> Any:
        if attr.startswith("__"):  # inspect, pickle and doctest probe dunders: those stay AttributeErrors
            raise AttributeError(f"module {name!r} has no attribute {attr!r}")
        if f"{name}.{attr}" in MODULES:
            return importlib.import_module(f"{name}.{attr}")
        homes = home_of(name)
        for home in homes:
            try:
                return getattr(importlib.import_module(home), attr)
            except AttributeError:
                pass
        raise _not_implemented(name, attr, homes)

    return __getattr__


def _not_implemented(name: str, attr: str, homes: tuple[str, ...]) -> NotImplementedError:
    torch_name = "torch" + f"{name}.{attr}"[len("minigrad"):]
    key = f"{name}.{attr}" if f"{name}.{attr}" in MISSING else _missing_prefix(name)
    if key is not None:
        why = MISSING[key]
    elif homes:
        why = (f"it is not written in minigrad (torch{name[len('minigrad'):]}'s names come from "
               f"{' and '.join(homes)}, which lack it)")
    else:
        why = f"minigrad has no code for torch{name[len('minigrad'):]}; the module exists so that imports resolve"
    return NotImplementedError(f"minigrad does not implement {torch_name}: {why} (see docs/pytorch_compat.md)")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """First on ``sys.meta_path``, it answers only for the names in ``MODULES`` and ``ALIASES``."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: Any = None):
        if fullname in ALIASES:
            return importlib.machinery.ModuleSpec(fullname, _ALIAS, is_package=fullname in _PARENTS)
        if fullname not in MODULES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None:  # minigrad's own code; a package if torch's module has children
            if spec.submodule_search_locations is None and fullname in _PARENTS:
                spec.submodule_search_locations = []
            if fullname in _PARENTS and spec.loader is not None:
                spec.loader = _Shielding(spec.loader)
            return spec
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # the default module object

    def exec_module(self, module: types.ModuleType) -> None:
        name = module.__name__
        module.__doc__ = (f"Stand-in for torch{name[len('minigrad'):]} (minigrad.compat.torch_paths): names "
                          f"come from {', '.join(home_of(name)) or 'nowhere'}; others raise NotImplementedError.")
        module.__stand_in__ = True
        module.__getattr__ = _stand_in_getattr(name)


class _Alias(importlib.abc.Loader):
    """Imports a public path of ``ALIASES`` as the module that holds it: one module, two names."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = importlib.import_module(ALIASES[spec.name])
        spec.loader_state = module.__spec__  # its own, which the import system replaces with the alias's
        if spec.name in _PARENTS and not hasattr(module, "__path__"):
            module.__path__ = []  # torch's is a package: its submodules import below it
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        module.__spec__ = module.__spec__.loader_state  # it ran already, under its own name


_FINDER = _Finder()
_ALIAS = _Alias()


def _shield(module: types.ModuleType, name: str | None = None) -> None:
    """Register, without binding them on ``module``, the stand-ins of torch's submodules whose names
    ``module`` binds to something else: ``torch.quantization.fuse_modules`` is a module and a
    function. Importing a submodule binds it on its package, so ``import
    minigrad.quantization.fuse_modules`` would replace the function with the stand-in; a module
    already in ``sys.modules`` is returned as is, unbound, and the function stays, as in torch,
    whose package imports the submodule before it binds the function."""
    prefix = (name or module.__name__) + "."  # the public path of an aliased module
    for attr, value in list(vars(module).items()):
        name = prefix + attr
        if name in MODULES and name not in sys.modules and not isinstance(value, types.ModuleType) \
                and importlib.machinery.PathFinder.find_spec(name, getattr(module, "__path__", None)) is None:
            stand_in = importlib.util.module_from_spec(importlib.machinery.ModuleSpec(name, _FINDER, is_package=True))
            _FINDER.exec_module(stand_in)
            sys.modules[name] = stand_in


class _Shielding(importlib.abc.Loader):
    """A minigrad package's own loader, followed by ``_shield`` once the package has run."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def __getattr__(self, attr: str) -> Any:  # get_source, get_code...: the wrapped loader's
        return getattr(self.loader, attr)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self.loader.exec_module(module)
        _shield(module)


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once); register the torch paths that name a
    module minigrad keeps under another name (``minigrad.sparse`` is ``minigrad.ops.sparse``); and
    make the modules already imported that torch has as packages (``minigrad.nn.utils``) packages."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    for name in sorted(MODULES, key=lambda n: n.count(".")):
        parent, _, attr = name.rpartition(".")
        owner = sys.modules.get(parent)
        # the module's own dict, not getattr: a package's __getattr__ would import every stand-in
        alias = vars(owner).get(attr) if owner is not None and not is_stand_in(owner) else None
        if name not in sys.modules and isinstance(alias, types.ModuleType):
            sys.modules[name] = alias
        module = sys.modules.get(name)
        if module is not None and name in _PARENTS and not hasattr(module, "__path__"):
            module.__path__ = []
        if module is not None and name in _PARENTS and not is_stand_in(module):
            _shield(module, name)
