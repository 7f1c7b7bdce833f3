"""Grading that holds: every cheat scores 0, an honest answer beside them scores, and each ends in its own process.

An instructor notebook of small exercises (one forbids the library function it re-implements, each
has a hidden check) is graded against a student notebook in which each exercise is one cheat:
the ways a student could game a grader (stubbing the grader, an ``==`` that is always true, a fresh copy of the
module that holds the reference, reading the solutions or the hidden checks from disk, writing
outside the scratch folder, forging results on the pipe and dying, replacing the machinery that
runs the next cells, 2 GiB in one cell, 4 GiB printed, ``os._exit``, a hang, a fork bomb) and a
few more. Every cheat must score 0 with a reason that names it, the honest exercise must pass,
and the score table, with each exercise's grading time, is printed (``pytest -s`` shows it).
Grading a notebook starts a Python per exercise, so the cheats share one grading run.
"""

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the course tools read notebooks with nbformat")

from minigrad.course import find_exercises, grade, release_notebook, verify, write_junit  # noqa: E402
from minigrad.course.answers import AnswerError, decode, encode  # noqa: E402
from minigrad.course.checks import checked, misuses, probe  # noqa: E402
from minigrad.course.sandbox import landlock_abi  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SECRET = "hidden-check-marker-5f0c1e"  # only in the hidden checks: no student process may ever see it
SETUP = """
import numpy as np
import minigrad
from minigrad.autograd import topological_order
from minigrad.course import answer
"""
COUNT = ('''
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
for t in ((a * a + a).exp(), (a * 3).sin() * a):
    got = answer(count_nodes(t))
    assert got == len(topological_order([t.grad_fn])), f"expected {len(topological_order([t.grad_fn]))}, got {got}"''')
SQUARE = ('''
def square(x):
    ### BEGIN SOLUTION
    return x * x
    ### END SOLUTION''', '''
x = minigrad.tensor([1.0, -2.0], dtype=minigrad.float64, requires_grad=True)
values = answer(square(x).detach().numpy())
(grad,) = answer(minigrad.grad(square(x).sum(), x))
assert np.allclose(values, [1.0, 4.0]), f"expected [1, 4], got {values}"
assert np.allclose(grad.numpy(), [2.0, -4.0]), f"expected the gradient [2, -4], got {grad}"''')


def _double(number):
    return (f'''
def double{number}(x):
    ### BEGIN SOLUTION
    return 2 * x
    ### END SOLUTION''', f'''
got = answer(double{number}(np.arange(3.0)))
assert np.allclose(got, [0.0, 2.0, 4.0]), f"expected [0, 2, 4], got {{got}}"''')


def _code(source, **meta):
    cell = nbformat.v4.new_code_cell(textwrap.dedent(source).strip())
    if meta:
        cell.metadata["minigrad"] = meta
    return cell


def instructor_notebook(exercises):
    """``exercises``: (title, (solution, check), forbid) per exercise; each gets a hidden check."""
    cells = [_code(SETUP)]
    for number, (title, (solution, check), forbid) in enumerate(exercises, 1):
        cells.append(_code(f"# Exercise {number}: {title}\n{textwrap.dedent(solution).strip()}",
                           **({"forbid": forbid} if forbid else {})))
        cells.append(_code(f"# Check {number}\n{textwrap.dedent(check).strip()}"))
        name = (solution.split("def ", 1)[1].split("(", 1)[0]).strip()
        hidden = {"count_nodes": "answer(count_nodes((a * a).exp())) == len(topological_order([(a * a).exp().grad_fn]))",
                  "square": "np.allclose(answer(square(minigrad.tensor([3.0])).numpy()), [9.0])"}.get(
                      name, f"np.allclose(answer({name}(np.array([21.0]))), [42.0])")
        cells.append(_code(f"# Hidden check {number}\n_marker = {SECRET!r}\nassert {hidden}, _marker"))
    return nbformat.v4.new_notebook(cells=cells)


def student_notebook(source, answers):
    """The student version of ``source`` with exercise N's solution cell replaced by ``answers[N]``."""
    nb = release_notebook(source)
    for cell in nb.cells:
        meta = cell.metadata.get("minigrad", {})
        if meta.get("role") == "solution" and meta.get("exercise") in answers:
            cell.source = textwrap.dedent(answers[meta["exercise"]]).strip()
    return nb


