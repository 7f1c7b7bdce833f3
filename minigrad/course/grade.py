"""Grading a notebook: run it top to bottom in a fresh kernel and score each exercise.

The notebook runs the way nbval runs it, one cell after another in one IPython kernel, but an
error does not stop the run (nbclient with ``allow_errors``), and a cell that runs past the time
limit is interrupted and counts as failed. An exercise passes when its solution cell and its check
cell both ran without an error. The kernel runs on the Python that runs the grader (unless a
kernel is named), in the notebook's folder, with this minigrad importable.
"""

from __future__ import annotations

import copy
import os
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import minigrad
from minigrad.course.exercises import CourseError, Exercise, find_exercises, read_notebook
from minigrad.course.release import release_notebook

__all__ = ["ExerciseResult", "GradeReport", "grade", "grade_notebook", "run_notebook", "verify"]


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

    @property
    def score(self) -> int:
        return sum(result.passed for result in self.results)

    @property
    def total(self) -> int:
        return len(self.results)

    def to_dict(self) -> dict[str, Any]:
        return {"notebook": self.notebook, "score": self.score, "total": self.total,
                "exercises": [asdict(result) for result in self.results]}

    def __str__(self) -> str:
        titles = [_clip(result.title, 40) for result in self.results]
        width = max([len("exercise"), *map(len, titles)])
        lines = [self.notebook, f"  {'#':>3}  {'exercise':<{width}}  result"]
        for result, title in zip(self.results, titles):
            row = f"  {result.number:>3}  {title:<{width}}  {'pass' if result.passed else 'FAIL'}"
            lines.append(row if result.passed else f"{row}  {_clip(result.error, 100)}")
        lines.append(f"Score: {self.score}/{self.total}")
        return "\n".join(lines)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _this_python_kernel() -> type:
    """A kernel manager class whose every kernel is IPython on the Python running this process.

    A notebook names its kernel by a spec ("python3", or whatever its author's machine called it);
    resolving that name could start another Python without minigrad, so like nbval's
    ``--nbval-current-env`` the grader ignores it.
    """
    from ipykernel.kernelspec import RESOURCES, get_kernel_dict
    from jupyter_client import AsyncKernelManager
    from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
    from traitlets import default

    class ThisPythonSpecs(KernelSpecManager):
        def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
            return KernelSpec(resource_dir=RESOURCES, **get_kernel_dict())

    class ThisPythonKernel(AsyncKernelManager):
        @default("kernel_spec_manager")
        def _kernel_spec_manager_default(self) -> KernelSpecManager:
            return ThisPythonSpecs()

    return ThisPythonKernel


def _kernel_env() -> dict[str, str]:
    """This environment, with the folder that holds this minigrad first on ``PYTHONPATH``.

    Run as ``python -m minigrad.course`` from a source checkout, minigrad is importable only because
    the current folder is on the path; the kernel starts in the notebook's folder and would lose it.
    """
    env = dict(os.environ)
    root = Path(minigrad.__file__).resolve().parent.parent
    installed = {Path(sysconfig.get_paths()[key]).resolve() for key in ("purelib", "platlib")}
    if root not in installed:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    return env


def _error_line(content: dict[str, Any], elapsed: float, timeout: int) -> str:
    name, value = content.get("ename", "Error"), content.get("evalue", "")
    if name == "KeyboardInterrupt" and elapsed >= timeout:
        return f"timed out after {timeout} s"
    first = value.strip().splitlines()[0] if value.strip() else ""
    return f"{name}: {first}" if first else name


