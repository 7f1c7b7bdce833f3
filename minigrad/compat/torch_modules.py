"""The public module paths of PyTorch, as minigrad names them (``minigrad.nn.modules.conv``).

``torch_modules.txt`` is generated from the installed torch by ``tools/torch_modules.py`` (its
filter: PyTorch's rule for public modules, less the tests, benchmarks and examples in its wheel).
``minigrad.compat.torch_paths`` makes every one of them importable, and a package's ``__getattr__``
(``minigrad.compat.unsupported.module_getattr``) imports one on attribute access, as torch has its
submodules imported.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["MODULES", "PARENTS"]

MODULES: frozenset[str] = frozenset(
    "minigrad" + line.strip()[len("torch"):]
    for line in Path(__file__).with_name("torch_modules.txt").read_text().splitlines() if line.strip())
PARENTS = frozenset(name.rpartition(".")[0] for name in MODULES)  # those with submodules of their own
