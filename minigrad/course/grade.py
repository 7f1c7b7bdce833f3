"""Grading a notebook: the student's answers, the instructor's checks, under nbval, with a hard limit.

``grade`` never runs the student's notebook as it is. ``assemble`` builds the graded notebook from
the instructor's source: its setup and helper cells, the student's solution cells (found by their
metadata or comment line), the instructor's check cells and the hidden checks the student never
saw, all run through ``minigrad.course.guard`` (which stops solutions from calling the function
they re-implement and undoes and reports patches of numpy, math, builtins or minigrad). An edited
or deleted check counts for nothing: the instructor's copy runs. The graded notebook runs under
``pytest --nbval-lax`` in a scratch folder, in a process tree that ``minigrad.course.sandbox``
kills at a hard wall-clock limit; an exercise passes when its solution, its check and its hidden
checks all ran without an error, and an exercise the run did not reach fails.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import nbformat

import minigrad
from minigrad.course.exercises import BEGIN, METADATA_KEY, CourseError, find_exercises, read_notebook
from minigrad.course.progress import PROGRESS
from minigrad.course.release import release_notebook
from minigrad.course.sandbox import TIMED_OUT, TOO_MANY_PROCESSES, sandbox_command

__all__ = ["ExerciseResult", "GradeReport", "assemble", "grade", "grade_against", "solution_notebook",
           "verify", "write_junit"]

ROOT = Path(minigrad.__file__).resolve().parent.parent
GUARD = Path(__file__).resolve().parent / "guard.py"
CELL_TIMEOUT, LIMIT = 60, 300
_DEAD = "Kernel dead on test start"


@dataclass
class ExerciseResult:
    """The outcome of one exercise; ``error`` is the first line of its first failure, empty if it passed."""

    number: int
    title: str
    passed: bool
    error: str = ""


@dataclass
class GradeReport:
    """Every exercise's result for one notebook, with the score table ``str()`` prints."""

    notebook: str
    results: list[ExerciseResult]
    stopped: str = ""  # why the run ended early ("killed: the 300 s limit passed"), if it did

    @property
    def score(self) -> int:
        return sum(result.passed for result in self.results)

    @property
    def total(self) -> int:
        return len(self.results)

    def to_dict(self) -> dict[str, Any]:
        return {"notebook": self.notebook, "score": self.score, "total": self.total, "stopped": self.stopped,
                "exercises": [asdict(result) for result in self.results]}

    def __str__(self) -> str:
        titles = [_clip(result.title, 40) for result in self.results]
        width = max([len("exercise"), *map(len, titles)])
        lines = [self.notebook, f"  {'#':>3}  {'exercise':<{width}}  result"]
        for result, title in zip(self.results, titles):
            row = f"  {result.number:>3}  {title:<{width}}  {'pass' if result.passed else 'FAIL'}"
            lines.append(row if result.passed else f"{row}  {_clip(result.error, 100)}")
        if self.stopped:
            lines.append(f"The run was stopped ({self.stopped}); the exercises it did not finish fail.")
        lines.append(f"Score: {self.score}/{self.total}")
        return "\n".join(lines)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def solution_notebook(nb: Any, path: Path) -> Path:
    """The instructor's source of a student notebook: ``chapters/<chapter>/solutions/<name>``.

    The chapter comes from the notebook's metadata (``release`` copies it from the source), so a
    student may rename or move their notebook.
    """
    chapter = nb.metadata.get(METADATA_KEY, {}).get("chapter")
    if not chapter:
        raise CourseError(f"{path}: the notebook does not say which chapter it belongs to "
                          "(metadata minigrad.chapter); pass the instructor's notebook with --solution")
    source = ROOT / "chapters" / chapter / "solutions" / path.name
    if not source.exists():
        source = ROOT / "chapters" / chapter / "solutions" / "exercises.ipynb"
    if not source.exists():
        raise CourseError(f"{path}: no instructor notebook for chapter {chapter!r} at {source}")
    return source


