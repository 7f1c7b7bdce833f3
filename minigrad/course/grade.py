"""Grading a notebook: each exercise in a confined process of its own, judged by checks in another process.

``grade`` never runs the student's notebook as it is, and never runs the instructor's checks where
the student's code ran. From the instructor's notebook and the student's it builds, per exercise,
a program for the student's side (``minigrad.course.runner``): the instructor's setup cells, the
student's solution cell, and the probes of that exercise's checks, which compute what the checks
read through ``answer(...)`` (``minigrad.course.checks``). That program runs under
``minigrad.course.sandbox`` (its own scratch folder, a copy of the package in which the library
functions the exercise re-implements have no body, a wall-clock limit, bounds on processes,
memory and output, an unprivileged user and Landlock), and sends its answers as plain data on a
pipe (``minigrad.course.answers``). Then one checker process (``minigrad.course.checker``), which
no student code ever ran in, runs the setup and every check and hidden check on the decoded
answers. An exercise passes when its check and hidden checks pass there; a crash, an exit, a hang
or a fork bomb fails that exercise alone, with the supervisor's own account of how it ended.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import nbformat

import minigrad
from minigrad.course.answers import MAX_ANSWER_BYTES, AnswerError, read_messages
from minigrad.course.checks import RECEIVED, SEND, checked, misuses, probe, student_names
from minigrad.course.exercises import BEGIN, METADATA_KEY, CourseError, Exercise, find_exercises, read_notebook
from minigrad.course.release import release_notebook
from minigrad.course.sandbox import (
    MEMORY, OUTPUT, SYSTEM_PATHS, Confinement, ConfinementError, confinement, sandbox_command,
)

__all__ = ["ExerciseResult", "GradeReport", "grade", "grade_against", "run_confined", "solution_notebook", "student_env",
           "verify", "write_junit"]

ROOT = Path(minigrad.__file__).resolve().parent.parent
COURSE = Path(__file__).resolve().parent
CELL_TIMEOUT, LIMIT = 60, 300  # seconds: one exercise's student process, and the whole grading
WORKERS = min(4, os.cpu_count() or 1)  # exercises graded at a time (each mostly waits on its process)
# The student's process gets only this of the course tools: what a check cell imports.
STUDENT_COURSE = '''"""What the grader's student process has of minigrad.course: answer() (see minigrad/course/answers.py)."""

from minigrad.course.answers import answer

