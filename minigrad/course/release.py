"""Student versions of notebooks: every solution block replaced by ``raise NotImplementedError``.

``release_notebook`` keeps each exercise's code outside the ``### BEGIN SOLUTION`` /
``### END SOLUTION`` markers (a signature, a docstring), replaces each block with
``raise NotImplementedError("exercise N")`` at the block's indentation, clears the outputs and
execution counts of the exercise and check cells (a stored output could give the answer away) and
stamps their metadata, and drops the hidden checks; lesson cells are left as they are. ``release`` does that for one notebook or
a folder of them, never writes into the source, and gives the same files when run again.
"""

from __future__ import annotations

import copy
import shutil
import warnings
from pathlib import Path
from typing import Any

import nbformat

from minigrad.course.exercises import BEGIN, END, METADATA_KEY, CourseError, find_exercises, read_notebook

__all__ = ["release", "release_notebook", "ship", "strip_solutions"]


def strip_solutions(source: str, number: int) -> str:
    """``source`` with each marked solution block replaced by ``raise NotImplementedError("exercise N")``."""
    lines = []
    inside = False
    for line in source.splitlines():
        if BEGIN in line:
            indent = line[: len(line) - len(line.lstrip())]
            lines += [f"{indent}# YOUR CODE HERE", f'{indent}raise NotImplementedError("exercise {number}")']
            inside = True
        elif END in line:
            inside = False
        elif not inside:
            lines.append(line)
    return "\n".join(lines) + ("\n" if source.endswith("\n") else "")


def release_notebook(nb: Any) -> Any:
    """The student version of notebook ``nb`` (a new node; ``nb`` is not changed)."""
    student = copy.deepcopy(nb)
    exercises = find_exercises(student, strict=True)
    hidden = {index for exercise in exercises for index in exercise.hidden_cells}
    for exercise in exercises:
        (solution,), (check,) = exercise.solution_cells, exercise.check_cells
        for index, role in ((solution, "solution"), (check, "check")):
            cell = student.cells[index]
            cell.outputs = []
            cell.execution_count = None
            cell.metadata.pop("execution", None)  # kernel timestamps nbclient records
            meta: dict[str, Any] = {"exercise": exercise.number, "role": role}
            if role == "solution":
                meta["title"] = exercise.title
                if exercise.forbid:  # public (the exercise says so), and self-grading enforces it too
                    meta["forbid"] = exercise.forbid
                cell.source = strip_solutions(cell.source, exercise.number)
            cell.metadata[METADATA_KEY] = meta
    student.cells = [cell for index, cell in enumerate(student.cells) if index not in hidden]
    return student


def _is_hidden(relative: Path) -> bool:
    return any(part.startswith(".") or part == "__pycache__" for part in relative.parts)


def _has_markers(path: Path) -> bool:
    data = path.read_bytes()
    return BEGIN.encode() in data or END.encode() in data


def release(src: str | Path, dest: str | Path) -> list[Path]:
    """Write the student version of ``src`` (a notebook or a folder) to ``dest``; returns the files written.

    For a notebook, ``dest`` is the output ``.ipynb`` or a folder to put it in. For a folder, every
    notebook below it is released to the same relative path under ``dest``, and other files are
    copied unless they contain a solution marker (a jupytext twin of an exercises notebook, say),
    which are skipped with a warning. Hidden folders and ``__pycache__`` are ignored.
    """
    src, dest = Path(src), Path(dest)
    if not src.exists():
        raise CourseError(f"{src}: no such notebook or folder")
    if src.is_file():
        target = dest if dest.suffix == ".ipynb" else dest / src.name
        if target.resolve() == src.resolve():
            raise CourseError(f"{target}: the student version would overwrite its source")
        jobs = [(src, target)]
    else:
        if dest.resolve().is_relative_to(src.resolve()):
            raise CourseError(f"{dest}: the destination lies inside the source folder {src}")
        jobs = [(path, dest / path.relative_to(src)) for path in sorted(src.rglob("*"))
                if path.is_file() and not _is_hidden(path.relative_to(src))]
    # Release every notebook before writing anything, so a malformed one leaves dest untouched.
    outputs = []
    for path, target in jobs:
        if path.suffix == ".ipynb":
            try:
                outputs.append((target, release_notebook(read_notebook(path))))
            except CourseError as error:
                raise CourseError(f"{path}: {error}") from error
        elif _has_markers(path):
            warnings.warn(f"{path}: not copied, it contains solution markers", stacklevel=2)
        else:
            outputs.append((target, path))
    for target, content in outputs:
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Path):
            shutil.copyfile(content, target)
        else:
            nbformat.write(content, target)
    return [target for target, _ in outputs]


def ship(chapters: str | Path, check: bool = False) -> list[Path]:
    """Write each ``chapters/*/solutions/X.ipynb``'s student version to ``chapters/*/X.ipynb``.

    With ``check`` nothing is written: the student versions that are missing or differ from what
    the release gives are returned (an empty list means the shipped notebooks are up to date).
    Otherwise the files written are returned.
    """
    chapters = Path(chapters)
    sources = sorted(chapters.glob("*/solutions/*.ipynb"))
    if not sources:
        raise CourseError(f"{chapters}: no instructor notebooks (chapters/*/solutions/*.ipynb)")
    out = []
    for source in sources:
        target = source.parent.parent / source.name
        text = nbformat.writes(release_notebook(read_notebook(source))) + "\n"
        if not check:
            target.write_text(text)
            out.append(target)
        elif not target.exists() or target.read_text() != text:
            out.append(target)
    return out
