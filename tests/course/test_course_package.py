"""One source, two builds: the package regions a student writes and the student repository.

The chapter-order check itself (chapter k's tests with chapters 1..k written, for every k) runs
many test files and lives behind ``make course-check``; these tests check the pieces it rests on.
"""

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from minigrad.course.exercises import CourseError
from minigrad.course.package import (
    CHAPTER_LESSONS, CHAPTER_TESTS, ROOT, find_regions, find_stubs, grade_repository, release_package, strip_regions,
)

SOURCE = '''def f(x):
    """Doc stays."""
    y = x + 1
    ### BEGIN SOLUTION chapter 02: f's answer
    return y * 2
    ### END SOLUTION


def g():
    ### BEGIN SOLUTION chapter 01: g
    return 1
    ### END SOLUTION
'''


def test_strip_regions_keeps_signature_docstring_and_earlier_chapters():
    assert strip_regions(SOURCE) == (
        'def f(x):\n    """Doc stays."""\n    y = x + 1\n    raise NotImplementedError("chapter 02: f\'s answer")\n'
        '\n\ndef g():\n    raise NotImplementedError("chapter 01: g")\n')
    assert strip_regions(SOURCE, upto=1).endswith('def g():\n    return 1\n')
    assert "### " not in strip_regions(SOURCE, upto=2)


@pytest.mark.parametrize("text, message", [
    ("    ### BEGIN SOLUTION\n    x = 1\n    ### END SOLUTION\n", "needs 'chapter NN: title'"),
    ("### BEGIN SOLUTION chapter 01: a\nx = 1\n", "never closed"),
    ("x = 1\n### END SOLUTION\n", "without a region"),
])
def test_strip_regions_refuses_malformed_markers(text, message):
    with pytest.raises(CourseError, match=message):
        strip_regions(text)


def test_the_package_marks_the_regions_the_course_promises():
    regions = find_regions()
    per_chapter = Counter(r.chapter for r in regions)
    assert per_chapter[1] >= 5 and per_chapter[2] >= 12 and per_chapter[3] >= 7 and per_chapter[4] >= 4, per_chapter
    assert all(1 <= r.lines <= 40 for r in regions), [(r.tag, r.lines) for r in regions if not 1 <= r.lines <= 40]
    assert len({r.tag for r in regions}) == len(regions), "two regions share a tag"
    assert set(CHAPTER_TESTS) == set(CHAPTER_LESSONS) == set(per_chapter)


def test_release_package_writes_a_student_repository_that_imports_and_raises_only_in_regions(tmp_path):
    dest = tmp_path / "student"
    regions = release_package(dest)
    assert {p.name for p in dest.iterdir()} >= {"minigrad", "chapters", "tests", "Makefile", "README.md", ".git"}
    # a git repository whose one commit holds every file: students clone it as it is
    git = lambda *args: subprocess.run(["git", *args], cwd=dest, capture_output=True, text=True, check=True).stdout
    assert git("log", "--format=%s").splitlines() == ["minigrad student repository (every region to write)"]
    assert git("status", "--porcelain", "--ignored") == "", "files left out of the commit"
    readme = (dest / "README.md").read_text()
    assert readme == (ROOT / "minigrad" / "course" / "student_README.md").read_text()
    for step in ("git clone", "make lab", "minigrad.course test-chapter 1", "## Grading yourself",
                 "minigrad.course grade chapters/01_graphs/exercises.ipynb"):
        assert step in readme, f"the students' README lacks {step!r}"
    assert not list(dest.glob("chapters/*/solutions")), "the solutions must not ship"
    assert not list(dest.glob("minigrad/course/muta*.py")), (
        "the mutant catalog quotes the solutions: it must not ship")
    assert not [p for p in dest.rglob("*.py") if "### BEGIN SOLUTION chapter" in p.read_text()
                and "course" not in p.parts]
    text = (dest / "minigrad" / "autograd" / "engine.py").read_text()
    assert 'raise NotImplementedError("chapter 01: topological order")' in text
    assert 'def topological_order(roots: Iterable[Function]) -> list[Function]:' in text
    script = """
import minigrad
from minigrad.autograd.engine import topological_order
x = minigrad.ones(3)
print(float((x + x).sum().item()))
for call in (lambda: topological_order([]), lambda: minigrad.tensor(1.0, requires_grad=True) * 2):
    try:
        call()
    except NotImplementedError as error:
        print(error)
"""
    run = subprocess.run([sys.executable, "-c", script], cwd=dest, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(dest), "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[:3] == ["6.0", "chapter 01: topological order",
                                          "chapter 01: Function.apply records the in-edges"]
    assert len(regions) == len(find_regions())
    # `python -m minigrad.course regions` in the student repository lists every region still to write
    assert [s.tag for s in find_stubs(dest / "minigrad")] == [r.tag for r in regions]
    with pytest.raises(CourseError, match="not empty"):
        release_package(dest)
    with pytest.raises(CourseError, match="inside the source"):
        release_package(ROOT / "build" / "student")


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="grading runs under the Linux sandbox")
def test_grading_a_student_repository_runs_the_instructors_tests_against_the_students_package(tmp_path):
    release_package(tmp_path / "done", upto=1)
    release_package(tmp_path / "empty", upto=0)
    (done,) = grade_repository(tmp_path / "done", chapters=[1], notebooks=False)
    (empty,) = grade_repository(tmp_path / "empty", chapters=[1], notebooks=False)
    assert done.results[0].passed, str(done)
    assert not empty.results[0].passed and "NotImplementedError: chapter 01" in empty.results[0].error, str(empty)


def test_the_course_tools_say_which_extra_to_install_when_its_packages_are_missing():
    script = "import sys; sys.modules['nbformat'] = None; import minigrad.course"
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("ModuleNotFoundError: minigrad.course needs nbformat") and "make venv" in last \
        and ".[dev]" in last, last


# Where a region's code uses a builtin's name for minigrad's function on purpose, and its docstring says so.
SHADOWS_ON_PURPOSE = {"minigrad.ops.softmax": {"sum"}}


def test_no_module_where_students_write_shadows_a_builtin():
    """A student's ``any(...)`` or ``sum(...)`` in a region must reach Python's, not a tensor op."""
    import builtins
    import importlib

    shadowing = {}
    for path in sorted({r.path for r in find_regions()}):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        module = importlib.import_module(name)
        found = {n for n in vars(module) if not n.startswith("_") and hasattr(builtins, n)}
        if found - SHADOWS_ON_PURPOSE.get(name, set()):
            shadowing[name] = sorted(found - SHADOWS_ON_PURPOSE.get(name, set()))
    assert not shadowing, f"module-level names that hide Python's builtins where students write: {shadowing}"