__all__ = ["answer"]
'''
PUBLIC_CHECKS = ".checks"  # chapters/<chapter>/.checks/: the student release's pristine public checks


@dataclass
class ExerciseResult:
    """The outcome of one exercise; ``error`` is the first line of its first failure, empty if it passed."""

    number: int
    title: str
    passed: bool
    error: str = ""
    seconds: float = 0.0  # how long its student process ran


@dataclass
class GradeReport:
    """Every exercise's result for one notebook, with the score table ``str()`` prints."""

    notebook: str
    results: list[ExerciseResult]
    stopped: str = ""  # why the run ended early ("the 300 s limit passed"), if it did
    confinement: str = ""  # how the student's code ran (user, Landlock)

    @property
    def score(self) -> int:
        return sum(result.passed for result in self.results)

    @property
    def total(self) -> int:
        return len(self.results)

    def to_dict(self) -> dict[str, Any]:
        return {"notebook": self.notebook, "score": self.score, "total": self.total, "stopped": self.stopped,
                "confinement": self.confinement, "exercises": [asdict(result) for result in self.results]}

    def __str__(self) -> str:
        titles = [_clip(result.title, 40) for result in self.results]
        width = max([len("exercise"), *map(len, titles)])
        lines = [self.notebook, f"  {'#':>3}  {'exercise':<{width}}  result"]
        for result, title in zip(self.results, titles):
            row = f"  {result.number:>3}  {title:<{width}}  {'pass' if result.passed else 'FAIL'}"
            lines.append(row if result.passed else f"{row}  {_clip(result.error, 100)}")
        if self.stopped:
            lines.append(f"The run was stopped ({self.stopped}); the exercises it did not reach fail.")
        lines.append(f"Score: {self.score}/{self.total}")
        if self.confinement:  # never silent about whom the student's code ran as
            lines.append(f"({self.confinement})")
        return "\n".join(lines)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def solution_notebook(nb: Any, path: Path) -> Path:
    """The instructor's source of a student notebook: ``chapters/<chapter>/solutions/<name>``.

    The chapter comes from the notebook's metadata (``release`` copies it from the source), so a
    student may rename or move their notebook. In a student repository, which has no solutions,
    it is the public checks the release ships (``chapters/<chapter>/.checks/``): self-grading.
    """
    chapter = nb.metadata.get(METADATA_KEY, {}).get("chapter")
    if not chapter:
        raise CourseError(f"{path}: the notebook does not say which chapter it belongs to "
                          "(metadata minigrad.chapter); pass the instructor's notebook with --solution")
    for folder in ("solutions", PUBLIC_CHECKS):
        for name in (path.name, "exercises.ipynb"):
            source = ROOT / "chapters" / chapter / folder / name
            if source.exists():
                return source
    raise CourseError(f"{path}: no instructor notebook for chapter {chapter!r} at "
                      f"{ROOT / 'chapters' / chapter / 'solutions' / 'exercises.ipynb'}, nor public checks at "
                      f"{ROOT / 'chapters' / chapter / PUBLIC_CHECKS / 'exercises.ipynb'}")


@dataclass
class _Plan:
    """What each side runs per exercise: the same setup cells, then the solution and probes, or the checks."""

    exercises: list[Exercise]
    student: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    checker: dict[int, list[dict[str, Any]]] = field(default_factory=dict)


def _plan(source: Any, student: Any) -> _Plan:
    exercises = find_exercises(source, strict=True)
    answers = {e.number: e.solution_cells for e in find_exercises(student, strict=False)}
    role_of = {index: (e.number, role) for e in exercises
               for role, cells in (("solution", e.solution_cells), ("check", e.check_cells),
                                   ("hidden", e.hidden_cells)) for index in cells}
    plan = _Plan(exercises)
    for e in exercises:
        names = student_names(source.cells[e.solution_cells[0]].source)
        for index in e.check_cells + e.hidden_cells:
            text = source.cells[index].source
            if bad := misuses(text, names):
                raise CourseError(f"cell {index} (a check of exercise {e.number}) reads {', '.join(sorted(bad))} "
                                  "outside answer(...): a check reads the student's code only through answer(expr)")
            if probe(text) is None:
                raise CourseError(f"cell {index} (a check of exercise {e.number}) reads no answer(...): it cannot "
                                  "tell a right solution from a wrong one")
    for e in exercises:  # both sides run the setup cells before the exercise's last check, in order
        last, steps, checks = max(e.check_cells + e.hidden_cells), [], []
        for index, cell in enumerate(source.cells[: last + 1]):
            if cell.cell_type != "code" or not cell.source.strip():
                continue
            number, role = role_of.get(index, (None, "setup"))
            if role == "setup":
                steps.append({"cell": index, "role": role, "exercise": None, "source": cell.source})
                checks.append(steps[-1])
            elif number == e.number and role == "solution":
                text = "\n\n".join(student.cells[i].source for i in answers.get(number, [])) or \
                    f'raise NotImplementedError("exercise {number}: the solution cell is missing")'
                steps.append({"cell": index, "role": role, "exercise": number, "source": text})
            elif number == e.number:
                steps.append({"cell": index, "role": role, "exercise": number, "source": probe(cell.source)})
                checks.append({**steps[-1], "source": checked(cell.source)})
        plan.student[e.number], plan.checker[e.number] = steps, checks
    return plan


def _strip_reference(package: Path, qualname: str, number: int) -> None:
    """Replace the body of the function ``qualname`` in the package copy under ``package`` by a ``raise``."""
    parts = qualname.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        base = package.joinpath(*parts[:cut])
        path = base.with_suffix(".py") if base.with_suffix(".py").exists() else base / "__init__.py"
        if path.exists():
            break
    else:
        raise CourseError(f"exercise {number} forbids {qualname}, which is not in the package")
    text = path.read_text()
    node: Any = ast.parse(text)
    for name in parts[cut:]:
        node = next((n for n in getattr(node, "body", []) if isinstance(n, (ast.FunctionDef, ast.ClassDef))
                     and n.name == name), None)
        if node is None:
            raise CourseError(f"exercise {number} forbids {qualname}, which is not in {path.name}")
    if not isinstance(node, ast.FunctionDef):
        raise CourseError(f"exercise {number} forbids {qualname}, which is not a function")
    lines = text.splitlines(keepends=True)
    first = node.body[0]
    message = f"exercise {number} asks you to write this yourself: the solution may not call {qualname}"
    keep = lines[first.lineno - 1][: first.col_offset] if first.lineno == node.lineno else " " * first.col_offset
    lines[first.lineno - 1: node.end_lineno] = [f"{keep}raise ReferenceCalled({message!r})\n"]
    path.write_text("".join(lines))


def _copy_resources(folder: Path | None, scratch: Path) -> None:
    """The chapter's data files and scripts (not its notebooks, not the solutions) into ``scratch``."""
    if folder is None:
        return
    for path in folder.iterdir():
        if path.name.startswith(".") or path.name in ("solutions", "__pycache__") or path.suffix == ".ipynb":
            continue
        if path.is_dir():
            shutil.copytree(path, scratch / path.name, ignore=shutil.ignore_patterns(".*", "__pycache__"))
        else:
            shutil.copy(path, scratch / path.name)


def _readable_paths(hidden: list[Path]) -> list[str]:
    """The interpreter's folders and the grader's import path, less any that is or holds one of ``hidden``.

    A folder the interpreter cannot do without (its prefix, the system's) that holds one of
    ``hidden`` makes grading refuse: the student's code would read what it must not.
    """
    prefix = Path(sys.prefix).resolve()
    needed = [Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, Path(sys.executable).parent)]
    needed += [Path(p) for p in SYSTEM_PATHS]
    for folder in needed:
        if blocked := [h for h in hidden if h.is_relative_to(folder) and not h.is_relative_to(prefix)]:
            raise CourseError(f"the student's code must read {folder} to run Python, and {blocked[0]} lies inside "
                              "it: move the course (or the interpreter) so that neither holds the other")
    optional = [Path(p).resolve() for p in sys.path if p and Path(p).is_dir()]
    keep = [p for p in optional if p.is_relative_to(prefix)
            or not any(p.is_relative_to(h) or h.is_relative_to(p) for h in hidden)]
    return sorted({*map(str, needed), *map(str, keep)})


@dataclass
class _Run:
    """What the student's process of one exercise sent, and how it ended (the supervisor's word)."""

    answers: dict[int, dict[str, Any]]
    errors: dict[str, str]  # "setup" / "solution" -> the first error there
    ended: str              # "" when it finished and said so
    seconds: float


def _read_pipe(fd: int, sink: list[bytes]) -> None:
    total = 0
    with os.fdopen(fd, "rb") as pipe:
        while chunk := pipe.read(65536):
            total += len(chunk)
            if total <= MAX_ANSWER_BYTES:
                sink.append(chunk)
            elif sink[-1:] != [b""]:
                sink.append(b"")  # over the bound: the rest is read and dropped, so the writer never blocks


def student_env(folder: Path, path: Path) -> dict[str, str]:
    """The whole environment of a student's process: its folder as home and temp, ``path`` to import from."""
    return {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin", "HOME": str(folder),
            "TMPDIR": str(folder / "tmp"), "MPLCONFIGDIR": str(folder / "tmp"), "MPLBACKEND": "Agg",
            "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(path), "LANG": "C.UTF-8",
            "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def run_confined(command: list[str], folder: Path, env: dict[str, str], limit: float, how: Confinement,
                 hidden: list[Path], stdin: bytes = b"", pass_fds: tuple[int, ...] = (), memory: int = MEMORY,
                 output: int = OUTPUT, tcp: bool = False, shm: bool = False) -> tuple[int, str]:
    """Run the student's ``command`` in ``folder`` under the sandbox's supervisor: ``(status, how it ended)``.

    ``folder`` (made the student's) is all it may write; ``hidden`` folders it may not read even
    where the grader's import path leads into them; ``pass_fds`` are closed here once passed on.
    Its output goes to ``folder/output.log``; ``tcp`` lets it open TCP connections and ``shm`` write
    /dev/shm (MPI and multiprocessing need them).
    """
    (folder / "tmp").mkdir(exist_ok=True)
    if how.uid is not None:
        for path in [folder, *folder.rglob("*")]:
            os.chown(path, how.uid, how.uid, follow_symlinks=False)
    config = {"command": command, "cwd": str(folder), "env": env, "limit": limit, "memory": memory, "output": output,
              "uid": how.uid, "drop_capabilities": how.drop_capabilities, "landlock": how.landlock, "tcp": tcp,
              "read": _readable_paths(hidden), "write": [str(folder), *(["/dev/shm"] if shm else [])], "log": str(folder / "output.log"),
              "pass_fds": list(pass_fds)}
    supervisor = subprocess.Popen(sandbox_command(config), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, pass_fds=pass_fds)
    for fd in pass_fds:
        os.close(fd)
    # (communicate ignores a broken pipe: a process that ended before reading its stdin; the supervisor says why)
    _, stderr = supervisor.communicate(stdin, timeout=limit + 60)
    return supervisor.returncode, (stderr.decode(errors="replace").strip().splitlines() or ["the supervisor said nothing"])[-1]


def _run_student(exercise: Exercise, steps: list[dict[str, Any]], package_root: Path, resources: Path | None,
                 scratch: Path, how: Confinement, timeout: float, hidden: list[Path]) -> _Run:
    folder = scratch / f"exercise-{exercise.number}"
    (folder / "tmp").mkdir(parents=True)
    _copy_resources(resources, folder)
    package = folder / "package"
    shutil.copytree(package_root / "minigrad", package / "minigrad",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "course"))
    (package / "minigrad" / "course").mkdir()
    shutil.copy(COURSE / "answers.py", package / "minigrad" / "course" / "answers.py")
    (package / "minigrad" / "course" / "__init__.py").write_text(STUDENT_COURSE)
    for qualname in exercise.forbid:
        _strip_reference(package, qualname, exercise.number)
    (folder / ".grader").mkdir()
    for name in ("runner.py", "answers.py"):
        shutil.copy(COURSE / name, folder / ".grader" / name)
    read_end, write_end = os.pipe()
    chunks: list[bytes] = []
    reader = threading.Thread(target=_read_pipe, args=(read_end, chunks), daemon=True)
    reader.start()
    program = {"fd": write_end, "path": str(package), "send": SEND, "steps": steps}
    started = time.monotonic()
    _, ended = run_confined([sys.executable, str(folder / ".grader" / "runner.py")], folder, student_env(folder, package),
                            timeout, how, hidden, json.dumps(program).encode(), (write_end,))
    reader.join(timeout=10)
    seconds = time.monotonic() - started
    answers: dict[int, dict[str, Any]] = {}
    errors: dict[str, str] = {}
    done = False
    try:
        if chunks[-1:] == [b""]:
            raise AnswerError(f"the answers came to more than {MAX_ANSWER_BYTES // 2**20} MiB")
        for message in read_messages(b"".join(chunks)):
            kind, value = next(iter(message.items()))
            if kind == "done":
                done = True
            elif kind in ("answer", "error") and isinstance(value, dict) and isinstance(value.get("cell"), int):
                sent = answers.setdefault(value["cell"], {"values": [], "error": ""})
                if kind == "answer":
                    sent["values"].append(value.get("value"))
                else:
                    sent["error"] = sent["error"] or str(value.get("message", ""))[:500]
                    role = str(value.get("role", ""))
                    if role in ("setup", "solution"):
                        errors.setdefault(role, sent["error"])
    except AnswerError as error:
        return _Run({}, {"solution": str(error)}, "", seconds)
    if ended == "finished" and not done:
        ended = "the student's process ended before it finished (os._exit?)"
    elif ended.startswith("exited") and not done:
        ended = f"the student's process {ended} before it finished"
    elif ended == "finished" or ended.startswith("exited"):
        ended = ""
    return _Run(answers, errors, ended, seconds)


def _run_checker(plan: _Plan, runs: dict[int, _Run], resources: Path | None, scratch: Path,
                 limit: float) -> dict[int, tuple[bool, str]]:
    """Every exercise's checks on its answers, in one process that runs instructor code only."""
    folder = scratch / "checker"
    (folder / ".grader").mkdir(parents=True)
    _copy_resources(resources, folder)
    for name in ("checker.py", "runner.py", "answers.py"):
        shutil.copy(COURSE / name, folder / ".grader" / name)
    exercises = []
    for number, steps in plan.checker.items():
        if number in runs:
            sent = runs[number].answers
            exercises.append({"number": number, "steps": [{**step, "answers": sent.get(step["cell"], {})
                                                            if step["role"] != "setup" else {}} for step in steps]})
    read_end, write_end = os.pipe()
    env = {**os.environ, "HOME": str(folder), "MPLBACKEND": "Agg", "PYTHONHASHSEED": "0",
           "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, str(folder / ".grader" / "checker.py")], cwd=folder, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            pass_fds=[write_end])
    os.close(write_end)
    chunks: list[bytes] = []
    reader = threading.Thread(target=_read_pipe, args=(read_end, chunks), daemon=True)
    reader.start()
    program = {"fd": write_end, "received": RECEIVED, "exercises": exercises}
    try:
        _, stderr = proc.communicate(json.dumps(program).encode(), timeout=limit)
    except subprocess.TimeoutExpired as error:
        proc.kill()
        raise CourseError(f"the instructor's checks did not finish in {limit:g} s") from error
    reader.join(timeout=10)
    verdicts = {}
    for message in read_messages(b"".join(chunks)):
        if "setup_failed" in message:
            failed = message["setup_failed"]
            raise CourseError(f"the instructor's setup cell {failed['cell']} failed in the checker: {failed['error']}")
        verdict = message["verdict"]
        verdicts[verdict["cell"]] = (verdict["passed"], verdict["error"])
    if proc.returncode != 0 and not verdicts:
        raise CourseError(f"the checker did not run: {stderr.decode(errors='replace')[-2000:]}")
    return verdicts


def _result(exercise: Exercise, run: _Run | None, verdicts: dict[int, tuple[bool, str]], stopped: str) -> ExerciseResult:
    if run is None:
        return ExerciseResult(exercise.number, exercise.title, False, f"not run ({stopped})")
    error = run.ended or (f"setup: {run.errors['setup']}" if "setup" in run.errors else "") or \
        (f"solution: {run.errors['solution']}" if "solution" in run.errors else "")
    for index in exercise.check_cells + exercise.hidden_cells:
        passed, why = verdicts.get(index, (False, "the checker did not reach it"))
        if not error and not passed:
            error = f"{'hidden check' if index in exercise.hidden_cells else 'check'}: {why}"
    return ExerciseResult(exercise.number, exercise.title, not error, error, round(run.seconds, 2))


def grade_against(source: Any, student: Any, name: str, resources: Path | None = None,
                  timeout: int = CELL_TIMEOUT, limit: float = LIMIT, package_root: Path = ROOT,
                  secrets: list[Path] | None = None, workers: int = WORKERS) -> GradeReport:
    """Grade the notebook ``student`` against the instructor's notebook ``source`` (both nbformat nodes).

    ``timeout`` bounds each exercise's student process, ``limit`` the whole grading; ``package_root``
    holds the ``minigrad`` the student's code runs with (a student's repository); ``secrets`` are the
    files the student's code must not be able to read (``grade`` passes the solutions notebook);
    ``workers`` exercises run at a time.
    """
    plan = _plan(source, student)
    if not plan.exercises:
        raise CourseError(f"{name}: the instructor's notebook has no exercises")
    secrets = secrets or []
    try:
        how = confinement(secrets)
    except ConfinementError as error:
        raise CourseError(f"cannot grade {name} safely: {error}") from error
    hidden = [ROOT.resolve(), package_root.resolve(), *(p.resolve().parent for p in secrets)]
    started, runs, late = time.monotonic(), {}, []

    def run(exercise: Exercise) -> None:
        left = limit - (time.monotonic() - started)
        if left < 1:
            late.append(exercise.number)
            return
        runs[exercise.number] = _run_student(exercise, plan.student[exercise.number], package_root, resources,
                                             scratch, how, min(timeout, left), hidden)

    with tempfile.TemporaryDirectory(prefix="minigrad-grade-") as scratch_name:
        scratch = Path(scratch_name)
        scratch.chmod(0o711)  # the unprivileged user may enter its own folder below, not list the others
        with ThreadPoolExecutor(max(1, workers)) as pool:  # each run waits on its own process tree
            list(pool.map(run, plan.exercises))
        stopped = f"the {limit:g} s limit passed" if late else ""
        verdicts = _run_checker(plan, runs, resources, scratch, max(limit, 60))
    results = [_result(e, runs.get(e.number), verdicts, stopped) for e in plan.exercises]
    return GradeReport(name, results, stopped, how.describe())


def grade(path: str | Path, solution: str | Path | None = None, timeout: int = CELL_TIMEOUT,
          limit: float = LIMIT, package_root: Path = ROOT) -> GradeReport:
    """Grade the student notebook at ``path`` (the file is not changed, nor run in its folder).

    ``solution`` is the instructor's notebook; by default the one of the chapter the notebook's
    metadata names (``solution_notebook``), or in a student repository its public checks.
    """
    path = Path(path)
    student = read_notebook(path)
    source_path = Path(solution) if solution is not None else solution_notebook(student, path)
    source = read_notebook(source_path)
    resources = source_path.parent.parent if source_path.parent.name in ("solutions", PUBLIC_CHECKS) else source_path.parent
    secrets = [] if source_path.parent.name == PUBLIC_CHECKS else [source_path.resolve()]
    return grade_against(source, student, str(path), resources, timeout, limit, package_root, secrets)


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
    secrets = [path.resolve()]
    solved = grade_against(source, source, str(path), resources, timeout, limit, secrets=secrets)
    released = grade_against(source, release_notebook(source), f"{path} (student version)", resources,
                             timeout, limit, secrets=secrets)
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
