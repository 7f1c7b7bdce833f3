"""``docs/pytorch_compat.md`` says true things: every row it marks supported or partly resolves in
minigrad, and where PyTorch is installed, minigrad's signature takes every parameter torch's does
(a partly row names each one it lacks in its notes); every row marked not raises the error it
names; and the totals line counts the rows.

A row is ``| `torch.name` | status | notes |``; the minigrad name is the torch name with ``torch``
replaced by ``minigrad``. A "not" row's notes begin with the error's class name and a colon.
"""

import builtins
import importlib
import inspect
import re
from pathlib import Path

import pytest

TABLE = Path(__file__).resolve().parents[2] / "docs" / "pytorch_compat.md"
ROW = re.compile(r"^\| `(torch(?:\.\w+)+)` \| (supported|partly|not) \| (.*) \|$")
# Parameters that concern memory layout or kernel selection, which minigrad does not have, or that
# torch keeps only for old code (size_average, reduce): accepted by no minigrad signature.
IGNORED = {"out", "layout", "pin_memory", "memory_format", "non_blocking", "foreach", "fused", "capturable",
           "differentiable", "size_average", "reduce", "self", "args", "kwargs"}


def _rows() -> list[tuple[str, str, str]]:
    return [m.groups() for line in TABLE.read_text().splitlines() if (m := ROW.match(line))]


def resolve(name: str):
    """The object a dotted name names: the longest importable module prefix, then attributes."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(name)


def _parameters(obj) -> dict | None:
    """A callable's parameters (a class's ``__init__``'s), or None when Python cannot see them."""
    target = obj.__init__ if inspect.isclass(obj) else obj
    if not callable(target) or isinstance(obj, property):
        return None
    try:
        return dict(inspect.signature(target).parameters)
    except (TypeError, ValueError):  # builtins written in C have no signature
        return None


ROWS = _rows()


def test_the_table_has_rows_in_every_section_and_true_totals():
    counts = {s: sum(1 for _, st, _ in ROWS if st == s) for s in ("supported", "partly", "not")}
    line = f"Totals: {counts['supported']} supported, {counts['partly']} partly, {counts['not']} not."
    assert line in TABLE.read_text(), f"update the totals line to: {line}"
    assert len({n for n, _, _ in ROWS}) == len(ROWS), "a name appears twice"
    assert all(counts.values())


@pytest.mark.parametrize("name,status,notes", [r for r in ROWS if r[1] != "not"], ids=lambda v: str(v)[:60])
def test_supported_and_partly_rows_resolve_and_take_torchs_parameters(name, status, notes):
    mine = resolve("minigrad" + name[len("torch"):])
    if status == "partly":
        assert notes.strip(), f"{name}: a partly row says what is missing"
    torch = pytest.importorskip("torch")
    try:
        theirs = _parameters(resolve(name))
    except AttributeError:  # torch's own optional dependency is missing (torch.utils.tensorboard needs tensorboard)
        pytest.skip(f"{name} does not import in this torch installation")
    ours = _parameters(mine)
    if ours is None or theirs is None or any(p.kind is p.VAR_KEYWORD for p in ours.values()):
        return
    lacking = [p for p in theirs if p not in ours and p not in IGNORED and not p.startswith("_")]
    if status == "supported":
        assert not lacking, f"{name} is marked supported but minigrad's signature lacks {lacking}"
    else:
        unnamed = [p for p in lacking if f"`{p}`" not in notes]
        assert not unnamed, f"{name}: the notes must name each parameter minigrad lacks: {unnamed}"


@pytest.mark.parametrize("name,status,notes", [r for r in ROWS if r[1] == "not"], ids=lambda v: str(v)[:60])
def test_not_rows_raise_the_error_they_name(name, status, notes):
    error = getattr(builtins, notes.split(":")[0])
    with pytest.raises(error):
        resolve("minigrad" + name[len("torch"):])