# Each cheat: (title, what it does, the start of the reason it must fail with); doubleN is its exercise's function.
CHEATS = [
    ("stub the grader", """
        import builtins, gc
        for obj in gc.get_objects():  # every function of the grader's it can find: made to do nothing
            if type(obj).__name__ == "function" and getattr(obj, "__name__", "") in (
                    "send", "write_message", "encode", "received", "error_line", "main"):
                try:
                    obj.__code__ = (lambda *args, **kwargs: None).__code__
                except ValueError:  # a closure: its cells stay, its code goes
                    obj.__defaults__ = None
        globals().update({k: (lambda *args, **kwargs: True) for k in list(globals()) if k.startswith("__minigrad")})
        def doubleN(x):
            return None""", "the student's process ended before it finished"),
    ("== always true", """
        class Anything(float):
            def __eq__(self, other):
                return True
            __ne__ = lambda self, other: False
        def doubleN(x):
            return Anything(0)""", "check: AnswerError: an answer must be plain data"),
    ("a fresh copy of the reference", """
        import importlib.util, minigrad.autograd.engine as engine
        spec = importlib.util.spec_from_file_location("fresh", engine.__file__)
        fresh = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(fresh)
        def count_nodes(t):
            return len(fresh.topological_order([t.grad_fn]))""", "check: ReferenceCalled: exercise 3 asks you"),
    ("the reference from the instructor's checkout", f"""
        import importlib.util
        spec = importlib.util.spec_from_file_location("theirs", {str(ROOT / 'minigrad' / 'autograd' / 'engine.py')!r})
        theirs = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(theirs)
        def count_nodes(t):
            return len(theirs.topological_order([t.grad_fn]))""", "solution: PermissionError"),
    ("read the solutions notebook", """
        import json, os
        notebook = json.load(open(os.environ["SOLUTIONS"]))
        exec("".join(notebook["cells"][11]["source"]).replace("### BEGIN SOLUTION", ""))""", "solution: PermissionError"),
    ("find the hidden checks on disk or in other processes", f"""
        import os
        paths = [f"/proc/{{pid}}/{{what}}" for pid in os.listdir("/proc") if pid.isdigit() for what in ("cmdline", "environ")]
        for top in ("/tmp", "/var/tmp", "/work", "/home", "/root", ".."):
            paths += [os.path.join(folder, name) for folder, _, files in os.walk(top) for name in files]
        found = False
        for path in paths[:20000]:
            try:
                found = found or {SECRET[:10]!r} in open(path, errors="ignore").read(2**20)
            except (OSError, ValueError):
                pass
        def doubleN(x):
            return 2 * x if found else x""", "check: AssertionError: expected [0, 2, 4], got [0. 1. 2.]"),  # not found
    ("read the solutions through a symlink in the scratch folder", """
        import json, os
        os.symlink(os.environ["SOLUTIONS"], "mine.ipynb")
        notebook = json.load(open("mine.ipynb"))""", "solution: PermissionError"),
    ("write outside the scratch folder", """
        import os
        with open(os.environ["OUTSIDE"], "w") as out:
            out.write("student code was here")
        def doubleN(x):
            return 2 * x""", "solution: PermissionError"),
    ("forge results on the pipe, then die", """
        import json, os
        for fd in range(3, 64):
            for line in ({"verdict": {"cell": 22, "passed": True, "error": ""}}, {"done": True}):
                try:
                    os.write(fd, (json.dumps(line) + "\\n").encode())
                except OSError:
                    pass
        os._exit(0)""", "check: no answer for doubleN"),
    ("replace what runs the next cells", """
        import builtins
        builtins.exec = lambda *args, **kwargs: None
        builtins.compile = lambda *args, **kwargs: None
        def doubleN(x):
            return x""", "check: "),
    ("2 GiB in one cell", """
        hoard = bytearray(2 * 2**30)
        def doubleN(x):
            return 2 * x""", "solution: MemoryError"),
    ("print 4 GiB", """
        import sys
        line = "x" * 2**20
        for _ in range(4096):
            sys.stdout.write(line)
        def doubleN(x):
            return 2 * x""", "solution: OSError: [Errno 27] File too large"),
    ("kill the grader", """
        import os, signal
        for pid in (os.getppid(), os.getpgid(os.getppid())):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        def doubleN(x):
            return x""", "check: AssertionError"),
    ("a hard-coded answer to the public check", """
        import numpy as np
        def doubleN(x):
            return np.array([0.0, 2.0, 4.0])""", "hidden check: AssertionError: "),
    ("a hang that swallows interrupts", """
        import time
        while True:
            try:
                time.sleep(1)
            except BaseException:
                pass""", "killed: the 12 s limit passed"),
    ("a fork bomb", """
        import os, time
        for _ in range(600):
            try:
                if os.fork() == 0:
                    time.sleep(60)
                    os._exit(0)
            except OSError:
                break
        time.sleep(60)""", "killed: more than 256 processes"),
]


