"""Grading that holds: the cheats a student would try score nothing, and a runaway run is killed.

Each test builds an instructor notebook with four small minigrad exercises and a student notebook
that cheats in the ways issue 14 lists (checks replaced by ``print``, numpy/math/gradcheck patched
in a solution cell, the library function the exercise re-implements called, ``builtins.isinstance``
patched, an endless loop that swallows interrupts, a fork bomb), grades it and checks both the
score and the reason each exercise failed. Every test starts a kernel, so there are few.
"""

import os
import textwrap
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the course tools read notebooks with nbformat")
pytest.importorskip("nbval", reason="grading runs the notebook under nbval")
pytest.importorskip("ipykernel", reason="grading runs the notebook in a Jupyter kernel")

from minigrad.course import grade, release_notebook, verify, write_junit  # noqa: E402

SETUP = """
import math
import numpy as np
import minigrad
from minigrad.autograd import gradcheck, topological_order
"""
# (title, solution, check, hidden check, forbid)
EXERCISES = [
    ("Count the nodes", '''
def count_nodes(t):
    """The number of distinct nodes reachable from t.grad_fn."""
    ### BEGIN SOLUTION
    seen, stack = {t.grad_fn}, [t.grad_fn]
    while stack:
        for edge in stack.pop().next_functions:
            if edge is not None and edge[0] not in seen:
                seen.add(edge[0])
                stack.append(edge[0])
    return len(seen)
    ### END SOLUTION''', '''
a = minigrad.tensor(2.0, requires_grad=True)
t = (a * a + a).exp()
assert count_nodes(t) == len(topological_order([t.grad_fn])), "wrong count"''', None,
     ["minigrad.autograd.engine.topological_order"]),
    ("Double", '''
def double(x):
    ### BEGIN SOLUTION
    return 2 * x
    ### END SOLUTION''', '''
assert np.allclose(double(np.arange(3.0)), [0.0, 2.0, 4.0]), "wrong values"
assert math.isclose(double(0.5), 1.0), "wrong value"''', '''
assert double(21) == 42, "wrong value for 21"''', []),
    ("Square", '''
def square(x):
    ### BEGIN SOLUTION
    return x * x
    ### END SOLUTION''', '''
x = minigrad.tensor([1.0, -2.0], dtype=minigrad.float64, requires_grad=True)
assert np.allclose(square(x).detach().numpy(), [1.0, 4.0]), "wrong values"
assert gradcheck(square, (x,)), "gradcheck failed"''', None, []),
    ("Halve", '''
def halve(x):
    ### BEGIN SOLUTION
    return x / 2
    ### END SOLUTION''', '''
assert halve(3.0) == 1.5, "wrong value"''', None, []),
]


def _code(source, **meta):
    cell = nbformat.v4.new_code_cell(textwrap.dedent(source).strip())
    if meta:
        cell.metadata["minigrad"] = meta
    return cell


def instructor_notebook():
    cells = [_code(SETUP)]
    for number, (title, solution, check, hidden, forbid) in enumerate(EXERCISES, 1):
        cells.append(_code(f"# Exercise {number}: {title}\n{solution.strip()}", **({"forbid": forbid} if forbid else {})))
        cells.append(_code(f"# Check {number}\n{check.strip()}"))
        if hidden:
            cells.append(_code(f"# Hidden check {number}\n{hidden.strip()}"))
    return nbformat.v4.new_notebook(cells=cells)


def student_notebook(answers):
    """The student version with exercise N's solution cell replaced by ``answers[N]`` (if given)."""
    nb = release_notebook(instructor_notebook())
    for cell in nb.cells:
        number = cell.metadata.get("minigrad", {}).get("exercise")
        if cell.metadata.get("minigrad", {}).get("role") == "solution" and number in answers:
            cell.source = textwrap.dedent(answers[number]).strip()
    return nb


def _write(tmp_path, name, nb):
    path = tmp_path / name
    nbformat.write(nb, path)
    return path


@pytest.fixture
def source(tmp_path):
    return _write(tmp_path, "source.ipynb", instructor_notebook())