def assemble(source: Any, student: Any, guard: str = "_grader") -> tuple[Any, list[tuple[int | None, str]]]:
    """The graded notebook and, per code cell, ``(exercise number, role)`` (``None`` for the grader's own).

    ``source`` is the instructor's notebook (setup, checks, hidden checks, what each exercise may
    not call), ``student`` the submission, of which only the solution cells are used; ``guard`` is
    the name the guard gets in the kernel (``grade`` draws a random one).
    """
    exercises = find_exercises(source, strict=True)
    answers = {e.number: e.solution_cells for e in find_exercises(student, strict=False)}
    forbid = {e.number: e.forbid for e in exercises if e.forbid}
    role_of = {index: (e.number, role) for e in exercises
               for role, cells in (("solution", e.solution_cells), ("check", e.check_cells),
                                   ("hidden", e.hidden_cells)) for index in cells}
    # The guard is loaded from the grader's file: the minigrad on the kernel's path may be a student's,
    # and importing the package minigrad.course would take seconds.
    cells = [f"import importlib.util as {guard}\n"
             f"{guard} = {guard}.module_from_spec({guard}.spec_from_file_location('minigrad_course_guard', "
             f"{str(GUARD)!r}))\n"
             f"{guard}.__spec__.loader.exec_module({guard})\n"
             f"{guard} = {guard}.Guard(globals(), {forbid!r})"]
    roles: list[tuple[int | None, str]] = [(None, "guard")]
    for index, cell in enumerate(source.cells):
        if cell.cell_type != "code" or not cell.source.strip():
            continue
        number, role = role_of.get(index, (None, "setup"))
        if role == "setup":
            cells.append(f"{guard}.cell({cell.source!r})")
        elif role == "solution":
            answer = "\n\n".join(student.cells[i].source for i in answers.get(number, [])) or \
                f'raise NotImplementedError("exercise {number}: the solution cell is missing")'
            cells.append(f"{guard}.solution({number}, {answer!r})")
        else:
            cells.append(f"{guard}.check({number}, {cell.source!r})")
        roles.append((number, role))
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells]), roles


def _kernel_pythonpath(package_root: Path) -> str:
    """``package_root`` first on the path, unless it is where this Python installs packages."""
    installed = {Path(sysconfig.get_paths()[key]).resolve() for key in ("purelib", "platlib")}
    parts = [] if package_root.resolve() in installed else [str(package_root)]
    if package_root.resolve() != ROOT:  # the grader's own modules (guard, progress) come from here
        parts.append(str(ROOT))
    return os.pathsep.join(filter(None, [*parts, os.environ.get("PYTHONPATH")]))


def _copy_resources(folder: Path, scratch: Path) -> None:
    """The chapter's data files and scripts (not its notebooks, not the solutions) into ``scratch``."""
    for path in folder.iterdir():
        if path.name.startswith(".") or path.name in ("solutions", "__pycache__") or path.suffix == ".ipynb":
            continue
        if path.is_dir():
            shutil.copytree(path, scratch / path.name, ignore=shutil.ignore_patterns(".*", "__pycache__"))
        else:
            shutil.copy(path, scratch / path.name)


def run_graded(nb: Any, resources: Path | None, timeout: int = CELL_TIMEOUT, limit: float = LIMIT,
               package_root: Path = ROOT) -> tuple[dict[int, tuple[bool, str]], str]:
    """Run the graded notebook ``nb`` in a scratch folder under nbval and the sandbox.

    Returns, per code cell that finished, ``(passed, error line)``, and why the run stopped early
    (empty if it did not). ``resources`` is the folder whose data files the notebook may read.
    """
    with tempfile.TemporaryDirectory(prefix="minigrad-grade-") as scratch_name:
        scratch = Path(scratch_name)
        if resources is not None:
            _copy_resources(resources, scratch)
        nbformat.write(nb, scratch / "graded.ipynb")
        # The progress plugin is loaded from a copy, not from the package on the kernel's path,
        # which may be a student's.
        shutil.copy(Path(__file__).resolve().parent / "progress.py", scratch / "minigrad_grade_progress.py")
        (scratch / "pytest.ini").write_text("[pytest]\n")
        progress = scratch / "progress.jsonl"
        progress.touch()
        env = dict(os.environ, HOME=str(scratch), IPYTHONDIR=str(scratch / ".ipython"),
                   JUPYTER_RUNTIME_DIR=str(scratch / ".jupyter"), MPLCONFIGDIR=str(scratch / ".matplotlib"),
                   MPLBACKEND="Agg", PYTHONHASHSEED="0", PYTHONDONTWRITEBYTECODE="1",
                   PYTHONPATH=_kernel_pythonpath(package_root), **{PROGRESS: str(progress)})
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                   "-p", "minigrad_grade_progress", "--nbval-lax", "--nbval-current-env",
                   f"--nbval-cell-timeout={timeout}", "graded.ipynb"]
        run = subprocess.run(sandbox_command(limit, command), cwd=scratch, env=env, capture_output=True,
                             text=True, timeout=limit + 120)
        outcomes: dict[int, tuple[bool, str]] = {}
        died = None  # nbval reports the cell a kernel died in as timed out, and later ones as dead
        for line in progress.read_text().splitlines():
            record = json.loads(line)
            cell, error = record["cell"], record["error"]
            if error.startswith("timed out"):
                died = cell
            if error == _DEAD:
                if died is not None and outcomes[died][1].startswith("timed out"):
                    outcomes[died] = (False, "the kernel died (a crash, or out of memory)")
                error = "not run: the kernel died before it"
            outcomes[cell] = (record["passed"], error)
    stopped = ""
    if run.returncode in (TIMED_OUT, TOO_MANY_PROCESSES):
        stopped = run.stderr.strip().splitlines()[-1]
    elif not outcomes:
        raise CourseError(f"the graded notebook did not run:\n{run.stdout[-2000:]}{run.stderr[-2000:]}")
    return outcomes, stopped


