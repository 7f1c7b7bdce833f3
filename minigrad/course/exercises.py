"""Finding the exercises of a notebook: which cells are solutions, which are checks, and their numbers.

An exercise is a solution cell whose first line is ``# Exercise N: title`` and whose answer sits
between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` lines, followed later by a check cell whose
first line is ``# Check N``, and optionally by ``# Hidden check N`` cells, which the grader runs and
the student version leaves out. The same facts can be stored in the cell's metadata,
``{"minigrad": {"exercise": N, "role": "solution" | "check" | "hidden", "title": ...}}``, which
``tag_notebook`` writes and ``release`` always writes, so grading does not depend on a student
keeping the comment lines; where both are present the metadata wins. An instructor's solution cell
may also list, as ``"forbid"``, the library functions its answer may not call (see ``guard``).
See ``chapters/README.md``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat

__all__ = [
    "BEGIN", "END", "METADATA_KEY", "CourseError", "Exercise", "cell_role", "find_exercises",
    "read_notebook", "solution_blocks", "tag_notebook",
]

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
METADATA_KEY = "minigrad"

_EXERCISE_LINE = re.compile(r"#\s*Exercise\s+(\d+)\b\s*[:.\-\u2013\u2014]?\s*(.*?)\s*$", re.IGNORECASE)
_CHECK_LINE = re.compile(r"#\s*Check\s+(\d+)\b", re.IGNORECASE)
_HIDDEN_LINE = re.compile(r"#\s*Hidden\s+check\s+(\d+)\b", re.IGNORECASE)
ROLES = ("solution", "check", "hidden")


class CourseError(ValueError):
    """A notebook that does not follow the exercise convention; the message names the cell."""


@dataclass
class Exercise:
    """One exercise: its number, its title and the indices of its cells in ``nb.cells``."""

    number: int
    title: str = ""
    solution_cells: list[int] = field(default_factory=list)
    check_cells: list[int] = field(default_factory=list)
    hidden_cells: list[int] = field(default_factory=list)
    forbid: list[str] = field(default_factory=list)


def read_notebook(path: str | Path) -> Any:
    """Read an ``.ipynb`` file as an nbformat v4 node; a missing or damaged file raises ``CourseError``."""
    path = Path(path)
    if path.suffix != ".ipynb":
        raise CourseError(f"{path}: not a notebook (expected a .ipynb file)")
    try:
        return nbformat.read(path, as_version=4)
    except OSError as error:
        raise CourseError(f"{path}: cannot read it ({error.strerror or error})") from error
    except (ValueError, nbformat.ValidationError) as error:  # NotJSONError is a ValueError
        first_line = (str(error).splitlines() or [type(error).__name__])[0]
        raise CourseError(f"{path}: not a valid notebook ({first_line})") from error


def _first_line(source: str) -> str:
    return next((line.strip() for line in source.splitlines() if line.strip()), "")


def _comment_role(cell: Any) -> tuple[int, str, str] | None:
    line = _first_line(cell.source)
    if match := _EXERCISE_LINE.match(line):
        return int(match[1]), "solution", match[2]
    if match := _CHECK_LINE.match(line):
        return int(match[1]), "check", ""
    if match := _HIDDEN_LINE.match(line):
        return int(match[1]), "hidden", ""
    return None


def _metadata_role(cell: Any, index: int) -> tuple[int, str, str] | None:
    meta = cell.get("metadata", {}).get(METADATA_KEY)
    if meta is None or ("exercise" not in meta and "role" not in meta):  # other facts only ("forbid")
        return None
    number, role = meta.get("exercise"), meta.get("role")
    if not isinstance(number, int) or role not in ROLES:
        raise CourseError(f"cell {index}: metadata {METADATA_KEY!r} must hold an integer 'exercise' "
                          f"and a 'role' of 'solution', 'check' or 'hidden', got {dict(meta)!r}")
    return number, role, meta.get("title", "")


def cell_role(cell: Any, index: int = 0) -> tuple[int, str, str] | None:
    """``(number, "solution" | "check" | "hidden", title)`` for an exercise cell, ``None`` otherwise.

    Metadata wins over the comment line; ``index`` only names the cell in error messages.
    """
    if cell.cell_type != "code":
        return None
    return _metadata_role(cell, index) or _comment_role(cell)


def solution_blocks(source: str, index: int = 0) -> list[tuple[int, int]]:
    """The ``(begin, end)`` line numbers of each marker pair in ``source``; raises on unpaired markers."""
    blocks, begin = [], None
    for lineno, line in enumerate(source.splitlines()):
        if BEGIN in line:
            if begin is not None:
                raise CourseError(f"cell {index}, line {lineno + 1}: {BEGIN!r} inside another solution block")
            begin = lineno
        elif END in line:
            if begin is None:
                raise CourseError(f"cell {index}, line {lineno + 1}: {END!r} without {BEGIN!r}")
            blocks.append((begin, lineno))
            begin = None
    if begin is not None:
        raise CourseError(f"cell {index}, line {begin + 1}: {BEGIN!r} is never closed by {END!r}")
    return blocks


def find_exercises(nb: Any, strict: bool = True) -> list[Exercise]:
    """The exercises of notebook ``nb`` (an ``nbformat`` node), sorted by number.

    ``strict`` (what ``release`` and ``tag`` use) demands the authoring convention: exactly one
    solution cell and one later check cell per number, solution markers in every solution cell
    that is not already a student version and nowhere else, and comment lines that agree with the
    metadata. Without it (what ``grade`` uses, on a notebook a student has edited) whatever cells
    carry a role are collected, and an exercise that lost a cell simply fails.
    """
    exercises: dict[int, Exercise] = {}
    for index, cell in enumerate(nb.cells):
        role = cell_role(cell, index)
        if strict:
            _check_cell(cell, index, role)
        if role is None:
            continue
        number, kind, title = role
        exercise = exercises.setdefault(number, Exercise(number))
        if kind == "solution":
            exercise.solution_cells.append(index)
            exercise.title = exercise.title or title
            exercise.forbid = exercise.forbid or list(cell.metadata.get(METADATA_KEY, {}).get("forbid", []))
        else:
            getattr(exercise, f"{kind}_cells").append(index)
    found = [exercises[number] for number in sorted(exercises)]
    if strict:
        for exercise in found:
            _check_exercise(exercise)
    return found


def _check_cell(cell: Any, index: int, role: tuple[int, str, str] | None) -> None:
    has_markers = BEGIN in cell.source or END in cell.source
    if cell.cell_type != "code":
        if has_markers:
            raise CourseError(f"cell {index}: solution markers in a {cell.cell_type} cell; "
                              "only code cells can hold exercises")
        return
    blocks = solution_blocks(cell.source, index)
    comment = _comment_role(cell)
    if role is not None and comment is not None and comment[:2] != role[:2]:
        raise CourseError(f"cell {index}: metadata says exercise {role[0]} ({role[1]}) but the first "
                          f"line says exercise {comment[0]} ({comment[1]}); run "
                          "`python -m minigrad.course tag` to rewrite the metadata")
    if role is None or role[1] != "solution":
        if has_markers:
            raise CourseError(f"cell {index}: {BEGIN!r} in a cell whose first line is not "
                              "'# Exercise N: title'")
        return
    if not blocks and "raise NotImplementedError" not in cell.source:
        raise CourseError(f"cell {index}: solution cell of exercise {role[0]} has no {BEGIN!r} ... "
                          f"{END!r} block")


def _check_exercise(exercise: Exercise) -> None:
    n, solutions, checks = exercise.number, exercise.solution_cells, exercise.check_cells
    if len(solutions) != 1:
        where = f"cells {solutions}" if solutions else "no cell"
        raise CourseError(f"exercise {n}: needs exactly one solution cell ('# Exercise {n}: title'), "
                          f"found {where}")
    if len(checks) != 1:
        where = f"cells {checks}" if checks else "no cell"
        raise CourseError(f"exercise {n}: needs exactly one check cell ('# Check {n}'), found {where}")
    if checks[0] < solutions[0]:
        raise CourseError(f"exercise {n}: check cell {checks[0]} comes before solution cell {solutions[0]}")
    if any(hidden < checks[0] for hidden in exercise.hidden_cells):
        raise CourseError(f"exercise {n}: a hidden check comes before its check cell {checks[0]}")


def tag_notebook(nb: Any) -> list[Exercise]:
    """Write each exercise cell's number, role and title into its metadata, from its comment line.

    Changes ``nb`` in place and returns its exercises; raises ``CourseError`` if the notebook does
    not follow the convention. Cells without a comment line keep the metadata they have.
    """
    for cell in nb.cells:
        role = _comment_role(cell) if cell.cell_type == "code" else None
        if role is not None:
            number, kind, title = role
            meta: dict[str, Any] = {**cell.metadata.get(METADATA_KEY, {}), "exercise": number, "role": kind}
            if kind == "solution":
                meta["title"] = title
            cell.metadata[METADATA_KEY] = meta
    return find_exercises(nb, strict=True)