def run_notebook(nb: Any, cwd: str | Path, timeout: int = 60, kernel_name: str | None = None) -> dict[int, str | None]:
    """Execute ``nb`` in place and return, per code cell index, ``None`` if it ran or its error line.

    Errors do not stop the run; a cell that runs longer than ``timeout`` seconds is interrupted.
    Empty cells are not run and not listed. If the kernel dies, the cell it died in and every later
    one are listed as failed.
    """
    from jupyter_client.kernelspec import NoSuchKernel
    from nbclient import NotebookClient
    from nbclient.exceptions import DeadKernelError

    outcomes: dict[int, str | None] = {}
    started: dict[int, float] = {}

    def on_cell_execute(cell: Any, cell_index: int) -> None:
        started[cell_index] = time.monotonic()

    def on_cell_executed(cell: Any, cell_index: int, execute_reply: dict[str, Any]) -> None:
        content = execute_reply.get("content", {})
        elapsed = time.monotonic() - started[cell_index]
        outcomes[cell_index] = None if content.get("status") == "ok" else _error_line(content, elapsed, timeout)

    # IPython's own kernel would warn on stderr, at every start, that it talks to us over TCP.
    kernel: dict[str, Any] = {"kernel_name": kernel_name} if kernel_name else {
        "kernel_manager_class": _this_python_kernel(), "kernel_name": "python3",
        "extra_arguments": ["--IPKernelApp.log_level=ERROR"]}
    client = NotebookClient(
        nb, timeout=timeout, interrupt_on_timeout=True, allow_errors=True, shutdown_kernel="immediate",
        resources={"metadata": {"path": str(cwd)}}, on_cell_execute=on_cell_execute,
        on_cell_executed=on_cell_executed, **kernel)
    try:
        client.execute(**({} if kernel_name else {"env": _kernel_env()}))
    except DeadKernelError:
        pending = [i for i, cell in enumerate(nb.cells)
                   if cell.cell_type == "code" and cell.source.strip() and i not in outcomes]
        for i in pending:
            outcomes[i] = "the kernel died (a crash, or out of memory)" if i == pending[0] else \
                f"not run: the kernel died in cell {pending[0]}"
    except NoSuchKernel as error:
        raise CourseError(f"no Jupyter kernel named {kernel_name!r}") from error
    except RuntimeError as error:  # the kernel did not start or answer
        raise CourseError(f"cannot run the notebook: {error}") from error
    return outcomes


def _result(exercise: Exercise, outcomes: dict[int, str | None]) -> ExerciseResult:
    number, title = exercise.number, exercise.title
    if not exercise.solution_cells:
        return ExerciseResult(number, title, False, "the solution cell is missing")
    if not exercise.check_cells:
        return ExerciseResult(number, title, False, "the check cell is missing")
    for role, cells in (("solution", exercise.solution_cells), ("check", exercise.check_cells)):
        for index in cells:
            if outcomes.get(index):
                return ExerciseResult(number, title, False, f"{role}: {outcomes[index]}")
    return ExerciseResult(number, title, True)


def grade_notebook(nb: Any, cwd: str | Path, name: str = "notebook", timeout: int = 60,
                   kernel_name: str | None = None) -> GradeReport:
    """Run notebook ``nb`` (a copy) with ``cwd`` as its folder and score its exercises."""
    exercises = find_exercises(nb, strict=False)
    if not exercises:
        raise CourseError(f"{name}: no exercises found (a code cell starting '# Exercise N: title', "
                          "see chapters/README.md)")
    outcomes = run_notebook(copy.deepcopy(nb), cwd, timeout, kernel_name)
    return GradeReport(name, [_result(exercise, outcomes) for exercise in exercises])


def grade(path: str | Path, timeout: int = 60, kernel_name: str | None = None) -> GradeReport:
    """Run the notebook at ``path`` in its folder and score its exercises (the file is not changed)."""
    path = Path(path)
    return grade_notebook(read_notebook(path), path.parent, str(path), timeout, kernel_name)


def verify(path: str | Path, timeout: int = 60, kernel_name: str | None = None) -> tuple[bool, GradeReport, GradeReport]:
    """Grade the solution notebook at ``path`` and its student version: ``(ok, solved, released)``.

    ``ok`` when the solutions score every exercise and the student version none. Both run in the
    notebook's folder, so relative paths in the notebook work for both.
    """
    path = Path(path)
    nb = read_notebook(path)
    solved = grade_notebook(nb, path.parent, str(path), timeout, kernel_name)
    released = grade_notebook(release_notebook(nb), path.parent, f"{path} (student version)", timeout, kernel_name)
    return solved.score == solved.total and released.score == 0, solved, released
