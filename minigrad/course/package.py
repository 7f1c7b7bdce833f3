"""One source, two builds: the package regions a student writes, and the student repository.

A region is a block of the package source between two comment lines, at the block's indentation::

    def topological_order(roots):
        "the docstring stays"
        ### BEGIN SOLUTION chapter 01: topological order
        ...the body a student writes...
        ### END SOLUTION

``strip_regions`` replaces each region with ``raise NotImplementedError("chapter 01: topological
order")``; ``release_package`` writes the student repository (the package stripped, the lesson
notebooks, the student exercise notebooks with a pristine copy of their public checks in
``chapters/*/.checks/`` for self-grading, the student tests, the benchmarks (lessons import them), docs,
Makefile, pyproject, and the students' README, ``student_README.md``) as a git repository with one
commit, ready to clone; with
``upto=k`` the regions of chapters 1..k stay written, which is what a student has done after
chapter k. ``CHAPTER_TESTS`` and ``CHAPTER_LESSONS`` say which tests and lesson notebooks check
which chapter; ``check_chapter(k)`` runs them in a release with chapters 1..k written, so a hole
of a later chapter can never break an earlier one.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from minigrad.course.exercises import CourseError
from minigrad.course.grade import PUBLIC_CHECKS, ExerciseResult, GradeReport, grade, run_confined, student_env
from minigrad.course.release import ship
from minigrad.course.sandbox import confinement

__all__ = ["CHAPTER_LESSONS", "CHAPTER_TESTS", "Region", "check_chapter", "find_regions", "find_stubs", "grade_repository",
           "release_package", "strip_regions"]

ROOT = Path(__file__).resolve().parent.parent.parent
_BEGIN = re.compile(r"^(\s*)### BEGIN SOLUTION chapter (\d\d): (.+?)\s*$")
_END = re.compile(r"^\s*### END SOLUTION\s*$")

# The tests that check each chapter's regions (run with chapters 1..k written, later ones empty).
CHAPTER_TESTS: dict[int, list[str]] = {
    1: ["tests/test_chapter01.py", "tests/test_pipeline.py", "tests/test_graph_ir.py"],
    2: ["tests/test_chapter02.py", "tests/test_engine.py", "tests/test_broadcasting.py", "tests/test_gradcheck.py",
        "tests/test_optim.py", "tests/test_nn_module.py", "tests/test_softmax.py", "tests/test_serialization.py",
        "tests/test_dataloader.py"],
    3: ["tests/test_chapter03.py", "tests/test_passes.py", "tests/test_fusion.py", "tests/test_checkpoint.py",
        "tests/test_amp.py", "tests/test_memory.py"],
    4: ["tests/test_distributed.py"],
}
# The lesson notebooks each check runs. Chapter 01's lessons after the first build models and call
# backward, which is chapter 02's machinery (Module's parameter registration, the engine): they
# run in chapter 02's check, once both chapters are written.
CHAPTER_LESSONS: dict[int, list[str]] = {
    1: ["chapters/01_graphs/01_*.ipynb"],
    2: ["chapters/01_graphs/0[2-9]_*.ipynb", "chapters/02_backprop/0*.ipynb"],
    3: ["chapters/03_optimization/[0-9][0-9]_*.ipynb"],
    4: ["chapters/04_distributed/[0-9][0-9]_*.ipynb"],
}
# What the student repository holds besides the package (the solutions never leave). Its README is
# the students' own (how to clone, set up, test a chapter and grade themselves), not this project's.
_FILES = ["Makefile", ".gitignore", "pyproject.toml", "chapters", "benchmarks", "docs"]
STUDENT_README = Path(__file__).resolve().parent / "student_README.md"
# The mutant catalog quotes the regions' solutions: it never ships, nor sits where graded code can read it.
INSTRUCTOR_ONLY = ("mutants.py", "mutate.py")
_TEST_SUPPORT = ["tests/conftest.py", "tests/helpers.py", "tests/op_table.py", "tests/fake_cupy.py", "tests/distributed"]


@dataclass
class Region:
    """One region: where it is, whose chapter, its title and its length in lines (markers excluded)."""

    path: Path
    begin: int  # 1-based line of the BEGIN marker
    chapter: int
    title: str
    lines: int

    @property
    def tag(self) -> str:
        return f"chapter {self.chapter:02d}: {self.title}"


def _scan(path: Path, text: str) -> list[Region]:
    regions, open_at = [], None
    for lineno, line in enumerate(text.splitlines(), 1):
        if match := _BEGIN.match(line):
            if open_at is not None:
                raise CourseError(f"{path}:{lineno}: a region begins inside the region of line {open_at[0]}")
            open_at = (lineno, int(match[2]), match[3])
        elif _END.match(line):
            if open_at is None:
                raise CourseError(f"{path}:{lineno}: '### END SOLUTION' without a region")
            regions.append(Region(path, open_at[0], open_at[1], open_at[2], lineno - open_at[0] - 1))
            open_at = None
        elif "### BEGIN SOLUTION" in line:
            raise CourseError(f"{path}:{lineno}: a package region needs 'chapter NN: title' after the marker")
    if open_at is not None:
        raise CourseError(f"{path}:{open_at[0]}: the region is never closed")
    return regions


def find_regions(package: Path | None = None) -> list[Region]:
    """Every region of the package's ``.py`` files, in file and line order."""
    package = package or ROOT / "minigrad"
    return [region for path in sorted(package.rglob("*.py")) if "course" not in path.relative_to(package).parts
            for region in _scan(path, path.read_text())]


