"""Rewrite imports and paths in the given files after files of the repository were moved.

``tools/moved_paths.txt`` lists each move as ``old new`` (paths from the repository root). A move
of a package file renames its module too (``minigrad/graph/codegen/cpu.py`` ->
``minigrad/graph/codegen/numpy_blocks.py`` renames ``minigrad.graph.codegen.cpu``), so in each file
this rewrites, in order:

- ``from P import X`` (``as`` names and several names per line included) where ``P.X`` moved: the
  moved name goes to a ``from`` line of its own under its new package, or stays on its line when
  only its file name changed, and ``as X`` keeps the local name where the name changed;
- every dotted module name and every path that moved (``minigrad.meta.to_meta``, ``"minigrad/meta.py"``,
  ``tests/test_ops.py``).

A module whose old dotted name stays public, because PyTorch programs import it by that name
(``minigrad.cuda``, ``minigrad.utils.checkpoint``; the keys of ``ALIASES`` in
``minigrad/compat/__init__.py``), is rewritten only in the import statements of ``minigrad/``,
where the package must import the real module; messages, docstrings, tests, notebooks and docs keep
the public name. Files are rewritten in
place; ``--check`` only lists what would change. Usage, after merging a branch that moved files:
``python tools/follow_moves.py $(git diff --name-only main...other)``.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MOVES = ROOT / "tools" / "moved_paths.txt"
ALIASES_FILE = ROOT / "minigrad" / "compat" / "__init__.py"


def read_moves(path: Path = MOVES) -> list[tuple[str, str]]:
    """``(old, new)`` path pairs, in file order."""
    pairs = []
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            old, new = line.split()
            pairs.append((old, new))
    return pairs


def module_name(path: str) -> str | None:
    """``minigrad/backend/__init__.py`` -> ``minigrad.backend``; None for a file that is no module."""
    if not path.endswith(".py") or not path.startswith("minigrad/"):
        return None
    parts = path[:-3].split("/")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def public_aliases(path: Path = ALIASES_FILE) -> set[str]:
    """The old module names that stay importable (the keys of ``ALIASES``), read without importing."""
    if not path.exists():
        return set()
    for node in ast.walk(ast.parse(path.read_text())):
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) else None)
        if isinstance(target, ast.Name) and target.id == "ALIASES" and isinstance(node.value, ast.Dict):
            return {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
    return set()


def renames(pairs: list[tuple[str, str]]) -> dict[str, str]:
    """Old dotted module name -> new one, for the moves of package modules."""
    found = {}
    for old, new in pairs:
        a, b = module_name(old), module_name(new)
        if a and b and a != b:
            found[a] = b
    return found


_FROM = re.compile(r'^(?P<indent>[ \t"]*)from (?P<package>minigrad(?:\.\w+)*) import (?P<names>[\w ,]+?)'
                   r'(?P<tail>[ \t]*(?:#[^\n]*?)?(?:\\n)?"?,?)$', re.M)


def _rewrite_from(text: str, modules: dict[str, str]) -> str:
    def fix(match: re.Match) -> str:
        package, kept, moved = match["package"], [], []
        for item in (s.strip() for s in match["names"].split(",")):
            if not item:
                continue
            name, _, local = item.partition(" as ")
            new = modules.get(f"{package}.{name.strip()}")
            if new is None:
                kept.append(item)
                continue
            parent, _, leaf = new.rpartition(".")
            local = local.strip() or name.strip()
            as_local = "" if leaf == local else f" as {local}"
            if parent == package:  # renamed in its package: it stays on its line
                kept.append(leaf + as_local)
            else:
                moved.append(f"from {parent} import {leaf}{as_local}")
        if not moved:
            return match[0] if kept == [s.strip() for s in match["names"].split(",") if s.strip()] else \
                f"{match['indent']}from {package} import {', '.join(kept)}{match['tail']}"
        indent, tail = match["indent"], match["tail"]
        lines = ([f"from {package} import {', '.join(kept)}"] if kept else []) + moved
        # a notebook's JSON source line: the indent ends in a quote, every line ends in \n",
        separator = '\\n",\n' if indent.endswith('"') else "\n"
        return separator.join(indent + line for line in lines) + tail

    return _FROM.sub(fix, text)


def rewrite(text: str, pairs: list[tuple[str, str]], inside_package: bool, public: set[str]) -> str:
    """``text`` with the moved imports, module names and paths rewritten."""
    everywhere = {a: b for a, b in renames(pairs).items() if a not in public}
    in_imports = renames(pairs) if inside_package else everywhere
    text = _rewrite_from(text, in_imports)
    for old in sorted(in_imports, key=len, reverse=True):  # longest first: minigrad.cuda_amp before minigrad.cuda
        pattern = rf"(?<![\w.]){re.escape(old)}(?!\w)"
        if old in everywhere:
            text = re.sub(pattern, in_imports[old], text)
        else:  # a public name: messages and docstrings keep it; only the package's own imports change
            text = re.sub(rf"^([ \t]*(?:from|import) [^#\n]*)",  # the statement, not its comment
                          lambda m: re.sub(pattern, in_imports[old], m[1]), text, flags=re.M)
    for old, new in sorted(pairs, key=lambda p: len(p[0]), reverse=True):
        text = re.sub(rf"(?<![\w/.]){re.escape(old)}(?![\w/])", new, text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--moves", type=Path, default=MOVES)
    parser.add_argument("--check", action="store_true", help="list the files that would change; change nothing")
    args = parser.parse_args(argv)
    pairs, public = read_moves(args.moves), public_aliases()
    changed = []
    for path in args.files:
        if not path.is_file():
            continue
        text = path.read_text()
        try:
            inside = path.resolve().relative_to(ROOT).parts[0] == "minigrad"
        except ValueError:
            inside = False
        new = rewrite(text, pairs, inside, public)
        if new != text:
            changed.append(path)
            if not args.check:
                path.write_text(new)
    for path in changed:
        print(path)
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
