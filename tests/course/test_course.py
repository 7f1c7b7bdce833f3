"""Tests for minigrad/course (release, grade, verify, tag) and the nbval setup of the chapters.

The fixture notebooks in tests/fixtures/course are tiny and plain Python: exercises.ipynb has three
exercises and lesson cells with stored outputs, lesson.ipynb has stored outputs one of which is a
timing. Tests that grade start a Python per exercise (a second or two each), so there are few.
"""

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the course tools read notebooks with nbformat")

from minigrad.course import (  # noqa: E402
    CourseError, ExerciseResult, GradeReport, find_exercises, grade, read_notebook, release_notebook,
    strip_solutions, tag_notebook,
)
from minigrad.course.__main__ import main  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "course"
EXERCISES = FIXTURES / "exercises.ipynb"
SANITIZE = ROOT / "chapters" / "nbval_sanitize.cfg"
SOLUTION_TEXT = ["### BEGIN SOLUTION", "### END SOLUTION", "sum(x * x for x in xs)", "indegree",
                 "sum(values[: i + 1])"]

_missing = [name for name in ("nbclient", "ipykernel", "jupyter_client") if importlib.util.find_spec(name) is None]
needs_kernel = pytest.mark.skipif(
    bool(_missing), reason=f"running a notebook needs a Jupyter kernel: pip install {' '.join(_missing)}")


def _cannot_confine():
    from minigrad.course.sandbox import ConfinementError, confinement

    try:
        confinement([EXERCISES])
    except ConfinementError as error:
        return str(error)
    return ""


needs_confinement = pytest.mark.skipif(bool(_cannot_confine()), reason=_cannot_confine() or "confined")


def _code(source, **minigrad_meta):
    cell = nbformat.v4.new_code_cell(source)
    if minigrad_meta:
        cell.metadata["minigrad"] = minigrad_meta
    return cell


def _notebook(*cells):
    return nbformat.v4.new_notebook(cells=list(cells))


def _digest(folder):
    return {path.relative_to(folder): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.rglob("*")) if path.is_file()}


# --- the exercise convention -------------------------------------------------------------------

def test_fixture_exercises_are_found_from_their_comment_lines():
    exercises = find_exercises(read_notebook(EXERCISES))
    assert [(e.number, e.title) for e in exercises] == [
        (1, "Sum of squares"), (2, "Topological order"), (3, "Running mean")]
    assert [(e.solution_cells, e.check_cells) for e in exercises] == [([3], [4]), ([6], [8]), ([11], [12])]


def test_tag_writes_metadata_that_survives_losing_the_comment_lines():
    nb = read_notebook(EXERCISES)
    tag_notebook(nb)
    assert nb.cells[3].metadata["minigrad"] == {"exercise": 1, "role": "solution", "title": "Sum of squares"}
    assert nb.cells[4].metadata["minigrad"] == {"exercise": 1, "role": "check"}
    for index in (3, 4):  # a student rewrites both cells from scratch
        nb.cells[index].source = "\n".join(nb.cells[index].source.splitlines()[1:])
    exercise = find_exercises(nb, strict=False)[0]
    assert (exercise.number, exercise.title, exercise.solution_cells, exercise.check_cells) == (
        1, "Sum of squares", [3], [4])


def test_tag_command_writes_the_metadata_into_the_notebook(tmp_path, capsys):
    shutil.copy(EXERCISES, tmp_path / "exercises.ipynb")
    assert main(["tag", str(tmp_path / "exercises.ipynb")]) == 0
    assert "tagged 3 exercises" in capsys.readouterr().out
    nb = nbformat.read(tmp_path / "exercises.ipynb", 4)
    assert nb.cells[12].metadata["minigrad"] == {"exercise": 3, "role": "check"}


@pytest.mark.parametrize("cells, message", [
    ([_code("x = 1\n### BEGIN SOLUTION\nx = 2\n### END SOLUTION")], "first line is not"),
    ([nbformat.v4.new_markdown_cell("### BEGIN SOLUTION\nthe answer\n### END SOLUTION")], "markdown cell"),
    ([_code("# Exercise 1: a\n### BEGIN SOLUTION\nx = 2")], "never closed"),
    ([_code("# Exercise 1: a\nx = 2\n### END SOLUTION")], "without"),
    ([_code("# Exercise 1: a\nx = 2"), _code("# Check 1\nassert x")], "has no"),
    ([_code("# Exercise 1: a\n### BEGIN SOLUTION\nx = 2\n### END SOLUTION")], "one check cell"),
    ([_code("# Check 1\nassert x"), _code("# Exercise 1: a\n### BEGIN SOLUTION\nx = 2\n### END SOLUTION")],
     "comes before"),
    ([_code("# Exercise 1: a\n### BEGIN SOLUTION\nx = 2\n### END SOLUTION"),
      _code("# Exercise 1: b\n### BEGIN SOLUTION\nx = 3\n### END SOLUTION"), _code("# Check 1\nassert x")],
     "one solution cell"),
    ([_code("# Exercise 2: a\n### BEGIN SOLUTION\nx = 2\n### END SOLUTION", exercise=1, role="solution"),
      _code("# Check 1\nassert x")], "run `python -m minigrad.course tag`"),
    ([_code("x = 1", exercise="1", role="solution")], "integer 'exercise'"),
])
def test_release_refuses_notebooks_that_break_the_convention(cells, message):
    with pytest.raises(CourseError, match=re.escape(message)):
        release_notebook(_notebook(*cells))