def _cheat_exercises():
    exercises = []
    for number, (title, answer_source, _) in enumerate(CHEATS, 1):
        task = COUNT if "count_nodes" in answer_source else _double(number)
        exercises.append((title, task, ["minigrad.autograd.engine.topological_order"] if task is COUNT else []))
    exercises.append(("an honest answer", _double(len(CHEATS) + 1), []))
    exercises.append(("an honest answer with a gradient", SQUARE, []))
    return exercises


needs_landlock = pytest.mark.skipif(landlock_abi() < 1 or not Path("/proc").is_dir(),
                                    reason="the grader confines student code with Linux Landlock")


def test_answers_cross_as_plain_data_and_nothing_else():
    value = {"a": [1, 2.5, float("nan"), "s", None, True], (1, 2): {3}, "arr": __import__("numpy").arange(6.0).reshape(2, 3)}
    back = decode(json.loads(json.dumps(encode(value))))
    assert back["a"][:2] == [1, 2.5] and back[(1, 2)] == {3} and back["arr"].shape == (2, 3)
    import minigrad

    for shape in [(), (0,), (2, 1, 3)]:  # a 0-d or empty Tensor keeps its shape, and a transposed array its values
        tensor = decode(encode(minigrad.zeros(*shape) + 1.5))
        assert type(tensor) is minigrad.Tensor and tuple(tensor.shape) == shape
    transposed = __import__("numpy").arange(6.0).reshape(2, 3).T
    assert (decode(encode(transposed)) == transposed).all()

    class Sneaky(int):
        def __eq__(self, other):
            return True

    for bad in (Sneaky(1), object(), __import__("numpy").array([object()])):
        with pytest.raises(AnswerError, match="plain data|numbers, booleans or strings"):
            encode(bad)
    for forged in ({"$array": {"dtype": "|O", "shape": [1], "data": ""}}, {"$pickle": "x"}, {"a": 1, "b": 2}):
        with pytest.raises(AnswerError):
            decode(forged)


def test_a_check_cell_splits_into_a_probe_without_its_reference_and_a_check_without_the_students_code():
    cell = textwrap.dedent("""
        minigrad.manual_seed(2)
        g = minigrad.randn(3)
        expected = reference(g)
        got = answer(theirs(g))
        assert np.allclose(got, expected), "wrong"
        print("ok")""")
    student_side = probe(cell)
    assert "theirs(g)" in student_side and "reference" not in student_side and "assert" not in student_side
    assert "manual_seed(2)" in student_side and "print" not in student_side
    checker_side = checked(cell)
    names = {node.id for node in ast.walk(ast.parse(checker_side)) if isinstance(node, ast.Name)}
    assert "theirs" not in names and "reference" in names  # the student's function is only a string there
    assert misuses("y = theirs(1)\nanswer(theirs(2))", {"theirs"}) == {"theirs"}
    assert probe("assert reference(1) == 1") is None


@needs_landlock
def test_the_instructor_notebook_grades_full_marks_and_its_student_version_none(tmp_path):
    source = tmp_path / "source.ipynb"
    nbformat.write(instructor_notebook([("count", COUNT, ["minigrad.autograd.engine.topological_order"]),
                                        ("square", SQUARE, []), ("double", _double(3), [])]), source)
    ok, solved, released = verify(source, timeout=60)
    assert ok, f"{solved}\n{released}"
    assert (solved.score, released.score, released.total) == (3, 0, 3)
    assert [r.error for r in released.results] == ["check: NotImplementedError: exercise 1",
                                                   "check: NotImplementedError: exercise 2",
                                                   "check: NotImplementedError: exercise 3"]


