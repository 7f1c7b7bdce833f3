"""The course tooling: student versions of exercise notebooks, and grading that holds.

Exercises follow the nbgrader convention. A solution cell starts with ``# Exercise N: title`` and
holds its answer between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` lines; a later check cell
starts with ``# Check N`` and asserts the result; ``# Hidden check N`` cells are graded but never
shipped. The instructor's notebooks live in ``chapters/*/solutions/``; ``ship`` writes their
student versions beside them. ``grade`` runs each exercise's solution in a confined process of
its own (``sandbox``, ``runner``) and the instructor's checks in another (``checker``), on the
answers the check cells read with ``answer(...)`` (``answers``, ``checks``). From the shell::

    python -m minigrad.course ship [--check] chapters
    python -m minigrad.course grade chapters/01_graphs/exercises.ipynb [--json] [--junit out.xml]
    python -m minigrad.course verify chapters/01_graphs/solutions/exercises.ipynb
    python -m minigrad.course release chapters release/chapters
    python -m minigrad.course tag chapters/01_graphs/solutions/exercises.ipynb

``chapters/README.md`` explains the convention to authors and the workflow to instructors.
"""

from importlib.util import find_spec

# minigrad itself needs only numpy; the course tools need the notebook and test tools of the dev
# extra. Say so, and how to get them, instead of failing on whichever import comes first.
_MISSING = [name for name in ("nbformat", "nbclient", "pytest") if find_spec(name) is None]
if _MISSING:
    raise ModuleNotFoundError(f"minigrad.course needs {', '.join(_MISSING)} (the course tools of minigrad's dev "
                              "extra): run `make venv` in minigrad's repository, or `pip install -e '.[dev]'`, "
                              "then use .venv/bin/python -m minigrad.course", name=_MISSING[0])

from minigrad.course.answers import answer
from minigrad.course.exercises import CourseError, Exercise, find_exercises, read_notebook, tag_notebook
from minigrad.course.grade import (
    ExerciseResult, GradeReport, grade, grade_against, solution_notebook, verify, write_junit,
)
from minigrad.course.release import release, release_notebook, ship, strip_solutions

__all__ = [
    "CourseError", "Exercise", "ExerciseResult", "GradeReport", "answer", "find_exercises", "grade",
    "grade_against", "read_notebook", "release", "release_notebook", "ship", "solution_notebook",
    "strip_solutions", "tag_notebook", "verify", "write_junit",
]