def test_strip_solutions_keeps_the_code_around_each_block_at_its_indentation():
    source = ("def f(x):\n    y = x + 1\n    ### BEGIN SOLUTION\n    return y * 2\n    ### END SOLUTION\n"
              "### BEGIN SOLUTION\nz = f(1)\n### END SOLUTION\nprint(z)\n")
    assert strip_solutions(source, 4) == (
        'def f(x):\n    y = x + 1\n    # YOUR CODE HERE\n    raise NotImplementedError("exercise 4")\n'
        '# YOUR CODE HERE\nraise NotImplementedError("exercise 4")\nprint(z)\n')


# --- release ------------------------------------------------------------------------------------

def test_release_hides_solutions_and_clears_only_the_exercise_outputs():
    nb = read_notebook(EXERCISES)
    student = release_notebook(nb)
    text = nbformat.writes(student)
    assert not [snippet for snippet in SOLUTION_TEXT if snippet in text]
    for number, index in ((1, 3), (2, 6), (3, 11)):
        assert f'raise NotImplementedError("exercise {number}")' in student.cells[index].source
    assert student.cells[3].source.startswith(
        '# Exercise 1: Sum of squares\ndef sum_of_squares(xs):\n    """The sum of x * x over xs."""\n')
    for index in (3, 4, 6, 8, 11, 12):  # the exercise and check cells
        assert student.cells[index].outputs == [] and student.cells[index].execution_count is None
    assert student.cells[8].source == nb.cells[8].source  # checks stay as they are
    assert student.cells[1].outputs == nb.cells[1].outputs and student.cells[1].execution_count == 1
    assert student.cells[11].metadata["minigrad"] == {"exercise": 3, "role": "solution", "title": "Running mean"}
    assert nbformat.writes(release_notebook(student)) == text  # a student version releases to itself
    assert nbformat.writes(nb) + "\n" == EXERCISES.read_text()  # the input node is not changed


def test_release_of_a_folder_leaves_the_source_alone_and_gives_the_same_files_twice(tmp_path, capsys):
    src = tmp_path / "chapter"
    (src / "data").mkdir(parents=True)
    (src / ".ipynb_checkpoints").mkdir()
    shutil.copy(EXERCISES, src / "exercises.ipynb")
    shutil.copy(FIXTURES / "lesson.ipynb", src / "lesson.ipynb")
    shutil.copy(EXERCISES, src / ".ipynb_checkpoints" / "exercises-checkpoint.ipynb")
    (src / "data" / "points.csv").write_text("x,y\n1,2\n")
    (src / "exercises.py").write_text("# Exercise 1: a\n### BEGIN SOLUTION\nx = 1\n### END SOLUTION\n")
    before = _digest(src)

    with pytest.warns(UserWarning, match="exercises.py: not copied"):
        assert main(["release", str(src), str(tmp_path / "out")]) == 0
    first = _digest(tmp_path / "out")
    assert sorted(map(str, first)) == ["data/points.csv", "exercises.ipynb", "lesson.ipynb"]
    assert (tmp_path / "out" / "lesson.ipynb").read_bytes() == (src / "lesson.ipynb").read_bytes()
    with pytest.warns(UserWarning):
        assert main(["release", str(src), str(tmp_path / "out")]) == 0
    assert _digest(tmp_path / "out") == first
    assert _digest(src) == before
    assert "wrote" in capsys.readouterr().out