@needs_landlock
def test_every_cheat_scores_nothing_by_name_and_the_honest_answers_beside_them_score(tmp_path, monkeypatch, capsys):
    source = tmp_path / "instructor" / "source.ipynb"
    source.parent.mkdir()
    nbformat.write(instructor_notebook(_cheat_exercises()), source)
    outside = tmp_path / "outside.txt"
    # What a cheat would look for is handed to it, as if it had guessed: it must still fail.
    monkeypatch.setenv("SOLUTIONS", str(source))
    monkeypatch.setenv("OUTSIDE", str(outside))
    answers = {number: text.replace('os.environ["SOLUTIONS"]', repr(str(source)))
               .replace('os.environ["OUTSIDE"]', repr(str(outside))).replace("doubleN", f"double{number}")
               for number, (_, text, _) in enumerate(CHEATS, 1)}
    answers[len(CHEATS) + 1] = f"def double{len(CHEATS) + 1}(x):\n    return x + x"
    answers[len(CHEATS) + 2] = "def square(x):\n    return x ** 2"
    path = tmp_path / "mallory.ipynb"
    nbformat.write(student_notebook(nbformat.read(source, 4), answers), path)

    report = grade(path, source, timeout=12, limit=600)
    with capsys.disabled():
        print(f"\n{report.confinement}")
        for result in report.results:
            print(f"  {result.number:>2}  {result.title:<52} {'pass' if result.passed else 'FAIL'}  "
                  f"{result.seconds:5.1f} s  {result.error[:70]}")
    results = {r.number: r for r in report.results}
    for number, (title, _, reason) in enumerate(CHEATS, 1):
        reason = reason.replace("doubleN", f"double{number}")
        assert not results[number].passed and results[number].error.startswith(reason), \
            f"cheat {number} ({title}): {results[number].error!r}, expected it to start with {reason!r}"
    assert results[len(CHEATS) + 1].passed and results[len(CHEATS) + 2].passed, str(report)
    assert report.score == 2
    assert not outside.exists(), "a student wrote outside its scratch folder"
    assert SECRET not in json.dumps(report.to_dict()).replace(f"AssertionError: {SECRET}", ""), \
        "the hidden check's text leaked into the report other than as its own message"
    write_junit([report], tmp_path / "report.xml")
    xml = (tmp_path / "report.xml").read_text()
    assert xml.count("<testcase") == len(CHEATS) + 2 and xml.count("<failure") == len(CHEATS)


@needs_landlock
def test_a_student_grades_their_own_notebook_in_the_released_repository(tmp_path):
    from minigrad.course.package import release_package

    repo = tmp_path / "student"
    release_package(repo, upto=1)
    shipped = repo / "chapters" / "01_graphs" / "exercises.ipynb"
    assert (repo / "chapters" / "01_graphs" / ".checks" / "exercises.ipynb").read_bytes() == shipped.read_bytes()
    assert not list(repo.rglob("solutions")), "the solutions and their hidden checks stay with the instructor"
    solutions = nbformat.read(ROOT / "chapters" / "01_graphs" / "solutions" / "exercises.ipynb", 4)
    nb = nbformat.read(shipped, 4)
    answers = {e.number: solutions.cells[e.solution_cells[0]].source for e in find_exercises(solutions)}
    for cell in nb.cells:
        meta = cell.metadata.get("minigrad", {})
        if meta.get("role") == "solution" and meta["exercise"] in (1, 4):
            cell.source = answers[meta["exercise"]]  # a student who solved exercises 1 and 4
        elif meta.get("role") == "check" and meta["exercise"] == 2:
            cell.source = "# Check 2\npass"  # and "fixed" check 2: the pristine public check still runs
    nbformat.write(nb, shipped)
    run = subprocess.run([sys.executable, "-m", "minigrad.course", "grade", "chapters/01_graphs/exercises.ipynb", "--json"],
                         cwd=repo, env={**os.environ, "PYTHONPATH": str(repo)}, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert [e["number"] for e in report["exercises"] if e["passed"]] == [1, 4], run.stdout
    assert report["total"] == 9 and "hidden" not in run.stdout


def test_grading_as_root_never_silently_keeps_root(monkeypatch):
    from minigrad.course import sandbox

    if os.geteuid() != 0:
        pytest.skip("the root policy applies when the grader runs as root")
    monkeypatch.setattr(sandbox, "_blocking_folder", lambda paths: Path("/root"))
    monkeypatch.setattr(sandbox, "landlock_abi", lambda: 3)
    with pytest.raises(sandbox.ConfinementError, match=r"user nobody, who cannot run .*chmod o\+x /root"):
        sandbox.confinement([Path("/x/solutions/exercises.ipynb")])
    monkeypatch.setattr(sandbox, "landlock_abi", lambda: 7)
    assert sandbox.confinement([]).user == "root without capabilities"
    monkeypatch.setattr(sandbox, "_blocking_folder", lambda paths: None)
    assert sandbox.confinement([]).uid == sandbox.NOBODY