_STUB = re.compile(r'^\s*raise NotImplementedError\("chapter (\d\d): (.+)"\)\s*$')


def find_stubs(package: Path | None = None) -> list[Region]:
    """The regions still to write in a student repository (its ``raise NotImplementedError("chapter
    NN: title")`` lines; ``lines`` is 0), in file and line order."""
    package = package or ROOT / "minigrad"
    return [Region(path, lineno, int(match[1]), match[2], 0)
            for path in sorted(package.rglob("*.py")) if "course" not in path.relative_to(package).parts
            for lineno, line in enumerate(path.read_text().splitlines(), 1) if (match := _STUB.match(line))]


def strip_regions(text: str, upto: int = 0, path: Path = Path("<source>")) -> str:
    """``text`` with every region of a chapter after ``upto`` replaced by ``raise NotImplementedError``.

    Regions of chapters ``<= upto`` keep their body; every marker line goes.
    """
    _scan(path, text)  # refuses unpaired or untagged markers
    out, skipping = [], False
    for line in text.splitlines(keepends=True):
        if match := _BEGIN.match(line):
            skipping = int(match[2]) > upto
            if skipping:
                tag = f"chapter {int(match[2]):02d}: {match[3]}"
                out.append(f'{match[1]}raise NotImplementedError("{tag}")\n')
        elif _END.match(line):
            skipping = False
        elif not skipping:
            out.append(line)
    return "".join(out)