def test_release_refuses_to_write_into_its_source(tmp_path, capsys):
    shutil.copy(EXERCISES, tmp_path / "exercises.ipynb")
    assert main(["release", str(tmp_path), str(tmp_path / "student")]) == 2
    assert main(["release", str(tmp_path / "exercises.ipynb"), str(tmp_path)]) == 2
    assert main(["release", str(tmp_path / "missing.ipynb"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "inside the source folder" in err and "overwrite its source" in err and "no such notebook" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exercises.ipynb"]


def test_score_table_names_each_exercise_and_the_total():
    report = GradeReport("ex.ipynb", [ExerciseResult(1, "Sum of squares", True),
                                      ExerciseResult(2, "Topological order", False, "check: AssertionError: no")])
    assert str(report) == (
        "ex.ipynb\n"
        "    #  exercise           result\n"
        "    1  Sum of squares     pass\n"
        "    2  Topological order  FAIL  check: AssertionError: no\n"
        "Score: 1/2")
    assert report.to_dict()["score"] == 1 and report.to_dict()["total"] == 2


# --- grade (each test runs a notebook in a fresh kernel) ----------------------------------------

@needs_confinement
def test_verify_solutions_grade_full_marks_and_the_student_version_none(capsys):
    assert main(["verify", str(EXERCISES), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["ok"]
    assert (result["solved"]["score"], result["solved"]["total"]) == (3, 3)
    assert (result["released"]["score"], result["released"]["total"]) == (0, 3)
    assert [e["error"] for e in result["released"]["exercises"]] == [
        "check: NotImplementedError: exercise 1", "check: NotImplementedError: exercise 2",
        "solution: NotImplementedError: exercise 3"]


@needs_confinement
def test_grade_scores_exactly_the_exercise_a_student_solved(tmp_path):
    student = release_notebook(read_notebook(EXERCISES))
    # Exercise 2 solved in a rewritten cell without its comment line (found by its metadata),
    # exercise 3 answered wrongly (the check must catch it), exercise 1 never returns.
    student.cells[6].source = "def topological_order(edges):\n    return ['x', 'w', 'mul', 'add']"
    student.cells[11].source = "# Exercise 3: Running mean\nmeans = [0.0, 0.0, 0.0, 0.0]"
    student.cells[3].source = "def sum_of_squares(xs):\n    while True:\n        pass"
    nbformat.write(student, tmp_path / "alice.ipynb")

    report = grade(tmp_path / "alice.ipynb", EXERCISES, timeout=10)
    assert (report.score, report.total) == (1, 3)
    assert [(r.number, r.passed) for r in report.results] == [(1, False), (2, True), (3, False)]
    assert report.results[0].error == "killed: the 10 s limit passed"
    assert report.results[2].error == (
        "check: AssertionError: expected [2.0, 3.0, 4.0, 5.0], got [0.0, 0.0, 0.0, 0.0]")
    assert nbformat.read(tmp_path / "alice.ipynb", 4) == student  # grading does not write the notebook


@needs_confinement
def test_a_crash_fails_only_its_own_exercise(tmp_path, capsys):
    nb = read_notebook(EXERCISES)
    nb.cells[6].source = nb.cells[6].source.replace("return order", "import os\n    os._exit(1)")
    nbformat.write(nb, tmp_path / "crash.ipynb")
    assert main(["grade", str(tmp_path / "crash.ipynb"), "--solution", str(EXERCISES), "--timeout", "30"]) == 0
    out = capsys.readouterr().out
    assert "FAIL  the student's process exited with status 1 before it finished" in out
    assert "Score: 2/3\n(student code ran as " in out


def test_grade_of_a_notebook_without_exercises_is_a_usage_error(capsys):
    assert main(["grade", str(FIXTURES / "lesson.ipynb")]) == 2
    assert "does not say which chapter" in capsys.readouterr().err
    assert main(["grade", str(EXERCISES), "--solution", str(FIXTURES / "lesson.ipynb")]) == 2
    assert "has no exercises" in capsys.readouterr().err


# --- the nbval setup for lesson notebooks -------------------------------------------------------

def _sanitize(text):
    from nbval.plugin import get_sanitize_patterns

    for regex, replacement in get_sanitize_patterns(SANITIZE.read_text()):
        text = re.sub(regex, replacement, text)
    return text


@pytest.mark.parametrize("first, second", [
    ("sum in 1.641 ms", "sum in 12 ms"),
    ("took 2s", "took 0.53 seconds"),
    ("CPU times: user 1.2 ms, sys: 0 ns, total: 1.2 ms\nWall time: 1.3 ms",
     "CPU times: user 3 µs, sys: 1 µs, total: 4 µs\nWall time: 5.01 µs"),
    ("1.23 ms ± 45.6 µs per loop (mean ± std. dev. of 7 runs, 1,000 loops each)",
     "2.5 ms ± 1 µs per loop (mean ± std. dev. of 7 runs, 100 loops each)"),
    ("100%|██████████| 10/10 [00:01<00:00,  9.87it/s]", "100%|██████████| 10/10 [00:00<00:00, 123.45it/s]"),
    ("850 samples/s", "1,204.5 samples/s"),
    ("<function f at 0x7f3a2c1d5e40>", "<function f at 0x55d0c2a1b2c0>"),
    ("saved to /tmp/tmpa1b2_c3d/ckpt.npz", "saved to /private/var/folders/x1/yz/T/tmp9zz8yy7x/ckpt.npz"),
    ("at 2025-01-31 12:34:56.789", "at 2026-02-01T01:02:03"),
    ('<!-- Generated by graphviz version 2.43.0 (0)\n -->\n<svg width="62pt">\n<g/>\n</svg>\n',
     '<!-- Generated by graphviz version 9.0.0 (20230911.1827)\n -->\n<svg width="62pt">\n<g/>\n</svg>\n'),
])
def test_sanitize_file_masks_volatile_output(first, second):
    pytest.importorskip("nbval")
    assert _sanitize(first) == _sanitize(second)


@pytest.mark.parametrize("text", [
    "tensor([1.0000, 2.0000], requires_grad=True)", "epoch 3: loss 0.6931, accuracy 91.2%",
    "3 samples in 10 steps", "2 minibatches of 4 sequences", "Linear(in_features=4, out_features=2)",
    "<Figure size 640x480 with 1 Axes>", "0xff",
    '<svg width="62pt" height="44pt">\n<g id="node1" class="node"><title>t0</title></g>\n</svg>',
])
def test_sanitize_file_leaves_deterministic_output_alone(text):
    pytest.importorskip("nbval")
    assert _sanitize(text) == text


def test_chapters_conftest_makes_plain_nbval_runs_use_the_sanitize_file(monkeypatch):
    pytest.importorskip("nbval")
    spec = importlib.util.spec_from_file_location("chapters_conftest", ROOT / "chapters" / "conftest.py")
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    option = type("Option", (), dict(nbval_sanitize_with=None, sanitize_with=None, nbval_kernel_name=None,
                                     current_env=False, nbval_current_env=False))()
    config = type("Config", (), {"option": option, "pluginmanager": type("PM", (), {
        "hasplugin": staticmethod(lambda name: True)})()})()
    monkeypatch.setenv("PYTHONPATH", "elsewhere")
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    conftest.pytest_configure(config)
    assert option.nbval_sanitize_with == str(SANITIZE) and option.nbval_current_env
    assert os.environ["PYTHONPATH"] == os.pathsep.join([str(ROOT), "elsewhere"])
    assert os.environ["PYTHONHASHSEED"] == "0"


@needs_kernel
def test_lesson_notebook_passes_nbval_with_the_sanitize_file(tmp_path):
    pytest.importorskip("nbval")
    shutil.copy(FIXTURES / "lesson.ipynb", tmp_path / "lesson.ipynb")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # keep the repository's settings out
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", "--nbval",
               "--nbval-current-env", "--nbval-sanitize-with", str(SANITIZE), "lesson.ipynb"]
    run = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "4 passed" in run.stdout


# --- the chapters' own exercise notebooks (structure only; CI runs them under nbval) ------------

CHAPTER_EXERCISES = sorted(ROOT.glob("chapters/*/solutions/exercises.ipynb"))


@pytest.mark.parametrize("path", CHAPTER_EXERCISES or [pytest.param(None, marks=pytest.mark.skip(
    reason="no chapters/*/solutions/exercises.ipynb yet"))], ids=lambda p: p and p.parent.parent.name)
def test_chapter_exercises_follow_the_convention_and_release_cleanly(path):
    nb = read_notebook(path)
    exercises = find_exercises(nb)
    assert 5 <= len(exercises) <= 10, f"{path}: {len(exercises)} exercises, the course wants 5 to 10"
    assert [e.number for e in exercises] == list(range(1, len(exercises) + 1))
    student = nbformat.writes(release_notebook(nb))
    assert "### BEGIN SOLUTION" not in student and "### END SOLUTION" not in student


def test_the_shipped_student_versions_are_the_release_of_the_solutions(tmp_path, capsys):
    assert main(["ship", "--check", str(ROOT / "chapters")]) == 0, capsys.readouterr().out
    shutil.copytree(ROOT / "chapters" / "01_graphs" / "solutions", tmp_path / "01_graphs" / "solutions")
    assert main(["ship", "--check", str(tmp_path)]) == 1
    assert "out of date" in capsys.readouterr().out
    assert main(["ship", str(tmp_path)]) == 0 and main(["ship", "--check", str(tmp_path)]) == 0
    shipped = read_notebook(tmp_path / "01_graphs" / "exercises.ipynb")
    assert "### BEGIN SOLUTION" not in nbformat.writes(shipped)
    assert shipped.metadata["minigrad"] == {"chapter": "01_graphs"}