def _results(exercises: list[Any], roles: list[tuple[int | None, str]], outcomes: dict[int, tuple[bool, str]],
             stopped: str) -> list[ExerciseResult]:
    guard_ok, guard_error = outcomes.get(0, (False, stopped or "did not run"))
    if not guard_ok:
        raise CourseError(f"the grader's guard did not start: {guard_error}")
    missing = f"not finished ({stopped})" if stopped else "not run (the kernel died)"
    results = []
    for exercise in exercises:
        error = ""
        for cell, (number, role) in enumerate(roles):
            if number == exercise.number and not error:
                passed, why = outcomes.get(cell, (False, missing))
                error = "" if passed else f"{'hidden check' if role == 'hidden' else role}: {why}"
        results.append(ExerciseResult(exercise.number, exercise.title, not error, error))
    return results


def grade_against(source: Any, student: Any, name: str, resources: Path | None = None,
                  timeout: int = CELL_TIMEOUT, limit: float = LIMIT, package_root: Path = ROOT) -> GradeReport:
    """Grade the notebook ``student`` against the instructor's notebook ``source`` (both nbformat nodes)."""
    exercises = find_exercises(source, strict=True)
    if not exercises:
        raise CourseError(f"{name}: the instructor's notebook has no exercises")
    graded, roles = assemble(source, student, f"_grader_{secrets.token_hex(6)}")
    outcomes, stopped = run_graded(graded, resources, timeout, limit, package_root)
    return GradeReport(name, _results(exercises, roles, outcomes, stopped), stopped)


def grade(path: str | Path, solution: str | Path | None = None, timeout: int = CELL_TIMEOUT,
          limit: float = LIMIT, package_root: Path = ROOT) -> GradeReport:
    """Grade the student notebook at ``path`` (the file is not changed, nor run in its folder).

    ``solution`` is the instructor's notebook; by default the one of the chapter the notebook's
    metadata names (``solution_notebook``).
    """
    path = Path(path)
    student = read_notebook(path)
    source_path = Path(solution) if solution is not None else solution_notebook(student, path)
    source = read_notebook(source_path)
    resources = source_path.parent.parent if source_path.parent.name == "solutions" else source_path.parent
    return grade_against(source, student, str(path), resources, timeout, limit, package_root)


def verify(path: str | Path, timeout: int = CELL_TIMEOUT, limit: float = LIMIT) -> tuple[bool, GradeReport, GradeReport]:
    """Grade the instructor's notebook at ``path`` and its student version: ``(ok, solved, released)``.

    ``ok`` when the solutions score every exercise and the student version none. Given a student
    version (a notebook without solution markers), its instructor's notebook is verified.
    """
    path = Path(path)
    source = read_notebook(path)
    if BEGIN not in nbformat.writes(source):
        path = solution_notebook(source, path)
        source = read_notebook(path)
    resources = path.parent.parent if path.parent.name == "solutions" else path.parent
    solved = grade_against(source, source, str(path), resources, timeout, limit)
    released = grade_against(source, release_notebook(source), f"{path} (student version)", resources,
                             timeout, limit)
    return solved.score == solved.total and released.score == 0, solved, released


def write_junit(reports: list[GradeReport], path: str | Path) -> None:
    """JUnit XML for a learning-management system: one test suite per notebook, one case per exercise."""
    suites = ET.Element("testsuites", tests=str(sum(r.total for r in reports)),
                        failures=str(sum(r.total - r.score for r in reports)))
    for report in reports:
        suite = ET.SubElement(suites, "testsuite", name=report.notebook, tests=str(report.total),
                              failures=str(report.total - report.score))
        for result in report.results:
            case = ET.SubElement(suite, "testcase", classname=report.notebook,
                                 name=f"exercise {result.number}: {result.title}")
            if not result.passed:
                ET.SubElement(case, "failure", message=result.error).text = result.error
    ET.indent(suites)
    Path(path).write_text(ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n")