def release_package(dest: str | Path, upto: int = 0, root: Path = ROOT, git: bool = True) -> list[Region]:
    """Write the student repository to ``dest`` (regions of chapters after ``upto`` empty); returns the regions.

    With ``git`` (the default) ``dest`` becomes a git repository holding everything in one commit,
    which the instructor pushes where the students clone it from.
    """
    dest = Path(dest)
    if git and shutil.which("git") is None:
        raise CourseError("git is not installed: the student repository is a git repository (install git, "
                          "or pass --no-git to write the files only)")
    if dest.resolve().is_relative_to(root.resolve()):
        raise CourseError(f"{dest}: the student repository may not lie inside the source {root}")
    if dest.exists() and any(dest.iterdir()):
        raise CourseError(f"{dest}: not empty")
    dest.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns(".*", "__pycache__", "*.egg-info", "solutions", "fixtures")
    for name in _FILES:
        source = root / name
        if source.is_dir():
            shutil.copytree(source, dest / name, ignore=ignore)
        elif source.exists():
            shutil.copy(source, dest / name)
    shutil.copy(STUDENT_README, dest / "README.md")
    _copy_tests(root, dest, sorted(CHAPTER_TESTS))
    regions = find_regions(root / "minigrad")
    for path in sorted((root / "minigrad").rglob("*.py")):
        relative = path.relative_to(root)
        if "__pycache__" in relative.parts or (relative.parent.parts == ("minigrad", "course")
                                               and path.name in INSTRUCTOR_ONLY):
            continue
        target = dest / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        text = path.read_text()  # (the course tools themselves talk about markers: copied as they are)
        target.write_text(text if relative.parts[:2] == ("minigrad", "course") else strip_regions(text, upto, relative))
    for path in (root / "minigrad").rglob("*"):
        if path.is_file() and path.suffix != ".py" and "__pycache__" not in path.parts:
            target = dest / path.relative_to(root)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, target)
    if any((root / "chapters").glob("*/solutions/*.ipynb")):
        stale = ship(root / "chapters", check=True)
        if stale:
            raise CourseError(f"the shipped student notebooks are out of date: {', '.join(map(str, stale))}")
        # Self-grading: a pristine copy of each student notebook's public checks, which `grade` uses
        # where there are no solutions (the hidden checks stay with the instructor).
        for notebook in sorted((root / "chapters").glob("*/solutions/*.ipynb")):
            shipped = notebook.parent.parent / notebook.name
            target = dest / "chapters" / shipped.parent.name / PUBLIC_CHECKS / notebook.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(shipped, target)
    if git:
        _commit(dest, upto)
    return regions


def _commit(dest: Path, upto: int) -> None:
    """Make ``dest`` a git repository whose one commit holds every file of the release."""
    # The instructor's identity when git has one; otherwise the course's, so that a machine
    # without user.name still releases (git refuses to commit without an author).
    env = {**os.environ}
    for key, value in (("user.name", "minigrad course"), ("user.email", "course@minigrad.invalid")):
        if subprocess.run(["git", "config", key], cwd=dest, capture_output=True).returncode != 0:
            env[f"GIT_AUTHOR_{key[5:].upper()}"] = env[f"GIT_COMMITTER_{key[5:].upper()}"] = value
    written = f"chapters 1..{upto} written" if upto else "every region to write"
    for command in (["git", "init", "-q", "-b", "main"], ["git", "add", "-A"],
                    ["git", "commit", "-q", "-m", f"minigrad student repository ({written})"]):
        run = subprocess.run(command, cwd=dest, env=env, capture_output=True, text=True)
        if run.returncode != 0:
            raise CourseError(f"{dest}: `{' '.join(command)}` failed: {run.stderr.strip()}")


def _copy_tests(root: Path, dest: Path, chapters: list[int]) -> None:
    """The instructor's tests of ``chapters`` and the files they import, from ``root`` to ``dest``."""
    for name in _TEST_SUPPORT + sorted({t for k in chapters for t in CHAPTER_TESTS[k]}):
        source, target = root / name, dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        elif source.exists():
            shutil.copy(source, target)


def check_chapter(chapter: int, root: Path = ROOT, extra: list[str] | None = None) -> int:
    """Run chapter ``chapter``'s tests and lessons in a student repository with chapters 1..chapter written.

    The chapter's solved exercises (``solutions/exercises.ipynb``) run there too, under nbval: a
    student who has written chapters 1..k can do chapter k's exercises. Returns pytest's exit
    status (0 when they pass).
    """
    if chapter not in CHAPTER_TESTS:
        raise CourseError(f"no chapter {chapter}: the chapters are {sorted(CHAPTER_TESTS)}")
    with tempfile.TemporaryDirectory(prefix=f"minigrad-chapter-{chapter}-") as scratch:
        repo = Path(scratch) / "repo"
        release_package(repo, upto=chapter, root=root, git=False)
        lessons = sorted(str(p.relative_to(repo)) for pattern in CHAPTER_LESSONS[chapter] for p in repo.glob(pattern))
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "--nbval",
                   *CHAPTER_TESTS[chapter], *lessons, *_solved_exercises(chapter, root, repo), *(extra or [])]
        return subprocess.run(command, cwd=Path(scratch) / "repo",
                              env={**_env(), "PYTHONPATH": str(Path(scratch) / "repo")}).returncode