def test_the_instructor_notebook_grades_full_marks_and_its_student_version_none(source):
    ok, solved, released = verify(source, timeout=30)
    assert ok, f"{solved}\n{released}"
    assert (solved.score, released.score, released.total) == (4, 0, 4)


def test_each_cheat_scores_nothing_and_an_honest_answer_beside_them_scores(tmp_path, source):
    student = student_notebook({
        # the reference, called directly, through its module and through an alias made at import
        1: """
        import minigrad.autograd.engine as engine
        count_nodes = lambda t: len(engine.topological_order([t.grad_fn]))""",
        # the judge patched in the solution cell: five lines, and no real answer
        2: """
        import math, numpy, minigrad.autograd
        numpy.allclose = lambda *args, **kwargs: True
        math.isclose = lambda *args, **kwargs: True
        minigrad.autograd.gradcheck = lambda *args, **kwargs: True
        def double(x):
            return None""",
        # isinstance patched for good, and an answer that is wrong
        3: """
        import builtins
        builtins.isinstance = lambda obj, cls: True
        def square(x):
            return x""",
        4: "def halve(x):\n    return x / 2",
    })
    for cell in student.cells:  # every check replaced by a print
        if cell.metadata.get("minigrad", {}).get("role") == "check":
            cell.source = 'print("passed")'
    report = grade(_write(tmp_path, "alice.ipynb", student), source, timeout=30)
    errors = {r.number: r.error for r in report.results}
    assert (report.score, report.total) == (1, 4), str(report)
    assert errors[1].startswith("check: ReferenceCalled: exercise 1 asks you to write this yourself"), errors[1]
    assert errors[2].startswith("solution: TamperingDetected: exercise 2 replaced math.isclose, "
                                "minigrad.autograd.gradcheck"), errors[2]
    assert "numpy.allclose" in errors[2]
    assert errors[3].startswith("solution: TamperingDetected: exercise 3 replaced builtins.isinstance"), errors[3]
    assert report.results[3].passed
    write_junit([report], tmp_path / "report.xml")
    xml = (tmp_path / "report.xml").read_text()
    assert xml.count("<testcase") == 4 and xml.count("<failure") == 3 and "ReferenceCalled" in xml


def test_a_patch_made_while_a_check_runs_and_a_reference_hidden_in_an_alias_are_caught(tmp_path, source):
    student = student_notebook({
        1: """
        ref = topological_order
        def count_nodes(t):
            return len(ref([t.grad_fn]))""",
        2: """
        def double(x):
            import numpy
            numpy.allclose = lambda *args, **kwargs: True
            return 2 * x""",
    })
    report = grade(_write(tmp_path, "bob.ipynb", student), source, timeout=30)
    errors = {r.number: r.error for r in report.results}
    assert "ReferenceCalled" in errors[1], errors[1]
    assert errors[2].startswith("check: TamperingDetected: exercise 2 replaced numpy.allclose"), errors[2]


def _alive(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc").is_dir() or os.name != "posix", reason="the sandbox uses Linux /proc")
def test_a_fork_bomb_is_bounded_and_the_run_killed_at_the_limit_with_all_its_processes(tmp_path, source):
    pids = tmp_path / "pids"
    student = student_notebook({1: f"""
        import os, time
        forked = 0
        while forked < 2000:  # each child leaves the kernel's session and sleeps
            try:
                pid = os.fork()
            except OSError:
                break
            if pid == 0:
                os.setsid()
                with open({str(pids)!r}, "a") as out:
                    out.write(f"{{os.getpid()}}\\n")
                time.sleep(600)
                os._exit(0)
            forked += 1
        time.sleep(600)"""})
    started = time.monotonic()
    report = grade(_write(tmp_path, "mallory.ipynb", student), source, timeout=300, limit=20)
    assert time.monotonic() - started < 120
    assert report.stopped == "killed: the 20 s limit passed", str(report)
    assert report.score == 0 and all(r.error.endswith(f"not finished ({report.stopped})")
                                     for r in report.results), str(report)
    children = [int(line) for line in pids.read_text().split()]
    assert 0 < len(children) <= 256, f"{len(children)} processes forked"
    assert not [pid for pid in children if _alive(pid)], "a forked process outlived the grading"
