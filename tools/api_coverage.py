"""The usage-weighted PyTorch coverage figure of ``docs/pytorch_compat.md`` (issue 31).

Over the ported programs in ``tests/ported/`` (their original text: each ported import line put
back from the comment beside it), an AST walk counts every torch API call site: each outermost
attribute chain rooted at a name bound by a ``torch`` import (``torch.cat``, ``nn.Linear``,
``F.relu``, ``optim.Adam``, ``torch.utils.data.DataLoader``) and each use of a name imported from
torch (``DataLoader`` after ``from torch.utils.data import DataLoader``). A site is supported when
the same path under ``minigrad`` resolves: the modules import and every attribute exists, where a
feature minigrad does not follow raises ``NotImplementedError`` (``minigrad.compat.unsupported``) and so
counts as unsupported. Tensor methods (``x.view``) are not counted: which calls are on tensors is
not known without running the program. ``tests/compat/test_api_coverage.py`` checks the figure printed in
the compatibility page is the one this computes.

    python tools/api_coverage.py            # print the figure and the unsupported names
    python tools/api_coverage.py --write    # rewrite the figure in docs/pytorch_compat.md
"""

from __future__ import annotations

import argparse
import ast
import importlib
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PORTED = ROOT / "tests" / "ported"
DOC = ROOT / "docs" / "pytorch_compat.md"
NOT_PROGRAMS = {"harness.py", "torchvision_shim.py"}
ORIGINAL_IMPORT = re.compile(r"^(\s*)\S.*  # ((?:import|from) torch(?!vision)\b.*)$", re.M)
BEGIN, END = "<!-- api-coverage:begin -->", "<!-- api-coverage:end -->"


def original_text(ported: str) -> str:
    """The program as it was: every ported import line replaced by the original in its comment."""
    return ORIGINAL_IMPORT.sub(lambda m: m.group(1) + m.group(2), ported)


def torch_names(tree: ast.AST) -> tuple[dict[str, str], set[str]]:
    """Local name -> the torch path it is bound to, from the program's torch imports; and the
    local names that are modules (``import torch.nn as nn``, ``from torch import nn``), whose bare
    uses are not call sites."""
    names: dict[str, str] = {}
    modules: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "torch" or a.name.startswith("torch."):
                    local = a.asname or "torch"  # `import torch.utils.data` binds `torch`
                    names[local] = a.name if a.asname else "torch"
                    modules.add(local)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and (
                node.module == "torch" or node.module.startswith("torch.")):
            for a in node.names:
                local = a.asname or a.name
                names[local] = f"{node.module}.{a.name}"
                if _is_module(names[local]):
                    modules.add(local)
    return names, modules


def _chain(node: ast.AST) -> list[str] | None:
    """``a.b.c`` as ["a", "b", "c"]; None when the chain is not rooted at a plain name."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


def call_sites(source: str) -> list[str]:
    """Every torch API site in ``source`` (original imports), as full torch paths, one per use."""
    tree = ast.parse(source)
    names, modules = torch_names(tree)
    sites: list[str] = []
    inner: set[int] = set()  # attribute nodes inside a longer chain already counted
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in inner:
            parts = _chain(node)
            if parts and parts[0] in names:
                sites.append(".".join([names[parts[0]], *parts[1:]]))
                sub = node.value
                while isinstance(sub, ast.Attribute):
                    inner.add(id(sub))
                    sub = sub.value
        elif (isinstance(node, ast.Name) and node.id in names and node.id not in modules
              and isinstance(node.ctx, ast.Load)):
            sites.append(names[node.id])  # a class or function imported from torch, used bare
    return sites


def _is_module(path: str) -> bool:
    """Whether a name imported with ``from torch... import name`` is a module: its minigrad
    counterpart imports as one (a module minigrad lacks counts as an object, and as unsupported)."""
    try:
        importlib.import_module("minigrad" + path[len("torch"):])
        return True
    except Exception:  # noqa: BLE001  (not a module, or one minigrad lacks or refuses)
        return False


def resolves(site: str) -> bool:
    """Whether ``site`` (a torch path) exists in minigrad: its modules import and its attributes
    are found without an AttributeError, ImportError or NotImplementedError."""
    parts = ("minigrad" + site[len("torch"):]).split(".")
    obj = None
    for i in range(len(parts), 0, -1):  # the longest importable module prefix
        try:
            obj = importlib.import_module(".".join(parts[:i]))
            rest = parts[i:]
            break
        except ImportError:
            continue
        except NotImplementedError:
            return False
    if obj is None:
        return False
    try:
        for attr in rest:
            obj = getattr(obj, attr)
    except (AttributeError, NotImplementedError):
        return False
    return True


@dataclass
class Coverage:
    """Sites counted over the corpus, and those minigrad does not resolve."""
    sites: Counter = field(default_factory=Counter)
    missing: Counter = field(default_factory=Counter)
    programs: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.sites.values())

    @property
    def supported(self) -> int:
        return self.total - sum(self.missing.values())

    @property
    def fraction(self) -> float:
        return self.supported / self.total if self.total else 1.0


def measure(folder: Path = PORTED) -> Coverage:
    """The coverage of minigrad over the ported programs in ``folder``."""
    cov = Coverage()
    known: dict[str, bool] = {}
    for path in sorted(folder.glob("*.py")):
        if path.name.startswith("test_") or path.name in NOT_PROGRAMS:
            continue
        sites = call_sites(original_text(path.read_text()))
        bad = 0
        for site in sites:
            cov.sites[site] += 1
            if site not in known:
                known[site] = resolves(site)
            if not known[site]:
                cov.missing[site] += 1
                bad += 1
        cov.programs[path.stem] = (len(sites), len(sites) - bad)
    return cov


def figure_line(cov: Coverage) -> str:
    return (f"Usage-weighted coverage over the {len(cov.programs)} ported program files: {cov.supported} of "
            f"{cov.total} torch API call sites ({100 * cov.fraction:.1f}%) resolve in minigrad.")


def section(cov: Coverage) -> str:
    """The compatibility page's coverage section (between its markers)."""
    lines = [BEGIN, figure_line(cov)]
    if cov.missing:
        lines.append("Sites that do not resolve yet: " + ", ".join(
            f"`{name}` ({n})" for name, n in sorted(cov.missing.items(), key=lambda kv: (-kv[1], kv[0]))) + ".")
    lines.append(END)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the figure in docs/pytorch_compat.md")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    cov = measure()
    text = section(cov)
    print(text)
    for name, (n, ok) in cov.programs.items():
        print(f"  {name:32s} {ok:4d} / {n:4d}")
    if args.write:
        doc = DOC.read_text()
        if BEGIN in doc:
            doc = doc[:doc.index(BEGIN)] + text + doc[doc.index(END) + len(END):]
        else:
            raise SystemExit(f"{DOC}: no {BEGIN} marker to write the figure after")
        DOC.write_text(doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