def _solved_exercises(chapter: int, root: Path, repo: Path) -> list[str]:
    """Copy chapter ``chapter``'s solved exercise notebooks into the student repository ``repo``
    (where they never ship) and return their paths in it."""
    paths = []
    for source in sorted(root.glob(f"chapters/{chapter:02d}_*/solutions/*.ipynb")):
        target = repo / source.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, target)
        paths.append(str(target.relative_to(repo)))
    return paths


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def grade_repository(repo: str | Path, chapters: list[int] | None = None, limit: float = 600,
                     notebooks: bool = True, root: Path = ROOT) -> list[GradeReport]:
    """Grade a student's repository: per chapter, the instructor's tests against the student's package.

    The student's ``minigrad`` (their ``minigrad/course`` is replaced by the instructor's) and the
    instructor's tests of each chapter run in a scratch folder under the sandbox; a chapter passes
    when all of its tests pass. Then every ``chapters/*/exercises.ipynb`` of the repository is
    graded against the instructor's solutions, with the student's package in the kernel (unless
    ``notebooks`` is false). Returns one ``GradeReport`` for the package and one per notebook.
    """

    repo = Path(repo)
    if not (repo / "minigrad" / "__init__.py").exists():
        raise CourseError(f"{repo}: not a student repository (no minigrad/__init__.py)")
    chapters = chapters or sorted(CHAPTER_TESTS)
    with tempfile.TemporaryDirectory(prefix="minigrad-grade-repo-") as scratch_name:
        scratch = Path(scratch_name)
        shutil.copytree(repo / "minigrad", scratch / "minigrad",
                        ignore=shutil.ignore_patterns("__pycache__", "course"))
        shutil.copytree(root / "minigrad" / "course", scratch / "minigrad" / "course",
                        ignore=shutil.ignore_patterns("__pycache__", *INSTRUCTOR_ONLY))
        _copy_tests(root, scratch, chapters)
        (scratch / "pytest.ini").write_text("[pytest]\n")
        how = confinement([])
        results = []
        for chapter in chapters:
            xml = scratch / f"chapter{chapter}.xml"
            command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                       f"--junitxml={xml}", *CHAPTER_TESTS[chapter]]
            # (the student's package runs in these tests' process: confined like an exercise, with
            # room for MPI's processes, memory and TCP, and for the files the tests write)
            _, ended = run_confined(command, scratch, student_env(scratch, scratch), limit, how,
                                    [root.resolve(), repo.resolve()], memory=8 * 2**30, output=2**30, tcp=True, shm=True)
            results.append(_chapter_result(chapter, xml, ended))
        report = GradeReport(f"{repo} (package)", results)
    if not notebooks:
        return [report]
    return [report, *(grade(path, package_root=repo) for path in sorted(repo.glob("chapters/*/exercises.ipynb")))]


def _chapter_result(chapter: int, xml: Path, ended: str) -> ExerciseResult:
    title = f"chapter {chapter:02d} package regions"
    if not xml.exists():
        return ExerciseResult(chapter, title, False, ended if ended != "finished" else "the tests did not run")
    suite = ET.parse(xml).getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    failed = [case for case in suite.iter("testcase") if case.find("failure") is not None or case.find("error") is not None]
    total = sum(1 for case in suite.iter("testcase") if case.find("skipped") is None)
    if not failed:
        return ExerciseResult(chapter, title, True)
    first = failed[0].find("failure") if failed[0].find("failure") is not None else failed[0].find("error")
    message = (first.get("message") or "").splitlines()[0] if first is not None else ""
    return ExerciseResult(chapter, title, False, f"{len(failed)} of {total} tests fail; first: "
                          f"{failed[0].get('name')}: {message}")
