"""The course tooling: student versions of exercise notebooks, and grading them.

Exercises follow the nbgrader convention. A solution cell starts with ``# Exercise N: title`` and
holds its answer between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` lines; a later check cell
starts with ``# Check N`` and asserts the result. ``release`` writes the student version (each
block replaced by ``raise NotImplementedError("exercise N")``, exercise outputs cleared, the roles
stamped into cell metadata); ``grade`` runs a notebook in a fresh kernel and passes an exercise when
both its cells ran without an error. From the shell::

    python -m minigrad.course release chapters release/chapters
    python -m minigrad.course grade release/chapters/01_graphs/exercises.ipynb [--json]
    python -m minigrad.course verify chapters/01_graphs/exercises.ipynb
    python -m minigrad.course tag chapters/01_graphs/exercises.ipynb

``chapters/README.md`` explains the convention to authors and the workflow to instructors.
"""

from minigrad.course.exercises import CourseError, Exercise, find_exercises, read_notebook, tag_notebook
from minigrad.course.grade import ExerciseResult, GradeReport, grade, grade_notebook, run_notebook, verify
from minigrad.course.release import release, release_notebook, strip_solutions

__all__ = [
    "CourseError", "Exercise", "ExerciseResult", "GradeReport", "find_exercises", "grade",
    "grade_notebook", "read_notebook", "release", "release_notebook", "run_notebook",
    "strip_solutions", "tag_notebook", "verify",
]
